"""The bridge's serial reader on a babbling port: an overlong line is one warning, however long,
and the lines after it still arrive."""

from __future__ import annotations

import asyncio
import logging

import pytest

from holdover.bridge.serial_link import MAX_LINE, SerialLink


class Port:
    """What pyserial's read gives, in the chunks a USB CDC port hands over, then stops the link."""

    def __init__(self, data: bytes, link: SerialLink, chunk: int = 4096) -> None:
        self.chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        self.link = link

    @property
    def in_waiting(self) -> int:
        return len(self.chunks[0]) if self.chunks else 0

    def read(self, _n: int) -> bytes:
        if not self.chunks:
            self.link._stop.set()
            return b""
        return self.chunks.pop(0)


def test_a_megabyte_line_is_one_warning_and_what_follows_still_arrives(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        queue: asyncio.Queue = asyncio.Queue()
        link = SerialLink("socket://test", 115200, queue, loop)
        good = b'{"sig":"x","body":{}}'
        data = b"#log line\n" + b"A" * (1 << 20) + b"\n" + good + b"\n" + b"B" * (3 * MAX_LINE) + b"\n" + good + b"\n"
        caplog.set_level(logging.WARNING, logger="holdover")
        link._read(Port(data, link))
        loop.run_until_complete(asyncio.sleep(0))  # the queued call_soon_threadsafe puts
        noise = [r.getMessage() for r in caplog.records if "noise" in r.getMessage()]
        assert noise == [f"serial socket://test: a line of {1 << 20} bytes dropped as noise"], noise
        assert link.noise_lines == 2  # the second, a minute not yet gone, is counted, not logged
        assert [queue.get_nowait().payload for _ in range(queue.qsize())] == [good, good]
    finally:
        loop.close()
