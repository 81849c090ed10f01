# Entry point on the ESP32 (MicroPython runs main.py after boot.py).
import board_esp32
import sentinel

sentinel.run(board_esp32.Board())
