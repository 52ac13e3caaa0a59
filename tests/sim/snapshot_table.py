"""The Mind's `task_snapshots` table: the REAL `mind.store.snapshots.SnapshotStore` (SQLite, in
memory), its REAL transaction scripts (`mind.store.scripts`) and the REAL pure rules of
`mind.core.snapshots` in between, unless a test swaps in broken ones (the store's `rules`).

One per World; it survives Mind crashes (it is the disk). `SnapshotTable` is a thin adapter: it
passes each operation to the store and keeps, from the store's answers, what the checker and the
clients read besides: `rows` (task id -> snapshot) and `dirty` (the ids whose row changed since the
checker last looked). An answer names the row now held (a report's, an insert's, a start's), or
what a reconciliation wrote and deleted, or how many rows went stale; where it does not say which
(a cleared cancel, rows gone stale, a Mind's restart), the adapter reads the rows back from the
store. With `checked=True` (`Rules(checked_store=True)`) it also compares `rows` with a full
listing of the store after every operation: an answer that is not what the store holds shows there
(`mismatch`, which the checker fails on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mind.core import snapshots as core_rules
from mind.core.snapshots import Plan, Snapshot
from mind.store.scripts import SnapshotRules
from mind.store.snapshots import SnapshotStore
from protocol.messages import TaskInfo

EVERY = 1_000_000
"""A listing's limit that no simulated table reaches."""


@dataclass(frozen=True)
class SwappedRules:
    """`mind.core.snapshots` with `reconcile` and `apply_report` swapped: a test's broken rules."""

    reconcile: Callable[..., Plan]
    apply_report: Callable[..., Snapshot | None]
    from_report = staticmethod(core_rules.from_report)
    within_quota = staticmethod(core_rules.within_quota)


def store_rules(reconcile: Callable[..., Plan], apply_report: Callable[..., Snapshot | None]) -> SnapshotRules:
    """The rules for the store: `mind.core.snapshots` itself unless a test swapped one."""
    if reconcile is core_rules.reconcile and apply_report is core_rules.apply_report:
        return core_rules
    return SwappedRules(reconcile, apply_report)


class SnapshotTable:
    """The real `SnapshotStore`'s operations (those the simulated Mind calls), and `rows`, `dirty`
    and `all()` kept from its answers."""

    def __init__(self, rules: SnapshotRules = core_rules, checked: bool = False) -> None:
        self.real = SnapshotStore(Path(":memory:"), rules)
        self.rows: dict[str, Snapshot] = {}
        """The store's rows (task id -> snapshot), as its answers and read-backs showed them."""
        self.dirty: dict[str, None] = {}
        """Task ids whose row changed since the checker last looked (it checks only those)."""
        self.checked = checked
        self.mismatch: str | None = None
        """With `checked`: the first difference between `rows` and the store (the checker fails on
        it after the event; raised here, it would reach the simulated Mind as a database error)."""

    def _held(self, task_id: str, snap: Snapshot | None) -> None:
        """The store holds `snap` for `task_id` now (None: no row): note it, and whether it changed."""
        if snap is None:
            if self.rows.pop(task_id, None) is not None:
                self.dirty[task_id] = None
        elif self.rows.get(task_id) != snap:
            self.rows[task_id] = snap
            self.dirty[task_id] = None

    def _listed(self, before: list[str], listing: list[Snapshot]) -> None:
        """`listing`: every row the store holds now among `before` (and others); the rest are gone."""
        found = {s.task_id: s for s in listing}
        for task_id in before:
            if task_id not in found:
                self._held(task_id, None)
        for task_id, snap in found.items():
            self._held(task_id, snap)

    def _check(self) -> None:
        if self.checked:
            store = {s.task_id: s for s in self.real.list(limit=EVERY)}
            if store != self.rows and self.mismatch is None:
                self.mismatch = f"kept {self.rows!r} != store {store!r}"

    def _of_hand(self, hand: str) -> list[str]:
        return [tid for tid, s in self.rows.items() if s.hand == hand]

    def get(self, task_id: str) -> Snapshot | None:
        return self.real.get(task_id)

    def insert_new(self, snap: Snapshot) -> Snapshot | None:
        existing = self.real.insert_new(snap)
        self._held(snap.task_id, existing or snap)  # None: `snap` was inserted
        self._check()
        return existing

    def delete(self, task_id: str) -> None:
        self.real.delete(task_id)
        self._held(task_id, None)
        self._check()

    def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        held, what = self.real.report(hand, info, now, adopt)
        self._held(info.task_id, held)
        self._check()
        return held, what

    def retry_start(self, snap: Snapshot) -> Snapshot | None:
        written = self.real.retry_start(snap)
        if written is not None:  # None: nothing written
            self._held(snap.task_id, written)
        self._check()
        return written

    def finish_start(self, task_id: str) -> Snapshot | None:
        held = self.real.finish_start(task_id)
        self._held(task_id, held)
        self._check()
        return held

    def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        held = self.real.set_cancel_pending(task_id, reason)
        self._held(task_id, held)
        self._check()
        return held

    def clear_cancel_pending(self, task_id: str) -> None:
        self.real.clear_cancel_pending(task_id)
        self._held(task_id, self.real.get(task_id))
        self._check()

    def mark_hand_stale(self, hand: str) -> int:
        n = self.real.mark_hand_stale(hand)
        if n:  # how many it changed
            self._listed(self._of_hand(hand), self.real.list(hand=hand, limit=EVERY))
        self._check()
        return n

    def mark_all_stale(self) -> int:
        n = self.real.mark_all_stale()
        self._listed(list(self.rows), self.real.list(limit=EVERY))
        self._check()
        return n

    def reconcile(
        self, hand: str, hand_rows: dict[str, TaskInfo], now: float, synced_since: float | None = None
    ) -> Plan:
        plan = self.real.reconcile(hand, hand_rows, now, synced_since)
        for snap in plan.writes:  # what it wrote, and what it deleted: nothing else
            self._held(snap.task_id, snap)
        for task_id in plan.never_stored:
            self._held(task_id, None)
        self._check()
        return plan

    def all(self) -> list[Snapshot]:
        return list(self.rows.values())
