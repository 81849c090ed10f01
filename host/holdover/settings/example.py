"""holdover.toml.example, written from the settings' own models: every setting with its default
and what it is for (`holdover config-example` prints it; a test keeps the file in the repository
equal to it). Values in EXAMPLES show the shape of what has no default."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from holdover.settings import ENV_PREFIX, Settings, section_model

# Values that show the shape of what has no default: required keys and the entries of lists of tables.
EXAMPLES: dict[str, Any] = {
    "sentinels.id": "rack1",
    "sentinels.key_file": "/etc/holdover/rack1.key",
    "serial.url": "/dev/serial/by-id/usb-Silicon_Labs_CP2102_USB_to_UART_Bridge_Controller_0001-if00-port0",
    "hooks.events": ["mains_lost", "battery_critical"],
    "hooks.run": "/usr/local/bin/on-power-loss",
    "alerts.channels.name": "phone",
    "alerts.channels.url": "ntfys://ntfy.sh/holdover-site1",
    "failover.uplinks.name": "wan",
    "failover.uplinks.dev": "eth0",
    "failover.uplinks.gateway": "192.168.1.1",
    "failover.node": "gpu-node-1",
    "mqtt.password_file": "/etc/holdover/bridge.password",
    "protect.registry": "/run/user/1000/holdover",
    "web.token_file": "/etc/holdover/web.token",
    "dongle.password_file": "/etc/holdover/dongle.password",
    "slurm.circuits.name": "rack1",
    "slurm.circuits.sentinel": "rack1",
    "slurm.circuits.nodes": "gpu[01-04]",
    "slurm.signals.partition": "lightning",
    "slurm.signals.job_name": "train-*",
    "slurm.signals.signal": "USR1",
    "slurm.conf": "/etc/slurm/slurm.conf",
    "slurm.grace": 30.0,
}
# Sections whose one example entry is live in the example (a bridge needs a sentinel); the other
# lists of tables are shown commented out.
_LIVE_EXAMPLES = ("sentinels",)


def _toml_value(v: Any) -> str:
    import tomli_w

    if isinstance(v, list):  # on one line, so that a commented-out example stays commented
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    v = str(v) if isinstance(v, Path) else v
    return tomli_w.dumps({"v": v}).strip().removeprefix("v = ")


def _render(model: type[BaseModel], path: str, out: list[str], prefix: str, entry: bool) -> None:
    """One table's keys, then its sub-tables (TOML wants a table's own keys first)."""
    later: list[tuple[str, type[BaseModel], bool]] = []
    for name, f in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        sub = section_model(f.annotation)
        if sub is not None:
            later.append((name, sub, typing.get_origin(f.annotation) is list))
            continue
        desc = f.description or ""
        if typing.get_origin(f.annotation) is Literal:
            desc += f" (one of: {', '.join(typing.get_args(f.annotation))})"
        out.append(f"{prefix}# {desc}{' (required)' if f.is_required() else ''}")
        if key in EXAMPLES and (entry or f.is_required()):
            out.append(f"{prefix}{name} = {_toml_value(EXAMPLES[key])}")
        elif f.default_factory is not None and not isinstance(f.default_factory(), list | dict):
            # A default that depends on the machine: shown with an example, not set.
            out.append(f"{prefix}# {name} = {_toml_value(EXAMPLES[key])}")
        else:
            default = f.default_factory() if f.default_factory is not None else f.default
            unset = default is None or entry  # an entry's optional keys are shown, not set
            shown = EXAMPLES.get(key, "") if default is None else default
            out.append(f"{prefix}{'# ' if unset else ''}{name} = {_toml_value(shown)}")
    for name, sub, many in later:
        key = f"{path}.{name}" if path else name
        out.append("")
        live = not prefix and (not many or name in _LIVE_EXAMPLES)
        p = "" if live else "# "
        if sub.__doc__ and not sub.__doc__.startswith(sub.__name__ + "("):
            out.append(f"# {sub.__doc__.strip().splitlines()[0]}")
        out.append(f"{p}[[{key}]]" if many else f"{p}[{key}]")
        _render(sub, key, out, p, many)


def example_toml() -> str:
    """holdover.toml.example: every setting with its default and what it is for, from these models
    (`holdover config-example` prints it; a test keeps the file in the repository equal to it)."""
    out = [
        "# holdover.toml: the bridge's configuration. Every setting, with its default and what it is for.",
        "# Generated from holdover/settings/ (`holdover config-example`); keys left out take these defaults.",
        f"# Any setting can be overridden from the environment: {ENV_PREFIX}SECTION__KEY, e.g.",
        f"# {ENV_PREFIX}MQTT__HOST=10.0.0.2 or {ENV_PREFIX}WEB__TOKEN_FILE=/etc/holdover/web.token.",
    ]
    _render(Settings, "", out, "", False)
    return "\n".join(out).replace("\n\n\n", "\n\n") + "\n"
