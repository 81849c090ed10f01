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
    assert said in r.output
    assert r.output.startswith("holdover: "), r.output
