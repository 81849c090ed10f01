"""The `holdover` command's surface (every command, argument, option, default and help text) is the
one recorded in tests/fixtures/cli_surface.json: a reshaping of cli/ that drops or renames anything
a user or a script relies on fails here. Record anew, on purpose, with
`PYTHONPATH=tests python tests/cli/test_cli_surface.py > tests/fixtures/cli_surface.json`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support import cli_surface as surface

RECORDED = Path(__file__).parents[1] / "fixtures" / "cli_surface.json"


def test_every_command_and_option_is_as_recorded() -> None:
    recorded = json.loads(RECORDED.read_text())
    now = surface()
    assert sorted(now) == sorted(recorded), "commands added or lost"
    for path, want in recorded.items():
        assert now[path] == want, f"`holdover {path}` changed"


def test_every_help_shows_its_section_names() -> None:
    """Rich reads "[mqtt]" as a style and prints nothing of it: each bracketed word of a command's
    or an option's help must reach the rendered --help."""
    from typer.testing import CliRunner

    from holdover.cli import app

    runner = CliRunner()
    checked = 0
    for path, cmd in surface().items():
        texts = [cmd["help"], *(p["help"] or "" for p in cmd["params"])]
        words = {w for t in texts for w in re.findall(r"\[[a-z_]+\]", t.replace("\\[", "["))}
        if not words:
            continue
        shown = runner.invoke(app, [*path.split(), "--help"], env={"COLUMNS": "400"}, terminal_width=400).output
        assert sorted(w for w in words if w not in shown) == [], f"`holdover {path} --help` lost them:\n{shown}"
        checked += 1
    assert checked >= 4  # broker-config, nut-config, test-alert, the failover commands


if __name__ == "__main__":
    print(json.dumps(surface(), indent=1, sort_keys=True))
