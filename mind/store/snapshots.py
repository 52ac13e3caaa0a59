"""The Mind's task snapshots in SQLite (the `task_snapshots` table of mind.db).

Every operation is a script of `mind.store.scripts` (written once for both engines: the reads, the
pure rules of `mind/core/snapshots.py`, the writes) run over this module's port, the SQLite
statements (`SqliteSnapshotRows`), under one lock and, when it reads to write, in one `BEGIN
IMMEDIATE` transaction, so a push, a query reply and a reconciliation pass racing each other still
apply in version order. Synchronous: the asyncio shell calls it through one worker thread
(`mind.store.sqlite`); its port never suspends, so a script runs to its end in the calling thread
(`run_now`). Raw arguments are never stored: `info` is a `TaskInfo`, which carries digests only.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from mind.core import snapshots as core_rules
from mind.core.snapshots import Plan, Snapshot
from mind.store import scripts
from mind.store.rows import COLS, NON_TERMINAL, snapshot_of, snapshot_row
from mind.store.scripts import SnapshotRows, SnapshotRules, run_now
from protocol.messages import TaskInfo
from protocol.states import TaskState

P = ParamSpec("P")
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS task_snapshots (
    task_id TEXT PRIMARY KEY,
    hand TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    binding_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    stale INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_synced_at REAL,
    version INTEGER NOT NULL DEFAULT 0,
    info BLOB,
    cancel_pending TEXT,
    start_pending INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS task_snapshots_hand ON task_snapshots(hand, state);
"""

_PUT = f"INSERT OR REPLACE INTO task_snapshots ({COLS}) VALUES ({', '.join('?' * 15)})"
_STALE_STATES = ",".join("?" * len(NON_TERMINAL))


class SqliteSnapshotRows:
    """The port of `mind.store.scripts.SnapshotRows` on one SQLite connection. Its caller holds the
    store's lock; its transaction is `BEGIN IMMEDIATE` (the database's write lock: nothing else
    writes until it ends), so its reads need no row locks."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    async def fence(self, hand: str) -> None:
        """One Mind, no claims: a Hand's generation fences its connections."""

    async def get(self, task_id: str) -> Snapshot | None:
        r = self._db.execute(f"SELECT {COLS} FROM task_snapshots WHERE task_id=?", (task_id,)).fetchone()
        return snapshot_of(r) if r else None

    async def of_hand(self, hand: str) -> list[Snapshot]:
        return [snapshot_of(r) for r in self._db.execute(f"SELECT {COLS} FROM task_snapshots WHERE hand=?", (hand,))]

    async def holders(self, task_ids: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for i in range(0, len(task_ids), 500):  # within SQLite's bound on a statement's variables
            chunk = task_ids[i : i + 500]
            found.update(
                self._db.execute(
                    f"SELECT task_id, hand FROM task_snapshots WHERE task_id IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
            )
        return found

    async def insert(self, snap: Snapshot) -> bool:
        cur = self._db.execute(
            f"INSERT INTO task_snapshots ({COLS}) VALUES ({', '.join('?' * 15)}) ON CONFLICT (task_id) DO NOTHING",
            snapshot_row(snap),
        )
        return cur.rowcount == 1

    async def put(self, snaps: list[Snapshot]) -> None:
        if snaps:
            self._db.executemany(_PUT, [snapshot_row(s) for s in snaps])

    async def delete(self, task_ids: list[str]) -> None:
        if task_ids:
            self._db.executemany("DELETE FROM task_snapshots WHERE task_id=?", [(t,) for t in task_ids])

    async def clear_cancel(self, task_id: str) -> None:
        self._db.execute("UPDATE task_snapshots SET cancel_pending=NULL WHERE task_id=?", (task_id,))

    async def mark_stale(self, hand: str | None) -> int:
        if hand is None:
            sql = f"UPDATE task_snapshots SET stale=1 WHERE stale=0 AND state IN ({_STALE_STATES})"
            return self._db.execute(sql, NON_TERMINAL).rowcount
        sql = f"UPDATE task_snapshots SET stale=1 WHERE hand=? AND stale=0 AND state IN ({_STALE_STATES})"
        return self._db.execute(sql, (hand, *NON_TERMINAL)).rowcount

    async def clear_starts(self) -> None:
        self._db.execute("UPDATE task_snapshots SET start_pending=0 WHERE start_pending=1")

    async def listing(
        self, hand: str | None, state: TaskState | None, limit: int, after: tuple[float, str] | None
    ) -> list[Snapshot]:
        where: list[str] = []
        params: list[object] = []
        if after is not None:
            where.append("(created_at < ? OR (created_at = ? AND task_id > ?))")
            params += [after[0], after[0], after[1]]
        if hand is not None:
            where.append("hand=?")
            params.append(hand)
        if state is not None:
            where.append("state=?")
            params.append(state.value)
        sql = f"SELECT {COLS} FROM task_snapshots"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, task_id LIMIT ?"
        return [snapshot_of(r) for r in self._db.execute(sql, (*params, limit)).fetchall()]

    async def counts_by_state(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT state, COUNT(*) FROM task_snapshots GROUP BY state").fetchall())

    async def groups(self) -> list[tuple[str, str, str, bool, int]]:
        return self._db.execute(
            "SELECT hand, owner, state, stale, COUNT(*) FROM task_snapshots GROUP BY hand, owner, state, stale"
        ).fetchall()

    async def count_stale(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM task_snapshots WHERE stale=1").fetchone()[0])


class _Transaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`, or `ROLLBACK` when the script raised."""

    def __init__(self, rows: SqliteSnapshotRows) -> None:
        self._rows = rows

    async def __aenter__(self) -> SqliteSnapshotRows:
        self._rows._db.execute("BEGIN IMMEDIATE")
        return self._rows

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._rows._db.execute("ROLLBACK" if exc_type else "COMMIT")


class SnapshotStore:
    """The SQLite engine's snapshot store: each method one script of `mind.store.scripts`, with
    `rules` the pure rules its scripts call (`mind.core.snapshots`; a test may pass broken ones)."""

    def __init__(self, path: Path, rules: SnapshotRules = core_rules) -> None:
        self._rules = rules
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._rows = SqliteSnapshotRows(self._db)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _run(
        self,
        script: Callable[Concatenate[SnapshotRows, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        with self._lock:
            return run_now(script(self._rows, *args, **kwargs))

    def get(self, task_id: str) -> Snapshot | None:
        return self._run(scripts.get, task_id)

    def insert_new(self, snap: Snapshot) -> Snapshot | None:
        """Insert if no snapshot has this id; else return the existing one (nothing written)."""
        return self._run(scripts.insert_new, snap)

    def delete(self, task_id: str) -> None:
        self._run(scripts.delete, task_id)

    def remove(self, task_id: str, hand: str) -> Snapshot | None:
        """`mind task rm` (`scripts.remove`)."""
        return self._run(scripts.remove, task_id, hand)

    def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        """Apply a Hand's report. Returns (snapshot now held, what happened)."""
        return self._run(scripts.report, hand, info, now, adopt, rules=self._rules)

    def retry_start(self, snap: Snapshot) -> Snapshot | None:
        return self._run(scripts.retry_start, snap)

    def finish_start(self, task_id: str) -> Snapshot | None:
        return self._run(scripts.finish_start, task_id)

    def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        return self._run(scripts.set_cancel_pending, task_id, reason)

    def clear_cancel_pending(self, task_id: str) -> None:
        self._run(scripts.clear_cancel_pending, task_id)

    def mark_hand_stale(self, hand: str) -> int:
        return self._run(scripts.mark_hand_stale, hand)

    def mark_all_stale(self) -> int:
        """Mind restart: nothing it holds about an unfinished task can be trusted as current."""
        return self._run(scripts.mark_all_stale)

    def list(
        self,
        hand: str | None = None,
        state: TaskState | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[Snapshot]:
        """Newest first (`created_at`, then `task_id`); with `after`, one page after that key."""
        return self._run(scripts.listing, hand, state, limit, after)

    def counts_by_state(self) -> dict[str, int]:
        return self._run(scripts.counts_by_state)

    def counts_visible(self, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]:
        return self._run(scripts.counts_visible, visible)

    def count_stale(self) -> int:
        return self._run(scripts.count_stale)

    def reconcile(
        self,
        hand: str,
        hand_rows: dict[str, TaskInfo],
        now: float,
        synced_since: float | None = None,
        quota: int | None = None,
    ) -> Plan:
        """One reconciliation pass for `hand`, planned and applied in one transaction."""
        return self._run(scripts.reconcile, hand, hand_rows, now, synced_since, quota, rules=self._rules)
