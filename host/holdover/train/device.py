"""Device-to-host copies of a snapshot: CUDA tensors into the pinned snapshot buffer, on a side stream.

Imported only when a tensor of the state lives on a GPU (Guard checks the captured shards), so
a CPU-only run never touches CUDA. The snapshot buffer is registered with the driver once
(cudaHostRegister), which makes each copy a DMA that does not stop the host; the copies go on a
stream of their own per device, which first waits for everything the training stream has queued
(the step's last kernels must have written what is copied). The Snapshot waits for them before
anything may change them: at the boundary for what a forward pass writes (buffers), and before the
next optimizer step for the parameters and their moments, whose copies overlap the forward pass
(Guard's pre-hook on optimizer.step() holds the step until then).

Resume goes the other way through the reader's staging buffers, page-locked for the load by
pin_host (restore.load_into asks for it only when a destination is on a GPU).

Untried on a GPU: this machine has none. What ran here is the byte placement (`copy_to_host`,
the same call the CUDA path makes) on CPU tensors, and the Snapshot's use of a stager.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import torch

from holdover.train.say import Log, stderr
from holdover.train.state import flat_bytes


def host_bytes(address: int, nbytes: int) -> torch.Tensor:
    """Host memory at `address` as a flat uint8 tensor (no copy)."""
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)


def copy_to_host(address: int, src: torch.Tensor, nbytes: int, non_blocking: bool = False) -> None:
    """Copies the bytes of `src` (any device; made contiguous by the caller) to host memory at `address`."""
    if nbytes == 0:
        return
    src = flat_bytes(src.detach())
    if src.numel() != nbytes:
        raise ValueError(f"a tensor of {src.numel()} bytes where {nbytes} were planned")
    host_bytes(address, nbytes).copy_(src, non_blocking=non_blocking)


def pin_host(address: int, size: int, what: str, log: Log) -> Callable[[], None]:
    """Page-locks host memory for DMA (cudaHostRegister); returns what unregisters it."""
    cudart = torch.cuda.cudart()
    try:
        torch.cuda.check_error(cudart.cudaHostRegister(address, size, 0))
    except RuntimeError as e:
        # Still correct unpinned: each copy then goes through the driver's own bounce buffer
        # and holds the host for its length.
        log(f"holdover: could not pin the {size >> 20} MB {what} ({e}); device copies are slower")
        return lambda: None
    return lambda: torch.cuda.check_error(cudart.cudaHostUnregister(address))


class CudaStager:
    """The Snapshot's Stager for CUDA tensors (see holdover.train.ckpt.snapshot)."""

    def __init__(self, log: Log = stderr) -> None:
        self.log = log
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def pin(self, address: int, size: int) -> Callable[[], None]:
        return pin_host(address, size, "snapshot buffer", self.log)

    def to_host(self, items: Sequence[tuple[int, Any, int]]) -> Callable[[], None]:
        events: list[torch.cuda.Event] = []
        by_device: dict[torch.device, list[tuple[int, Any, int]]] = {}
        for item in items:
            by_device.setdefault(item[1].device, []).append(item)
        for dev, group in by_device.items():
            stream = self._streams.get(dev)
            if stream is None:
                stream = self._streams[dev] = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for address, src, nbytes in group:
                    copy_to_host(address, src, nbytes, non_blocking=True)
                    # Memory the loop frees meanwhile (a contiguous() temporary) is not reused
                    # by the training stream until this stream is done with it.
                    src.record_stream(stream)
                done = torch.cuda.Event()
                done.record(stream)
            events.append(done)

        def wait() -> None:
            for e in events:
                e.synchronize()

        return wait
