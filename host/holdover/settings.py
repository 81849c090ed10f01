"""The bridge's TOML configuration, validated with every problem listed by key."""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import os
import re
import signal
import socket
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from holdover import events
from holdover.errors import USAGE, HoldoverError
from holdover.firmware import keycheck, protocol


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


class ProtectSettings(_Strict):
    """What the bridge does for training runs when the sentinel reports the node is on battery."""

    enabled: bool = Field(True, description="emergency checkpoints of protected runs on battery")
    registry: ConfigPath | None = Field(None, description="where protected runs register; default as holdover.train")
    grace: float = Field(10.0, ge=0, le=3600, description="seconds on battery before saving (upssched-like)")
    runtime_default: float = Field(
        600.0, gt=0, description="the UPS runtime (s) assumed when no [ups] says it: a guess, named so"
    )
    margin: float = Field(60.0, ge=0, description="seconds of the runtime estimate kept in reserve")
    hang_after: float = Field(30.0, gt=0, description="a save that reports no progress this long is hung")
    after_save: Literal["continue", "exit"] = Field("continue", description="what a run does once saved")
    rescue_dir: ConfigPath = Field(
        Path("/var/lib/holdover/rescue"), description="where gcore dumps and /dev/shm copies go"
    )
    gcore: bool = Field(True, description="dump a run that cannot save in time with gcore")
    gcore_rate_mb_s: float = Field(350.0, gt=0, description="measured gcore speed, for its time budget")
    shm: list[str] = Field(default_factory=list, description="globs under /dev/shm copied on rescue")
    final_command: str = Field(
        "", description="run once all targets are saved or rescued, when the host UPS reaches low battery"
    )
    final_timeout: float = Field(60.0, gt=0, description="seconds final_command may take")
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
    name: str = Field(min_length=1, description="a name for it in events and the dashboard")
    dev: str = Field(min_length=1, max_length=15, description="the interface: wan0, usb0, a 4G dongle's")
    gateway: str = Field(min_length=7, description="the next hop through it (an IPv4 address)")


# A node's name: in its MQTT topics, its broker login (holdover-node-NAME) and Home Assistant.
NODE_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class FailoverSettings(_Strict):
    """The node's uplinks, the first the primary; empty: no failover."""

    uplinks: list[UplinkSettings] = Field(default_factory=list, description="the primary first, then backups")
    # Probed out of every uplink: "ip" for an ICMP echo, "ip:port" for a TCP connect. IP literals
    # only: a name would need a DNS lookup, through the very uplink that may be dead. A real site
    # names a few well-known addresses; tests and benchmarks only ever their own.
    targets: list[str] = Field(default_factory=list, description="ip (ICMP echo) or ip:port (TCP connect)")
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
        pattern=NODE_NAME,
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


class DiagnoseSettings(_Strict):
    """`holdover diagnose` and the report made on every outage."""

    resolvers: list[str] = Field(
        default_factory=list, description="DNS servers to ask (ip or ip:port; a real site names its own)"
    )
    name: str = Field("example.com", description="the name they are asked for")
    metadata_url: str = Field("", description="a cloud metadata endpoint to try (empty: none)")

    @field_validator("resolvers")
    @classmethod
    def _ips(cls, v: list[str]) -> list[str]:
        for r in v:
            host, _, port = r.partition(":")
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"{r!r}: an IPv4 address (no names: they would need DNS)") from None
            if port and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"{r!r}: the port must be 1-65535")
        return v


class BondingSettings(_Strict):
    """The node's Linux bonds, watched for a slave going down (redundancy gone, traffic still flowing)."""

    enabled: bool = Field(True, description="watch /proc/net/bonding (nothing to do where there are no bonds)")
    interval: float = Field(2.0, gt=0, le=600, description="seconds between two looks")
    proc: ConfigPath = Field(Path("/proc"), description="where /proc is (tests point it at fixture files)")


SMS_SCHEME = "dongle-sms://"  # an alert channel sent as SMS by the [dongle], not by apprise


class DongleSettings(_PasswordFromFile):
    """A Huawei HiLink 4G stick (E3372h, E8372h): its state and signal, data used, SMS."""

    enabled: bool = Field(False, description="watch a HiLink dongle")
    url: str = Field("http://192.168.8.1/", description="its web API (a stick's factory address)")
    username: str = Field("", description="its admin user, for sticks that ask for a login")
    password: str = Field("", description="its admin password (better: password_file)")
    password_file: ConfigPath | None = Field(None, description="a file holding that password")
    timeout: float = Field(3.0, gt=0, le=60, description="seconds each HTTP request to it may take")
    uplink: str = Field("", description="the [failover] uplink it is: dialled before traffic is switched to it")
    data_cap_mb: int = Field(0, ge=0, description="the plan's monthly data in MB, counted on that uplink (0: none)")
    cap_warn: float = Field(0.8, gt=0, lt=1, description="the share of the cap that raises an alert")
    at_cap: Literal["stay", "alert_only"] = Field(
        "alert_only", description="at the cap: stay on it, or alert only and keep traffic on the primary"
    )
    cap_interval: float = Field(10.0, gt=0, le=3600, description="seconds between two counts")


NIS_ADDRESS = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:]+\])(?::(?P<port>\d{1,5}))?$")
NUT_UPS = re.compile(r"^(?P<ups>[A-Za-z0-9_.-]+)@(?P<host>[A-Za-z0-9_.:-]+?)(?::(?P<port>\d{1,5}))?$")


class UpsSettings(_PasswordFromFile):
    """The host's UPS: what sets the emergency deadline (the sentinel's own cell never does)."""

    nut: str = Field("", description='a NUT server\'s UPS, upsc-style: "myups@127.0.0.1:3493" (port 3493 if left out)')
    apcupsd: str = Field(
        "", description='or apcupsd\'s network information server, as apcaccess takes it: "127.0.0.1:3551"'
    )
    username: str = Field(
        "", description="a upsd.users user, sent on connecting (reading needs none; upsd asks only for commands)"
    )
    password: str = Field("", description="its password (better: password_file)")
    password_file: ConfigPath | None = Field(None, description="a file holding the password")
    runtime_s: float = Field(
        0.0, ge=0, description="a fixed runtime (s) for a UPS that reports none: a guess, the doctor says so"
    )
    low_runtime_s: float = Field(
        0.0, ge=0, description="on battery with less runtime than this: low battery, as NUT's LB (0: LB only)"
    )
    poll_s: float = Field(0.5, ge=0.1, le=60, description="how often upsd is asked (a local upsd answers in ms)")
    timeout_s: float = Field(2.0, gt=0, le=60, description="a NUT answer slower than this is a failed read")
    disagree_after_s: float = Field(
        15.0, ge=0, description="a sentinel's mains loss the UPS does not see for this long is alerted"
    )

    @field_validator("nut")
    @classmethod
    def _nut_address(cls, v: str) -> str:
        if v and not NUT_UPS.match(v):
            raise ValueError(f"expected UPSNAME@HOST or UPSNAME@HOST:PORT, as upsc takes it; got {v!r}")
        return v

    @field_validator("apcupsd")
    @classmethod
    def _nis_address(cls, v: str) -> str:
        if v and not NIS_ADDRESS.match(v):
            raise ValueError(f"expected HOST or HOST:PORT, as apcaccess -h takes it; got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> UpsSettings:
        if self.nut and self.apcupsd:
            raise ValueError("set one of nut and apcupsd: the host has one UPS to read (both name one)")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.nut or self.apcupsd or self.runtime_s)

    @property
    def source(self) -> str:
        """Where the UPS is read, as a person would name it."""
        return self.nut or (f"apcupsd at {self.apcupsd}" if self.apcupsd else "")

    def nis_address(self) -> tuple[str, int]:
        """(host, port) of `apcupsd`."""
        m = NIS_ADDRESS.match(self.apcupsd)
        assert m is not None
        return m["host"].strip("[]"), int(m["port"] or 3551)

    def address(self) -> tuple[str, str, int]:
        """(ups name, host, port) of `nut`."""
        m = NUT_UPS.match(self.nut)
        assert m is not None
        return m["ups"], m["host"], int(m["port"] or 3493)

    @property
    def name(self) -> str:
        """How people are told of it: the UPS's own name in NUT, or "UPS" for a fixed runtime."""
        if self.apcupsd:
            return f"apcupsd@{self.nis_address()[0]}"
        return self.address()[0] if self.nut else "UPS"


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
        import apprise  # only when alerts are configured: it is a large import

        if apprise.Apprise.instantiate(v, suppress_exceptions=True) is None:
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


def _signal_name(v: str) -> str:
    name = v.upper().removeprefix("SIG")
    if name not in signal.Signals.__members__ and f"SIG{name}" not in signal.Signals.__members__:
        raise ValueError(f"{v!r} is not a signal (USR1, USR2, TERM, INT...)")
    return name


SignalName = Annotated[str, AfterValidator(_signal_name)]


class SlurmCircuit(_Strict):
    """Nodes that lose power together, and what says their power went (a sentinel, the UPS, or both)."""

    name: str = Field(..., min_length=1, description="the circuit, as people call it (rack1)")
    sentinel: str | None = Field(None, description="the sentinel watching this circuit's mains")
    ups: bool = Field(False, description="the host UPS of [ups] feeds these nodes: its on-battery counts")
    nodes: str = Field(..., min_length=1, description="a Slurm hostlist: gpu[01-04] (expanded by scontrol)")

    @model_validator(mode="after")
    def _watched(self) -> SlurmCircuit:
        if self.sentinel is None and not self.ups:
            raise ValueError("a circuit needs a sentinel, or ups = true, to know when its power goes")
        return self


class SlurmSignal(_Strict):
    """The signal a job is told to checkpoint with, by its partition or its name."""

    partition: str | None = Field(None, description="jobs in this partition")
    job_name: str | None = Field(None, description="jobs whose name matches this glob (train-*)")
    signal: SignalName = Field(..., description="USR1, USR2, TERM...")


class PeerSettings(_Strict):
    """The other nodes of this node's multi-node jobs, checked every second (cluster/peers.py): one
    silent for lost_after_s means the link between the nodes may be dead, and this node's runs are
    asked to checkpoint (their Guards save without a collective)."""

    peers: list[str] = Field(
        default_factory=list, description='"host:port" of each other node; any port (a refused one answers)'
    )
    every_s: float = Field(1.0, gt=0, description="how often each peer is checked")
    timeout_s: float = Field(1.0, gt=0, description="a check with no answer within this is silence")
    lost_after_s: float = Field(5.0, gt=0, description="silent this long: peer_lost, and a checkpoint of every run")
    netns: str | None = Field(None, description="check from this network namespace (tests)")

    @field_validator("peers")
    @classmethod
    def _host_port(cls, peers: list[str]) -> list[str]:
        for p in peers:
            host, _, port = p.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"peer {p!r} is not host:port")
        return peers


class SlurmSettings(_Strict):
    """Slurm's nodes on circuits: drain them on a cut and tell their jobs to checkpoint."""

    circuits: list[SlurmCircuit] = Field(default_factory=list)
    signal: SignalName = Field(
        "USR2", description="what jobs are told to checkpoint with (NCCL takes USR1 in some builds)"
    )
    signals: list[SlurmSignal] = Field(default_factory=list, description="per partition or job name; first match")
    # Who gets the signal (scancel's own choices). "steps": every step srun started, the training
    # processes, not the batch script's shell, as `sbatch --signal` does. "full" adds the shell,
    # which a script without a trap for the signal dies of, and the job with it (seen here with
    # USR2). "batch": the shell alone, for scripts that trap it and pass it on themselves.
    signal_to: Literal["steps", "full", "batch"] = Field(
        "steps", description="who is signalled: the steps' processes, with the batch shell, or the shell alone"
    )
    grace: float | None = Field(None, ge=0, description="seconds of a cut before draining; default [protect] grace")
    then: Literal["run", "requeue", "hold"] = Field(
        "run",
        description="once a job is saved on every node it runs on: let it run, requeue it, or requeue and hold it",
    )
    save_timeout_s: float = Field(
        300.0, gt=0, description="a job not saved on every node by then is reported unsaved (and left running)"
    )
    resume_after_s: float = Field(60.0, ge=0, description="mains back and steady this long before nodes resume")
    timeout_s: float = Field(10.0, gt=0, le=120, description="each Slurm command's time limit")
    conf: ConfigPath | None = Field(None, description="SLURM_CONF for the commands; default: Slurm's own")
    netns: str | None = Field(None, description="run Slurm's commands in this network namespace (tests)")

    @property
    def enabled(self) -> bool:
        return bool(self.circuits)

    def signal_for(self, partition: str, job_name: str) -> str:
        for rule in self.signals:
            if rule.partition is not None and rule.partition != partition:
                continue
            if rule.job_name is not None and not fnmatch.fnmatchcase(job_name, rule.job_name):
                continue
            return rule.signal
        return self.signal


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
