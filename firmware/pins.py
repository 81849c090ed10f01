# The chips holdover supports, and their pin facts (the esp32 port's pin tables and Espressif's
# datasheets). One table for both ends: the board's config validator (config.py) refuses a pin
# by it, and the host's `holdover check-config` and `holdover flash` (board/chips.py) take the
# list of chips from it, so a chip the board config refuses is one flash refuses too.
NAMES = ("esp32", "esp32s3", "esp32c3")  # a tuple: MicroPython's dicts keep no order


def _r(a, b):
    return tuple(range(a, b + 1))


CHIPS = {
    "esp32": {
        "name": "ESP32",
        "gpios": _r(0, 19) + (21, 22, 23, 25, 26, 27) + _r(32, 39),  # no 20, 24, 28-31 or >= 40
        "flash": _r(6, 11),
        "psram": (16, 17),  # WROVER modules: the PSRAM's clock and chip select
        "uart0": (1, 3),
        "usb": (),
        "strapping": (0, 2, 5, 12, 15),  # 0: boot mode; 12: flash voltage
        # The devkit's own LED (through a resistor to ground, which keeps GPIO2 low at reset as
        # download mode wants): the one strapping pin a status LED may use.
        "onboard_led": 2,
        "input_only": _r(34, 39),
        "adc1": _r(32, 39),
        "adc2": (0, 2, 4, 12, 13, 14, 15, 25, 26, 27),
    },
    "esp32s3": {
        "name": "ESP32-S3",
        "gpios": _r(0, 21) + _r(26, 48),
        "flash": _r(26, 32),
        "psram": _r(33, 37),  # octal PSRAM/flash (R8 modules)
        "uart0": (43, 44),
        "usb": (19, 20),
        "strapping": (0, 3, 45, 46),
        "input_only": (),
        "adc1": _r(1, 10),
        "adc2": _r(11, 20),
    },
    "esp32c3": {
        "name": "ESP32-C3",
        "gpios": _r(0, 21),
        "flash": _r(11, 17),
        "psram": (),
        "uart0": (20, 21),
        "usb": (18, 19),
        "strapping": (2, 8, 9),
        "input_only": (),
        "adc1": _r(0, 4),
        "adc2": (5,),
    },
}
