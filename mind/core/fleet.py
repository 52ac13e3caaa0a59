"""A fleet run's plan (DESIGN §12): which Hand's run starts next, and the truthful aggregate.

Pure and sans-I/O, as the run registry: the shell (mind/client/fleet.py) feeds it events with a
time (`on_end`, `on_online`, `interrupt`, `next(now)`) and performs the actions it answers (`Start`,
`Cancel`, `Skip`). Each member is an ordinary run with its own one terminal state; the plan only
decides when runs start and derives the aggregate from the members' ends, never the other way.

Counting, as SSM Run Command's MaxConcurrency / MaxErrors:
- at most `max_concurrency` runs are in flight at any time;
- an *error* is a member run that ended anything but `succeeded` (failed, timed_out, cancelled,
  rejected, lost, budget_exhausted). A Hand that was never reached (`hand_offline`,
  `undeliverable`) is not an error: it did not run, so it says nothing about the command (as SSM's
  Undeliverable and Delivery Timed Out), but the fleet does not succeed either;
- once errors > `max_errors` no new run starts; runs in flight finish (and may fail too: they are
  counted, never hidden), and every Hand not started ends `not_started`. So a fleet sees at most
  `max_errors + max_concurrency` errors, and with concurrency 1 exactly `max_errors + 1` before it
  stops (the count of `not_started` is then exact too);
- `fail_fast`: a budget of 0, and the runs in flight are cancelled when it is spent.
Offline Hands: without `deliver_within` they end `hand_offline` at once; with it they wait for
their Hand to connect until the deadline, then end `undeliverable`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.errors import MindhandError

SUCCEEDED = "succeeded"
LOST = "lost"
NOT_STARTED = "not_started"
UNDELIVERABLE = "undeliverable"
HAND_OFFLINE = "hand_offline"
UNREACHED = frozenset({HAND_OFFLINE, UNDELIVERABLE})
"""Ends of a Hand no run reached: not errors, not successes."""
PLAN_ENDS = frozenset({NOT_STARTED, UNDELIVERABLE, HAND_OFFLINE, LOST})
"""The ends the plan decides itself (every other end is a member run's own terminal state)."""

DEFAULT_MAX_CONCURRENCY = "50"
DEFAULT_MAX_ERRORS = "0"

# --- the aggregate exit codes (README "Fleet runs"; mind/cli/exits.py holds the same numbers) ---
EXIT_OK = 0
EXIT_FLEET_UNREACHED = 118
"""Every run that started succeeded, but some Hands were never reached (offline, undeliverable)."""
EXIT_FLEET_FAILED = 120
"""Some runs did not succeed, within the error budget: every Hand was tried (or unreachable)."""
EXIT_FLEET_BUDGET = 119
"""The error budget was spent (or --fail-fast tripped) and some Hands were not started because of
it (a budget spent by the last runs, with nothing left to start, is 120)."""
EXIT_FLEET_INTERRUPTED = 130
"""Ctrl-C: the runs in flight were cancelled, nothing more started."""
EXIT_FLEET_LOST = 255
"""The connection to the Mind was lost mid-fleet: the runs in flight ended `lost`."""


class LimitError(MindhandError):
    pass


def parse_limit(text: str, what: str) -> tuple[int, bool]:
    """`N` or `P%` as (value, is_percent)."""
    t = text.strip()
    pct = t.endswith("%")
    num = t[:-1] if pct else t
    if not num.isdigit():
        raise LimitError(f"--{what} wants a count or a percentage (10, 25%), got {text!r}")
    value = int(num)
    if pct and value > 100:
        raise LimitError(f"--{what}: a percentage is at most 100%, got {text!r}")
    return value, pct


def resolve_concurrency(text: str, total: int) -> int:
    """A count, or a percentage of the selected Hands rounded up; at least 1."""
    value, pct = parse_limit(text, "max-concurrency")
    n = math.ceil(value * total / 100) if pct else value
    if n < 1:
        raise LimitError("--max-concurrency must allow at least one run")
    return n


def resolve_errors(text: str, total: int) -> int:
    """A count, or a percentage of the selected Hands rounded down (10% of 15 Hands is 1: the
    second error stops the fleet). 0 is allowed: the first error stops it."""
    value, pct = parse_limit(text, "max-errors")
    return value * total // 100 if pct else value


@dataclass(frozen=True)
class Start:
    hand: str


@dataclass(frozen=True)
class Cancel:
    hand: str


@dataclass(frozen=True)
class Skip:
    """The plan ended this Hand without (news of) its run: `state` is one of `PLAN_ENDS`
    (`lost` only when the connection to the Mind is gone: `abandon`)."""

    hand: str
    state: str


Action = Start | Cancel | Skip


@dataclass
class Aggregate:
    total: int
    counts: dict[str, int]
    not_succeeded: dict[str, str]
    """Hand -> its end, for every Hand that did not succeed (by name)."""
    errors: int
    budget_spent: bool
    interrupted: bool
    exit_code: int
    abandoned: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


@dataclass
class FleetPlan:
    hands: list[tuple[str, bool]]
    """(name, connected) for every selected Hand, in the order to start them."""
    max_concurrency: int
    max_errors: int = 0
    deliver_within: float | None = None
    fail_fast: bool = False
    now: float = 0.0
    ends: dict[str, str] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    errors: int = 0
    budget_spent: bool = False
    interrupted: bool = False
    abandoned: bool = False
    """The connection to the Mind was lost mid-fleet (`abandon`)."""
    _waiting: list[str] = field(default_factory=list)
    _offline: dict[str, float] = field(default_factory=dict)
    _started: set[str] = field(default_factory=set)
    _t0: float = 0.0

    def __post_init__(self) -> None:
        self._t0 = self.now
        if self.max_concurrency < 1:
            raise LimitError("max_concurrency must be at least 1")
        if self.max_errors < 0:
            raise LimitError("max_errors must not be negative")
        if self.fail_fast:
            self.max_errors = 0
        seen: set[str] = set()
        for name, connected in self.hands:
            if name in seen:
                raise LimitError(f"hand {name!r} selected twice")
            seen.add(name)
            if connected:
                self._waiting.append(name)
            else:
                self._offline[name] = self._first_deadline()

    # --- queries ---

    @property
    def stopped(self) -> bool:
        return self.budget_spent or self.interrupted or self.abandoned

    @property
    def done(self) -> bool:
        return len(self.ends) == len(self.hands)

    def waiting(self) -> list[str]:
        """Connected Hands not started yet, in the order they will be (a copy)."""
        return list(self._waiting)

    def offline(self) -> list[str]:
        """Hands still waiting to come online within the delivery window, sorted."""
        return sorted(self._offline)

    def pending(self) -> list[str]:
        """Hands with no end yet (waiting, offline or in flight)."""
        return [name for name, _ in self.hands if name not in self.ends]

    def deadline(self) -> float | None:
        """The next time `next(now)` has something to do by itself (an offline Hand's delivery
        window closing), or None."""
        return min(self._offline.values(), default=None)

    # --- events ---

    def next(self, now: float) -> list[Action]:
        """What to do now: plan-decided ends, then starts within the concurrency limit."""
        self.now = max(self.now, now)
        acts: list[Action] = []
        for name, until in list(self._offline.items()):
            if self.stopped:
                acts.append(self._skip(name, NOT_STARTED))
            elif until <= self.now:
                acts.append(self._skip(name, UNDELIVERABLE if self.deliver_within is not None else HAND_OFFLINE))
        if self.stopped:
            while self._waiting:
                acts.append(self._skip(self._waiting[0], NOT_STARTED))
            return acts
        while self._waiting and len(self.in_flight) < self.max_concurrency:
            name = self._waiting.pop(0)
            self.in_flight.add(name)
            self._started.add(name)
            acts.append(Start(name))
        return acts

    def on_online(self, hand: str, now: float) -> list[Action]:
        """`hand` connected: an offline member within its delivery window may start now."""
        if hand in self._offline and not self.stopped:
            del self._offline[hand]
            self._waiting.append(hand)
        return self.next(now)

    def on_end(self, hand: str, state: str, now: float) -> list[Action]:
        """A member run ended `state` (its own terminal state; `hand_offline` when the Mind
        refused it as offline, which, within a delivery window, waits for the Hand again)."""
        if hand not in self.in_flight:
            return self.next(now)  # not ours, or ended twice: the first end stands
        self.in_flight.discard(hand)
        if state == HAND_OFFLINE and self.deliver_within is not None and not self.stopped:
            # It went away between the selection and the start: wait for it within the window.
            self._offline[hand] = self._first_deadline()
            self._started.discard(hand)
            return self.next(now)
        self.ends[hand] = state
        acts: list[Action] = []
        if state != SUCCEEDED and state not in UNREACHED:
            self.errors += 1
            if self.errors > self.max_errors and not self.stopped:  # (after Ctrl-C: cancels, no budget)
                self.budget_spent = True
                if self.fail_fast:
                    acts += [Cancel(h) for h in sorted(self.in_flight)]
        return acts + self.next(now)

    def interrupt(self, now: float) -> list[Action]:
        """Ctrl-C: cancel every run in flight, start nothing more."""
        first = not self.interrupted
        self.interrupted = True
        acts: list[Action] = [Cancel(h) for h in sorted(self.in_flight)] if first else []
        return acts + self.next(now)

    def abandon(self, now: float) -> list[Action]:
        """The connection to the Mind is gone: every run in flight ends `lost` (nobody here can
        know how it went), nothing else starts (`not_started`)."""
        self.abandoned = True
        acts: list[Action] = [Skip(h, LOST) for h in sorted(self.in_flight)]
        for h in self.in_flight:
            self.ends[h] = LOST
        self.in_flight.clear()
        return acts + self.next(now)

    def _first_deadline(self) -> float:
        """The delivery window counts from the fleet's start, for every Hand alike."""
        return self._t0 + (self.deliver_within or 0.0)

    def _skip(self, name: str, state: str) -> Skip:
        self._offline.pop(name, None)
        if name in self._waiting:
            self._waiting.remove(name)
        self.ends[name] = state
        return Skip(name, state)

    # --- the result ---

    def aggregate(self) -> Aggregate:
        return aggregate(self.ends, len(self.hands), self.errors, self.budget_spent, self.interrupted, self.abandoned)


def aggregate(
    ends: dict[str, str], total: int, errors: int, budget_spent: bool, interrupted: bool, abandoned: bool = False
) -> Aggregate:
    """The fleet's result from its members' ends only (the table is in README "Fleet runs")."""
    counts: dict[str, int] = {}
    for state in ends.values():
        counts[state] = counts.get(state, 0) + 1
    bad = {h: s for h, s in sorted(ends.items()) if s != SUCCEEDED}
    pending = total - len(ends)
    if pending:
        counts["pending"] = pending
    if interrupted:
        code = EXIT_FLEET_INTERRUPTED
    elif abandoned:
        code = EXIT_FLEET_LOST
    elif budget_spent and NOT_STARTED in counts:
        code = EXIT_FLEET_BUDGET
    elif any(s not in UNREACHED for s in bad.values()) or pending:
        code = EXIT_FLEET_FAILED
    elif bad:
        code = EXIT_FLEET_UNREACHED
    else:
        code = EXIT_OK
    return Aggregate(total, counts, bad, errors, budget_spent, interrupted, code, abandoned)


def counted(states: Iterable[str]) -> int:
    """How many of `states` count against the error budget."""
    return sum(1 for s in states if s != SUCCEEDED and s not in UNREACHED and s != NOT_STARTED)
