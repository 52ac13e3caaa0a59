"""A background task's start on the Mind, decided step by step, pure (DESIGN §7; issues 13 and 14).

A start waits on the Mind's own records several times before anything reaches the Hand (is the id
held already? is there such a Hand? write the snapshot stale first), and every wait is a moment in
which the connections, the run registry and the other starts of the same id can change. The races
live between those waits, so the decisions are kept here, apart from the waits: a `Start` takes the
answer of each wait together with the facts of that moment (`Facts`) and returns a `Step`: the
actions to perform in order, then at most one `need`, a question to the Mind's stores whose answer
is the next event. The asyncio task service (`mind.daemon.taskservice`) and the deterministic
simulation (`tests/sim/mind_shell.py`) are two drivers of the same decisions; neither restates them.

`TaskStarts` is the one piece of state: who waits for the Hand's answer to each start in flight,
the sender first, then any start of the same id and binding that joined it (they hear the same
truth). The verdicts on a start the Mind's records already answer are `mind.core.admission`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from mind.core.admission import (
    AskHand,
    Denial,
    JoinStart,
    StartReply,
    denial_message,
    existing_start,
    hand_offline,
    id_taken,
    joined_outcome,
    start_without_snapshot,
    touch_denial,
    use_denial,
)
from mind.core.registry import Log, StartEnded
from mind.core.scope import Scope
from mind.core.snapshots import Snapshot
from protocol.audit import AuditEvent
from protocol.codes import RejectCode
from protocol.digest import args_digest, binding_digest
from protocol.messages import (
    Background,
    Exec,
    StartOutcome,
    TaskInfo,
    TaskStart,
    TaskStartResult,
    TaskStartValue,
    TaskView,
)
from protocol.states import RunState, TaskState

W = TypeVar("W")
"""Whoever waits for a start's answer: the daemon's (peer, request id), the simulation's (conn, id)."""

START_TIMEOUT_MS = 30_000
"""Bounds only the Hand's durable admission of a task (row committed), never the task itself."""

# --- the facts of a moment, read by the shell each time a wait ends ----------------------------------


@dataclass(frozen=True)
class Facts:
    """What the shell sees now: the Hand's live generation (None: not connected), and whether a
    foreground run holds the id (a task's own start run does not: a refused start leaves nothing
    that blocks a retry, issue 14 item 4)."""

    hand_gen: int | None
    used_by_run: bool

    @property
    def connected(self) -> bool:
        return self.hand_gen is not None


# --- what the shell asks of the Mind's stores: the answer is the next event -------------------------


@dataclass(frozen=True)
class ReadSnapshot:
    """`SnapshotStore.get(task_id)` -> the snapshot or None."""

    task_id: str


@dataclass(frozen=True)
class LookUpHand:
    """Is there a (not revoked) Hand credential named `hand`? -> bool."""

    hand: str


@dataclass(frozen=True)
class InsertSnapshot:
    """`SnapshotStore.insert_new(snapshot)` -> the snapshot already under its id, or None."""

    snapshot: Snapshot


@dataclass(frozen=True)
class RetryStart:
    """`SnapshotStore.retry_start(snapshot)` -> the snapshot written, or None if the row changed."""

    snapshot: Snapshot


@dataclass(frozen=True)
class ReportStart:
    """`SnapshotStore.report(hand, info, now)` of the Hand's answer -> (snapshot or None, what)."""

    hand: str
    info: TaskInfo


@dataclass(frozen=True)
class FinishStart:
    """`SnapshotStore.finish_start(task_id)` -> the snapshot or None (as an action: awaited, the
    answer unused)."""

    task_id: str


@dataclass(frozen=True)
class DeleteSnapshot:
    """`SnapshotStore.delete(task_id)`, awaited before the next action."""

    task_id: str


Need = ReadSnapshot | LookUpHand | InsertSnapshot | RetryStart | ReportStart | FinishStart

# --- what the shell does, in order --------------------------------------------------------------------


@dataclass(frozen=True)
class Reply(Generic[W]):
    waiter: W
    msg: TaskStartResult


@dataclass(frozen=True)
class Denied(Generic[W]):
    """Count and audit a request outside `waiter`'s scope (the sentence is in the reply)."""

    waiter: W
    denial: Denial


@dataclass(frozen=True)
class Admit(Generic[W]):
    """Admit the start run (run id = task id) to the run registry, on generation `gen`: the Rpc
    goes to the Hand. `waiter`'s request id names it."""

    waiter: W
    task_id: str
    exec: Exec
    gen: int
    background: Background
    owner: str


@dataclass(frozen=True)
class Restart(Generic[W]):
    """Decide `waiter`'s start again from the beginning (the row changed under a retry)."""

    waiter: W
    req: TaskStart


@dataclass(frozen=True)
class InternalError(Generic[W]):
    """`waiter` hears `internal_error`: settling the start failed (the shell logs why)."""

    waiter: W


Action = Reply[Any] | Denied[Any] | Admit[Any] | Restart[Any] | InternalError[Any] | Log | FinishStart | DeleteSnapshot


@dataclass(frozen=True)
class Step:
    """Perform `actions` in order (store writes awaited), then ask `need`, if any: its answer and
    the facts of that moment are the next event (`on_result`). No need: the procedure is done."""

    actions: tuple[Action, ...] = ()
    need: Need | None = None


DONE = Step()


# --- the state: starts in flight ------------------------------------------------------------------------


class TaskStarts(Generic[W]):
    """Task starts sent to the Hand and not yet answered, and who waits for each answer.

    Each flight has an owner, the `Start` that claimed it. A start that finds the id free (its
    insert succeeded) while another start's retry of the same id is still in flight takes the id
    over: that retry rewrites a row that is gone and is bound to fail. The waiters of the flight it
    displaced stay with their own start (`release` gives them back to it, to decide again), never
    dropped and never answered with another binding's truth (sim seed 3380, continuity variant)."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[W]] = {}
        self._owner: dict[str, object] = {}
        self._displaced: dict[object, list[W]] = {}

    def in_flight(self, task_id: str) -> bool:
        return task_id in self._waiting

    def begin(
        self, waiter: W, req: TaskStart, task_id: str, scope: Scope, me: str, wall: float, facts: Facts
    ) -> tuple[Start[W], Step]:
        """A client's start: the attempt, and its first step. `wall` stamps a new snapshot."""
        start = Start(self, waiter, req, task_id, scope, me, wall)
        return start, start.begin(facts)

    def ended(self, a: StartEnded) -> tuple[Ending[W], Step]:
        """The start run of `a.run_id` reached its terminal: settle the snapshot, then answer every
        waiter. The waiters are taken now; a start of the id that comes later begins afresh."""
        self._owner.pop(a.run_id, None)
        ending = Ending(a, self._waiting.pop(a.run_id, []))
        return ending, ending.begin()

    # used by `Start` only
    def claim(self, task_id: str, waiter: W, owner: object) -> None:
        prev = self._owner.get(task_id)
        if prev is not None and prev is not owner and task_id in self._waiting:
            self._displaced.setdefault(prev, []).extend(self._waiting[task_id])
        self._waiting[task_id] = [waiter]
        self._owner[task_id] = owner

    def keep(self, task_id: str, waiter: W, owner: object) -> None:
        if task_id not in self._waiting:
            self.claim(task_id, waiter, owner)

    def join(self, task_id: str, waiter: W) -> None:
        self._waiting[task_id].append(waiter)

    def release(self, task_id: str, owner: object) -> list[W]:
        """The waiters of `owner`'s flight: the id's current one if it still owns it, else those
        of its flight that another start displaced."""
        if self._owner.get(task_id) is owner:
            del self._owner[task_id]
            return self._waiting.pop(task_id, [])
        return self._displaced.pop(owner, [])


def start_result(
    task_id: str,
    hand: str,
    outcome: StartOutcome,
    code: RejectCode | None,
    message: str,
    view: TaskView | None,
    waiters: list[W],
) -> list[Action]:
    """The first waiter sent the start; the others joined it (same id and binding) and hear the
    same truth, with `accepted` read as `duplicate` (their start ran nothing new)."""
    return [
        Reply(
            w,
            TaskStartResult(
                task_id=task_id,
                hand=hand,
                outcome=outcome if i == 0 else joined_outcome(outcome),
                reject_code=code,
                message=message,
                view=view,
            ),
        )
        for i, w in enumerate(waiters)
    ]


class Phase(Enum):
    READ = "read"  # is the id held already (a rare path: the id is used by a run, or the Hand is away)
    LOOKUP = "lookup"  # no snapshot and no connection: is there such a Hand at all
    INSERT = "insert"  # the snapshot is written stale before the start is sent
    RETRY = "retry"  # a start the Hand never answered is asked again: its snapshot rewritten first
    DONE = "done"


class Start(Generic[W]):
    """One client's task start, from the request to the moment it is sent (or answered)."""

    def __init__(
        self, starts: TaskStarts[W], waiter: W, req: TaskStart, task_id: str, scope: Scope, me: str, wall: float
    ) -> None:
        self.starts = starts
        self.waiter = waiter
        self.req = req
        self.task_id = task_id
        self.hand = req.hand
        self.scope = scope
        self.me = me
        self.wall = wall
        self.binding = binding_digest(req.tool, req.args, req.max_runtime_ms)
        self.phase = Phase.READ
        self._looked = Facts(None, False)
        """The facts a hand lookup was decided on (looked at again after the read, before it)."""
        self._inserted: Snapshot | None = None

    # --- events ---

    def begin(self, facts: Facts) -> Step:
        denial = use_denial(self.scope, self.hand, self.req.tool)
        if denial is not None:
            self.phase = Phase.DONE
            return Step(
                (Denied(self.waiter, denial),)
                + self._reply("rejected", RejectCode.DENIED_BY_SCOPE, denial_message(self.me, denial))
            )
        if facts.used_by_run or not facts.connected:
            # The rare paths look first; the common one (Hand connected, fresh id) goes straight to
            # the insert, which answers the same existing snapshot, in one database call.
            self.phase = Phase.READ
            return Step(need=ReadSnapshot(self.task_id))
        return self._insert()

    def on_result(self, value: Any, facts: Facts) -> Step:
        """The answer to the last step's `need`, with the facts as they are now."""
        phase = self.phase
        if phase is Phase.READ:
            if value is not None:
                return self._settle_existing(value, facts)
            self._looked = facts
            if facts.connected or facts.used_by_run:
                return self._without_snapshot(True)
            self.phase = Phase.LOOKUP
            return Step(need=LookUpHand(self.hand))
        if phase is Phase.LOOKUP:
            return self._without_snapshot(bool(value))
        if phase is Phase.INSERT:
            if value is not None:
                return self._settle_existing(value, facts)
            if not facts.connected:  # the Hand went while we waited on the database
                self.phase = Phase.DONE
                return Step((DeleteSnapshot(self.task_id),) + self._answer(hand_offline(self.hand)))
            self.starts.claim(self.task_id, self.waiter, self)
            assert self._inserted is not None
            return self._send(self._inserted, facts)
        if phase is Phase.RETRY:
            if value is None:  # the row changed meanwhile (reported, or forgotten): decide again
                self.phase = Phase.DONE
                return Step(tuple(Restart(w, self.req) for w in self.starts.release(self.task_id, self)))
            logged = Log(
                AuditEvent.TASK_START_ASKED_AGAIN, {"task_id": self.task_id, "hand": self.hand, "client": self.me}
            )
            sent = self._send(value, facts)
            return Step((logged,) + sent.actions)
        raise ValueError(f"start of {self.task_id}: no answer is awaited ({phase.value})")

    def failed(self, error: bool) -> list[Action]:
        """A wait failed (`error`) or was cancelled: a retry's claim is given up, so a later start
        of the id is not left joining a start nobody sends. Starts that joined this one hear
        `internal_error` (this start's own waiter hears it from the shell that saw the failure)."""
        joined: list[W] = []
        if self.phase is Phase.RETRY:
            joined = [w for w in self.starts.release(self.task_id, self) if w != self.waiter]
        self.phase = Phase.DONE
        return [InternalError(w) for w in joined] if error else []

    # --- decisions ---

    def _without_snapshot(self, known: bool) -> Step:
        looked = self._looked
        refused = start_without_snapshot(
            self.task_id,
            self.hand,
            used_by_run=looked.used_by_run,
            hand_connected=looked.connected,
            hand_known=known,
        )
        if refused is not None:
            self.phase = Phase.DONE
            return Step(self._answer(refused))
        return self._insert()

    def _insert(self) -> Step:
        self.phase = Phase.INSERT
        self._inserted = Snapshot(
            task_id=self.task_id,
            hand=self.hand,
            tool=self.req.tool,
            args_digest=args_digest(self.req.tool, self.req.args),
            binding_digest=self.binding,
            state=TaskState.QUEUED,
            stale=True,
            created_at=self.wall,
            start_pending=True,
            owner=self.me,
        )
        return Step(need=InsertSnapshot(self._inserted))

    def _settle_existing(self, existing: Snapshot, facts: Facts) -> Step:
        task_id = self.task_id
        denial = touch_denial(
            self.scope, self.me, existing.hand, existing.owner, f"reuse task id {task_id}", task_id=task_id
        )
        if denial is not None:
            # Task ids are one namespace (the Hands key tasks by id): a taken id outside the
            # client's scope is answered exactly as a conflicting one inside it, so the answer
            # says only "taken", never which Hand or whose (audited as a scope denial).
            self.phase = Phase.DONE
            return Step((Denied(self.waiter, denial),) + self._answer(id_taken(task_id)))
        verdict = existing_start(
            existing,
            task_id,
            self.hand,
            self.binding,
            in_flight=self.starts.in_flight(task_id),
            hand_connected=facts.connected,
        )
        if isinstance(verdict, JoinStart):
            self.phase = Phase.DONE
            self.starts.join(task_id, self.waiter)
            return DONE
        if isinstance(verdict, AskHand):
            # Claimed before the write, so two retries cannot both send; later ones join.
            self.phase = Phase.RETRY
            self.starts.claim(task_id, self.waiter, self)
            return Step(need=RetryStart(verdict.snapshot))
        self.phase = Phase.DONE
        return Step(self._answer(verdict))

    def _send(self, snap: Snapshot, facts: Facts) -> Step:
        self.phase = Phase.DONE
        if facts.hand_gen is None:  # gone while the retry was written: whether the task exists is unknown
            message = f"hand {self.hand!r} went away before the start could be sent again; retry when it is connected"
            waiters = self.starts.release(self.task_id, self)
            replies = start_result(self.task_id, self.hand, "unknown", None, message, snap.view(), waiters)
            return Step((FinishStart(self.task_id), *replies))
        self.starts.keep(self.task_id, self.waiter, self)
        req = self.req
        exec_req = Exec(hand=req.hand, tool=req.tool, args=req.args, timeout_ms=START_TIMEOUT_MS)
        background = Background(max_runtime_ms=req.max_runtime_ms)
        return Step((Admit(self.waiter, self.task_id, exec_req, facts.hand_gen, background, self.me),))

    def _answer(self, r: StartReply) -> tuple[Action, ...]:
        if r.outcome == "duplicate":
            logged = Log(
                AuditEvent.TASK_START_DUPLICATE, {"task_id": self.task_id, "hand": self.hand, "client": self.me}
            )
            return (logged,) + self._reply(r.outcome, r.code, r.message, r.view)
        return self._reply(r.outcome, r.code, r.message, r.view)

    def _reply(
        self, outcome: StartOutcome, code: RejectCode | None, message: str, view: TaskView | None = None
    ) -> tuple[Action, ...]:
        acts: list[Action] = []
        if outcome == "rejected":  # the Mind's own refusals; the Hand's are audited by it (`Ending`)
            req = self.req
            fields = {
                "task_id": self.task_id,
                "hand": self.hand,
                "client": self.me,
                "tool": req.tool,
                "args_digest": args_digest(req.tool, req.args),
                "code": code.value if code is not None else None,
                "reason": message,
            }
            acts.append(Log(AuditEvent.TASK_START_REJECTED, fields))
        acts += start_result(self.task_id, self.hand, outcome, code, message, view, [self.waiter])
        return tuple(acts)


class Ending(Generic[W]):
    """A start run's terminal: the snapshot settled (fresh on success, deleted on a refusal, left
    for reconciliation otherwise), then every waiter answered."""

    def __init__(self, a: StartEnded, waiters: list[W]) -> None:
        self.a = a
        self.task_id = a.run_id
        self.hand = a.hand
        self.waiters = waiters
        self._duplicate = False
        self._how = "unanswered"
        """Which settling the answer is for: "report", "malformed" or "unanswered"."""

    def begin(self) -> Step:
        a, end = self.a, self.a.end
        if end.state is RunState.SUCCEEDED:
            try:
                value: TaskStartValue | None = TaskStartValue.model_validate(end.value)
            except ValidationError:
                value = None
            if value is not None and value.task.task_id == a.run_id:
                self._duplicate = value.duplicate
                self._how = "report"
                return Step(need=ReportStart(a.hand, value.task))
            self._how = "malformed"
            bad = () if value is not None else (Log("task_start_bad_value", {"task_id": a.run_id, "hand": a.hand}),)
            return Step(bad, need=FinishStart(a.run_id))
        if end.state is RunState.REJECTED:  # nothing stored for a refused start
            code = end.reject_code
            return Step((DeleteSnapshot(a.run_id), *self._answer("rejected", code, end.reason, None)))
        self._how = "unanswered"
        return Step(need=FinishStart(a.run_id))

    def on_result(self, value: Any, facts: Facts | None = None) -> Step:
        end = self.a.end
        if self._how == "report":
            snap, _what = value
            outcome: StartOutcome = "duplicate" if self._duplicate else "accepted"
            return Step(self._answer(outcome, None, "", snap.view() if snap is not None else None))
        if self._how == "malformed":
            return Step(self._answer("unknown", None, "the hand accepted the start but its answer was malformed", None))
        message = (
            f"the start was sent but its answer never came ({end.state.value}: {end.reason}); "
            "the task may exist: `mind task get` tells once the hand is connected"
        )
        return Step(self._answer("unknown", None, message, value.view() if value is not None else None))

    def failed(self, error: bool) -> list[Action]:
        """Settling failed: the waiters hear `internal_error` rather than silence."""
        return [InternalError(w) for w in self.waiters] if error else []

    def _answer(
        self, outcome: StartOutcome, code: RejectCode | None, message: str, view: TaskView | None
    ) -> tuple[Action, ...]:
        fields = {
            "task_id": self.task_id,
            "hand": self.hand,
            "outcome": outcome,
            "reject_code": code.value if code is not None else None,
            "reason": message,
            "start_run": self.a.end.state.value,
        }
        replies = start_result(self.task_id, self.hand, outcome, code, message, view, self.waiters)
        return (Log(AuditEvent.TASK_START_ENDED, fields), *replies)
