"""One checkpoint of this rank, written now: the state captured as shards over its live memory
(torch's, through train.state, or the run's own `capture`), written O_DIRECT or buffered as this
device's own saves measured best (ckpt.iomode), then booked: the job's done record, a pin that
keeps it out of rotation, the rotation, and the registration's last save the bridge reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holdover.train import ckpt, registry
from holdover.train.ranks import JobRecords
from holdover.train.say import Log

# (step, the caller's extras) -> (the shards to write, the training state as JSON-able data)
Capture = Callable[[int, "dict[str, Any] | None"], "tuple[list[ckpt.Shard], dict[str, Any]]"]


class Writer:
    def __init__(
        self,
        root: Path,
        state: tuple[Any, Any, Any],
        capture: Capture | None,
        threads: int,
        shard_bytes: int | None,
        io: str,
        keep: int,
        records: JobRecords,
        published: Callable[[registry.LastSave], None],
        log: Log,
    ) -> None:
        if io not in ("auto", "direct", "buffered"):
            raise ValueError(f"io={io!r}: one of auto, direct, buffered")
        self.root = root
        self.model, self.optimizer, self.scheduler = state
        self.own_capture = capture  # without torch: the run hands over its own buffers and state
        self.threads, self.shard_bytes = threads, shard_bytes
        self.io, self.keep = io, keep
        self.records = records
        self.published = published  # the registration's last save, written where the bridge reads it
        self.log = log

    def write(
        self,
        step: int,
        extra: dict[str, Any] | None,
        meta: dict[str, Any],
        progress: ckpt.Progress | None,
        rng: Any,
        direct: bool,
    ) -> tuple[Path, ckpt.Manifest]:
        """Captured and written (the caller holds the boundary), O_DIRECT or not as `direct()` said."""
        shards, blobs = self.capture(step, extra, rng)
        return ckpt.save(
            self.root, step, shards, meta=meta, blobs=blobs, threads=self.threads, direct=direct, progress=progress
        )

    def capture(
        self, step: int, extra: dict[str, Any] | None, rng: Any, on_device: bool = False
    ) -> tuple[list[ckpt.Shard], dict[str, bytes]]:
        """The state as shards over its live memory, and train.json; GPU tensors copied to the
        host, or left there (`on_device`) for the snapshot to stage."""
        if self.own_capture is not None:
            shards, train = self.own_capture(step, extra)
            return list(shards), {ckpt.TRAIN_JSON: json.dumps(train).encode()}
        from holdover.train import state  # torch only when a save actually happens

        cap = state.capture(
            self.model, self.optimizer, self.scheduler, extra, step, self.shard_bytes, self.threads, rng, on_device
        )
        return cap.shards, {ckpt.TRAIN_JSON: json.dumps(cap.train).encode()}

    def direct(self, probe: bool) -> bool:
        return self.io == "direct" or (self.io == "auto" and ckpt.iomode.direct(self.root, probe))

    def learn_io(self, manifest: ckpt.Manifest, direct: bool) -> None:
        if self.io == "auto":
            said = ckpt.iomode.learn(self.root, manifest, direct)
            if said:
                self.log(f"holdover: {said}")

    def saved(
        self, step: int, directory: Path, manifest: ckpt.Manifest, seconds: float, reason: str, pin: bool, prune: bool
    ) -> None:
        """The bookkeeping of a checkpoint now on disk: the job's done record, pin, rotation, registration."""
        self.records.saved(step, directory)
        if pin:
            ckpt.pin(directory, reason)
        if prune:
            self.prune(directory)
        self.published(registry.LastSave(step, str(directory), manifest.nbytes, round(seconds, 4), time.time(), reason))

    def prune(self, newest: Path) -> None:
        try:
            ckpt.prune(self.root, self.keep, protect=[newest])
        except OSError as e:
            self.log(f"holdover: could not remove old checkpoints in {self.root}: {e}")
