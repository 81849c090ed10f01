"""A sentinel's signing key: made here, kept in a 0600 file, the same bytes in the board's config."""

from __future__ import annotations

import secrets
from pathlib import Path

from holdover.errors import HoldoverError
from holdover.files import write_private
from holdover.firmware import keycheck, protocol

KEY_BYTES = 32  # HMAC-SHA256's block is 64 bytes; 32 random ones are its full strength


class KeyFileError(HoldoverError, OSError):
    """The key file could not be written (exists, or the directory is not ours to write)."""


def generate() -> str:
    key = secrets.token_hex(KEY_BYTES)
    assert keycheck.key_problem(key) is None
    return key


def write(sid: str, directory: Path, force: bool = False) -> tuple[Path, str]:
    """A new key for `sid` in DIRECTORY/SID.key, created 0600 (never readable by others, not even
    for a moment: the mode is set at creation). An existing file is kept unless `force`."""
    if not protocol.valid_sid(sid):
        raise KeyFileError(f"{sid!r} is not a sentinel id: 1-32 of A-Z a-z 0-9 _ -")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KeyFileError(f"cannot make {directory}: {e.strerror}") from None
    path = directory / f"{sid}.key"
    key = generate()
    try:
        write_private(path, key + "\n", exclusive=not force)
    except FileExistsError:
        raise KeyFileError(f"{path} exists; keep it, or --force to replace it (the board then needs it)") from None
    except OSError as e:
        raise KeyFileError(f"cannot write {path}: {e.strerror}") from None
    return path, key
