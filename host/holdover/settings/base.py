"""What every section of the config is made of: the strict model, a path from the config's own
directory, a secret read from a file of its own, a signal's name, a node's name; and ConfigError."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationInfo, model_validator

from holdover.errors import USAGE, HoldoverError


class ConfigError(HoldoverError, ValueError):
    """A config file that cannot be used; the message lists each problem by key."""

    exit_code = USAGE
    what = "bad config"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _secret(path: Path, key: str) -> str:
    """A secret kept in a file of its own (a key, a password): read when the config loads, so an
    unreadable one is a config error by its key, not a failure later."""
    try:
        return path.read_text().strip()
    except OSError as e:
        raise ValueError(f"{key}: cannot read {path}: {e.strerror}") from None


class _PasswordFromFile(_Strict):
    """For sections with `password` and `password_file`: the file, when given, is read at load.
    Loaded with `secrets_later` (the commands that make those files: broker-config, and
    install-service before it), a file not there yet is left for them to write."""

    @model_validator(mode="after")
    def _password_file(self, info: ValidationInfo) -> _PasswordFromFile:
        path = getattr(self, "password_file", None)
        if path is None or ((info.context or {}).get("secrets_later") and not path.exists()):
            return self
        self.password = _secret(path, "password_file")
        return self


def _as_path(v: object, info: ValidationInfo) -> object:
    """A path from the config: `~` expanded, and a relative one taken from the config file's
    directory (load() passes it), not from wherever the command happens to run."""
    if not isinstance(v, str):
        return v
    p = Path(v).expanduser()
    base = (info.context or {}).get("base") if info is not None else None
    return p if p.is_absolute() or base is None else Path(base) / p


# A path is a string in TOML; checked strictly (see parse), pydantic would want a Path object.
ConfigPath = Annotated[Path, BeforeValidator(_as_path)]


def _signal_name(v: str) -> str:
    name = v.upper().removeprefix("SIG")
    if name not in signal.Signals.__members__ and f"SIG{name}" not in signal.Signals.__members__:
        raise ValueError(f"{v!r} is not a signal (USR1, USR2, TERM, INT...)")
    return name


SignalName = Annotated[str, AfterValidator(_signal_name)]


# A node's name: in its MQTT topics, its broker login (holdover-node-NAME) and Home Assistant.
NODE_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
