# Probes on raw non-blocking sockets, polled: nothing here can block the event loop.
#
# asyncio.open_connection is not used because a timeout that cancels it leaks its socket (on
# the ESP32 lwIP has about ten), and because on MicroPython it reports a refused connect as a
# success (the socket turns writable with an error pending). Polling every POLL_MS costs that
# much RTT resolution, which is plenty for an uplink watch.
import asyncio
import select
import socket
import time

POLL_MS = 5
_BAD = select.POLLERR | select.POLLHUP
EINPROGRESS = 115


def addr(host, port):
    # Host is an IP literal (the config insists), so this resolves nothing.
    return socket.getaddrinfo(host, port)[0][-1]


async def exchange(address, timeout_ms, udp=False, send=None, accept=None):
    """RTT in ms of a TCP connect, or of a UDP request answered so that accept(reply) holds; None on failure."""
    t0 = time.ticks_ms()
    s = None
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(address)
        except OSError as e:
            if e.args[0] != EINPROGRESS:
                return None
        if send:
            s.send(send)
        p = select.poll()
        p.register(s, select.POLLIN if udp else select.POLLOUT)
        while time.ticks_diff(time.ticks_ms(), t0) < timeout_ms:
            for _obj, ev in p.poll(0):
                if ev & _BAD:
                    return None
                if not udp:
                    return time.ticks_diff(time.ticks_ms(), t0)
                if accept(s.recv(512)):
                    return time.ticks_diff(time.ticks_ms(), t0)
            await asyncio.sleep_ms(POLL_MS)
        return None
    except OSError:
        return None
    finally:
        if s is not None:
            s.close()
