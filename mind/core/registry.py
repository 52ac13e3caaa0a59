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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from protocol import limits
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, CancelStatus, RejectCode
from protocol.control import Budget
from protocol.digest import args_digest
from protocol.errors import ProtocolError
from protocol.messages import (
    OUTCOME_FIELDS,
    Background,
    Cancel,
    Exec,
    Message,
    Progress,
    Resize,
    Result,
    Rpc,
    RunEnd,
    RunInfo,
    RunOutput,
    RunUpdate,
    StreamAck,
    StreamData,
)
from protocol.states import RUN_TERMINAL, RUN_TRANSITIONS, RunState, advance, can_advance
from protocol.streams import Relay

MIND_DEADLINE_SLACK_S = 2.0
"""Extra time the Mind waits past the Hand's deadline and kill grace before deciding `timed_out`
itself: the Hand's own `timed_out` result normally arrives first and carries the real details."""

DEFAULT_GRACE_MS = 5000

HISTORY_TAIL_MAX = 4 << 10
"""Bytes of each output tail a finished run keeps in history (the client got the whole tail, up to
`limits.OUTPUT_TAIL_MAX`, in its `run_end`)."""
HISTORY_ERROR_MAX = 1 << 10
"""Characters of a finished run's error text kept in history."""


def retained(end: RunEnd) -> RunEnd:
    """What history keeps of a run's end: its metadata (state, times, exit code, signal, stage,
    reason, byte counts and digests) and bounded tails, never its payload. The tool value (a
    `read_file` result is up to 4 MiB) went to the waiting client and is not kept: 10,000 retained
    runs must cost the same whatever their tools returned (DESIGN §11)."""
    update: dict[str, Any] = {"value": None}
    if end.error is not None and len(end.error) > HISTORY_ERROR_MAX:
        update["error"] = end.error[: HISTORY_ERROR_MAX - 1] + "\u2026"
    for name in ("stdout", "stderr"):
        tail = getattr(end, name)
        if len(tail.data) > HISTORY_TAIL_MAX:
            update[name] = tail.model_copy(update={"data": tail.data[-HISTORY_TAIL_MAX:]})
    return end.model_copy(update=update)


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


def _relays(req: Exec) -> dict[str, Relay]:
    """The streams a run carries: output (`stdout`+`stderr`, or one `pty`), and `stdin` if asked."""
    spec = req.streams
    if spec is None:
        return {}
    names = ["pty"] if spec.pty is not None else ["stdout", "stderr"]
    if spec.stdin or spec.pty is not None:
        names.append("stdin")
    return {name: Relay() for name in names}


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
    relays: dict[str, Relay] = field(default_factory=dict)
    """A streamed run's byte streams as the Mind relays them, by name (DESIGN §11): the Mind
    forwards each chunk at once and checks that no sender exceeds the window its receiver granted,
    so it never holds more than one window per stream, whatever the reader's speed."""
    end: RunEnd | None = None
    ended_at: float | None = None
    ended_wall: float | None = None
    seq: int = 0
    """Admission order (1, 2, ...): where a page of history starts (`ListRuns.after`)."""
    value_not_retained: bool = False
    fleet: str | None = None
    """The fleet run this run is a member of (`Exec.fleet`, DESIGN §12)."""

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
            value_not_retained=self.value_not_retained,
            fleet=self.fleet,
        )


class RunRegistry:
    def __init__(self, retain_finished: int = 10_000) -> None:
        self._runs: dict[str, Run] = {}
        self._active: dict[str, Run] = {}
        """The non-terminal runs: ticks, disconnects and counts touch only these, never the
        (much larger) retained history."""
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._retain = retain_finished
        self._seq = 0
        self.late_inputs = 0
        self.foreign_inputs = 0

    # --- queries ---

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    def __len__(self) -> int:
        """Runs held: the active ones and the retained finished ones (`--retain-runs`)."""
        return len(self._runs)

    def active(self) -> list[Run]:
        return list(self._active.values())

    def history(
        self,
        hand: str | None = None,
        state: RunState | None = None,
        since: float | None = None,
        before: int | None = None,
        fleet: str | None = None,
    ) -> Iterator[Run]:
        """Newest first: the active runs and the retained finished ones, only those admitted before
        run number `before` (a `Run.seq`) if given. Lazy, so a page reads only what it sends; take
        what is needed before the registry changes again."""
        for run in reversed(self._runs.values()):  # insertion order is admission order
            if before is not None and run.seq >= before:
                continue
            if hand is not None and run.hand != hand:
                continue
            if state is not None and run.state is not state:
                continue
            if since is not None and run.created_wall < since:
                continue
            if fleet is not None and run.fleet != fleet:
                continue
            yield run

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
        run.end = retained(end)
        run.value_not_retained = end.value is not None
        run.relays = {}  # nothing flows after the end: history keeps no stream state
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
        old = self._runs.get(run_id)
        if old is not None:
            if old.background is None or not old.terminal or background is None:
                raise ValueError(f"run id {run_id} already exists")
            # A task's start sent again (its first answer never came, or the Hand refused it with
            # nothing stored): the new start run replaces the finished one in the history.
            del self._runs[run_id]
            self._finished.pop(run_id, None)
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
            relays=_relays(req) if background is None else {},
            fleet=req.fleet,
        )
        self._seq += 1
        run.seq = self._seq
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
                    streams=req.streams if background is None else None,
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

    # --- streams (DESIGN §11): data, not state; never droppable; never move a state ---------------

    def on_hand_stream(self, msg: StreamData | StreamAck, hand: str, gen: int) -> list[Action]:
        """Output chunks and stdin acknowledgements from the Hand the run was sent to, on that
        generation, to the attached client. A chunk beyond its window or out of order is refused
        (logged, not forwarded): the client then sees the gap and says which bytes are missing."""
        run = self._runs.get(msg.run_id)
        if run is None or run.hand != hand or run.gen != gen or run.terminal or run.client is None:
            return []
        if (
            isinstance(msg, StreamData)
            and msg.stream == "stdin"
            or isinstance(msg, StreamAck)
            and msg.stream != "stdin"
        ):
            return [self._log("stream_wrong_direction", run, stream=msg.stream, what=msg.TYPE)]
        return self._relay(run, msg, SendToClient(run.client, run.req_id, msg))

    def on_client_stream(self, msg: StreamData | StreamAck | Resize, client: str) -> list[Action]:
        """stdin chunks, output acknowledgements and terminal resizes from the attached client, to
        the Hand the run was sent to (a client may only feed its own run)."""
        run = self._runs.get(msg.run_id)
        if run is None or run.client != client or run.terminal or run.gen is None:
            return []
        forward = SendToHand(run.hand, run.gen, msg)
        if isinstance(msg, Resize):
            return [forward] if "pty" in run.relays else []
        if (
            isinstance(msg, StreamData)
            and msg.stream != "stdin"
            or isinstance(msg, StreamAck)
            and msg.stream == "stdin"
        ):
            return [self._log("stream_wrong_direction", run, stream=msg.stream, what=msg.TYPE)]
        return self._relay(run, msg, forward)

    def _relay(self, run: Run, msg: StreamData | StreamAck, forward: Action) -> list[Action]:
        relay = run.relays.get(msg.stream)
        if relay is None:
            return [self._log("stream_unknown", run, stream=msg.stream)]
        try:
            if isinstance(msg, StreamData):
                relay.on_data(msg.offset, len(msg.data), msg.eof)
            elif not relay.on_ack(msg.offset) and not msg.closed:
                return []  # nothing new for the sender
        except ProtocolError as exc:
            return [self._log("stream_refused", run, stream=msg.stream, why=exc.message)]
        return [forward]

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
