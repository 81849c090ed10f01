# The sentinel application: plain MicroPython asyncio tasks above a board layer.
#
# The same code runs on the ESP32 (board_esp32) and in the unix port (board_emu). The
# power-watch task never awaits the network, and the watchdog is fed from its health,
# not from MQTT's: a sentinel whose broker is gone must keep watching, not reboot.
#
# Every event goes into the outbox on flash and from there, a few at a time, out as a line on
# the USB serial port and into the MQTT queue; it leaves the outbox only on the bridge's signed
# receipt, and is sent again with backoff until then. Heartbeats are telemetry: RAM only,
# dropped first.
import asyncio
import binascii
import gc
import os
import sys

import commands
import mains
import mqtt
import outbox
import protocol
import version
import wifi

WDT_MS = 8000
WATCH_STALE_MS = 2000  # the power watch must have sampled this recently to feed the WDT
OUTBOX_CAP = 48 * 1024  # bytes of flash for unreceipted events (~150 events)
RESTART_AFTER_MS = 500
CRASH_CAUSES = ("wdt", "hard")  # resets that count towards safe mode; power_on never does


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
        if board.nvs_get("restart", 0):
            # machine.reset() is a HARD_RESET on the ESP32, as a panic is: asked for, it is neither
            # a crash to count towards safe mode nor a mystery in the last-reset diagnostic.
            self.reset_cause = protocol.RESTART_ASKED
            board.nvs_set("restart", 0)
        self.crashes = self._count_crash()
        self.safe_mode = self.crashes >= cfg["safe_mode"]["after"]
        self.seq = 0
        self._last_event = 0  # seq of the last event other than a heartbeat, in this boot
        self._t0 = board.ticks_ms()
        self._up_last = self._t0
        self._mains_since_up = 0  # uptime (ms) at the last mains change; the boot state counts from 0
        self._up_ms = 0
        self.raised = {}
        self.heap_hwm = 0
        window = min(8, cfg["mqtt"]["queue_len"] // 2)  # events in RAM at once (the rest wait on flash)
        self.outbox = outbox.Outbox(board, board.outbox_path, OUTBOX_CAP, self._send_event, window)
        self.commands = commands.CommandGate(
            board, self.signer, self.sid, self.boot, self.outbox.receipt, self._run, self.relay_on, self._answer,
            self.log,
        )  # fmt: skip
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
        self.mains = mains.MainsWatch(board, cfg["mains"], self._mains_changed, self._mains_tier)
        self.wifi = wifi.WifiKeeper(board.wlan(), cfg["wlan"], board, self.log)
        self.battery = self.uplink = self.relay = self.led = self.announce = None
        if cfg["led"]["pin"] >= 0:
            import led

            self.led = led.StatusLed(board, cfg["led"], self._health)
        if cfg["battery"]["pin"] >= 0:
            import battery

            self.battery = battery.Battery(board, cfg["battery"], self._battery_level)
        # Safe mode keeps only what watches power and reports it: a crash loop is most likely
        # in the parts that talk to the outside (probes, relay, discovery, NTP).
        if not self.safe_mode and cfg["uplink"]["targets"]:
            import uplink

            self.uplink = uplink.UplinkWatch(board, cfg["uplink"], self._uplink_changed)
        if not self.safe_mode and cfg["relay"]["pin"] >= 0:
            import relay

            self.relay = relay.Relay(board, cfg["relay"], self._relay_switched)
        if not self.safe_mode and cfg["ha"]["discovery"]:
            import announce

            self.announce = announce.Announcer(
                self.mqtt, cfg, self.sid, board.name, self.wifi.mac, self._note_heap, self.log
            )
        elif cfg["relay"]["pin"] >= 0 and cfg["relay"]["wiring"] == "no":
            # Safe mode takes no commands, but the modem on the normally-open contact needs the coil on.
            board.relay(cfg["relay"]["pin"], cfg["relay"]["active_low"]).value(1)

    def _count_crash(self):
        n = self.board.nvs_get("crashes", 0)
        # Only a crash counts; a power-on (a mains flicker browning the board out included)
        # proves nothing about the firmware and starts the count again.
        n = n + 1 if self.reset_cause in CRASH_CAUSES else 0
        self.board.nvs_set("crashes", n)
        return n

    # --- time and logging --------------------------------------------------------------

    def uptime_ms(self):
        # ticks_ms wraps after ~12.4 days on MicroPython; accumulate deltas instead.
        now = self.board.ticks_ms()
        self._up_ms += self.board.ticks_diff(now, self._up_last)
        self._up_last = now
        return self._up_ms

    def log(self, *parts):
        # A log line on the shared USB serial port starts with LOG; protocol lines with "{".
        self.board.console(protocol.LOG + " " + " ".join([str(p) for p in (self.uptime_ms(),) + parts]))

    def on_battery(self):
        return self.mains.present is False

    def runtime_s(self):
        return self.battery.runtime_s() if self.battery else None

    # --- outbound ------------------------------------------------------------------------

    def _seal(self, kind, data):
        self.seq += 1
        return protocol.encode(
            self.signer, self.sid, self.boot, self.seq, self.uptime_ms(), self.board.now_unix(), kind, data
        )

    def emit(self, kind, data):
        try:
            self._emit(kind, data)
        except MemoryError:
            # A full heap must cost telemetry, never the power watch that called us: collect,
            # try once more, and if even that fails the event is lost, loudly, and we go on.
            gc.collect()
            try:
                self._emit(kind, data)
            except MemoryError:
                self.log("event", kind, "LOST: out of memory")

    def _emit(self, kind, data):
        if self.on_battery():
            # What the bridge budgets its emergency work against, on every event while it matters.
            data["on_battery"] = True
            r = self.runtime_s()
            if r is not None:
                data[protocol.RUNTIME] = r
        if kind not in protocol.TRANSIENT_KINDS:
            # A chain through the events the outbox keeps, so the bridge can name a gap (one lost
            # from RAM when the outbox was full, say) even though state and acks share the seq.
            if self._last_event:
                data["prev"] = self._last_event
            self._last_event = self.seq + 1
        payload = self._seal(kind, data)
        self.raised[kind] = self.raised.get(kind, 0) + 1
        critical = kind in protocol.CRITICAL_KINDS
        if kind in protocol.TRANSIENT_KINDS:
            self.board.serial_out(payload)
            if kind == protocol.HEARTBEAT or self.mqtt.connected:
                # A suspicion is worth something only now: not queued in RAM for a later link
                # (its dip or loss follows, kept), and it changes nothing in the state.
                self.mqtt.publish(protocol.topic(self.sid, protocol.EVENT), payload, qos=1)
            if kind == protocol.MAINS_SUSPECT:
                self.log("event", kind, "seq", self.seq)
                return
        elif not self.outbox.append(payload, critical):
            # Outbox full: the event still goes, from RAM, where a reset would lose it.
            self.log("outbox", "full, %s seq %d kept in RAM only" % (kind, self.seq))
            self._send_event(payload, None)
        self.log("event", kind, "seq", self.seq)
        self.publish_state()

    def _send_event(self, payload, handle):
        # Serial every time: it is the channel left when the LAN is dead, and a line is cheap.
        self.board.serial_out(payload)
        if handle is not None and handle in self.mqtt.outbox:
            return handle  # still queued for the broker: the link sends it when it can
        return self.mqtt.publish(protocol.topic(self.sid, protocol.EVENT), payload, qos=1, critical=True)

    def publish_state(self):
        try:
            payload = self._seal(protocol.STATE_KIND, self.snapshot())
        except MemoryError:
            gc.collect()  # state is telemetry: the next change or heartbeat sends a fresh one
            self.log("state", "skipped: out of memory")
            return
        self.mqtt.publish(protocol.topic(self.sid, protocol.STATE), payload, retain=True)
        self.board.serial_out(payload)  # a host on the serial side needs the runtime estimate too

    def snapshot(self):
        s = self.mains.snapshot()
        s.update(
            {
                # On the uptime scale, which never wraps: a ticks_diff against boot would turn
                # negative after 6.2 days on the chip.
                "mains_since_ms": self._mains_since_up,
                "boot_count": self.boot_count,
                "reset_cause": self.reset_cause,
                "safe_mode": self.safe_mode,
                "uptime_ms": self.uptime_ms(),
                "queued": self.mqtt.pending(),
                "dropped": self.mqtt.dropped,
                "mqtt_oversized": self.mqtt.oversized,
                "sub_failed": self.mqtt.sub_failed,
                "outbox_bytes": self.outbox.pending(),
                "outbox_refused": self.outbox.refused,
                "outbox_resent": self.outbox.resent,
                "cmd_refused": self.commands.refused,
                "mem_free": gc.mem_free(),
                "relay": self.relay.on if self.relay else None,
                "wlan_joins": self.wifi.joins,
                "wlan_errors": self.wifi.errors,
                "rssi": self.wifi.rssi(),
                "uplink": self.uplink.status() if self.uplink else None,
            }
        )
        if self.uplink:
            s["targets"] = self.uplink.snapshot()
        if self.led:
            s.update(self.led.snapshot())
        if self.battery:
            s.update(self.battery.snapshot())
            s[protocol.RUNTIME] = self.runtime_s()
        return s

    def _on_connect(self):
        self.outbox.hurry()
        # Birth first, so "online" is not stuck behind a backlog of queued events.
        self.mqtt.publish(protocol.topic(self.sid, protocol.STATUS), protocol.ONLINE, retain=True, first=True)
        self.publish_state()
        if self.announce:
            self.announce.due.set()

    # --- commands, from MQTT or the serial port --------------------------------------------

    def _on_message(self, topic, payload, retained):
        self.command(payload, retained, "mqtt")

    def command(self, payload, retained, via):
        """A receipt or a relay command, from MQTT or the serial port (commands.py checks it)."""
        self.commands.take(payload, retained, via)

    def _answer(self, ack):
        payload = self._seal(protocol.ACK_KIND, ack)
        self.mqtt.publish(protocol.topic(self.sid, protocol.CMD_ACK), payload, qos=1)
        self.board.serial_out(payload)

    def relay_on(self):
        return self.relay.on if self.relay else None

    def _run(self, op, ms):
        if op == protocol.OP_RESTART:
            self.board.nvs_set("restart", 1)
            self._restarting = asyncio.create_task(self._restart())
            return None
        if self.relay is None:
            return protocol.SAFE_MODE if self.safe_mode else protocol.NO_RELAY
        if op == protocol.OP_PULSE:
            return self.relay.pulse(ms, "command")
        return self.relay.set(op == protocol.OP_ON, "command")

    async def _restart(self):
        await asyncio.sleep_ms(RESTART_AFTER_MS)  # the ack out first, on every path
        self.log("cmd", "restart as asked")
        self.board.reset()

    # --- sensing -------------------------------------------------------------------------

    def _mains_changed(self, present, held_ms):
        # The change happened a debounce ago, at mains.changed_ms (for a loss: its last edge).
        self._mains_since_up = self._uptime_at(self.mains.changed_ms)
        if present:
            self.emit(protocol.MAINS_RESTORED, {"outage_ms": held_ms})
        else:
            last = self._mains_since_up
            self.emit(protocol.MAINS_LOST, {"debounce_ms": self.mains.debounce, "last_pulse_ms": last})

    def _uptime_at(self, ticks):
        """A moment on the board's clock (ticks_ms), as uptime ms: what events carry."""
        # From the uptime's own reading of the clock: a second read may be a ms on, and the
        # suspect and the loss of one edge would then carry two times.
        up = self.uptime_ms()
        return up - self.board.ticks_diff(self._up_last, ticks)

    def _mains_tier(self, dip_ms, last):
        # A suspicion (dip_ms None) or the dip it ended as, dated from the last mains edge.
        d = {"last_pulse_ms": self._uptime_at(last)}
        if dip_ms is None:
            d["hz"] = self.mains.hz
            self.emit(protocol.MAINS_SUSPECT, d)
        else:
            d["dip_ms"] = dip_ms
            self.emit(protocol.MAINS_DIP, d)

    def _battery_level(self, level, prev):
        kind = {"ok": protocol.BATTERY_OK, "low": protocol.BATTERY_LOW, "critical": protocol.BATTERY_CRITICAL}[level]
        d = self.battery.snapshot()
        d["previous"] = prev
        d["on_battery"] = self.on_battery()
        self.emit(kind, d)

    def _uplink_changed(self, up, outage_ms):
        if up:
            self.emit(protocol.UPLINK_RESTORED, {"outage_ms": outage_ms, "targets": self.uplink.snapshot()})
        else:
            self.emit(
                protocol.UPLINK_LOST,
                {"outage_ms": outage_ms, "wlan": self.board.net_up(), "targets": self.uplink.snapshot()},
            )

    def _relay_switched(self, on, why):
        self.emit(protocol.RELAY, {"on": on, "why": why})

    def _health(self):
        """What the status LED shows: error when the bridge cannot hear us, warning when a
        watched thing is wrong, ok otherwise."""
        import led

        if self.safe_mode or not self.mqtt.connected:
            return led.ERROR
        if self.on_battery() or (self.uplink and self.uplink.up is False):
            return led.WARNING
        if self.battery and self.battery.level != "ok":
            return led.WARNING
        return led.OK

    # --- housekeeping ----------------------------------------------------------------------

    async def _supervise(self):
        wdt = self.board.wdt(WDT_MS)
        good_after = self.cfg["safe_mode"]["good_after_s"] * 1000
        while True:
            if self.board.ticks_diff(self.board.ticks_ms(), self.mains.alive_ms) < WATCH_STALE_MS:
                wdt.feed()
            else:
                self.log("wdt", "power watch stalled; not feeding the watchdog")
            if self.crashes and self.uptime_ms() > good_after:
                self.crashes = 0
                self.board.nvs_set("crashes", 0)
                self.log("boot", "stable; crash count cleared")
            if not (self.announce and self.announce.bursting):
                # Resends that are due. Not beside a discovery burst: the two at once were the
                # heap's fullest moment (3 KB over either alone); they wait a tick, on flash.
                self.outbox.pump()
            try:
                self.outbox.flush()
            except OSError as e:  # a full or failing flash must not stop the watch
                self.log("outbox", "flush failed:", repr(e))
            self._note_heap()
            await asyncio.sleep_ms(1000)

    def _note_heap(self):
        gc.collect()
        # The live heap, measured after a collection: before one it only shows garbage piling up.
        live = gc.mem_alloc()
        if live > self.heap_hwm:
            self.heap_hwm = live

    async def _heartbeat(self):
        period = self.cfg["heartbeat_s"] * 1000
        while True:
            await asyncio.sleep_ms(period)
            self.emit(protocol.HEARTBEAT, {"uptime_ms": self.uptime_ms(), "mem_free": gc.mem_free()})

    async def _policy(self):
        """Once a second: tell the relay how long the uplink has been down (the power-cycle policy
        is relay.py's), and set the clock by NTP while the uplink is up."""
        ticks, diff = self.board.ticks_ms, self.board.ticks_diff
        ntp_host = "" if self.safe_mode else self.cfg["ntp"]["host"]
        next_ntp = ticks()
        while True:
            await asyncio.sleep_ms(1000)
            u, now = self.uplink, ticks()
            down_ms = diff(now, u.down_since_ms) if u is not None and u.up is False else 0
            if self.relay is not None and self.relay.tick(down_ms, self.on_battery()):
                self.log("relay", "uplink down %d s: power-cycling the modem" % (down_ms // 1000))
            if ntp_host and self.board.net_up() and (u is None or u.up) and diff(now, next_ntp) >= 0:
                import ntp

                t = await ntp.query(ntp_host, self.cfg["ntp"]["port"])
                if t:
                    self.board.set_time(t)
                    self.log("ntp", "time set from", ntp_host)
                next_ntp = ticks() + (self.cfg["ntp"]["interval_s"] * 1000 if t else 60000)

    def _task_error(self, _loop, context):
        # A task that dies is one "#" line, never a traceback on the console the serial channel shares.
        self.log("task", "died:", context.get("message", ""), repr(context.get("exception")))

    async def main(self):
        asyncio.get_event_loop().set_exception_handler(self._task_error)
        await self.board.serve(self)  # board services first: the emulated mains pulses come from there
        present = await self.mains.settle()
        if self.battery:
            self.battery.read()
        if self.outbox.pending():
            self.log("outbox", "%d bytes from before the reset still to deliver" % self.outbox.pending())
        if self.safe_mode:
            self.log("boot", "SAFE MODE after %d crash resets: uplink, relay, NTP, discovery off" % self.crashes)
        self.emit(
            protocol.BOOT,
            {
                "reset_cause": self.reset_cause,
                "boot_count": self.boot_count,
                "crashes": self.crashes,
                "safe_mode": self.safe_mode,
                "mains": present,
                "board": self.board.name,
                "mains_path": self.mains.path,
                "fw": version.VERSION,  # what the bridge serves as ups.firmware to NUT's clients
            },
        )
        if not present:
            # Booted on battery (a reboot mid-outage): the bridge must still hear it.
            self.emit(protocol.MAINS_LOST, {"debounce_ms": self.mains.debounce, "at_boot": True})
        tasks = [
            ("mains", self.mains.run),
            ("supervisor", self._supervise),
            ("wlan", self.wifi.run),
            ("mqtt", self.mqtt.run),
            ("heartbeat", self._heartbeat),
            ("policy", self._policy),
        ]
        if self.battery:
            tasks.append(("battery", self.battery.run))
        if self.uplink:
            tasks.append(("uplink", self.uplink.run))
        if self.led:
            tasks.append(("led", self.led.run))
        if self.announce:
            tasks.append(("discovery", self.announce.run))
        await asyncio.gather(*[asyncio.create_task(self._keep(n, f)) for n, f in tasks])

    async def _keep(self, name, start):
        # A task that dies (a MemoryError at the wrong moment, a driver error) is logged and
        # started again; one fault must not stop the others, and gather() would stop them all.
        # The watchdog still resets the board if the mains watch keeps dying and stops sampling.
        while True:
            try:
                await start()
            except Exception as e:
                self.log("task", name, "died, restarting:", repr(e))
            gc.collect()
            await asyncio.sleep_ms(1000)


def run(board):
    loaded = set(sys.modules)
    import config

    try:
        cfg = config.load(board.config_path)
    except config.ConfigError as e:
        board.console("# config error: %s" % e)
        board.halt("config error: %s" % e)
        return
    # The validator, its tables and what only it imports (the chips' pin maps, the key rule) are
    # needed once; the heap is not (the local name holds config too).
    for name in set(sys.modules) - loaded:
        del sys.modules[name]
    del config
    gc.collect()
    board.configure(cfg)
    asyncio.run(Sentinel(board, cfg).main())
