"""The wings' import rules (docs/architecture.md), checked on the source so a stray import fails the build."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import holdover

ROOT = Path(holdover.__file__).parent
WINGS = ("bridge", "node", "board", "lab", "web", "train", "cluster")
BASE = ("settings", "journal", "events", "proc", "errors", "files", "mqtt_session")
# wing -> the holdover subpackages it may import (besides itself, the base and the firmware's protocol)
ALLOWED = {
    "base": set(),
    "bridge": {"node", "train", "cluster"},
    "node": {"train"},
    "cluster": {"node"},  # node/netlink.py: the one way into a namespace
    "board": set(),
    "lab": {"bridge", "node", "board", "web", "train", "cluster"},
    "web": {"bridge", "node"},
    "train": set(),
}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "holdover" or m.startswith("holdover.")}


def _wing(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    if len(rel.parts) > 1 and rel.parts[0] in BASE:
        return "base"  # settings/: a package, still the base
    if len(rel.parts) > 1:
        return rel.parts[0] if rel.parts[0] in WINGS else None
    return "base" if rel.stem in BASE else None  # cli/ may import anything


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path: Path) -> None:
    wing = _wing(path)
    if wing is None:
        return
    for mod in _imports(path):
        parts = mod.split(".")
        target = parts[1] if len(parts) > 1 else None
        if target in WINGS and target != wing:
            assert target in ALLOWED[wing], f"{path.relative_to(ROOT)} ({wing}) imports {mod}"
        if wing == "train":
            # holdover.errors and holdover.files import nothing, so the training process pays nothing for them.
            assert target in ("train", "errors", "files"), (
                f"train/ runs inside training scripts and imports only train/: {mod}"
            )


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_cli_speaks_typer(path: Path) -> None:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "cli":
        return
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        assert not any(n == "typer" or n.startswith("typer.") for n in names), (
            f"{rel} imports typer: commands live in cli/"
        )


SQL_CALLS = {"execute", "executemany", "executescript"}


def _ledger_module(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "Ledger" for b in n.bases)
        for n in tree.body
    )


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_journal_and_the_ledgers_speak_sql(path: Path) -> None:
    tree = ast.parse(path.read_text())
    if path.relative_to(ROOT).parts[0] == "journal" or _ledger_module(tree):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr not in SQL_CALLS, (
                f"{path.relative_to(ROOT)}:{node.lineno} runs SQL: ask the journal or a wing's Ledger instead"
            )


def test_the_sql_rule_sees_the_ledgers() -> None:
    ledgers = [p for p in ROOT.rglob("*.py") if _ledger_module(ast.parse(p.read_text()))]
    assert len(ledgers) >= 4, ledgers


TESTS = Path(__file__).resolve().parents[1]
TEST_WINGS = {"base", "board", "bridge", "cli", "cluster", "e2e", "firmware", "node", "train", "web"}


def test_tests_live_in_the_folder_of_their_wing() -> None:
    """tests/<wing>/ mirrors the package (base for settings, journal, events, proc and the rules;
    e2e for the whole chain, the wheel and the docs as written); support.py and conftest.py alone
    at the top."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders <= TEST_WINGS, folders - TEST_WINGS


MOST_LINES = 500
FIRMWARE = ROOT.parents[1] / "firmware"


def test_no_module_is_over_500_lines() -> None:
    """A module past 500 lines has grown a second idea (issue 53: guard.py at 1,023, settings.py at
    768): split it by what it does before adding to it."""
    sources = [*ROOT.rglob("*.py"), *FIRMWARE.glob("*.py")]
    assert len(sources) > 150, len(sources)  # both trees seen, not an empty glob
    over = {str(p): n for p in sources if (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert over == {}, f"split these by idea: {over}"
