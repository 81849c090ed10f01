# The USB serial channel's line protocol, for both board layers: the board keeps the transport
# (UART0 through the devkit's USB bridge on the chip, a TCP port in the emulator), this keeps the
# lines. Out: the same signed envelopes as MQTT, one per line, and "#" log lines, all through one
# bounded queue so a log line never lands in the middle of an event. In: a line starting with
# "{" is a signed command or receipt for the sentinel to verify; anything else, or anything too
# long to be an envelope, is counted and skipped, never fatal (line noise, a REPL prompt).
import asyncio

import protocol

LINE_MAX = protocol.MAX_PAYLOAD + 52  # an envelope and its newline, with room to spare


class Lines:
    def __init__(self, backlog):
        self.backlog = backlog  # lines waiting for a slow reader; the oldest go, as a UART FIFO's do
        self._out = []
        self._kick = asyncio.Event()
        self.dropped = 0
        self.skipped = 0

    def put(self, line):
        if isinstance(line, str):
            line = line.encode()
        self._out.append(line)
        if len(self._out) > self.backlog:
            self._out.pop(0)
            self.dropped += 1
        self._kick.set()

    async def get(self):
        """The next line to write (without its newline), waiting for one."""
        while not self._out:
            self._kick.clear()
            await self._kick.wait()
        return self._out.pop(0)

    def received(self, line, app, log):
        """One line from the host: handed to the sentinel if it can be ours, else skipped."""
        if len(line) > LINE_MAX:
            self.skipped += 1
            log("# serial: line too long, dropped")
            return
        line = line.strip()
        if line[:1] == b"{":
            if app is not None:
                app.command(line, False, "serial")
        elif line:
            self.skipped += 1
            log("# serial: ignored a line that is not a signed command")
