"""Alerts to people: which events, to which channel, said how, delivered once, never a storm.

A reaction (events.py). Each accepted event the host's table marks as worth alerting becomes an
alert with a title (what happened, where) and a body (severity, when, what holdover is doing
about it, the battery runtime left, which problem a recovery closes and how long it lasted).

Storms are stopped before anything is queued, and a storm is a rate: a problem that changes state
`flap_after` times within `flap_window_s` (3 in a minute) is flapping. Two real cuts minutes apart
are two cuts, each alerted; the same alert again without a change between (within `dedup_s`) is
dropped. While a problem flaps its changes are counted, not sent, with a summary every
`flap_summary_s` it goes on; once it has been quiet for a window the storm is over and one summary
says so and what it ended on ("Mains lost at ups1 flapped 12 times in 48 s", now: power lost),
at the severity of that end state, so a storm that ends in a cut still reaches the critical
channels and opens the problem its recovery will close. A recovery goes to every channel its
problem went to, whatever their minimum severity.

Delivery is durable: every alert is a row in the journal's outbox per channel before anything is
sent (while the journal cannot write, a row in memory: the alert that the journal is broken must
not need the journal; bounded, sent and retried the same way, lost only to a restart), retried
with backoff until its channel takes it, and marked sent the moment it did, so a bridge restart
resumes the unsent and sends nothing twice (short of a crash between a channel accepting and the
mark, a window of one SQLite write). Each channel has a rate limit per hour; alerts due beyond it
go out merged into one message. Every alert is also published, readable, on MQTT
`holdover/alerts` for phone apps on the LAN, which needs no uplink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from holdover import events
from holdover.bridge import notify
from holdover.bridge.alert_outbox import AlertOutbox
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node.dongle import Dongle, DongleError
from holdover.settings import SMS_SCHEME, AlertChannelSettings, AlertSettings, sms_numbers

log = logging.getLogger("holdover.alerts")

RANK = {events.INFO: 0, events.WARNING: 1, events.CRITICAL: 2}
HOUR = 3600.0
UNJOURNALED_MAX = 500  # alerts kept in memory while the journal cannot take them


@dataclass
class _Problem:
    """What is known about one problem at one sentinel (say, mains at ups1)."""

    changes: deque[float] = field(default_factory=deque)
    last_kind: str = ""
    last_ts: float = -1e18
    opened: float | None = None  # when the problem alert went out, while it is open
    title: str = ""  # the problem alert's title, for the recovery that closes it
    channels: set[str] = field(default_factory=set)
    flapping_since: float | None = None
    flaps: int = 0  # changes counted since the storm began
    summary_at: float = 0.0
    now: str = ""  # the latest state's title, for the summary
    now_kind: str = ""  # and its kind: the storm's end state


def compose(event: Event, problem: _Problem | None = None, now: float | None = None) -> tuple[str, str, str]:
    """(severity, title, body) for an event, from the host's event table."""
    k = events.kind(event.kind)
    fields = {"sid": event.sid, **event.data}
    title = k.describe(**fields)
    title = title[:1].upper() + title[1:]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.rx_ts))
    lines = [f"{k.severity.upper()} · {event.sid} · {when}"]
    if event.data.get("detail"):
        lines.append(str(event.data["detail"]))
    if k.doing:
        lines.append("holdover: " + k.action(**fields))
    runtime = event.data.get("runtime_s")
    if isinstance(runtime, int | float) and runtime >= 0:
        # Two batteries, never confused: the host's UPS (the deadline) and the sentinel's own cell.
        if event.data.get("ups"):
            lines.append(f"UPS {event.data['ups']}: about {events.duration(runtime)} left")
        else:
            lines.append(f"sentinel battery: about {events.duration(runtime)} left (the sentinel's own cell)")
    if k.resolves and problem is not None and problem.opened is not None:
        lines.append(f"closes: {problem.title} (after {events.duration((now or time.time()) - problem.opened)})")
    return k.severity, title, "\n".join(lines)


class Alerts:
    def __init__(
        self,
        settings: AlertSettings,
        journal: Journal,
        publish: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.time,
        wan_down: Callable[[], bool] = lambda: False,
        dongle: Dongle | None = None,
        elsewhere: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.s = settings
        # The node whose bridge sends the site's alerts about sentinels, when not this one (bridge.site).
        self.elsewhere = elsewhere
        self.wan_down = wan_down  # channels with when = "wan_down" are used only while it says so
        self.dongle = dongle  # sends the dongle-sms:// channels
        self.journal = journal
        self.outbox = AlertOutbox(journal)
        # The readable copy for MQTT holdover/alerts; it answers whether the broker is there to
        # take it now (paho queues it while not).
        self.publish = publish
        self.clock = clock
        self.channels: dict[str, AlertChannelSettings] = {c.name: c for c in settings.channels}
        self._problems: dict[tuple[str, str], _Problem] = defaultdict(_Problem)
        self._nudge = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Outbox rows the journal could not take (id None), and ids it could not mark sent (never again).
        self._unjournaled: deque[dict[str, Any]] = deque(maxlen=UNJOURNALED_MAX)
        self._sent_unmarked: set[int] = set()

    # --- the Reaction interface -------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._sender()), loop.create_task(self._summaries())]

    def on_event(self, event: Event) -> None:
        k = events.kind(event.kind)
        if not k.alert:
            return
        if event.sid != protocol.NODE and (other := self.elsewhere()):
            log.info("%s from %s: journaled here, alerted by the bridge on %s", event.kind, event.sid, other)
            return
        problem_kind = k.resolves or k.name
        p = self._problems[(event.sid, problem_kind)]
        now = self.clock()
        severity, title, body = compose(event, p, now)
        if p.flapping_since is not None and now - p.changes[-1] >= self.s.flap_window_s:
            self._summary(event.sid, problem_kind, p, now, final=True)  # quiet for a window: it is over
        p.changes.append(now)
        while p.changes and p.changes[0] < now - self.s.flap_window_s:
            p.changes.popleft()
        if p.flapping_since is not None or len(p.changes) >= self.s.flap_after:
            if p.flapping_since is None:
                p.flapping_since, p.summary_at = now, now + self.s.flap_summary_s
                log.warning("%s at %s is flapping: alerts held for a summary", problem_kind, event.sid)
            p.flaps += 1
            p.now, p.now_kind = title, event.kind
            return
        if event.kind == p.last_kind and now - p.last_ts < self.s.dedup_s:
            log.info("alert %r again within %.0f s: not sent again", title, self.s.dedup_s)
            return
        p.last_kind, p.last_ts = event.kind, now
        wan_down = self.wan_down()
        to = {
            c.name
            for c in self.channels.values()
            if RANK[severity] >= RANK[c.min_severity] and (c.when == "always" or wan_down)
        }
        if k.resolves:
            to |= p.channels  # a recovery reaches whoever heard of the problem
            p.opened, p.channels = None, set()
        else:
            p.opened, p.title, p.channels = now, title, to
        self._deliver(to, severity, event.kind, event.sid, title, body)

    async def close(self) -> None:
        await events.cancel(*self._tasks)

    # --- out --------------------------------------------------------------------------------------

    def _deliver(self, to: set[str], severity: str, kind: str, sid: str, title: str, body: str) -> None:
        for name in sorted(to):
            try:
                self.outbox.queue(name, severity, kind, sid, title, body)
            except (sqlite3.Error, OSError) as e:
                self.journal.failed(f"queueing the alert {title!r}", e)
                row = {"id": None, "channel": name, "severity": severity, "title": title, "body": body}
                self._unjournaled.append({**row, "attempts": 0, "next_try": 0.0})
        on_mqtt: bool | None = None  # None: not published at all
        if self.publish is not None and self.s.mqtt:
            try:
                on_mqtt = self.publish(f"{title}\n{body}")
            except Exception:  # the LAN copy failing must not keep the alert from the phones
                log.exception("alert not published on MQTT")
        if to:
            log.info("alert %r to %s", title, ", ".join(sorted(to)))
        elif on_mqtt:
            log.info("alert %r on MQTT %s only (no channel for it)", title, protocol.ALERTS)
        elif on_mqtt is False:
            log.warning(
                "alert %r reaches nobody yet: no channel for it, and the broker is unreachable "
                "(queued for MQTT %s until it is back)",
                title,
                protocol.ALERTS,
            )
        else:
            log.warning("alert %r reaches nobody: no channel for it and [alerts] mqtt is off", title)
        self._nudge.set()

    def _retry(self, rows: list[dict[str, Any]], next_try: float, error: str, count: bool = True) -> None:
        for r in rows:
            if r["id"] is None:  # in memory: the journal could not take it
                r["next_try"], r["attempts"] = next_try, r["attempts"] + count
        ids = [r["id"] for r in rows if r["id"] is not None]
        if ids:
            with self.journal.guard("noting an alert to retry"):
                self.outbox.retry(ids, next_try, error)

    async def _sms(self, channel: AlertChannelSettings, title: str, body: str) -> notify.Sent:
        """Through the dongle's SMS: the cellular network, when no internet uplink is left."""
        if self.dongle is None:
            return notify.Sent(False, "no [dongle] to send SMS through")
        try:
            await self.dongle.asend_sms(sms_numbers(channel.url), f"{title}: {body}")
        except DongleError as e:
            return notify.Sent(False, str(e))
        return notify.Sent(True)

    async def _summaries(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = self.clock()
            for (sid, kind), p in self._problems.items():
                if p.flapping_since is None:
                    continue
                if now - p.changes[-1] >= self.s.flap_window_s:
                    self._summary(sid, kind, p, now, final=True)
                elif now >= p.summary_at:
                    self._summary(sid, kind, p, now, final=False)

    def _summary(self, sid: str, kind: str, p: _Problem, now: float, final: bool) -> None:
        assert p.flapping_since is not None
        # Over: the storm's span, first held change to last; going on: up to now.
        window = events.duration((p.changes[-1] if final else now) - p.flapping_since)
        what = kind.replace("_", " ")
        what = what[:1].upper() + what[1:]
        end = events.kind(p.now_kind)
        # A storm that ended on the problem is that problem, open: its severity, its recovery to come.
        severity = end.severity if final and not end.resolves else events.WARNING
        if final:
            title = f"{what} at {sid} flapped {p.flaps} times in {window}"
            body = f"{severity.upper()} · {sid} · over: each change was held back, not sent\nnow: {p.now}"
        else:
            title = f"{what} at {sid} is flapping: {p.flaps} changes in {window}"
            body = f"WARNING · {sid} · each change held back, not sent\nnow: {p.now}"
        to = {c.name for c in self.channels.values() if RANK[severity] >= RANK[c.min_severity]} | p.channels
        if final:
            if end.resolves:
                p.opened, p.channels = None, set()
            else:
                p.opened, p.title, p.channels = now, p.now, to
            p.last_kind, p.last_ts = p.now_kind, now
            p.flapping_since, p.flaps = None, 0
            p.changes.clear()
        else:
            p.summary_at = now + self.s.flap_summary_s
        self._deliver(to, severity, "flapping", sid, title, body)

    async def _sender(self) -> None:
        while True:
            try:
                await self._send_due()
            except Exception:  # a broken channel must not end delivery on the others
                log.exception("alert delivery round failed")
            self._nudge.clear()
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that arrives as
            # the nudge is set (an alert raised as the bridge stops), and close() waits forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._nudge.wait()

    async def _send_due(self) -> None:
        now = self.clock()
        due: dict[str, list[dict[str, Any]]] = defaultdict(list)
        rows: list[dict[str, Any]] = []
        with self.journal.guard("reading the alert outbox"):
            rows = [r for r in self.outbox.due(now) if r["id"] not in self._sent_unmarked]
        for row in [*rows, *(r for r in self._unjournaled if r["next_try"] <= now)]:
            due[row["channel"]].append(row)
        for name, rows in due.items():
            channel = self.channels.get(name)
            if channel is None:  # removed from the config since: kept, not sent, said once
                self._retry(rows, now + HOUR, f"no channel {name!r} configured", count=False)
                continue
            sent: list[float] = []
            with self.journal.guard("reading the alert outbox"):
                sent = self.outbox.messages_since(name, now - HOUR)
            room = channel.per_hour - len(sent)
            if room <= 0:
                self._retry(rows, sent[0] + HOUR, "rate limit: held", count=False)
                continue
            batches = [[r] for r in rows] if len(rows) <= room else [rows]  # over the limit: one merged
            for batch in batches:
                await self._send(channel, batch)

    async def _send(self, channel: AlertChannelSettings, rows: list[dict[str, Any]]) -> None:
        if len(rows) == 1:
            severity, title, body = rows[0]["severity"], rows[0]["title"], rows[0]["body"]
        else:
            severity = max((r["severity"] for r in rows), key=RANK.__getitem__)
            title = f"{len(rows)} holdover alerts (rate limit: merged)"
            body = "\n".join(f"- {r['title']}" for r in rows)
        if channel.url.startswith(SMS_SCHEME):
            result = await self._sms(channel, title, body)
        else:
            result = await asyncio.to_thread(notify.send, channel.url, title, body, severity)
        ids = [r["id"] for r in rows if r["id"] is not None]
        now = self.clock()
        if result.ok:
            for r in rows:
                if r["id"] is None:
                    self._unjournaled.remove(r)
            if ids:
                try:
                    self.outbox.sent(ids, now, ids[0])
                except (sqlite3.Error, OSError) as e:
                    self.journal.failed("marking alerts sent", e)
                    self._sent_unmarked.update(ids)  # sent: never again, even if the mark is lost
            return
        attempts = max(r["attempts"] for r in rows) + 1
        wait = min(self.s.retry_max_s, 2.0**attempts)
        self._retry(rows, now + wait, result.error)
        log.warning(
            "alert %r not delivered to %s (try %d): %s; again in %.0f s",
            title,
            channel.name,
            attempts,
            result.error,
            wait,
        )
