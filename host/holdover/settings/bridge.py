"""The sections of what talks to the sentinels and to people: the broker, the serial ports, the
journal, the sentinels and their keys, hooks, alerts, NUT serving, Home Assistant, the web."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from holdover import events
from holdover.firmware import keycheck, protocol
from holdover.settings.base import ConfigPath, _PasswordFromFile, _secret, _Strict


class MqttSettings(_PasswordFromFile):
    host: str = Field("127.0.0.1", description="the broker (Mosquitto on the LAN, reachable when the WAN is down)")
    port: int = Field(1883, ge=1, le=65535, description="the broker's port")
    username: str = Field("", description="the bridge's broker user (holdover broker-config makes one)")
    password: str = Field("", description="its password (better: password_file)")
    password_file: ConfigPath | None = Field(None, description="a file holding the password, kept out of the config")
    client_id: str = Field(
        "",
        description="one per bridge: its persistent session on the broker (empty: holdover-bridge-NODE, "
        "so the bridges of several nodes on one broker never take each other's session)",
    )
    keepalive: int = Field(
        30, ge=5, le=3600, description="seconds; the broker drops a silent bridge after 1.5 times this"
    )
    ha_commands: bool = Field(
        True, description="forward Home Assistant's ON/OFF on holdover/<id>/relay/set as signed commands"
    )


class SerialSettings(_Strict):
    """A sentinel's USB serial port: /dev/ttyUSB0, /dev/serial/by-id/..., or socket://HOST:PORT (the emulator)."""

    url: str = Field(min_length=1, description="/dev/ttyUSB0, /dev/serial/by-id/..., socket://HOST:PORT")
    baud: int = Field(115200, ge=300, le=4000000, description="the board's console speed")
    silent_after_s: float = Field(
        75.0, ge=1, le=86400, description="no line for this long: the path is down (2.5 x the board's heartbeat_s)"
    )


class JournalSettings(_Strict):
    path: ConfigPath = Field(
        Path("/var/lib/holdover/journal.db"),
        description="the event journal (SQLite); relative: to this file's directory",
    )
    keep_routine_days: float = Field(
        7.0, ge=0, description="heartbeats and refused messages older than this are deleted (0: kept forever)"
    )


class SentinelSettings(_Strict):
    id: str = Field(description="its sentinel_id in the board's config.json")
    key: str = Field("", description="its signing key, as in the board's config (better: key_file)")
    key_file: ConfigPath | None = Field(None, description="a 0600 file holding the key: holdover keygen ID makes it")

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        if not protocol.valid_sid(v):
            raise ValueError("must be 1-32 of A-Z a-z 0-9 _ -")
        return v

    @model_validator(mode="after")
    def _has_key(self) -> SentinelSettings:
        if self.key_file is not None:
            self.key = _secret(self.key_file, "key_file")
        if not self.key:
            raise ValueError(f"key: set key or key_file (make one: holdover keygen {self.id})")
        problem = keycheck.key_problem(self.key)
        if problem:
            raise ValueError(f"{'key_file ' + str(self.key_file) if self.key_file else 'key'}: {problem}")
        return self


class HookSettings(_Strict):
    events: list[str] = Field(min_length=1, description='event kinds that run it, or ["*"]')
    run: str = Field(
        min_length=1, description="a shell command; gets HOLDOVER_EVENT, HOLDOVER_SENTINEL, HOLDOVER_PAYLOAD"
    )
    timeout: float = Field(30.0, gt=0, le=3600, description="seconds, then SIGTERM and SIGKILL to its process group")
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


class NutServerSettings(_Strict):
    """Serve each sentinel as a NUT UPS: NUT's own upsd and dummy-ups serve the files the bridge keeps
    current, so upsmon, a NAS, Home Assistant's NUT integration follow it (`holdover nut-config`)."""

    serve: bool = Field(False, description="keep a dummy-ups file per sentinel current")
    dir: ConfigPath = Field(Path("/var/lib/holdover/nut"), description="where those files (and client passwords) go")
    prefix: str = Field("holdover-", description="a sentinel's UPS name is this and its id: holdover-rack1")
    listen: str = Field("0.0.0.0", description="upsd's listening address, for nut-config's upsd.conf")
    port: int = Field(3493, ge=1, le=65535, description="upsd's port")
    clients: list[str] = Field(default_factory=list, description="upsmon users (one per machine that follows)")
    lb_runtime_s: float = Field(
        0.0, ge=0, description="tell the clients LB once the host UPS has less runtime than this (their shutdown time)"
    )

    @field_validator("prefix")
    @classmethod
    def _ups_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]*", v):
            raise ValueError("a NUT UPS name takes A-Z a-z 0-9 _ . -")
        return v

    @field_validator("clients")
    @classmethod
    def _users(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", c)]
        if bad or len(set(v)) != len(v):
            raise ValueError(f"client names: unique, 1-32 of A-Z a-z 0-9 _ . - (got {v})")
        return v


SMS_SCHEME = "dongle-sms://"  # an alert channel sent as SMS by the [dongle], not by apprise


_APPRISE_CHECK = (
    "import sys, apprise; "
    "sys.exit(0 if apprise.Apprise.instantiate(sys.argv[1], suppress_exceptions=True) is not None else 3)"
)
_TAKEN, _REFUSED = 0, 3  # the child's answers; anything else (it could not run) is asked here instead
_taken: dict[str, bool] = {}


def apprise_takes(url: str) -> bool:
    """Whether apprise can use the URL. Asked in a child process unless apprise is loaded here
    already: its plugins, once imported, stay 28 MB resident, and a bridge that never alerts (most
    of a site's node bridges: one alerts for the site) need not carry them (bench/site_scale.py)."""
    if url in _taken:
        return _taken[url]
    if "apprise" not in sys.modules:
        try:
            r = subprocess.run([sys.executable, "-c", _APPRISE_CHECK, url], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            r = None
        if r is not None and r.returncode in (_TAKEN, _REFUSED):
            _taken[url] = r.returncode == _TAKEN
            return _taken[url]
    import apprise  # loaded already, or the child could not say

    _taken[url] = apprise.Apprise.instantiate(url, suppress_exceptions=True) is not None
    return _taken[url]


class AlertChannelSettings(_Strict):
    """One place alerts go: an apprise URL (ntfy, Telegram, Pushover, mailto, Matrix, ...), or
    dongle-sms://+NUMBER[,+NUMBER] for SMS through the [dongle]."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$", description="a name for it in the journal")
    url: str = Field(min_length=3, description="an apprise URL: ntfys://ntfy.sh/TOPIC, tgram://..., mailto://...")
    min_severity: Literal["info", "warning", "critical"] = Field("warning", description="the least it is sent")
    per_hour: int = Field(20, ge=1, le=3600, description="messages an hour at most; more are merged into one")
    when: Literal["always", "wan_down"] = Field(
        "always", description="wan_down: only while no uplink is left (SMS through the dongle)"
    )

    @field_validator("url")
    @classmethod
    def _apprise_knows_it(cls, v: str) -> str:
        if v.startswith(SMS_SCHEME):
            numbers = sms_numbers(v)
            if not numbers or not all(re.fullmatch(r"\+?[0-9]{5,15}", n) for n in numbers):
                raise ValueError(f"{SMS_SCHEME}: phone numbers as +4915112345678, comma-separated; got {v!r}")
            return v
        if not apprise_takes(v):
            scheme = v.split("://")[0] if "://" in v else v
            raise ValueError(f"apprise cannot use this URL (scheme {scheme!r}, or its parts); see apprise's docs")
        return v


def sms_numbers(url: str) -> list[str]:
    return [n.strip() for n in url.removeprefix(SMS_SCHEME).split(",") if n.strip()]


class AlertSettings(_Strict):
    channels: list[AlertChannelSettings] = Field(default_factory=list, description="where alerts go")
    mqtt: bool = Field(True, description="also publish each alert, readable, on holdover/alerts")
    once_per_site: bool = Field(
        True,
        description="with several bridges on one broker, one of them (the lowest-named online one with "
        "channels) alerts about sentinels; each still alerts about its own node",
    )
    dedup_s: float = Field(300.0, ge=0, description="the same alert again within this is dropped")
    flap_window_s: float = Field(
        60.0, gt=0, description="changes counted over this window; this quiet: a storm is over"
    )
    flap_after: int = Field(3, ge=2, description="changes in the window that make a storm: a summary instead")
    flap_summary_s: float = Field(300.0, gt=0, description="while a storm goes on, a summary this often")
    retry_max_s: float = Field(300.0, gt=0, description="the longest wait between two tries of an unsent alert")

    @model_validator(mode="after")
    def _unique(self) -> AlertSettings:
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError(f"alert channel names must be unique: {names}")
        return self


class WebSettings(_Strict):
    """The HTTP API and dashboard the bridge serves (`holdover bridge`)."""

    enabled: bool = Field(True, description="serve the HTTP API and the dashboard")
    host: str = Field("127.0.0.1", description="where to listen; 127.0.0.1 unless you mean it")
    port: int = Field(8787, ge=1, le=65535, description="its port")
    token: str = Field("", description="bearer token for POST actions; empty (and no token_file): actions off")
    token_file: ConfigPath | None = Field(None, description="a file holding the token (kept out of the config)")

    def token_value(self) -> str:
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError:
                return ""  # unreadable: actions stay off rather than open
        return self.token


class HaSettings(_Strict):
    """This node as a device in Home Assistant (MQTT discovery), beside the sentinels' own."""

    discovery: bool = Field(True, description="announce this node (power, UPS, uplink, runs, a checkpoint button)")
    prefix: str = Field(protocol.HA_PREFIX, pattern=r"^[A-Za-z0-9_-]+$", description="Home Assistant's prefix")
    url: str = Field(
        "",
        pattern=r"^(https?://\S+)?$",
        description="the dashboard as Home Assistant's users reach it (its device page links there); "
        "default: [web] host and port, unless that is loopback",
    )
    press_every_s: float = Field(60.0, ge=0, description="a checkpoint button press within this of the last is refused")
