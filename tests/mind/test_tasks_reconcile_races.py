"""Regressions for two races the deterministic simulation found in the reconciliation pass
(`tests/sim`; replayed there as scripted scenarios).

1. The inventory is read page by page. A task started DURING the pass, with an id that sorts into
   a page already read, is in no page, although the Hand reported it meanwhile (start result,
   `task_update`). The pass declared it `lost` ("unknown to hand").
2. That `lost` kept the snapshot's version (> 0), and `apply_report` protected only version-0
   terminals: the next report of the task overwrote the terminal (lost -> succeeded).
"""

from dataclasses import replace

from mind.core.snapshots import UNKNOWN_TO_HAND, Snapshot, apply_report, reconcile
from mind.store.snapshots import SnapshotStore
from protocol.messages import TaskInfo
from protocol.states import TaskState

D = "0" * 64


def info(task_id: str, state: TaskState, version: int) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tool="exec",
        state=state,
        version=version,
        args_digest=D,
        binding_digest=D,
        max_runtime_ms=1000,
        created_at=1.0,
    )


def snap(task_id: str, state: TaskState, version: int, stale: bool, synced: float | None) -> Snapshot:
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
        last_synced_at=synced,
    )


def test_a_task_reported_during_the_pass_is_not_declared_lost() -> None:
    started_meanwhile = snap("t0", TaskState.RUNNING, 2, stale=False, synced=10.0)
    gone_before = snap("t9", TaskState.RUNNING, 2, stale=True, synced=5.0)
    plan = reconcile("h", [started_meanwhile, gone_before], {}, {}, now=11.0, synced_since=9.0)
    assert [s.task_id for s in plan.lost] == ["t9"]  # synced before the pass: still unknown to hand
    assert plan.unchanged == 1


def test_without_a_pass_start_every_missing_unfinished_task_is_lost() -> None:
    plan = reconcile("h", [snap("t0", TaskState.RUNNING, 2, stale=False, synced=10.0)], {}, {}, now=11.0)
    assert [s.task_id for s in plan.lost] == ["t0"]


def test_a_lost_the_mind_decided_never_changes_whatever_its_version() -> None:
    lost = replace(snap("t0", TaskState.LOST, 2, stale=False, synced=11.0), reason=UNKNOWN_TO_HAND)
    assert apply_report(lost, info("t0", TaskState.SUCCEEDED, 3), 12.0) is None


def test_the_store_passes_the_pass_start_on(tmp_path) -> None:
    store = SnapshotStore(tmp_path / "mind.db")
    try:
        store.insert_new(snap("t0", TaskState.QUEUED, 0, stale=True, synced=None))
        store.report("h", info("t0", TaskState.RUNNING, 2), 10.0)  # the start, during the pass
        plan = store.reconcile("h", {}, 11.0, synced_since=9.0)
        assert plan.lost == [] and store.get("t0").state is TaskState.RUNNING
        store.report("h", info("t0", TaskState.SUCCEEDED, 3), 12.0)
        assert store.get("t0").state is TaskState.SUCCEEDED
    finally:
        store.close()
