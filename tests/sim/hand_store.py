"""The Hand's task database, in memory: `hand.taskstore.TaskStore`'s semantics without SQLite.

It survives Hand crashes (it is the disk). Same rules as the real store: `version` starts at 1 and
grows by one on every change; a state change goes through `protocol.states.advance`, so a terminal
row never changes; `page` is ordered by task id; `purge` forgets terminal rows finished before a
cutoff. Each change is reported to `on_change` (the checker keeps every version the Hand ever had).
The log files are sizes only: what matters to the invariants is `log_bytes`, not the bytes.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Callable

from hand.taskstore import TaskRow
from protocol.states import TASK_TERMINAL, TASK_TRANSITIONS, TaskState, advance

OnChange = Callable[[str, TaskRow | None, str], None]


class HandTaskStore:
    def __init__(self, label: str, on_change: OnChange) -> None:
        self.label = label
        self.rows: dict[str, TaskRow] = {}
        self.log_sizes: dict[str, int] = {}
        self._on_change = on_change

    def get(self, task_id: str) -> TaskRow | None:
        return self.rows.get(task_id)

    def count(self) -> int:
        return len(self.rows)

    def page(self, after: str | None, limit: int) -> list[TaskRow]:
        ids = sorted(t for t in self.rows if t > (after or ""))
        return [self.rows[t] for t in ids[:limit]]

    def unfinished(self) -> list[TaskRow]:
        rows = [r for r in self.rows.values() if r.state in (TaskState.QUEUED, TaskState.RUNNING)]
        return sorted(rows, key=lambda r: (r.created_at, r.task_id))

    def insert(self, row: TaskRow) -> None:
        if row.task_id in self.rows:
            raise sqlite3.IntegrityError(f"UNIQUE constraint failed: tasks.task_id ({row.task_id})")
        self.rows[row.task_id] = row
        self._on_change(row.task_id, row, "insert")

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
            t for t, r in self.rows.items()
            if r.state in TASK_TERMINAL and r.finished_at is not None and r.finished_at < finished_before
        ]
        for t in ids:
            del self.rows[t]
            self.log_sizes.pop(t, None)
            self._on_change(t, None, "purge")
        return ids
