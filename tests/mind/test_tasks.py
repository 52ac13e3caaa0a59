"""Snapshot rules and the reconciliation plan (pure), plus the SQLite store applying them."""

from dataclasses import replace

import pytest

from mind.core.snapshots import UNKNOWN_TO_HAND, Snapshot, apply_report, mark_stale, reconcile
from mind.store.snapshots import SnapshotStore
from protocol.messages import TaskInfo
from protocol.states import TaskState

D = "0" * 64


def info(task_id="t1", state=TaskState.RUNNING, version=2, **kw):
    return TaskInfo(
        task_id=task_id,
        tool="exec",
        state=state,
        version=version,
        args_digest=D,
        binding_digest=D,
        max_runtime_ms=1000,
        created_at=1.0,
        **kw,
    )


def snap(task_id="t1", state=TaskState.QUEUED, version=1, stale=False, **kw):
    return Snapshot(
        task_id=task_id,
        hand="h",
        tool="exec",
        args_digest=D,
        binding_digest=D,
        state=state,
        stale=stale,
        created_at=1.0,
        version=version,
        **kw,
    )


def test_newer_report_applies_and_is_fresh():
    s = apply_report(snap(stale=True), info(version=2), now=5.0)
    assert s.state is TaskState.RUNNING and not s.stale and s.last_synced_at == 5.0 and s.version == 2


def test_older_report_is_ignored_whatever_the_order():
    s = snap(state=TaskState.SUCCEEDED, version=3)
    assert apply_report(s, info(version=2, state=TaskState.RUNNING), 5.0) is None


def test_same_report_twice_changes_nothing():
    s = apply_report(snap(), info(), 5.0)
    assert apply_report(s, info(), 6.0) is None


def test_terminal_snapshot_is_never_stale():
    assert mark_stale(snap(state=TaskState.SUCCEEDED, version=4)) is None
    assert mark_stale(snap(state=TaskState.RUNNING)).stale


def test_reconcile_realigns_loses_adopts_and_delivers_cancels():
    snaps = [
        snap("known", stale=True),
        snap("gone", state=TaskState.RUNNING, stale=True),
        snap("purged", state=TaskState.SUCCEEDED, version=5),
        snap("cancelme", state=TaskState.RUNNING, stale=True, cancel_pending="user_requested"),
    ]
    rows = {
        "known": info("known", TaskState.SUCCEEDED, 4, exit_code=0),
        "cancelme": info("cancelme", TaskState.RUNNING, 2),
        "new": info("new", TaskState.RUNNING, 2),
        "theirs": info("theirs", TaskState.RUNNING, 2),
        "inflight": info("inflight", TaskState.QUEUED, 1),
    }
    plan = reconcile("h", snaps, rows, {"theirs": "other-hand", "inflight": "h"}, now=9.0)
    by_id = {s.task_id: s for s in plan.writes}
    assert by_id["known"].state is TaskState.SUCCEEDED and not by_id["known"].stale
    assert by_id["gone"].state is TaskState.LOST and by_id["gone"].reason == UNKNOWN_TO_HAND
    assert "purged" not in by_id  # terminal and purged by the Hand's retention: stays as it was
    assert [a.task_id for a in plan.adopted] == ["new"]
    assert plan.foreign == ["theirs"] and "inflight" not in by_id
    assert plan.cancels == [("cancelme", "user_requested")]
    # idempotent: the same inventory against the result changes nothing
    after = [by_id.get(s.task_id, s) for s in snaps] + plan.adopted
    again = reconcile("h", after, rows, {"theirs": "other-hand", "inflight": "h"}, now=10.0)
    assert again.writes == [] and again.foreign == ["theirs"]


def test_mind_decided_lost_never_changes():
    lost = replace(snap(state=TaskState.LOST, version=0), reason=UNKNOWN_TO_HAND)
    assert apply_report(lost, info(version=1), 5.0) is None


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(tmp_path / "mind.db")
    yield s
    s.close()


def test_store_round_trip_and_staleness(store):
    assert store.insert_new(snap("a", stale=True, start_pending=True)) is None
    assert store.insert_new(snap("a")) is not None  # exists: nothing written
    got, what = store.report("h", info("a", version=2), 3.0)
    assert what == "updated" and got.state is TaskState.RUNNING and not got.stale and not got.start_pending
    assert store.mark_hand_stale("h") == 1 and store.get("a").stale
    got, what = store.report("other", info("a", version=3), 4.0)
    assert what == "foreign" and store.get("a").version == 2
    store.report("h", info("a", TaskState.SUCCEEDED, 5), 5.0)
    assert store.mark_all_stale() == 0  # terminal snapshots never go stale


def test_store_reconcile_in_one_transaction(store):
    for i in range(50):
        store.insert_new(snap(f"t{i:03}", state=TaskState.RUNNING, stale=True))
    rows = {f"t{i:03}": info(f"t{i:03}", TaskState.SUCCEEDED, 3) for i in range(0, 50, 2)}
    plan = store.reconcile("h", rows, 7.0)
    assert len(plan.updated) == 25 and len(plan.lost) == 25
    states = {s.task_id: s.state for s in store.list(limit=100)}
    assert states["t000"] is TaskState.SUCCEEDED and states["t001"] is TaskState.LOST
    assert store.reconcile("h", rows, 8.0).writes == []
