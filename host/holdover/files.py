"""Small files written so that a reader never sees half of one: the one way holdover writes a
record, a registration or a secret. Imports nothing of holdover's, so `holdover.train` uses it too.

- `write_atomic`: a temporary file beside the target, renamed over it; `durable` adds the fsyncs
  (the file's, then its directory's) that make the rename survive a power cut.
- `write_private`: a secret (a key, a password), mode 0600 from the moment it exists, never
  readable by others even for an instant; `exclusive` refuses to replace one that is there.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o644, durable: bool = True) -> Path:
    raw = data.encode() if isinstance(data, str) else data
    # The pid in the name: two processes writing the same target never share a temporary file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask never loosens or tightens what was asked
        _write_all(fd, raw)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)
    return path


def write_private(path: Path, data: str | bytes, *, exclusive: bool = False) -> Path:
    """Raises FileExistsError if `exclusive` and the file is there."""
    raw = data.encode() if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a rewrite of a file made looser by hand
        _write_all(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def kept_secret(path: Path) -> str | None:
    """A password kept in a 0600 file by an earlier run, or None: a re-run keeps what is deployed."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
