# Home Assistant's discovery configs as one burst a connection: a fresh Home Assistant has every
# entity within a second of a connect, each config sent once the queue is short again, so the
# board's other tasks are never starved. The configs themselves are discovery.py's, imported for
# the burst and dropped after it: its bytecode would sit in the heap between connects.
import asyncio
import gc
import sys


class Announcer:
    def __init__(self, mqtt, cfg, sid, board_name, mac, note_heap, log):
        self.mqtt = mqtt
        self.cfg = cfg
        self.sid = sid
        self.board_name = board_name
        self.mac = mac
        self.note_heap = note_heap
        self.log = log
        self.due = asyncio.Event()  # a connection came up: the configs to send
        # The outbox holds its resends meanwhile: the two at once were the heap's fullest moment.
        self.bursting = False

    async def run(self):
        while True:
            await self.due.wait()
            self.due.clear()
            # The backlog goes first: its bytes and the module's are not held at once. The
            # messages are ~700 bytes, and a connect (birth, state, a backlog) is when the heap
            # is fullest.
            await self._queue_short()
            gc.collect()
            self.bursting = True
            try:
                await self._burst()
            except MemoryError:
                self.log("discovery", "out of memory; again in a second")
                self.due.set()
                await asyncio.sleep_ms(1000)
            finally:
                self.bursting = False
                sys.modules.pop("discovery", None)
                gc.collect()

    async def _burst(self):
        # A coroutine of its own, so that its frame, which holds the module, ends with the burst.
        import discovery

        for topic, payload in discovery.messages(self.cfg, self.sid, self.board_name, self.mac()):
            await self._queue_short()
            if self.due.is_set() or not self.mqtt.connected:
                return  # the next connection sends the whole set again
            self.mqtt.publish(topic, payload, retain=True)
            payload = None
            self.note_heap()  # the burst's own peak (the module, a message queued), not left to chance
            await asyncio.sleep_ms(0)

    async def _queue_short(self):
        while self.mqtt.pending() and self.mqtt.connected and not self.due.is_set():
            await asyncio.sleep_ms(20)
