# The modules that go onto a board, in the syntax of MicroPython's manifest.py (module(), include()).
# `holdover deploy` copies exactly these (compiled with mpy-cross for the board's chip, main.py as
# source, since the board runs it by name after boot), the emulator runs them plus its own board
# layer (board_emu.py, emu_world.py, emu_control.py, emu_main.py), and tests/board/test_deploy.py checks
# that no firmware file is left out of both lists.
module("main.py")
module("board_esp32.py")
module("sentinel.py")
module("commands.py")
module("protocol.py")
module("config.py")
module("jsoncheck.py")
module("pins.py")
module("keycheck.py")
module("line.py")
module("outbox.py")
module("mains.py")
module("battery.py")
module("uplink.py")
module("relay.py")
module("led.py")
module("wifi.py")
module("mqtt.py")
module("netio.py")
module("ntp.py")
module("announce.py")
module("discovery.py")
module("version.py")
