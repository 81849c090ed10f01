"""The root of every error holdover raises on purpose.

A `HoldoverError` is something a person can act on: its message is the one line they see after
`holdover:`, and its `exit_code` is what the command exits with. The CLI maps it in one place
(`holdover.cli`); anything else that escapes is a bug, not a message.

Exit codes follow one rule across commands: 2 when what was given cannot be used (a config, an
argument, an image, a board that is not there), 1 when it was tried and failed. A few commands
have meanings of their own above that (`doctor`: 1 a warning, 2 a failure; `deploy`: 3 the board
did not reach its broker).

This module imports nothing, so `holdover.train` (inside training scripts) may use it too.
"""

from __future__ import annotations

USAGE = 2  # what was given cannot be used
FAILED = 1  # it was tried and did not work


class HoldoverError(Exception):
    exit_code: int = FAILED
    # Put before the message when the CLI shows it ("bad config: ..."), so a reader knows what kind
    # of thing failed without each raise repeating it.
    what: str = ""

    def __init__(self, message: str = "", *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    def user_message(self) -> str:
        return f"{self.what}: {self}" if self.what else str(self)
