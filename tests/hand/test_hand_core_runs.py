"""The run rules of `hand.core.runs` fed directly (no process, no clock), and the two shells that
perform them: a foreground run and a background start refused for the same reason read the same
sentence, and both follow one order."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hand.aio.runs import RunTable
from hand.aio.tasks import TaskManager
from hand.core.policy import Policy
from hand.core.rows import TaskRow, to_info
from hand.core.runs import (
    NOT_BACKGROUND,
    PROGRESS_BYTES,
    PROGRESS_EVENTS,
    SHUTTING_DOWN,
    STATE_ROOM_MIN,
    RecentRuns,
    RunBook,
    RunEnd,
    final,
    kill_grace,
    process_end,
    progress_fits,
    progress_pieces,
    refusal,
    run_limits,
    stopped,
    stream_refusal,
)
from hand.core.tasks import background_refusal, ending, start_request, started, starts_first
from hand.system.process import ProcessOutcome, Tail
from protocol import limits
from protocol.codes import CancelReason, CancelStatus, RejectCode
from protocol.control import Budget, Lifecycle, Termination
from protocol.messages import Accepted, Background, Message, Rejected, Result, Rpc, TaskStartValue
from protocol.states import RunState, TaskState

BIG = limits.ARGS_MAX_BYTES + 1


def ask(tool: str = "exec", **kw: object):
    base: dict[str, object] = dict(args_size=10, allowed=True, closing=False)
    return refusal("r1", tool, **{**base, **kw})  # type: ignore[arg-type]


def test_a_run_and_a_task_refused_for_the_same_reason_read_the_same_sentence() -> None:
    for kw in (dict(closing=True), dict(args_size=BIG), dict(allowed=False)):
        run = ask("exec", **kw)
        task = background_refusal(
            "exec",
            allowed=bool(kw.get("allowed", True)),
            closing=bool(kw.get("closing", False)),
            args_size=int(kw.get("args_size", 10)),  # type: ignore[call-overload]
        )
        assert run is not None and run == task, kw


def test_one_order_for_every_refusal() -> None:
    worst = dict(known=True, closing=True, state_free=0, args_size=BIG, allowed=False, no_pty="no terminals here")
    assert ask("nope", **worst).code is RejectCode.DUPLICATE_RUN  # type: ignore[union-attr]
    worst.pop("known")
    assert ask("nope", **worst) == SHUTTING_DOWN
    worst.pop("closing")
    assert ask("nope", **worst).code is RejectCode.DISK_FULL  # type: ignore[union-attr]
    worst.pop("state_free")
    assert ask("nope", **worst).code is RejectCode.UNKNOWN_TOOL  # type: ignore[union-attr]
    assert ask("read_file", background=True, **worst) == NOT_BACKGROUND
    r = ask("exec", **worst)
    assert r is not None and r.code is RejectCode.INVALID_REQUEST and f"{BIG} bytes exceed" in r.message
    worst.pop("args_size")
    r = ask("exec", **worst)
    assert (
        r is not None
        and r.code is RejectCode.DENIED_BY_POLICY
        and r.message == "tool 'exec' is denied by this hand's policy"
    )
    worst.pop("allowed")
    assert ask("exec", **worst) == refusal(
        "x", "exec", args_size=0, allowed=True, closing=False, no_pty="no terminals here"
    )
    r = ask("exec", **worst)
    assert r is not None and r.code is RejectCode.DENIED_BY_POLICY and r.message == "no terminals here"
    worst.pop("no_pty")
    assert ask("exec", **worst) is None
    assert ask("shell", background=True) is None


def test_a_full_state_disk_refuses_every_start_at_once_runs_and_tasks_alike() -> None:
    """A start the audit file (and a task's row and log) could not record does not run: refused
    `disk_full` below `STATE_ROOM_MIN` free, with the same sentence for a run and a task, and the
    sentence says how much was free. At the floor and above, nothing is refused for it; an unknown
    amount (no state disk, or `statvfs` failed) is never a refusal."""
    for free in (0, 4096, STATE_ROOM_MIN - 1):
        run = ask("exec", state_free=free)
        task = background_refusal("exec", allowed=True, closing=False, args_size=10, state_free=free)
        assert run is not None and run == task and run.code is RejectCode.DISK_FULL
        assert f"({free} bytes free" in run.message and "nothing ran" in run.message
    for free in (STATE_ROOM_MIN, None):
        assert ask("exec", state_free=free) is None
        assert background_refusal("exec", allowed=True, closing=False, args_size=10, state_free=free) is None
    book: RunBook[object] = RunBook(RecentRuns())
    r = book.refusal("r1", "exec", args_size=1, allowed=True, state_free=0)
    assert r is not None and r.code is RejectCode.DISK_FULL and not book.knows("r1")  # nothing was taken in


def test_a_background_start_is_never_a_duplicate_at_once() -> None:
    """Its duplicate is decided at the group commit (it may be the same task asked again)."""
    assert background_refusal("exec", allowed=True, closing=False, args_size=10) is None


def test_a_stream_tool_needs_exactly_its_streams() -> None:
    assert stream_refusal("put_file", wants_stdin=True, streams=True, pty=False, stdin=True) is None
    assert stream_refusal("get_file", wants_stdin=False, streams=True, pty=False, stdin=False) is None
    for streams, pty, stdin in ((False, False, False), (True, True, True), (True, False, False)):
        r = stream_refusal("put_file", wants_stdin=True, streams=streams, pty=pty, stdin=stdin)
        assert r is not None and r.code is RejectCode.INVALID_REQUEST and "with a stdin stream" in r.message
    r = stream_refusal("get_file", wants_stdin=False, streams=True, pty=False, stdin=True)
    assert r is not None and "with output streams and no stdin" in r.message


def test_the_budget_and_the_grace_of_a_run() -> None:
    assert run_limits(None) == {PROGRESS_BYTES: limits.PROGRESS_BYTES_MAX, PROGRESS_EVENTS: limits.PROGRESS_EVENTS_MAX}
    assert run_limits(3)["cpu_seconds"] == 3
    assert kill_grace(None, 5.0) == 5.0 and kill_grace(200, 5.0) == 0.2 and kill_grace(60_000, 5.0) == 5.0
    budget = Budget({PROGRESS_BYTES: 10, PROGRESS_EVENTS: 2})
    assert progress_fits(budget, 6) and not progress_fits(budget, 6)  # all or nothing: no bytes were taken
    assert budget.used(PROGRESS_EVENTS) == 1 and progress_fits(budget, 4) and not progress_fits(budget, 0)


def test_progress_is_cut_at_stable_offsets_and_dropped_past_the_caps() -> None:
    step = limits.PROGRESS_CHUNK_MAX
    offsets = {"stdout": 0, "stderr": 0}
    budget = Budget({PROGRESS_BYTES: step * 2, PROGRESS_EVENTS: 10})
    pieces = progress_pieces(offsets, "stdout", b"a" * (step * 2 + 5), budget, stopped=False)
    assert [(o, len(p), sent) for o, p, sent in pieces] == [(0, step, True), (step, step, True), (2 * step, 5, False)]
    assert offsets == {"stdout": 2 * step + 5, "stderr": 0}  # a dropped piece still moves the offset
    assert progress_pieces(offsets, "stderr", b"xy", Budget({}), stopped=True) == [(0, b"xy", False)]
    assert offsets["stderr"] == 2 and progress_pieces(offsets, "stderr", b"", Budget({}), stopped=False) == []


def test_the_truth_wins_a_command_that_exited_on_its_own_reports_its_exit() -> None:
    cancel = CancelReason.USER_REQUESTED
    assert process_end(killed=False, exit_code=0, signal=None, cancel=cancel) == RunEnd(RunState.SUCCEEDED, "")
    assert process_end(killed=False, exit_code=3, signal=None, cancel=cancel) == RunEnd(
        RunState.FAILED, "exit status 3"
    )
    assert process_end(killed=True, exit_code=None, signal=15, cancel=cancel) == RunEnd(
        RunState.CANCELLED, "user_requested"
    )
    deadline = process_end(killed=True, exit_code=None, signal=9, cancel=CancelReason.DEADLINE_EXCEEDED)
    assert deadline == RunEnd(RunState.TIMED_OUT, "deadline_exceeded")
    someone = process_end(killed=False, exit_code=None, signal=9, cancel=None)  # not our kill: not a cancel
    assert someone == RunEnd(RunState.FAILED, "killed by signal 9")


def test_a_cpu_budget_spent_is_budget_exhausted_whoever_killed_it() -> None:
    ours = process_end(killed=True, exit_code=None, signal=9, cancel=CancelReason.BUDGET_EXHAUSTED, cpu_seconds=2.0)
    assert ours == RunEnd(RunState.BUDGET_EXHAUSTED, "cpu budget of 2 s exhausted")
    kernel = process_end(killed=False, exit_code=None, signal=signal.SIGXCPU, cancel=None, cpu_seconds=2.0)
    assert kernel.state is RunState.BUDGET_EXHAUSTED and "the kernel's per-process CPU limit" in kernel.reason
    far = process_end(killed=False, exit_code=None, signal=signal.SIGKILL, cancel=None, cpu_seconds=5.0, cpu_used=0.3)
    assert far == RunEnd(RunState.FAILED, "killed by signal 9")  # an OOM kill, not a budget


def test_a_run_and_a_task_that_ended_alike_say_it_alike() -> None:
    out = ProcessOutcome(exit_code=3, signal=None, killed=False, stage=None, stdout=Tail(), stderr=Tail(), duration=1.0)
    assert ending(out, None, 1000).reason == process_end(killed=False, exit_code=3, signal=None, cancel=None).reason
    kernel = process_end(killed=False, exit_code=None, signal=signal.SIGXCPU, cancel=None, cpu_seconds=2)
    out = ProcessOutcome(None, signal.SIGXCPU, False, None, Tail(), Tail(), 1.0)
    task = ending(out, None, 1000, cpu_seconds=2)
    assert task.state is TaskState.FAILED and task.reason == kernel.reason


def test_a_stopped_run_reports_the_fact_else_its_reason() -> None:
    assert stopped(None, None) == RunEnd(RunState.CANCELLED, "shutdown")
    assert stopped(None, CancelReason.DEADLINE_EXCEEDED) == RunEnd(RunState.TIMED_OUT, "deadline_exceeded")
    fact = Termination(RunState.BUDGET_EXHAUSTED, "cpu budget of 1 s exhausted", 1.0)
    assert stopped(fact, CancelReason.BUDGET_EXHAUSTED).state is RunState.BUDGET_EXHAUSTED


def test_the_first_terminal_wins() -> None:
    life = Lifecycle()
    assert final(life, RunEnd(RunState.SUCCEEDED, ""), 1.0) is None  # it is the terminal
    assert life.termination is not None and life.termination.reason == "succeeded"
    life = Lifecycle()
    life.finish(RunState.TIMED_OUT, "deadline_exceeded", 1.0)  # the deadline set the fact first
    assert final(life, RunEnd(RunState.FAILED, "killed by signal 9"), 2.0) == RunEnd(
        RunState.TIMED_OUT, "deadline_exceeded"
    )
    assert final(life, RunEnd(RunState.TIMED_OUT, "other words"), 2.0) is None  # same state: the result stands


def test_a_start_is_answered_accepted_then_its_result_carrying_the_task() -> None:
    row = TaskRow("t1", "exec", "a" * 64, "b" * 64, TaskState.QUEUED, 1, 1000, 5.0)
    for duplicate in (False, True):
        accepted, result = started("t1", to_info(row), duplicate=duplicate)
        assert isinstance(accepted, Accepted) and accepted.run_id == "t1"
        assert isinstance(result, Result) and result.run_id == "t1" and result.state is RunState.SUCCEEDED
        value = TaskStartValue.model_validate(result.value)
        assert value.duplicate is duplicate and value.task.task_id == "t1" and value.task.state is TaskState.QUEUED


def test_a_start_is_bound_to_its_tool_arguments_and_max_runtime() -> None:
    def rpc(args: dict, max_ms: int) -> Rpc:
        return Rpc(run_id="t1", tool="exec", args=args, timeout_ms=1000, background=Background(max_runtime_ms=max_ms))

    a = start_request(rpc({"argv": ["true"]}, 1000))
    assert (a.task_id, a.tool, a.max_runtime_ms) == ("t1", "exec", 1000)
    assert start_request(rpc({"argv": ["true"]}, 1000)) == a
    longer = start_request(rpc({"argv": ["true"]}, 2000))
    assert longer.args_digest == a.args_digest and longer.binding_digest != a.binding_digest
    other = start_request(rpc({"argv": ["false"]}, 1000))
    assert other.args_digest != a.args_digest and other.binding_digest != a.binding_digest


def test_a_queued_task_whose_program_could_not_start_is_recorded_running_first() -> None:
    assert starts_first(TaskState.QUEUED, TaskState.FAILED)
    assert not starts_first(TaskState.QUEUED, TaskState.CANCELLED)  # dequeued: it never ran
    assert not starts_first(TaskState.RUNNING, TaskState.FAILED)


def test_a_run_id_is_never_run_twice_and_a_closing_book_takes_nothing_new() -> None:
    recent = RecentRuns(cap=2)
    book: RunBook[object] = RunBook(recent)
    run = object()
    assert book.refusal("r1", "exec", args_size=1, allowed=True) is None
    book.active["r1"] = run
    assert book.cancel_status("r1") is CancelStatus.CANCEL_REQUESTED
    dup = book.refusal("r1", "exec", args_size=1, allowed=True)
    assert dup is not None and dup.code is RejectCode.DUPLICATE_RUN
    assert book.end("r1", run) and not book.end("r1", run)  # one result: the second end is refused
    assert book.cancel_status("r1") is CancelStatus.ALREADY_DONE and book.knows("r1")
    other = RunBook[object](recent)  # the memory of finished ids outlives the connection
    assert other.refusal("r1", "exec", args_size=1, allowed=True) == dup
    assert other.cancel_status("r9") is CancelStatus.UNKNOWN_RUN
    recent.add("r2")
    recent.add("r3")
    assert "r1" not in recent and other.refusal("r1", "exec", args_size=1, allowed=True) is None  # bounded
    book.active["r4"] = run
    assert book.close(CancelReason.CONNECTION_LOST) == [run]
    book.close(CancelReason.SHUTDOWN)
    assert book.closing is CancelReason.CONNECTION_LOST  # the first reason stays
    assert book.refusal("r5", "exec", args_size=1, allowed=True) == SHUTTING_DOWN


# --- the shells: the same refusals, read on the wire ----------------------------------------------


def _shells(tmp_path: Path, policy: Policy) -> tuple[RunTable, TaskManager, list[Message]]:
    sent: list[Message] = []

    def spawn(coro):  # refusals happen before anything is spawned
        coro.close()
        raise AssertionError("a refused start spawned something")

    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    table = RunTable(root=root, policy=policy, send=sent.append, spawn=spawn)
    tasks = TaskManager(state_dir=tmp_path / "state", root=root, spawn=spawn, policy=policy)
    return table, tasks, sent


@pytest.mark.parametrize(
    ("policy", "args", "expect"),
    [
        (Policy(deny=frozenset({"exec"})), {"argv": ["true"]}, "tool 'exec' is denied by this hand's policy"),
        (Policy(), {"argv": ["x" * BIG]}, "bytes exceed"),
    ],
    ids=["denied", "too-large"],
)
async def test_the_shells_refuse_a_run_and_a_task_with_one_sentence(tmp_path, policy, args, expect) -> None:
    table, tasks, sent = _shells(tmp_path, policy)
    table.on_rpc(Rpc(run_id="run", tool="exec", args=args, timeout_ms=1000))
    bg = Background(max_runtime_ms=1000)
    await tasks.on_start(Rpc(run_id="task", tool="exec", args=args, timeout_ms=1000, background=bg), sent.append)
    assert [type(m) for m in sent] == [Rejected, Rejected]
    run, task = sent
    assert isinstance(run, Rejected) and isinstance(task, Rejected)
    assert expect in run.message and (run.code, run.message) == (task.code, task.message)
