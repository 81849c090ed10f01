"""The firmware's module list, read from `firmware/manifest.py` (MicroPython's manifest syntax).

One list for everything that puts the firmware somewhere: `holdover deploy` copies it, the
emulator's build compiles it (plus the emulator's own board layer), the tests check it. The file is
run the way MicroPython's `tools/manifestfile.py` runs it, with the two functions this firmware
uses; `require()` and `package()` are refused by name rather than half-supported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import holdover.firmware
from holdover.errors import HoldoverError

MANIFEST = "manifest.py"
# Run by the emulator only: the unix port's board layer and its entry point.
EMULATOR_ONLY = ("board_emu.py", "emu_world.py", "emu_control.py", "emu_main.py")
# Run as source by name (MicroPython runs main.py after boot.py); everything else goes as .mpy.
SOURCE = ("main.py",)


def firmware_dir() -> Path:
    return Path(holdover.firmware.__file__).parent


class ManifestError(HoldoverError, ValueError):
    pass


@dataclass(frozen=True)
class Module:
    path: Path  # the source file on this machine

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def on_board(self) -> str:
        """The file's name on the board."""
        return self.name if self.name in SOURCE else self.path.stem + ".mpy"


def read(path: Path | None = None) -> list[Module]:
    path = Path(path or firmware_dir() / MANIFEST)
    found: list[Module] = []

    def module(module_path: str, base_path: str = ".", opt: int | None = None) -> None:
        src = (path.parent / base_path / module_path).resolve()
        if not src.is_file():
            raise ManifestError(f"{path}: module({module_path!r}): no such file {src}")
        if any(m.path == src for m in found):
            raise ManifestError(f"{path}: module({module_path!r}) is listed twice")
        found.append(Module(src))

    def include(manifest_path: str) -> None:
        found.extend(read(path.parent / manifest_path))

    def unsupported(name: str) -> Callable[..., None]:
        def refuse(*args: object, **kw: object) -> None:
            raise ManifestError(f"{path}: {name}() is not supported here; list the files with module()")

        return refuse

    scope = {"module": module, "include": include}
    scope |= {n: unsupported(n) for n in ("require", "package", "freeze", "metadata")}
    try:
        # Our own file, run as MicroPython runs a manifest: plain Python calling module().
        exec(compile(path.read_text(), str(path), "exec"), scope)
    except OSError as e:
        raise ManifestError(f"cannot read {path}: {e}") from None
    except SyntaxError as e:
        raise ManifestError(f"{path}:{e.lineno}: {e.msg}") from None
    return found
