"""The Hand's rules for background tasks (DESIGN §7), pure: fed with rows, counts, outcomes and
`now`, they return decisions. `hand.aio.tasks.TaskManager` performs them, and the deterministic
simulation (`tests/sim/hand_tasks.py`) drives these same functions and classes, so a rule changed
here is a rule changed in both.

- Admission, in order: the refusals every start gets at once, in the one order and with the
  sentences of a foreground run (`background_refusal`, `hand.core.runs.refusal`), arguments and
  paths (the shell, through `hand.system.tools`), then
  duplicates (same id and binding -> the existing task, nothing runs; another binding ->
  `conflicting_duplicate`), then the quota (`quota_exceeded` at `max_retained` rows, nothing
  stored). Within a batch each start sees the rows admitted before it (`admit_batch`).
- The ORDER of admission (`Admissions`): starts are taken in as they arrive, in arrival order; one
  batch at a time is decided and committed, and a batch is everything that arrived while the
  previous one was in progress; a start is answered only after its batch's commit (durable before
  accepted), and a failed look or commit refuses the whole batch.
- At most `max_running` run; the rest wait `queued`, first come first served (`next_to_start`).
- The truth wins (`ending`): only a kill we performed makes a task `cancelled`/`timed_out`/budget
  `failed`; a command that exited on its own reports its real exit even if a cancel raced it.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from hand.core.cpu import cpu_exhausted, kernel_cpu_kill
from hand.core.rows import TaskRow
from hand.core.runs import OUT_OF_MEMORY, Refused, exit_reason, kernel_cpu_reason, oom_error, refusal
from hand.core.runs import SHUTTING_DOWN as SHUTTING_DOWN  # the start's refusal, as tests name it
from hand.core.spawn import SpawnFailure
from protocol.codes import CancelReason, ErrorCode, KillStage, RejectCode
from protocol.digest import args_digest, binding_digest
from protocol.messages import Accepted, Error, Result, Rpc, TaskInfo, TaskStartValue
from protocol.states import TASK_TERMINAL, TASK_TRANSITIONS, RunState, TaskState

LOST_REASON = "hand restarted before completion"
ADMIT_BACKLOG = 1024
"""Starts taken in but not yet decided, past which the reader waits for them (backpressure on the
connection's reader instead of an unbounded queue)."""


class Outcome(Protocol):
    """What `ending` reads of a finished process (`hand.system.process.ProcessOutcome`)."""

    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...
    @property
    def killed(self) -> bool: ...
    @property
    def stage(self) -> KillStage | None: ...


@dataclass(frozen=True)
class TaskLimits:
    max_running: int = 4
    max_retained: int = 1000
    retention_s: float = 7 * 86400.0
    log_max: int = 64 << 20


class Admission(enum.Enum):
    INSERT = "insert"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    OVER_QUOTA = "over_quota"


def admit(existing: TaskRow | None, binding: str, retained: int, max_retained: int) -> Admission:
    """What to do with a start whose arguments passed policy, given the row already stored under its
    id (if any) and the number of rows kept after the retention purge."""
    if existing is not None:
        return Admission.DUPLICATE if existing.binding_digest == binding else Admission.CONFLICT
    if retained >= max_retained:
        return Admission.OVER_QUOTA
    return Admission.INSERT


@dataclass(frozen=True)
class StartRequest:
    """A start that passed policy, waiting for the next group commit."""

    task_id: str
    tool: str
    args_digest: str
    binding_digest: str
    max_runtime_ms: int


def start_request(rpc: Rpc) -> StartRequest:
    """A background start as admission sees it: its id, and the digests that identify it (its
    arguments; its binding: tool, arguments and max runtime, what a duplicate must match)."""
    assert rpc.background is not None
    max_ms = rpc.background.max_runtime_ms
    return StartRequest(
        task_id=rpc.run_id,
        tool=rpc.tool,
        args_digest=args_digest(rpc.tool, rpc.args),
        binding_digest=binding_digest(rpc.tool, rpc.args, max_ms),
        max_runtime_ms=max_ms,
    )


@dataclass(frozen=True)
class Verdict:
    admission: Admission
    row: TaskRow | None
    """INSERT: the new row (to commit); DUPLICATE: the row it duplicates; else None."""
    retained: int
    """Rows kept when this start was decided (for the quota message)."""


def admit_batch(
    starts: Sequence[StartRequest], existing: Mapping[str, TaskRow], retained: int, max_retained: int, now: float
) -> list[Verdict]:
    """Decide the starts of one group commit, in arrival order, exactly as if they came one at a
    time: each sees the rows admitted before it in the same batch (a second start with the same id
    is its duplicate or its conflict) and counts them against the quota. `existing` holds the
    stored rows under the batch's ids, `retained` the stored row count (after the purge)."""
    known = dict(existing)
    verdicts: list[Verdict] = []
    for s in starts:
        row = known.get(s.task_id)
        decision = admit(row, s.binding_digest, retained, max_retained)
        if decision is Admission.INSERT:
            row = TaskRow(
                task_id=s.task_id,
                tool=s.tool,
                args_digest=s.args_digest,
                binding_digest=s.binding_digest,
                state=TaskState.QUEUED,
                version=1,
                max_runtime_ms=s.max_runtime_ms,
                created_at=now,
            )
            known[s.task_id] = row
            retained += 1
        verdicts.append(
            Verdict(decision, row if decision in (Admission.INSERT, Admission.DUPLICATE) else None, retained)
        )
    return verdicts


def purge_cutoff(now: float, retention_s: float) -> float:
    """Terminal rows that finished before this time are forgotten (rows and logs)."""
    return now - retention_s


def next_to_start(queued: Sequence[str], running: int, max_running: int) -> list[str]:
    """The queued ids to start now, oldest first, so that at most `max_running` run at once."""
    return list(queued[: max(0, max_running - running)])


@dataclass(frozen=True)
class Ending:
    state: TaskState
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    stage: KillStage | None = None
    error: str | None = None


def starts_first(state: TaskState, end: TaskState) -> bool:
    """A task still `queued` whose ending is not one a queued task may take (`failed`: its program
    could not start) is first recorded `running`: it did start, then failed."""
    return state is TaskState.QUEUED and end not in TASK_TRANSITIONS[TaskState.QUEUED]


def not_started(failure: SpawnFailure) -> Ending:
    """A task whose program could not start: `failed`, with exit code 127 or 126 when the program
    itself could not be executed, as a shell reports it (`hand.core.spawn`)."""
    return Ending(TaskState.FAILED, failure.reason, failure.exit_code, error=failure.error)


def ending(
    out: Outcome | None,
    cancel: CancelReason | None,
    max_runtime_ms: int,
    error: str | None = None,
    cpu_seconds: int | None = None,
    cpu_used: float = 0.0,
    oom_kills: int = 0,
    memory_limit: int | None = None,
) -> Ending:
    """How a task ended. The truth wins: only a kill we performed makes it `cancelled`,
    `timed_out` or (its CPU budget spent) `failed`; a command that exited on its own reports its
    real exit even if a cancel raced."""
    if out is None:
        return Ending(TaskState.FAILED, "tool failed", error=error)
    if out.killed:
        stage = out.stage
        if cancel is CancelReason.BUDGET_EXHAUSTED and cpu_seconds is not None:
            return Ending(TaskState.FAILED, cpu_exhausted(cpu_seconds), out.exit_code, out.signal, stage, error)
        if cancel is CancelReason.DEADLINE_EXCEEDED:
            return Ending(
                TaskState.TIMED_OUT,
                f"max runtime of {max_runtime_ms} ms exceeded",
                out.exit_code,
                out.signal,
                stage,
                error,
            )
        return Ending(
            TaskState.CANCELLED, (cancel or CancelReason.SHUTDOWN).value, out.exit_code, out.signal, stage, error
        )
    if out.exit_code == 0:
        return Ending(TaskState.SUCCEEDED, "", 0, None, None, error)
    if kernel_cpu_kill(out.killed, out.signal, cpu_seconds, cpu_used):
        assert cpu_seconds is not None
        return Ending(TaskState.FAILED, kernel_cpu_reason(cpu_seconds), out.exit_code, out.signal, None, error)
    if oom_kills:  # the kernel killed in its cgroup for its memory limit (`process_end` says the same)
        return Ending(
            TaskState.FAILED, OUT_OF_MEMORY, out.exit_code, out.signal, None, error or oom_error(memory_limit)
        )
    return Ending(TaskState.FAILED, exit_reason(out.exit_code, out.signal), out.exit_code, out.signal, None, error)


class CancelAction(enum.Enum):
    DEQUEUE = "dequeue"
    KILL = "kill"
    ALREADY_DONE = "already_done"
    UNKNOWN = "unknown"


def cancel_action(queued: bool, running: bool, row: TaskRow | None) -> CancelAction:
    """A queued task is cancelled at once (nothing ran); a running one is killed and its terminal
    comes later as a `task_update`; anything else already ended or never existed."""
    if queued:
        return CancelAction.DEQUEUE
    if running:
        return CancelAction.KILL
    return CancelAction.UNKNOWN if row is None else CancelAction.ALREADY_DONE


def removal(task_id: str, row: TaskRow | None, *, live: TaskState | None, uncommitted: bool) -> Error | None:
    """Whether a task may be removed (`mind task rm`), None when it may: only a finished task whose
    outcome is on disk, so nothing running loses its record and its log while it writes them, and
    no outcome the Hand holds in memory is thrown away with its row (DESIGN §7). `live`: the state
    the task manager holds it in (queued, running; a terminal one is its runner finishing after the
    commit), None when it holds it nowhere; `uncommitted`: it ended but its outcome is not on disk
    yet (a full disk)."""
    if uncommitted:
        return Error(
            code=ErrorCode.NOT_ALLOWED,
            message=f"task {task_id} ended but this hand could not record its outcome yet (its state disk may be "
            "full): it can be removed once it is recorded",
        )
    state = live if live is not None and live not in TASK_TERMINAL else None
    if state is None and row is not None and not row.terminal:
        state = row.state
    if state is not None:
        return Error(
            code=ErrorCode.NOT_ALLOWED,
            message=f"task {task_id} is {state.value}: only a finished task can be removed "
            f"(cancel it first: mind task cancel {task_id})",
        )
    if row is None:
        return Error(code=ErrorCode.UNKNOWN_TASK, message=f"this hand has no task {task_id}")
    return None


def lost_reason(orphan_killed: bool) -> str:
    return f"{LOST_REASON}; its leftover processes were killed" if orphan_killed else LOST_REASON


def orphaned(row: TaskRow, start_time_now: int | None) -> bool:
    """Whether the process a row the previous run of the Hand left unfinished names is still that
    process: alive (`start_time_now`, None if the pid is gone) AND started when the row says. A pid
    reused since is someone else's and is never killed."""
    return row.pid is not None and row.pid_start_time is not None and start_time_now == row.pid_start_time


def recovered(row: TaskRow, orphan_killed: bool, log_size: int | None, now: float) -> dict[str, object]:
    """What an unfinished row becomes after a restart of the Hand (DESIGN §7): `lost`, never re-run,
    the reason saying whether its orphaned tree was killed, its log's size as found on disk (the
    row's own count when the log cannot be read)."""
    return {
        "state": TaskState.LOST,
        "reason": lost_reason(orphan_killed),
        "finished_at": now,
        "log_bytes": row.log_bytes if log_size is None else log_size,
    }


def page_length(offset: int, limit: int, log_bytes: int) -> int:
    """How many bytes a log page holds: never past the known end, so a page never shows bytes the
    `log_bytes` beside it does not count."""
    return max(0, min(limit, log_bytes - offset))


def at_eof(next_offset: int, log_bytes: int, terminal: bool) -> bool:
    return terminal and next_offset >= log_bytes


def stream_truncated(size: int, cap: int, combined_truncated: bool, errored: bool) -> bool:
    """Whether a finished task's stream file (`task logs --stream`) lost bytes, from what is kept:
    its size, the bound, and the row's own `truncated` (the combined log's) and `error`. The row
    stores no flag per stream (its schema is the combined log's). A stream can only have lost
    bytes if the combined log did (that one is offered every byte of both streams, so it reaches
    the same bound no later), and then it did if its file reached the bound or a log write failed
    (the task records that as its `error`).
    Errs only towards saying "truncated": a stream of exactly `cap` bytes, or a bound lowered
    since the task ran, says so although nothing was lost. A running task's flag is its sink's."""
    return combined_truncated and (size >= cap or errored)


# --- the answer to one start, and the order in which starts are decided ---------------------------


@dataclass(frozen=True)
class Queued:
    """Committed as a new row: it will run. Answer `accepted` + `result` (not a duplicate)."""

    row: TaskRow


@dataclass(frozen=True)
class Duplicate:
    """The same id and binding are stored already: nothing new runs; answer with that task."""

    row: TaskRow


Answer = Queued | Duplicate | Refused


def background_refusal(
    tool: str, *, allowed: bool, closing: bool, args_size: int, state_free: int | None = None
) -> Refused | None:
    """The refusals a background start gets at once, before anything is stored or batched: the
    one order and the sentences of a foreground run (`hand.core.runs.refusal`; a full state disk
    included), less the duplicate (decided at the group commit, `admit_batch`). Then
    `hand.system.tools.prepare` checks arguments and paths."""
    return refusal(
        "", tool, args_size=args_size, allowed=allowed, closing=closing, background=True, state_free=state_free
    )


def started(task_id: str, info: TaskInfo, *, duplicate: bool) -> tuple[Accepted, Result]:
    """What a start is sent once its row is committed (or the row it duplicates is found):
    `accepted`, then the start run's `result` carrying the task."""
    value = TaskStartValue(task=info, duplicate=duplicate).model_dump(mode="python")
    return Accepted(run_id=task_id), Result(run_id=task_id, state=RunState.SUCCEEDED, value=value)


def answer_for(verdict: Verdict, task_id: str, max_retained: int) -> Answer:
    """What a start is told once its batch is committed."""
    if verdict.admission is Admission.CONFLICT:
        return Refused(
            RejectCode.CONFLICTING_DUPLICATE,
            f"task {task_id} already exists with another tool, arguments or max runtime",
        )
    if verdict.admission is Admission.OVER_QUOTA:
        return Refused(
            RejectCode.QUOTA_EXCEEDED,
            f"this hand already keeps {verdict.retained} tasks (max {max_retained}); "
            "finished tasks are forgotten after the retention time",
        )
    assert verdict.row is not None
    return Duplicate(verdict.row) if verdict.admission is Admission.DUPLICATE else Queued(verdict.row)


NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def store_failed(exc: BaseException) -> Refused:
    """The answer of every start of a batch whose look or commit failed: nothing of it is stored.
    A disk that filled between the admission's look at it and the commit is `disk_full` too (the
    same truth a start refused at once is told), anything else an internal error."""
    no_room = getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL" or getattr(exc, "errno", None) in NO_ROOM_ERRNOS
    if no_room:
        return Refused(
            RejectCode.DISK_FULL,
            f"this hand's state disk is full: the task database could not store the start ({exc}); nothing was stored",
        )
    return Refused(
        RejectCode.INTERNAL_ERROR, f"the task database could not store the start: {type(exc).__name__}: {exc}"
    )


S = TypeVar("S")


class Admissions(Generic[S]):
    """The order in which background starts are taken in, batched and decided: one batch at a
    time, and a batch is every start that arrived while the previous one was being decided.

    The shell (asyncio in `TaskManager`, generators in the simulation) owns at most one drainer:
    after `take` it starts one if `needs_drainer()`, the drainer loops on `next_batch` until it
    returns None and then calls `drainer_ended`, and every request that must see the starts taken
    in before it waits while `deciding()`. Keeping this bookkeeping here, not in each shell, is what
    makes the order the simulation checks the order the Hand ships: the group commit's two races
    were in exactly this bookkeeping, found only after a hand-kept copy of it caught up."""

    def __init__(self) -> None:
        self._pending: list[S] = []
        self._draining = False

    def take(self, start: S) -> None:
        """A start arrived (it passed policy): it waits for the next batch."""
        self._pending.append(start)

    def needs_drainer(self) -> bool:
        return not self._draining

    def drainer_started(self) -> None:
        self._draining = True

    def next_batch(self) -> list[S] | None:
        """(the drainer) Everything taken in since the last batch, in arrival order; None when
        nothing waits."""
        if not self._pending:
            return None
        batch, self._pending = self._pending, []
        return batch

    def drainer_ended(self) -> None:
        """The drainer is gone (done, or cancelled with its owner): starts still waiting need a new
        one, which the next `take` or waiter starts."""
        self._draining = False

    def abandon(self) -> list[S]:
        """No drainer can be started (the owner is closing): every waiting start, to be refused."""
        batch, self._pending = self._pending, []
        return batch

    def backlog(self) -> int:
        return len(self._pending)

    def deciding(self) -> bool:
        """Some start taken in is not answered yet."""
        return bool(self._pending) or self._draining
