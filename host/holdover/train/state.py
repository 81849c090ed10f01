"""PyTorch training state to and from checkpoint shards (the only module here that imports torch).

Tensors are grouped by layer: a layer is a state-dict key up to its first numeric part
(``blocks.3.attn.qkv.weight`` -> ``blocks.3``), or its top-level module. Each parameter's optimizer
moments go into the same shard as the parameter, so a shard restores a layer on its own. Layers are
packed into shards of about ``shard_bytes`` (files of ~100 MB or more, and at least as many as writer
threads, measured best here). Everything that is not a tensor (step, data position, param groups,
scheduler, Python/NumPy RNG) goes into ``train.json``, hashed and listed in the manifest like a shard.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from holdover.train import ckpt

DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code
CODES = {v: k for k, v in DTYPES.items()}
TRAIN_JSON = ckpt.TRAIN_JSON
OPT = "optim/"
RNG = "rng/"


def _entry(name: str, t: torch.Tensor, on_device: bool = False) -> ckpt.Tensor:
    t = t.detach()
    if t.dtype not in DTYPES:
        raise ckpt.CheckpointError(f"tensor {name}: dtype {t.dtype} has no safetensors code")
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu":
        if on_device and t.device.type == "cuda":  # left there: a Snapshot copies it into its pinned buffer
            return ckpt.Tensor(name, DTYPES[t.dtype], list(t.shape), 0, nbytes, t.contiguous(), str(t.device))
        t = t.to("cpu")  # the device-to-host staging copy; on CPU the save reads live memory
    t = t.contiguous()
    return ckpt.Tensor(name, DTYPES[t.dtype], list(t.shape), t.data_ptr(), nbytes, t)


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's own bytes as a flat uint8 view, on its own device."""
    return t.reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def layer_of(key: str) -> str:
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0] if len(parts) > 1 else "_root"


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return value.item()
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()  # numpy arrays and scalars (the NumPy RNG state holds both)
    raise ckpt.CheckpointError(f"{where}: a {type(value).__name__} cannot be stored in train.json")


@dataclass
class Rng:
    """Every RNG a run draws from, as it stood at one moment (a step boundary, for a save taken
    later from another thread while the loop has drawn more)."""

    torch: list[tuple[str, torch.Tensor]]
    python: Any
    numpy: Any = None


def rng_state() -> Rng:
    tensors = [(f"{RNG}torch", torch.get_rng_state())]
    if torch.cuda.is_available():
        tensors += [(f"{RNG}cuda{i}", torch.cuda.get_rng_state(i)) for i in range(torch.cuda.device_count())]
    try:
        import numpy as np

        numpy = np.random.get_state(legacy=True)
    except ImportError:
        numpy = None
    return Rng(tensors, random.getstate(), numpy)  # raw: turned into JSON only when saved


@dataclass
class Captured:
    shards: list[ckpt.Shard]
    train: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    extra: dict[str, Any] | None = None,
    step: int = 0,
    shard_bytes: int | None = None,
    threads: int = ckpt.THREADS,
    rng: Rng | None = None,
    on_device: bool = False,
) -> Captured:
    """Describe the whole training state as shards (no copy on CPU) plus a JSON part; the RNGs as
    they are now, or as `rng` holds them. Tensors on a GPU are copied to the host here, or with
    `on_device` left there for a Snapshot to stage."""
    groups: dict[str, list[ckpt.Tensor]] = {}
    order: list[str] = []

    def add(layer: str, entry: ckpt.Tensor) -> None:
        if layer not in groups:
            groups[layer] = []
            order.append(layer)
        groups[layer].append(entry)

    names = {id(p): n for n, p in model.named_parameters()}
    param_layer: dict[str, str] = {}
    for key, t in model.state_dict(keep_vars=False).items():
        layer = layer_of(key)
        param_layer[key] = layer
        add(layer, _entry(key, t, on_device))

    train: dict[str, Any] = {"step": step, "extra": _jsonable(extra or {}, "extra")}
    if optimizer is not None:
        sd = optimizer.state_dict()
        flat = [p for g in optimizer.param_groups for p in g["params"]]
        scalars: dict[str, dict[str, Any]] = {}
        for idx, st in sd["state"].items():
            pname = names.get(id(flat[idx]), f"param{idx}")
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    add(param_layer.get(pname, layer_of(pname)), _entry(f"{OPT}{pname}/{k}", v, on_device))
                else:
                    scalars.setdefault(pname, {})[k] = _jsonable(v, f"optimizer.state.{pname}.{k}")
        train["optimizer"] = {
            "param_groups": _jsonable(sd["param_groups"], "optimizer.param_groups"),
            "names": [names.get(id(p), f"param{i}") for i, p in enumerate(flat)],
            "scalars": scalars,
        }
    if scheduler is not None:
        train["scheduler"] = _jsonable(scheduler.state_dict(), "scheduler")
    rng = rng or rng_state()
    groups["_rng"] = [_entry(name, t) for name, t in rng.torch]
    order.append("_rng")
    train["python_rng"] = _jsonable(rng.python, "python_rng")
    if rng.numpy is not None:
        train["numpy_rng"] = _jsonable(rng.numpy, "numpy_rng")

    total = sum(t.nbytes for g in groups.values() for t in g)
    target = shard_bytes or min(max(total // (2 * max(threads, 1)), 32 << 20), 2 << 30)
    shards: list[ckpt.Shard] = []
    current: list[ckpt.Tensor] = []
    size = 0
    for layer in order:
        current.extend(groups[layer])
        size += sum(t.nbytes for t in groups[layer])
        if size >= target:
            shards.append(ckpt.Shard(f"shard_{len(shards):03d}.safetensors", current))
            current, size = [], 0
    if current:
        shards.append(ckpt.Shard(f"shard_{len(shards):03d}.safetensors", current))
    return Captured(shards, train)


def save(
    root: Path | str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    extra: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    threads: int = ckpt.THREADS,
    shard_bytes: int | None = None,
    progress: ckpt.Progress | None = None,
    rng: Rng | None = None,
) -> tuple[Path, ckpt.Manifest]:
    cap = capture(model, optimizer, scheduler, extra, step, shard_bytes, threads, rng)
    blob = json.dumps(cap.train).encode()
    return ckpt.save(root, step, cap.shards, meta=meta, blobs={TRAIN_JSON: blob}, threads=threads, progress=progress)


@dataclass
class Loaded:
    directory: Path
    manifest: ckpt.Manifest
    tensors: dict[str, torch.Tensor]
    train: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.train.get("step", self.manifest.step))


def load(directory: Path | str, threads: int = ckpt.THREADS) -> Loaded:
    """Read and verify every file of one checkpoint in one pass (the parallel reader `ckpt.verify`
    uses); the tensors are built on the very buffers that were checked. Raises CheckpointError
    naming a bad file."""
    directory = Path(directory)
    manifest, bufs = ckpt.read_all(directory, threads)
    tensors: dict[str, torch.Tensor] = {}
    train: dict[str, Any] = {}
    for entry in manifest.files:
        path = directory / entry.name
        buf = bufs[entry.name]
        if entry.name == TRAIN_JSON:
            try:
                train = json.loads(bytes(buf[: entry.size]))
            except ValueError as e:
                raise ckpt.CheckpointError(f"{path}: not JSON: {e}") from None
            continue
        header, start = ckpt.parse_header(buf, path)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = CODES[info["dtype"]]
                b, e = info["data_offsets"]
                shape = [int(x) for x in info["shape"]]
            except (KeyError, TypeError, ValueError):
                raise ckpt.CheckpointError(f"{path}: bad header entry for {name}") from None
            if not 0 <= b <= e <= entry.size - start:
                raise ckpt.CheckpointError(f"{path}: {name} lies outside the file")
            count = (e - b) // torch.empty((), dtype=dtype).element_size()
            if count:
                t = torch.frombuffer(buf, dtype=dtype, count=count, offset=start + b)
            else:
                t = torch.empty(0, dtype=dtype)
            tensors[name] = t.reshape(shape)
    return Loaded(directory, manifest, tensors, train)


def apply(
    loaded: Loaded,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
) -> None:
    """Put a loaded checkpoint back into the live objects (model, optimizer, scheduler, RNGs)."""
    t = loaded.tensors
    model.load_state_dict({k: v for k, v in t.items() if not k.startswith((OPT, RNG))})
    opt = loaded.train.get("optimizer")
    if optimizer is not None and opt is not None:
        # One pass over the tensors: "optim/<param>/<key>" grouped by parameter name.
        by_param: dict[str, dict[str, Any]] = {}
        for k, v in t.items():
            if k.startswith(OPT):
                pname, _, key = k[len(OPT) :].rpartition("/")
                by_param.setdefault(pname, {})[key] = v
        state: dict[int, dict[str, Any]] = {}
        for idx, pname in enumerate(opt["names"]):
            st = by_param.get(pname, {})
            st.update(opt["scalars"].get(pname, {}))
            if st:
                state[idx] = st
        optimizer.load_state_dict({"state": state, "param_groups": opt["param_groups"]})
    _apply_scheduler_rng(loaded, scheduler, restore_rng)


def apply_rest(
    loaded: Loaded, optimizer: torch.optim.Optimizer | None, scheduler: Any = None, restore_rng: bool = True
) -> None:
    """What `apply` restores besides tensors, for a loader that put the tensors in place itself
    (restore.load_into): the optimizer's hyperparameters and non-tensor state, scheduler, RNGs."""
    opt = loaded.train.get("optimizer")
    if optimizer is not None and opt is not None:
        for group, saved in zip(optimizer.param_groups, opt["param_groups"], strict=False):
            group.update({k: v for k, v in saved.items() if k != "params"})
        flat = [p for g in optimizer.param_groups for p in g["params"]]
        for p, pname in zip(flat, opt["names"], strict=False):
            for k, v in opt["scalars"].get(pname, {}).items():
                optimizer.state[p][k] = v
    _apply_scheduler_rng(loaded, scheduler, restore_rng)


def _apply_scheduler_rng(loaded: Loaded, scheduler: Any, restore_rng: bool) -> None:
    t = loaded.tensors
    if scheduler is not None and "scheduler" in loaded.train:
        scheduler.load_state_dict(loaded.train["scheduler"])
    if restore_rng:
        if f"{RNG}torch" in t:
            torch.set_rng_state(t[f"{RNG}torch"].clone())
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            if f"{RNG}cuda{i}" in t:
                torch.cuda.set_rng_state(t[f"{RNG}cuda{i}"].clone(), i)
        if "python_rng" in loaded.train:
            v, st, g = loaded.train["python_rng"]
            random.setstate((v, tuple(st), g))
        if "numpy_rng" in loaded.train:
            try:
                import numpy as np

                name, keys, pos, has_gauss, gauss = loaded.train["numpy_rng"]
                np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
            except ImportError:
                pass
