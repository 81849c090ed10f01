"""The sections of what acts on this machine: the rescue of training runs, the host's UPS, the
uplinks and their failover, the 4G dongle, bonds, the outage diagnosis."""

from __future__ import annotations

import ipaddress
import re
import signal
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from holdover.settings.base import NODE_NAME, ConfigPath, _PasswordFromFile, _Strict


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
    plan: bool = Field(True, description="save as the plan says (node/plan.py); false: every run at once")
    shed: bool = Field(
        False,
        description="stop each run once its emergency checkpoint is verified (SIGSTOP its process group, and"
        " its GPUs' power limit to their floor where NVML answers), so the UPS lasts longer for the others and the"
        " outage; continued when the power is back (node/shed.py)",
    )
    rank_watts: float = Field(
        0.0,
        ge=0,
        description="what one rank of a run draws while it trains (W: its GPU's and a share of the box's; nvidia-smi"
        " shows the GPU's): what stopping it gives back to the UPS, in the plan (0: not modelled)",
    )
    max_loss_min: float = Field(
        0.0,
        ge=0,
        description="the most of a run a cut may lose (minutes) when the rescue plan cannot save it in the UPS's"
        " runtime: such a run then saves that often by the clock, behind its loop (node/cadence.py); 0: off",
    )
    disk_mb_s: float = Field(
        0.0,
        ge=0,
        description="the checkpoint disk's write ceiling, MB/s (fio); 0: unknown, saves not limited by it",
    )
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
    watts: float = Field(
        0.0,
        ge=0,
        description="the UPS's rated real power (W, its label's watts, not VA): with its ups.load %, the load the"
        " rescue plan models shedding against (0: not modelled)",
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
