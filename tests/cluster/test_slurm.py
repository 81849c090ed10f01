"""A power cut drains a circuit's Slurm nodes and tells every job on them to checkpoint; power
back and steady resumes what holdover drained. Debian's slurmctld, slurmd and munge in network
namespaces (holdover.lab.slurm), a real Mosquitto, the emulated sentinel and a bridge."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from holdover.journal import Journal
from holdover.lab import ddp_trainee
from holdover.lab import slurm as slurm_lab
from holdover.lab.slurm import SlurmLab, pids_in
from support import HOLDOVER, KEY, Mqtt5, wait_for

needs_slurm = pytest.mark.skipif(
    not slurm_lab.available(), reason="needs Debian's slurmd (scripts/ensure-system-deps.sh)"
)

NODES = {"n1": "198.51.100.11", "n2": "198.51.100.12", "n3": "198.51.100.13"}
# Each task writes which node it is on when told to checkpoint, and goes on (a training run saves
# and continues); a bash trap runs between two sleeps. Single-quoted for the batch shell: each
# task, not the batch shell on the first node, names its node.
TASK = """srun bash -c 'trap "echo $SLURM_JOB_ID > {dir}/sig-$SLURMD_NODENAME" USR2; while :; do sleep 0.1; done'"""


@contextlib.contextmanager
def slurm_cluster(nodes: dict[str, str]) -> Iterator[SlurmLab]:
    """A SlurmLab, and nothing of it running once it is closed: a job's slurmstepd, srun and ranks
    included (slurmstepd, in a session of its own and deaf to SIGTERM, outlived the lab by minutes)."""
    with SlurmLab(nodes) as lab:
        inside = lab.namespaces()
        yield lab
    left = pids_in(inside)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]


def _slurm(lab: SlurmLab, **more: object) -> dict:
    """[slurm] for a bridge beside the lab's controller: circuit rack1 is n[1-2], on the rig's sentinel."""
    circuit = {"name": "rack1", "sentinel": "demo", "nodes": "n[1-2]"}
    return {"slurm": {"circuits": [circuit], "conf": str(lab.conf), "netns": lab.netns, **more}}


def _events(rig, kind: str) -> list[dict]:
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        return [e.data for e in reversed(j.events(kinds=[kind]))]


def _cut(rig) -> float:
    """Cut the emulated mains; the monotonic time of the cut, once the sentinel said mains_lost."""
    since = time.monotonic()
    rig.control.send(mains=False)
    rig.wait("mains_lost", 5, since)
    return since


def _running(lab: SlurmLab, job: str) -> bool:
    return "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T")


@pytest.mark.long
@needs_slurm
def test_a_cut_drains_the_circuit_and_signals_its_jobs_everywhere_and_power_back_resumes_only_ours(
    rig_factory, tmp_path: Path
) -> None:
    with slurm_cluster(NODES) as lab:
        rig = rig_factory(bridge_extra=_slurm(lab, grace=1.5, resume_after_s=1.0, save_timeout_s=4, timeout_s=5))
        rig.wait("boot", 15)
        # A two-node job on n2 (in the circuit) and n3 (not): both its parts are told.
        job = lab.run(
            "sbatch", "--parsable", "-N2", "-w", "n2,n3", "-o", str(lab.dir / "job.out"),
            "--wrap", TASK.format(dir=lab.dir),
        ).strip()  # fmt: skip
        wait_for(lambda: _running(lab, job), 15, "the job running")
        time.sleep(0.5)  # the tasks' traps set

        # A blip inside the grace moves nothing.
        since = _cut(rig)
        rig.control.send(mains=True)
        rig.wait("mains_restored", 5, since)
        time.sleep(2.0)
        assert _events(rig, "slurm_drained") == [] and lab.states()["n1"][0] == "idle"

        since = _cut(rig)
        wait_for(lambda: _events(rig, "slurm_drained"), 10, "the circuit drained")
        took = time.monotonic() - since
        [drained] = _events(rig, "slurm_drained")
        assert (drained["circuit"], drained["count"]) == ("rack1", 2), drained
        assert [(j["job"], j["signal"], j["nodes"]) for j in drained["jobs"]] == [(job, "USR2", "n[2-3]")]
        states = lab.states()
        for n in ("n1", "n2"):
            state, reason = states[n]
            assert state in ("drained", "draining") and reason.startswith("holdover: mains lost at demo since "), states
        assert states["n3"][0] == "allocated", states  # not on the circuit: it runs on
        wait_for(lambda: len(list(lab.dir.glob("sig-*"))) == 2, 5, "both parts of the job told")
        assert sorted(p.name for p in lab.dir.glob("sig-*")) == ["sig-n2", "sig-n3"]
        assert _running(lab, job)  # told to checkpoint, not killed

        # An admin drains n1 for their own reason meanwhile: it stays drained when power is back.
        lab.run("scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=admin: fan replaced")
        since = time.monotonic()
        rig.control.send(mains=True)
        rig.wait("mains_restored", 5, since)
        wait_for(lambda: _events(rig, "slurm_resumed"), 10, "the circuit resumed")
        [resumed] = _events(rig, "slurm_resumed")
        assert (resumed["nodes"], resumed["kept"]) == ("n2", [{"node": "n1", "reason": "admin: fan replaced"}])
        states = lab.states()
        assert states["n1"] == ("drained", "admin: fan replaced") and states["n2"][0].rstrip("*") in (
            "allocated",
            "mixed",
        )

        # Its tasks only trap the signal: no node's bridge ever reports a checkpoint of it.
        wait_for(lambda: _events(rig, "slurm_job_unsaved"), 10, "the job reported unsaved")
        [unsaved] = _events(rig, "slurm_job_unsaved")
        assert (unsaved["job"], unsaved["missing"]) == (job, "n2, n3"), unsaved

        # Slurm gone during a cut: the bridge says so once, goes on, and drains when it is back.
        lab.stop("slurmctld")
        rig.bridge.bridge.circuits.retry_s = 0.5
        since = _cut(rig)
        wait_for(lambda: _events(rig, "slurm_failed"), 20, "the failure told")
        failed = _events(rig, "slurm_failed")[0]
        assert failed["circuit"] == "rack1" and failed["what"] == "reading n[1-2]" and failed["error"], failed
        assert rig.bridge.thread.is_alive()
        lab.restart("slurmctld")
        wait_for(lambda: len(_events(rig, "slurm_drained")) == 2, 30, "the circuit drained once Slurm answers")
        assert len(_events(rig, "slurm_failed")) == 1  # retried every 0.5 s, told once
        states = lab.states()
        assert states["n2"][1].startswith("holdover: mains lost at demo")
        assert states["n1"] == ("drained", "admin: fan replaced"), states  # not ours: its reason kept
        assert _events(rig, "slurm_drained")[1]["kept"] == [{"node": "n1", "reason": "admin: fan replaced"}]

        # No job left on the circuit: a cut only drains.
        lab.run("scancel", job)
        since = time.monotonic()
        rig.control.send(mains=True)
        rig.wait("mains_restored", 5, since)
        wait_for(lambda: len(_events(rig, "slurm_resumed")) == 2, 10, "resumed again")
        wait_for(lambda: not lab.run("squeue", "-h", "-o", "%i").strip(), 10, "no job left")
        since = _cut(rig)
        wait_for(lambda: len(_events(rig, "slurm_drained")) == 3, 10, "drained with no job")
        last = _events(rig, "slurm_drained")[2]
        assert (last["count"], last["jobs"], last["jobs_told"]) == (1, [], 0), last  # n2; n1 is the admin's
        print(f"cut -> drained and signalled: {took:.2f} s (grace 1.5 s)")


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        (
            {"circuits": [{"name": "r", "nodes": "n1"}]},
            "slurm.circuits.0: a circuit needs a sentinel, or ups = true",
        ),
        (
            {"circuits": [{"name": "r", "sentinel": "rack9", "nodes": "n1"}]},
            "slurm.circuits[0].sentinel 'rack9' is not a [[sentinels]] id",
        ),
        ({"circuits": [{"name": "r", "ups": True, "nodes": "n1"}]}, "slurm.circuits[0].ups: no [ups] to read"),
        ({"signal": "USR9"}, "slurm.signal: 'USR9' is not a signal"),
        (
            {"signals": [{"partition": "gpu", "signal": "KILLME"}]},
            "slurm.signals.0.signal: 'KILLME' is not a signal",
        ),
        ({"signal_to": "everyone"}, "slurm.signal_to: Input should be 'steps', 'full' or 'batch'"),
    ],
)
def test_a_circuit_or_signal_that_cannot_work_is_refused_by_key(slurm: dict, message: str) -> None:
    from holdover.settings import ConfigError, parse

    with pytest.raises(ConfigError) as e:
        parse({"sentinels": [{"id": "rack1", "key": KEY}], "slurm": slurm})
    assert message in str(e.value), str(e.value)


def test_each_job_gets_the_signal_of_the_first_rule_it_matches() -> None:
    from holdover.settings import SlurmSettings

    s = SlurmSettings.model_validate(
        {
            "signal": "SIGUSR2",
            "signals": [
                {"partition": "lightning", "signal": "sigusr1"},
                {"job_name": "hf-*", "signal": "TERM"},
                {"partition": "gpu", "job_name": "hf-*", "signal": "INT"},
            ],
        }
    )
    assert s.signal == "USR2"
    assert s.signal_for("lightning", "hf-llama") == "USR1"
    assert s.signal_for("gpu", "hf-llama") == "TERM"  # the first match, not the most specific
    assert s.signal_for("gpu", "llama") == "USR2"


@needs_slurm
def test_the_bridge_refuses_a_circuit_naming_a_node_slurm_does_not_know(tmp_path: Path) -> None:
    import subprocess

    import tomli_w

    from support import HOLDOVER

    with slurm_cluster({"n1": "198.51.100.11"}) as lab:
        cfg = tmp_path / "holdover.toml"
        cfg.write_text(
            tomli_w.dumps(
                {
                    "journal": {"path": str(tmp_path / "j.db")},
                    "sentinels": [{"id": "rack1", "key": KEY}],
                    "web": {"enabled": False},
                    "slurm": {
                        "circuits": [{"name": "rack1", "sentinel": "rack1", "nodes": "n[1-2]"}],
                        "conf": str(lab.conf),
                        "netns": lab.netns,
                    },
                }
            )
        )
        r = subprocess.run([HOLDOVER, "bridge", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "slurm.circuits[0].nodes: Slurm knows no node n2 (sinfo -N lists them)" in r.stderr, r.stderr


@pytest.mark.long
@needs_slurm
def test_a_job_saved_at_one_step_on_every_node_is_requeued(rig_factory) -> None:
    """A two-rank torch job (gloo, one rank a node, the Guard agreeing on the step), a bridge on
    each node reporting its runs, the controller's bridge requeueing the job once both saved."""
    import sys

    from holdover.bridge.service import Bridge, BridgeThread
    from holdover.settings import Settings
    from holdover.train import job as jobrec

    pytest.importorskip("torch")
    with slurm_cluster({"n1": "198.51.100.11", "n2": "198.51.100.12"}) as lab:
        more = {"grace": 0.5, "resume_after_s": 0.5, "then": "requeue", "save_timeout_s": 60}
        rig = rig_factory(bridge_extra=_slurm(lab, **more))
        nodes = []
        for n in ("n1", "n2"):
            cfg = Settings.model_validate(
                {
                    "mqtt": {"host": rig.broker.host, "port": rig.broker.port, "client_id": f"holdover-{n}"},
                    "journal": {"path": str(lab.dir / f"journal-{n}.db")},
                    "protect": {"registry": str(lab.dir / f"reg-{n}")},
                    "failover": {"node": n},
                    "web": {"enabled": False},
                }
            )
            nodes.append(BridgeThread(Bridge(cfg)).start())
        try:
            rig.wait("boot", 15)
            run = (
                f"{sys.executable} -m holdover.lab.ddp_trainee --ckpt {lab.dir}/ckpt-$SLURMD_NODENAME"
                f" --registry {lab.dir}/reg-$SLURMD_NODENAME --step-sleep 0.05"
            )
            job = lab.run(
                "sbatch", "--parsable", "-N2", "-o", str(lab.dir / "job-%j.out"),
                "--export", f"ALL,MASTER_ADDR={NODES['n1']},MASTER_PORT=29500,GLOO_SOCKET_IFNAME=eth0",
                "--wrap", f"srun bash -c '{run}'",
            ).strip()  # fmt: skip
            regs = [lab.dir / "reg-n1" / "train.json", lab.dir / "reg-n2" / "train.rank1.json"]
            wait_for(lambda: all(r.exists() for r in regs), 60, "both ranks registered (torch's import is slow here)")
            since = _cut(rig)
            wait_for(lambda: _events(rig, "slurm_job_saved"), 30, "the job saved on both nodes")
            took = time.monotonic() - since
            [saved] = _events(rig, "slurm_job_saved")
            assert (saved["job"], saved["count"], saved["then"]) == (job, 2, "requeued"), saved
            step = saved["step"]
            # Both ranks' checkpoints of that one step are on disk, each verified by its node's bridge.
            for n, rank in (("n1", 0), ("n2", 1)):
                assert (lab.dir / f"ckpt-{n}" / f"rank{rank}" / f"step_{step:09d}").is_dir(), list(
                    (lab.dir / f"ckpt-{n}").rglob("step_*")
                )
                # and each node's disk holds the job's record: that step complete on both ranks
                complete = lambda n=n: (jobrec.read(lab.dir / f"ckpt-{n}").complete or {}).get("step") == step  # noqa: E731
                wait_for(complete, 10, f"the job's record of step {step} on {n}")
            # Requeued: pending again, and nothing starts it while its nodes are drained.
            wait_for(lambda: "PENDING" in lab.run("squeue", "-h", "-j", job, "-o", "%T"), 15, "the job pending")
            # `holdover status` (the journal, no bridge needed) lists what was drained and each job's fate.
            import subprocess

            from support import HOLDOVER

            r = subprocess.run(
                [HOLDOVER, "status", "--config", str(rig.dir / "holdover.toml")],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0, r.stderr
            assert "Slurm circuit rack1: n[1-2] drained" in r.stdout, r.stdout
            assert f"job {job} (wrap, USR2): saved at step {step}, requeued" in r.stdout, r.stdout
            # Power back and steady: the nodes resume, the job starts again and resumes from its checkpoint.
            since = time.monotonic()
            rig.control.send(mains=True)
            rig.wait("mains_restored", 5, since)
            wait_for(lambda: _events(rig, "slurm_resumed"), 15, "the nodes resumed")
            # Slurm holds a requeued job back (its BeginTime, about two minutes); a person in a hurry
            # says "now", as here.
            lab.run("scontrol", "update", f"JobId={job}", "StartTime=now")
            out = lab.dir / f"job-{job}.out"

            def resumed() -> dict[int, int]:
                return ddp_trainee.resumed(out.read_text() if out.exists() else "")

            # The first run said 0; the requeued one names the step it loaded, on both ranks.
            again = lambda: len(resumed()) == 2 and all(s >= step for s in resumed().values())  # noqa: E731
            wait_for(
                again,
                60,
                f"both ranks of the requeued job resumed from the saved step: {lab.run('squeue', '-h', '-o', '%i %T %r %N')}"
                f"{lab.states()} {out.read_text()[-1500:] if out.exists() else 'no output'}",
            )
            print(
                f"cut -> saved on both nodes at step {step} and requeued: {took:.1f} s (grace 0.5 s); resumed {resumed()}"
            )
        finally:
            for b in nodes:
                b.stop()


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.long
@needs_slurm
def test_a_saved_job_is_suspended_off_the_ups_and_resumed_in_place_when_the_power_is_back(rig_factory) -> None:
    """[slurm] then = "suspend": a job whose node reported its checkpoint is stopped where it is by
    Slurm (its processes in state T, no step made), and resumed in place with the nodes, not
    requeued. The torch-free trainee, one node, its bridge reporting its run."""
    import sys

    from holdover.bridge.service import Bridge, BridgeThread
    from holdover.settings import Settings

    with slurm_cluster({"n1": "198.51.100.11", "n2": "198.51.100.12"}) as lab:
        rig = rig_factory(bridge_extra=_slurm(lab, grace=0.5, resume_after_s=0.5, then="suspend", save_timeout_s=30))
        cfg = Settings.model_validate(
            {
                "mqtt": {"host": rig.broker.host, "port": rig.broker.port, "client_id": "holdover-n1"},
                "journal": {"path": str(lab.dir / "journal-n1.db")},
                "protect": {"registry": str(lab.dir / "reg-n1")},
                "failover": {"node": "n1"},
                "web": {"enabled": False},
            }
        )
        node = BridgeThread(Bridge(cfg)).start()
        try:
            rig.wait("boot", 15)
            run = (
                f"{sys.executable} -m holdover.lab.trainee --ckpt {lab.dir}/ckpt --registry {lab.dir}/reg-n1"
                " --name train --mb 1 --step-sleep 0.05"
            )
            out = lab.dir / "job.out"
            job = lab.run("sbatch", "--parsable", "-N1", "-w", "n1", "-o", str(out), "--wrap", f"srun {run}").strip()
            reg = lab.dir / "reg-n1" / "train.json"
            wait_for(reg.exists, 30, "the run registered")
            pid = json.loads(reg.read_text())["pid"]
            since = _cut(rig)
            wait_for(lambda: _events(rig, "slurm_job_saved"), 30, "the job saved")
            took = time.monotonic() - since
            [saved] = _events(rig, "slurm_job_saved")
            assert (saved["job"], saved["count"], saved["then"]) == (job, 1, "suspended"), saved
            assert "SUSPENDED" in lab.run("squeue", "-h", "-j", job, "-o", "%T")
            wait_for(lambda: _proc_state(pid) == "T", 10, "the run's process stopped")
            steps = out.read_text().count("\n")
            time.sleep(0.5)
            assert out.read_text().count("\n") == steps  # stopped: not a step more

            since = time.monotonic()
            rig.control.send(mains=True)
            rig.wait("mains_restored", 5, since)
            wait_for(lambda: _events(rig, "slurm_resumed"), 15, "the nodes and the job resumed")
            [resumed] = _events(rig, "slurm_resumed")
            assert (resumed["nodes"], resumed["jobs"]) == ("n1,n2", [job]), resumed
            assert _running(lab, job) and json.loads(reg.read_text())["pid"] == pid  # in place, not requeued
            wait_for(lambda: out.read_text().count("\n") > steps + 5, 10, "steps again after the resume")
            print(f"cut -> saved and suspended: {took:.1f} s (grace 0.5 s)")
        finally:
            node.stop()
            with contextlib.suppress(slurm_lab.SlurmError):
                lab.run("scancel", "-u", "root")


@pytest.mark.long
@needs_slurm
def test_a_controller_killed_at_each_turn_of_a_cut_goes_on_from_slurm_and_its_journal(
    rig_factory, site_dir: Path
) -> None:
    """The controller's bridge as its unit runs it (a process of its own), killed with SIGKILL at
    each turn of a cut, on a broker running the ACL broker-config writes for nodes n1 and n2:
    - inside the grace (nothing drained yet): the restart drains after what is left of it;
    - drained, a job told to checkpoint: the restart follows the job again without telling it a
      second time; a forged "saved" from n2's login is refused by the broker, never requeues it,
      and n1's own report does;
    - power back while no bridge runs, and killed again in the steady wait before the resume: the
      restart resumes what holdover drained. Slurm's drain reason and the journal are all it has."""
    from holdover.bridge import broker_config as bc
    from holdover.firmware import protocol

    cfg = site_dir / "site.toml"
    cfg.write_text(f'[failover]\nnode = "head"\n[[sentinels]]\nid = "demo"\nkey = "{KEY}"\n')
    auth = site_dir / "mosquitto"
    argv = [HOLDOVER, "broker-config", "-c", str(cfg), "--out", str(auth), "--node", "n1", "--node", "n2"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pw = {u: (auth / f"{u}.password").read_text().strip() for u in ("demo", "holdover-node-n1", "holdover-node-n2")}

    with slurm_cluster({"n1": "198.51.100.11", "n2": "198.51.100.12"}) as lab:
        more = {"grace": 3, "resume_after_s": 3, "timeout_s": 5, "then": "requeue", "save_timeout_s": 300}
        rig = rig_factory(
            bridge=False,
            broker_auth=bc.auth(auth),
            firmware={"mqtt": {"user": "demo", "password": pw["demo"]}},
            bridge_mqtt={"username": bc.BRIDGE_USER, "password_file": str(auth / f"{bc.BRIDGE_USER}.password")},
            bridge_extra={**_slurm(lab, **more), "failover": {"node": "head"}},
        )
        config = str(rig.dir / "holdover.toml")
        logged = rig.dir / "bridge.log"

        def bridge() -> subprocess.Popen[bytes]:
            log = logged.open("ab")
            return subprocess.Popen([HOLDOVER, "bridge", "-c", config], stdout=log, stderr=log)

        def journaled(kind: str) -> int:
            with contextlib.suppress(Exception):  # the bridge may be making the file
                return len(_events(rig, kind))
            return 0

        def killed(p: subprocess.Popen[bytes]) -> None:
            p.kill()
            p.wait(10)

        # Each signal the job's task gets is a line: told twice would be two.
        told = lab.dir / "sig-n1"
        task = TASK.replace("> {dir}/sig-", ">> {dir}/sig-").format(dir=lab.dir)
        job = lab.run("sbatch", "--parsable", "-w", "n1", "-o", str(lab.dir / "job.out"), "--wrap", task).strip()
        wait_for(lambda: _running(lab, job), 15, "the job running")
        time.sleep(0.5)  # the task's trap set

        first = bridge()
        try:
            wait_for(lambda: journaled("boot"), 20, "the bridge hearing the sentinel")
            rig.control.send(mains=False)
            wait_for(lambda: journaled("mains_lost"), 10, "mains_lost journaled")
        finally:
            killed(first)  # inside the grace: nothing drained yet
        assert journaled("slurm_drained") == 0 and lab.states()["n1"][0].rstrip("*") == "allocated"

        second = bridge()
        try:
            # The cut is still open in the journal: drained once the rest of the grace is over.
            wait_for(lambda: journaled("slurm_drained"), 20, "the circuit drained after the restart")
            states = lab.states()
            assert all(states[n][1].startswith("holdover: mains lost at demo") for n in ("n1", "n2")), states
            wait_for(lambda: told.exists(), 5, "the job told to checkpoint")
        finally:
            killed(second)

        third = bridge()
        try:
            wait_for(lambda: "1 job(s) still followed" in logged.read_text(), 20, "the job followed again")
            node_state = lambda n, step: json.dumps(  # noqa: E731
                {"node": n, "ts": time.time(), "runs": {"train": {"job": job, "step": step, "checkpoint_age_s": 0}}}
            ).encode()
            # n2's login speaking for n1: refused by the broker, so neither retained nor delivered.
            n2 = Mqtt5(rig.broker.port, "holdover-node-n2", pw["holdover-node-n2"])
            topic = protocol.node_topic("n1", protocol.STATE)
            assert n2.ack(n2.c.publish(topic, node_state("n1", 999), qos=1, retain=True).mid).value == 0x87
            n2.close()
            time.sleep(1.0)
            assert journaled("slurm_job_saved") == 0 and _running(lab, job)
            n1 = Mqtt5(rig.broker.port, "holdover-node-n1", pw["holdover-node-n1"])
            assert n1.ack(n1.c.publish(topic, node_state("n1", 7), qos=1, retain=True).mid).value == 0
            n1.close()
            wait_for(lambda: journaled("slurm_job_saved"), 10, "n1's own report taken")
            [saved] = _events(rig, "slurm_job_saved")
            assert (saved["job"], saved["step"], saved["then"]) == (job, 7, "requeued"), saved
            wait_for(lambda: "PENDING" in lab.run("squeue", "-h", "-j", job, "-o", "%T"), 15, "the job requeued")
            assert told.read_text().split() == [job], "told to checkpoint a second time"
            assert journaled("slurm_drained") == 1  # and nothing drained twice
        finally:
            killed(third)

        rig.control.send(mains=True)  # power back while no bridge runs
        time.sleep(1)
        fourth = bridge()
        try:
            # Heard on reconnect (the broker kept its session; the sentinel resends until receipted).
            wait_for(lambda: journaled("mains_restored"), 20, "the return of the power heard")
        finally:
            killed(fourth)  # in the steady wait: nothing resumed yet
        assert journaled("slurm_resumed") == 0 and lab.states()["n1"][1].startswith("holdover:")

        fifth = bridge()
        try:
            wait_for(lambda: journaled("slurm_resumed"), 20, "holdover's nodes resumed after the restart")
            states = lab.states()
            assert all(states[n][1] == "none" for n in ("n1", "n2")), states
            assert journaled("slurm_drained") == 1 and journaled("slurm_job_saved") == 1
        finally:
            fifth.terminate()
            fifth.wait(20)


def test_one_scancel_tells_every_job_and_a_job_gone_meanwhile_is_named(tmp_path: Path, monkeypatch) -> None:
    """A cut's jobs in one scancel (bench/site_scale.py: one a job grew a 32-node cut by 0.6 s);
    scancel tells what it can and fails if one job is gone: squeue then says which were told."""
    from holdover.cluster.slurm import Slurm, SlurmError
    from holdover.settings import SlurmSettings

    calls = tmp_path / "calls"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    # As Slurm's own: scancel signals jobs 11 and 13 and refuses 12, which ended a moment ago.
    (bin_ / "scancel").write_text(
        f'#!/bin/sh\necho "scancel $*" >> {calls}\necho "scancel: error: Kill job error on job id 12: Invalid job id specified" >&2\nexit 1\n'
    )
    (bin_ / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> {calls}\nprintf "11\\n13\\n"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    slurm = Slurm(SlurmSettings())
    with pytest.raises(SlurmError, match="Invalid job id specified"):
        slurm.signal(["11", "12", "13"], "USR2")
    assert slurm.running(["11", "12", "13"]) == {"11", "13"}
    assert calls.read_text().splitlines() == [
        "scancel --signal=USR2 11 12 13",
        "squeue -h -j 11,12,13 -t RUNNING,SUSPENDED -o %i",
    ]


def test_a_node_state_is_looked_at_only_by_the_jobs_it_names() -> None:
    """The follow of a job counts the nodes whose state names it against squeue's node count; a state
    naming other jobs (or none) wakes nothing and is never looked through (docs/scale.md)."""
    import asyncio

    from holdover.cluster.circuits import Circuits
    from holdover.cluster.slurm import Job
    from holdover.settings import Settings

    cfg = Settings.model_validate(
        {
            "slurm": {"circuits": [{"name": "rack1", "sentinel": "demo", "nodes": "n[1-3]"}]},
            "sentinels": [{"id": "demo", "key": KEY}],
        }
    )
    c = Circuits(cfg, lambda kind, data: None)  # type: ignore[arg-type,return-value]
    now = time.time()

    def state(*runs: tuple[str, int]) -> dict:
        return {
            "ts": now,
            "runs": {f"r{i}": {"job": j, "step": s, "checkpoint_age_s": 0.1} for i, (j, s) in enumerate(runs)},
        }

    job = Job("7", "train", "gpu", "n[1-2]", "root", count=2)
    c.node_state("n1", state(("7", 10)))
    c.node_state("n3", state(("8", 3)))  # another job's node: not looked at for job 7
    assert c._saved(job, None, now - 1) == (None, ["1 of 2 node(s)"])

    async def follow_wakes() -> list[bool]:
        woken = asyncio.Event()
        c._waiting["7"] = {woken}
        c.node_state("n3", state(("8", 4)))
        quiet = not woken.is_set()
        c.node_state("n2", state(("7", 10)))
        return [quiet, woken.is_set()]

    assert asyncio.run(follow_wakes()) == [True, True]
    assert c._saved(job, None, now - 1) == (10, [])
    c.node_state("n2", state())  # n2's run ended: it no longer names job 7
    assert c._jobs_on["7"] == {"n1"} and c._saved(job, None, now - 1)[0] is None


class FakeSlurm:
    """Slurm's answers for two circuits (ra: n1-n2, rb: n3-n4) and three jobs: 1 on n1, 2 across n2
    and n3, 3 on n4; each call written down as the command it stands for."""

    NODES: ClassVar[dict[str, list[str]]] = {"ra": ["n1", "n2"], "rb": ["n3", "n4"]}
    JOBS: ClassVar[dict[str, list[str]]] = {"1": ["n1"], "2": ["n2", "n3"], "3": ["n4"]}

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.state = {j: "RUNNING" for j in self.JOBS}

    def hostnames(self, hostlist: str) -> list[str]:
        return self.NODES["ra" if "1" in hostlist else "rb"]

    def nodes(self, names: list[str]) -> dict[str, tuple[str, str]]:
        return {n: ("idle", "") for n in names}

    def drain(self, names: list[str], reason: str) -> None:
        self.calls.append(f"drain {','.join(names)}")

    def resume(self, names: list[str]) -> None:
        self.calls.append(f"resume {','.join(names)}")

    def jobs_on(self, names: list[str]) -> list:
        from holdover.cluster.slurm import Job

        on = [j for j, ns in self.JOBS.items() if set(ns) & set(names)]
        return [Job(j, "train", "gpu", ",".join(self.JOBS[j]), "root", len(self.JOBS[j])) for j in on]

    def signal(self, jobs: list[str], signal: str) -> None:
        self.calls.append(f"scancel {' '.join(jobs)}")

    def suspend(self, jobs: list[str]) -> None:
        self.calls.append(f"suspend {','.join(jobs)}")
        for j in jobs:
            assert self.state[j] == "RUNNING", f"job {j} suspended twice"
            self.state[j] = "SUSPENDED"

    def suspended(self, jobs: list[str]) -> set[str]:
        return {j for j in jobs if self.state[j] == "SUSPENDED"}

    def resume_jobs(self, jobs: list[str]) -> None:
        self.calls.append(f"resume jobs {','.join(jobs)}")
        for j in jobs:
            self.state[j] = "RUNNING"


def test_two_circuits_out_at_once_tell_a_job_across_both_once_and_resume_it_when_both_are_back() -> None:
    """A job with steps on two circuits cut together is signalled and followed once (two scancels a
    job are two saves, and the second follow would suspend it twice), suspended once, and stays
    suspended while either circuit is out: resumed, it would draw from the UPS still on battery."""
    import asyncio

    from holdover.cluster.circuits import Circuits
    from holdover.firmware import protocol
    from holdover.journal.schema import Event
    from holdover.settings import Settings

    cfg = Settings.model_validate(
        {
            "slurm": {
                "circuits": [
                    {"name": "ra", "sentinel": "sa", "nodes": "n[1-2]"},
                    {"name": "rb", "sentinel": "sb", "nodes": "n[3-4]"},
                ],
                "grace": 0,
                "resume_after_s": 0,
                "then": "suspend",
            },
            "sentinels": [{"id": "sa", "key": KEY}, {"id": "sb", "key": KEY}],
        }
    )
    said: list[tuple[str, dict]] = []
    slurm = FakeSlurm()
    c = Circuits(cfg, lambda kind, data: said.append((kind, data)), slurm=slurm)  # type: ignore[arg-type]
    seq = iter(range(1, 100))

    def power(sid: str, kind: str) -> None:
        c.on_event(Event(0, time.time(), "sentinel", sid, "b00t", next(seq), kind, 0, None, {}))

    def report(*nodes: str) -> None:  # each node's bridge: its rank of each job saved at step 9
        for n in nodes:
            runs = {
                f"r{j}": {"job": j, "step": 9, "checkpoint_age_s": 0.0} for j, ns in FakeSlurm.JOBS.items() if n in ns
            }
            c.node_state(n, {"ts": time.time() + 1, "runs": runs})

    def kinds(kind: str) -> list[dict]:
        return [d for k, d in said if k == kind]

    async def outage() -> None:
        power("sa", protocol.MAINS_LOST)
        power("sb", protocol.MAINS_LOST)
        await asyncio.sleep(0.1)
        assert sorted(slurm.calls) == ["drain n1,n2", "drain n3,n4", "scancel 1 2", "scancel 3"], slurm.calls
        rb = next(d for d in kinds("slurm_drained") if d["circuit"] == "rb")
        assert rb["already"] == ["2"] and [j["job"] for j in rb["jobs"]] == ["3"], rb
        report("n1", "n2", "n3", "n4")
        await asyncio.sleep(0.5)  # the follows see them saved; 0.2 s later, one suspend a circuit
        assert slurm.state == {"1": "SUSPENDED", "2": "SUSPENDED", "3": "SUSPENDED"}
        assert sorted((d["job"], d["then"]) for d in kinds("slurm_job_saved")) == [
            ("1", "suspended"), ("2", "suspended"), ("3", "suspended"),
        ]  # fmt: skip
        power("sa", protocol.MAINS_RESTORED)  # ra back, rb still out: job 2 has a step on rb
        await asyncio.sleep(0.1)
        [back] = kinds("slurm_resumed")
        assert (back["jobs"], back["jobs_still_suspended"]) == (["1"], ["2"]), back
        assert slurm.state == {"1": "RUNNING", "2": "SUSPENDED", "3": "SUSPENDED"}
        power("sb", protocol.MAINS_RESTORED)
        await asyncio.sleep(0.1)
        assert (kinds("slurm_resumed")[1]["jobs"], kinds("slurm_resumed")[1]["jobs_still_suspended"]) == (
            ["2", "3"],
            [],
        )
        assert set(slurm.state.values()) == {"RUNNING"}
        await c.close()

    asyncio.run(outage())
