"""O_DIRECT or buffered, per device, from the device's own saves: the first large periodic save is
written O_DIRECT, the next buffered, and the faster (buffered only by 10 %) is kept for every save
after, emergencies included, which never probe. A filesystem that refuses O_DIRECT (tmpfs) is
written buffered from the first save. The size threshold is lowered here so a small model probes;
the rates of such small saves are noise, so the tests check the rule against the record, and set
the record to make each outcome happen."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from holdover.train import ckpt
from holdover.train.ckpt import engine, iomode
from holdover.train.guard import Guard


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iomode, "MIN_PROBE_BYTES", 0)


def _guard(root: Path, log: list[str], **kw: Any) -> Guard:
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 128)).sum().backward()
    opt.step()
    kw.setdefault("interval", 1)
    return Guard(
        root, "io", model=model, optimizer=opt, signal=None, registry_dir=root.parent / "reg", log=log.append, **kw
    )


def _io(root: Path, step: int) -> str:
    return ckpt.verify(root / ckpt.step_dirname(step)).meta["io"]


def _record(root: Path) -> dict[str, Any]:
    return json.loads((root / iomode.RECORD).read_text())


@pytest.mark.parametrize("background", [True, False])
def test_the_first_periodic_saves_measure_both_modes_and_the_faster_is_kept(tmp_path: Path, background: bool) -> None:
    root = tmp_path / "ckpt"
    log: list[str] = []
    g = _guard(root, log, background=background)
    for step in (1, 2, 3):
        g.step_end(step)
        g.wait_background()
    rec = _record(root)
    assert _io(root, 1) == "direct" and _io(root, 2) == "buffered"
    assert rec["direct"] > 0 and rec["buffered"] > 0 and "refused" not in rec
    chosen = "buffered" if rec["buffered"] >= 1.1 * rec["direct"] else "direct"
    assert _io(root, 3) == chosen
    (said,) = [m for m in log if "saves on this device use" in m]
    assert ("O_DIRECT writes" if chosen == "direct" else "buffered writes") in said
    assert f"O_DIRECT {rec['direct'] / 1e6:.0f} MB/s" in said
    g.close()


def test_an_emergency_never_probes_and_takes_what_is_known(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    log: list[str] = []
    g = _guard(root, log, interval=None)
    root.mkdir(parents=True)
    dev = root.stat().st_dev
    for rates, want in (
        ({"direct": 1_000, "buffered": 2_000}, "buffered"),
        ({"direct": 2_000, "buffered": 1_050}, "direct"),
    ):
        (root / iomode.RECORD).write_text(json.dumps({"device": dev, **rates}))
        rid = g.request("mains_lost")
        g.step_end(len(log) + 10)
        d = Path(g.requests()[rid]["dir"])
        assert ckpt.verify(d).meta["io"] == want, rates
        log.append(want)
    # With nothing measured, an emergency writes O_DIRECT and its rate becomes the first figure;
    # it never tries buffered to compare.
    (root / iomode.RECORD).unlink()
    rid = g.request("mains_lost")
    g.step_end(50)
    assert ckpt.verify(Path(g.requests()[rid]["dir"])).meta["io"] == "direct"
    assert set(_record(root)) == {"device", "direct"}
    g.close()


def test_a_record_from_another_device_or_garbled_is_measured_again(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / iomode.RECORD).write_text(json.dumps({"device": root.stat().st_dev + 1, "direct": 1, "buffered": 9}))
    assert iomode.direct(root, probe=True) is True  # another disk's figures: probe from the start
    assert iomode.direct(root) is True
    (root / iomode.RECORD).write_text("{not json")
    assert iomode.direct(root, probe=True) is True


def test_a_filesystem_that_refuses_o_direct_is_written_buffered_from_the_first_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This kernel's tmpfs takes O_DIRECT (since 6.6), so the refusal (EINVAL at open, as FUSE and
    # older tmpfs give it) is made at the syscall the writer makes.
    real = os.open

    def refusing(path: Any, flags: int, *a: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a)

    monkeypatch.setattr(engine.os, "open", refusing)
    log: list[str] = []
    root = tmp_path / "ckpt"
    g = _guard(root, log, background=False)
    for step in (1, 2):
        g.step_end(step)
    assert _io(root, 1) == _io(root, 2) == "buffered"
    assert _record(root)["refused"] is True
    assert sum("O_DIRECT refused on this filesystem" in m for m in log) == 1, log
    assert iomode.direct(root, probe=True) is False
    g.close()


def test_a_fixed_mode_is_kept_and_a_wrong_one_named(tmp_path: Path) -> None:
    log: list[str] = []
    g = _guard(tmp_path / "ckpt", log, io="buffered", background=False)
    g.step_end(1)
    assert _io(tmp_path / "ckpt", 1) == "buffered" and not (tmp_path / "ckpt" / iomode.RECORD).exists()
    g.close()
    with pytest.raises(ValueError, match="io='fast': one of auto, direct, buffered"):
        _guard(tmp_path / "x", log, io="fast")
