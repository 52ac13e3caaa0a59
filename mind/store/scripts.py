"""The stores' transaction scripts, written once for both engines (DESIGN §16).

A script is the sequence one store operation performs: the reads, the pure rule of
`mind.core.snapshots` in between, the writes. Each is written here once, over a small port that
each engine implements with its own SQL:

- `SnapshotRows`: the statements on `task_snapshots`, and `transaction()`, which gives the same
  port inside one transaction whose reads lock the rows they return. A script that reads, decides
  and writes does all of it inside one `async with rows.transaction() as tx`; a script of one
  statement runs without one (a single statement is atomic by itself on both engines). The SQLite
  port (`mind.store.snapshots`) runs on the database thread under the store's lock, its
  transaction `BEGIN IMMEDIATE`; the PostgreSQL one (`mind.store.postgres.snapshots`) on one
  pooled connection, its transaction an asyncpg transaction with the rows read `FOR UPDATE` and a
  write about a Hand fenced by this node's claim (`tx.fence(hand)`, nothing on SQLite).
- `SnapshotRules`: the pure rules a script calls, the module `mind.core.snapshots` itself unless
  the caller passes others (the simulation's tests inject broken rules through it).
- `EndingRows`: the `run_endings` table and the life record, each call one transaction (no
  ending script decides between two statements of one transaction). `EndingBook` holds the
  scripts and what they count between calls (writes since the last prune, the window).

The ports are `async`, so one script serves both engines: on PostgreSQL each await is a round
trip; the SQLite ports never suspend (their bodies are plain `sqlite3` calls), so `run_now` takes a
script to its end in one step, on the thread that called it, with no event loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from mind.core import snapshots as core_rules
from mind.core.snapshots import Plan, Snapshot
from mind.store.api import Calls, Results
from mind.store.rows import Ending, endings_of
from protocol import limits
from protocol.messages import TaskInfo
from protocol.states import TaskState

T = TypeVar("T")


def run_now(script: Coroutine[Any, Any, T]) -> T:
    """Take a script over a port that never suspends (SQLite's) to its end, here and now."""
    try:
        script.send(None)
    except StopIteration as done:
        return done.value
    script.close()
    raise RuntimeError("a store script waited on a port that must answer at once")


# --- task snapshots ---


class SnapshotRows(Protocol):
    """`task_snapshots` as a script sees it (see the module): one engine's statements."""

    def transaction(self) -> AbstractAsyncContextManager[SnapshotRows]:
        """This port inside one transaction: committed when the block ends, rolled back if it
        raises; the snapshots it reads are locked until then."""
        ...

    async def fence(self, hand: str) -> None:
        """Inside a transaction, before a write about `hand`: raises `Fenced` if another node
        claimed it since (and keeps it ours until commit). Nothing on an engine without claims."""
        ...

    async def get(self, task_id: str) -> Snapshot | None: ...
    async def of_hand(self, hand: str) -> list[Snapshot]: ...
    async def holders(self, task_ids: list[str]) -> dict[str, str]:
        """task id -> its Hand, for the ids held."""
        ...

    async def insert(self, snap: Snapshot) -> bool:
        """Insert unless the id is held; whether it was inserted."""
        ...

    async def put(self, snaps: list[Snapshot]) -> None:
        """Insert or replace each."""
        ...

    async def delete(self, task_ids: list[str]) -> None: ...
    async def clear_cancel(self, task_id: str) -> None: ...
    async def mark_stale(self, hand: str | None) -> int:
        """Mark `hand`'s (every Hand's for None) non-terminal snapshots stale; how many changed."""
        ...

    async def clear_starts(self) -> None:
        """Every start in flight forgotten (`start_pending` off)."""
        ...

    async def listing(
        self, hand: str | None, state: TaskState | None, limit: int, after: tuple[float, str] | None
    ) -> list[Snapshot]:
        """Newest first (`created_at`, then `task_id` bytewise); with `after`, only the rows after
        that (created_at, task_id) in this order: one page of a listing (keyset paging)."""
        ...

    async def counts_by_state(self) -> dict[str, int]: ...
    async def groups(self) -> list[tuple[str, str, str, bool, int]]:
        """(hand, owner, state, stale, count) of every group of snapshots."""
        ...

    async def count_stale(self) -> int: ...


class SnapshotRules(Protocol):
    """The rules of `mind.core.snapshots` that the scripts call (that module satisfies it)."""

    def from_report(self, hand: str, info: TaskInfo, now: float) -> Snapshot: ...
    def apply_report(self, snap: Snapshot, info: TaskInfo, now: float) -> Snapshot | None: ...
    def within_quota(
        self, rows: dict[str, Any], unknown_ids: list[str], held_elsewhere: dict[str, str], mine: int, quota: int | None
    ) -> tuple[dict[str, Any], int]: ...
    def reconcile(
        self,
        hand: str,
        snapshots: list[Snapshot],
        hand_rows: dict[str, TaskInfo],
        held_elsewhere: dict[str, str],
        now: float,
        synced_since: float | None = None,
    ) -> Plan: ...


async def get(rows: SnapshotRows, task_id: str) -> Snapshot | None:
    return await rows.get(task_id)


async def insert_new(rows: SnapshotRows, snap: Snapshot) -> Snapshot | None:
    """Insert if no snapshot has this id; else return the existing one (nothing written)."""
    async with rows.transaction() as tx:
        if await tx.insert(snap):
            return None
        return await tx.get(snap.task_id)


async def delete(rows: SnapshotRows, task_id: str) -> None:
    await rows.delete([task_id])


async def remove(rows: SnapshotRows, task_id: str, hand: str) -> Snapshot | None:
    """Delete the snapshot of a task its Hand has just removed (`mind task rm`), and return it;
    None (nothing deleted) unless it is still `hand`'s and no start of its id is in flight: a
    start that came in meanwhile owns the id now. A write about the Hand: fenced."""
    async with rows.transaction() as tx:
        await tx.fence(hand)
        snap = await tx.get(task_id)
        if snap is None or snap.hand != hand or snap.start_pending:
            return None
        await tx.delete([task_id])
        return snap


async def report(
    rows: SnapshotRows, hand: str, info: TaskInfo, now: float, adopt: bool = True, rules: SnapshotRules = core_rules
) -> tuple[Snapshot | None, str]:
    """Apply a Hand's report. Returns (snapshot now held, what happened). Fenced."""
    async with rows.transaction() as tx:
        await tx.fence(hand)
        snap = await tx.get(info.task_id)
        if snap is None:
            if not adopt:
                return None, "unknown"
            new = rules.from_report(hand, info, now)
            await tx.put([new])
            return new, "adopted"
        if snap.hand != hand:
            return snap, "foreign"
        updated = rules.apply_report(snap, info, now)
        if updated is None:
            return snap, "unchanged"
        await tx.put([updated])
        return updated, "updated"


async def retry_start(rows: SnapshotRows, snap: Snapshot) -> Snapshot | None:
    """Write `snap` (a start asked of the Hand again) if the row is still one the Hand never
    reported and no start is in flight; None if it changed meanwhile (nothing written)."""
    async with rows.transaction() as tx:
        current = await tx.get(snap.task_id)
        if current is None or current.version > 0 or current.start_pending:
            return None
        await tx.put([snap])
        return snap


async def finish_start(rows: SnapshotRows, task_id: str) -> Snapshot | None:
    """The start run ended without a report: keep the snapshot stale for reconciliation."""
    async with rows.transaction() as tx:
        snap = await tx.get(task_id)
        if snap is None:
            return None
        if snap.start_pending:
            snap = replace(snap, start_pending=False)
            await tx.put([snap])
        return snap


async def set_cancel_pending(rows: SnapshotRows, task_id: str, reason: str) -> Snapshot | None:
    async with rows.transaction() as tx:
        snap = await tx.get(task_id)
        if snap is None or snap.terminal:
            return snap
        snap = replace(snap, cancel_pending=reason)
        await tx.put([snap])
        return snap


async def clear_cancel_pending(rows: SnapshotRows, task_id: str) -> None:
    await rows.clear_cancel(task_id)


async def mark_hand_stale(rows: SnapshotRows, hand: str) -> int:
    return await rows.mark_stale(hand)


async def mark_all_stale(rows: SnapshotRows) -> int:
    """A Mind (a node) starts: nothing it is told about an unfinished task can be trusted as
    current. On a shared database this marks other nodes' Hands' snapshots stale too: stale means
    "may be out of date", which is never wrong; their next report or reconciliation freshens them."""
    async with rows.transaction() as tx:
        stale = await tx.mark_stale(None)
        # A start in flight when the Mind stopped will never get its answer: reconciliation decides.
        await tx.clear_starts()
        return stale


async def listing(
    rows: SnapshotRows,
    hand: str | None = None,
    state: TaskState | None = None,
    limit: int = 1000,
    after: tuple[float, str] | None = None,
) -> list[Snapshot]:
    return await rows.listing(hand, state, limit, after)


async def counts_by_state(rows: SnapshotRows) -> dict[str, int]:
    return await rows.counts_by_state()


async def counts_visible(rows: SnapshotRows, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]:
    """(tasks by state, stale snapshots) over the snapshots whose (hand, owner) `visible` allows:
    what `mind status` shows a scoped client, never the fleet's totals (issue 13)."""
    counts: dict[str, int] = {}
    stale = 0
    for hand, owner, state, is_stale, n in await rows.groups():
        if visible(hand, owner):
            counts[state] = counts.get(state, 0) + n
            stale += n if is_stale else 0
    return counts, stale


async def count_stale(rows: SnapshotRows) -> int:
    return await rows.count_stale()


async def reconcile(
    rows: SnapshotRows,
    hand: str,
    hand_rows: dict[str, TaskInfo],
    now: float,
    synced_since: float | None = None,
    quota: int | None = None,
    rules: SnapshotRules = core_rules,
) -> Plan:
    """One reconciliation pass for `hand`, planned and applied in one transaction with the Hand's
    rows locked (fenced). With `quota`, the Hand's snapshots (its own and adopted ones) stay at
    most that many: reported ids beyond it are not adopted, so a hostile Hand cannot grow the
    Mind's database without bound."""
    async with rows.transaction() as tx:
        await tx.fence(hand)
        mine = await tx.of_hand(hand)
        settled = [s for s in mine if not s.start_pending]
        held_elsewhere: dict[str, str] = {s.task_id: hand for s in mine if s.start_pending}
        mine_ids = {s.task_id for s in mine}
        unknown_ids = [tid for tid in hand_rows if tid not in mine_ids]
        if unknown_ids:
            held_elsewhere.update(await tx.holders(unknown_ids))
        hand_rows, over = rules.within_quota(hand_rows, unknown_ids, held_elsewhere, len(mine), quota)
        plan = rules.reconcile(hand, settled, hand_rows, held_elsewhere, now, synced_since)
        plan.over_quota = over
        await tx.put(plan.writes)
        await tx.delete(plan.never_stored)
        return plan


async def batch(call: Callable[[str, tuple[Any, ...]], Awaitable[Any]], calls: Calls) -> Results:
    """`Snapshots.batch`: each call `(method name, args, hand)` in order, by `call`, each followed by
    `mark_hand_stale(hand)` when `hand` is given; `(True, value)` or `(False, exception)` each."""
    out: Results = []
    for name, args, hand in calls:
        try:
            try:
                out.append((True, await call(name, args)))
            finally:
                if hand is not None:
                    await call("mark_hand_stale", (hand,))
        except Exception as exc:  # this call's waiter hears it; the batch goes on
            out.append((False, exc))
    return out


# --- endings ---

MAX_ROWS = 100_000
"""Endings kept at most (the newest): 10,000 runs lost at once, ten times over."""
PRUNE_EVERY = 1000
"""Endings written between two prunes."""


class EndingRows(Protocol):
    """`run_endings` and the life record as the ending scripts see them: each call one transaction."""

    async def write(self, endings: list[Ending]) -> list[tuple[str, int]]:
        """Insert or replace each ending's row, in one transaction; the (Hand, claim) of each one
        refused because another node claimed its Hand since (never on an engine without claims)."""
        ...

    async def prune(self, horizon: float, keep: int) -> None:
        """Delete the endings older than `horizon`, then all but the newest `keep`."""
        ...

    async def read(self) -> Iterable[Sequence[Any]]:
        """Every row (`ENDING_COLS`), oldest first."""
        ...

    async def start_life(self) -> tuple[bool, int] | None:
        """Mark this Mind's life running with no runs left; the record before (running, live runs)."""
        ...

    async def end_life(self, live_runs: int) -> None: ...


class EndingBook:
    """The endings' scripts over one engine's `EndingRows`, with what they count between calls.

    Bounded: an ending matters only while some Hand may still present its run, that is up to the
    longest run timeout plus the resume window; older rows are deleted at start (`load`) and every
    `every` writes, and at most `keep` newest are kept."""

    def __init__(self, rows: EndingRows, every: int = PRUNE_EVERY, keep: int = MAX_ROWS) -> None:
        self.rows = rows
        self.every = every
        self.keep = keep
        self.writes = 0
        self.window = 0.0

    async def put_many(self, endings: list[Ending]) -> list[tuple[str, int]]:
        """Write `endings` in one transaction (none of them if it raises); prune when due. The
        (Hand, claim) of each one refused by the fence."""
        if not endings:
            return []
        refused = await self.rows.write(endings)
        before, self.writes = self.writes, self.writes + len(endings)
        if before // self.every != self.writes // self.every:
            await self.prune(self.window, endings[-1].ended_at)
        return refused

    async def prune(self, window: float, now: float) -> None:
        """Delete the endings no Hand can present any more (older than the longest run timeout
        plus `window`), and all but the newest `keep`."""
        await self.rows.prune(now - limits.RUN_TIMEOUT_MAX_MS / 1000 - window, self.keep)

    async def load(self, window: float, now: float | None = None) -> list[Ending]:
        """The endings that still matter, oldest first, after `prune`; `window` is kept for the
        prunes that follow writes."""
        now = time.time() if now is None else now
        self.window = window
        await self.prune(window, now)
        return endings_of(await self.rows.read())

    async def begin_life(self) -> bool:
        """This Mind starts. True if its previous life may have left runs going on Hands: it
        crashed (never said it stopped), or it stopped with runs resumable. Only then may a Hand
        still present a run this Mind does not know, and an attach to one is told to wait."""
        before = await self.rows.start_life()
        return before is not None and (before[0] or before[1] > 0)

    async def end_life(self, live_runs: int) -> None:
        """This Mind stops, leaving `live_runs` runs resumable on their Hands."""
        await self.rows.end_life(live_runs)
