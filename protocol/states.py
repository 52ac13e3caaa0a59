"""Run and task states with their legal transitions, as data.

Invariants (DESIGN §3): every run and task ends in exactly one terminal state; the first legal
terminal wins; terminals never change. `advance` is the only way to move a state, and it refuses
anything the table does not list, so an illegal transition is an error at the call site, not a
silently rewritten history.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from protocol.errors import MindhandError


class RunState(StrEnum):
    ADMITTED = "admitted"
    SENT = "sent"
    ACCEPTED = "accepted"
    RUNNING = "running"
    CANCEL_REQUESTED = "cancel_requested"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"
    BUDGET_EXHAUSTED = "budget_exhausted"


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"


RUN_TERMINAL: frozenset[RunState] = frozenset(
    {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.REJECTED,
        RunState.CANCELLED,
        RunState.TIMED_OUT,
        RunState.LOST,
        RunState.BUDGET_EXHAUSTED,
    }
)

HAND_REPORTABLE: frozenset[RunState] = frozenset(
    {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.CANCELLED,
        RunState.TIMED_OUT,
        RunState.BUDGET_EXHAUSTED,
    }
)
"""Terminal states a Hand may put in a `result`. `lost` and `rejected` are never a result: the Mind
decides `lost` (nobody can know), and a refusal travels as `rejected` before anything ran."""

_EXECUTED_END = HAND_REPORTABLE | {RunState.LOST}

RUN_TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    RunState.ADMITTED: frozenset(
        {RunState.SENT, RunState.REJECTED, RunState.CANCELLED, RunState.LOST, RunState.TIMED_OUT}
    ),
    RunState.SENT: frozenset(
        {
            RunState.ACCEPTED,
            RunState.REJECTED,
            RunState.CANCEL_REQUESTED,
            RunState.LOST,
            RunState.TIMED_OUT,
        }
    ),
    RunState.ACCEPTED: frozenset({RunState.RUNNING, RunState.CANCEL_REQUESTED} | _EXECUTED_END),
    RunState.RUNNING: frozenset({RunState.CANCEL_REQUESTED} | _EXECUTED_END),
    # A cancel is a request: the run still ends in whatever the authority reports first. A result
    # that raced the cancel is `succeeded`, because the command did run. A `rejected` can still
    # arrive if the cancel was requested before the Hand's admission answer.
    RunState.CANCEL_REQUESTED: frozenset(_EXECUTED_END | {RunState.REJECTED}),
}

TASK_TERMINAL: frozenset[TaskState] = frozenset(
    {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.CANCELLED,
        TaskState.TIMED_OUT,
        TaskState.LOST,
    }
)

TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.QUEUED: frozenset({TaskState.RUNNING, TaskState.CANCELLED, TaskState.LOST}),
    TaskState.RUNNING: frozenset(TASK_TERMINAL),
}


class IllegalTransition(MindhandError):
    def __init__(self, current: StrEnum, new: StrEnum) -> None:
        super().__init__(f"illegal transition {current} -> {new}")
        self.current = current
        self.new = new


S = TypeVar("S", RunState, TaskState)


def can_advance(table: Mapping[S, frozenset[S]], current: S, new: S) -> bool:
    return new in table.get(current, frozenset())


def advance(table: Mapping[S, frozenset[S]], current: S, new: S) -> S:
    """Return `new` if the table allows `current -> new`; raise `IllegalTransition` otherwise.

    Terminal states have no row, so nothing ever leaves them.
    """
    if not can_advance(table, current, new):
        raise IllegalTransition(current, new)
    return new
