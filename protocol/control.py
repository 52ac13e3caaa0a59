"""Execution control: Budget, Cancellation, Lifecycle and `check_active` (DESIGN §6, seed 000).

Three handles answer three different questions, and they must stay separate:
- Budget: "may it still spend?" - reserve before spending; over the limit raises.
- Cancellation: "must it stop?" - first reason wins; callbacks are a broadcast that interrupts
  whatever is blocked (kill a process group, cancel a waiter).
- Lifecycle: "how did it end?" - first terminal wins; the fact, immutable once set.

A reason is intent, a terminal is fact. On deadline or budget exhaustion the code sets the fact first
(`finish`) and broadcasts second (`cancel`): the callbacks' own `finish` then loses harmlessly, so the
outcome never depends on callback order or on a callback failing.

Everything here is synchronous and clock-free (time is passed in), so the Hand, the Mind registry and
the simulation share one implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protocol.codes import CancelReason
from protocol.errors import MindhandError
from protocol.states import RUN_TERMINAL, RunState


class RunAborted(MindhandError):
    """Raised at a checkpoint when the run must not go on. Not an error: the outcome is recorded."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class BudgetExceeded(RunAborted):
    def __init__(self, kind: str, limit: int, wanted: int) -> None:
        super().__init__(f"budget for {kind} exhausted: {wanted} over a limit of {limit}")
        self.kind = kind
        self.limit = limit
        self.wanted = wanted


class Budget:
    """Reserve-before-spend counters with a limit per kind ("progress_bytes", "cpu_seconds", ...)."""

    def __init__(self, limits: dict[str, int | float]) -> None:
        self._limits = dict(limits)
        self._used: dict[str, int | float] = {k: 0 for k in limits}

    def limit(self, kind: str) -> int | float | None:
        return self._limits.get(kind)

    def used(self, kind: str) -> int | float:
        return self._used.get(kind, 0)

    def try_reserve(self, kind: str, amount: int | float) -> bool:
        """Reserve `amount` if it fits; return False (and spend nothing) if it does not.

        Kinds without a limit are unlimited but still counted.
        """
        if amount < 0:
            raise ValueError("a reservation cannot be negative")
        limit = self._limits.get(kind)
        used = self._used.get(kind, 0)
        if limit is not None and used + amount > limit:
            return False
        self._used[kind] = used + amount
        return True

    def reserve(self, kind: str, amount: int | float) -> None:
        """Reserve or raise `BudgetExceeded`; the caller decides whether that ends the run."""
        if not self.try_reserve(kind, amount):
            limit = self._limits[kind]
            raise BudgetExceeded(kind, int(limit), int(self._used.get(kind, 0) + amount))


Callback = Callable[[CancelReason], None]


class Cancellation:
    """First-reason-wins cancellation with a synchronous broadcast to every registered callback."""

    def __init__(self) -> None:
        self._reason: CancelReason | None = None
        self._callbacks: list[Callback] = []

    @property
    def reason(self) -> CancelReason | None:
        return self._reason

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    def cancel(self, reason: CancelReason) -> bool:
        """Record `reason` if none is recorded yet and call every callback; False if already cancelled.

        Every callback runs even if an earlier one raises; the failures are re-raised together
        afterwards, so one broken subscriber cannot stop the others from being interrupted.
        """
        if self._reason is not None:
            return False
        self._reason = reason
        callbacks, self._callbacks = self._callbacks, []
        errors: list[Exception] = []
        for cb in callbacks:
            try:
                cb(reason)
            except Exception as exc:  # collected and re-raised below
                errors.append(exc)
        if errors:
            raise ExceptionGroup("cancel callbacks failed", errors)
        return True

    def on_cancel(self, callback: Callback) -> Callable[[], None]:
        """Register `callback`; if already cancelled it is called at once. Returns an unregister."""
        if self._reason is not None:
            callback(self._reason)
            return lambda: None
        self._callbacks.append(callback)

        def unregister() -> None:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass

        return unregister


@dataclass(frozen=True)
class Termination:
    state: RunState
    reason: str
    at: float

    def __post_init__(self) -> None:
        if self.state not in RUN_TERMINAL:
            raise ValueError(f"{self.state} is not a terminal state")
        if not self.reason:
            raise ValueError("a termination needs a reason")


class Lifecycle:
    """First-terminal-wins: the first `finish` sets the fact, later calls return False."""

    def __init__(self) -> None:
        self._termination: Termination | None = None

    @property
    def termination(self) -> Termination | None:
        return self._termination

    @property
    def done(self) -> bool:
        return self._termination is not None

    def finish(self, state: RunState, reason: str, now: float) -> bool:
        termination = Termination(state, reason, now)  # validates even when it will lose
        if self._termination is not None:
            return False
        self._termination = termination
        return True


REASON_TO_STATE: dict[CancelReason, RunState] = {
    CancelReason.USER_REQUESTED: RunState.CANCELLED,
    CancelReason.CLIENT_DISCONNECTED: RunState.CANCELLED,
    CancelReason.SHUTDOWN: RunState.CANCELLED,
    CancelReason.CONNECTION_LOST: RunState.CANCELLED,
    CancelReason.RECORDING_FAILED: RunState.CANCELLED,
    CancelReason.DEADLINE_EXCEEDED: RunState.TIMED_OUT,
    CancelReason.BUDGET_EXHAUSTED: RunState.BUDGET_EXHAUSTED,
    CancelReason.INTERNAL_FAILURE: RunState.FAILED,
}
"""Many reasons map to one terminal: intent (why stop) and fact (how it ended) stay distinct."""


class RunControl:
    """The three handles of one run plus its deadline (a time on the caller's own clock)."""

    def __init__(
        self,
        budget: Budget | None = None,
        deadline: float | None = None,
        *,
        finish_on_cancel: bool = True,
    ) -> None:
        """`finish_on_cancel`: a cancel ends the run in the state its reason maps to (seed 000's
        startRun subscriber). A runner that observes the real end itself (the Hand's process runner,
        which must report `succeeded` if the command exited on its own before the kill landed)
        passes False and calls `finish` with what it saw."""
        self.budget = budget or Budget({})
        self.cancellation = Cancellation()
        self.lifecycle = Lifecycle()
        self.deadline = deadline
        self._now_for_cancel: float = 0.0
        if finish_on_cancel:
            self.cancellation.on_cancel(self._finish_on_cancel)

    def _finish_on_cancel(self, reason: CancelReason) -> None:
        self.lifecycle.finish(REASON_TO_STATE[reason], reason.value, self._now_for_cancel)

    def cancel(self, reason: CancelReason, now: float) -> bool:
        self._now_for_cancel = now
        return self.cancellation.cancel(reason)

    def exhaust(self, kind: str, now: float) -> None:
        """Budget exhausted: set the fact first, then broadcast."""
        self.lifecycle.finish(RunState.BUDGET_EXHAUSTED, f"budget for {kind} exhausted", now)
        self.cancel(CancelReason.BUDGET_EXHAUSTED, now)

    def reserve(self, kind: str, amount: int | float, now: float) -> None:
        """A checkpoint plus a reservation; exhaustion ends the run `budget_exhausted`."""
        check_active(self, now)
        try:
            self.budget.reserve(kind, amount)
        except BudgetExceeded:
            self.exhaust(kind, now)
            raise


def check_active(ctl: RunControl, now: float) -> None:
    """The checkpoint before starting a tool, each progress send and each reservation.

    Order is fixed: an existing terminal aborts; a passed deadline sets `timed_out` and then
    broadcasts `deadline_exceeded`; a cancellation aborts.
    """
    term = ctl.lifecycle.termination
    if term is not None:
        raise RunAborted(f"run already ended: {term.state}")
    if ctl.deadline is not None and now >= ctl.deadline:
        ctl.lifecycle.finish(RunState.TIMED_OUT, CancelReason.DEADLINE_EXCEEDED.value, now)
        ctl.cancel(CancelReason.DEADLINE_EXCEEDED, now)
        raise RunAborted("deadline exceeded")
    if ctl.cancellation.cancelled:
        raise RunAborted(f"cancelled: {ctl.cancellation.reason}")
