"""The Hand's rules for a run (DESIGN §3-§6), pure: what refuses a start and how a run ended.

`hand.aio.runs.RunTable` (foreground runs) and `hand.aio.tasks.TaskManager` (background starts)
perform them; the deterministic simulation (`tests/sim/hand_runs.py`, `hand_tasks.py`) calls these
same functions, so a rule changed here is changed in all three.

- ONE order of refusal, ONE set of sentences for a run and a background start (`refusal`): an id
  already known (foreground only: a background duplicate is decided at its group commit, where it
  may be the same task asked again), the Hand closing, a full state disk (`disk_full`: what cannot
  be audited does not run), the tool (unknown, or not one that can run in the background), the
  arguments' size, the policy, then a terminal the policy denies. A run and a task refused for the
  same reason read the same sentence. The tool's own arguments and paths are checked after these,
  by the shell (`hand.system.tools.prepare`).
- A run id is never run twice (`RunBook`, `RecentRuns`): a run is entered before `accepted` and
  ended in the same step as its one result, so a cancel sees it active or done, never between.
- Progress is observation only (`progress_pieces`): dropped past the caps, never after the end.
- The truth wins (`process_end`): only a kill we performed makes a run end as its cancel reason
  says (`REASON_TO_STATE`); a command that exited on its own reports its real exit even if a
  cancel raced it.
- The first terminal wins (`final`): the fact set by a deadline or a budget before the kill
  (`RunControl.exhaust`) is what the run reports, whatever the process did next.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from hand.core.cpu import CPU_SECONDS, cpu_exhausted, kernel_cpu_kill
from hand.core.policy import KNOWN_TOOLS
from protocol import limits
from protocol.codes import CancelReason, CancelStatus, RejectCode
from protocol.control import REASON_TO_STATE, Budget, Lifecycle, Termination
from protocol.states import RunState

BACKGROUND_TOOLS = frozenset({"exec", "shell"})
PROGRESS_BYTES = "progress_bytes"
PROGRESS_EVENTS = "progress_events"
RECENT_MAX = 1000


@dataclass(frozen=True)
class Refused:
    """Answer `rejected` with this code; nothing runs and nothing is stored for this start."""

    code: RejectCode
    message: str


SHUTTING_DOWN = Refused(RejectCode.SHUTTING_DOWN, "this hand is shutting down")
STATE_ROOM_MIN = 1 << 20
"""Free bytes on the Hand's state disk below which a start is refused (`disk_full`). What a start
writes there before anyone hears of it is small (its audit lines, a task's row and WAL pages, the
first blocks of its log), but it is written by several writers at once, and a filesystem with less
than this left fills within a few of them: past this line the start would run with its audit lines
dropped and its records failing part way. A run that cannot be audited does not run."""
NOT_BACKGROUND = Refused(RejectCode.INVALID_REQUEST, "only exec and shell can run as background tasks")


def duplicate_run(run_id: str) -> Refused:
    return Refused(RejectCode.DUPLICATE_RUN, f"run {run_id} is already known to this hand")


def args_too_large(size: int) -> Refused:
    return Refused(RejectCode.INVALID_REQUEST, f"arguments of {size} bytes exceed {limits.ARGS_MAX_BYTES}")


def denied(tool: str) -> Refused:
    return Refused(RejectCode.DENIED_BY_POLICY, f"tool {tool!r} is denied by this hand's policy")


def disk_full(free: int) -> Refused:
    """A start refused for the state disk: says how much was free and what it needs, so the
    operator knows what to free and the caller knows nothing ran."""
    return Refused(
        RejectCode.DISK_FULL,
        f"this hand's state disk is full ({free} bytes free, under the {STATE_ROOM_MIN >> 20} MiB a start needs): "
        "it cannot keep the audit trail and records of a new run or task, so nothing ran; "
        "try again once there is room",
    )


def refusal(
    run_id: str,
    tool: str,
    *,
    args_size: int,
    allowed: bool,
    closing: bool,
    known: bool = False,
    background: bool = False,
    no_pty: str | None = None,
    state_free: int | None = None,
) -> Refused | None:
    """The refusal a start gets at once, before it is accepted (a run) or batched (a task), in the
    one order both follow; None when the shell may go on to check its arguments and paths.
    `allowed`: the policy allows the tool; `known`: the run id is active or recently finished on
    this Hand (never run a run id twice); `no_pty`: why the policy refuses the terminal this start
    asks for (`ToolPolicy.why_no_pty`), None when it asks for none or may have one; `state_free`:
    the bytes free on the state disk now (None: not known, or no state disk), refused below
    `STATE_ROOM_MIN` whatever is asked, as a closing Hand refuses."""
    if known:
        return duplicate_run(run_id)
    if closing:
        return SHUTTING_DOWN
    if state_free is not None and state_free < STATE_ROOM_MIN:
        return disk_full(state_free)
    if background and tool not in BACKGROUND_TOOLS:
        return NOT_BACKGROUND
    if tool not in KNOWN_TOOLS:
        return Refused(RejectCode.UNKNOWN_TOOL, f"this hand has no tool {tool!r}")
    if args_size > limits.ARGS_MAX_BYTES:
        return args_too_large(args_size)
    if not allowed:
        return denied(tool)
    if no_pty is not None:
        return Refused(RejectCode.DENIED_BY_POLICY, no_pty)
    return None


def stream_refusal(tool: str, *, wants_stdin: bool, streams: bool, pty: bool, stdin: bool) -> Refused | None:
    """A tool whose bytes travel as a stream (`put_file`/`get_file` as `mind cp` sends them) is
    refused unless the run carries exactly the streams it needs, and never on a terminal."""
    if streams and not pty and stdin == wants_stdin:
        return None
    how = "with a stdin stream" if wants_stdin else "with output streams and no stdin"
    return Refused(RejectCode.INVALID_REQUEST, f"{tool} carries its bytes as a stream: send it {how} (mind cp)")


# --- the runs of one connection -------------------------------------------------------------------


class RecentRuns:
    """A bounded memory of finished run ids: `already_done` for a late cancel, and `duplicate_run`
    for an rpc that would run a finished run again (nothing is re-run automatically). Shared across
    connections by the agent, so a run id of an earlier connection is never run twice."""

    def __init__(self, cap: int = RECENT_MAX) -> None:
        self._cap = cap
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, run_id: str) -> None:
        self._ids[run_id] = None
        self._ids.move_to_end(run_id)
        while len(self._ids) > self._cap:
            self._ids.popitem(last=False)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._ids


R = TypeVar("R")


class RunBook(Generic[R]):
    """The runs of one connection as the rules see them: the active ones by id (whatever the
    shell keeps for each), the recently finished ones, and whether the table is closing. A run is
    entered before `accepted` and ended in the same step as its one result, so a `cancel` that
    follows on the ordered stream sees it either active or done, never in between."""

    def __init__(self, recent: RecentRuns) -> None:
        self.active: dict[str, R] = {}
        self.recent = recent
        self.closing: CancelReason | None = None

    def knows(self, run_id: str) -> bool:
        """The run was taken in (it is active, or recently finished): it never runs again."""
        return run_id in self.active or run_id in self.recent

    def refusal(
        self,
        run_id: str,
        tool: str,
        *,
        args_size: int,
        allowed: bool,
        no_pty: str | None = None,
        state_free: int | None = None,
    ) -> Refused | None:
        """`refusal` for a start on this connection: a known id is a duplicate, a closing table
        takes nothing new."""
        return refusal(
            run_id,
            tool,
            args_size=args_size,
            allowed=allowed,
            closing=self.closing is not None,
            known=self.knows(run_id),
            no_pty=no_pty,
            state_free=state_free,
        )

    def cancel_status(self, run_id: str) -> CancelStatus:
        """The answer to a cancel: a request for an active run, `already_done` for a finished one."""
        if run_id in self.active:
            return CancelStatus.CANCEL_REQUESTED
        return CancelStatus.ALREADY_DONE if run_id in self.recent else CancelStatus.UNKNOWN_RUN

    def close(self, reason: CancelReason) -> list[R]:
        """Refuse new runs from now on (the first reason stays); the active runs, to cancel."""
        self.closing = self.closing or reason
        return list(self.active.values())

    def end(self, run_id: str, run: R) -> bool:
        """Forget `run` as it concludes; False when it already had (a run has one result)."""
        if self.active.get(run_id) is not run:
            return False
        del self.active[run_id]
        self.recent.add(run_id)
        return True


# --- the run's budget and its grace ---------------------------------------------------------------


def run_limits(cpu_seconds: int | None) -> dict[str, int | float]:
    """What a run may spend: progress (observation, dropped past the caps) and, if asked, CPU."""
    out: dict[str, int | float] = {
        PROGRESS_BYTES: limits.PROGRESS_BYTES_MAX,
        PROGRESS_EVENTS: limits.PROGRESS_EVENTS_MAX,
    }
    if cpu_seconds is not None:
        out[CPU_SECONDS] = cpu_seconds
    return out


def kill_grace(asked_ms: int | None, hand_grace: float) -> float:
    """The grace between SIGTERM and SIGKILL: the client may shorten the Hand's, never lengthen it."""
    return hand_grace if asked_ms is None else min(asked_ms / 1000, hand_grace)


def progress_fits(budget: Budget, n: int) -> bool:
    """Reserve one progress event of `n` bytes, all or nothing."""
    for kind, amount in ((PROGRESS_EVENTS, 1), (PROGRESS_BYTES, n)):
        limit = budget.limit(kind)
        if limit is not None and budget.used(kind) + amount > limit:
            return False
    return budget.try_reserve(PROGRESS_EVENTS, 1) and budget.try_reserve(PROGRESS_BYTES, n)


def progress_pieces(
    offsets: dict[str, int], stream: str, data: bytes, budget: Budget, *, stopped: bool
) -> list[tuple[int, bytes, bool]]:
    """Output as progress events: `data` cut into pieces at their offsets in `stream` (`offsets`
    advances by all of it, sent or not), each with whether it goes out. Progress is observation
    only: a run that is stopped or has ended sends none, and past the caps a piece is dropped (and
    counted by the caller) while the run goes on."""
    base = offsets[stream]
    offsets[stream] = base + len(data)
    step = limits.PROGRESS_CHUNK_MAX
    pieces = (data[i : i + step] for i in range(0, len(data), step))
    return [(base + i * step, p, not stopped and progress_fits(budget, len(p))) for i, p in enumerate(pieces)]


# --- how a run ended ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunEnd:
    state: RunState
    reason: str


def exit_reason(exit_code: int | None, signal: int | None) -> str:
    """The reason of a command that ended on its own and not well (a run's or a task's)."""
    return f"exit status {exit_code}" if exit_code is not None else f"killed by signal {signal}"


def kernel_cpu_reason(cpu_seconds: int) -> str:
    return f"{cpu_exhausted(cpu_seconds)} (the kernel's per-process CPU limit)"


def process_end(
    *,
    killed: bool,
    exit_code: int | None,
    signal: int | None,
    cancel: CancelReason | None,
    cpu_seconds: float | None = None,
    cpu_used: float = 0.0,
    oom_kills: int = 0,
) -> RunEnd:
    """How a run's process ended. The truth wins: only a kill we performed (`killed`) makes it end
    as its cancel reason says; CPU spent past the budget is `budget_exhausted` whether we or the
    kernel's per-process limit killed it; a run that failed after the kernel killed in it for its
    memory limit (`oom_kills`, its cgroup's count) is `out_of_memory`; otherwise its exit status
    decides (a run that succeeded although one of its processes was killed for memory succeeded)."""
    cpu = int(cpu_seconds) if cpu_seconds is not None else None
    if killed and cancel is CancelReason.BUDGET_EXHAUSTED and cpu is not None:
        return RunEnd(RunState.BUDGET_EXHAUSTED, cpu_exhausted(cpu))
    if killed and cancel is not None:
        return RunEnd(REASON_TO_STATE[cancel], cancel.value)
    if cpu is not None and kernel_cpu_kill(killed, signal, cpu, cpu_used):
        return RunEnd(RunState.BUDGET_EXHAUSTED, kernel_cpu_reason(cpu))
    if exit_code == 0:
        return RunEnd(RunState.SUCCEEDED, "")
    if oom_kills:
        return RunEnd(RunState.FAILED, OUT_OF_MEMORY)
    return RunEnd(RunState.FAILED, exit_reason(exit_code, signal))


OUT_OF_MEMORY = "out_of_memory"


def oom_error(memory_limit: int | None) -> str:
    """The sentence a run killed for its memory limit carries (`error`)."""
    if memory_limit is None:
        return "out of memory: the kernel killed a process of the run for its memory limit"
    return f"out of memory: the run's memory limit is {_size(memory_limit)}"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def stopped(termination: Termination | None, cancel: CancelReason | None) -> RunEnd:
    """A run stopped before (or instead of) producing an outcome: the fact if one was set, else
    what its cancel reason means (a run stopped with no reason was stopped by the Hand's shutdown)."""
    reason = cancel or CancelReason.SHUTDOWN
    state = termination.state if termination is not None else REASON_TO_STATE[reason]
    return RunEnd(state, reason.value)


def final(lifecycle: Lifecycle, end: RunEnd, now: float) -> RunEnd | None:
    """Record `end` as the run's one terminal. None: it is the terminal; otherwise the fact set
    before it (a deadline, a budget) with another state, which the run reports instead."""
    if lifecycle.finish(end.state, end.reason or end.state.value, now):
        return None
    term = lifecycle.termination
    assert term is not None
    return RunEnd(term.state, term.reason) if term.state != end.state else None
