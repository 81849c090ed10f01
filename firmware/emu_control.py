# The emulator's control port: newline-delimited JSON, one command a line ({"mains": false}),
# answered with one JSON line. What each key accepts and does is a table, like config.SPEC.
# Emulator only: never on a board (host/holdover/board/manifest.py).
import asyncio
import gc
import json
import time

CONTROL_LINE_MAX = 512  # bytes; the longest legitimate control command is ~40


# key: (what it takes: "flag" for true/false, (lo, hi, what) for a number, or the words "get"
# accepts), what it does. Data, not functions: every function is heap the chip's twin lacks.
GETS = ("state", "world", "ticks", "adc", "mem", "relay", "led", "raised")
COMMANDS = {
    "mains": ("flag", "switch"),
    "wlan": ("flag", "switch"),
    # Spurious edges on the mains pin, as GPIO36/39 see with WiFi on: with or without mains.
    "ghost_hz": ((0, 200, "edges per second"), "set"),
    "ghost_us": ((1, 1000, "microseconds wide"), "set"),  # interference is a few us; wider passes the filter
    # The line: 50 or 60 Hz (anything else is a line the watch must call unknown), and how many
    # edges a cycle the opto gives (2: bridge-fed, 1: one half-wave).
    "hz": ((40, 70, "Hz"), "set"),
    "edges_per_cycle": ((1, 2, "edges"), "set"),
    # The VM held up this long (a flash write, a GC pause) while the world goes on; with
    # switch_in_stall_ms set first, mains goes (or comes back) that far into the stall.
    "stall_ms": ((1, 2000, "ms"), "stall"),
    "switch_in_stall_ms": ((0, 2000, "ms"), "set"),
    # A gap of exactly this long in the edge train, timed on the world's own clock (a host's
    # two commands would add their own jitter to it); mains stays on either side.
    "dip_ms": ((1, 2000, "ms"), "dip"),
    # Each edge moved by up to this share of the period, either way: a real line's wander.
    "jitter_pct": ((0, 10, "percent"), "set"),
    "battery_v": ((0, 30, "a voltage"), "volts"),  # a set voltage also ends a running discharge
    # A discharge runs the battery voltage down at this rate until 0 or a set battery_v.
    "discharge_v_per_s": ((0, 5, "volts"), "volts"),
    "adc_noise_v": ((0, 5, "volts"), "volts"),
    # The reset button: the supervisor boots the firmware again with cause "hard".
    "reset": (None, "reset"),
    "get": (GETS, "get"),
}


def _problem(takes, v):
    if takes == "flag":
        return None if isinstance(v, bool) else "expected true or false"
    if isinstance(takes, tuple) and len(takes) == 3 and not isinstance(takes[0], str):
        lo, hi, what = takes
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            return "expected %s %s..%s" % (what, lo, hi)
    elif takes is GETS and v not in GETS:
        return "expected %s or %s" % (", ".join(GETS[:-1]), GETS[-1])
    return None


def _get(board, v):
    app = board.app
    if v == "state":
        return {"state": app.snapshot() if app else None}
    if v == "world":
        return {"world": board.world.state}
    if v == "ticks":
        return {"ticks_ms": board.ticks_ms()}
    if v == "adc":
        return {"adc_uv": board.adc(-1).read_uv()}
    if v == "mem":
        gc.collect()
        hwm = app.heap_hwm if app else 0
        return {"mem": {"free": gc.mem_free(), "alloc": gc.mem_alloc(), "hwm": hwm, "emu_only": board.EMU_ONLY}}
    if v == "relay":
        return {"relay": bool(board.world.get("relay")), "pin": board.world.get("relay_pin")}
    if v == "raised":
        # Events raised in this boot, by kind: what a soak compares the journal with.
        return {"raised": app.raised if app else {}}
    periods = board.led_periods()  # "led"
    if periods is None:
        return "this board config has no status LED"
    return {"led": board.led_on(), "periods_ms": periods}


def command(board, text):
    try:
        cmd = json.loads(text)
    except ValueError:
        return {"ok": False, "error": "not JSON: %r" % text[:80]}
    if not isinstance(cmd, dict) or len(cmd) != 1:
        return {"ok": False, "error": "expected an object with exactly one key"}
    k = list(cmd)[0]
    v = cmd[k]
    if k not in COMMANDS:
        return {"ok": False, "error": "unknown command %r" % k}
    takes, does = COMMANDS[k]
    bad = _problem(takes, v)
    if bad is None and does == "get":
        out = _get(board, v)
        if not isinstance(out, str):
            out["ok"] = True
            return out
        bad = out
    if bad is not None:
        return {"ok": False, "error": "%s: %s" % (k, bad)}
    if does == "reset":
        board.reset_soon()
        return {"ok": True, "reset": True}
    if does == "stall":
        return _stall(board, int(v))
    if does == "dip":
        if not board.world.dip(int(v)):
            return {"ok": False, "error": "dip_ms: mains is off"}
        return {"ok": True, "dip_ms": v, "uptime_ms": board.app.uptime_ms() if board.app else None}
    if does == "volts":
        if k == "battery_v":
            board.world.set("discharge_v_per_s", 0)
        v = float(v)
    board.world.set(k, v)
    out = {"ok": True, k: v}
    if does == "switch":
        # The firmware's own clock at the change, so a test can time what follows on the board.
        out["uptime_ms"] = board.app.uptime_ms() if board.app else None
    return out


def _stall(board, ms):
    cut = min(int(board.world.get("switch_in_stall_ms") or 0), ms)
    out = {"ok": True, "stall_ms": ms}
    if cut:
        time.sleep_ms(cut)  # blocking, as the chip's flash write is: no task, no soft IRQ runs
        board.world.set("switch_in_stall_ms", 0)
        board.world.set("mains", not board.world["mains"])
        out["uptime_ms"] = board.app.uptime_ms() if board.app else None
    time.sleep_ms(ms - cut)
    return out


def _reply(board, line):
    try:
        text = line.decode()
    except UnicodeError:
        return {"ok": False, "error": "not UTF-8"}
    return command(board, text.strip())


def client(board):
    async def serve_one(r, w):
        # Read in bounded chunks, never readline(): a peer that sends a megabyte without a newline
        # must cost 2 x CONTROL_LINE_MAX of heap, not a megabyte.
        buf = b""
        skipping = False
        try:
            while True:
                chunk = await r.read(256)
                if not chunk:
                    break
                buf += chunk
                while True:
                    i = buf.find(b"\n")
                    if i < 0:
                        break
                    line = buf[:i]
                    buf = buf[i + 1 :]
                    if skipping or len(line) > CONTROL_LINE_MAX:
                        skipping = False
                        resp = {"ok": False, "error": "line too long"}
                    else:
                        resp = _reply(board, line)
                    w.write(json.dumps(resp).encode() + b"\n")
                    await w.drain()
                if len(buf) > CONTROL_LINE_MAX:
                    skipping = True
                    buf = b""
        except Exception as e:  # one bad control client must not disturb the firmware
            print("# emu: control client error", repr(e))
        # MicroPython's Stream.close() does nothing; wait_closed() is what closes the socket.
        w.close()
        try:
            await w.wait_closed()
        except OSError:
            pass

    return serve_one


async def serve(board, host, port):
    await asyncio.start_server(client(board), host, port)
