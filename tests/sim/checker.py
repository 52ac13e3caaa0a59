"""The invariants (DESIGN §3, §5, §7, §8), checked while the simulation runs and after it settles.

Always (after every event):
- one terminal per run: the Mind registry ends each run once, the Hand concludes each run once, a
  client gets at most one `run_end` per run and nothing after it;
- terminals never change: a terminal snapshot stays exactly as it is and never disappears; the
  Hand's rows change only through the legal transitions, one version at a time;
- nothing is executed twice: every start of a command is counted where it happens (`jobs.py`);
- a Hand message moves a run only if it came on the generation the run was sent on;
- progress never moves a state;
- a snapshot never claims a state the Hand did not have at that version (only the Mind-decided
  `lost`, "unknown to hand", is the Mind's own), and a start run succeeds only for a stored row;
- a cancel answered `already_done` carries a terminal task;
- while a Hand has no connection, its unfinished tasks are shown `stale` (never a fresh-looking
  copy that may be out of date).

Once reconciled (after the quiesce phase): every run and task ended; every snapshot is fresh,
has no cancel or start pending, and equals the Hand's row (state, version, exit fields); a
snapshot the Hand does not have is the Mind-decided `lost` or the last thing the Hand had before
purging it; every Hand row is known to the Mind; every request of a still-connected client got
exactly one answer, and every `run_end` agrees with the registry.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from sim.clients import Request, SimClient

from hand.core.rows import TaskRow, to_info
from mind.core.registry import Log, RunRegistry, SendToClient, StartEnded
from mind.core.snapshots import UNKNOWN_TO_HAND, Plan, Snapshot
from protocol.codes import TaskCancelStatus
from protocol.messages import (
    CancelRunResult,
    Message,
    RunEnd,
    RunOutput,
    RunUpdate,
    TaskCancelReply,
    TaskCancelResult,
    TaskInfo,
    TaskStartResult,
)
from protocol.states import RUN_TERMINAL, TASK_TERMINAL, RunState, TaskState

if TYPE_CHECKING:
    from sim.simulation import World

EXIT_FIELDS = ("state", "version", "exit_code", "signal", "stage", "reason", "error", "started_at", "finished_at")


class InvariantViolation(BaseException):
    """A BaseException, so that no `except Exception` of the simulated code can swallow it."""

    def __init__(self, invariant: str, detail: str, seed: int, step: int, replay: str) -> None:
        self.invariant = invariant
        self.detail = detail
        self.seed = seed
        self.step = step
        self.replay = replay
        super().__init__(f"invariant '{invariant}' violated at seed {seed}, step {step}: {detail}\n  replay: {replay}")


class Checker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.rows: dict[tuple[str, str], dict[int, TaskRow]] = {}
        """Every version of every row each Hand ever had (the Hand's history)."""
        self.purged: dict[tuple[str, str], TaskRow] = {}
        self.mind_ends: dict[tuple[int, str], RunState] = {}
        """(life of the Mind, run id) -> terminal: a restarted registry may reuse a task id."""
        self.hand_ends: dict[tuple[str, str], RunState] = {}
        self.sent_gen: dict[tuple[int, str], int] = {}
        self.executions: Counter[tuple[str, str, str]] = Counter()
        self.terminal_snaps: dict[str, Snapshot] = {}
        self.notes: Counter[str] = Counter()

    def fail(self, invariant: str, detail: str) -> None:
        w = self.world
        raise InvariantViolation(invariant, detail, w.seed, w.step_no, w.replay_command())

    # --- hooks: the Hand ------------------------------------------------------------------------

    def on_exec(self, key: tuple[str, str, str]) -> None:
        self.executions[key] += 1
        self.notes[f"exec:{key[1]}"] += 1
        if self.executions[key] > 1:
            self.fail("no task executed twice", f"{key[1]} {key[2]} on {key[0]} started {self.executions[key]} times")

    def on_row_change(self, hand: str, task_id: str, row: TaskRow | None, what: str) -> None:
        key = (hand, task_id)
        hist = self.rows.setdefault(key, {})
        if what == "purge":
            if hist:
                self.purged[key] = hist[max(hist)]
            return
        assert row is not None
        if what == "insert":
            if key in self.purged:  # an id reused after its row was purged: a new task
                del self.purged[key]
                hist.clear()
            elif hist:
                self.fail("one row per task", f"{task_id} inserted twice on {hand}")
        else:
            prev = hist.get(row.version - 1)
            if prev is None or row.version in hist:
                self.fail("version + 1 on each row change", f"{task_id} on {hand}: v{row.version} after {sorted(hist)}")
            if prev.state in TASK_TERMINAL:
                self.fail("terminals never change", f"hand row {task_id} on {hand}: {prev.state} -> {row.state}")
        hist[row.version] = row
        if row.state in TASK_TERMINAL:
            self.notes[f"task:{row.state.value}"] += 1

    def on_hand_run_end(self, hand: str, run_id: str, state: RunState) -> None:
        if (hand, run_id) in self.hand_ends:
            self.fail("one terminal per run", f"hand {hand} concluded {run_id} twice")
        self.hand_ends[(hand, run_id)] = state

    # --- hooks: the Mind ------------------------------------------------------------------------

    def on_rpc_sent(self, life: int, run_id: str, gen: int) -> None:
        self.sent_gen.setdefault((life, run_id), gen)

    def on_mind_log(self, life: int, log: Log) -> None:
        ext = self.world.ext
        if ext is not None:
            ext.checker.on_mind_log(life, log)
        if log.event in ("run_rebound", "run_adopted"):
            # continuity (DESIGN §15): the run speaks on its Hand's new generation from now on
            self.sent_gen[(life, log.fields["run_id"])] = log.fields["gen"]
            return
        if log.event == "run_admitted":
            # A task's start run sent again after its first ended unanswered or refused (the only
            # admission of a known id the registry allows) is a new run under the same id.
            self.mind_ends.pop((life, log.fields["run_id"]), None)
            self.sent_gen.pop((life, log.fields["run_id"]), None)
            return
        if log.event != "run_terminal":
            return
        key = (life, log.fields["run_id"])
        if key in self.mind_ends:
            self.fail(
                "one terminal per run", f"registry ended {key[1]} twice: {self.mind_ends[key]}, {log.fields['state']}"
            )
        self.mind_ends[key] = RunState(log.fields["state"])
        self.notes[f"run:{log.fields['state']}"] += 1

    @staticmethod
    def run_state(registry: RunRegistry, run_id: str) -> RunState | None:
        run = registry.get(run_id)
        return run.state if run is not None else None

    def on_hand_input(
        self, life: int, registry: RunRegistry, msg: Message, hand: str, gen: int, before: RunState | None
    ) -> None:
        run_id = msg.run_id  # type: ignore[attr-defined]
        after = self.run_state(registry, run_id)
        sent = self.sent_gen.get((life, run_id))
        if after != before and sent != gen:
            self.fail(
                "results only from the accepting generation",
                f"{msg.TYPE} on {hand} gen{gen} moved {run_id} {before} -> {after} (sent on gen{sent})",
            )
        if before in RUN_TERMINAL and after != before:
            self.fail("terminals never change", f"{run_id}: {before} -> {after}")

    def on_progress(self, registry: RunRegistry, run_id: str, before: RunState | None, acts: list[Any]) -> None:
        after = self.run_state(registry, run_id)
        if after != before or any(not (isinstance(a, SendToClient) and isinstance(a.msg, RunOutput)) for a in acts):
            self.fail("progress never changes a state", f"progress for {run_id}: {before} -> {after}, {acts}")

    def on_start_ended(self, a: StartEnded) -> None:
        if a.end.state is RunState.SUCCEEDED and (a.hand, a.run_id) not in self.rows:
            self.fail("a start succeeds only once the row is stored", f"task {a.run_id} on {a.hand}")

    def on_reply(self, hand: str, msg: Message) -> None:
        if isinstance(msg, TaskCancelResult) and msg.status is TaskCancelStatus.ALREADY_DONE:
            if msg.task is None or msg.task.state not in TASK_TERMINAL:
                state = msg.task.state if msg.task else None
                self.fail(
                    "already_done only for an ended task", f"{hand} answered already_done for {msg.task_id} in {state}"
                )

    def on_reconciled(self, hand: str, gen: int, plan: Plan) -> None:
        self.notes["reconcile"] += 1
        self.notes["reconcile_lost"] += len(plan.lost)
        self.notes["reconcile_adopted"] += len(plan.adopted)
        self.notes["reconcile_cancels"] += len(plan.cancels)

    # --- hooks: clients -------------------------------------------------------------------------

    def on_client_msg(self, client: SimClient, req: Request, msg: Message) -> None:
        if isinstance(msg, TaskStartResult):
            self.notes[f"start:{msg.outcome}" + (f":{msg.reject_code.value}" if msg.reject_code else "")] += 1
        elif isinstance(msg, TaskCancelReply):
            self.notes[f"task_cancel:{msg.status.value}"] += 1
        elif isinstance(msg, CancelRunResult):
            self.notes[f"cancel_run:{msg.status.value}"] += 1
        if req.kind == "exec":
            if isinstance(msg, RunEnd):
                if req.ends > 1:
                    self.fail(
                        "exactly one run_end per run per client", f"{client.name} got {req.ends} for {msg.run_id}"
                    )
            elif isinstance(msg, (RunUpdate, RunOutput)):
                if req.ends:
                    self.fail(
                        "terminals never change", f"{client.name} got {msg.TYPE} for {msg.run_id} after its run_end"
                    )
                if isinstance(msg, RunUpdate) and msg.state in RUN_TERMINAL:
                    self.fail("one terminal per run", f"run_update with terminal {msg.state}")
        elif len(req.replies) > 1:
            self.fail("one answer per request", f"{client.name} {req.kind} {req.target}: {len(req.replies)} answers")

    # --- after every event ----------------------------------------------------------------------

    def after_event(self) -> None:
        """Look at every snapshot that changed since the last event (the table reads them back from
        the real store after each write), and at all of them when a Hand connected or went."""
        if self.world.ext is not None:
            self.world.ext.checker.after_event()
        table = self.world.snapshots
        if table.mismatch is not None:  # `Rules(checked_store=True)` only
            self.fail("the snapshot table keeps what the store holds", table.mismatch)
        mind = self.world.mind
        if mind is not None and mind.hands_changed:
            mind.hands_changed = False
            table.dirty.update(dict.fromkeys(table.rows))
        if not table.dirty:
            return
        online = mind.hands if mind is not None else {}
        for task_id in table.dirty:
            now = table.rows.get(task_id)
            old = self.terminal_snaps.get(task_id)
            if old is not None:
                if now is None:
                    self.fail("terminals never change", f"terminal snapshot {task_id} ({old.state}) disappeared")
                if (now.state, now.version, now.info, now.reason) != (old.state, old.version, old.info, old.reason):
                    self.fail(
                        "terminals never change",
                        f"snapshot {task_id}: {old.state} v{old.version} -> {now.state} v{now.version}",
                    )
            if now is not None:
                if now.terminal and old is None:
                    self.terminal_snaps[task_id] = now
                self._claims(now)
                if not now.terminal and not now.stale and now.hand not in online:
                    self.fail(
                        "an offline hand's tasks are shown stale",
                        f"{task_id} {now.state} on {now.hand}, which has no connection",
                    )
        table.dirty.clear()

    def _claims(self, snap: Snapshot) -> None:
        """A snapshot is the Hand's word at some version, or the Mind's own `lost`."""
        if snap.reason == UNKNOWN_TO_HAND:
            if snap.state is not TaskState.LOST:
                self.fail("snapshot claims", f"{snap.task_id}: 'unknown to hand' in {snap.state}")
            return
        if snap.version == 0:
            if snap.terminal:
                self.fail("snapshot claims", f"{snap.task_id}: terminal {snap.state} without any report from the hand")
            return
        row = self.rows.get((snap.hand, snap.task_id), {}).get(snap.version)
        if row is None or row.state != snap.state:
            had = row.state if row else "nothing"
            self.fail(
                "snapshot claims", f"{snap.task_id} {snap.state} v{snap.version}: the hand had {had} at that version"
            )

    # --- once reconciled ------------------------------------------------------------------------

    def reconciled(self, phase: str) -> None:
        w = self.world
        assert w.mind is not None
        for run in w.mind.registry.active():
            self.fail("every run ends", f"[{phase}] run {run.run_id} still {run.state}")
        for slot in w.hands.values():
            for row in slot.store.rows.values():
                if not row.terminal:
                    self.fail("every task ends", f"[{phase}] {row.task_id} on {slot.label} still {row.state}")
                snap = w.snapshots.get(row.task_id)
                if snap is None or snap.hand != slot.label:
                    self.fail("every hand task is known to the mind", f"[{phase}] {row.task_id} on {slot.label}")
        for snap in w.snapshots.all():
            self._reconciled_snapshot(snap, phase)
        if w.ext is not None:
            w.ext.checker.reconciled(phase)
        for client in w.clients:
            if client.conn is None:
                continue
            for req in client.live_requests():
                if req.answered != 1:
                    self.fail(
                        "one answer per request", f"[{phase}] {client.name} {req.kind} {req.target}: {req.answered}"
                    )
                if req.kind == "exec" and req.run_id is not None:
                    end = next(m for m in req.replies if isinstance(m, RunEnd))
                    if end.state != w.mind.registry.get(req.run_id).state:  # type: ignore[union-attr]
                        self.fail("run_end agrees with the registry", f"[{phase}] {req.run_id}: {end.state}")

    def _reconciled_snapshot(self, snap: Snapshot, phase: str) -> None:
        tid = snap.task_id
        if snap.stale or snap.cancel_pending or snap.start_pending:
            self.fail(
                "every non-terminal snapshot is fresh",
                f"[{phase}] {tid} {snap.state} stale={snap.stale} cancel_pending={snap.cancel_pending} "
                f"start_pending={snap.start_pending}",
            )
        slot = self.world.hands.get(snap.hand)
        row = slot.store.get(tid) if slot is not None else None
        if row is not None:
            if snap.reason == UNKNOWN_TO_HAND:
                self.fail(
                    "mind snapshot equals the hand's row",
                    f"[{phase}] {tid}: mind says lost (unknown to hand), the hand has it {row.state} v{row.version}",
                )
            self._same(snap, to_info(row), phase, "the hand's row")
            return
        if snap.reason == UNKNOWN_TO_HAND:
            return
        gone = self.purged.get((snap.hand, tid))
        if gone is None:
            self.fail("no snapshot claims what the hand does not have", f"[{phase}] {tid} {snap.state} on {snap.hand}")
        else:
            self._same(snap, to_info(gone), phase, "the hand's last row before purge")

    def _same(self, snap: Snapshot, info: TaskInfo, phase: str, what: str) -> None:
        mine = snap.info
        diffs = [f for f in EXIT_FIELDS if mine is None or getattr(mine, f) != getattr(info, f)]
        if snap.state != info.state or snap.version != info.version or diffs:
            self.fail(
                "mind snapshot equals the hand's row",
                f"[{phase}] {snap.task_id}: mind {snap.state} v{snap.version}, {what} {info.state} v{info.version} "
                f"(differs in {diffs})",
            )
