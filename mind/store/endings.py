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
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack

from protocol import limits
from protocol.io.files import private_file
from protocol.messages import RunEnd

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

MAX_ROWS = 100_000
"""Endings kept at most (the newest): 10,000 runs lost at once, ten times over."""
PRUNE_EVERY = 1000
TAIL_KEPT = 512


@dataclass(frozen=True)
class Ending:
    """One run the Mind ended by itself, as a restarted Mind needs it back."""

    end: RunEnd
    owner: str
    ended_at: float
    """Wall-clock time."""
    cancel_reason: str | None = None
    args_digest: str = ""
    hand: str = ""
    """The run's Hand: on a shared database the ending is written only while this node's claim of
    it is current (`mind.store.postgres`); not stored."""


class EndingStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, timeout=1)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._writes = 0
        self._window = 0.0
        self._rows = self._db.execute("SELECT count(*) FROM run_endings").fetchone()[0]
        """Rows in the table, or more: what `prune` checks against `MAX_ROWS`."""

    def close(self) -> None:
        self._db.close()

    def begin_life(self) -> bool:
        """This Mind starts. True if its previous life may have left runs going on Hands: it
        crashed (never said it stopped), or it stopped with runs resumable. Only then may a Hand
        still present a run this Mind does not know, and an attach to one is told to wait."""
        row = self._db.execute("SELECT running, live_runs FROM life WHERE id = 1").fetchone()
        self._db.execute("INSERT OR REPLACE INTO life (id, running, live_runs) VALUES (1, 1, 0)")
        return row is not None and (bool(row[0]) or row[1] > 0)

    def end_life(self, live_runs: int) -> None:
        """This Mind stops, leaving `live_runs` runs resumable on their Hands."""
        self._db.execute("INSERT OR REPLACE INTO life (id, running, live_runs) VALUES (1, 0, ?)", (live_runs,))

    def put(self, ending: Ending) -> None:
        """Write one ending, durably, before returning (raises `sqlite3.Error` if it cannot)."""
        self.put_many([ending])

    def put_many(self, endings: list[Ending]) -> None:
        """Write `endings` in one transaction, durably, before returning (raises `sqlite3.Error` if
        it cannot, and then none is written): one commit for every call that ended in one turn of
        the Mind's loop, instead of one each (issue 25)."""
        if not endings:
            return
        rows = [self._row(e) for e in endings]
        with self._db:  # BEGIN ... COMMIT, or ROLLBACK on an error
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO run_endings (run_id, owner, ended_at, cancel_reason, args_digest, run_end) "
                "VALUES (?,?,?,?,?,?)",
                rows,
            )
        self._rows += len(rows)
        before, self._writes = self._writes, self._writes + len(rows)
        if before // PRUNE_EVERY != self._writes // PRUNE_EVERY:
            self.prune(self._window, endings[-1].ended_at)

    @staticmethod
    def _row(ending: Ending) -> tuple[object, ...]:
        end = ending.end
        short = {
            name: tail.model_copy(update={"data": tail.data[-TAIL_KEPT:]})
            for name in ("stdout", "stderr")
            if len((tail := getattr(end, name)).data) > TAIL_KEPT
        }
        if short:
            end = end.model_copy(update=short)
        blob = msgpack.packb(end.model_dump(mode="python"), use_bin_type=True)
        return (ending.end.run_id, ending.owner, ending.ended_at, ending.cancel_reason, ending.args_digest, blob)

    def prune(self, window: float, now: float) -> None:
        """Delete the endings no Hand can present any more (older than the longest run timeout
        plus `window`), and all but the newest `MAX_ROWS`."""
        horizon = now - limits.RUN_TIMEOUT_MAX_MS / 1000 - window
        self._rows -= self._db.execute("DELETE FROM run_endings WHERE ended_at < ?", (horizon,)).rowcount
        if self._rows <= MAX_ROWS:
            return  # counted from the writes (a replaced row counts twice: a count never too low)
        # On the age index, only when over the bound: `NOT IN (newest MAX_ROWS)` scanned and sorted
        # the whole table every PRUNE_EVERY writes, a stall of the loop that grew with the table.
        cutoff = self._db.execute(
            "SELECT ended_at FROM run_endings ORDER BY ended_at DESC LIMIT 1 OFFSET ?", (MAX_ROWS,)
        ).fetchone()
        if cutoff is not None:  # ties at the cutoff go too: at most MAX_ROWS are kept
            self._db.execute("DELETE FROM run_endings WHERE ended_at <= ?", (cutoff[0],))
        self._rows = self._db.execute("SELECT count(*) FROM run_endings").fetchone()[0]

    def load(self, window: float, now: float | None = None) -> list[Ending]:
        """The endings that still matter, oldest first, after `prune`. A row that does not decode
        (a damaged file) is skipped, not fatal: it is one run's memory."""
        now = time.time() if now is None else now
        self._window = window
        self.prune(window, now)
        out: list[Ending] = []
        for run_id, owner, ended_at, reason, digest, blob in self._db.execute(
            "SELECT run_id, owner, ended_at, cancel_reason, args_digest, run_end FROM run_endings ORDER BY ended_at"
        ):
            try:
                end = RunEnd.model_validate(msgpack.unpackb(blob, raw=False))
            except Exception:
                continue
            if end.run_id == run_id:
                out.append(Ending(end, owner, ended_at, reason, digest))
        return out
