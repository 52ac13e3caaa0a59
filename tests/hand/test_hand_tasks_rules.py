"""The task manager's decisions as plain functions, the head-bounded log and the store's rules."""

from __future__ import annotations

import os
import stat

import pytest

from hand.core.rows import TaskRow, to_info
from hand.core.tasks import (
    Admission,
    CancelAction,
    admit,
    at_eof,
    cancel_action,
    ending,
    lost_reason,
    next_to_start,
    page_length,
    purge_cutoff,
    removal,
)
from hand.system.process import ProcessOutcome, Tail
from hand.system.taskdb import TaskStore
from hand.system.tasklogs import LogSink
from protocol.codes import CancelReason, ErrorCode, KillStage
from protocol.states import IllegalTransition, TaskState


def row(task_id: str = "t", state: TaskState = TaskState.QUEUED, binding: str = "b" * 64, **kw) -> TaskRow:
    return TaskRow(
        task_id=task_id,
        tool="shell",
        args_digest="a" * 64,
        binding_digest=binding,
        state=state,
        version=1,
        max_runtime_ms=1000,
        created_at=1.0,
        **kw,
    )


def outcome(exit_code=None, signal=None, killed=False, stage=None) -> ProcessOutcome:
    return ProcessOutcome(exit_code, signal, killed, stage, Tail(), Tail(), 0.1)


def test_admission_duplicate_conflict_quota():
    assert admit(row(), "b" * 64, retained=5, max_retained=1) is Admission.DUPLICATE  # quota never blocks a duplicate
    assert admit(row(), "c" * 64, retained=0, max_retained=9) is Admission.CONFLICT
    assert admit(None, "b" * 64, retained=2, max_retained=2) is Admission.OVER_QUOTA
    assert admit(None, "b" * 64, retained=1, max_retained=2) is Admission.INSERT
    assert purge_cutoff(100.0, 30.0) == 70.0


def test_next_to_start_is_fifo_and_bounded():
    assert next_to_start(["a", "b", "c"], running=1, max_running=3) == ["a", "b"]
    assert next_to_start(["a"], running=3, max_running=2) == []


def test_ending_the_truth_wins():
    assert ending(outcome(0), CancelReason.USER_REQUESTED, 1000).state is TaskState.SUCCEEDED  # exited first
    e = ending(outcome(3), None, 1000)
    assert (e.state, e.reason, e.exit_code) == (TaskState.FAILED, "exit status 3", 3)
    assert ending(outcome(None, 9), None, 1000).reason == "killed by signal 9"
    e = ending(outcome(None, 15, True, KillStage.TERM), CancelReason.DEADLINE_EXCEEDED, 1500)
    assert (e.state, e.stage) == (TaskState.TIMED_OUT, KillStage.TERM) and "1500 ms" in e.reason
    e = ending(outcome(None, 9, True, KillStage.KILL), CancelReason.SHUTDOWN, 1000)
    assert (e.state, e.reason) == (TaskState.CANCELLED, "shutdown")
    e = ending(None, None, 1000, "cannot start x: No such file or directory")
    assert e.state is TaskState.FAILED and e.error.startswith("cannot start")


def test_cancel_actions_and_reasons():
    assert cancel_action(True, False, None) is CancelAction.DEQUEUE
    assert cancel_action(False, True, None) is CancelAction.KILL
    assert cancel_action(False, False, None) is CancelAction.UNKNOWN
    assert cancel_action(False, False, row(state=TaskState.SUCCEEDED)) is CancelAction.ALREADY_DONE
    assert lost_reason(False) == "hand restarted before completion"
    assert lost_reason(True).endswith("its leftover processes were killed")


def test_log_pages_and_eof():
    assert page_length(0, 100, 40) == 40 and page_length(50, 100, 40) == 0 and page_length(10, 5, 40) == 5
    assert at_eof(40, 40, terminal=True) and not at_eof(40, 40, terminal=False) and not at_eof(30, 40, True)


def test_log_sink_keeps_the_head_and_flags_truncation_only_past_the_cap(tmp_path):
    path = tmp_path / "t.log"
    sink = LogSink(path, cap=6)
    sink.append(b"abc")
    sink.append(b"def")
    assert (sink.size, sink.truncated) == (6, False)  # exactly at the cap: nothing lost yet
    sink.append(b"g")
    sink.append(b"h")
    assert (sink.size, sink.truncated) == (6, True)
    sink.close()
    assert path.read_bytes() == b"abcdef" and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_store_bumps_version_on_every_change_and_refuses_illegal_transitions(tmp_path):
    store = TaskStore(tmp_path / "state")
    try:
        store.insert(row())
        assert store.update("t", log_bytes=5).version == 2  # not a transition, still a change
        r = store.update("t", state=TaskState.RUNNING, started_at=2.0, pid=123, pid_start_time=456)
        assert r.version == 3 and r.pid_start_time == 456
        done = store.update("t", state=TaskState.TIMED_OUT, stage=KillStage.KILL, finished_at=3.0)
        assert store.get("t") == done and done.version == 4
        with pytest.raises(IllegalTransition):
            store.update("t", state=TaskState.SUCCEEDED)
        assert store.get("t").version == 4  # nothing written
        info = to_info(done)
        assert info.state is TaskState.TIMED_OUT and info.stage is KillStage.KILL and info.version == 4
        store.insert(row("u"))
        assert [r.task_id for r in store.page(None, 1)] == ["t"] and [r.task_id for r in store.page("t", 5)] == ["u"]
        assert store.purge(finished_before=3.5) == ["t"] and store.count() == 1  # terminal and old only
    finally:
        store.close()


def test_only_a_finished_task_whose_outcome_is_on_disk_may_be_removed():
    """`mind task rm`: a queued or running task is cancelled first, never removed (nothing that
    runs loses its record or its log); an outcome held in memory for a full disk is not thrown away
    with its row; an unknown id says so. A terminal row held by a runner still finishing is done."""
    done = row(state=TaskState.SUCCEEDED)
    assert removal("t", done, live=None, uncommitted=False) is None
    assert removal("t", done, live=TaskState.SUCCEEDED, uncommitted=False) is None  # its runner is finishing
    for live, stored in ((TaskState.RUNNING, row(state=TaskState.RUNNING)), (TaskState.QUEUED, row()), (None, row())):
        err = removal("t", stored, live=live, uncommitted=False)
        assert err is not None and err.code is ErrorCode.NOT_ALLOWED, live
        assert f"task t is {(live or stored.state).value}" in err.message and "mind task cancel t" in err.message
    kept = removal("t", row(state=TaskState.RUNNING), live=None, uncommitted=True)
    assert kept is not None and kept.code is ErrorCode.NOT_ALLOWED and "could not record its outcome" in kept.message
    unknown = removal("t", None, live=None, uncommitted=False)
    assert unknown is not None and unknown.code is ErrorCode.UNKNOWN_TASK


def test_the_store_removes_a_finished_row_and_its_logs_and_nothing_else(tmp_path):
    store = TaskStore(tmp_path / "state")
    try:
        store.insert_many([row("t"), row("u")])
        store.update("t", state=TaskState.RUNNING, started_at=1.5)
        store.update("t", state=TaskState.FAILED, exit_code=2, finished_at=2.0)
        for task_id in ("t", "u"):
            for path in store.log_paths(task_id):
                path.write_bytes(b"x")
        assert store.remove("u") is None  # queued: its row and its log stay
        assert store.get("u") is not None and all(p.exists() for p in store.log_paths("u"))
        gone = store.remove("t")
        assert gone is not None and gone.state is TaskState.FAILED and gone.exit_code == 2
        assert store.get("t") is None and not any(p.exists() for p in store.log_paths("t"))
        assert store.remove("t") is None and store.remove("nope") is None and store.count() == 1
    finally:
        store.close()
