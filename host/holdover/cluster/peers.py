"""A Reaction for a training node's bridge: the other nodes of its jobs, checked every second, and
an emergency checkpoint of this node's runs when one of them stops answering.

When the link between nodes dies, every rank blocks in its next collective and the framework's
timeout (10 to 30 minutes) ends the job. The Guard's own watchdog saves after `stall_save_s`
without a step; this says it sooner and from outside: a peer silent for `lost_after_s` raises
`peer_lost`, which starts the rescue like any trigger, and the Guard serves that request from its
watchdog without a collective (train/guard.py). `peer_back` when it answers again.

A peer answers when a TCP connect to its address reaches its kernel: accepted or refused alike
(a refused port is a host that is up). Only a timeout or an unreachable route counts as silent,
so any port will do; the node's sshd (22) is the usual one.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from holdover import events
from holdover.node.netlink import in_netns
from holdover.settings import PeerSettings

log = logging.getLogger("holdover.cluster")

_ANSWERED = (errno.ECONNREFUSED, errno.ECONNRESET)


async def answers(host: str, port: int, timeout: float, netns: str | None = None) -> bool:
    """Whether the peer's kernel answered a TCP connect within `timeout` (accepted or refused)."""
    with in_netns(netns):  # the socket belongs to the namespace it is made in (tests: a node's)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, (host, port)), timeout)
        return True
    except OSError as e:
        return e.errno in _ANSWERED
    except TimeoutError:
        return False
    finally:
        s.close()


class PeerWatch:
    def __init__(self, settings: PeerSettings, node_event: Callable[[str, dict[str, Any]], Any]) -> None:
        self.s = settings
        self.node_event = node_event
        now = time.monotonic()
        self.last_answer: dict[str, float] = {p: now for p in settings.peers}
        self.lost: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def on_event(self, event: Any) -> None:
        pass  # it raises events; it acts on none

    async def close(self) -> None:
        await events.cancel(self._task)

    def view(self) -> dict[str, Any]:
        now = time.monotonic()
        return {p: {"lost": p in self.lost, "silent_s": round(now - t, 1)} for p, t in self.last_answer.items()}

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            results = await asyncio.gather(*(self._check(p) for p in self.s.peers))
            now = time.monotonic()
            for peer, ok in zip(self.s.peers, results, strict=True):
                self._judge(peer, ok, now)
            await asyncio.sleep(max(0.0, self.s.every_s - (time.monotonic() - started)))

    async def _check(self, peer: str) -> bool:
        host, _, port = peer.rpartition(":")
        try:
            return await answers(host, int(port), self.s.timeout_s, self.s.netns)
        except OSError as e:  # this node's own trouble (no namespace, no socket): not the peer's
            log.warning("peer check of %s could not run: %s", peer, e)
            return True

    def _judge(self, peer: str, ok: bool, now: float) -> None:
        if ok:
            self.last_answer[peer] = now
            if peer in self.lost:
                self.lost.discard(peer)
                self.node_event(events.PEER_BACK, {"peer": peer})
            return
        silent = now - self.last_answer[peer]
        if silent >= self.s.lost_after_s and peer not in self.lost:
            self.lost.add(peer)
            log.warning("peer %s silent for %.1f s: the link between the nodes may be dead", peer, silent)
            self.node_event(events.PEER_LOST, {"peer": peer, "silent_s": round(silent, 1)})
