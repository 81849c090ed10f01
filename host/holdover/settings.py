"""The bridge's TOML configuration, validated with every problem listed by key."""

from __future__ import annotations

import ipaddress
import re
import signal
import socket
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from holdover import events
from holdover.firmware import protocol


class ConfigError(ValueError):
    """A config file that cannot be used; the message lists each problem by key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MqttSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    username: str = ""
    password: str = ""
    client_id: str = "holdover-bridge"
    keepalive: int = Field(30, ge=5, le=3600)
    ha_commands: bool = Field(
        True, description="forward Home Assistant's ON/OFF on holdover/<id>/relay/set as signed commands"
    )


class SerialSettings(_Strict):
    """A sentinel's USB serial port: /dev/ttyUSB0, /dev/serial/by-id/..., or socket://HOST:PORT (the emulator)."""

    url: str = Field(min_length=1)
    baud: int = Field(115200, ge=300, le=4000000)


class JournalSettings(_Strict):
    path: Path = Path("holdover-journal.db")


class SentinelSettings(_Strict):
    id: str
    key: str = ""
    key_file: Path | None = None

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        if not protocol.valid_sid(v):
            raise ValueError("must be 1-32 of A-Z a-z 0-9 _ -")
        return v

    @model_validator(mode="after")
    def _has_key(self) -> SentinelSettings:
        if self.key_file is not None:
            try:
                self.key = self.key_file.read_text().strip()
            except OSError as e:
                raise ValueError(f"key_file: cannot read {self.key_file}: {e.strerror}") from None
        if len(self.key.encode()) < 16:
            raise ValueError("key: must be at least 16 bytes (set key or key_file)")
        return self


class HookSettings(_Strict):
    events: list[str] = Field(min_length=1)
    run: str = Field(min_length=1)
    timeout: float = Field(30.0, gt=0, le=3600)
    sentinels: list[str] = Field(default_factory=list, description="empty: every sentinel")

    @field_validator("events")
    @classmethod
    def _known_kinds(cls, v: list[str]) -> list[str]:
        bad = [k for k in v if k not in events.TABLE and k != "*"]
        if bad:
            raise ValueError(f"unknown event kind(s) {bad}; known: {', '.join(events.TABLE)} or '*'")
        return v

    def matches(self, kind: str, sid: str) -> bool:
        return ("*" in self.events or kind in self.events) and (not self.sentinels or sid in self.sentinels)


class ProtectSettings(_Strict):
    """What the bridge does for training runs when the sentinel reports the node is on battery."""

    enabled: bool = True
    registry: Path | None = Field(None, description="where protected runs register; default as holdover.train")
    grace: float = Field(10.0, ge=0, le=3600, description="seconds on battery before saving (upssched-like)")
    runtime_default: float = Field(600.0, gt=0, description="UPS runtime (s) when the event carries no estimate")
    margin: float = Field(60.0, ge=0, description="seconds of the runtime estimate kept in reserve")
    hang_after: float = Field(30.0, gt=0, description="a save that reports no progress this long is hung")
    after_save: Literal["continue", "exit"] = "continue"
    rescue_dir: Path = Path("holdover-rescue")
    gcore: bool = True
    gcore_rate_mb_s: float = Field(350.0, gt=0, description="measured gcore speed, for its time budget")
    shm: list[str] = Field(default_factory=list, description="globs under /dev/shm copied on rescue")
    final_command: str = Field("", description="run once all targets are saved or rescued, on battery_critical")
    final_timeout: float = Field(60.0, gt=0)
    match_cmdline: list[str] = Field(default_factory=list, description="regexes for unregistered training processes")
    match_tmux: list[str] = Field(default_factory=list, description="globs of tmux session names to protect")
    signal: str = Field("SIGUSR2", description="signal for matched processes without a registration")

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if not hasattr(signal, v) or not v.startswith("SIG"):
            raise ValueError(f"unknown signal {v!r} (e.g. SIGUSR2)")
        return v

    @field_validator("match_cmdline")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for r in v:
            try:
                re.compile(r)
            except re.error as e:
                raise ValueError(f"bad regex {r!r}: {e}") from None
        return v


class UplinkSettings(_Strict):
    name: str = Field(min_length=1)
    dev: str = Field(min_length=1, max_length=15, description="the interface: wan0, usb0, a 4G dongle's")
    gateway: str = Field(min_length=7, description="the next hop through it (an IPv4 address)")


class FailoverSettings(_Strict):
    """The node's uplinks, the first the primary; empty: no failover."""

    uplinks: list[UplinkSettings] = Field(default_factory=list)
    # Probed out of every uplink: "ip" for an ICMP echo, "ip:port" for a TCP connect. IP literals
    # only: a name would need a DNS lookup, through the very uplink that may be dead. A real site
    # names a few well-known addresses; tests and benchmarks only ever their own.
    targets: list[str] = Field(default_factory=list)
    # 3 bad rounds of 0.4 s: a hard loss is acted on within 1.6 s at the worst phase.
    interval: float = Field(0.4, ge=0.05, le=60, description="seconds between probe rounds")
    timeout: float = Field(0.35, gt=0, le=30, description="seconds a probe may take")
    reliability: int = Field(1, ge=1, description="targets that must answer for a good round")
    down: int = Field(3, ge=1, description="bad rounds in a row before an uplink is down")
    up: int = Field(3, ge=1, description="good rounds in a row before it is up again")
    dwell: float = Field(10.0, ge=0, description="seconds between two switches, at least")
    failback_after: float = Field(30.0, ge=0, description="seconds the primary must be steady before failback")
    netns: str | None = Field(None, description="run in this network namespace (tests); default: this machine's")
    node: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0] or "node",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="this node's name in its MQTT topic (holdover/node/NAME/uplink); default: the host name",
    )

    @model_validator(mode="after")
    def _sound(self) -> FailoverSettings:
        if self.uplinks and len(self.uplinks) < 2:
            raise ValueError("failover needs a primary and at least one backup uplink")
        if self.uplinks and not self.targets:
            raise ValueError("failover needs probe targets")
        for t in self.targets:
            host, colon, port = t.rpartition(":")
            if not colon:
                host = port
            elif not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"targets: {t!r}: the port must be 1-65535 (write ip for ICMP, ip:port for TCP)")
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"targets: {t!r}: {host!r} is not an IPv4 address (no names)") from None
        if self.targets and self.reliability > len(self.targets):
            raise ValueError(f"reliability {self.reliability} but only {len(self.targets)} target(s)")
        if self.timeout >= self.interval:
            raise ValueError("timeout must be shorter than interval")
        return self


class AlertChannelSettings(_Strict):
    """One place alerts go: an apprise URL (ntfy, Telegram, Pushover, mailto, Matrix, ...)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    url: str = Field(min_length=3)
    min_severity: Literal["info", "warning", "critical"] = "warning"
    per_hour: int = Field(20, ge=1, le=3600, description="messages an hour at most; more are merged into one")

    @field_validator("url")
    @classmethod
    def _apprise_knows_it(cls, v: str) -> str:
        import apprise  # only when alerts are configured: it is a large import

        if apprise.Apprise.instantiate(v, suppress_exceptions=True) is None:
            scheme = v.split("://")[0] if "://" in v else v
            raise ValueError(f"apprise cannot use this URL (scheme {scheme!r}, or its parts); see apprise's docs")
        return v


class AlertSettings(_Strict):
    channels: list[AlertChannelSettings] = Field(default_factory=list)
    mqtt: bool = Field(True, description="also publish each alert, readable, on holdover/alerts")
    dedup_s: float = Field(300.0, ge=0, description="the same alert again within this is dropped")
    flap_window_s: float = Field(300.0, gt=0, description="changes counted over this window")
    flap_after: int = Field(3, ge=2, description="changes in the window that make it flapping: a summary instead")
    retry_max_s: float = Field(300.0, gt=0, description="the longest wait between two tries of an unsent alert")

    @model_validator(mode="after")
    def _unique(self) -> AlertSettings:
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError(f"alert channel names must be unique: {names}")
        return self


class WebSettings(_Strict):
    """The HTTP API and dashboard the bridge serves (`holdover bridge`)."""

    enabled: bool = True
    host: str = Field("127.0.0.1", description="where to listen; 127.0.0.1 unless you mean it")
    port: int = Field(8787, ge=1, le=65535)
    token: str = Field("", description="bearer token for POST actions; empty (and no token_file): actions off")
    token_file: Path | None = Field(None, description="a file holding the token (kept out of the config)")

    def token_value(self) -> str:
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError:
                return ""  # unreadable: actions stay off rather than open
        return self.token


class Settings(_Strict):
    mqtt: MqttSettings = MqttSettings()
    journal: JournalSettings = JournalSettings()
    sentinels: list[SentinelSettings] = Field(default_factory=list)
    serial: list[SerialSettings] = Field(default_factory=list)
    hooks: list[HookSettings] = Field(default_factory=list)
    alerts: AlertSettings = AlertSettings()
    protect: ProtectSettings = ProtectSettings()
    failover: FailoverSettings = FailoverSettings()
    web: WebSettings = WebSettings()

    @model_validator(mode="after")
    def _unique_sentinels(self) -> Settings:
        ids = [s.id for s in self.sentinels]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"sentinels: duplicate id(s) {dup}")
        return self

    def keys(self) -> dict[str, bytes]:
        return {s.id: s.key.encode() for s in self.sentinels}


def _describe(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse(data: dict, origin: str = "config") -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{origin}: {e.error_count()} problem(s)\n{_describe(e)}") from None


def load(path: Path) -> Settings:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return parse(data, str(path))
