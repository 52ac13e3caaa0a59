"""The order of background admission (`hand.core.tasks.Admissions`) and the answers a start gets:
the pure rules the Hand's TaskManager performs and the simulation drives."""

from __future__ import annotations

from hand.core.rows import TaskRow
from hand.core.tasks import (
    SHUTTING_DOWN,
    Admission,
    Admissions,
    Duplicate,
    Queued,
    Refused,
    StartRequest,
    Verdict,
    admit_batch,
    answer_for,
    background_refusal,
    store_failed,
)
from protocol import limits
from protocol.codes import RejectCode
from protocol.states import TaskState


def row(task_id: str, binding: str = "b") -> TaskRow:
    return TaskRow(task_id, "exec", "a", binding, TaskState.QUEUED, 1, 1000, 0.0)


def test_one_batch_at_a_time_and_a_batch_is_what_arrived_meanwhile() -> None:
    adm: Admissions[str] = Admissions()
    assert not adm.deciding()
    adm.take("s1")
    assert adm.needs_drainer() and adm.deciding()
    adm.drainer_started()
    adm.take("s2")
    assert not adm.needs_drainer(), "one drainer: a second start joins the waiting ones"
    assert adm.next_batch() == ["s1", "s2"]
    assert adm.deciding(), "a batch being decided is still deciding, with nothing waiting"
    adm.take("s3")  # arrives while the batch is committed
    adm.take("s4")
    assert adm.next_batch() == ["s3", "s4"], "arrival order, all that came in meanwhile"
    assert adm.next_batch() is None
    assert adm.deciding(), "until the drainer says it is gone"
    adm.drainer_ended()
    assert not adm.deciding() and adm.needs_drainer()


def test_a_drainer_cancelled_midway_leaves_the_waiting_starts_for_the_next_one() -> None:
    adm: Admissions[str] = Admissions()
    adm.take("s1")
    adm.drainer_started()
    assert adm.next_batch() == ["s1"]
    adm.take("s2")
    adm.drainer_ended()  # cancelled with its owner before it took s2
    assert adm.deciding() and adm.needs_drainer() and adm.backlog() == 1
    assert adm.abandon() == ["s2"]
    assert not adm.deciding()


def test_answers_follow_the_verdicts() -> None:
    req = StartRequest("t1", "exec", "a", "b", 1000)
    (v,) = admit_batch([req], {}, 0, 10, 5.0)
    assert answer_for(v, "t1", 10) == Queued(v.row)  # type: ignore[arg-type]
    dup = Verdict(Admission.DUPLICATE, row("t1"), 1)
    assert answer_for(dup, "t1", 10) == Duplicate(row("t1"))
    conflict = answer_for(Verdict(Admission.CONFLICT, None, 1), "t1", 10)
    assert isinstance(conflict, Refused) and conflict.code is RejectCode.CONFLICTING_DUPLICATE
    assert "t1" in conflict.message
    quota = answer_for(Verdict(Admission.OVER_QUOTA, None, 10), "t1", 10)
    assert isinstance(quota, Refused) and quota.code is RejectCode.QUOTA_EXCEEDED
    assert "10 tasks (max 10)" in quota.message


def test_a_second_start_with_the_same_id_in_one_batch_is_its_duplicate_or_conflict() -> None:
    a = StartRequest("t1", "exec", "a", "b", 1000)
    same = StartRequest("t1", "exec", "a", "b", 1000)
    other = StartRequest("t1", "exec", "a", "other", 1000)
    verdicts = admit_batch([a, same, other], {}, 0, 10, 1.0)
    answers = [answer_for(v, "t1", 10) for v in verdicts]
    assert isinstance(answers[0], Queued) and isinstance(answers[1], Duplicate)
    assert isinstance(answers[2], Refused) and answers[2].code is RejectCode.CONFLICTING_DUPLICATE


def test_refusals_before_anything_is_stored_come_in_a_fixed_order() -> None:
    assert background_refusal("exec", allowed=False, closing=True, args_size=10**9) == SHUTTING_DOWN
    r = background_refusal("read_file", allowed=False, closing=False, args_size=10**9)
    assert r is not None and r.code is RejectCode.INVALID_REQUEST and "background" in r.message
    r = background_refusal("exec", allowed=False, closing=False, args_size=limits.ARGS_MAX_BYTES + 1)
    assert r is not None and r.code is RejectCode.INVALID_REQUEST and "bytes exceed" in r.message
    r = background_refusal("exec", allowed=False, closing=False, args_size=1)
    assert r is not None and r.code is RejectCode.DENIED_BY_POLICY
    assert background_refusal("shell", allowed=True, closing=False, args_size=limits.ARGS_MAX_BYTES) is None


def test_a_failed_commit_refuses_with_the_reason() -> None:
    """A disk that filled between the admission's look and the commit is `disk_full`, as a start
    refused at once for it is (SQLite says SQLITE_FULL, the OS ENOSPC or EDQUOT); anything else is
    an internal error, with its reason."""
    import sqlite3

    r = store_failed(OSError(28, "No space left on device"))
    assert r.code is RejectCode.DISK_FULL and "No space left" in r.message and "nothing was stored" in r.message
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"  # as sqlite3 sets it (Python 3.11+)
    assert store_failed(full).code is RejectCode.DISK_FULL
    r = store_failed(sqlite3.OperationalError("database is locked"))
    assert r.code is RejectCode.INTERNAL_ERROR and "database is locked" in r.message
