"""Resume into the model's own tensors: each checked chunk of a checkpoint is copied from the
reader's staging buffer straight into the model's and optimizer's existing tensors.

`state.load` + `state.apply` build every tensor on a buffer of its own and then copy them in: a
second copy of the state at the peak, and first-touch costs paid for memory the model already
owns. Here the peak is the state plus the reader's staging buffers. The price: a chunk found
damaged halfway leaves the tensors holding a mix of two checkpoints, so `load_into` raises and the
caller loads an older checkpoint over them in full (Guard.resume does); optimizer state this call
created is taken back first, so nothing of the failed attempt outlives it.

A destination on a GPU takes the copy host-to-device from the checked staging buffer (torch's
copy_ from a CPU tensor). The staging buffers are then page-locked for the call
(holdover.train.device.pin_host), so each copy is DMA from them rather than a copy through the
driver's bounce buffer; nothing here touches CUDA for a CPU-only run. Untried on a GPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from holdover.errors import HoldoverError
from holdover.train import ckpt, state
from holdover.train.say import Log, stderr


class DoesNotFit(HoldoverError, ValueError):
    """A sound checkpoint of another model (a tensor missing here, or of another shape or dtype):
    not damage, so resume stops and says so rather than set the checkpoint aside."""


@dataclass
class _Place:
    """Where a tensor's bytes lie in a file, and the tensor (or a stand-in) they go into."""

    start: int
    end: int
    dest: torch.Tensor  # flat uint8 view of the destination's bytes
    after: Callable[[], None] | None = None  # copies a stand-in into a destination it could not view


Maker = Callable[[str, list[int], torch.dtype], "torch.Tensor | None"]


def _destinations(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, train: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], Maker | None, Callable[[], None]]:
    """name -> the live tensor a checkpoint's tensor of that name goes into; a maker for optimizer
    state that does not exist yet; and an undo for what the maker made."""
    dest: dict[str, torch.Tensor] = dict(model.state_dict(keep_vars=False))
    created: list[tuple[Any, str]] = []
    opt = train.get("optimizer")
    if optimizer is None or opt is None:
        return dest, None, lambda: None
    flat = [p for g in optimizer.param_groups for p in g["params"]]
    names: list[str] = opt["names"]
    if len(flat) != len(names):
        raise DoesNotFit(f"the optimizer has {len(flat)} parameters, the checkpoint {len(names)}")
    index = {n: p for p, n in zip(flat, names, strict=True)}
    for p, pname in zip(flat, names, strict=True):
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                dest[f"{state.OPT}{pname}/{k}"] = v

    def make(name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor | None:
        # A fresh optimizer has no moments before its first step: made here, to the saved shape,
        # where load_state_dict would put them (beside the parameter; a step count on the host).
        pname, _, key = name[len(state.OPT) :].rpartition("/")
        p = index.get(pname)
        if p is None:
            return None
        t = torch.empty(shape, dtype=dtype, device=p.device if shape else "cpu")
        optimizer.state.setdefault(p, {})[key] = t
        created.append((p, key))
        return t

    def undo() -> None:
        for p, key in created:
            st = optimizer.state.get(p, {})
            st.pop(key, None)
            if not st:
                optimizer.state.pop(p, None)

    return dest, make, undo


def load_into(
    directory: Path | str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    threads: int = ckpt.THREADS,
    restore_rng: bool = True,
    log: Log = stderr,
) -> state.Loaded:
    """Read, check and copy one checkpoint into the live objects; returns what was loaded (its
    `tensors` hold only the RNG states). Raises CheckpointError naming a bad file or a tensor that
    does not fit; the tensors may then hold a mix, which the caller must load over in full."""
    directory = Path(directory)
    manifest = ckpt.read_manifest(directory)
    if any(not f.chunk for f in manifest.files):
        # Format 1: one hash a file, known only once all of it is read; loaded whole, as before.
        loaded = state.load(directory, threads)
        state.apply(loaded, model, optimizer, scheduler, restore_rng)
        return loaded
    train_entry = next((f for f in manifest.files if f.name == ckpt.TRAIN_JSON), None)
    train = json.loads(ckpt.read_blob(directory, train_entry)) if train_entry else {}
    dest, maker, undo = _destinations(model, optimizer, train)
    rng: dict[str, torch.Tensor] = {}
    plan: dict[str, list[_Place]] = {}
    headers: dict[str, bytes] = {}
    held: set[str] = set()
    try:
        for entry in manifest.files:
            if entry.name == ckpt.TRAIN_JSON:
                continue
            raw, header, start = ckpt.read_header(directory / entry.name)
            headers[entry.name] = raw
            plan[entry.name] = _places(entry.name, header, start, dest, rng, maker)
            held.update(header)
        missing = sorted(set(model.state_dict()) - held)
        if missing:
            # load_state_dict's strictness: a tensor left as the script built it would be a
            # resume that is not one.
            raise DoesNotFit(f"{directory}: the model's {', '.join(missing[:5])} not in the checkpoint")

        def deliver(name: str, offset: int, data: memoryview) -> None:
            if name not in plan:
                return
            raw = headers[name]
            if offset < len(raw):
                # The header was parsed before it was checked: it must be the bytes now checked.
                n = min(len(data), len(raw) - offset)
                if bytes(data[:n]) != raw[offset : offset + n]:
                    raise ckpt.CheckpointError(f"{directory / name}: header changed while being read")
            src = torch.frombuffer(data, dtype=torch.uint8) if len(data) else None
            end = offset + len(data)
            for p in plan[name]:
                a, b = max(p.start, offset), min(p.end, end)
                if a < b and src is not None:
                    p.dest[a - p.start : b - p.start].copy_(src[a - offset : b - offset])

        ckpt.read_into(directory, deliver, threads, manifest=manifest, page_lock=_page_lock(dest, log))
        for places in plan.values():
            for p in places:
                if p.after is not None:
                    p.after()
    except BaseException:
        undo()
        raise
    loaded = state.Loaded(directory, manifest, rng, train)
    state.apply_rest(loaded, optimizer, scheduler, restore_rng)
    return loaded


def _page_lock(dest: dict[str, torch.Tensor], log: Log) -> ckpt.PageLock | None:
    """What page-locks the reader's staging, for a state with a tensor on a GPU; None without one
    (CUDA is never touched then)."""
    if not any(t.device.type == "cuda" for t in dest.values()):
        return None
    from holdover.train import device

    return lambda address, size: device.pin_host(address, size, "read staging buffer", log)


def _places(
    name: str,
    header: dict[str, Any],
    start: int,
    dest: dict[str, torch.Tensor],
    rng: dict[str, torch.Tensor],
    maker: Maker | None,
) -> list[_Place]:
    out = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = state.CODES[info["dtype"]]
            b, e = info["data_offsets"]
            shape = [int(x) for x in info["shape"]]
        except (KeyError, TypeError, ValueError):
            raise ckpt.CheckpointError(f"{name}: bad header entry for {key}") from None
        t = dest.get(key)
        if t is None and key.startswith(state.RNG):
            t = rng[key] = torch.empty(shape, dtype=dtype)
        elif t is None and key.startswith(state.OPT):
            if maker is None:
                continue  # no optimizer to restore (state.apply passes its tensors over too)
            t = maker(key, shape, dtype)
        if t is None:
            raise DoesNotFit(f"{name}: {key} is in the checkpoint and nowhere in the model or optimizer")
        if list(t.shape) != shape or t.dtype != dtype:
            raise DoesNotFit(f"{name}: {key} is {dtype} {shape} in the checkpoint, {t.dtype} {list(t.shape)} here")
        if t.is_contiguous():
            # On a GPU too: its bytes viewed on the device, each checked chunk copied in from the
            # reader's staging buffer (synchronously: the buffer is reused for the next chunk).
            out.append(_Place(start + b, start + e, state.flat_bytes(t.detach())))
        else:
            # Not viewable as bytes in place (strided): filled on the host, then one copy_ into it.
            stand_in = torch.empty(shape, dtype=dtype)

            def after(t: torch.Tensor = t, s: torch.Tensor = stand_in) -> None:
                with torch.no_grad():
                    t.copy_(s)

            out.append(_Place(start + b, start + e, state.flat_bytes(stand_in), after))
    return out
