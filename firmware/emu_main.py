# Entry point in the MicroPython unix port: the unchanged firmware on the emulated board.
# What the firmware shares with the board layer (asyncio, json, line) is imported first, so that
# only the layer's own code is measured below.
import asyncio  # noqa: F401
import gc
import json  # noqa: F401
import sys

import line  # noqa: F401

gc.collect()
_before = gc.mem_alloc()
import board_emu  # noqa: E402

gc.collect()
# The emulated board layer's own code (its world and control port apart, EMU_ONLY): a chip holds
# board_esp32's instead, which the heap test puts in its place (board.emulator.esp32_layer_bytes).
board_emu.Board.LAYER = gc.mem_alloc() - _before - board_emu.EMU_ONLY_BYTES
del _before
import sentinel  # noqa: E402

sentinel.run(board_emu.Board(sys.argv))
