"""`holdover flash` without a board: the chip table, the image checks, the port choice, the dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serial.tools.list_ports_common import ListPortInfo
from typer.testing import CliRunner

from holdover.board import flash
from holdover.board.chips import CHIPS, Chip
from holdover.cli import app


def _image(tmp_path: Path, chip: Chip, full: bool = True, name: str = "fw.bin") -> Path:
    """An image with the header fields esptool's image format defines (magic, chip id at byte 12)
    and, for a full image, the partition table where 0x8000 of flash falls inside it."""
    head = bytes([0xE9, 3, 2, 0x20]) + (0x40080000).to_bytes(4, "little") + bytes([0xEE, 0, 0, 0])
    head += chip.image_id.to_bytes(2, "little") + bytes(10)
    data = bytearray(head + bytes(0x20000))
    if full:
        at = chip.partition_table
        data[at : at + 2] = flash.PARTITION_MAGIC
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def _port(device: str, vid: int | None, pid: int | None) -> ListPortInfo:
    p = ListPortInfo(device, skip_link_detection=True)
    p.vid, p.pid = vid, pid
    return p


def test_the_chip_table_agrees_with_esptool() -> None:
    from esptool.targets import CHIP_DEFS

    for key, chip in CHIPS.items():
        rom = CHIP_DEFS[key]
        assert (chip.name, chip.image_id, chip.offset) == (
            rom.CHIP_NAME,
            rom.IMAGE_CHIP_ID,
            rom.BOOTLOADER_FLASH_OFFSET,
        )


@pytest.mark.parametrize("key", list(CHIPS))
def test_each_chips_image_goes_to_its_offset(tmp_path: Path, key: str) -> None:
    chip = CHIPS[key]
    p = flash.plan(_image(tmp_path, chip), "/dev/ttyUSB7")
    assert p.chip == chip and p.image.chip == chip
    assert f"at 0x{chip.offset:x}" in "\n".join(p.describe())
    erase, write, verify = p.esptool_argv()
    assert erase[-1] == "erase-flash" and ["--chip", key] == erase[1:3]
    assert write[-2:] == [hex(chip.offset), str(p.image.path)] and verify[-2] == hex(chip.offset)
    assert {"esp32": 0x1000}.get(key, 0x0) == chip.offset


def test_flash_takes_exactly_the_chips_the_board_config_takes(tmp_path: Path) -> None:
    from esptool.targets import CHIP_DEFS

    from holdover.board.config_check import check_text
    from holdover.firmware import pins

    assert list(CHIPS) == list(pins.NAMES)
    base = {"sentinel_id": "s", "key": "5e0b8d2f7a4c9e1b3f6a8d0c2e5b7f9a", "wlan": {"ssid": "x"}}
    base["mqtt"] = {"host": "10.0.0.1"}
    for key in ("esp32s2", "esp32c6"):  # chips esptool knows and holdover does not
        assert any("chip: must be one of" in p for p in check_text(json.dumps({**base, "chip": key})))
        rom = CHIP_DEFS[key]
        other = Chip(key, rom.CHIP_NAME, rom.BOOTLOADER_FLASH_OFFSET, rom.IMAGE_CHIP_ID, "")
        with pytest.raises(flash.FlashError, match="not one holdover supports"):
            flash.plan(_image(tmp_path, other), "/dev/ttyUSB0")
        with pytest.raises(flash.FlashError, match=f"--chip {key}: not one of auto, esp32"):
            flash.plan(_image(tmp_path, CHIPS["esp32"]), "/dev/ttyUSB0", chip=key)


def test_an_image_for_another_chip_is_refused(tmp_path: Path) -> None:
    img = _image(tmp_path, CHIPS["esp32s3"])
    with pytest.raises(flash.FlashError, match="built for ESP32-S3, but the board is an ESP32;"):
        flash.plan(img, "/dev/ttyUSB0", chip="esp32")
    assert flash.plan(img, "/dev/ttyUSB0", chip="esp32s3").chip.key == "esp32s3"
    with pytest.raises(flash.FlashError, match="--chip esp8266: not one of auto, esp32"):
        flash.plan(img, "/dev/ttyUSB0", chip="esp8266")


def test_what_is_not_a_full_image_is_named(tmp_path: Path) -> None:
    with pytest.raises(flash.FlashError, match="application image only"):
        flash.read_image(_image(tmp_path, CHIPS["esp32"], full=False))
    (tmp_path / "x.bin").write_bytes(b"PK\x03\x04 a zip, not firmware" + bytes(64))
    with pytest.raises(flash.FlashError, match=r"not an ESP firmware image \(first byte 50, expected e9"):
        flash.read_image(tmp_path / "x.bin")
    odd = bytearray(_image(tmp_path, CHIPS["esp32"]).read_bytes())
    odd[12:14] = (0x77).to_bytes(2, "little")
    (tmp_path / "odd.bin").write_bytes(bytes(odd))
    with pytest.raises(flash.FlashError, match="chip id 119, not one holdover supports"):
        flash.read_image(tmp_path / "odd.bin")
    with pytest.raises(flash.FlashError, match="cannot read"):
        flash.read_image(tmp_path / "missing.bin")


def test_the_board_is_found_by_its_usb_bridge() -> None:
    mouse = _port("/dev/ttyS0", None, None)
    cp210x = _port("/dev/ttyUSB0", 0x10C4, 0xEA60)
    native = _port("/dev/ttyACM0", 0x303A, 0x1001)
    ftdi_other = _port("/dev/ttyUSB3", 0x0403, 0x6014)  # an FT232H: a JTAG adapter more often than an ESP32
    assert flash.pick_port(None, [mouse, cp210x, ftdi_other]).device == "/dev/ttyUSB0"
    assert flash.pick_port(None, [native]).what == "Espressif USB-Serial/JTAG"
    with pytest.raises(
        flash.FlashError,
        match=r"2 boards found: /dev/ttyACM0 \(Espressif.*\); /dev/ttyUSB0 \(Silicon Labs CP210x\); pass --port",
    ):
        flash.pick_port(None, [cp210x, native])
    with pytest.raises(flash.FlashError, match=r"no ESP32 board found on USB \(looked for 10c4:ea60, 1a86:7523"):
        flash.pick_port(None, [mouse, ftdi_other])
    assert flash.pick_port("/dev/ttyUSB5", [cp210x, native]).device == "/dev/ttyUSB5"


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path: Path) -> None:
    img = _image(tmp_path, CHIPS["esp32"])
    r = CliRunner().invoke(app, ["flash", "--dry-run", "--port", str(tmp_path / "no-such-port"), str(img)])
    assert r.exit_code == 0, r.output
    out = r.output
    for want in ("chip:   ESP32", "erase:", "write:  at 0x1000", "verify:", "reset:", "nothing was done"):
        assert want in out, out
    assert (
        f"esptool --chip esp32 --port {tmp_path / 'no-such-port'} --baud 460800 write-flash --flash-mode keep 0x1000 {img}"
        in out
    )
    r = CliRunner().invoke(app, ["flash", "--dry-run", "--chip", "esp32c3", "--port", "/dev/null", str(img)])
    assert r.exit_code == 2 and "built for ESP32, but the board is an ESP32-C3" in r.output


def test_flashing_a_port_with_no_chip_behind_it_fails_naming_the_port(tmp_path: Path) -> None:
    import os
    import tty

    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        p = flash.plan(_image(tmp_path, CHIPS["esp32"]), os.ttyname(slave))
        p = flash.Plan(p.port, p.chip, p.image, connect_attempts=1)
        with pytest.raises(flash.FlashError, match=f"{os.ttyname(slave)}: .*"):
            flash.flash(p, say=lambda s: None)
    finally:
        os.close(master)
        os.close(slave)
