"""The Mind's `task_snapshots` table, in memory: `mind.store.snapshots.SnapshotStore`'s operations over a
dict, with the REAL pure rules of `mind.core.snapshots` (`apply_report`, `from_report`, `mark_stale`,
`reconcile`) in between, exactly where the store calls them.

It survives Mind crashes (it is the disk). `CheckedSnapshots` runs every operation against this
model AND the real SQLite store (in memory) and fails on the first difference: the model is then
known to be the store, not a guess about it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from mind.core import snapshots as rules
from mind.core.snapshots import Plan, Snapshot
from protocol.messages import TaskInfo


class SnapshotTable:
    def __init__(
        self,
        reconcile: Callable[..., Plan] = rules.reconcile,
        apply_report: Callable[..., Snapshot | None] = rules.apply_report,
    ) -> None:
        self.rows: dict[str, Snapshot] = {}
        self.dirty: dict[str, None] = {}
        """Task ids written since the checker last looked (it checks only those)."""
        self._reconcile = reconcile
        self._apply_report = apply_report

    def _put(self, snap: Snapshot) -> None:
        self.rows[snap.task_id] = snap
        self.dirty[snap.task_id] = None

    def get(self, task_id: str) -> Snapshot | None:
        return self.rows.get(task_id)

    def insert_new(self, snap: Snapshot) -> Snapshot | None:
        existing = self.rows.get(snap.task_id)
        if existing is not None:
            return existing
        self._put(snap)
        return None

    def delete(self, task_id: str) -> None:
        self.rows.pop(task_id, None)
        self.dirty[task_id] = None

    def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        snap = self.rows.get(info.task_id)
        if snap is None:
            if not adopt:
                return None, "unknown"
            new = rules.from_report(hand, info, now)
            self._put(new)
            return new, "adopted"
        if snap.hand != hand:
            return snap, "foreign"
        new = self._apply_report(snap, info, now)
        if new is None:
            return snap, "unchanged"
        self._put(new)
        return new, "updated"

    def retry_start(self, snap: Snapshot) -> Snapshot | None:
        current = self.rows.get(snap.task_id)
        if current is None or current.version > 0 or current.start_pending:
            return None
        self._put(snap)
        return snap

    def finish_start(self, task_id: str) -> Snapshot | None:
        snap = self.rows.get(task_id)
        if snap is None:
            return None
        if snap.start_pending:
            snap = replace(snap, start_pending=False)
            self._put(snap)
        return snap

    def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        snap = self.rows.get(task_id)
        if snap is None or snap.terminal:
            return snap
        snap = replace(snap, cancel_pending=reason)
        self._put(snap)
        return snap

    def clear_cancel_pending(self, task_id: str) -> None:
        snap = self.rows.get(task_id)
        if snap is not None:
            self._put(replace(snap, cancel_pending=None))

    def mark_hand_stale(self, hand: str) -> int:
        n = 0
        for snap in list(self.rows.values()):
            if snap.hand == hand:
                new = rules.mark_stale(snap)
                if new is not None:
                    self._put(new)
                    n += 1
        return n

    def mark_all_stale(self) -> int:
        n = 0
        for snap in list(self.rows.values()):
            new = rules.mark_stale(snap)
            if new is not None:
                snap = new
                n += 1
            if snap.start_pending:
                snap = replace(snap, start_pending=False)
            if new is not None or snap is not self.rows[snap.task_id]:
                self._put(snap)
        return n

    def reconcile(
        self, hand: str, hand_rows: dict[str, TaskInfo], now: float, synced_since: float | None = None
    ) -> Plan:
        mine = [s for s in self.rows.values() if s.hand == hand]
        settled = [s for s in mine if not s.start_pending]
        held_elsewhere = {s.task_id: hand for s in mine if s.start_pending}
        mine_ids = {s.task_id for s in mine}
        for tid in hand_rows:
            if tid not in mine_ids and tid in self.rows:
                held_elsewhere[tid] = self.rows[tid].hand
        plan = self._reconcile(hand, settled, hand_rows, held_elsewhere, now, synced_since)
        for snap in plan.writes:
            self._put(snap)
        for tid in plan.never_stored:
            self.delete(tid)
        return plan

    def all(self) -> list[Snapshot]:
        return list(self.rows.values())


class ModelMismatch(AssertionError):
    pass


def _norm(value: Any) -> Any:
    """Plans list snapshots in table order, which SQLite does not promise: compare them sorted."""
    if isinstance(value, Plan):
        key = lambda s: s.task_id
        return (
            sorted(value.updated, key=key),
            sorted(value.adopted, key=key),
            sorted(value.lost, key=key),
            sorted(value.cancels),
            sorted(value.foreign),
            value.unchanged,
        )
    return value


class CheckedSnapshots:
    """The model and the real `SnapshotStore` side by side; every answer must be the same."""

    def __init__(self, model: SnapshotTable) -> None:
        from mind.store.snapshots import SnapshotStore

        self.model = model
        self.real = SnapshotStore(Path(":memory:"))

    def __getattr__(self, name: str) -> Any:
        ours = getattr(self.model, name)
        if name in ("rows", "all", "dirty"):
            return ours
        theirs = getattr(self.real, name)

        def both(*args: Any, **kwargs: Any) -> Any:
            a = ours(*args, **kwargs)
            b = theirs(*args, **kwargs)
            if _norm(a) != _norm(b):
                raise ModelMismatch(f"{name}{args}: model {a!r} != store {b!r}")
            real_rows = {s.task_id: s for s in self.real.list(limit=100_000)}
            if real_rows != self.model.rows:
                raise ModelMismatch(f"after {name}{args}: model {self.model.rows!r} != store {real_rows!r}")
            return a

        return both
