"""A wing's own tables in the journal, declared beside the code that writes them."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from holdover.journal import Journal


class Ledger:
    """A wing's own tables in the journal: the subclass declares them (DDL) and is the only code
    that queries them. On a read-only journal from a bridge that never made them, `present` is
    False and the ledger reads as empty."""

    DDL = ""
    # (table, column, type) of columns added after the table was first made: a CREATE ... IF NOT
    # EXISTS cannot add a column to a table that is there, so each is added where it is missing.
    ADDED: tuple[tuple[str, str, str], ...] = ()

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        journal.ensure(self.DDL, self.ADDED)

    @property
    def db(self) -> sqlite3.Connection:
        # The journal's connection of the moment: a stand-in is replaced by the file once it opens,
        # and the ledger's tables are made there on first use.
        self.journal.ensure(self.DDL, self.ADDED)
        return self.journal.db

    @property
    def present(self) -> bool:
        return self.journal.ensure(self.DDL, self.ADDED)
