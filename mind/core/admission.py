"""The Mind's verdicts on what a client asks, before anything reaches a Hand (DESIGN §4, §7, §9), pure:
the run ids a connection may name, scope (which Hands, which tools, whose runs and tasks), the
handshake rate limit, and what a task
start is told when the Mind's own records already answer it.

`mind.daemon.door` and `mind.daemon.dispatch` perform these verdicts (log, count, answer, send), and
`mind.core.taskstart` decides a task start with them (the task service performs it); the
deterministic simulation (`tests/sim/mind_shell.py`) drives the same functions, so the rules it
checks are the rules the Mind ships.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from mind.core.scope import Scope
from mind.core.snapshots import Snapshot
from protocol import limits
from protocol.codes import RejectCode
from protocol.ids import run_number
from protocol.messages import StartOutcome, TaskView

# --- named runs (DESIGN §4) ------------------------------------------------------------------------


class RunNames:
    """The run ids one client connection may name (`Exec.run_id`): `<prefix>.<n>` with its own
    prefix (its `welcome`'s) and `n` above every `n` it named before. Never another connection's
    id, never one named before (its run may have ended and left the registry): a counter says so,
    not a lookup of the history."""

    __slots__ = ("named", "prefix")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.named = 0
        """The largest `n` taken so far."""

    def take(self, run_id: str) -> str | None:
        """Take `run_id` for a run this connection starts; what is wrong with it, or None."""
        n = run_number(self.prefix, run_id)
        if n is None:
            return f"run id {run_id!r} is not one this connection may name ({self.prefix}.N)"
        if n <= self.named:
            return f"run id {run_id!r} was named before on this connection (the next is above {self.named})"
        self.named = n
        return None


# --- scope -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Denial:
    """A request outside the client's scope: `what` it may not do (for the sentence the client
    reads, "credential 'ci' may not use hand 'db1'"), and the fields to log (never arguments)."""

    what: str
    fields: Mapping[str, str] = field(default_factory=dict)


def denial_message(label: str, denial: Denial) -> str:
    return f"denied_by_scope: credential {label!r} may not {denial.what}"


def use_denial(scope: Scope, hand: str, tool: str) -> Denial | None:
    """May this client run `tool` on `hand` (a foreground run or a task start)? The Hand is checked
    first, so a client learns nothing about tools on a Hand it may not use."""
    if not scope.allows_hand(hand):
        return Denial(f"use hand {hand!r}", {"hand": hand})
    if not scope.allows_tool(tool):
        return Denial(f"use tool {tool!r}", {"tool": tool})
    return None


def touch_denial(scope: Scope, me: str, hand: str, owner: str | None, what: str, **fields: str) -> Denial | None:
    """May this client read or cancel a run or task of `owner` on `hand` (`what`: "cancel run r1")?"""
    if scope.allows_hand(hand) and scope.may_touch(owner, me):
        return None
    return Denial(what, fields)


def args_problem(args: object, max_items: int = limits.ARGS_MAX_ITEMS) -> str | None:
    """Why a request's arguments are refused before any work, or None (issue 13, item 5): more
    than `max_items` values in all (a million empty lists cost the Mind seconds to digest and
    re-encode, in a frame well under the size limit). The walk stops at the bound, so its own cost
    is bounded too. Hands still check the encoded size (`limits.ARGS_MAX_BYTES`)."""
    seen = 1
    todo: list[object] = [args]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            seen += 2 * len(value)  # keys and values, counted before any is looked at
            children: Iterable[object] = value.values()
        elif isinstance(value, (list, tuple)):
            seen += len(value)
            children = value
        else:
            continue
        if seen > max_items:
            return f"arguments hold more than {max_items} values"
        todo.extend(children)
    return None


# --- the handshake rate limit -----------------------------------------------------------------------

MAX_TRACKED_ADDRESSES = 10_000


class AuthFailures:
    """Failed (and abandoned) handshakes per peer address in a sliding window: an address with
    `limit` failures in `window` seconds is *limited* until the oldest ages out. A limited address
    is not locked out (a stranger behind the same NAT must not lock out a peer that proves its
    credential, issue 13 item 9): its handshakes are slowed and a failure is answered
    `rate_limited`, but a correct proof is still welcomed. Memory is bounded under a spray of
    addresses (the oldest address is forgotten first)."""

    def __init__(self, max_addresses: int = MAX_TRACKED_ADDRESSES) -> None:
        self._failures: dict[str, list[float]] = {}
        self._max = max_addresses

    def limited(self, addr: str, now: float, limit: int, window: float) -> bool:
        recent = [t for t in self._failures.get(addr, ()) if now - t < window]
        if recent:
            self._failures[addr] = recent
        else:
            self._failures.pop(addr, None)
        return len(recent) >= limit

    def failed(self, addr: str, now: float) -> None:
        self._failures.setdefault(addr, []).append(now)
        if len(self._failures) > self._max:
            self._failures.pop(next(iter(self._failures)))

    def recent(self) -> int:
        """Failures remembered now, over every address (for `mind status`)."""
        return sum(len(v) for v in self._failures.values())


# --- task starts the Mind answers itself --------------------------------------------------------------


@dataclass(frozen=True)
class StartReply:
    """The answer to a task start that does not need the Hand."""

    outcome: Literal["rejected", "duplicate", "unknown"]
    code: RejectCode | None = None
    message: str = ""
    view: TaskView | None = None


@dataclass(frozen=True)
class JoinStart:
    """A start of this id (same Hand and binding) is in flight: wait for the Hand's answer to it and
    hear that, rather than an answer made up from the Mind's own record (DESIGN §7)."""


@dataclass(frozen=True)
class AskHand:
    """The Mind holds the id only from a start the Hand never answered (the answer was lost, or
    reconciliation found no row): only the Hand can settle it, so the start goes to the Hand again,
    which answers with the task it has or admits it now. `snapshot` is the one to write first."""

    snapshot: Snapshot


StartVerdict = StartReply | JoinStart | AskHand


def hand_offline(hand: str) -> StartReply:
    return StartReply("rejected", RejectCode.HAND_OFFLINE, f"hand {hand!r} is not connected; nothing was stored")


def existing_start(
    existing: Snapshot, task_id: str, hand: str, binding: str, *, in_flight: bool, hand_connected: bool
) -> StartVerdict:
    """A start whose id the Mind already holds a snapshot for (the client may touch it).

    Another Hand or binding is a conflict. The same one is a duplicate (nothing new runs) only when
    the Hand itself has reported the task (`version > 0`): the Mind's record of what it *sent* is no
    answer (issue 14, item 2). Until the Hand has spoken, a retry joins the start in flight, or asks
    the Hand again, or, with the Hand away, is told that nobody knows yet."""
    if existing.hand != hand or existing.binding_digest != binding:
        return id_taken(task_id)
    if existing.version > 0 or existing.terminal:
        return StartReply(
            "duplicate", message="a task with this id and binding exists; nothing new was run", view=existing.view()
        )
    if in_flight:
        return JoinStart()
    if hand_connected:
        return AskHand(retry_snapshot(existing))
    return StartReply(
        "unknown",
        message=(
            f"an earlier start of task {task_id} was sent but never answered, and hand {hand!r} is not "
            "connected: whether the task exists is unknown; retry when it is connected"
        ),
        view=existing.view(),
    )


def retry_snapshot(existing: Snapshot) -> Snapshot:
    """The snapshot of a start asked of the Hand again: in flight again (never terminal: a start
    the Hand never reported is queued until it does)."""
    return replace(existing, stale=True, start_pending=True)


def joined_outcome(outcome: StartOutcome) -> StartOutcome:
    """What a start that joined another one in flight is told: the Hand holds one task per id, so
    when the first was accepted the joiner's start ran nothing new."""
    return "duplicate" if outcome == "accepted" else outcome


def id_taken(task_id: str) -> StartReply:
    """The one answer for an id that cannot be used: a conflicting start in the client's scope and
    any start of an id held outside it read the same (issue 13), so ids do not leak across scopes."""
    return StartReply(
        "rejected",
        RejectCode.CONFLICTING_DUPLICATE,
        f"task {task_id} already exists with another hand, tool, arguments or options",
    )


def start_without_snapshot(
    task_id: str, hand: str, *, used_by_run: bool, hand_connected: bool, hand_known: bool
) -> StartReply | None:
    """A start with no snapshot under its id: refused if a foreground run holds the id or the Hand
    cannot take it now; None when it goes on to the Hand."""
    if used_by_run:
        return StartReply("rejected", RejectCode.CONFLICTING_DUPLICATE, f"id {task_id} is already used by a run")
    if not hand_connected:
        if not hand_known:
            return StartReply("rejected", RejectCode.UNKNOWN_HAND, f"no hand named {hand!r}")
        return hand_offline(hand)
    return None
