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

Continuity (DESIGN §15) is decided here too, behind `resume_window` (0, the default, keeps every
rule above exactly): a leg that goes away leaves its run `running` for the window, a Hand that
comes back on a new generation presents its runs (`on_runs_present`) and the Mind re-binds, kills
or ends each, the run's owner re-attaches (`on_attach`, newest wins), and past the window the seed's
rule fires (`on_tick`). A terminal the Mind decides by itself is handed to the shell to write
durably (`PersistEnding`) before anyone is told, so first-terminal-wins holds across a crash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from mind.core.budgets import STREAM_WINDOW_CAP, grown_window
from mind.core.runs import (
    Action,
    FrameToClient,
    FrameToHand,
    Log,
    PersistEnding,
    Run,
    SendToClient,
    SendToHand,
    StartEnded,
    relays_for,
    relays_for_spec,
)
from mind.core.seal import seal, unsealed
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, CancelStatus, ErrorCode, RejectCode
from protocol.digest import args_digest
from protocol.errors import ProtocolError
from protocol.frames import OUTPUT_STREAMS, Numbers
from protocol.limits import RESUME_WINDOW_MAX_S
from protocol.messages import (
    OUTCOME_FIELDS,
    Attached,
    Background,
    Cancel,
    Detached,
    Error,
    Exec,
    PresentedRun,
    Progress,
    Replaced,
    Resize,
    Result,
    ResultAck,
    Rpc,
    RunEnd,
    RunExited,
    RunOutput,
    RunsPresent,
    RunUpdate,
    StreamAck,
    StreamNumbers,
    StreamPosition,
    StreamResume,
    Streams,
)
from protocol.states import RUN_TERMINAL, RUN_TRANSITIONS, RunState, advance, can_advance
from protocol.streams import check_resume

ADOPT_MAX = 1024
"""Unknown runs one presentation may have adopted (a Mind that restarted): more foreground runs than
any Hand holds at once; the rest are killed, said in one line."""
CANCEL_ANSWER_S = 60.0
"""A cancel delivered to a Hand that is there is answered within the run's grace (it sends SIGTERM,
then SIGKILL) plus this: past it the run ends `lost`, never `cancel_requested` for ever. Longer than
the Mind takes to find a silent Hand gone (two ping intervals, 20 s by default): a Hand cut off
without a word is away by then, and its runs wait for it under the window's rules instead."""
MIND_DEADLINE_SLACK_S = 2.0
"""Extra time the Mind waits past the Hand's deadline and kill grace before deciding `timed_out`
itself: the Hand's own `timed_out` result normally arrives first and carries the real details."""

DEFAULT_GRACE_MS = 5000

HISTORY_TAIL_MAX = 4 << 10
"""Bytes of each output tail a finished run keeps in history (the client got the whole tail, up to
`limits.OUTPUT_TAIL_MAX`, in its `run_end`)."""
HISTORY_ERROR_MAX = 1 << 10
"""Characters of a finished run's error text kept in history."""


COPIES = frozenset({"put_file", "get_file"})


def copy_summary(tool: str, value: Any) -> dict[str, int] | None:
    """What history keeps of a copy's value: how many files and bytes it moved (`mind runs` shows
    a `mind cp` as one entry with them, issue 36), two integers whatever the copy was."""
    if tool not in COPIES or not isinstance(value, dict):
        return None
    files, size = value.get("files", 1), value.get("bytes", value.get("size"))
    if not isinstance(files, int) or not isinstance(size, int):
        return None
    return {"files": files, "bytes": size}


def retained(end: RunEnd) -> RunEnd:
    """What history keeps of a run's end: its metadata (state, times, exit code, signal, stage,
    reason, byte counts and digests) and bounded tails, never its payload. The tool value (a
    `read_file` result is up to 4 MiB) went to the waiting client and is not kept: 10,000 retained
    runs must cost the same whatever their tools returned (DESIGN §11); of a copy, two counts."""
    update: dict[str, Any] = {"value": copy_summary(end.tool, end.value)}
    if end.error is not None and len(end.error) > HISTORY_ERROR_MAX:
        update["error"] = end.error[: HISTORY_ERROR_MAX - 1] + "\u2026"
    for name in ("stdout", "stderr"):
        tail = getattr(end, name)
        if len(tail.data) > HISTORY_TAIL_MAX:
            update[name] = tail.model_copy(update={"data": tail.data[-HISTORY_TAIL_MAX:]})
    return end.model_copy(update=update)


class RunRegistry:
    def __init__(
        self,
        retain_finished: int = 10_000,
        resume_window: float = 0.0,
        keep_max: float = RESUME_WINDOW_MAX_S,
        seal_key: bytes = b"",
    ) -> None:
        """`resume_window`: seconds a run may be unattended on either leg before the seed's rule
        fires (DESIGN §15); 0 ends it at once, as before continuity. `keep_max`: the longest a
        detached run is kept (`Detach.keep_s` is capped to it). `seal_key`: the store's key the
        `rpc`s are sealed with (`mind.core.seal`), the same in every life of the Mind."""
        self.resume_window = resume_window
        self.keep_max = keep_max
        self.seal_key = seal_key
        self._presented: dict[str, int] = {}
        """The generation each Hand last presented its runs on: one presentation per welcome."""
        self._newest_gen: dict[str, int] = {}
        """The newest generation heard of per Hand (a run sent on it, or its presentation): an older
        one is fenced, and its results are not acknowledged."""
        self._runs: dict[str, Run] = {}
        self._active: dict[str, Run] = {}
        """The non-terminal runs: ticks, disconnects and counts touch only these, never the
        (much larger) retained history."""
        self._owners: dict[str, dict[str, Run]] = {}
        """The non-terminal runs by owner: a start's stream budget adds up its client's own runs,
        not every active run (10,000 tunnel connections at once spent a third of the Mind there)."""
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._retain = retain_finished
        self._seq = 0
        self._presentations_until: float | None = None
        """Until then (a Mind that just started) a run this registry does not know may still be
        presented by its Hand: an attach to it is told to wait, not that the run is unknown."""
        self.late_inputs = 0
        self.foreign_inputs = 0
        self._numbers: dict[tuple[str, ...], Numbers] = {}
        """Each connection's stream numbers (DESIGN §11b), by ("h", hand, gen) or ("c", client):
        given when a run's streams are bound to the connection, dead with the run or the
        connection. A data frame names its stream only by them."""

    # --- queries ---

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    def __len__(self) -> int:
        """Runs held: the active ones and the retained finished ones (`--retain-runs`)."""
        return len(self._runs)

    def active(self) -> list[Run]:
        return list(self._active.values())

    def active_of(self, owner: str) -> list[Run]:
        """The non-terminal runs `owner` started (or was given by an adoption)."""
        return list(self._owners.get(owner, {}).values())

    def _activate(self, run: Run) -> None:
        self._active[run.run_id] = run
        self._owners.setdefault(run.owner, {})[run.run_id] = run

    def _deactivate(self, run: Run) -> None:
        self._active.pop(run.run_id, None)
        mine = self._owners.get(run.owner)
        if mine is not None:
            mine.pop(run.run_id, None)
            if not mine:
                del self._owners[run.owner]

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

    def _terminate(
        self, run: Run, end: RunEnd, now: float, wall: float, mind_decided: bool = False, durable: bool = False
    ) -> list[Action]:
        """Set the one terminal state of `run`. Callers have checked the transition is legal.
        `mind_decided`: nobody reported it, the Mind decided it; with continuity on, it is written
        durably first (`PersistEnding`). `durable`: a Hand's result, written first too, because the
        Hand lets it go at the `result_ack` that follows: a Mind that crashed after acknowledging
        would otherwise adopt the run when it is presented again and could end it a second way.
        With the window 0 no run outlives its connections, so no Hand can ever re-present one and
        there is nothing to persist."""
        kept = retained(end)
        collected = [
            StreamPosition(stream=name, offset=relay.acked, consumed=relay.acked)  # type: ignore[arg-type]
            for name, relay in run.relays.items()
            if name != "stdin"
        ]
        if collected:  # what a later attach need not print again
            kept = kept.model_copy(update={"collected": collected})
        acts: list[Action] = []
        if (mind_decided or durable) and self.resume_window > 0:
            acts.append(PersistEnding(run.run_id, kept, run.owner, run.cancel_reason, run.args_digest))
        acts += self._move(run, end.state)
        run.end = kept
        run.value_not_retained = end.value is not None
        run.relays = {}  # nothing flows after the end: history keeps no stream state
        self._unbind(run)
        run.ended_at = now
        run.ended_wall = wall
        self._deactivate(run)
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
            relays=relays_for(req) if background is None else {},
            fleet=req.fleet,
        )
        self._seq += 1
        run.seq = self._seq
        self._runs[run_id] = run
        self._activate(run)
        refused = {"reject_code": refusal[0].value} if refusal is not None else {}  # (audit: aggregated)
        acts: list[Action] = [
            self._log(AuditEvent.RUN_ADMITTED, run, tool=req.tool, args_digest=run.args_digest, client=owner, **refused)
        ]
        admitted: list[Action] = []
        if run.client is not None:
            admitted += self._bind_client(run)
            if req.run_id is None or req.watch:
                # (a run whose client named it needs no frame to learn its id: a call's end is its only
                # answer, and a streamed run's `stream_numbers` say it was admitted, just before this)
                admitted.append(
                    SendToClient(run.client, req_id, RunUpdate(run_id=run_id, hand=run.hand, state=run.state))
                )
        if refusal is not None:
            code, why = refusal
            acts += admitted
            acts += self._terminate(run, self._end(run, RunState.REJECTED, why, now, reject_code=code), now, wall)
            return acts
        if hand_gen is None:
            code = RejectCode.HAND_OFFLINE if hand_known else RejectCode.UNKNOWN_HAND
            why = f"hand {req.hand!r} is not connected" if hand_known else f"no hand named {req.hand!r}"
            acts += admitted
            acts += self._terminate(run, self._end(run, RunState.REJECTED, why, now, reject_code=code), now, wall)
            return acts
        run.gen = hand_gen
        self._newest_gen[run.hand] = max(hand_gen, self._newest_gen.get(run.hand, 0))
        moved = self._move(run, RunState.SENT)
        acts += self._bind_hand(run)
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
                    owner=run.owner or None,
                    **self._sealed(run, req.streams if background is None else None, wall),
                ),
            )
        )
        # The Hand's frame is the one the answer waits for, so it leaves first (issue 25); the client
        # hears of the admission, then (if it watches) of `sent`, in that order, right after.
        return acts + admitted + moved

    def _sealed(self, run: Run, spec: Streams | None, wall: float) -> dict[str, Any]:
        """A foreground run's seal and its time, for its `rpc` (a task's start run is never adopted)."""
        if run.background is not None or not run.owner:
            return {}
        digest = run.args_digest
        mark = seal(
            self.seal_key, run.hand, run.run_id, run.owner, run.tool, digest, run.timeout_ms, run.grace_ms, spec, wall
        )
        return {"seal": mark, "sealed_at": wall}

    def on_exited(self, msg: RunExited, hand: str, gen: int) -> list[Action]:
        """The run's process ended and its output is still owed (a detached run nobody reads): the
        run stays live until that output is delivered, and says how the process ended meanwhile."""
        run, acts = self._from_hand(msg.run_id, hand, gen, "run_exited")
        if run is None or run.terminal:
            return acts
        run.exited = msg
        return [self._log("run_exited", run, exit_code=msg.exit_code, signal=msg.signal)]

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

    def _bind_hand(self, run: Run) -> list[Action]:
        """Numbers for the run's streams on its Hand's connection, announced before anything that
        lets the Hand use them (the `rpc`, a re-bind's `stream_resume`)."""
        if not run.relays or run.gen is None:
            return []
        table = self._numbers.setdefault(("h", run.hand, str(run.gen)), Numbers())
        numbers = table.assign(run.run_id, run.relays)
        return [SendToHand(run.hand, run.gen, StreamNumbers(run_id=run.run_id, **numbers))]

    def _bind_client(self, run: Run) -> list[Action]:
        """Numbers for the run's streams on its client's connection, announced under the run's
        request id before its first `run_update` or its `attached`."""
        if not run.relays or run.client is None:
            return []
        table = self._numbers.setdefault(("c", run.client), Numbers())
        numbers = table.assign(run.run_id, run.relays, run.req_id)
        return [SendToClient(run.client, run.req_id, StreamNumbers(run_id=run.run_id, **numbers))]

    def _unbind_client(self, run: Run) -> None:
        if run.client is not None and (table := self._numbers.get(("c", run.client))) is not None:
            table.drop_run(run.run_id)

    def _unbind(self, run: Run) -> None:
        self._unbind_client(run)
        if run.gen is not None and (table := self._numbers.get(("h", run.hand, str(run.gen)))) is not None:
            table.drop_run(run.run_id)

    def stream_number(self, conn: tuple[str, ...], run_id: str, stream: str) -> int | None:
        """The number of `stream` of `run_id` on connection `conn` (("h", hand, str(gen)) or
        ("c", client)), if it has one: what the simulation's ends would have learnt from
        `stream_numbers`."""
        table = self._numbers.get(conn)
        return table.number(run_id, stream) if table is not None else None

    @staticmethod
    def _entry(table: Numbers | None, number: int, who: str) -> Any:
        if table is None:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"stream number {number} was never given to this {who}")
        return table.lookup(number)

    def on_hand_frame(
        self, hand: str, gen: int, number: int, offset: int, eof: bool, payload: memoryview | bytes
    ) -> list[Action]:
        """An output chunk from the Hand, as its data frame's header says (DESIGN §11b). The header
        is checked against the stream's `Relay` (window, contiguity) and the Hand's right to the
        stream (its number was given on this connection, for an output stream); the payload goes
        on to the attached client as it came. A number never given, or a stream the Hand does not
        send, is a `ProtocolError` (the connection ends, as for a malformed envelope); a number of a
        run that has ended is a late frame, dropped; a chunk beyond its window or out of order is
        refused (logged, not forwarded) as before: the client then sees the gap and says which
        bytes are missing, and after a resume the resend fills it."""
        entry = self._entry(self._numbers.get(("h", hand, str(gen))), number, "hand connection")
        if entry is None:
            return []
        if entry.stream not in OUTPUT_STREAMS:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"a hand may not send on the {entry.stream} stream")
        run = self._runs.get(entry.run_id)
        if run is None or run.hand != hand or run.gen != gen or run.terminal or run.client is None:
            return []
        relay = run.relays.get(entry.stream)
        target = self._numbers.get(("c", run.client))
        to = target.number(run.run_id, entry.stream) if target is not None else None
        if relay is None or to is None:
            return [self._log("stream_unknown", run, stream=entry.stream)]
        try:
            if not relay.on_data(offset, len(payload), eof):
                return []  # sent before the sender heard of a resume, and sent again: once is enough
        except ProtocolError as exc:
            return [self._log("stream_refused", run, stream=entry.stream, why=exc.message)]
        return [FrameToClient(run.client, to, offset, eof, payload, run.run_id, entry.stream)]

    def on_client_frame(
        self, client: str, number: int, offset: int, eof: bool, payload: memoryview | bytes
    ) -> list[Action]:
        """A stdin chunk from the attached client, as its data frame's header says: the rules of
        `on_hand_frame` the other way. While the Hand is away nothing reaches it and stdin is not
        counted (the client keeps it and resends from the Hand's resume point)."""
        entry = self._entry(self._numbers.get(("c", client)), number, "client connection")
        if entry is None:
            return []
        if entry.stream != "stdin":
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"a client may not send on the {entry.stream} stream")
        run = self._runs.get(entry.run_id)
        if run is None or run.client != client or run.terminal or run.gen is None or run.hand_away_since is not None:
            return []
        relay = run.relays.get("stdin")
        target = self._numbers.get(("h", run.hand, str(run.gen)))
        to = target.number(run.run_id, "stdin") if target is not None else None
        if relay is None or to is None:
            return [self._log("stream_unknown", run, stream="stdin")]
        try:
            if not relay.on_data(offset, len(payload), eof):
                return []
        except ProtocolError as exc:
            return [self._log("stream_refused", run, stream="stdin", why=exc.message)]
        return [FrameToHand(run.hand, run.gen, to, offset, eof, payload, run.run_id, "stdin")]

    def on_hand_stream(self, msg: StreamAck, hand: str, gen: int) -> list[Action]:
        """stdin acknowledgements from the Hand the run was sent to, on that generation, to the
        attached client (acknowledgements stay envelopes: one per quarter window). With no client
        attached it is counted, its window too: the next attachment resumes under it (a window
        halved meanwhile and not told had the client resume past the Hand's limit, and the
        stream stopped)."""
        run = self._runs.get(msg.run_id)
        if run is None or run.hand != hand or run.gen != gen or run.terminal:
            return []
        if msg.stream != "stdin":
            return [self._log("stream_wrong_direction", run, stream=msg.stream, what=msg.TYPE)]
        return self._relay(run, msg, SendToClient(run.client, run.req_id, msg) if run.client is not None else None)

    def on_client_stream(self, msg: StreamAck | Resize, client: str) -> list[Action]:
        """Output acknowledgements and terminal resizes from the attached client, to the Hand the
        run was sent to (a client may only feed its own run)."""
        run = self._runs.get(msg.run_id)
        if run is None or run.client != client or run.terminal or run.gen is None:
            return []
        if run.hand_away_since is not None:
            return self._while_hand_away(run, msg)
        forward = SendToHand(run.hand, run.gen, msg)
        if isinstance(msg, Resize):
            return [forward] if "pty" in run.relays else []
        if msg.stream == "stdin":
            return [self._log("stream_wrong_direction", run, stream=msg.stream, what=msg.TYPE)]
        return self._relay(run, msg, forward)

    def _while_hand_away(self, run: Run, msg: StreamAck | Resize) -> list[Action]:
        """Nothing reaches an absent Hand. An acknowledgement of output is counted, its window
        too (the Hand learns both in its `stream_resume`: a window halved meanwhile and not told
        had the Hand resume past the client's limit, and the stream stopped); the last resize
        waits for the Hand."""
        if isinstance(msg, Resize):
            if "pty" in run.relays:
                run.pending_resize = msg
        elif msg.stream != "stdin" and msg.stream in run.relays:
            return self._relay(run, msg, None)
        return []

    def _relay(self, run: Run, msg: StreamAck, forward: SendToHand | SendToClient | None) -> list[Action]:
        """Count an acknowledgement in the stream's relay and forward it to the sender; with no
        sender to tell (`forward` None: a client away), counted only."""
        relay = run.relays.get(msg.stream)
        if relay is None:
            return [self._log("stream_unknown", run, stream=msg.stream)]
        window = msg.window
        if window is not None and window > relay.window:  # a growth: within the client's budget
            held = sum(x.holds for r in self.active_of(run.owner) for x in r.relays.values())
            window = grown_window(window, relay.window, held)
            if window != msg.window and forward is not None:
                forward = replace(forward, msg=msg.model_copy(update={"window": window}))
        try:
            if not relay.on_ack(msg.offset, window) and not msg.closed:
                return []  # nothing new for the sender
        except ProtocolError as exc:
            return [self._log("stream_refused", run, stream=msg.stream, why=exc.message)]
        return [forward] if forward is not None else []

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
        """The Hand's result. With continuity on, a result is acknowledged (`result_ack`), the late
        and the unknown too: the Hand keeps a result until then, and the Mind has taken it (or its
        own earlier terminal won). Not one from a fenced generation: that Hand presents it again
        on its new connection."""
        known = self._runs.get(res.run_id)
        fenced = gen < self._newest_gen.get(hand, 0) or (
            known is not None and known.hand == hand and not known.terminal and known.gen != gen
        )
        ack: list[Action] = []
        if self.resume_window > 0 and not fenced:
            ack.append(SendToHand(hand, gen, ResultAck(run_id=res.run_id)))
        run, acts = self._from_hand(res.run_id, hand, gen, "result")
        if run is None:
            return acts + ack
        if run.state is RunState.SENT and can_advance(RUN_TRANSITIONS, RunState.ACCEPTED, res.state):
            # A quick call's `result` comes without an `accepted` before it (the Hand answers it at
            # once, issue 25): it is the acceptance too, and the run passes through `accepted`.
            acts = self._move(run, RunState.ACCEPTED)
        if not can_advance(RUN_TRANSITIONS, run.state, res.state):
            return [self._log("hand_input_illegal", run, what="result", state=run.state.value, result=res.state.value)]
        fields = {k: getattr(res, k) for k in OUTCOME_FIELDS}
        fields["progress_dropped"] = res.progress_dropped + run.dropped
        end = RunEnd(hand=run.hand, tool=run.tool, **fields)
        return acts + self._terminate(run, end, now, wall, durable=run.background is None) + ack

    def on_cancel_result(
        self, run_id: str, hand: str, gen: int, status: CancelStatus, now: float, wall: float
    ) -> list[Action]:
        run, acts = self._from_hand(run_id, hand, gen, "cancel_result")
        if run is None:
            return acts
        if status is CancelStatus.UNKNOWN_RUN:
            if run.cancel_sent_at is None and not run.terminal:
                # No cancel of this run went out: the answer is to one of an earlier run of the id
                # (a task's start sent again, DESIGN §5), which the Hand had already ended when the
                # cancel reached it; this run's `rpc` is behind that cancel on the connection.
                return [self._log("cancel_result_of_an_earlier_start", run, status=status.value)]
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
        if run.hand_away_since is None:  # else the cancel is delivered when the Hand is back
            acts.append(SendToHand(run.hand, run.gen, Cancel(run_id=run.run_id, reason=reason)))
            run.cancel_sent_at = now
        return CancelStatus.CANCEL_REQUESTED, acts

    def on_hand_gone(self, hand: str, gen: int, now: float, wall: float) -> list[Action]:
        """The connection of generation `gen` ended: every run it carried has an unknown outcome.
        With a resume window a foreground run waits for the Hand instead (it keeps its runs that
        long and presents them when it is back); the start run of a task does not (the task's own
        reconciliation tells what became of it)."""
        self._numbers.pop(("h", hand, str(gen)), None)
        acts: list[Action] = []
        for run in list(self._active.values()):
            if run.hand != hand or run.gen != gen:
                continue
            if self.resume_window > 0 and run.background is None:
                if run.hand_away_since is None:
                    run.hand_away_since, run.hand_away_wall = now, wall
                    acts.append(self._log("run_hand_away", run, window_s=self.resume_window))
                    acts += self._tell_away(run)
                continue
            acts += self._terminate(
                run, self._end(run, RunState.LOST, "hand connection lost before a result", now), now, wall
            )
        return acts

    # --- continuity (DESIGN §15) -----------------------------------------------------------------

    def on_runs_present(self, hand: str, gen: int, msg: RunsPresent, now: float, wall: float) -> list[Action]:
        """Hand `hand`, welcomed as generation `gen`, presents the foreground runs it still holds.

        Each run the Mind holds as non-terminal for this Hand is re-bound to `gen` (the old
        generation stays fenced: `_from_hand` accepts only the run's generation); the Hand is told
        to kill each run the Mind ended or does not know; every run of this Hand on an older
        generation that it does not present ends `lost` at once: the Hand restarted and nobody can
        know how it went. Streams resume from the offsets both sides give (`_resume_streams`), and
        a cancel or resize that came during the outage is delivered now, once."""
        if self._presented.get(hand, 0) >= gen:
            # one presentation per welcome: a Hand presenting again (or on an older connection)
            # adds nothing, and cannot grow the Mind by a run list each time
            self.foreign_inputs += 1
            return [Log("runs_present_repeated", {"hand": hand, "gen": gen, "runs": len(msg.runs)})]
        self._presented[hand] = gen
        self._newest_gen[hand] = max(gen, self._newest_gen.get(hand, 0))
        acts: list[Action] = []
        presented: set[str] = set()
        adopted = refused = 0
        forged: list[tuple[str, str]] = []
        for p in msg.runs:
            presented.add(p.run_id)
            run = self._runs.get(p.run_id)
            if run is None and p.owner is not None and p.tool is not None and self._adopting(now):
                problem = unsealed(self.seal_key, hand, p)
                if problem is not None or adopted >= ADOPT_MAX:
                    # made up by the Hand or altered (never adopted), or more than a Hand runs at
                    # once: killed, and said in one line below, not one per run
                    if problem is not None:
                        forged.append((p.run_id, problem))
                    else:
                        refused += 1
                    acts.append(SendToHand(hand, gen, Cancel(run_id=p.run_id, reason=CancelReason.INTERNAL_FAILURE)))
                    continue
                adopted += 1
                acts += self._adopt(hand, gen, p, now, wall)
                continue
            if run is None or run.hand != hand or run.terminal:
                acts.append(SendToHand(hand, gen, Cancel(run_id=p.run_id, reason=self._kill_reason(run))))
                if run is not None and run.hand == hand:
                    acts.append(self._log("run_presented_after_end", run, state=run.state.value, to_gen=gen))
                else:
                    fields = {"run_id": p.run_id, "hand": hand, "gen": gen, "what": "runs_present"}
                    acts.append(Log(AuditEvent.HAND_INPUT_UNKNOWN_RUN, fields))
                continue
            if run.gen is None or run.gen >= gen:
                self.foreign_inputs += 1  # not a newer connection than the one the run is on
                acts.append(self._log(AuditEvent.HAND_INPUT_WRONG_GENERATION, run, what="runs_present", from_gen=gen))
                continue
            opening = p.spec.window if p.spec is not None else None
            acts += self._rebind(run, gen, p.started, p.streams, now, wall, opening)
        if refused:
            acts.append(
                Log("runs_present_over_bound", {"hand": hand, "gen": gen, "refused": refused, "max": ADOPT_MAX})
            )
        if forged:
            run_id, why = forged[0]
            fields = {"hand": hand, "gen": gen, "refused": len(forged), "first": run_id, "why": why}
            acts.append(Log(AuditEvent.HAND_PRESENTED_UNSEALED, fields))
        for run in list(self._active.values()):
            if run.hand != hand or run.gen is None or run.gen >= gen or run.run_id in presented:
                continue
            why = "hand restarted: it no longer has this run"
            acts += self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall, mind_decided=True)
        return acts

    def on_hand_moved(self, hand: str, claim: int) -> tuple[list[Run], list[Action]]:
        """Another node claimed `hand` at `claim` (on a shared database, DESIGN §16): every
        foreground run of it this registry holds on an older claim (a generation is the claim) is
        that node's now, for the Hand presents the runs it holds on its new connection and that node
        adopts them and records their endings. They are forgotten here at once, no ending decided
        or written: waiting for the window to end them `lost` would tell their clients a falsehood
        while the truth is elsewhere. Returned, for the shell to move their attached clients to
        where the runs are now. A run on this claim or a newer one (the Hand came back here since)
        stays; so does a task's start run, which ends with its connection as always (§15)."""
        moved: list[Run] = []
        acts: list[Action] = []
        for run in list(self._active.values()):
            if run.hand != hand or run.gen is None or run.gen >= claim or run.background is not None:
                continue
            self._unbind(run)
            self._deactivate(run)
            del self._runs[run.run_id]
            moved.append(run)
            acts.append(self._log("run_handed_over", run, claim=claim, state=run.state.value, client=run.client))
        return moved, acts

    def _adopting(self, now: float) -> bool:
        """A Mind that restarted adopts unknown runs only within its window: past it, an attach to
        such a run was told `unknown_run`, and a run adopted later would end unheard of."""
        return self._presentations_until is not None and now < self._presentations_until

    def _adopt(self, hand: str, gen: int, p: PresentedRun, now: float, wall: float) -> list[Action]:
        """A run this registry never admitted, presented by its Hand with its owner: the Mind
        restarted (SIGTERM or a crash) while the run went on. Had this Mind's earlier life ended it
        by itself, the durable ending would be here (`restore`) and the run would be killed
        instead; so the run is adopted as it stands on the Hand (accepted or running, its streams
        at the positions the Hand gives, its deadline from the time the Hand has left), unattended
        until its owner re-attaches within the window. A result pending on the Hand follows the
        presentation and ends it as any result does."""
        assert p.owner is not None and p.tool is not None  # and sealed: `unsealed` said None
        assert p.timeout_ms is not None and p.sealed_at is not None
        grace = p.grace_ms if p.grace_ms is not None else DEFAULT_GRACE_MS
        # the Hand's word on the time left, never past the timeout the Mind sealed
        remaining = min(p.remaining_ms if p.remaining_ms is not None else 0, p.timeout_ms)
        age = max(0.0, wall - p.sealed_at)  # the run's own age, as the Mind sealed its start
        run = Run(
            run_id=p.run_id,
            hand=hand,
            tool=p.tool,
            args_digest=p.args_digest or "",
            client=None,
            req_id="",
            owner=p.owner,
            watch=True,
            timeout_ms=max(1, remaining),
            grace_ms=grace,
            created_at=now - age,
            created_wall=p.sealed_at,
            mind_deadline=now + (remaining + grace) / 1000 + MIND_DEADLINE_SLACK_S,
            state=RunState.RUNNING if p.started else RunState.ACCEPTED,
            gen=gen,
            client_away_since=now,
            client_away_wall=wall,
        )
        given: dict[str, StreamPosition] = {s.stream: s for s in p.streams}
        if p.spec is not None:
            for name, relay in relays_for_spec(p.spec).items():
                pos = given.get(name)
                if pos is not None:  # where the Hand stands: sent/acknowledged, or received/consumed
                    window = None if pos.window is None else min(pos.window, STREAM_WINDOW_CAP)
                    relay.take_up(pos.offset, pos.consumed, window)
                run.relays[name] = relay
        self._seq += 1
        run.seq = self._seq
        self._runs[run.run_id] = run
        self._activate(run)
        return [
            self._log(
                "run_adopted", run, owner=p.owner, state=run.state.value, result_pending=p.result_pending, to_gen=gen
            ),
            *self._bind_hand(run),
        ]

    def restore(
        self, end: RunEnd, owner: str, cancel_reason: CancelReason | None, args_digest: str, wall: float, now: float
    ) -> None:
        """A run this Mind ended by itself in an earlier life (`PersistEnding`, read back from the
        durable store at start): held as finished, so its Hand presenting it is told to kill it, and
        its owner attaching gets this ending, not a second one. Emits nothing."""
        if end.run_id in self._runs:
            return
        run = Run(
            run_id=end.run_id,
            hand=end.hand,
            tool=end.tool,
            args_digest=args_digest,
            client=None,
            req_id="",
            owner=owner,
            watch=False,
            timeout_ms=1,
            grace_ms=0,
            created_at=now,
            created_wall=wall,
            mind_deadline=now,
            state=end.state,
            cancel_reason=cancel_reason,
            end=end,
            ended_at=now,
            ended_wall=wall,
        )
        self._seq += 1
        run.seq = self._seq
        self._runs[run.run_id] = run
        self._finished[run.run_id] = None
        self._prune()

    def expect_presentations(self, until: float) -> None:
        """The Mind has just started: until `until` (its start plus the window) a Hand may still
        present a run this registry does not know, so an attach to such a run is told to wait
        (`resume_pending`), not that the run is unknown (DESIGN §15)."""
        self._presentations_until = until

    def _tell_away(self, run: Run) -> list[Action]:
        """The attached client hears that the Hand went away or came back (whatever its `watch`):
        it is what its terminal says while the run waits ("hand unreachable, waiting up to 47 s")."""
        if run.client is None:
            return []
        update = RunUpdate(
            run_id=run.run_id, hand=run.hand, state=run.state, gen=run.gen, hand_away_since=run.hand_away_wall
        )
        return [SendToClient(run.client, run.req_id, update)]

    @staticmethod
    def _kill_reason(run: Run | None) -> CancelReason:
        """Why a run the Hand presents must stop: the Mind's own ending of it, in the Hand's words."""
        if run is None or run.end is None:
            return CancelReason.CONNECTION_LOST  # nobody here waits for it
        if run.end.state is RunState.TIMED_OUT:
            return CancelReason.DEADLINE_EXCEEDED
        if run.end.state is RunState.CANCELLED and run.cancel_reason is not None:
            return run.cancel_reason
        return CancelReason.CONNECTION_LOST

    def _rebind(
        self,
        run: Run,
        gen: int,
        started: bool,
        streams: list[StreamPosition],
        now: float,
        wall: float,
        opening: int | None = None,
    ) -> list[Action]:
        old_gen = run.gen
        if old_gen is not None and (old := self._numbers.get(("h", run.hand, str(old_gen)))) is not None:
            old.drop_run(run.run_id)
        run.gen = gen
        run.hand_away_since = run.hand_away_wall = None
        acts: list[Action] = [
            self._log("run_rebound", run, from_gen=old_gen),
            *self._tell_away(run),
            *self._bind_hand(run),
        ]
        if run.state is RunState.SENT:  # the Hand holds it: it was accepted, the answer was cut
            acts += self._move(run, RunState.ACCEPTED)
        if started and run.state is RunState.ACCEPTED:
            acts += self._move(run, RunState.RUNNING)
        problem = self._resume_streams(run, streams, acts, opening)
        if problem is not None:
            why = f"the hand presented the run's streams inconsistently: {problem}"
            acts += self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall, mind_decided=True)
            acts.append(SendToHand(run.hand, gen, Cancel(run_id=run.run_id, reason=CancelReason.INTERNAL_FAILURE)))
            return acts
        if run.state is RunState.CANCEL_REQUESTED:
            reason = run.cancel_reason or CancelReason.USER_REQUESTED
            acts.append(SendToHand(run.hand, gen, Cancel(run_id=run.run_id, reason=reason)))
            run.cancel_sent_at = now
        if run.pending_resize is not None:
            acts.append(SendToHand(run.hand, gen, run.pending_resize))
            run.pending_resize = None
        return acts

    def _resume_streams(
        self, run: Run, streams: list[StreamPosition], acts: list[Action], opening: int | None = None
    ) -> str | None:
        """The Hand is back. Its `stdin` position (received, consumed) is where the client resends
        from: the relay rewinds there and the attached client is told. For output, the Hand resends
        from what the relay forwarded, if the client's leg held (everything forwarded reaches it);
        if the client is away too, its own resume point decides when it re-attaches. A stdin
        position without a window grants the `opening` one (the Hand states it only when it differs):
        a window grown and halved back to it, the halving lost in the cut, is not the relay's."""
        given: dict[str, StreamPosition] = {p.stream: p for p in streams}
        for name, relay in run.relays.items():
            pos = given.get(name)
            try:
                if name == "stdin":
                    if pos is None:
                        continue
                    relay.resume(pos.offset, pos.consumed)
                    granted = pos.window if pos.window is not None else opening
                    if granted is not None:  # the limit it granted less what it consumed, maybe
                        relay.narrow(granted)  # more than its window: not the client's new window
                    if run.client is not None:
                        msg = StreamResume(
                            run_id=run.run_id,
                            stream="stdin",
                            offset=pos.offset,
                            consumed=pos.consumed,
                            window=relay.window,  # the one this relay checks the client against
                        )
                        acts.append(SendToClient(run.client, run.req_id, msg))
                    continue
                if pos is not None and not (pos.consumed <= relay.acked and relay.offset <= pos.offset):
                    return f"{name} sent {pos.offset} acknowledged {pos.consumed}, relayed {relay.offset} acknowledged {relay.acked}"
                if run.client is not None:  # its leg held: it gets everything the relay forwarded
                    relay.expect_resend()
                    msg = StreamResume(
                        run_id=run.run_id,
                        stream=name,  # type: ignore[arg-type]
                        offset=relay.offset,
                        consumed=relay.acked,
                        window=relay.window,  # a change the cut kept from the Hand
                    )
                    assert run.gen is not None
                    acts.append(SendToHand(run.hand, run.gen, msg))
            except ProtocolError as exc:
                return f"{name}: {exc.message}"
        return None

    def on_attach(
        self,
        run_id: str,
        client: str,
        owner: str,
        req_id: str,
        now: float,
        wall: float,
        streams: Sequence[StreamPosition] = (),
    ) -> list[Action]:
        """Client connection `client` (identity `owner`) takes over `run_id`: only the run's owner
        may (scope checks are the shell's, as for any request); the newest attachment wins, and
        the previous one, if still attached, is told it was `replaced`. Each output stream resumes
        from the position this client gives, or from what the previous consumer acknowledged; the
        answer says where every stream stands. A run that has ended answers with its retained end."""
        run = self._runs.get(run_id)
        if run is None and self._presentations_until is not None and now < self._presentations_until:
            why = f"the mind has just started and does not hold run {run_id} yet: its hand may still present it"
            return [SendToClient(client, req_id, Error(code=ErrorCode.RESUME_PENDING, message=why))]
        if run is None:
            return [SendToClient(client, req_id, Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {run_id}"))]
        if run.owner != owner:
            why = f"run {run_id} belongs to another client: only its owner may attach"
            return [SendToClient(client, req_id, Error(code=ErrorCode.NOT_ALLOWED, message=why))]
        if run.background is not None:
            why = f"run {run_id} starts a background task: follow the task instead"
            return [SendToClient(client, req_id, Error(code=ErrorCode.NOT_ALLOWED, message=why))]
        if run.terminal:
            assert run.end is not None
            return [SendToClient(client, req_id, run.end)]
        given: dict[str, StreamPosition] = {p.stream: p for p in streams}
        points: dict[str, tuple[int, int]] = {}
        for name, relay in run.relays.items():
            if name == "stdin":
                continue
            pos = given.get(name)
            points[name] = (pos.offset, pos.consumed) if pos is not None else (relay.acked, relay.acked)
            try:  # every point checked before any relay moves: a refusal changes nothing
                check_resume(relay.acked, relay.relayed, *points[name])
            except ProtocolError as exc:
                why = f"cannot resume run {run_id} from there: {exc.message}"
                return [SendToClient(client, req_id, Error(code=ErrorCode.INVALID_PAYLOAD, message=why))]
        out: list[StreamPosition] = []
        resumes: list[StreamResume] = []
        for name, relay in run.relays.items():
            if name == "stdin":  # this client resends from what reached the Hand's leg, under its window
                out.append(
                    StreamPosition(stream="stdin", offset=relay.offset, consumed=relay.acked, window=relay.window)
                )
                continue
            offset, consumed = points[name]
            relay.resume(offset, consumed)
            pos = given.get(name)
            if pos is not None and pos.window is not None:
                relay.narrow(pos.window)  # the Hand resumes under the window the client grants now
            out.append(StreamPosition(stream=name, offset=offset, consumed=relay.acked))  # type: ignore[arg-type]
            resumes.append(
                StreamResume(run_id=run_id, stream=name, offset=offset, consumed=relay.acked, window=relay.window)  # type: ignore[arg-type]
            )
        acts: list[Action] = []
        if run.client is not None and run.client != client:
            acts.append(SendToClient(run.client, run.req_id, Replaced(run_id=run_id)))
            acts.append(self._log("run_attach_replaced", run, previous=run.client, client=client))
        self._unbind_client(run)
        run.client, run.req_id = client, req_id
        run.client_away_since = run.client_away_wall = run.keep_until = None
        acts.append(self._log("run_attached", run, client=client))
        acts += self._bind_client(run)
        if run.hand_away_since is None and run.gen is not None:
            acts += [SendToHand(run.hand, run.gen, r) for r in resumes]
        attached = Attached(
            run_id=run_id, hand=run.hand, state=run.state, streams=out, hand_away_since=run.hand_away_wall
        )
        acts.append(SendToClient(client, req_id, attached))
        return acts

    def on_detach(
        self, run_id: str, client: str, req_id: str, keep_s: float | None, now: float, wall: float
    ) -> list[Action]:
        """The attached client leaves `run_id` running unattended on purpose: kept for the window,
        or `keep_s` capped by `keep_max`. Past that the client-away rule fires (`on_tick`)."""
        run = self._runs.get(run_id)
        if run is None or run.client != client or run.terminal:
            why = f"run {run_id} is not attached to this connection"
            return [SendToClient(client, req_id, Error(code=ErrorCode.UNKNOWN_RUN, message=why))]
        keep = min(keep_s, self.keep_max) if keep_s is not None else self.resume_window
        if keep <= 0:
            why = "this mind keeps no unattended runs (its resume window is 0): ask for a keep time"
            return [SendToClient(client, req_id, Error(code=ErrorCode.NOT_ALLOWED, message=why))]
        acts: list[Action] = [SendToClient(client, req_id, Detached(run_id=run_id, keep_s=keep))]
        self._unbind_client(run)
        run.client = None
        run.client_away_since, run.client_away_wall = now, wall
        run.keep_until = now + keep
        acts.append(self._log("run_detached", run, keep_s=keep))
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
        acts = self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall, mind_decided=True)
        acts.append(SendToHand(hand, gen, Cancel(run_id=run_id, reason=CancelReason.INTERNAL_FAILURE)))
        return acts

    def on_client_gone(self, client: str, now: float, wall: float) -> list[Action]:
        """The client's connection ended. Without a window its runs are cancelled (nobody waits for
        them); with one they are left unattended for the window, for their owner to re-attach."""
        self._numbers.pop(("c", client), None)
        acts: list[Action] = []
        for run in list(self._active.values()):
            if run.client != client:
                continue
            run.client = None  # nobody left to tell
            if self.resume_window > 0:
                run.client_away_since, run.client_away_wall = now, wall
                acts.append(self._log("run_client_away", run, window_s=self.resume_window))
                continue
            _, more = self.on_cancel(run.run_id, CancelReason.CLIENT_DISCONNECTED, now, wall)
            acts += more
        return acts

    def on_tick(self, now: float, wall: float) -> list[Action]:
        """Mind-side deadlines: a run whose Hand never answered in time ends `timed_out`; past the
        resume window (or a detached run's `keep`) an absent leg's seed rule fires."""
        acts: list[Action] = []
        for run in list(self._active.values()):
            if (
                run.state is RunState.CANCEL_REQUESTED
                and run.cancel_sent_at is not None
                and run.hand_away_since is None
                and now >= run.cancel_sent_at + run.grace_ms / 1000 + CANCEL_ANSWER_S
            ):
                # asked to stop, the Hand there, and no answer past its grace: nobody can know
                why = f"the hand did not answer the cancel within {run.grace_ms / 1000 + CANCEL_ANSWER_S:g} s"
                acts += self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall, mind_decided=True)
                continue
            if now >= run.mind_deadline and can_advance(RUN_TRANSITIONS, run.state, RunState.TIMED_OUT):
                gen = run.gen
                away = run.hand_away_since is not None
                why = "no answer from the hand before the deadline"
                acts += self._terminate(run, self._end(run, RunState.TIMED_OUT, why, now), now, wall, mind_decided=True)
                if gen is not None and not away:  # an absent Hand hears it when it presents the run
                    acts.append(
                        SendToHand(run.hand, gen, Cancel(run_id=run.run_id, reason=CancelReason.DEADLINE_EXCEEDED))
                    )
                continue
            if self.resume_window > 0:
                acts += self._window_rules(run, now, wall)
        return acts

    def _window_rules(self, run: Run, now: float, wall: float) -> list[Action]:
        """The seed's rules, deferred by the window (DESIGN §15). Hand away past the window ->
        `lost` (nobody can know). Client away past the window (or its `keep`) -> cancel with
        `client_disconnected`: a request the Hand answers if it is there; if it is away too the
        Mind decides `cancelled` itself, and kills the run if the Hand ever presents it."""
        if run.hand_away_since is not None and now >= run.hand_away_since + self.resume_window:
            why = f"hand unreachable for longer than the resume window ({self.resume_window:g} s)"
            return self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall, mind_decided=True)
        if run.client_away_since is None or run.client is not None:
            return []
        until = run.keep_until if run.keep_until is not None else run.client_away_since + self.resume_window
        if now < until:
            return []
        reason = CancelReason.CLIENT_DISCONNECTED
        if run.hand_away_since is None:
            if run.state is RunState.CANCEL_REQUESTED:
                return []  # asked already: the Hand's answer ends it
            _, acts = self.on_cancel(run.run_id, reason, now, wall)
            return acts
        if run.state is RunState.SENT:
            return []  # never accepted: the Hand's presentation or its window decides
        run.cancel_reason = run.cancel_reason or reason
        end = self._end(run, RunState.CANCELLED, reason.value, now)
        return self._terminate(run, end, now, wall, mind_decided=True)

    def on_shutdown(self, now: float, wall: float) -> list[Action]:
        """The Mind is stopping: it will not be there to hear any result, so unfinished runs are lost."""
        acts: list[Action] = []
        for run in self.active():
            gen = run.gen
            why = "mind shut down before a result"
            acts += self._terminate(run, self._end(run, RunState.LOST, why, now), now, wall, mind_decided=True)
            if gen is not None:
                acts.append(SendToHand(run.hand, gen, Cancel(run_id=run.run_id, reason=CancelReason.SHUTDOWN)))
        return acts
