"""Periodic saves behind the loop: the state copied into a snapshot buffer at a step boundary and
written by a thread while training goes on.

The copy of the parameters and the optimizer's state is overlapped with the next forward and
backward pass, which do not change them (CheckFreq's pipelined snapshot, FAST '21): the Guard's
pre-hook on ``optimizer.step()`` waits here (`await_copy`) until it is done, so the loop pays
only what the copy outlasts the pass. A snapshot that would leave less than SNAPSHOT_HEADROOM of
memory is not made: the save is written in the loop instead, and that is said once."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holdover.train import ckpt, memory
from holdover.train.say import Log
from holdover.train.schedule import AdaptiveInterval

# Left free after a snapshot buffer is made: what the loop's own allocations (a batch, activations
# on a CPU run) may still take. A snapshot that would eat into it is not made: an OOM kill of the
# run by its own checkpointing is the worst outcome there is.
SNAPSHOT_HEADROOM = 1 << 30

# (step, extras, rng, on_device) -> (the shards over the state's live memory, the blobs beside them)
Capture = Callable[[int, "dict[str, Any] | None", Any, bool], "tuple[list[ckpt.Shard], dict[str, bytes]]"]
# (step, directory, manifest, seconds, direct): a background save is on disk
Landed = Callable[[int, Path, ckpt.Manifest, float, bool], None]


@dataclass
class Background:
    """A periodic save being written by its own thread."""

    step: int
    cancel: threading.Event
    started: float
    direct: bool = True  # written with O_DIRECT (ckpt.iomode)
    copied: threading.Event = field(default_factory=threading.Event)  # the snapshot holds the whole step
    thread: threading.Thread | None = None
    result: tuple[Path, ckpt.Manifest] | None = None
    error: Exception | None = None


def copied_later(optimizer: Any) -> Callable[[ckpt.Tensor], bool] | None:
    """Which captured tensors the snapshot may copy while the next forward pass runs: the
    optimizer's parameters and its state, which only its step changes; None for an optimizer
    that shows neither (a wrapper), when everything is copied at the boundary."""
    groups, states = getattr(optimizer, "param_groups", None), getattr(optimizer, "state", None)
    if groups is None or states is None:
        return None
    ptrs = {p.data_ptr() for g in groups for p in g["params"]}
    ptrs |= {v.data_ptr() for st in states.values() for v in st.values() if hasattr(v, "data_ptr")}
    ptrs.discard(0)  # an empty tensor has no memory to name
    # A tensor on a device is held as itself (keepalive); on the host, by its address.
    return lambda t: (t.address if t.device == "cpu" else t.keepalive.data_ptr()) in ptrs


class BackgroundSaver:
    def __init__(
        self,
        root: Path,
        threads: int,
        lock: threading.RLock,
        capture: Capture,
        meta: Callable[[str], dict[str, Any]],
        direct: Callable[[bool], bool],
        landed: Landed,
        overlap: Callable[[], Callable[[ckpt.Tensor], bool] | None],
        interval: AdaptiveInterval | None,
        warn: Callable[[str], None],
        log: Log,
    ) -> None:
        self.root, self.threads = root, threads
        self.lock = lock  # the Guard's boundary lock: the capture happens under it
        self.capture, self.meta, self.direct, self.landed = capture, meta, direct, landed
        self.overlap = overlap  # what may be copied after the boundary (copied_later), or None
        self.interval = interval
        self.warn, self.log = warn, log
        self.snapshot = ckpt.Snapshot()
        self.stager: ckpt.Stager | None = None  # made on the first snapshot with a tensor on a GPU
        self.no_room: str | None = None  # why the last periodic save ran in the loop, not behind it
        self.current: Background | None = None
        self._lock = threading.Lock()
        self.stalls: deque[tuple[int, float, float]] = deque(maxlen=64)  # (step, copy s, waited s)

    def save(self, step: int, extra: dict[str, Any] | None) -> float | None:
        """A periodic save of this boundary, written behind the loop: the seconds the loop paid
        (copy and wait), or None when there is no memory for the copy (the caller saves in the
        loop instead)."""
        t0 = time.monotonic()
        waited = self.finish()  # its snapshot buffer is the one about to be reused
        if waited >= 0.001:
            self.log(
                f"holdover: periodic save at step {step} waited {waited:.2f} s for the previous one to finish writing"
            )
        meta = self.meta("periodic")
        meta["background"] = True
        with self.lock:
            shards, blobs = self.capture(step, extra, None, True)
            if not self._room_for(step, shards):
                return None
            if self.stager is None and any(t.device.startswith("cuda") for s in shards for t in s.tensors):
                from holdover.train.device import CudaStager  # CUDA only for a state that has it

                self.stager = CudaStager(self.log)
            try:
                shards, rest = self.snapshot.begin(shards, self.threads, self.stager, self.overlap())
            except (MemoryError, OSError) as e:  # the buffer could not be made (mmap: ENOMEM)
                self.snapshot.close()
                self._in_loop(step, f"the snapshot buffer could not be made: {e}")
                return None
            if self.no_room is not None:
                self.log(f"holdover: periodic saves in the background again from step {step}: memory for the snapshot")
                self.no_room = None
        stall = time.monotonic() - t0
        self.stalls.append((step, round(stall - waited, 6), round(waited, 6)))
        bg = Background(step, threading.Event(), time.monotonic(), self.direct(True))

        def write() -> None:
            try:
                try:
                    rest()
                finally:
                    bg.copied.set()  # or the optimizer step would wait for ever on a failed copy
                bg.result = ckpt.save(
                    self.root,
                    step,
                    shards,
                    meta=meta,
                    blobs=blobs,
                    threads=self.threads,
                    direct=bg.direct,
                    cancel=bg.cancel,
                )
            except Exception as e:  # reported on the loop's thread (finish)
                bg.error = e

        bg.thread = threading.Thread(target=write, name="holdover-background-save", daemon=True)
        self.current = bg
        bg.thread.start()
        return stall

    def _room_for(self, step: int, shards: list[ckpt.Shard]) -> bool:
        """Whether a snapshot buffer for `shards` fits in memory with the headroom left."""
        need = ckpt.Snapshot.size_of(shards) - self.snapshot.nbytes
        if need <= 0:
            return True  # the buffer held already fits: no new memory
        room = memory.room()
        if need + SNAPSHOT_HEADROOM > room:
            # The old, smaller buffer too: memory is short and the loop's save does not use it.
            self.snapshot.close()
            self._in_loop(
                step,
                f"a background snapshot needs {need / 1e9:.2f} GB more and {room / 1e9:.2f} GB is free "
                f"({SNAPSHOT_HEADROOM / 1e9:.2f} GB kept for the loop)",
            )
            return False
        return True

    def _in_loop(self, step: int, why: str) -> None:
        if self.no_room is None:
            msg = f"periodic save at step {step} written in the loop (it stops training while it writes): {why}"
            self.log(f"holdover: {msg}")
            self.warn(msg)
        self.no_room = why

    @property
    def writing(self) -> bool:
        bg = self.current
        return bg is not None and bg.thread is not None and bg.thread.is_alive()

    def await_copy(self) -> None:
        """Holds the optimizer step until an overlapped snapshot has copied what it changes; the
        wait is what the loop paid for the save, beyond the boundary's part."""
        bg = self.current
        if bg is None or bg.copied.is_set():
            return
        t0 = time.monotonic()
        bg.copied.wait()
        waited = time.monotonic() - t0
        if self.stalls and self.stalls[-1][0] == bg.step:
            step, copy, before = self.stalls[-1]
            self.stalls[-1] = (step, round(copy + waited, 6), before)
        if self.interval:
            self.interval.paid(waited)

    def finish(self, cancel: bool = False, wait: bool = True) -> float:
        """Waits for the save being written (or stops it: `cancel`) and does its bookkeeping on
        this thread; with `wait=False` only when it has ended. Returns the seconds waited."""
        with self._lock:
            bg = self.current
            if bg is None or bg.thread is None or (not wait and bg.thread.is_alive()):
                return 0.0
            if cancel:
                bg.cancel.set()
            t0 = time.monotonic()
            bg.thread.join()
            self.current = None
        waited = time.monotonic() - t0
        if bg.result is not None:
            directory, manifest = bg.result
            self.landed(bg.step, directory, manifest, time.monotonic() - bg.started, bg.direct)
        elif bg.cancel.is_set():
            self.log(f"holdover: background save of step {bg.step} stopped for an emergency save")
        else:
            self.warn(str(bg.error))
            self.log(f"holdover: background checkpoint at step {bg.step} failed: {bg.error}")
        return waited

    def close(self) -> None:
        self.snapshot.close()  # memory the size of the state
