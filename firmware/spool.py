# The offline queue on flash: every event waits here until the broker has acknowledged it, so
# a reboot on battery loses nothing, and a long outage costs flash, not heap.
#
# An append-only file of one signed envelope per line, read forward by a cursor. `head` (the
# first unacknowledged byte) is saved at most once a second, so a reboot can re-send a few
# acknowledged events; the bridge drops those by (sentinel, boot, seq). Telemetry never comes
# here (the heartbeat lives in the RAM queue only and goes first when that is full). The last
# quarter of the cap is kept for mains and battery events: when the file is that full, other
# events are refused (and counted), and only a completely full file refuses a critical one.
import os


class Spool:
    def __init__(self, path, cap_bytes):
        self.path = path
        self.pos_path = path + ".pos"
        self.cap = cap_bytes
        self.refused = 0
        self.head = 0
        try:
            with open(self.pos_path) as f:
                self.head = int(f.read())
        except (OSError, ValueError):
            pass
        self.size = self._size()
        if self.head > self.size:
            self.head = 0
        self.read_at = self.head
        self._acked = []  # (start, end) of acknowledged lines past head
        self._dirty = False

    def _size(self):
        try:
            return os.stat(self.path)[6]
        except OSError:
            return 0

    def pending(self):
        return self.size - self.head

    def unread(self):
        return self.read_at < self.size

    def append(self, payload, critical=False):
        limit = self.cap if critical else self.cap * 3 // 4
        if self.size + len(payload) + 1 > limit:
            self.refused += 1
            return False
        with open(self.path, "ab") as f:
            f.write(payload)
            f.write(b"\n")
        self.size += len(payload) + 1
        return True

    def read(self):
        """(start, end, payload) of the next unread line, or None."""
        if not self.unread():
            return None
        with open(self.path, "rb") as f:
            f.seek(self.read_at)
            line = f.readline()
        if not line.endswith(b"\n"):  # a line cut short by a reset mid-write: skip the rest
            self.read_at = self.size
            return None
        start = self.read_at
        self.read_at += len(line)
        return start, self.read_at, line[:-1]

    def acked(self, start, end):
        self._acked.append((start, end))
        moved = True
        while moved:
            moved = False
            for span in self._acked:
                if span[0] == self.head:
                    self.head = span[1]
                    self._acked.remove(span)
                    self._dirty = moved = True
                    break

    def flush(self):
        """Save head; once everything is acknowledged, start an empty file."""
        if not self._dirty:
            return
        self._dirty = False
        if self.head >= self.size and self.read_at >= self.size:
            try:
                os.remove(self.path)
            except OSError:
                pass
            self.size = self.head = self.read_at = 0
        with open(self.pos_path, "w") as f:
            f.write(str(self.head))
