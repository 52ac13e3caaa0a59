"""A background task as the Hand's database stores it, and the writes that change it. Plain data,
shared by the task rules (`hand.core.tasks`), the store (`hand.system.taskdb`) and the simulation's
in-memory store, so all three mean the same thing by a row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocol.codes import KillStage
from protocol.messages import TaskInfo, Usage
from protocol.states import TASK_TERMINAL, TaskState


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    tool: str
    args_digest: str
    binding_digest: str
    state: TaskState
    version: int
    max_runtime_ms: int
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    stage: KillStage | None = None
    reason: str = ""
    error: str | None = None
    log_bytes: int = 0
    truncated: bool = False
    pid: int | None = None
    pid_start_time: int | None = None
    usage: str | None = None
    """What the ended task used (`protocol.messages.Usage` as JSON), where its cgroup counted it."""

    @property
    def terminal(self) -> bool:
        return self.state in TASK_TERMINAL


@dataclass(frozen=True)
class Insert:
    """A write: new rows (all or none)."""

    rows: tuple[TaskRow, ...]


@dataclass(frozen=True)
class Change:
    """A write: `changes` to one row, `version` + 1 (see `TaskStore.update`)."""

    task_id: str
    changes: Mapping[str, Any]


Write = Insert | Change


def to_info(row: TaskRow) -> TaskInfo:
    return TaskInfo(
        task_id=row.task_id,
        tool=row.tool,
        state=row.state,
        version=row.version,
        args_digest=row.args_digest,
        binding_digest=row.binding_digest,
        max_runtime_ms=row.max_runtime_ms,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        exit_code=row.exit_code,
        signal=row.signal,
        stage=row.stage,
        reason=row.reason[:4096],
        error=row.error[:16384] if row.error is not None else None,
        log_bytes=row.log_bytes,
        truncated=row.truncated,
        usage=Usage.model_validate_json(row.usage) if row.usage else None,
    )
