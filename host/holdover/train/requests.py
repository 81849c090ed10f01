"""The book of save requests a run was asked: from the bridge (the socket), a signal, or the
script itself. Each request is queued until a save answers it, and streams its state to whoever
asked (queued, saving with bytes done, then done or failed); the bridge's `status` reads it whole.
One condition guards the book: the socket's threads, the watchdog and the loop all touch it.
The standing request, a bound on what a cut may lose (`bound`), is set here too and kept by the
loop (schedule.LossBound)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from holdover.train import registry
from holdover.train.schedule import LossBound


class Requests:
    def __init__(
        self,
        registration: Callable[[], str],
        bound: LossBound | None = None,
        bounded: Callable[[], None] = lambda: None,
    ) -> None:
        self.registration = registration  # the run's registration as JSON, for `status`
        self.bound = bound or LossBound()
        self.bounded = bounded  # the bound changed: the run publishes it in its registration
        self.cv = threading.Condition()
        self.items: dict[str, dict[str, Any]] = {}  # id -> the request as it stands
        self.queue: list[str] = []  # ids not yet answered by a save, oldest first
        # Set by the signal handler, which may run in the middle of an optimizer step: only a flag,
        # made a request by whichever thread looks next (the loop, the watchdog).
        self.signalled = False

    def request(self, reason: str = "manual", rid: str | None = None, after: str = "continue") -> str:
        """Ask for a save at the next step boundary."""
        rid = rid or uuid.uuid4().hex[:12]
        with self.cv:
            if rid not in self.items:
                self.items[rid] = {
                    "id": rid,
                    "state": "queued",
                    "reason": reason,
                    "after": after,
                    "requested": time.time(),
                }
                self.queue.append(rid)
                self.cv.notify_all()
        return rid

    def from_signal(self) -> str | None:
        """The signal's request, queued, if a signal came since the last look."""
        if not self.signalled:
            return None
        self.signalled = False
        return self.request("signal", f"signal-{int(time.time() * 1000)}")

    def copy(self) -> dict[str, dict[str, Any]]:
        """Every request as it stands."""
        with self.cv:
            return {k: dict(v) for k, v in self.items.items()}

    def pending(self) -> list[str]:
        with self.cv:
            return list(self.queue)

    def take(self, rids: list[str]) -> None:
        """These are answered (or about to be): out of the queue."""
        with self.cv:
            for rid in rids:
                self.queue.remove(rid)

    def joined(self, rids: list[str], began: float, window: float, stopping: bool) -> list[str]:
        """The first of `rids` asked within `window` s of `began` (an emergency save the ranks
        agreed on for another rank's request: the same cut), taken out of the queue; one asking
        the run to exit only when it is `stopping`."""
        with self.cv:
            late = [
                r
                for r in rids
                if self.items[r]["requested"] - began <= window and (stopping or self.items[r].get("after") != "exit")
            ][:1]
            self.take(late)  # the condition's lock is reentrant
        return late

    def asks_exit(self, rids: list[str]) -> bool:
        return any(self.items[r].get("after") == "exit" for r in rids)

    def update(self, rids: list[str], **fields: Any) -> None:
        with self.cv:
            for rid in rids:
                self.items[rid].update(fields)
            self.cv.notify_all()

    def wake(self) -> None:
        """Whoever waits on the book looks again (the run is closing)."""
        with self.cv:
            self.cv.notify_all()

    def unanswered(self) -> list[str]:
        with self.cv:
            return [r["id"] for r in self.items.values() if r["state"] not in registry.STATES_FINAL]

    def handle(self, conn: socket.socket, msg: dict[str, Any]) -> None:
        """One request from the bridge (registry.RunServer parsed it)."""
        op = msg["op"]
        if op == "status":
            conn.sendall(registry.encode({"registration": json.loads(self.registration()), "requests": self.copy()}))
        elif op in ("save", "watch"):
            rid = str(msg.get("id") or uuid.uuid4().hex[:12])
            if op == "save":
                self.request(str(msg.get("reason", "bridge")), rid, str(msg.get("after", "continue")))
            elif rid not in self.items:
                conn.sendall(registry.encode({"id": rid, "state": "unknown"}))
                return
            self._stream(conn, rid)
        elif op == "bound":
            v = msg.get("max_loss_s")
            if v is not None and (type(v) not in (int, float) or not math.isfinite(v) or v <= 0):
                conn.sendall(registry.encode({"error": f"bound: max_loss_s must be seconds above 0, or null: {v!r}"}))
                return
            self.bound.max_loss_s = None if v is None else float(v)
            self.bounded()
            conn.sendall(registry.encode(self.bound.as_dict()))
        else:
            conn.sendall(registry.encode({"error": f"unknown op {op!r}"}))

    def _stream(self, conn: socket.socket, rid: str) -> None:
        last: dict[str, Any] = {}
        while True:
            with self.cv:
                self.cv.wait_for(lambda seen=last: self.items[rid] != seen, timeout=1.0)
                cur = dict(self.items[rid])
            if cur == last:
                continue
            try:
                conn.sendall(registry.encode(cur))
            except OSError:
                return
            if cur["state"] in registry.STATES_FINAL:
                return
            last = cur
            if cur["state"] == "saving":
                # Progress at most ten times a second, but a final state goes out at once.
                with self.cv:
                    self.cv.wait_for(lambda: self.items[rid]["state"] in registry.STATES_FINAL, timeout=0.1)
