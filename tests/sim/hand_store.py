"""The Hand's task database, in memory: `hand.system.taskdb.TaskStore`'s semantics without SQLite.

It survives Hand crashes (it is the disk). Same rules as the real store: `version` starts at 1 and
grows by one on every change; a state change goes through `protocol.states.advance`, so a terminal
row never changes; `page` is ordered by task id; `purge` forgets terminal rows finished before a
cutoff. `write_many` is the group commit's one transaction (the REAL `Insert`/`Change` writes):
each write is undone alone if it fails (its result is then the exception), and a failed commit
stores nothing and raises. Each change is reported to `on_change` (the checker keeps every version
the Hand ever had). The log files are sizes only: what matters to the invariants is `log_bytes`.

Fault: `fail_commits` (armed by `sim.faults`) makes the next commits that hold only `Insert`s fail
as a whole ("disk I/O error"), as SQLite's COMMIT can: the batch of starts is refused, nothing is
stored. Only insert-only commits: a failed commit of a RUNNING/terminal change leaves that row
unfinished until the Hand restarts (`TaskManager._execute`), which "every task ends" would flag.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hand.core.rows import Insert, TaskRow, Write
from protocol.states import TASK_TERMINAL, TASK_TRANSITIONS, TaskState, advance

OnChange = Callable[[str, TaskRow | None, str], None]


class HandTaskStore:
    def __init__(self, label: str, on_change: OnChange) -> None:
        self.label = label
        self.rows: dict[str, TaskRow] = {}
        self.log_sizes: dict[str, int] = {}
        self._on_change = on_change
        self.fail_commits = 0
        """How many of the next insert-only commits fail (a fault)."""

    def get(self, task_id: str) -> TaskRow | None:
        return self.rows.get(task_id)

    def get_many(self, task_ids: Iterable[str]) -> dict[str, TaskRow]:
        rows = self.rows
        return {t: rows[t] for t in task_ids if t in rows}

    def count(self) -> int:
        return len(self.rows)

    def page(self, after: str | None, limit: int) -> list[TaskRow]:
        ids = sorted(t for t in self.rows if t > (after or ""))
        return [self.rows[t] for t in ids[:limit]]

    def unfinished(self) -> list[TaskRow]:
        rows = [r for r in self.rows.values() if r.state in (TaskState.QUEUED, TaskState.RUNNING)]
        return sorted(rows, key=lambda r: (r.created_at, r.task_id))

    def insert(self, row: TaskRow) -> None:
        self.insert_many([row])

    def insert_many(self, rows: Sequence[TaskRow]) -> None:
        """All or none: raises `sqlite3.IntegrityError` (nothing inserted) if any id exists."""
        ids = [r.task_id for r in rows]
        clash = next((t for t in ids if t in self.rows), None)
        if clash is None and len(set(ids)) < len(ids):
            clash = next(t for t in ids if ids.count(t) > 1)
        if clash is not None:
            raise sqlite3.IntegrityError(f"UNIQUE constraint failed: tasks.task_id ({clash})")
        for row in rows:
            self.rows[row.task_id] = row
            self._on_change(row.task_id, row, "insert")

    def write_many(self, writes: Sequence[Write]) -> list[Any]:
        """One transaction: None for an `Insert`, the new row for a `Change`, or that write's error."""
        if self.fail_commits and all(isinstance(w, Insert) for w in writes):
            self.fail_commits -= 1
            raise sqlite3.OperationalError("disk I/O error")
        results: list[Any] = []
        for w in writes:
            try:
                if isinstance(w, Insert):
                    results.append(self.insert_many(w.rows))
                else:
                    results.append(self.update(w.task_id, **w.changes))
            except Exception as exc:  # this write's own result (a savepoint rolled back)
                results.append(exc)
        return results

    def update(self, task_id: str, **changes: Any) -> TaskRow:
        if "version" in changes or "task_id" in changes:
            raise ValueError("version and task_id are not changed by the caller")
        row = self.rows.get(task_id)
        if row is None:
            raise KeyError(task_id)
        if "state" in changes and changes["state"] != row.state:
            advance(TASK_TRANSITIONS, row.state, changes["state"])
        new = dataclasses.replace(row, **changes, version=row.version + 1)
        self.rows[task_id] = new
        self._on_change(task_id, new, "update")
        return new

    def purge(self, finished_before: float) -> list[str]:
        ids = [
            t
            for t, r in self.rows.items()
            if r.state in TASK_TERMINAL and r.finished_at is not None and r.finished_at < finished_before
        ]
        for t in ids:
            del self.rows[t]
            self.log_sizes.pop(t, None)
            self._on_change(t, None, "purge")
        return ids
