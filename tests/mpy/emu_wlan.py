# Runs inside MicroPython: the emulated board's WLAN against what the esp32 port does, without
# the rest of the board. Prints one JSON line of what each step gave.
import json
import time

from emu_world import WLAN

world = {"wlan": True}  # the access point, as emu_world.World reads it
w = WLAN(world)
out = {}
w.active(True)
w.connect("lab", "pw")
out["status_after_connect"] = w.status()
try:
    w.connect("lab", "pw")  # the naive keeper's mistake: connect() while connecting
    out["second_connect"] = "accepted"
except OSError as e:
    out["second_connect"] = str(e)
t = time.ticks_ms()
w.tick(time.ticks_add(t, 400))
out["joined"] = w.isconnected()
world["wlan"] = False  # the access point goes away
w.tick(time.ticks_add(t, 500))
out["status_after_drop"] = w.status()  # the driver is already reconnecting by itself
try:
    w.connect("lab", "pw")
    out["connect_after_drop"] = "accepted"
except OSError as e:
    out["connect_after_drop"] = str(e)
w.tick(time.ticks_add(t, 2100))
out["status_no_ap"] = w.status()
w.tick(time.ticks_add(t, 2150))
out["status_retrying"] = w.status()
world["wlan"] = True
w.tick(time.ticks_add(t, 2500))
out["rejoined_by_itself"] = w.isconnected()
print(json.dumps(out))
