"""Task snapshots: what the Mind last heard about each background task, and how reports and the
reconciliation pass realign it (DESIGN §3, §7, §8). Pure: no SQLite, no clock, no sockets.

The Hand's task database is the authority. A snapshot is a redacted copy (digests, never raw
arguments) plus two facts about the copy itself: `stale` (it may be out of date: the Hand is not
connected, or has not been asked since it reconnected) and `last_synced_at`.

Rules:
- A report is applied only if its `version` is newer than the one held (or equal, to refresh a stale
  copy), so pushes, query replies and inventory pages may arrive in any order.
- A terminal snapshot is never stale: nothing can change it any more.
- Reconciliation: every snapshot the Hand reports is realigned and fresh; a non-terminal snapshot the
  Hand does not know is `lost` ("unknown to hand") when the Hand had reported it before (its row is
  gone, and nobody can say more), and deleted when the Hand never had (a start whose answer never
  came and that never reached the Hand's database: nothing ran, and the id is free for a retry); a terminal one the Hand no longer has (purged by retention) stays as it is;
  tasks the Mind did not know are adopted; cancels recorded while the Hand was offline are
  delivered. Applying the same inventory twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from protocol.messages import TaskInfo, TaskView
from protocol.states import TASK_TERMINAL, TaskState

UNKNOWN_TO_HAND = "unknown to hand"


@dataclass(frozen=True)
class Snapshot:
    task_id: str
    hand: str
    tool: str
    args_digest: str
    binding_digest: str
    state: TaskState
    stale: bool
    created_at: float
    last_synced_at: float | None = None
    version: int = 0
    """The Hand's row version last applied; 0 while the Hand has not reported the task yet."""
    info: TaskInfo | None = None
    cancel_pending: str | None = None
    """The reason of a cancel recorded while the Hand was offline, until it is delivered."""
    start_pending: bool = False
    """The start run is in flight: the Hand may not have committed the row yet."""
    reason: str = ""
    """Why the Mind itself decided a state (only `lost`: unknown to hand)."""
    owner: str = ""
    """The client that started it ("" for a task adopted from a Hand): scopes decide who may see it."""

    @property
    def terminal(self) -> bool:
        return self.state in TASK_TERMINAL

    def view(self) -> TaskView:
        return TaskView(
            hand=self.hand,
            task=self.info,
            task_id=self.task_id,
            state=self.state,
            stale=self.stale,
            last_synced_at=self.last_synced_at,
            cancel_pending=self.cancel_pending is not None,
            created_at=self.created_at,
            reason=self.reason,
        )


def from_report(hand: str, info: TaskInfo, now: float) -> Snapshot:
    """Adopt a task the Mind did not know."""
    return Snapshot(
        task_id=info.task_id,
        hand=hand,
        tool=info.tool,
        args_digest=info.args_digest,
        binding_digest=info.binding_digest,
        state=info.state,
        stale=False,
        created_at=info.created_at,
        last_synced_at=now,
        version=info.version,
        info=info,
    )


def apply_report(snap: Snapshot, info: TaskInfo, now: float) -> Snapshot | None:
    """The snapshot after the Hand reported `info`, or None if the report changes nothing."""
    if info.version < snap.version:
        return None  # older than what we hold: arrived out of order
    if info.version == snap.version and not snap.stale and snap.info == info:
        return None
    if snap.terminal:
        # Terminals never change. A Hand's terminal row never does; a terminal the Mind decided
        # itself (`lost`, unknown to hand) keeps the version it had, which may be > 0.
        return None
    cancel_pending = None if info.state in TASK_TERMINAL else snap.cancel_pending
    return replace(
        snap,
        state=info.state,
        stale=False,
        last_synced_at=now,
        version=info.version,
        info=info,
        cancel_pending=cancel_pending,
        start_pending=False,
        tool=info.tool,
    )


def mark_stale(snap: Snapshot) -> Snapshot | None:
    if snap.terminal or snap.stale:
        return None
    return replace(snap, stale=True)


@dataclass
class Plan:
    updated: list[Snapshot]
    adopted: list[Snapshot]
    lost: list[Snapshot]
    cancels: list[tuple[str, str]]
    """(task_id, reason) of cancels to deliver now."""
    foreign: list[str]
    """Task ids the Hand reported that belong to another Hand in the Mind's records."""
    unchanged: int
    over_quota: int = 0
    never_stored: list[str] = field(default_factory=list)
    """Starts the Hand never reported and does not have: their snapshots are deleted."""
    """Task ids the Hand reported that the Mind did not adopt: the Hand's quota was full (issue 13)."""

    @property
    def writes(self) -> list[Snapshot]:
        return self.updated + self.adopted + self.lost


def within_quota(
    rows: dict[str, Any], unknown_ids: list[str], held_elsewhere: dict[str, str], mine: int, quota: int | None
) -> tuple[dict[str, Any], int]:
    """A Hand's inventory trimmed to its quota of stored snapshots: the ids new to the Mind (not
    held under another Hand) beyond the room left after the `mine` it has already are dropped, the
    highest ids first. Returns the rows kept and how many were over (both engines, one rule)."""
    if quota is None:
        return rows, 0
    new_ids = sorted(tid for tid in unknown_ids if tid not in held_elsewhere)
    room = max(0, quota - mine)
    if len(new_ids) <= room:
        return rows, 0
    kept = dict(rows)
    for tid in new_ids[room:]:
        del kept[tid]
    return kept, len(new_ids) - room


def reconcile(
    hand: str,
    snapshots: list[Snapshot],
    hand_rows: dict[str, TaskInfo],
    held_elsewhere: dict[str, str],
    now: float,
    synced_since: float | None = None,
) -> Plan:
    """Realign `snapshots` (this Hand's, excluding starts still in flight) with the Hand's rows.

    `held_elsewhere`: task id -> hand, for ids among `hand_rows` that the Mind holds but that are not
    in `snapshots`: another Hand's (foreign: never adopted, reported) or this Hand's start still in
    flight (left to the start run to settle).

    `synced_since`: when the inventory was first asked for. A snapshot the Hand reported since then
    is newer than the inventory, whose pages are read one by one (a task started during the pass
    can be missing from a page read before it existed): it is never declared `lost`.
    """
    plan = Plan([], [], [], [], [], 0)
    seen: set[str] = set()
    for snap in snapshots:
        seen.add(snap.task_id)
        row = hand_rows.get(snap.task_id)
        if row is None:
            reported_since = (
                synced_since is not None and snap.last_synced_at is not None and snap.last_synced_at >= synced_since
            )
            if snap.terminal or reported_since:
                plan.unchanged += 1
            elif snap.version == 0:
                # Never reported: the start never reached the Hand's database (the answer was
                # lost, the Hand died before its commit). The authority says the task does not
                # exist, so nothing was lost: the snapshot goes, and the id is free for a retry.
                plan.never_stored.append(snap.task_id)
            else:
                plan.lost.append(
                    replace(
                        snap,
                        state=TaskState.LOST,
                        stale=False,
                        last_synced_at=now,
                        reason=UNKNOWN_TO_HAND,
                        cancel_pending=None,
                    )
                )
            continue
        new = apply_report(snap, row, now)
        current = new or snap
        if new is not None:
            plan.updated.append(new)
        else:
            plan.unchanged += 1
        if current.cancel_pending is not None and row.state not in TASK_TERMINAL:
            plan.cancels.append((snap.task_id, current.cancel_pending))
    for task_id, row in hand_rows.items():
        if task_id in seen:
            continue
        owner = held_elsewhere.get(task_id)
        if owner is not None:
            if owner != hand:
                plan.foreign.append(task_id)
            continue
        plan.adopted.append(from_report(hand, row, now))
    return plan
