"""The foreground run registry: the Mind's authority on every run (DESIGN §3, §5).

Sans-I/O: each method takes an event and `now` (the shell's monotonic clock) and returns a list of
actions for the shell to perform in order. No await, no sockets, no clock reads. The race table of
DESIGN §5 is decided here and only here:

- first legal terminal wins; anything after it is logged as late and changes nothing;
- a Hand message counts only if it comes from the Hand and generation that the run was sent on;
- the accepting connection dropping before a result -> `lost` (nobody can know what happened);
- a cancel is a request: `cancel_requested` until the Hand reports, and a result that raced the
  cancel stands (`succeeded`: the command did run);
- the Mind's own deadline (the Hand's deadline plus grace plus slack) -> `timed_out`, and a cancel is
  sent so the Hand stops too;
- the waiting client disconnecting -> cancel with reason `client_disconnected`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from protocol import limits
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, CancelStatus, RejectCode
from protocol.control import Budget
from protocol.digest import args_digest
from protocol.messages import (
    OUTCOME_FIELDS,
    Background,
    Cancel,
    Exec,
    Message,
    Progress,
    Result,
    Rpc,
    RunEnd,
    RunInfo,
    RunOutput,
    RunUpdate,
)
from protocol.states import RUN_TERMINAL, RUN_TRANSITIONS, RunState, advance, can_advance

MIND_DEADLINE_SLACK_S = 2.0
"""Extra time the Mind waits past the Hand's deadline and kill grace before deciding `timed_out`
itself: the Hand's own `timed_out` result normally arrives first and carries the real details."""

DEFAULT_GRACE_MS = 5000


# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendToHand:
    hand: str
    gen: int
    msg: Message


@dataclass(frozen=True)
class SendToClient:
    client: str
    req_id: str
    msg: Message
    droppable: bool = False
    """Progress may be dropped when the client reads too slowly; state changes never are."""


@dataclass(frozen=True)
class Log:
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class StartEnded:
    """The start run of a background task reached its terminal: the shell settles the snapshot
    (fresh on success, deleted on rejection, left stale for reconciliation otherwise)."""

    run_id: str
    hand: str
    end: RunEnd


Action = SendToHand | SendToClient | Log | StartEnded


@dataclass
class Run:
    run_id: str
    hand: str
    tool: str
    args_digest: str
    client: str | None
    req_id: str
    owner: str
    watch: bool
    timeout_ms: int
    grace_ms: int
    created_at: float
    mind_deadline: float
    created_wall: float
    state: RunState = RunState.ADMITTED
    gen: int | None = None
    cancel_reason: CancelReason | None = None
    budget: Budget = field(
        default_factory=lambda: Budget(
            {"progress_bytes": limits.PROGRESS_BYTES_MAX, "progress_events": limits.PROGRESS_EVENTS_MAX}
        )
    )
    dropped: int = 0
    background: Background | None = None
    end: RunEnd | None = None
    ended_at: float | None = None
    ended_wall: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in RUN_TERMINAL

    def info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            hand=self.hand,
            tool=self.tool,
            state=self.state,
            gen=self.gen,
            created_at=self.created_wall,
            ended_at=self.ended_wall,
            args_digest=self.args_digest,
            end=self.end,
        )


class RunRegistry:
    def __init__(self, retain_finished: int = 10_000) -> None:
        self._runs: dict[str, Run] = {}
        self._active: dict[str, Run] = {}
        """The non-terminal runs: ticks, disconnects and counts touch only these, never the
        (much larger) retained history."""
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._retain = retain_finished
        self.late_inputs = 0
        self.foreign_inputs = 0

    # --- queries ---

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    def active(self) -> list[Run]:
        return list(self._active.values())

    def history(self, hand: str | None, state: RunState | None, since: float | None, limit: int) -> list[Run]:
        """Newest first: the active runs and the retained finished ones."""
        out: list[Run] = []
        for run in reversed(list(self._runs.values())):  # insertion order is admission order
            if hand is not None and run.hand != hand:
                continue
            if state is not None and run.state is not state:
                continue
            if since is not None and run.created_wall < since:
                continue
            out.append(run)
            if len(out) >= limit:
                break
        return out

    def running_on(self, hand: str) -> int:
        return sum(1 for r in self._active.values() if r.hand == hand)

    # --- helpers ---

    def _log(self, event: str, run: Run, **fields: Any) -> Log:
        return Log(event, {"run_id": run.run_id, "hand": run.hand, "gen": run.gen, **fields})

    def _move(self, run: Run, new: RunState) -> list[Action]:
        old = run.state
        run.state = advance(RUN_TRANSITIONS, run.state, new)
        acts: list[Action] = [self._log("run_state", run, old=old.value, new=new.value)]
        if run.client is not None and run.watch and new not in RUN_TERMINAL:
            acts.append(
                SendToClient(
                    run.client, run.req_id, RunUpdate(run_id=run.run_id, hand=run.hand, state=new, gen=run.gen)
                )
            )
        return acts

    def _terminate(self, run: Run, end: RunEnd, now: float, wall: float) -> list[Action]:
        """Set the one terminal state of `run`. Callers have checked the transition is legal."""
        acts = self._move(run, end.state)
        run.end = end
        run.ended_at = now
        run.ended_wall = wall
        self._active.pop(run.run_id, None)
        self._finished[run.run_id] = None
        acts.append(
            self._log(
                AuditEvent.RUN_TERMINAL,
                run,
                state=end.state.value,
                reason=end.reason,
                exit_code=end.exit_code,
                duration_ms=end.duration_ms,
                progress_dropped=end.progress_dropped,
                tool=run.tool,
                args_digest=run.args_digest,
                client=run.owner,
                reject_code=end.reject_code.value if end.reject_code else None,
            )
        )
        if run.client is not None:
            acts.append(SendToClient(run.client, run.req_id, end))
        if run.background is not None:
            acts.append(StartEnded(run.run_id, run.hand, end))
        self._prune()
        return acts

    def _prune(self) -> None:
        while len(self._finished) > self._retain:
            old, _ = self._finished.popitem(last=False)
            self._runs.pop(old, None)

    def _end(self, run: Run, state: RunState, reason: str, now: float, **kw: Any) -> RunEnd:
        return RunEnd(
            run_id=run.run_id,
            hand=run.hand,
            tool=run.tool,
            state=state,
            reason=reason,
            progress_dropped=run.dropped,
            duration_ms=max(0, int((now - run.created_at) * 1000)),
            **kw,
        )

    def _from_hand(self, run_id: str, hand: str, gen: int, what: str) -> tuple[Run | None, list[Action]]:
        """The run a Hand message is about, if that Hand and generation may speak for it."""
        run = self._runs.get(run_id)
        if run is None or run.hand != hand:
            self.foreign_inputs += 1
            fields = {"run_id": run_id, "hand": hand, "gen": gen, "what": what}
            return None, [Log(AuditEvent.HAND_INPUT_UNKNOWN_RUN, fields)]
        if run.gen != gen:
            self.foreign_inputs += 1
            return None, [self._log(AuditEvent.HAND_INPUT_WRONG_GENERATION, run, what=what, from_gen=gen)]
        if run.terminal:
            self.late_inputs += 1
            return None, [self._log("late_input", run, what=what, state=run.state.value)]
        return run, []

    # --- events ---

    def admit(
        self,
        run_id: str,
        req: Exec,
        client: str | None,
        req_id: str,
        hand_gen: int | None,
        hand_known: bool,
        now: float,
        wall: float,
        background: Background | None = None,
        owner: str = "",
        refusal: tuple[RejectCode, str] | None = None,
    ) -> list[Action]:
        """A client asks for a run. `hand_gen` is the Hand's live generation, None if offline.

        With `background`, this is the start run of a task (`task_id == run_id`): it ends
        `succeeded` as soon as the Hand has durably accepted the task, and emits `StartEnded`."""
        if run_id in self._runs:
            raise ValueError(f"run id {run_id} already exists")
        grace = req.grace_ms if req.grace_ms is not None else DEFAULT_GRACE_MS
        run = Run(
            run_id=run_id,
            hand=req.hand,
            tool=req.tool,
            args_digest=args_digest(req.tool, req.args),
            client=client,
            req_id=req_id,
            owner=owner,
            watch=req.watch,
            timeout_ms=req.timeout_ms,
            grace_ms=grace,
            created_at=now,
            created_wall=wall,
            mind_deadline=now + (req.timeout_ms + grace) / 1000 + MIND_DEADLINE_SLACK_S,
            background=background,
        )
        self._runs[run_id] = run
        self._active[run_id] = run
        acts: list[Action] = [
            self._log(AuditEvent.RUN_ADMITTED, run, tool=req.tool, args_digest=run.args_digest, client=owner)
        ]
        if run.client is not None:
            acts.append(SendToClient(run.client, req_id, RunUpdate(run_id=run_id, hand=run.hand, state=run.state)))
        if refusal is not None:
            code, why = refusal
            acts += self._terminate(run, self._end(run, RunState.REJECTED, why, now, reject_code=code), now, wall)
            return acts
        if hand_gen is None:
            code = RejectCode.HAND_OFFLINE if hand_known else RejectCode.UNKNOWN_HAND
            why = f"hand {req.hand!r} is not connected" if hand_known else f"no hand named {req.hand!r}"
            acts += self._terminate(run, self._end(run, RunState.REJECTED, why, now, reject_code=code), now, wall)
            return acts
        run.gen = hand_gen
        acts += self._move(run, RunState.SENT)
        acts.append(
            SendToHand(
                run.hand,
                hand_gen,
                Rpc(
                    run_id=run_id,
                    tool=req.tool,
                    args=req.args,
                    timeout_ms=req.timeout_ms,
                    grace_ms=grace,
                    background=background,
                ),
            )
        )
        return acts

    def on_accepted(self, run_id: str, hand: str, gen: int, now: float) -> list[Action]:
        run, acts = self._from_hand(run_id, hand, gen, "accepted")
        if run is None:
            return acts
        if run.state is RunState.SENT:
            return self._move(run, RunState.ACCEPTED)
        return [self._log("hand_input_ignored", run, what="accepted", state=run.state.value)]

    def on_started(self, run_id: str, hand: str, gen: int, now: float) -> list[Action]:
        run, acts = self._from_hand(run_id, hand, gen, "started")
        if run is None:
            return acts
        if run.state is RunState.ACCEPTED:
            return self._move(run, RunState.RUNNING)
        return [self._log("hand_input_ignored", run, what="started", state=run.state.value)]

    def on_rejected(
        self, run_id: str, hand: str, gen: int, code: RejectCode, message: str, now: float, wall: float
    ) -> list[Action]:
        run, acts = self._from_hand(run_id, hand, gen, "rejected")
        if run is None:
            return acts
        if not can_advance(RUN_TRANSITIONS, run.state, RunState.REJECTED):
            return [self._log("hand_input_illegal", run, what="rejected", state=run.state.value)]
        return self._terminate(run, self._end(run, RunState.REJECTED, message, now, reject_code=code), now, wall)

    def on_progress(self, msg: Progress, hand: str, gen: int) -> list[Action]:
        """Observation only: forwarded within the caps, never a state change."""
        run = self._runs.get(msg.run_id)
        if run is None or run.hand != hand or run.gen != gen or run.terminal:
            return []
        if run.state not in (RunState.ACCEPTED, RunState.RUNNING, RunState.CANCEL_REQUESTED):
            return []
        if not run.budget.try_reserve("progress_events", 1):
            run.dropped += 1
            return []
        if not run.budget.try_reserve("progress_bytes", len(msg.data)):
            run.dropped += 1
            return []
        if run.client is None:
            return []
        out = RunOutput(run_id=run.run_id, stream=msg.stream, offset=msg.offset, data=msg.data)
        return [SendToClient(run.client, run.req_id, out, droppable=True)]

    def on_result(self, res: Result, hand: str, gen: int, now: float, wall: float) -> list[Action]:
        run, acts = self._from_hand(res.run_id, hand, gen, "result")
        if run is None:
            return acts
        if not can_advance(RUN_TRANSITIONS, run.state, res.state):
            return [self._log("hand_input_illegal", run, what="result", state=run.state.value, result=res.state.value)]
        fields = {k: getattr(res, k) for k in OUTCOME_FIELDS}
        fields["progress_dropped"] = res.progress_dropped + run.dropped
        end = RunEnd(hand=run.hand, tool=run.tool, **fields)
        return self._terminate(run, end, now, wall)

    def on_cancel_result(
        self, run_id: str, hand: str, gen: int, status: CancelStatus, now: float, wall: float
    ) -> list[Action]:
        run, acts = self._from_hand(run_id, hand, gen, "cancel_result")
        if run is None:
            return acts
        if status is CancelStatus.UNKNOWN_RUN:
            # The stream is ordered and the Hand registers a run before answering `accepted`, so a
            # Hand that does not know a non-terminal run has lost it: nobody can say how it ended.
            return self._terminate(run, self._end(run, RunState.LOST, "hand does not know this run", now), now, wall)
        return [self._log("cancel_ack", run, status=status.value)]

    def on_cancel(
        self, run_id: str, reason: CancelReason, now: float, wall: float
    ) -> tuple[CancelStatus, list[Action]]:
        """A request to stop. Returns what to tell the requester, and the actions."""
        run = self._runs.get(run_id)
        if run is None:
            return CancelStatus.UNKNOWN_RUN, []
        if run.terminal:
            return CancelStatus.ALREADY_DONE, [self._log("cancel_after_terminal", run, reason=reason.value)]
        if run.state is RunState.CANCEL_REQUESTED:
            return CancelStatus.CANCEL_REQUESTED, []
        run.cancel_reason = reason
        if run.state is RunState.ADMITTED:
            # Never sent: nothing ran anywhere, so `cancelled` is the truth.
            return CancelStatus.CANCEL_REQUESTED, self._terminate(
                run, self._end(run, RunState.CANCELLED, reason.value, now), now, wall
            )
        assert run.gen is not None  # past `admitted` a run was sent, to the Hand of this generation
        acts = self._move(run, RunState.CANCEL_REQUESTED)
        acts.append(SendToHand(run.hand, run.gen, Cancel(run_id=run.run_id, reason=reason)))
        return CancelStatus.CANCEL_REQUESTED, acts

    def on_hand_gone(self, hand: str, gen: int, now: float, wall: float) -> list[Action]:
        """The connection of generation `gen` ended: every run it carried has an unknown outcome."""
        acts: list[Action] = []
        for run in list(self._active.values()):
            if run.hand == hand and run.gen == gen:
                acts += self._terminate(
                    run, self._end(run, RunState.LOST, "hand connection lost before a result", now), now, wall
                )
        return acts

    def on_internal_failure(self, run_id: str, hand: str, gen: int, what: str, now: float, wall: float) -> list[Action]:
        """The shell failed (a bug; its log has the traceback) while taking in the Hand's `what` about
        this run. Nobody can know how the run goes from here: it ends `lost` at once rather than at
        its deadline, and the Hand is told to stop it. Only the Hand and generation the run was sent
        on can end it this way; anything else changes nothing."""
        run = self._runs.get(run_id)
        if run is None or run.hand != hand or run.gen != gen or run.terminal:
            return []
        if not can_advance(RUN_TRANSITIONS, run.state, RunState.LOST):
            return []
        why = f"the mind failed while handling the hand's {what} (its log has the traceback)"
        acts = self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall)
        acts.append(SendToHand(hand, gen, Cancel(run_id=run_id, reason=CancelReason.INTERNAL_FAILURE)))
        return acts

    def on_client_gone(self, client: str, now: float, wall: float) -> list[Action]:
        acts: list[Action] = []
        for run in list(self._active.values()):
            if run.client != client:
                continue
            run.client = None  # nobody left to tell
            _, more = self.on_cancel(run.run_id, CancelReason.CLIENT_DISCONNECTED, now, wall)
            acts += more
        return acts

    def on_tick(self, now: float, wall: float) -> list[Action]:
        """Mind-side deadlines: a run whose Hand never answered in time ends `timed_out`."""
        acts: list[Action] = []
        for run in list(self._active.values()):
            if now < run.mind_deadline:
                continue
            if not can_advance(RUN_TRANSITIONS, run.state, RunState.TIMED_OUT):
                continue
            gen = run.gen
            acts += self._terminate(
                run, self._end(run, RunState.TIMED_OUT, "no answer from the hand before the deadline", now), now, wall
            )
            if gen is not None:
                acts.append(SendToHand(run.hand, gen, Cancel(run_id=run.run_id, reason=CancelReason.DEADLINE_EXCEEDED)))
        return acts

    def on_shutdown(self, now: float, wall: float) -> list[Action]:
        """The Mind is stopping: it will not be there to hear any result, so unfinished runs are lost."""
        acts: list[Action] = []
        for run in self.active():
            gen = run.gen
            acts += self._terminate(
                run, self._end(run, RunState.LOST, "mind shut down before a result", now), now, wall
            )
            if gen is not None:
                acts.append(SendToHand(run.hand, gen, Cancel(run_id=run.run_id, reason=CancelReason.SHUTDOWN)))
        return acts
