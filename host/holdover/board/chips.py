"""The ESP32 family as flashing and deploying need it: where the image goes, what it says it is for,
which bytecode the chip runs. Facts from Espressif's ESP-IDF (esp_image_header_t's chip_id, the
second-stage bootloader's offset per target) and MicroPython's mpy-cross (-march)."""

from __future__ import annotations

from dataclasses import dataclass


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


CHIPS = {
    c.key: c
    for c in (
        # The original ESP32 and the S2 keep their ROM's first 4 KiB free: the bootloader goes at 0x1000.
        Chip("esp32", "ESP32", 0x1000, 0, "xtensawin"),
        Chip("esp32s2", "ESP32-S2", 0x1000, 2, "xtensawin"),
        Chip("esp32s3", "ESP32-S3", 0x0, 9, "xtensawin"),
        Chip("esp32c3", "ESP32-C3", 0x0, 5, "rv32imc"),
        Chip("esp32c6", "ESP32-C6", 0x0, 13, "rv32imc"),
    )
}


def by_name(chip_name: str) -> Chip | None:
    """The chip esptool detected, by its CHIP_NAME ("ESP32", "ESP32-S3", ...)."""
    return next((c for c in CHIPS.values() if c.name == chip_name.upper()), None)


def by_image_id(image_id: int) -> Chip | None:
    return next((c for c in CHIPS.values() if c.image_id == image_id), None)
