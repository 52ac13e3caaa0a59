"""The endings a restarted Mind must still know, kept durably (DESIGN §15: first terminal wins
across a crash).

Two kinds, both written here BEFORE anyone hears of them (`mind.core.runs.PersistEnding`): a
terminal state nobody reported (`lost` at the window's end or at a Hand's restart, `timed_out` at
deadline + grace, `cancelled` when both legs stayed away), and a Hand's result the Mind took (the
Hand lets it go at the `result_ack` that follows). A Mind that crashes right after telling someone
then still knows, when it starts again, that the run ended: if the run's Hand presents it, it is
killed, not adopted, and its owner attaching gets this ending, not a second, different one.

Its own file (`endings.db` in the Mind's home), written from the event loop, the endings of one turn
of the loop in one transaction (`mind.daemon.grouped`): one small commit in WAL mode with
`synchronous=NORMAL` costs tens of microseconds and survives a kill -9 of the process
(the WAL is in the kernel's cache; a power cut is the operating system's to survive, as for every
store here). A separate file, because mind.db's writer is the database thread, and a snapshot
batch holding its lock must never make the event loop wait.

Bounded: an ending matters only while some Hand may still present its run, that is up to the
longest run timeout plus a window; older rows are deleted at start and every `PRUNE_EVERY` writes,
and at most `MAX_ROWS` newest are kept. A row keeps the ending's metadata and at most `TAIL_KEPT`
bytes of each output tail (the owner who attaches after a restart gets the state, the exit code and
the last lines; the whole output went to the client that was attached).

The scripts (when to prune, what a load returns, what a life record means) are written once for
both engines (`mind.store.scripts.EndingBook`), the rows encoded once (`mind.store.rows`); this
module is their SQLite port, `SqliteEndingRows`, and the synchronous store the loop calls. The
record (`Ending`) and the bounds (`MAX_ROWS`, `PRUNE_EVERY`, `TAIL_KEPT`) are defined with them and
named here too, where the Mind and the tests find them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mind.store.rows import ENDING_COLS, TAIL_KEPT, Ending, ending_row
from mind.store.scripts import MAX_ROWS, PRUNE_EVERY, EndingBook, run_now
from protocol.io.files import private_file

__all__ = ["MAX_ROWS", "PRUNE_EVERY", "TAIL_KEPT", "Ending", "EndingStore"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_endings (
    run_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    ended_at REAL NOT NULL,
    cancel_reason TEXT,
    args_digest TEXT NOT NULL DEFAULT '',
    run_end BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS run_endings_age ON run_endings(ended_at);
CREATE TABLE IF NOT EXISTS life (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    running INTEGER NOT NULL,
    live_runs INTEGER NOT NULL
);
"""


class SqliteEndingRows:
    """The port of `mind.store.scripts.EndingRows` on `endings.db`, on the caller's thread (the loop)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._count: int = db.execute("SELECT count(*) FROM run_endings").fetchone()[0]
        """Rows in the table, or more (a replaced row counts twice: a count never too low): what
        `prune` checks against its bound."""

    async def write(self, endings: list[Ending]) -> list[tuple[str, int]]:
        rows = [ending_row(e) for e in endings]
        with self._db:  # BEGIN ... COMMIT, or ROLLBACK on an error
            self._db.execute("BEGIN")
            self._db.executemany(f"INSERT OR REPLACE INTO run_endings ({ENDING_COLS}) VALUES (?,?,?,?,?,?)", rows)
        self._count += len(rows)
        return []  # one Mind, no claims: nothing is refused

    async def prune(self, horizon: float, keep: int) -> None:
        self._count -= self._db.execute("DELETE FROM run_endings WHERE ended_at < ?", (horizon,)).rowcount
        if self._count <= keep:
            return
        # On the age index, only when over the bound: `NOT IN (newest MAX_ROWS)` scanned and sorted
        # the whole table every PRUNE_EVERY writes, a stall of the loop that grew with the table.
        cutoff = self._db.execute(
            "SELECT ended_at FROM run_endings ORDER BY ended_at DESC LIMIT 1 OFFSET ?", (keep,)
        ).fetchone()
        if cutoff is not None:  # ties at the cutoff go too: at most `keep` are kept
            self._db.execute("DELETE FROM run_endings WHERE ended_at <= ?", (cutoff[0],))
        self._count = self._db.execute("SELECT count(*) FROM run_endings").fetchone()[0]

    async def read(self) -> list[Sequence[Any]]:
        return self._db.execute(f"SELECT {ENDING_COLS} FROM run_endings ORDER BY ended_at").fetchall()

    async def start_life(self) -> tuple[bool, int] | None:
        row = self._db.execute("SELECT running, live_runs FROM life WHERE id = 1").fetchone()
        self._db.execute("INSERT OR REPLACE INTO life (id, running, live_runs) VALUES (1, 1, 0)")
        return None if row is None else (bool(row[0]), int(row[1]))

    async def end_life(self, live_runs: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO life (id, running, live_runs) VALUES (1, 0, ?)", (live_runs,))


class EndingStore:
    """The SQLite engine's endings, synchronous: each method one script of `EndingBook`."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, timeout=1)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        # the bounds as this module names them when the store opens (a test lowers them here)
        self._book = EndingBook(SqliteEndingRows(self._db), PRUNE_EVERY, MAX_ROWS)

    def close(self) -> None:
        self._db.close()

    def begin_life(self) -> bool:
        """This Mind starts. True if its previous life may have left runs going on Hands: it
        crashed (never said it stopped), or it stopped with runs resumable."""
        return run_now(self._book.begin_life())

    def end_life(self, live_runs: int) -> None:
        """This Mind stops, leaving `live_runs` runs resumable on their Hands."""
        run_now(self._book.end_life(live_runs))

    def put(self, ending: Ending) -> None:
        """Write one ending, durably, before returning (raises `sqlite3.Error` if it cannot)."""
        self.put_many([ending])

    def put_many(self, endings: list[Ending]) -> None:
        """Write `endings` in one transaction, durably, before returning (raises `sqlite3.Error` if
        it cannot, and then none is written): one commit for every call that ended in one turn of
        the Mind's loop, instead of one each (issue 25)."""
        run_now(self._book.put_many(endings))

    def prune(self, window: float, now: float) -> None:
        """Delete the endings no Hand can present any more (older than the longest run timeout
        plus `window`), and all but the newest `MAX_ROWS`."""
        run_now(self._book.prune(window, now))

    def load(self, window: float, now: float | None = None) -> list[Ending]:
        """The endings that still matter, oldest first, after `prune`. A row that does not decode
        (a damaged file) is skipped, not fatal: it is one run's memory."""
        return run_now(self._book.load(window, now))
