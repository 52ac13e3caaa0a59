"""The Mind's task snapshots in SQLite (the `task_snapshots` table of mind.db).

Every read-modify-write happens under one lock with the pure rules of `mind/core/snapshots.py` in between, so a
push, a query reply and a reconciliation pass racing each other still apply in version order.
Synchronous: the asyncio shell calls it through one worker thread. Raw arguments are never stored:
`info` is a `TaskInfo`, which carries digests only.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import msgpack

from mind.core.snapshots import Plan, Snapshot, apply_report, from_report, reconcile, within_quota
from protocol.messages import TaskInfo
from protocol.states import TASK_TERMINAL, TaskState

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

COLS = (
    "task_id, hand, tool, args_digest, binding_digest, state, stale, created_at, last_synced_at, "
    "version, info, cancel_pending, start_pending, reason, owner"
)
NON_TERMINAL = tuple(s.value for s in TaskState if s not in TASK_TERMINAL)


def _row(r: tuple) -> Snapshot:
    info = TaskInfo.model_validate(msgpack.unpackb(r[10], raw=False)) if r[10] is not None else None
    return Snapshot(
        task_id=r[0],
        hand=r[1],
        tool=r[2],
        args_digest=r[3],
        binding_digest=r[4],
        state=TaskState(r[5]),
        stale=bool(r[6]),
        created_at=r[7],
        last_synced_at=r[8],
        version=r[9],
        info=info,
        cancel_pending=r[11],
        start_pending=bool(r[12]),
        reason=r[13],
        owner=r[14],
    )


def _values(s: Snapshot) -> tuple:
    info = msgpack.packb(s.info.model_dump(mode="python"), use_bin_type=True) if s.info is not None else None
    return (
        s.task_id,
        s.hand,
        s.tool,
        s.args_digest,
        s.binding_digest,
        s.state.value,
        int(s.stale),
        s.created_at,
        s.last_synced_at,
        s.version,
        info,
        s.cancel_pending,
        int(s.start_pending),
        s.reason,
        s.owner,
    )


class SnapshotStore:
    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- plumbing ---

    def _get(self, task_id: str) -> Snapshot | None:
        r = self._db.execute(f"SELECT {COLS} FROM task_snapshots WHERE task_id=?", (task_id,)).fetchone()
        return _row(r) if r else None

    def _put_many(self, snaps: Iterable[Snapshot]) -> None:
        self._db.executemany(
            f"INSERT OR REPLACE INTO task_snapshots ({COLS}) VALUES ({', '.join('?' * 15)})",
            [_values(s) for s in snaps],
        )

    def _tx(self):
        store = self

        class _Tx:
            def __enter__(self):
                store._lock.acquire()
                store._db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *_):
                try:
                    store._db.execute("ROLLBACK" if exc_type else "COMMIT")
                finally:
                    store._lock.release()

        return _Tx()

    # --- operations ---

    def get(self, task_id: str) -> Snapshot | None:
        with self._lock:
            return self._get(task_id)

    def insert_new(self, snap: Snapshot) -> Snapshot | None:
        """Insert if no snapshot has this id; else return the existing one (nothing written)."""
        with self._tx():
            existing = self._get(snap.task_id)
            if existing is not None:
                return existing
            self._put_many([snap])
            return None

    def delete(self, task_id: str) -> None:
        with self._tx():
            self._db.execute("DELETE FROM task_snapshots WHERE task_id=?", (task_id,))

    def remove(self, task_id: str, hand: str) -> Snapshot | None:
        """Delete the snapshot of a task its Hand has just removed (`mind task rm`), and return it;
        None (nothing deleted) unless it is still `hand`'s and no start of its id is in flight: a
        start that came in meanwhile owns the id now."""
        with self._tx():
            snap = self._get(task_id)
            if snap is None or snap.hand != hand or snap.start_pending:
                return None
            self._db.execute("DELETE FROM task_snapshots WHERE task_id=?", (task_id,))
            return snap

    def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        """Apply a Hand's report. Returns (snapshot now held, what happened)."""
        with self._tx():
            snap = self._get(info.task_id)
            if snap is None:
                if not adopt:
                    return None, "unknown"
                new = from_report(hand, info, now)
                self._put_many([new])
                return new, "adopted"
            if snap.hand != hand:
                return snap, "foreign"
            updated = apply_report(snap, info, now)
            if updated is None:
                return snap, "unchanged"
            self._put_many([updated])
            return updated, "updated"

    def retry_start(self, snap: Snapshot) -> Snapshot | None:
        """Write `snap` (a start asked of the Hand again) if the row is still one the Hand never
        reported and no start is in flight; None if it changed meanwhile (nothing written)."""
        with self._tx():
            current = self._get(snap.task_id)
            if current is None or current.version > 0 or current.start_pending:
                return None
            self._put_many([snap])
            return snap

    def finish_start(self, task_id: str) -> Snapshot | None:
        """The start run ended without a report: keep the snapshot stale for reconciliation."""
        with self._tx():
            snap = self._get(task_id)
            if snap is None:
                return None
            if snap.start_pending:
                snap = replace(snap, start_pending=False)
                self._put_many([snap])
            return snap

    def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        with self._tx():
            snap = self._get(task_id)
            if snap is None or snap.terminal:
                return snap
            snap = replace(snap, cancel_pending=reason)
            self._put_many([snap])
            return snap

    def clear_cancel_pending(self, task_id: str) -> None:
        with self._tx():
            self._db.execute("UPDATE task_snapshots SET cancel_pending=NULL WHERE task_id=?", (task_id,))

    def mark_hand_stale(self, hand: str) -> int:
        with self._tx():
            cur = self._db.execute(
                f"UPDATE task_snapshots SET stale=1 WHERE hand=? AND stale=0 AND state IN ({','.join('?' * len(NON_TERMINAL))})",
                (hand, *NON_TERMINAL),
            )
            return cur.rowcount

    def mark_all_stale(self) -> int:
        """Mind restart: nothing it holds about an unfinished task can be trusted as current."""
        with self._tx():
            cur = self._db.execute(
                f"UPDATE task_snapshots SET stale=1 WHERE stale=0 AND state IN ({','.join('?' * len(NON_TERMINAL))})",
                NON_TERMINAL,
            )
            # A start in flight when the Mind stopped will never get its answer: reconciliation decides.
            self._db.execute("UPDATE task_snapshots SET start_pending=0 WHERE start_pending=1")
            return cur.rowcount

    def list(
        self,
        hand: str | None = None,
        state: TaskState | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[Snapshot]:
        """Newest first (`created_at`, then `task_id`); with `after`, only the rows that come after
        that (created_at, task_id) in this order: one page of a listing (keyset paging)."""
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
        with self._lock:
            rows = self._db.execute(sql, (*params, limit)).fetchall()
        return [_row(r) for r in rows]

    def counts_by_state(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM task_snapshots GROUP BY state").fetchall())

    def counts_visible(self, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]:
        """(tasks by state, stale snapshots) over the snapshots whose (hand, owner) `visible` allows:
        what `mind status` shows a scoped client, never the fleet's totals (issue 13)."""
        with self._lock:
            groups = self._db.execute(
                "SELECT hand, owner, state, stale, COUNT(*) FROM task_snapshots GROUP BY hand, owner, state, stale"
            ).fetchall()
        counts: dict[str, int] = {}
        stale = 0
        for hand, owner, state, is_stale, n in groups:
            if visible(hand, owner):
                counts[state] = counts.get(state, 0) + n
                stale += n if is_stale else 0
        return counts, stale

    def count_stale(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM task_snapshots WHERE stale=1").fetchone()[0]

    def reconcile(
        self,
        hand: str,
        hand_rows: dict[str, TaskInfo],
        now: float,
        synced_since: float | None = None,
        quota: int | None = None,
    ) -> Plan:
        """One reconciliation pass for `hand`, planned and applied in one transaction. With `quota`,
        the Hand's snapshots (its own and adopted ones) stay at most that many: reported ids beyond it
        are not adopted, so a hostile Hand cannot grow the Mind's database without bound."""
        with self._tx():
            mine = [
                _row(r) for r in self._db.execute(f"SELECT {COLS} FROM task_snapshots WHERE hand=?", (hand,)).fetchall()
            ]
            settled = [s for s in mine if not s.start_pending]
            in_flight = {s.task_id: hand for s in mine if s.start_pending}
            held_elsewhere: dict[str, str] = dict(in_flight)
            mine_ids = {s.task_id for s in mine}
            unknown_ids = [tid for tid in hand_rows if tid not in mine_ids]
            for i in range(0, len(unknown_ids), 500):
                chunk = unknown_ids[i : i + 500]
                for tid, owner in self._db.execute(
                    f"SELECT task_id, hand FROM task_snapshots WHERE task_id IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall():
                    held_elsewhere[tid] = owner
            hand_rows, over = within_quota(hand_rows, unknown_ids, held_elsewhere, len(mine), quota)
            plan = reconcile(hand, settled, hand_rows, held_elsewhere, now, synced_since)
            plan.over_quota = over
            self._put_many(plan.writes)
            for tid in plan.never_stored:
                self._db.execute("DELETE FROM task_snapshots WHERE task_id=?", (tid,))
            return plan
