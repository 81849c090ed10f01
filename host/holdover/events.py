"""What each kind of event means on the host, in one table, as NUT's `notifylist` is one table.

The sentinel's kinds come from the wire protocol (`firmware/protocol.py`); the host adds its own
(a sentinel going silent, the steps of an emergency checkpoint, failover, the data cap). Hooks,
the rescue policy and alerts all read their defaults here: how serious an event is, what to say
about it, whether it starts an emergency checkpoint, and which problem a recovery closes.

A reaction is anything that acts on accepted events. The bridge keeps a list of them and hands
every accepted event to each, so a new reaction is one more object in that list, not a new line
in the bridge's dispatch.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from holdover.firmware import protocol
from holdover.journal import ROUTINE_KINDS as journal_routine
from holdover.journal import Event

INFO = "info"
WARNING = "warning"
CRITICAL = "critical"
SEVERITIES = (INFO, WARNING, CRITICAL)

SENTINEL = "sentinel"  # raised by the board, signed, over MQTT or serial
HOST = "host"  # raised on this machine by the bridge or a node reaction

SENTINEL_OFFLINE = "sentinel_offline"  # its last will, or "offline" published (NUT's COMMBAD)
SENTINEL_ONLINE = "sentinel_online"
SENTINEL_PATH_DOWN = "sentinel_path_down"  # one path silent (MQTT, a serial port), another still carries it
SENTINEL_PATH_UP = "sentinel_path_up"
UPS_ON_BATTERY = "ups_on_battery"  # the host's UPS (NUT's OB): the rescue's clock starts
UPS_ONLINE = "ups_online"
UPS_LOW_BATTERY = "ups_low_battery"  # NUT's LB or FSD, or runtime under [ups] low_runtime_s
UPS_UNREADABLE = "ups_unreadable"  # upsd unreachable, refusing, no such UPS: the deadline is a guess
UPS_READABLE = "ups_readable"
POWER_DISAGREE = "power_disagree"  # a sentinel says mains lost, the UPS says on line
FINAL_COMMAND = "final_command"  # the site goes down: NUT clients of the served sentinels see FSD
JOURNAL_BROKEN = "journal_broken"  # the bridge's journal cannot write: events held in memory, acted on
JOURNAL_RESTORED = "journal_restored"
RELAY_COMMANDED = "relay_commanded"  # a signed relay command sent, with who asked
FAILOVER = "failover"  # the node's traffic moved to a backup uplink
FAILBACK = "failback"
CHECKPOINT_REQUESTED = "checkpoint_requested"  # a person asked (Home Assistant's button, the API): every run saves now
CHECKPOINT_STARTED = "checkpoint_started"
CHECKPOINT_VERIFIED = "checkpoint_verified"
CHECKPOINT_FAILED = "checkpoint_failed"
CHECKPOINT_BAD = "checkpoint_bad"
CHECKPOINT_LATE = "checkpoint_late"
CHECKPOINT_HUNG = "checkpoint_hung"
CHECKPOINT_SKIPPED = "checkpoint_skipped"  # the plan did not start a save that could not finish in time
RESCUED = "rescued"  # no verified checkpoint, a gcore dump or /dev/shm copy instead
LOST = "lost"  # nothing of the run could be saved
DATA_CAP = "data_cap"
BOND_SLAVE_DOWN = "bond_slave_down"
BOND_SLAVE_UP = "bond_slave_up"
LINK_ADDED = "link_added"
LINK_REMOVED = "link_removed"
DIAGNOSIS = "diagnosis"
SLURM_DRAINED = "slurm_drained"  # cluster/circuits.py, from the bridge beside slurmctld
SLURM_RESUMED = "slurm_resumed"
SLURM_FAILED = "slurm_failed"
SLURM_JOB_SAVED = "slurm_job_saved"
SLURM_JOB_UNSAVED = "slurm_job_unsaved"
PEER_LOST = "peer_lost"  # cluster/peers.py: another node of this node's jobs went silent
PEER_BACK = "peer_back"
SAVE_CADENCE = "save_cadence"  # node/cadence.py: a run the plan cannot save told how often to save, or no longer


@dataclass(frozen=True)
class Kind:
    name: str
    severity: str
    message: str  # a format string over the event's fields: {sid} and the event's data keys
    source: str = SENTINEL
    starts_rescue: bool = False
    resolves: str | None = None  # the problem this recovery closes (for alerts and the dashboard)
    doing: str = ""  # what holdover does about it, for the alert's body
    alert: bool = True  # worth a person's phone at all (a heartbeat is not)

    def describe(self, **fields: object) -> str:
        """The stock message with what is known filled in; a missing field never raises."""
        return self.message.format_map(_Lenient(fields))

    def action(self, **fields: object) -> str:
        """What holdover does about it, with what is known filled in ('' if nothing)."""
        return self.doing.format_map(_Lenient(fields))


class _Lenient(dict):
    def __missing__(self, key: str) -> str:
        return "?"


_KINDS = (
    # --- from the sentinel -----------------------------------------------------------------------
    Kind(protocol.BOOT, INFO, "sentinel {sid} booted", alert=False),
    Kind(protocol.HEARTBEAT, INFO, "sentinel {sid} is alive", alert=False),
    Kind(
        protocol.MAINS_LOST,
        CRITICAL,
        "mains power lost at {sid}",
        starts_rescue=True,
        doing="every protected training run gets an emergency checkpoint unless mains is back within the grace",
    ),
    Kind(protocol.MAINS_RESTORED, INFO, "mains power back at {sid}", resolves=protocol.MAINS_LOST),
    # The first word of a possible cut, within 1.5 mains periods: for hooks that prepare, never a phone.
    Kind(protocol.MAINS_SUSPECT, INFO, "mains edges missing at {sid}", alert=False),
    Kind(protocol.MAINS_DIP, WARNING, "mains dipped for {dip_ms} ms at {sid}", alert=False),
    # The sentinel's own cell (an 18650 for the ESP32): its power, never the host's deadline ([ups]).
    Kind(
        protocol.BATTERY_LOW,
        WARNING,
        "sentinel {sid}'s own battery low: {runtime_s} s left",
        doing="nothing on the host: this is the sentinel's cell; when it runs out, power goes unwatched",
    ),
    Kind(
        protocol.BATTERY_CRITICAL,
        CRITICAL,
        "sentinel {sid}'s own battery critical: {runtime_s} s left",
        doing="nothing on the host: the sentinel goes quiet soon, power and uplink unwatched",
    ),
    Kind(protocol.BATTERY_OK, INFO, "sentinel {sid}'s own battery recovered", resolves=protocol.BATTERY_LOW),
    Kind(
        protocol.UPLINK_LOST,
        WARNING,
        "internet uplink lost at {sid}",
        doing="the node fails over to its backup uplink if one is configured and up",
    ),
    Kind(protocol.UPLINK_RESTORED, INFO, "internet uplink back at {sid}", resolves=protocol.UPLINK_LOST),
    Kind(protocol.RELAY, INFO, "relay at {sid} switched", alert=False),
    # --- from this machine -----------------------------------------------------------------------
    Kind(
        SENTINEL_OFFLINE,
        WARNING,
        "sentinel {sid} went silent",
        HOST,
        doing="power and uplink are unwatched",
    ),
    Kind(SENTINEL_ONLINE, INFO, "sentinel {sid} is back", HOST, resolves=SENTINEL_OFFLINE),
    Kind(
        SENTINEL_PATH_DOWN,
        WARNING,
        "sentinel {sid}: {path} silent, still heard over {via}",
        HOST,
        doing="power and uplink still watched over {via}; look at the {path} path (WiFi, broker, cable)",
    ),
    Kind(SENTINEL_PATH_UP, INFO, "sentinel {sid}: {path} back", HOST, resolves=SENTINEL_PATH_DOWN),
    Kind(
        CHECKPOINT_REQUESTED,
        WARNING,
        "emergency checkpoint of every run requested by {by}",
        HOST,
        starts_rescue=True,
        doing="every protected training run saves now",
    ),
    Kind(RELAY_COMMANDED, INFO, "relay at {sentinel}: {op} asked by {by}", HOST, alert=False),
    Kind(CHECKPOINT_STARTED, WARNING, "emergency checkpoint of {target} started", HOST),
    Kind(
        CHECKPOINT_VERIFIED,
        INFO,
        "emergency checkpoint of {target} verified ({mb} MB at {mb_s} MB/s)",
        HOST,
        resolves=CHECKPOINT_STARTED,
    ),
    Kind(CHECKPOINT_FAILED, CRITICAL, "emergency checkpoint of {target} failed", HOST),
    Kind(CHECKPOINT_BAD, CRITICAL, "emergency checkpoint of {target} does not verify", HOST),
    Kind(CHECKPOINT_LATE, CRITICAL, "no checkpoint of {target} before the deadline", HOST),
    Kind(CHECKPOINT_HUNG, CRITICAL, "checkpoint of {target} stopped making progress", HOST),
    Kind(CHECKPOINT_SKIPPED, CRITICAL, "{target} not saved: its save could not finish before the deadline", HOST),
    Kind(SAVE_CADENCE, INFO, "{said}", HOST, alert=False),
    Kind(RESCUED, CRITICAL, "{target}: no verified checkpoint; a core dump or /dev/shm copy was saved", HOST),
    Kind(LOST, CRITICAL, "{target}: nothing could be saved", HOST),
    Kind(
        UPS_ON_BATTERY,
        CRITICAL,
        "UPS {ups} on battery: {runtime_s} s left",
        HOST,
        starts_rescue=True,
        doing="every protected training run gets an emergency checkpoint inside the UPS's runtime, "
        "unless power is back within the grace",
    ),
    Kind(UPS_ONLINE, INFO, "UPS {ups} back on line power", HOST, resolves=UPS_ON_BATTERY),
    Kind(
        UPS_LOW_BATTERY,
        CRITICAL,
        "UPS {ups} battery low: {runtime_s} s left",
        HOST,
        starts_rescue=True,
        doing="last checkpoints, then the configured final command",
    ),
    Kind(
        UPS_UNREADABLE,
        WARNING,
        "UPS {ups} cannot be read: {detail}",
        HOST,
        doing="an emergency checkpoint's deadline falls back to protect.runtime_default, a guess",
    ),
    Kind(UPS_READABLE, INFO, "UPS {ups} read again", HOST, resolves=UPS_UNREADABLE),
    Kind(
        POWER_DISAGREE,
        WARNING,
        "sentinel {sentinel} says mains lost for {after_s} s, UPS {ups} says it is on line power",
        HOST,
        doing="the rescue ran on the sentinel's word; check the sentinel's opto is on the wall side of the UPS",
    ),
    Kind(
        FINAL_COMMAND,
        CRITICAL,
        "the host UPS is at low battery: running the final command",
        HOST,
        doing="every run is saved or rescued; {command}; NUT clients of the served sentinels see FSD",
    ),
    Kind(
        JOURNAL_BROKEN,
        CRITICAL,
        "the bridge's journal cannot be written: {detail}",
        HOST,
        doing="events are acted on (hooks, emergency checkpoints) and held in memory, not receipted, "
        "so the sentinels keep them; free space or fix [journal] path",
    ),
    Kind(
        JOURNAL_RESTORED,
        INFO,
        "the bridge's journal is writable again: {held} held event(s) journaled",
        HOST,
        resolves=JOURNAL_BROKEN,
    ),
    Kind(FAILOVER, WARNING, "traffic moved to the backup uplink {uplink}", HOST, doing="{why}"),
    Kind(FAILBACK, INFO, "traffic back on the primary uplink {uplink}", HOST, resolves=FAILOVER),
    Kind(
        DATA_CAP,
        WARNING,
        "backup uplink {uplink} has used {share} of its data cap ({used_mb} of {cap_mb} MB)",
        HOST,
        doing="{action}",
    ),
    Kind(
        BOND_SLAVE_DOWN,
        WARNING,
        "bond {bond}: slave {slave} is down, no redundancy left",
        HOST,
        doing="traffic still flows on {up}; the next link failure is an outage",
    ),
    Kind(BOND_SLAVE_UP, INFO, "bond {bond}: slave {slave} is back", HOST, resolves=BOND_SLAVE_DOWN),
    Kind(LINK_ADDED, INFO, "interface {dev} appeared", HOST, alert=False),
    Kind(LINK_REMOVED, INFO, "interface {dev} went away", HOST, alert=False),
    Kind(DIAGNOSIS, WARNING, "outage diagnosis: {first}", HOST, doing="failed checks: {failed}"),
    # --- Slurm (cluster/circuits.py), from the bridge beside slurmctld ---------------------------
    Kind(
        SLURM_DRAINED,
        WARNING,
        "circuit {circuit}: {count} Slurm node(s) drained ({nodes}), {jobs_told} job(s) told to checkpoint",
        HOST,
        doing="nothing new starts there on battery; {reason}",
    ),
    Kind(
        SLURM_RESUMED,
        INFO,
        "circuit {circuit}: power steady again, {count} Slurm node(s) resumed",
        HOST,
        resolves=SLURM_DRAINED,
    ),
    Kind(SLURM_FAILED, WARNING, "Slurm, circuit {circuit}: {what} failed: {error}", HOST),
    Kind(
        SLURM_JOB_SAVED,
        INFO,
        "Slurm job {job} ({name}) saved at step {step} on all {count} node(s)",
        HOST,
        doing="{then}",
    ),
    Kind(
        SLURM_JOB_UNSAVED,
        CRITICAL,
        "Slurm job {job} ({name}) not saved on every node within {timeout_s} s",
        HOST,
        doing="no verified checkpoint of one step from: {missing}; the job was left running",
    ),
    # --- the other nodes of this node's jobs (cluster/peers.py) ----------------------------------
    Kind(
        PEER_LOST,
        WARNING,
        "node {peer} silent for {silent_s} s: the link between the nodes may be dead",
        HOST,
        starts_rescue=True,
        doing="every run here saves its last whole step, without waiting for the other ranks",
    ),
    Kind(PEER_BACK, INFO, "node {peer} answers again", HOST, resolves=PEER_LOST),
)
TABLE: dict[str, Kind] = {k.name: k for k in _KINDS}
RESCUE_TRIGGERS: tuple[str, ...] = tuple(k.name for k in _KINDS if k.starts_rescue)


# Routine: the sentinel saying it is alive every 30 s. Journaled (presence is judged by them) but
# folded into a count where people read events, or an outage scrolls away in minutes.
ROUTINE = frozenset(journal_routine)


def duration(s: float) -> str:
    """A span as people say it: 42 s, 7 min 40 s, 11 h 46 min."""
    s = int(s)
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def kind(name: str) -> Kind:
    """The table's entry; a kind it does not know is reported, as information, under its own name."""
    return TABLE.get(name) or Kind(name, INFO, name.replace("_", " ") + " at {sid}", HOST)


class Reaction(Protocol):
    """Something the bridge hands every accepted event to (hooks, the rescue, alerts, failover, Slurm...)."""

    def start(self) -> None:
        """Called once the bridge's loop runs, before the first event (e.g. to resume work left by a restart)."""

    def on_event(self, event: Event) -> None:
        """Must not block: anything slow goes into a task of the reaction's own."""

    async def close(self) -> None:
        """Finish or cancel what is in flight; called when the bridge stops."""


async def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task and wait until it has ended: a reaction's close(). The task's own
    CancelledError is its end, not an error."""
    for t in tasks:
        if t is not None:
            t.cancel()
    for t in tasks:
        if t is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def woken(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` or `timeout` seconds: whether it was set. Not asyncio.wait_for, which in
    Python 3.11 can swallow a cancel that lands as the event is set (the bridge's stop then waited
    out its 15 s join: seen in the suite), so a task looping on it never ends."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=max(0.0, timeout))
    finally:
        waiter.cancel()
    return event.is_set()


class Polling(abc.ABC):
    """A Reaction whose work is a look every `interval` seconds on a task of its own (the bonds,
    the data used); events pass it by. A look that fails is logged and the next one runs."""

    interval: float = 1.0
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._every())

    def on_event(self, event: Event) -> None:  # noqa: B027 - a watch ignores events on purpose
        pass

    async def close(self) -> None:
        await cancel(self._task)

    @abc.abstractmethod
    async def look(self) -> None:
        """One look; what it finds it says through host events."""

    async def _every(self) -> None:
        while True:
            try:
                await self.look()
            except Exception:  # one strange reading must not end the watch
                logging.getLogger("holdover").exception("%s: a look failed", type(self).__name__)
            await asyncio.sleep(self.interval)
