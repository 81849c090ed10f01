# SNTP over the polled UDP exchange, because ntptime.settime() blocks the loop for up to its timeout.
import struct

import netio

_NTP_TO_UNIX = 2208988800


async def query(host, port=123, timeout_ms=1000):
    """Unix time from an NTP server (an IP literal), or None."""
    got = []

    def accept(r):
        # A server-mode reply (mode 4) with a transmit timestamp.
        if len(r) >= 48 and r[0] & 7 == 4:
            got.append(r)
            return True
        return False

    rtt = await netio.exchange(netio.addr(host, port), timeout_ms, udp=True, send=b"\x1b" + bytes(47), accept=accept)
    if rtt is None:
        return None
    secs = struct.unpack("!I", got[0][40:44])[0]
    if secs < 0x80000000:
        secs += 0x100000000  # era 1: after 2036-02-07
    return secs - _NTP_TO_UNIX + (rtt + 500) // 2000
