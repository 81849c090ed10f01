"""The chunked parallel writer and reader, and the faults around them (real files, real fsyncs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import xxhash

from holdover.train import ckpt, state
from holdover.train.ckpt import engine, write
from holdover.train.guard import Guard
from support import small_tmpfs


def _tensor(name: str, nbytes: int, seed: int) -> ckpt.Tensor:
    return ckpt.Tensor.from_buffer(
        name,
        "U8",
        [nbytes],
        torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
        .numpy()
        .tobytes(),
    )


def _bytes_read() -> int:
    """What this process's read calls have returned so far (all threads): /proc/self/io's rchar."""
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar")).split()[1]
    )


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        os.fsync(f.fileno())


def test_one_huge_tensor_and_many_small_ones_round_trip_bit_for_bit(tmp_path: Path) -> None:
    huge = _tensor("huge", 21 << 20, 1)  # one tensor spanning several chunks
    small = [_tensor(f"s{i}", 1000 + 37 * i, 10 + i) for i in range(300)]  # and many below a block
    shards = [ckpt.Shard("shard_000.safetensors", [huge]), ckpt.Shard("shard_001.safetensors", small)]
    d, manifest = ckpt.save(tmp_path, 5, shards, blobs={"train.json": b'{"step": 5}'}, threads=4)
    big = next(f for f in manifest.files if f.name == "shard_000.safetensors")
    assert big.chunk == ckpt.MIN_CHUNK and len(big.chunks) == -(-big.size // big.chunk) >= 5
    assert big.hash == ckpt.combine(big.chunks)
    for threads in (1, 3, 8):
        before = _bytes_read()
        _, bufs = ckpt.read_all(d, threads=threads)
        # Each byte read once: a chunk's read stops at its own end, not a whole window beyond it.
        assert _bytes_read() - before < manifest.nbytes + 64 * ckpt.ALIGN, threads
        for shard in shards:
            header, start = ckpt.parse_header(bufs[shard.name], d / shard.name)
            for t in shard.tensors:
                b, e = header[t.name]["data_offsets"]
                assert bytes(bufs[shard.name][start + b : start + e]) == bytes(t.keepalive), (threads, t.name)
        assert bytes(bufs["train.json"][:11]) == b'{"step": 5}'
    # The reference reader agrees: still plain safetensors.
    from safetensors.numpy import load_file

    assert load_file(str(d / "shard_000.safetensors"))["huge"].tobytes() == bytes(huge.keepalive)


@pytest.mark.parametrize("direct", [True, False])
def test_a_snapshot_goes_to_the_disk_where_it_lies_byte_for_byte_as_from_the_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    shards = [
        ckpt.Shard("shard_000.safetensors", [_tensor("huge", (21 << 20) + 4097, 3)], {"kind": "model"}),
        ckpt.Shard("shard_001.safetensors", [_tensor(f"s{i}", 1000 + 37 * i, 20 + i) for i in range(50)]),
        ckpt.Shard("shard_002.safetensors", [_tensor("empty", 0, 4)]),
    ]
    live, _ = ckpt.save(tmp_path / "live", 5, shards, blobs={"train.json": b"{}"}, threads=3, direct=direct)
    snap = ckpt.Snapshot()
    snap.take([ckpt.Shard("big.safetensors", [_tensor("old", 30 << 20, 9)])])  # a used buffer: no zeros left
    gathered: list[str] = []
    gather = write.FileWriter.gather
    monkeypatch.setattr(write.FileWriter, "gather", lambda f, i, dst: gathered.append(f.path.name) or gather(f, i, dst))
    copies = snap.take(shards)
    d, manifest = ckpt.save(tmp_path / "snap", 5, copies, blobs={"train.json": b"{}"}, threads=3, direct=direct)
    assert set(gathered) == {"train.json"}  # every shard went from the snapshot, none was gathered
    assert manifest.meta["io"] == ("direct" if direct else "buffered")
    for f in manifest.files:
        assert (d / f.name).read_bytes() == (live / f.name).read_bytes(), f.name
    assert ckpt.verify(d).step == 5
    # A shard whose image is not its file is refused, not written.
    wrong = ckpt.Shard(copies[1].name, copies[1].tensors[1:], copies[1].metadata, copies[1].image)
    with pytest.raises(ckpt.CheckpointError, match=r"shard_001\.safetensors: its image in memory is not its file"):
        ckpt.save(tmp_path / "wrong", 5, [wrong])
    snap.close()


def test_a_flipped_byte_in_any_chunk_is_caught_and_named(tmp_path: Path) -> None:
    d, manifest = ckpt.save(tmp_path, 1, [ckpt.Shard("shard_000.safetensors", [_tensor("w", 18 << 20, 2)])])
    entry = manifest.files[0]
    path = d / entry.name
    for i in range(len(entry.chunks)):
        offset = min(i * entry.chunk + entry.chunk // 2, entry.size - 1)
        _flip(path, offset)
        lo = i * entry.chunk
        with pytest.raises(ckpt.CheckpointError, match=rf"{entry.name}: hash mismatch \(bytes {lo}-"):
            ckpt.verify(d)
        _flip(path, offset)  # back as it was
        assert ckpt.verify(d).step == 1


def test_a_format_1_checkpoint_still_verifies_and_loads(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.Linear(300, 10))
    d, _ = state.save(tmp_path, 4, model)
    m = json.loads((d / ckpt.MANIFEST).read_text())
    m["format"] = "holdover-ckpt/1"
    for f in m["files"]:
        f["hash"] = xxhash.xxh3_128((d / f["name"]).read_bytes()).hexdigest()
        del f["chunk"], f["chunks"]
    (d / ckpt.MANIFEST).write_text(json.dumps(m))
    assert ckpt.verify(d).step == 4
    assert torch.equal(state.load(d).tensors["1.weight"], model[1].weight)
    _flip(d / m["files"][0]["name"], 5000)
    with pytest.raises(ckpt.CheckpointError, match="hash mismatch"):
        ckpt.verify(d)


def test_resume_with_several_threads_loads_exactly_what_was_saved(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 512)).sum().backward()
    opt.step()
    state.save(tmp_path, 9, model, opt, threads=8)
    fresh = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)])
    fresh_opt = torch.optim.Adam(fresh.parameters())
    g = Guard(tmp_path, "t", model=fresh, optimizer=fresh_opt, signal=None, registry_dir=tmp_path / "r", threads=5)
    assert g.resume() == 9
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    a, b = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg"], b[i]["exp_avg"]) for i in a)


def test_staging_buffers_go_round_least_recently_used_first_and_never_to_two_jobs(monkeypatch) -> None:
    import threading
    import time

    monkeypatch.setattr(engine, "STAGING", 4 * ckpt.ALIGN)
    monkeypatch.setattr(engine.kept, "free", [])
    used: list[int] = []
    busy: set[int] = set()
    lock = threading.Lock()

    def work(job: int, st: engine.StagingBuffer) -> None:
        with lock:
            assert st.address not in busy, "a staging buffer handed to two jobs at once"
            busy.add(st.address)
            used.append(st.address)
        time.sleep(0.002)
        with lock:
            busy.discard(st.address)

    engine.run_jobs(list(range(12)), 1, ckpt.ALIGN, work, keep=True)
    # One thread, four kept buffers: each comes back only after the other three.
    assert len(set(used)) == 4 and used == used[:4] * 3
    used.clear()
    engine.run_jobs(list(range(200)), 8, ckpt.ALIGN, work, keep=True)  # more threads than STAGING holds
    assert len(used) == 200 and len(set(used)) == 8
    used.clear()
    monkeypatch.setattr(engine, "STAGING", 64 * ckpt.ALIGN)
    engine.run_jobs(list(range(32)), 1, ckpt.ALIGN, work)  # new buffers for one call: an eighth of the bytes
    assert len(set(used)) == 4 and used == used[:4] * 8


def test_a_save_keeps_at_most_staging_bytes_and_a_daemons_verify_keeps_none(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(engine.kept, "free", [])
    monkeypatch.setattr(engine, "STAGING", 3 * ckpt.MIN_CHUNK)
    d, _ = ckpt.save(tmp_path, 1, [ckpt.Shard("shard_000.safetensors", [_tensor("w", 9 * ckpt.MIN_CHUNK, 3)])])
    kept = list(engine.kept.free)
    assert kept and sum(st.size for st in kept) <= engine.STAGING
    ckpt.verify(d)
    assert engine.kept.free == kept
    ckpt.verify(d, keep_buffers=True)  # buffers as long as the chunks: the kept ones serve
    assert sum(st.size for st in engine.kept.free) <= engine.STAGING


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "small", "size=3m") as mnt:
        yield mnt


def _leftover(root: Path, tag: str, size: int = 2_200_000) -> Path:
    d = root / f"{ckpt.TMP_PREFIX}step_000000009-{tag}"
    d.mkdir()
    (d / "shard_000.safetensors").write_bytes(os.urandom(size))
    return d


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_dead_writers_leftovers_are_reclaimed_only_when_space_is_short(small_fs: Path) -> None:
    host = socket.gethostname()
    shard = [ckpt.Shard("shard_000.safetensors", [_tensor("w", 1_000_000, 3)])]
    dead = _leftover(small_fs, f"{_dead_pid()}@{host}")
    ckpt.save(small_fs, 1, [ckpt.Shard("shard_000.safetensors", [_tensor("w", 100_000, 4)])])
    assert dead.exists()  # room enough: kept (prune after a save removes it, not a pre-flight)
    d, _ = ckpt.save(small_fs, 2, shard)  # 1 MB more does not fit beside it: it goes
    assert not dead.exists() and ckpt.verify(d).step == 2


def test_a_living_writers_temporary_dir_is_never_taken(small_fs: Path) -> None:
    shard = [ckpt.Shard("shard_000.safetensors", [_tensor("w", 1_000_000, 3)])]
    ckpt.save(small_fs, 1, [ckpt.Shard("shard_000.safetensors", [_tensor("w", 100_000, 4)])])
    # Either one taken would make room: the save must still be refused.
    mine = _leftover(small_fs, f"{os.getpid()}@{socket.gethostname()}", 1_200_000)
    other_host = _leftover(
        small_fs, f"{_dead_pid()}@elsewhere.example", 1_200_000
    )  # a shared disk: its pid means nothing here
    with pytest.raises(ckpt.CheckpointError, match=r"disk full: .* nothing was written"):
        ckpt.save(small_fs, 2, shard)
    assert mine.exists() and other_host.exists()


def _guard(root: Path, model: torch.nn.Module, log: list[str], keep: int = 2) -> Guard:
    return Guard(root, "t", model=model, signal=None, registry_dir=root / "reg", keep=keep, log=log.append)


def _damage(d: Path) -> None:
    shard = sorted(d.glob("shard_*.safetensors"))[0]
    _flip(shard, shard.stat().st_size // 2)


def test_a_damaged_checkpoint_is_set_aside_and_not_counted_by_keep(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    model = torch.nn.Linear(200, 200)
    log: list[str] = []
    g = _guard(root, model, log)
    d1, _ = g.save(1)
    d2, _ = g.save(2)
    _damage(d2)
    g2 = _guard(root, torch.nn.Linear(200, 200), log)
    assert g2.resume() == 1
    aside = root / f"{ckpt.DAMAGED_PREFIX}{d2.name}"
    assert aside.is_dir() and "hash mismatch" in (aside / "DAMAGED").read_text()
    assert ckpt.candidates(root) == [d1]
    g2.save(3)
    g2.save(4)  # keep=2: the two good newest stay, the damaged one is neither kept nor deleted
    assert [ckpt.read_manifest(p).step for p in ckpt.candidates(root)] == [4, 3]
    assert aside.is_dir()


def test_when_every_checkpoint_is_damaged_resume_raises_naming_each(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    log: list[str] = []
    g = _guard(root, torch.nn.Linear(100, 100), log)
    dirs = [g.save(s)[0] for s in (1, 2)]
    for d in dirs:
        _damage(d)
    (dirs[0] / ckpt.MANIFEST).write_text("{cut")
    g2 = _guard(root, torch.nn.Linear(100, 100), log)
    with pytest.raises(ckpt.CheckpointError) as err:
        g2.resume()
    text = str(err.value)
    assert f"{dirs[1].name}: " in text and "hash mismatch" in text
    assert f"{dirs[0].name}: " in text and "manifest is not valid" in text
    assert ckpt.candidates(root) == dirs[::-1]  # nothing moved without the caller's say
    assert g2.resume(fresh_if_damaged=True) == 0
    assert ckpt.candidates(root) == [] and len(list(root.glob(f"{ckpt.DAMAGED_PREFIX}*"))) == 2


def test_pruning_waits_until_the_request_is_done_and_spares_the_emergency_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    log: list[str] = []
    g = _guard(root, torch.nn.Linear(100, 100), log, keep=1)
    g.save(1)
    g.save(2)
    seen: list[str] = []
    real = ckpt.prune

    def spy(*a: object, **kw: object) -> list[Path]:  # the request as the bridge saw it when the prune began
        seen.append(g.requests()["r1"]["state"])
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ckpt, "prune", spy)
    g.request("mains_lost", "r1")
    g.step_end(3)
    assert seen == ["done"]
    steps = {ckpt.read_manifest(p).step: ckpt.pinned(p) for p in ckpt.candidates(root)}
    assert steps == {3: True, 2: False}  # keep=1 of the rotation, and the pinned emergency save
