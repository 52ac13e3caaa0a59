"""Task snapshots on the shared database: the scripts of `mind.store.scripts` over asyncpg.

Each operation is the script written once for both engines (the reads, the pure rules of
`mind.core.snapshots`, the writes), run on one pooled connection; its transaction is an asyncpg
transaction in which every snapshot read is locked (`SELECT ... FOR UPDATE`) and every write about a
Hand is fenced by this node's claim (`Fence.check`), so two nodes applying a report and a
reconciliation of the same Hand still apply them in version order, and a node that lost the Hand
writes nothing about it.

One thing only this engine does: the reconciliation of a Hand that reports no tasks, where the Mind
holds none for it either (the common welcome), is one statement shared by concurrent welcomes
(`_reconcile_empty`, `Coalescer`) before the script, which runs only when that statement finds a row.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import asyncpg

from mind.core.snapshots import Plan, Snapshot, reconcile
from mind.store import scripts
from mind.store.api import Calls, Results
from mind.store.coalesce import Coalescer
from mind.store.postgres.fence import Fence
from mind.store.postgres.pool import Db
from mind.store.rows import COLS, NON_TERMINAL, snapshot_of, snapshot_row
from mind.store.scripts import SnapshotRows
from protocol.messages import TaskInfo
from protocol.states import TaskState

P = ParamSpec("P")
T = TypeVar("T")

_INSERT = f"INSERT INTO task_snapshots ({COLS}) VALUES ({', '.join(f'${i}' for i in range(1, 16))})"
_PUT = (
    _INSERT
    + " ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{c.strip()} = EXCLUDED.{c.strip()}" for c in COLS.split(",")[1:])
)
_NON_TERMINAL = list(NON_TERMINAL)


class PgSnapshotRows:
    """The port of `mind.store.scripts.SnapshotRows` on one pooled connection; `locked` inside a
    transaction (its reads `FOR UPDATE`, its writes about a Hand fenced)."""

    def __init__(self, con: asyncpg.Connection, fence: Fence | None, locked: bool = False) -> None:
        self._con = con
        self._fence = fence
        self._lock = " FOR UPDATE" if locked else ""

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgSnapshotRows]:
        async with self._con.transaction():
            yield PgSnapshotRows(self._con, self._fence, locked=True)

    async def fence(self, hand: str) -> None:
        if self._fence is not None:
            await self._fence.check(self._con, hand)

    async def get(self, task_id: str) -> Snapshot | None:
        r = await self._con.fetchrow(f"SELECT {COLS} FROM task_snapshots WHERE task_id = $1{self._lock}", task_id)
        return snapshot_of(r) if r is not None else None

    async def of_hand(self, hand: str) -> list[Snapshot]:
        return [
            snapshot_of(r)
            for r in await self._con.fetch(f"SELECT {COLS} FROM task_snapshots WHERE hand = $1{self._lock}", hand)
        ]

    async def holders(self, task_ids: list[str]) -> dict[str, str]:
        rows = await self._con.fetch(
            "SELECT task_id, hand FROM task_snapshots WHERE task_id = ANY($1::text[])", task_ids
        )
        return {r[0]: r[1] for r in rows}

    async def insert(self, snap: Snapshot) -> bool:
        return (
            await self._con.fetchval(_INSERT + " ON CONFLICT DO NOTHING RETURNING 1", *snapshot_row(snap)) is not None
        )

    async def put(self, snaps: list[Snapshot]) -> None:
        if snaps:
            await self._con.executemany(_PUT, [snapshot_row(s) for s in snaps])

    async def delete(self, task_ids: list[str]) -> None:
        if task_ids:
            await self._con.execute("DELETE FROM task_snapshots WHERE task_id = ANY($1::text[])", task_ids)

    async def clear_cancel(self, task_id: str) -> None:
        await self._con.execute("UPDATE task_snapshots SET cancel_pending = NULL WHERE task_id = $1", task_id)

    async def mark_stale(self, hand: str | None) -> int:
        if hand is None:
            return _count(
                await self._con.execute(
                    "UPDATE task_snapshots SET stale = 1 WHERE stale = 0 AND state = ANY($1::text[])", _NON_TERMINAL
                )
            )
        return _count(
            await self._con.execute(
                "UPDATE task_snapshots SET stale = 1 WHERE hand = $1 AND stale = 0 AND state = ANY($2::text[])",
                hand,
                _NON_TERMINAL,
            )
        )

    async def clear_starts(self) -> None:
        await self._con.execute("UPDATE task_snapshots SET start_pending = 0 WHERE start_pending = 1")

    async def listing(
        self, hand: str | None, state: TaskState | None, limit: int, after: tuple[float, str] | None
    ) -> list[Snapshot]:
        where: list[str] = []
        params: list[Any] = []

        def p(value: Any) -> str:
            params.append(value)
            return f"${len(params)}"

        if after is not None:
            t = p(after[0])
            where.append(f'(created_at < {t} OR (created_at = {t} AND task_id COLLATE "C" > {p(after[1])}))')
        if hand is not None:
            where.append(f"hand = {p(hand)}")
        if state is not None:
            where.append(f"state = {p(state.value)}")
        sql = f"SELECT {COLS} FROM task_snapshots"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f' ORDER BY created_at DESC, task_id COLLATE "C" LIMIT {p(limit)}'
        return [snapshot_of(r) for r in await self._con.fetch(sql, *params)]

    async def counts_by_state(self) -> dict[str, int]:
        rows = await self._con.fetch("SELECT state, COUNT(*) FROM task_snapshots GROUP BY state")
        return {r[0]: int(r[1]) for r in rows}

    async def groups(self) -> list[tuple[str, str, str, bool, int]]:
        rows = await self._con.fetch(
            "SELECT hand, owner, state, stale, COUNT(*) FROM task_snapshots GROUP BY hand, owner, state, stale"
        )
        return [(r[0], r[1], r[2], bool(r[3]), int(r[4])) for r in rows]

    async def count_stale(self) -> int:
        return int(await self._con.fetchval("SELECT COUNT(*) FROM task_snapshots WHERE stale = 1"))


def _count(status: str) -> int:
    """Rows an UPDATE/DELETE changed, from its command tag (`UPDATE 3`)."""
    return int(status.rsplit(" ", 1)[-1])


class PgSnapshots:
    """The PostgreSQL engine's snapshot store: each method one script of `mind.store.scripts`."""

    def __init__(self, db: Db, fence: Fence | None = None) -> None:
        self._db = db
        self._fence = fence
        self._empty: Coalescer[tuple[str, int, bool], tuple[bool, bool]] = Coalescer(self._empty_of)

    async def _run(
        self,
        script: Callable[Concatenate[SnapshotRows, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        return await self._db.run(lambda con: script(PgSnapshotRows(con, self._fence), *args, **kwargs))

    async def get(self, task_id: str) -> Snapshot | None:
        return await self._run(scripts.get, task_id)

    async def insert_new(self, snap: Snapshot) -> Snapshot | None:
        return await self._run(scripts.insert_new, snap)

    async def delete(self, task_id: str) -> None:
        await self._run(scripts.delete, task_id)

    async def remove(self, task_id: str, hand: str) -> Snapshot | None:
        return await self._run(scripts.remove, task_id, hand)

    async def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        return await self._run(scripts.report, hand, info, now, adopt)

    async def retry_start(self, snap: Snapshot) -> Snapshot | None:
        return await self._run(scripts.retry_start, snap)

    async def finish_start(self, task_id: str) -> Snapshot | None:
        return await self._run(scripts.finish_start, task_id)

    async def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        return await self._run(scripts.set_cancel_pending, task_id, reason)

    async def clear_cancel_pending(self, task_id: str) -> None:
        await self._run(scripts.clear_cancel_pending, task_id)

    async def mark_hand_stale(self, hand: str) -> int:
        return await self._run(scripts.mark_hand_stale, hand)

    async def mark_all_stale(self) -> int:
        return await self._run(scripts.mark_all_stale)

    async def list(
        self,
        hand: str | None = None,
        state: TaskState | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[Snapshot]:
        return await self._run(scripts.listing, hand, state, limit, after)

    async def counts_by_state(self) -> dict[str, int]:
        return await self._run(scripts.counts_by_state)

    async def counts_visible(self, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]:
        return await self._run(scripts.counts_visible, visible)

    async def count_stale(self) -> int:
        return await self._run(scripts.count_stale)

    async def reconcile(
        self,
        hand: str,
        hand_rows: dict[str, TaskInfo],
        now: float,
        synced_since: float | None = None,
        quota: int | None = None,
    ) -> Plan:
        """`scripts.reconcile`, after `_reconcile_empty` for a Hand with no tasks."""
        if not hand_rows:
            plan = await self._reconcile_empty(hand, now, synced_since)
            if plan is not None:
                return plan
        return await self._run(scripts.reconcile, hand, hand_rows, now, synced_since, quota)

    async def _empty_of(self, items: Sequence[tuple[str, int, bool]]) -> Sequence[tuple[bool, bool]]:
        """For each (hand, claim, fenced): (still held by that claim, or unfenced; any row of the
        Hand's), the concurrent welcomes' checks in one statement (`Coalescer`)."""
        node = self._fence.node if self._fence is not None else ""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT NOT k.fenced OR h.label IS NOT NULL, t.hand IS NOT NULL "
                "FROM unnest($1::text[], $2::bigint[], $3::bool[]) WITH ORDINALITY AS k(hand, claim, fenced, i) "
                "LEFT JOIN (SELECT label, claim FROM hands WHERE label = ANY($1::text[]) AND node = $4 FOR SHARE) h "
                "ON h.label = k.hand AND h.claim = k.claim "
                "LEFT JOIN (SELECT DISTINCT hand FROM task_snapshots WHERE hand = ANY($1::text[])) t ON t.hand = k.hand "
                "ORDER BY k.i",
                [i[0] for i in items],
                [i[1] for i in items],
                [i[2] for i in items],
                node,
            )
        )
        return [(bool(r[0]), bool(r[1])) for r in rows]

    async def _reconcile_empty(self, hand: str, now: float, synced_since: float | None) -> Plan | None:
        """A Hand that reported no tasks, where the Mind holds none for it either: nothing to
        write, so one statement answers (the fence checked as `Fence.check` does, its row locked
        FOR SHARE for that statement) instead of a transaction of four round trips. None (the
        full transaction follows) when the Mind holds any row for the Hand."""
        fence = self._fence
        fenced = fence is not None and fence.active
        claim = fence.claim(hand) if fence is not None else -1
        held, any_rows = await self._empty((hand, claim, fenced))
        if not held:
            assert fence is not None
            fence.fenced(hand, claim)  # raises Fenced
        if any_rows:
            return None
        plan = reconcile(hand, [], {}, {}, now, synced_since)
        return None if plan.writes or plan.never_stored else plan

    async def batch(self, calls: Calls) -> Results:
        """`scripts.batch`, each call an await of this store's method."""
        return await scripts.batch(lambda name, args: getattr(self, name)(*args), calls)

    async def close(self) -> None:
        """The empty reconciliations in flight are cancelled (their callers too)."""
        await self._empty.aclose()
