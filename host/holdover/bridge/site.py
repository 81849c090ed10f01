"""The bridges of one site: several training nodes, each with its own bridge, on one broker.

Every bridge hears every sentinel, journals each event and acts on it for its own node (rescues
its runs, drains its Slurm circuits); that is wanted N times. An alert to a phone about a sentinel
is wanted once: the site's alerting bridge sends it, and the others journal it as not theirs to
send. The alerting bridge is the lowest-named node, among the bridges that are online (their
retained status, `holdover/node/NAME/status`, which the broker turns to offline by the bridge's
last will when it dies) and have alert channels (their retained node state says so). No vote and
no extra topic: every bridge reads the same retained messages and reaches the same answer; when
the alerting bridge goes, the next lowest takes over from its next alert.

An alert about a node itself (its uplink failed over, its rescue failed) is that node's own and
goes out from its bridge whatever the site says.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from holdover.firmware import protocol

log = logging.getLogger(__name__)


@dataclass
class _Peer:
    online: bool = False
    alerts: bool = False


class Site:
    def __init__(self, me: str, alerts: bool) -> None:
        self.me = me
        self.alerts = alerts
        self.peers: dict[str, _Peer] = {}

    def status(self, node: str, payload: bytes) -> None:
        if node != self.me:
            self.peers.setdefault(node, _Peer()).online = payload == protocol.ONLINE.encode()

    def state(self, node: str, body: dict[str, object]) -> None:
        if node != self.me:
            self.peers.setdefault(node, _Peer()).alerts = bool(body.get("alerts"))

    def alerting(self) -> str | None:
        """The node whose bridge sends the site's alerts about sentinels (None: no bridge has channels)."""
        named = {n for n, p in self.peers.items() if p.online and p.alerts} | ({self.me} if self.alerts else set())
        return min(named) if named else None

    def elsewhere(self) -> str | None:
        """The alerting node when it is not this one."""
        node = self.alerting()
        return node if node is not None and node != self.me else None

    def as_dict(self) -> dict[str, object]:
        return {
            "alerting": self.alerting(),
            "bridges": {self.me: {"online": True, "alerts": self.alerts}}
            | {n: {"online": p.online, "alerts": p.alerts} for n, p in sorted(self.peers.items())},
        }

    def __repr__(self) -> str:
        return json.dumps(self.as_dict())
