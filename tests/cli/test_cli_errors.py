"""Errors raised on purpose reach the user as one line and an exit code, mapped in one place
(holdover.cli.common.Group), and every such error shares the one root."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import holdover
from holdover.cli import app
from holdover.errors import HoldoverError

ROOT = Path(holdover.__file__).parent


def _error_classes() -> list[tuple[str, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                mod = ".".join(("holdover", *path.relative_to(ROOT).with_suffix("").parts))
                out.append((mod, node.name))
    return out


@pytest.mark.parametrize(("module", "name"), _error_classes(), ids=lambda v: v)
def test_every_error_of_ours_is_a_holdover_error(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, HoldoverError), f"{module}.{name} does not derive from holdover.errors.HoldoverError"


def test_there_are_errors_to_check() -> None:
    assert len(_error_classes()) >= 15


CASES = [
    # argv, exit code, what the one line must say
    (["bridge", "--config", "{tmp}/missing.toml"], 2, "bad config"),
    (["status", "--config", "{tmp}/missing.toml"], 2, "bad config"),
    (["forget", "no-such-run"], 1, "no run named 'no-such-run'"),
    (["verify", "{tmp}"], 1, "no verified checkpoint under"),
    (["verify", "{tmp}/nonexistent"], 2, "{tmp}/nonexistent: does not exist"),
    (["outages", "--days", "-1", "--config", "{tmp}/missing.toml"], 2, "--days -1: give a number of days above 0"),
    (["flash", "{tmp}/missing.bin", "--dry-run", "--port", "/dev/null"], 2, "cannot read"),
    (["launch", "--name", "bad/name", "--", "true"], 2, "run name 'bad/name'"),
    (["keygen", "bad", "--dir", "/proc/holdover-cannot-be-made"], 1, "/proc/holdover-cannot-be-made"),
]


@pytest.mark.parametrize(("argv", "code", "said"), CASES, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_an_error_is_one_line_and_its_exit_code(
    argv: list[str], code: int, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOLDOVER_REGISTRY", str(tmp_path / "registry"))
    r = CliRunner().invoke(app, [a.format(tmp=tmp_path) for a in argv])
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    assert said.format(tmp=tmp_path) in r.output
    assert r.output.startswith("holdover: "), r.output


# --- every subcommand against broken inputs: one line, a non-zero exit, never a traceback -------

KEYLINE = '[[sentinels]]\nid = "s"\nkey = "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"\n'


def _inputs(tmp: Path) -> dict[str, str]:
    garbage = tmp / "garbage"
    garbage.write_bytes(b"\x00\xffnot this\n{[")
    (tmp / "dir").mkdir()
    bad_journal = tmp / "bad-journal.toml"
    bad_journal.write_text(f'[journal]\npath = "{garbage}"\n{KEYLINE}')
    dir_journal = tmp / "dir-journal.toml"
    dir_journal.write_text(f'[journal]\npath = "{tmp / "dir"}"\n{KEYLINE}')
    empty = tmp / "empty.toml"
    empty.write_text(f'[journal]\npath = "{tmp / "j.db"}"\n{KEYLINE}')
    return {
        "missing": str(tmp / "missing"),
        "garbage": str(garbage),
        "dir": str(tmp / "dir"),
        "bad_journal": str(bad_journal),
        "dir_journal": str(dir_journal),
        "empty": str(empty),
    }


CONFIG_COMMANDS = [
    ["bridge"],
    ["broker-config", "--out", "{dir}/out"],
    ["doctor"],
    ["install-service", "--unit-dir", "{dir}"],
    ["diagnose"],
    ["failover", "status"],
    ["status"],
    ["events"],
    ["test-alert"],
    ["ha-remove", "s"],
    ["relay", "s", "on"],
]
BROKEN = [
    # every command that takes the bridge's config, against each broken config
    *[(c, cfg) for c in CONFIG_COMMANDS for cfg in ("missing", "garbage", "dir")],
    # a config that loads, pointing at a journal that is not one (the bridge starts all the same
    # and serves 503 until it can open it: test_journal_broken.py)
    (["status"], "bad_journal"),
    (["events"], "bad_journal"),
    (["status"], "dir_journal"),
    (["events"], "dir_journal"),
    # a config with nothing for the command to do
    (["diagnose"], "empty"),
    (["failover", "status"], "empty"),
    (["test-alert"], "empty"),
    (["events", "--kind", "mains_lots"], "empty"),
]
BOARD_BROKEN = [
    ["check-config", "{missing}"],
    ["check-config", "{garbage}"],
    ["check-config", "{dir}"],
    ["deploy", "--board", "{garbage}", "--port", "/dev/null"],
    ["deploy", "--board", "{missing}"],
    ["console", "--board", "{garbage}", "--port", "/dev/null", "--seconds", "0.1"],
    ["flash", "{garbage}", "--dry-run", "--port", "/dev/null"],
    ["flash", "{dir}", "--dry-run", "--port", "/dev/null"],
    ["emu", "--config", "{missing}", "--control", "127.0.0.1:1"],
    ["emu", "--config", "{garbage}", "--control", "nonsense"],
    ["keygen", "bad id!", "--dir", "{dir}"],
    ["verify", "{garbage}"],
    ["verify", "{missing}"],
    ["forget", "nobody"],
    ["launch", "--name", "x", "--", "/no/such/program"],
]


def _run_broken(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOLDOVER_REGISTRY", str(tmp_path / "registry"))
    r = CliRunner().invoke(app, argv)
    # CliRunner keeps an escaped exception in r.exception; what a user would have seen is a traceback.
    assert r.exception is None or isinstance(r.exception, SystemExit), (argv, repr(r.exception), r.output)
    assert "Traceback" not in r.output, (argv, r.output)
    assert r.exit_code != 0, (argv, r.output)
    assert r.output.strip(), (argv, "nothing said")


@pytest.mark.parametrize(("argv", "cfg"), BROKEN, ids=lambda v: "-".join(v) if isinstance(v, list) else v)
def test_a_broken_config_or_journal_is_one_line_never_a_traceback(
    argv: list[str], cfg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _inputs(tmp_path)
    _run_broken([*(a.format(**paths) for a in argv), "--config", paths[cfg]], tmp_path, monkeypatch)


@pytest.mark.parametrize("argv", [["status"], ["events"], ["outages"], ["get", "s"]], ids=lambda v: v[0])
@pytest.mark.parametrize("content", [b"", None], ids=["0 bytes", "a database without holdover's tables"])
def test_a_journal_the_bridge_has_not_written_is_said_so(
    argv: list[str], content: bytes | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "j.db"
    if content is None:
        import sqlite3

        sqlite3.connect(journal).execute("CREATE TABLE other (x)").connection.close()
    else:
        journal.write_bytes(content)
    cfg = tmp_path / "h.toml"
    cfg.write_text(f'[journal]\npath = "{journal}"\n{KEYLINE}')
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    r = CliRunner().invoke(app, [*argv, "--config", str(cfg)])
    assert "Traceback" not in r.output, r.output
    if argv == ["status"]:  # the rest of the box is still shown: its UPS, its runs
        assert r.exit_code == 0 and "journal: none yet: the bridge has not run with this config" in r.output
        return
    assert r.exit_code == 2, r.output
    assert f"holdover: {journal} holds no journal yet" in r.output and "has the bridge run" in r.output, r.output


@pytest.mark.parametrize("argv", BOARD_BROKEN, ids=lambda v: "-".join(v[:2]))
def test_broken_board_inputs_are_one_line_never_a_traceback(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _inputs(tmp_path)
    _run_broken([a.format(**paths) for a in argv], tmp_path, monkeypatch)
