# The sentinel application: plain MicroPython asyncio tasks above a board layer.
#
# The same code runs on the ESP32 (board_esp32) and in the unix port (board_emu). The
# power-watch task never awaits the network, and the watchdog is fed from its health,
# not from MQTT's: a sentinel whose broker is gone must keep watching, not reboot.
import asyncio
import binascii
import gc
import os

import mains
import mqtt
import protocol

WDT_MS = 8000
WATCH_STALE_MS = 2000  # the power watch must have sampled this recently to feed the WDT


class Sentinel:
    def __init__(self, board, cfg):
        self.board = board
        self.cfg = cfg
        self.sid = cfg["sentinel_id"]
        self.signer = protocol.Signer(cfg["key"])
        self.boot = binascii.hexlify(os.urandom(4)).decode()
        self.boot_count = board.nvs_get("boots", 0) + 1
        board.nvs_set("boots", self.boot_count)
        self.reset_cause = board.reset_cause()
        self.seq = 0
        self._t0 = board.ticks_ms()
        self._up_last = self._t0
        self._up_ms = 0
        self.raised = {}
        self.heap_hwm = 0
        st = protocol.topic(self.sid, protocol.STATUS)
        self.mqtt = mqtt.Client(
            board,
            cfg["mqtt"],
            client_id="holdover-" + self.sid,
            will=(st, protocol.OFFLINE, True, 1),
            on_connect=self._on_connect,
            on_message=self._on_message,
            log=self.log,
        )
        self.mqtt.subscribe(protocol.topic(self.sid, protocol.CMD))
        self.mains = mains.MainsWatch(board, cfg["mains"], self._mains_changed)

    # --- time and logging --------------------------------------------------------------

    def uptime_ms(self):
        # ticks_ms wraps after ~12.4 days on MicroPython; accumulate deltas instead.
        now = self.board.ticks_ms()
        self._up_ms += self.board.ticks_diff(now, self._up_last)
        self._up_last = now
        return self._up_ms

    def log(self, *parts):
        # "# " marks a log line on the shared USB serial port; protocol lines start with "{".
        print("#", self.uptime_ms(), *parts)

    # --- outbound ------------------------------------------------------------------------

    def _seal(self, kind, data):
        self.seq += 1
        return protocol.encode(
            self.signer, self.sid, self.boot, self.seq, self.uptime_ms(), self.board.now_unix(), kind, data
        )

    def emit(self, kind, data):
        payload = self._seal(kind, data)
        self.raised[kind] = self.raised.get(kind, 0) + 1
        self.mqtt.publish(
            protocol.topic(self.sid, protocol.EVENT), payload, qos=1, critical=kind in protocol.CRITICAL_KINDS
        )
        self.log("event", kind, "seq", self.seq)
        self.publish_state()

    def publish_state(self):
        self.mqtt.publish(
            protocol.topic(self.sid, protocol.STATE), self._seal(protocol.STATE_KIND, self.snapshot()), retain=True
        )

    def snapshot(self):
        return {
            "mains": self.mains.present,
            "mains_since_ms": self.board.ticks_diff(self.mains.changed_ms, self._t0),
            "glitches": self.mains.glitches,
            "boot_count": self.boot_count,
            "reset_cause": self.reset_cause,
            "uptime_ms": self.uptime_ms(),
            "queued": self.mqtt.pending(),
            "dropped": self.mqtt.dropped,
            "mem_free": gc.mem_free(),
        }

    def _on_connect(self):
        # Birth first, so "online" is not stuck behind a backlog of queued events.
        self.mqtt.publish(protocol.topic(self.sid, protocol.STATUS), protocol.ONLINE, retain=True, first=True)
        self.publish_state()

    def _on_message(self, topic, payload, retained):
        if retained:
            self.log("cmd", "refused: retained command on", topic)
            return
        try:
            msg = protocol.open_envelope(payload, self.signer)
        except protocol.ProtocolError as e:
            self.log("cmd", "refused:", str(e))
            return
        self.log("cmd", "received", msg["kind"], "(no command handlers in this build)")

    # --- sensing -------------------------------------------------------------------------

    def _mains_changed(self, present, held_ms):
        if present:
            self.emit(protocol.MAINS_RESTORED, {"outage_ms": held_ms})
        else:
            self.emit(protocol.MAINS_LOST, {"debounce_ms": self.mains.debounce})

    async def _supervise(self):
        wdt = self.board.wdt(WDT_MS)
        while True:
            if self.board.ticks_diff(self.board.ticks_ms(), self.mains.alive_ms) < WATCH_STALE_MS:
                wdt.feed()
            else:
                self.log("wdt", "power watch stalled; not feeding the watchdog")
            gc.collect()
            # The live heap, measured after a collection: before one it only shows garbage piling up.
            live = gc.mem_alloc()
            if live > self.heap_hwm:
                self.heap_hwm = live
            await asyncio.sleep_ms(1000)

    async def _heartbeat(self):
        period = self.cfg["heartbeat_s"] * 1000
        while True:
            await asyncio.sleep_ms(period)
            self.emit(protocol.HEARTBEAT, {"uptime_ms": self.uptime_ms(), "mem_free": gc.mem_free()})

    async def main(self):
        await self.board.serve(self)  # board services first: the emulated mains pulses come from there
        present = await self.mains.settle()
        self.emit(
            protocol.BOOT,
            {
                "reset_cause": self.reset_cause,
                "boot_count": self.boot_count,
                "mains": present,
                "board": self.board.name,
            },
        )
        if not present:
            # Booted on battery (a reboot mid-outage): the bridge must still hear it.
            self.emit(protocol.MAINS_LOST, {"debounce_ms": self.mains.debounce, "at_boot": True})
        tasks = [
            asyncio.create_task(self.mains.run()),
            asyncio.create_task(self._supervise()),
            asyncio.create_task(self.board.net_task(self.cfg["wlan"], self.log)),
            asyncio.create_task(self.mqtt.run()),
            asyncio.create_task(self._heartbeat()),
        ]
        await asyncio.gather(*tasks)


def run(board):
    import config

    try:
        cfg = config.load(board.config_path)
    except config.ConfigError as e:
        print("# config error:", e)
        board.halt("config error: %s" % e)
        return
    board.configure(cfg)
    asyncio.run(Sentinel(board, cfg).main())
