# Entry point in the MicroPython unix port: the unchanged firmware on the emulated board.
import sys

import board_emu
import sentinel

sentinel.run(board_emu.Board(sys.argv))
