"""The ESP32 family as flashing and deploying need it: where the image goes, what it says it is for,
which bytecode the chip runs. Facts from Espressif's ESP-IDF (esp_image_header_t's chip_id, the
second-stage bootloader's offset per target) and MicroPython's mpy-cross (-march)."""

from __future__ import annotations

from dataclasses import dataclass

from holdover.firmware import pins


@dataclass(frozen=True)
class Chip:
    key: str  # as the board config and --chip spell it
    name: str  # as esptool reports it (CHIP_NAME)
    offset: int  # where a full firmware image (bootloader first) is written
    image_id: int  # esp_image_header_t.chip_id: what an image built for this chip carries
    march: str  # mpy-cross architecture for native code

    @property
    def partition_table(self) -> int:
        """Where the partition table sits inside a full image (0x8000 in flash)."""
        return 0x8000 - self.offset


# Where each chip's image goes and what it carries. Which chips there are is the firmware's
# (pins.NAMES): a chip the board config refuses is one `holdover flash` refuses too.
_FLASH = {
    # The original ESP32 keeps its ROM's first 4 KiB free: the bootloader goes at 0x1000.
    "esp32": ("ESP32", 0x1000, 0, "xtensawin"),
    "esp32s3": ("ESP32-S3", 0x0, 9, "xtensawin"),
    "esp32c3": ("ESP32-C3", 0x0, 5, "rv32imc"),
}
CHIPS = {key: Chip(key, *_FLASH[key]) for key in pins.NAMES}


def by_name(chip_name: str) -> Chip | None:
    """The chip esptool detected, by its CHIP_NAME ("ESP32", "ESP32-S3", ...)."""
    return next((c for c in CHIPS.values() if c.name == chip_name.upper()), None)


def by_image_id(image_id: int) -> Chip | None:
    return next((c for c in CHIPS.values() if c.image_id == image_id), None)
