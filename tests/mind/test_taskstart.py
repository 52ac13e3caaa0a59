"""The Mind's task-start decisions (`mind.core.taskstart`), fed events, asserting actions: what a
client is told, what is written before anything is sent, and who joins a start in flight."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mind.core.registry import Log, StartEnded
from mind.core.scope import Scope
from mind.core.snapshots import Snapshot
from mind.core.taskstart import (
    START_TIMEOUT_MS,
    Admit,
    DeleteSnapshot,
    Denied,
    Facts,
    FinishStart,
    InsertSnapshot,
    InternalError,
    LookUpHand,
    ReadSnapshot,
    Reply,
    ReportStart,
    Restart,
    RetryStart,
    Start,
    Step,
    TaskStarts,
)
from protocol.audit import AuditEvent
from protocol.codes import RejectCode
from protocol.digest import binding_digest
from protocol.messages import RunEnd, TaskInfo, TaskStart
from protocol.states import RunState, TaskState

D = "0" * 64
ONLINE = Facts(hand_gen=3, used_by_run=False)
OFFLINE = Facts(hand_gen=None, used_by_run=False)
WALL = 1_700_000_000.0


def request(task_id: str = "t1", hand: str = "h1", tool: str = "exec", argv: str = "true") -> TaskStart:
    return TaskStart(hand=hand, task_id=task_id, tool=tool, args={"argv": [argv]}, max_runtime_ms=60_000)


def begin(
    starts: TaskStarts[str],
    waiter: str,
    facts: Facts = ONLINE,
    req: TaskStart | None = None,
    scope: Scope | None = None,
    me: str = "ci",
) -> tuple[Start[str], Step]:
    req = req or request()
    assert req.task_id is not None
    return starts.begin(waiter, req, req.task_id, scope or Scope(), me, WALL, facts)


def replies(step: Step) -> list[tuple[str, str, RejectCode | None]]:
    return [(a.waiter, a.msg.outcome, a.msg.reject_code) for a in step.actions if isinstance(a, Reply)]


def events(step: Step) -> list[str]:
    return [a.event for a in step.actions if isinstance(a, Log)]


def sent(starts: TaskStarts[str], waiter: str = "w1") -> tuple[Start[str], Snapshot]:
    """A start that went to the Hand: its snapshot inserted, its run admitted."""
    start, step = begin(starts, waiter)
    assert isinstance(step.need, InsertSnapshot)
    after = start.on_result(None, ONLINE)
    assert [type(a) for a in after.actions] == [Admit] and after.need is None
    return start, step.need.snapshot


def info(task_id: str = "t1", version: int = 1) -> TaskInfo:
    req = request(task_id)
    return TaskInfo(
        task_id=task_id,
        tool=req.tool,
        state=TaskState.RUNNING,
        version=version,
        args_digest=D,
        binding_digest=binding_digest(req.tool, req.args, req.max_runtime_ms),
        max_runtime_ms=req.max_runtime_ms,
        created_at=1.0,
    )


def ended(state: RunState, task_id: str = "t1", **kw: Any) -> StartEnded:
    end = RunEnd(run_id=task_id, hand="h1", tool="exec", state=state, **kw)
    return StartEnded(run_id=task_id, hand="h1", end=end)


# --- a fresh start ---------------------------------------------------------------------------------


def test_a_fresh_start_is_written_stale_then_sent_as_a_background_run_on_the_live_generation() -> None:
    starts: TaskStarts[str] = TaskStarts()
    start, step = begin(starts, "w1")
    assert step.actions == () and isinstance(step.need, InsertSnapshot)
    snap = step.need.snapshot
    assert (snap.task_id, snap.hand, snap.state, snap.stale, snap.start_pending) == (
        "t1",
        "h1",
        TaskState.QUEUED,
        True,
        True,
    )
    assert (snap.created_at, snap.owner, snap.version) == (WALL, "ci", 0)
    assert not starts.in_flight("t1")  # nothing claimed before the snapshot is written
    step = start.on_result(None, ONLINE)
    (admit,) = step.actions
    assert isinstance(admit, Admit) and step.need is None
    assert (admit.waiter, admit.task_id, admit.gen, admit.owner) == ("w1", "t1", 3, "ci")
    assert admit.exec.timeout_ms == START_TIMEOUT_MS and admit.background.max_runtime_ms == 60_000
    assert starts.in_flight("t1")


def test_a_hand_that_goes_while_the_snapshot_is_written_gets_nothing_and_the_row_is_deleted() -> None:
    starts: TaskStarts[str] = TaskStarts()
    start, _ = begin(starts, "w1")
    step = start.on_result(None, OFFLINE)
    assert isinstance(step.actions[0], DeleteSnapshot) and step.need is None
    assert replies(step) == [("w1", "rejected", RejectCode.HAND_OFFLINE)]
    assert events(step) == [AuditEvent.TASK_START_REJECTED]
    assert not starts.in_flight("t1")


def test_outside_the_scope_is_denied_before_any_store_is_asked() -> None:
    starts: TaskStarts[str] = TaskStarts()
    _, step = begin(starts, "w1", scope=Scope(hands=("web*",)))
    assert step.need is None
    denied = step.actions[0]
    assert isinstance(denied, Denied) and denied.waiter == "w1" and denied.denial.fields == {"hand": "h1"}
    assert replies(step) == [("w1", "rejected", RejectCode.DENIED_BY_SCOPE)]
    reply = step.actions[-1]
    assert isinstance(reply, Reply) and reply.msg.message == "denied_by_scope: credential 'ci' may not use hand 'h1'"


# --- the rare paths: the id is held by a run, or the Hand is away ------------------------------------


def test_an_offline_hand_is_looked_up_and_an_unknown_one_is_named() -> None:
    starts: TaskStarts[str] = TaskStarts()
    start, step = begin(starts, "w1", facts=OFFLINE)
    assert step.need == ReadSnapshot("t1")
    step = start.on_result(None, OFFLINE)
    assert step.need == LookUpHand("h1")
    step = start.on_result(False, OFFLINE)
    assert replies(step) == [("w1", "rejected", RejectCode.UNKNOWN_HAND)] and step.need is None


def test_a_known_hand_that_is_offline_is_refused_with_nothing_stored() -> None:
    starts: TaskStarts[str] = TaskStarts()
    start, _ = begin(starts, "w1", facts=OFFLINE)
    start.on_result(None, OFFLINE)
    step = start.on_result(True, OFFLINE)
    assert replies(step) == [("w1", "rejected", RejectCode.HAND_OFFLINE)]
    assert not any(isinstance(a, (DeleteSnapshot, Admit)) for a in step.actions)


def test_a_hand_that_connected_during_the_read_takes_the_start() -> None:
    starts: TaskStarts[str] = TaskStarts()
    start, _ = begin(starts, "w1", facts=OFFLINE)
    step = start.on_result(None, ONLINE)  # no lookup: a connected Hand is known
    assert isinstance(step.need, InsertSnapshot)
    assert isinstance(start.on_result(None, ONLINE).actions[0], Admit)


def test_an_id_held_by_a_foreground_run_is_refused() -> None:
    starts: TaskStarts[str] = TaskStarts()
    held = Facts(hand_gen=3, used_by_run=True)
    start, step = begin(starts, "w1", facts=held)
    assert step.need == ReadSnapshot("t1")
    step = start.on_result(None, held)
    assert replies(step) == [("w1", "rejected", RejectCode.CONFLICTING_DUPLICATE)]
    reply = step.actions[-1]
    assert isinstance(reply, Reply) and reply.msg.message == "id t1 is already used by a run"


# --- an id the Mind already holds ------------------------------------------------------------------


def test_a_second_start_joins_the_one_in_flight_and_hears_duplicate_when_the_first_is_accepted() -> None:
    starts: TaskStarts[str] = TaskStarts()
    _, snap = sent(starts, "w1")
    second, step = begin(starts, "w2")
    assert isinstance(step.need, InsertSnapshot)
    assert second.on_result(snap, ONLINE) == Step()  # the insert found it: joined, no answer of its own yet
    ending, step = starts.ended(
        ended(RunState.SUCCEEDED, value={"task": info().model_dump(mode="json"), "duplicate": False})
    )
    assert step.need == ReportStart("h1", info())
    settled = replace(snap, version=1, stale=False, start_pending=False, info=info())
    step = ending.on_result((settled, "applied"))
    assert replies(step) == [("w1", "accepted", None), ("w2", "duplicate", None)]
    assert events(step) == [AuditEvent.TASK_START_ENDED]
    assert not starts.in_flight("t1")


def test_a_start_the_hand_never_answered_is_asked_again_and_retries_during_it_join() -> None:
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], stale=True, start_pending=False)
    starts.ended(ended(RunState.LOST))  # the first start's answer never came
    start, step = begin(starts, "w1")
    step = start.on_result(unanswered, ONLINE)
    assert isinstance(step.need, RetryStart) and step.need.snapshot.start_pending
    assert starts.in_flight("t1")  # claimed before the write: a second retry joins
    joiner, _ = begin(starts, "w2")
    assert joiner.on_result(unanswered, ONLINE) == Step()
    step = start.on_result(step.need.snapshot, ONLINE)
    assert events(step) == [AuditEvent.TASK_START_ASKED_AGAIN]
    assert isinstance(step.actions[-1], Admit) and step.actions[-1].waiter == "w1"


def test_a_retry_whose_row_changed_meanwhile_decides_every_waiter_again() -> None:
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], start_pending=False)
    starts.ended(ended(RunState.LOST))
    start, _ = begin(starts, "w1")
    start.on_result(unanswered, ONLINE)
    begin(starts, "w2")[0].on_result(unanswered, ONLINE)
    step = start.on_result(None, ONLINE)
    assert [(a.waiter, type(a)) for a in step.actions] == [("w1", Restart), ("w2", Restart)]
    assert not starts.in_flight("t1")


def test_a_hand_gone_during_the_retry_write_leaves_the_truth_unknown_for_every_waiter() -> None:
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], start_pending=False)
    starts.ended(ended(RunState.LOST))
    start, _ = begin(starts, "w1")
    step = start.on_result(unanswered, ONLINE)
    assert isinstance(step.need, RetryStart)
    begin(starts, "w2")[0].on_result(unanswered, ONLINE)
    step = start.on_result(step.need.snapshot, OFFLINE)
    assert step.actions[1] == FinishStart("t1")
    assert replies(step) == [("w1", "unknown", None), ("w2", "unknown", None)]
    assert not starts.in_flight("t1")


def test_a_failed_retry_write_gives_up_its_claim() -> None:
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], start_pending=False)
    starts.ended(ended(RunState.LOST))
    start, _ = begin(starts, "w1")
    start.on_result(unanswered, ONLINE)
    assert starts.in_flight("t1")
    assert start.failed(error=True) == []
    assert not starts.in_flight("t1")


def test_a_failed_retry_write_answers_the_starts_that_joined_it() -> None:
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], start_pending=False)
    starts.ended(ended(RunState.LOST))
    start, _ = begin(starts, "w1")
    start.on_result(unanswered, ONLINE)
    begin(starts, "w2")[0].on_result(unanswered, ONLINE)  # joins the retry
    assert start.failed(error=True) == [InternalError("w2")]  # w1's own shell answers w1


def test_a_fresh_insert_during_a_doomed_retry_takes_the_id_and_the_retry_decides_its_own_again() -> None:
    """Sim seed 3380 (continuity variant): a retry was claimed on a stale row; reconciliation
    deleted the row; a new start of the id inserted afresh and was sent. The retry's write then
    found no row: it decides its own waiters again and leaves the new start's waiter in place, so
    every start is answered exactly once."""
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], start_pending=False)
    starts.ended(ended(RunState.LOST))
    retry, _ = begin(starts, "w1")
    retry.on_result(unanswered, ONLINE)  # claimed, RetryStart asked
    begin(starts, "w2")[0].on_result(unanswered, ONLINE)  # joins the retry
    fresh, step = begin(starts, "w3")
    assert isinstance(step.need, InsertSnapshot)
    step = fresh.on_result(None, ONLINE)  # the row was gone: inserted
    assert [(type(a), a.waiter) for a in step.actions] == [(Admit, "w3")]
    step = retry.on_result(None, ONLINE)  # the retry's row changed
    assert [(a.waiter, type(a)) for a in step.actions] == [("w1", Restart), ("w2", Restart)]
    assert starts.in_flight("t1")
    ending, step = starts.ended(ended(RunState.REJECTED, reject_code=RejectCode.INVALID_REQUEST, reason="no"))
    assert replies(step) == [("w3", "rejected", RejectCode.INVALID_REQUEST)]
    assert not starts.in_flight("t1")


def test_an_unanswered_start_with_the_hand_away_is_unknown() -> None:
    starts: TaskStarts[str] = TaskStarts()
    unanswered = replace(sent(starts, "w0")[1], start_pending=False)
    starts.ended(ended(RunState.LOST))
    start, step = begin(starts, "w1", facts=OFFLINE)
    step = start.on_result(unanswered, OFFLINE)
    assert replies(step) == [("w1", "unknown", None)] and step.need is None


def test_a_reported_task_is_a_duplicate_and_another_binding_a_conflict() -> None:
    starts: TaskStarts[str] = TaskStarts()
    _, snap = sent(starts, "w0")
    reported = replace(snap, version=2, start_pending=False, stale=False)
    start, _ = begin(starts, "w1")
    step = start.on_result(reported, ONLINE)
    assert replies(step) == [("w1", "duplicate", None)]
    assert events(step) == [AuditEvent.TASK_START_DUPLICATE]
    other, _ = begin(starts, "w2", req=request(argv="false"))
    step = other.on_result(reported, ONLINE)
    assert replies(step) == [("w2", "rejected", RejectCode.CONFLICTING_DUPLICATE)]


def test_an_id_held_by_another_client_reads_as_taken_and_is_audited_as_a_denial() -> None:
    starts: TaskStarts[str] = TaskStarts()
    _, snap = sent(starts, "w0")
    theirs = replace(snap, owner="someone", version=1, start_pending=False)
    start, _ = begin(starts, "w1", me="ci")
    step = start.on_result(theirs, ONLINE)
    assert isinstance(step.actions[0], Denied)
    # the same answer as a conflicting start inside the scope: ids do not leak across scopes
    assert replies(step) == [("w1", "rejected", RejectCode.CONFLICTING_DUPLICATE)]
    reply = step.actions[-1]
    assert isinstance(reply, Reply) and "another hand, tool, arguments or options" in reply.msg.message


# --- how a start run ends ----------------------------------------------------------------------------


def test_a_start_the_hand_refused_deletes_its_snapshot_before_answering() -> None:
    starts: TaskStarts[str] = TaskStarts()
    sent(starts, "w1")
    _, step = starts.ended(ended(RunState.REJECTED, reject_code=RejectCode.QUOTA_EXCEEDED, reason="full"))
    assert step.actions[0] == DeleteSnapshot("t1") and step.need is None
    assert replies(step) == [("w1", "rejected", RejectCode.QUOTA_EXCEEDED)]


def test_a_start_whose_answer_never_came_is_unknown_and_left_for_reconciliation() -> None:
    starts: TaskStarts[str] = TaskStarts()
    _, snap = sent(starts, "w1")
    ending, step = starts.ended(ended(RunState.LOST, reason="hand gone"))
    assert step.need == FinishStart("t1")
    step = ending.on_result(replace(snap, start_pending=False))
    (reply,) = [a for a in step.actions if isinstance(a, Reply)]
    assert reply.msg.outcome == "unknown" and reply.msg.view is not None
    assert "(lost: hand gone)" in reply.msg.message


def test_a_malformed_answer_of_the_hand_is_logged_and_unknown() -> None:
    starts: TaskStarts[str] = TaskStarts()
    sent(starts, "w1")
    ending, step = starts.ended(ended(RunState.SUCCEEDED, value={"task": "nonsense"}))
    assert events(step) == ["task_start_bad_value"] and step.need == FinishStart("t1")
    step = ending.on_result(None)
    assert replies(step) == [("w1", "unknown", None)]


def test_an_answer_about_another_task_is_not_adopted() -> None:
    starts: TaskStarts[str] = TaskStarts()
    sent(starts, "w1")
    ending, step = starts.ended(ended(RunState.SUCCEEDED, value={"task": info("t9").model_dump(mode="json")}))
    assert events(step) == [] and step.need == FinishStart("t1")


def test_settling_that_fails_answers_every_waiter_with_internal_error_but_not_when_cancelled() -> None:
    starts: TaskStarts[str] = TaskStarts()
    _, snap = sent(starts, "w1")
    begin(starts, "w2")[0].on_result(snap, ONLINE)
    ending, _ = starts.ended(ended(RunState.LOST))
    assert ending.failed(error=True) == [InternalError("w1"), InternalError("w2")]
    assert ending.failed(error=False) == []


def test_an_answer_to_a_start_that_asked_nothing_is_a_bug_not_a_guess() -> None:
    starts: TaskStarts[str] = TaskStarts()
    start, _ = sent(starts, "w1")
    with pytest.raises(ValueError, match="no answer is awaited"):
        start.on_result(None, ONLINE)
