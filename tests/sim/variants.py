"""The code as it was before the fixes the simulation led to, runnable in the simulation.

`scripts/sim --variant NAME` and the tests run these to show that the checker finds each bug, and
that the fix is what makes the seeds pass:
- `mind-before-fix`: `mind.daemon.taskservice` before this change. The reconciliation pass declared `lost` a task
  started DURING the pass whose id sorted into an inventory page already read, and a Mind-decided
  `lost` could later be overwritten by a report (its version was > 0): a terminal changed.
- `hand-before-fix`: `hand/aio/tasks.py` before its inventory waited for admissions: a start still in admission
  when its connection dropped is missing from the next connection's inventory, so the Mind declares
  it `lost` ("unknown to hand") while the Hand runs it.

- `hand-batch-before-fix`: `hand/` as the group commit first shipped: the Hand's reader answered a run
  `cancel` at once, even for a task start still being decided (`unknown_run`: the Mind called the
  start `lost` and kept a stale `queued` snapshot), and waiting starts were decided in the CALLER's
  task, so a reader cancelled mid-commit stranded a committed batch (`HandProcess.
  cancel_waits_for_starts`, `HandTasks.admit_in_owner`, both False here).

And the code as issue 22 ("Continuity") is being built:
- `continuity`: each seed's Mind has a resume window (5, 20 or 60 s); Hands keep their runs across a
  drop (`sim.continuity_hand`), clients on links of their own resume and re-attach
  (`sim.stream_clients`), streamed runs go through the real stream endpoints, and the continuity
  invariants are checked too (`sim.continuity_checker`).
- `continuity-result-before-ack`: the same, with a Hand that sends its result once its output's end
  is SENT (as `hand/aio/streams.py` does today) instead of acknowledged: a client away at that
  moment loses the tail (about half the seeds).

And issue 27 ("Many Minds", DESIGN §16):
- `nodes`: a world of its own (`sim.nodes_world`): two Mind nodes, each with the real
  `mind.core.nodes.NodeCore` and a lease clock, one simulated database with its own clock, Hands
  that hold both addresses and move, and the faults of a node (kill, freeze past its lease) and of
  its links (node<->database cut or slow, Hand<->node cut or blackholed); `sim.nodes_checker`.
"""

from __future__ import annotations

from dataclasses import replace

from sim.continuity_hand import ContinuityHand, HandResultBeforeAck
from sim.continuity_mind import ContinuityMind
from sim.hand_agent import HandProcess
from sim.hand_tasks import HandTasks
from sim.nodes_world import NodesWorld
from sim.simulation import Rules
from sim.stream_clients import Continuity

from mind.core.snapshots import Snapshot, reconcile
from protocol.messages import TaskInfo
from protocol.states import TASK_TERMINAL


def apply_report_before_fix(snap: Snapshot, info: TaskInfo, now: float) -> Snapshot | None:
    if info.version < snap.version:
        return None
    if info.version == snap.version and not snap.stale and snap.info == info:
        return None
    if snap.terminal and snap.version == 0:
        return None
    cancel_pending = None if info.state in TASK_TERMINAL else snap.cancel_pending
    return replace(
        snap,
        state=info.state,
        stale=False,
        last_synced_at=now,
        version=info.version,
        info=info,
        cancel_pending=cancel_pending,
        start_pending=False,
        tool=info.tool,
    )


def reconcile_before_fix(hand, snapshots, hand_rows, held_elsewhere, now, synced_since=None):  # type: ignore[no-untyped-def]
    return reconcile(hand, snapshots, hand_rows, held_elsewhere, now)


class HandBeforeFix(HandTasks):
    """`hand/aio/tasks.py` before the fix: the inventory did not wait for admissions in flight."""

    inventory_waits_for_admissions = False


class HandTasksAdmittingInCaller(HandTasks):
    admit_in_owner = False


class HandCancelAtOnce(HandProcess):
    cancel_waits_for_starts = False


RESUME_WINDOWS = (5.0, 20.0, 60.0)
"""The continuity variant's windows, one per seed: most outages outlast 5 s, few outlast 60 s."""

CONTINUITY = Rules(
    hand_cls=ContinuityHand,
    mind_cls=ContinuityMind,
    resume_windows=RESUME_WINDOWS,
    extension=Continuity,
    variant="continuity",
)

VARIANTS: dict[str, Rules] = {
    "fixed": Rules(),
    "mind-before-fix": Rules(
        reconcile=reconcile_before_fix, apply_report=apply_report_before_fix, variant="mind-before-fix"
    ),
    "hand-before-fix": Rules(hand_tasks_cls=HandBeforeFix, variant="hand-before-fix"),
    "hand-batch-before-fix": Rules(
        hand_tasks_cls=HandTasksAdmittingInCaller, hand_cls=HandCancelAtOnce, variant="hand-batch-before-fix"
    ),
    "continuity": CONTINUITY,
    "continuity-result-before-ack": replace(
        CONTINUITY, hand_cls=HandResultBeforeAck, variant="continuity-result-before-ack"
    ),
    "nodes": Rules(world=NodesWorld, variant="nodes"),
}
