"""The firmware seen from the host: the emulator (and, later, flashing a real board)."""
