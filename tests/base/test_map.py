"""The map cannot drift from the house: docs/architecture.md names every module of the host
package where it lives, names none that is gone, and names every firmware module; the README's
table has a row for each wing and names only folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

import holdover

ROOT = Path(holdover.__file__).parent
REPO = Path(__file__).resolve().parents[2]
FIRMWARE = REPO / "firmware"
DOC = REPO / "docs" / "architecture.md"


def _tree_block() -> list[str]:
    text = DOC.read_text()
    after = text.split("## The host package", 1)[1]
    return after.split("```", 2)[1].splitlines()[1:]


def named_in_tree() -> set[str]:
    """Each `x.py` of the tree, as a path under host/holdover/: a name with a slash is from the
    package's root; a bare one is in the folder whose line it stands under (by indentation)."""
    found: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder) of the folders open at this line
    for line in _tree_block():
        body = line.lstrip()
        indent = len(line) - len(body)
        head = re.match(r"([\w]+/|[\w]+\.py\b)", body)
        if head and not line.startswith("host/"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if head.group(1).endswith("/"):
                stack.append((indent, head.group(1).rstrip("/")))
        here = "/".join(d for _i, d in stack)
        for token in re.findall(r"(?<![\w.])([\w/]+\.py)\b", body):
            found.add(token if "/" in token else f"{here}/{token}".lstrip("/"))
    return found


def modules() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts
    }


def test_the_architecture_page_names_every_module_where_it_lives() -> None:
    named = {n for n in named_in_tree() if not n.startswith("firmware/")}
    assert sorted(modules() - named) == [], "modules docs/architecture.md's tree does not name"
    assert sorted(named - modules() - {"cli/__init__.py"}) == [], "names in the tree with no module"


def test_the_architecture_page_names_every_firmware_module() -> None:
    text = DOC.read_text()
    missing = [p.name for p in sorted(FIRMWARE.glob("*.py")) if p.name != "__init__.py" and p.name not in text]
    assert missing == [], "firmware modules docs/architecture.md never names"


def test_the_tree_reader_places_names_by_indentation() -> None:
    assert {
        "bridge/gate.py",
        "node/probe.py",
        "cluster/peers.py",
        "train/ckpt/write.py",
        "errors.py",
    } <= named_in_tree()


def test_the_readme_names_only_folders_and_files_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    rows = [r for r in re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M) if "/" in r]
    assert rows, "the README's table of the tree"
    assert [r for r in rows if not (REPO / r).exists()] == []
    base = {"host/holdover/cli/", "host/holdover/settings/", "host/holdover/journal/"}  # the package row names these
    wings = {f"host/holdover/{p.parent.name}/" for p in ROOT.glob("*/__init__.py")} - base
    assert sorted(wings - set(rows)) == [], "wings the README's table has no row for"
