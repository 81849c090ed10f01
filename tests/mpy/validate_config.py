# Runs inside MicroPython: validates the board config file in argv[1] with the firmware's
# own validator and prints the error (or "ok").
import sys

import config

try:
    config.load(sys.argv[1])
    print("ok")
except config.ConfigError as e:
    print("error:", e)
