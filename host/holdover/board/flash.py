"""`holdover flash`: put a MicroPython image on an ESP32 board with esptool, used as a library.

The checks are ours, the serial protocol is esptool's: find the board by its USB bridge's VID:PID
(or take --port), read what the image says it was built for (its first header carries the target
chip, and a full image has the partition table 0x8000 bytes into flash), refuse an image for another
chip or an application image without its bootloader, then erase, write at the chip's offset, verify
and reset. `--dry-run` prints the plan and the equivalent esptool command lines, touching nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from holdover.board.chips import CHIPS, Chip, by_image_id, by_name
from holdover.errors import FAILED, USAGE, HoldoverError

IMAGE_MAGIC = 0xE9  # esp_image_header_t.magic
PARTITION_MAGIC = b"\xaa\x50"  # the first entry of an ESP-IDF partition table
MAX_IMAGE = 16 << 20  # the largest flash an ESP32 module carries
BAUD = 460800

# USB-to-serial bridges on ESP32 boards, and Espressif's own USB (S3/C3 boards without one).
USB_IDS: dict[tuple[int, int], str] = {
    (0x10C4, 0xEA60): "Silicon Labs CP210x",
    (0x1A86, 0x7523): "WCH CH340",
    (0x1A86, 0x55D4): "WCH CH9102",
    (0x1A86, 0x55D3): "WCH CH343",
    (0x0403, 0x6001): "FTDI FT232R",
    (0x0403, 0x6010): "FTDI FT2232",
    (0x0403, 0x6015): "FTDI FT231X",
    (0x303A, 0x1001): "Espressif USB-Serial/JTAG",
    (0x303A, 0x0002): "Espressif USB (ROM download mode)",
    (0x303A, 0x4001): "Espressif USB (MicroPython, TinyUSB)",
}


class FlashError(HoldoverError, RuntimeError):
    """A flash that must not go ahead; the message says what was found and what to do."""

    exit_code = USAGE


@dataclass(frozen=True)
class Port:
    device: str
    what: str  # the bridge's name from its VID:PID
    serial_number: str = ""


def boards(ports: Iterable[Any] | None = None) -> list[Port]:
    """Serial ports whose USB VID:PID is an ESP32 board's bridge (pyserial's list_ports entries)."""
    if ports is None:
        from serial.tools import list_ports

        ports = list_ports.comports()
    found = []
    for p in ports:
        what = USB_IDS.get((p.vid, p.pid)) if p.vid is not None else None
        if what:
            found.append(Port(p.device, what, p.serial_number or ""))
    return sorted(found, key=lambda p: p.device)


def pick_port(port: str | None, ports: Iterable[Any] | None = None, missing_ok: bool = False) -> Port:
    if port:
        return Port(port, "given with --port")
    found = boards(ports)
    if not found and missing_ok:
        return Port("PORT", "no board on USB now: plug it in, or pass --port")
    if not found:
        known = ", ".join(f"{v:04x}:{p:04x}" for v, p in USB_IDS)
        raise FlashError(f"no ESP32 board found on USB (looked for {known}); plug one in or pass --port")
    if len(found) > 1:
        listed = "; ".join(f"{p.device} ({p.what})" for p in found)
        raise FlashError(f"{len(found)} boards found: {listed}; pass --port to choose one")
    return found[0]


@dataclass(frozen=True)
class Image:
    path: Path
    data: bytes
    chip: Chip

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def read_image(path: Path) -> Image:
    """Read a firmware image and work out the chip it was built for; refuses what is not a full
    ESP32-family image (naming what it looks like instead)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FlashError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) < 24 or data[0] != IMAGE_MAGIC:
        first = data[:1].hex() or "nothing"
        raise FlashError(f"{path} is not an ESP firmware image (first byte {first}, expected e9)")
    if len(data) > MAX_IMAGE:
        raise FlashError(f"{path} is {len(data)} bytes, larger than any ESP32 flash ({MAX_IMAGE})")
    image_id = int.from_bytes(data[12:14], "little")
    chip = by_image_id(image_id)
    if chip is None:
        raise FlashError(f"{path} was built for chip id {image_id}, not one holdover supports ({_supported()})")
    at = chip.partition_table
    if data[at : at + 2] != PARTITION_MAGIC:
        raise FlashError(
            f"{path} has no partition table at 0x{at:x}: it is an application image only, not a full "
            f"firmware (bootloader + partition table + MicroPython); use the .bin from "
            f"micropython.org/download for your board"
        )
    return Image(path, data, chip)


def _supported() -> str:
    return ", ".join(CHIPS)


def check_chip(image: Image, chip: Chip) -> None:
    if image.chip != chip:
        raise FlashError(
            f"{image.path.name} is built for {image.chip.name}, but the board is an {chip.name}; "
            f"flashing it would leave the board unbootable (get the {chip.name} image)"
        )


@dataclass(frozen=True)
class Plan:
    port: Port
    chip: Chip
    image: Image
    erase: bool = True
    baud: int = BAUD
    connect_attempts: int = 7  # esptool's default: resets into the ROM loader, tried again

    def esptool_argv(self) -> list[list[str]]:
        """The esptool command lines that do the same by hand."""
        head = ["esptool", "--chip", self.chip.key, "--port", self.port.device, "--baud", str(self.baud)]
        out = [[*head, "erase-flash"]] if self.erase else []
        out.append([*head, "write-flash", "--flash-mode", "keep", hex(self.chip.offset), str(self.image.path)])
        out.append([*head, "verify-flash", hex(self.chip.offset), str(self.image.path)])
        return out

    def describe(self) -> list[str]:
        steps = [
            f"port:   {self.port.device} ({self.port.what})",
            f"chip:   {self.chip.name}",
            f"image:  {self.image.path} ({len(self.image.data)} bytes, sha256 {self.image.sha256[:16]}…, "
            f"built for {self.image.chip.name})",
        ]
        if self.erase:
            steps.append("erase:  the whole flash (the board's files and config go too)")
        steps.append(f"write:  at 0x{self.chip.offset:x} ({self.chip.name}'s bootloader offset), {self.baud} baud")
        steps.append("verify: read back and compared (esptool's verify-flash)")
        steps.append("reset:  hard reset into the new firmware")
        return steps


def plan(
    image_path: Path,
    port: str | None,
    chip: str = "auto",
    erase: bool = True,
    ports: Iterable[Any] | None = None,
    dry_run: bool = False,
) -> Plan:
    """What a flash would do, from the image and the arguments alone (no board needed)."""
    image = read_image(image_path)
    if chip != "auto":
        if chip not in CHIPS:
            raise FlashError(f"--chip {chip}: not one of auto, {_supported()}")
        check_chip(image, CHIPS[chip])
    return Plan(pick_port(port, ports, missing_ok=dry_run), CHIPS[chip] if chip != "auto" else image.chip, image, erase)


def flash(p: Plan, say: Callable[[str], None] = print) -> None:
    """Do it: connect, check the chip esptool finds against the image, erase, write, verify, reset."""
    from esptool.cmds import attach_flash, detect_chip, erase_flash, reset_chip, run_stub, verify_flash, write_flash

    try:
        with detect_chip(p.port.device, p.baud, connect_attempts=p.connect_attempts) as esp:
            found = by_name(esp.CHIP_NAME)
            if found is None:
                raise FlashError(f"{p.port.device}: the board is an {esp.CHIP_NAME}, not one holdover supports")
            say(f"connected: {esp.get_chip_description()} on {p.port.device}")
            if found != p.chip:
                raise FlashError(f"--chip {p.chip.key}, but the board on {p.port.device} is an {found.name}")
            check_chip(p.image, found)
            esp = run_stub(esp)
            attach_flash(esp)
            if p.erase:
                say("erasing the flash (takes up to a minute)")
                erase_flash(esp)
            say(f"writing {len(p.image.data)} bytes at 0x{found.offset:x}")
            write_flash(esp, [(found.offset, p.image.data)])
            verify_flash(esp, [(found.offset, p.image.data)])
            say("verified; resetting the board")
            reset_chip(esp, "hard-reset")
    except FlashError as e:
        e.exit_code = FAILED  # found at the board: the flash was tried, not refused beforehand
        raise
    except Exception as e:  # esptool's FatalError and serial errors: say which step and port
        raise FlashError(f"{p.port.device}: {type(e).__name__}: {e}", exit_code=FAILED) from None
