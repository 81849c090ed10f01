# The firmware is plain MicroPython; this file only lets the host package ship it (and
# import protocol.py from it) as holdover.firmware. The board never imports it.
