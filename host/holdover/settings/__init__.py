"""The bridge's TOML configuration, validated with every problem listed by key: one pydantic model
per section, each in the module of its wing (base.py what all are made of; bridge.py, node.py,
cluster.py), put together here as Settings, with loading, environment overrides and the messages.
Every model is importable from here, as `from holdover.settings import UpsSettings`."""

from __future__ import annotations

import difflib
import os
import socket
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from holdover.settings.base import NODE_NAME, ConfigError, ConfigPath, SignalName, _Strict
from holdover.settings.bridge import (
    SMS_SCHEME,
    AlertChannelSettings,
    AlertSettings,
    HaSettings,
    HookSettings,
    JournalSettings,
    MqttSettings,
    NutServerSettings,
    SentinelSettings,
    SerialSettings,
    WebSettings,
    sms_numbers,
)
from holdover.settings.cluster import PeerSettings, SlurmCircuit, SlurmSettings, SlurmSignal
from holdover.settings.node import (
    NIS_ADDRESS,
    NUT_UPS,
    BondingSettings,
    DiagnoseSettings,
    DongleSettings,
    FailoverSettings,
    ProtectSettings,
    UplinkSettings,
    UpsSettings,
)

__all__ = [
    "ENV_PREFIX",
    "NIS_ADDRESS",
    "NODE_NAME",
    "NUT_UPS",
    "SMS_SCHEME",
    "AlertChannelSettings",
    "AlertSettings",
    "BondingSettings",
    "ConfigError",
    "ConfigPath",
    "DiagnoseSettings",
    "DongleSettings",
    "FailoverSettings",
    "HaSettings",
    "HookSettings",
    "JournalSettings",
    "MqttSettings",
    "NutServerSettings",
    "PeerSettings",
    "ProtectSettings",
    "SentinelSettings",
    "SerialSettings",
    "Settings",
    "SignalName",
    "SlurmCircuit",
    "SlurmSettings",
    "SlurmSignal",
    "UplinkSettings",
    "UpsSettings",
    "WebSettings",
    "environment_overrides",
    "load",
    "parse",
    "section_model",
    "sms_numbers",
]


class Settings(_Strict):
    mqtt: MqttSettings = MqttSettings()
    journal: JournalSettings = JournalSettings()
    sentinels: list[SentinelSettings] = Field(default_factory=list)
    serial: list[SerialSettings] = Field(default_factory=list)
    hooks: list[HookSettings] = Field(default_factory=list)
    alerts: AlertSettings = AlertSettings()
    protect: ProtectSettings = ProtectSettings()
    ups: UpsSettings = UpsSettings()
    nut_server: NutServerSettings = NutServerSettings()
    failover: FailoverSettings = FailoverSettings()
    web: WebSettings = WebSettings()
    dongle: DongleSettings = DongleSettings()
    bonding: BondingSettings = BondingSettings()
    diagnose: DiagnoseSettings = DiagnoseSettings()
    ha: HaSettings = HaSettings()
    slurm: SlurmSettings = SlurmSettings()
    cluster: PeerSettings = PeerSettings()

    @model_validator(mode="after")
    def _unique_sentinels(self) -> Settings:
        ids = [s.id for s in self.sentinels]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"sentinels: duplicate id(s) {dup}")
        sms = [c.name for c in self.alerts.channels if c.url.startswith(SMS_SCHEME)]
        if sms and not self.dongle.enabled:
            raise ValueError(f"alert channel(s) {sms} send SMS through the dongle: [dongle] enabled = true")
        names = [u.name for u in self.failover.uplinks]
        if self.dongle.uplink and self.dongle.uplink not in names:
            raise ValueError(f"dongle.uplink {self.dongle.uplink!r} is not a [failover] uplink ({names})")
        for i, c in enumerate(self.slurm.circuits):
            if c.sentinel is not None and c.sentinel not in ids:
                raise ValueError(f"slurm.circuits[{i}].sentinel {c.sentinel!r} is not a [[sentinels]] id ({ids})")
            if c.ups and not self.ups.enabled:
                raise ValueError(f"slurm.circuits[{i}].ups: no [ups] to read (nut, apcupsd or runtime_s)")
        if self.dongle.data_cap_mb and not self.dongle.uplink:
            raise ValueError("dongle.data_cap_mb counts on dongle.uplink: name the [failover] uplink it is")
        return self

    def keys(self) -> dict[str, bytes]:
        return {s.id: s.key.encode() for s in self.sentinels}

    @property
    def node(self) -> str:
        """This machine's name in its MQTT topics and in Home Assistant (the host name by default)."""
        return self.failover.node

    @property
    def client_id(self) -> str:
        """The bridge's MQTT client id: one per node, so bridges on one broker keep their own sessions."""
        return self.mqtt.client_id or f"holdover-bridge-{self.node}"

    def dashboard_url(self) -> str | None:
        """Where people open the dashboard from elsewhere: [ha] url, else [web] host and port
        unless it listens on loopback only (a link to 127.0.0.1 opens the reader's own machine)."""
        if self.ha.url:
            return self.ha.url
        if not self.web.enabled or self.web.host in ("127.0.0.1", "::1", "localhost"):
            return None
        host = socket.getfqdn() if self.web.host in ("0.0.0.0", "::") else self.web.host
        return f"http://{host}:{self.web.port}/"


ENV_PREFIX = "HOLDOVER_"  # HOLDOVER_MQTT__PORT=1884, HOLDOVER_WEB__TOKEN_FILE=..., HOLDOVER_SENTINELS='[...]'


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The settings model inside an annotation (list[X], X | None), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = section_model(arg)
        if found is not None:
            return found
    return None


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model at `loc` (the unknown key's parent) takes: for did-you-mean."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model else None
        model = section_model(field.annotation) if field else None
        if model is None:
            return []
    return list(model.model_fields) if model else []


_TYPES = {
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list [...]",
}


def _describe(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = _fields_at(err["loc"][:-1])
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
            msg = f"unknown key; did you mean {close[0]!r}?" if close else f"unknown key (known: {', '.join(known)})"
        elif err["type"] in _TYPES and isinstance(err["input"], str):
            msg = f"must be {_TYPES[err['type']]}, not the string {err['input']!r} (no quotes)"
        elif err["type"] in _TYPES:
            msg = f"must be {_TYPES[err['type']]}, not {type(err['input']).__name__} {err['input']!r}"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def environment_overrides() -> dict[str, Any]:
    """HOLDOVER_SECTION__KEY variables as a config fragment (pydantic-settings reads them: case,
    nesting, JSON for lists and tables); their values are still strings, typed by validation."""
    from pydantic_settings import EnvSettingsSource

    src = EnvSettingsSource(Settings, env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False)  # type: ignore[arg-type]
    return src()


def parse(
    data: dict[str, Any],
    origin: str = "config",
    env: bool = True,
    base: Path | None = None,
    secrets_later: bool = False,
) -> Settings:
    """The file's values strictly as written (a quoted port is an error, as on the board), then
    the environment's over them (strings by nature, so those are converted). Relative paths are
    taken from `base` (the config file's directory) when given."""
    if not data:
        raise ConfigError(f"{origin}: empty; holdover.toml.example has every setting with its default")
    context: dict[str, Any] = {"secrets_later": secrets_later}
    if base is not None:
        context["base"] = base
    try:
        cfg = Settings.model_validate(data, strict=True, context=context)
    except ValidationError as e:
        raise ConfigError(f"{origin}: {e.error_count()} problem(s)\n{_describe(e)}") from None
    over = environment_overrides() if env else {}
    if not over:
        return cfg
    try:
        return Settings.model_validate(_merge(data, over), context=context)
    except ValidationError as e:
        names = ", ".join(sorted(k for k in os.environ if k.upper().startswith(ENV_PREFIX)))
        raise ConfigError(f"{origin} with {names}: {e.error_count()} problem(s)\n{_describe(e)}") from None


def load(path: Path, secrets_later: bool = False) -> Settings:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file (byte {e.start} is not UTF-8); expected TOML") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return parse(data, str(path), base=path.resolve().parent, secrets_later=secrets_later)
