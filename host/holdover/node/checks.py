"""One finding of an audit (`holdover doctor`) or a walk of the uplinks (`holdover diagnose`):
what was checked, pass / warn / fail / skip, what was found and, where there is one, the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
RANK = {PASS: 0, SKIP: 0, WARN: 1, FAIL: 2}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def worst(checks: list[Check]) -> int:
    """The exit status: 0 all pass, 1 a warning, 2 a failure."""
    return max((RANK[c.status] for c in checks), default=0)
