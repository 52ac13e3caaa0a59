"""Budget / Cancellation / Lifecycle / check_active exactly as DESIGN §6 states them."""

import pytest

from protocol.codes import CancelReason
from protocol.control import (
    Budget,
    BudgetExceeded,
    Cancellation,
    Lifecycle,
    RunAborted,
    RunControl,
    check_active,
)
from protocol.states import RunState


def test_budget_reserves_before_spending_and_refuses_over_limit():
    b = Budget({"bytes": 10})
    b.reserve("bytes", 6)
    with pytest.raises(BudgetExceeded):
        b.reserve("bytes", 5)
    assert b.used("bytes") == 6  # a refused reservation spends nothing
    assert b.try_reserve("bytes", 4) and not b.try_reserve("bytes", 1)
    assert b.try_reserve("unlimited", 10**9)


def test_cancellation_first_reason_wins_and_broadcasts_once():
    c = Cancellation()
    seen = []
    c.on_cancel(seen.append)
    assert c.cancel(CancelReason.USER_REQUESTED)
    assert not c.cancel(CancelReason.SHUTDOWN)
    assert c.reason is CancelReason.USER_REQUESTED and seen == [CancelReason.USER_REQUESTED]
    late = []
    c.on_cancel(late.append)  # registered after: called at once
    assert late == [CancelReason.USER_REQUESTED]


def test_cancel_calls_every_callback_even_if_one_raises():
    c = Cancellation()
    seen = []

    def boom(_):
        raise RuntimeError("boom")

    c.on_cancel(boom)
    c.on_cancel(seen.append)
    with pytest.raises(ExceptionGroup):
        c.cancel(CancelReason.SHUTDOWN)
    assert seen == [CancelReason.SHUTDOWN]


def test_unregistered_callback_is_not_called():
    c = Cancellation()
    seen = []
    unregister = c.on_cancel(seen.append)
    unregister()
    c.cancel(CancelReason.SHUTDOWN)
    assert seen == []


def test_lifecycle_first_terminal_wins():
    lc = Lifecycle()
    assert lc.finish(RunState.SUCCEEDED, "exit 0", 1.0)
    assert not lc.finish(RunState.CANCELLED, "late", 2.0)
    assert lc.termination.state is RunState.SUCCEEDED and lc.termination.at == 1.0
    with pytest.raises(ValueError):
        lc.finish(RunState.RUNNING, "not terminal", 3.0)


def test_check_active_on_deadline_sets_fact_then_broadcasts():
    ctl = RunControl(deadline=10.0)
    order = []
    ctl.cancellation.on_cancel(lambda r: order.append(("cancel", r, ctl.lifecycle.termination.state)))
    check_active(ctl, 5.0)
    with pytest.raises(RunAborted):
        check_active(ctl, 10.0)
    assert ctl.lifecycle.termination.state is RunState.TIMED_OUT
    # the broadcast saw the terminal already set: fact first, signal second
    assert order == [("cancel", CancelReason.DEADLINE_EXCEEDED, RunState.TIMED_OUT)]
    with pytest.raises(RunAborted):
        check_active(ctl, 11.0)  # terminal already: abort


def test_check_active_when_cancelled_aborts_and_cancel_maps_reason_to_state():
    ctl = RunControl()
    ctl.cancel(CancelReason.CLIENT_DISCONNECTED, 1.0)
    assert ctl.lifecycle.termination.state is RunState.CANCELLED
    with pytest.raises(RunAborted):
        check_active(ctl, 2.0)


def test_budget_exhaustion_ends_run_budget_exhausted_and_later_cancel_loses():
    ctl = RunControl(Budget({"cpu": 1}))
    ctl.reserve("cpu", 1, 0.0)
    with pytest.raises(BudgetExceeded):
        ctl.reserve("cpu", 1, 1.0)
    assert ctl.lifecycle.termination.state is RunState.BUDGET_EXHAUSTED
    assert ctl.cancellation.reason is CancelReason.BUDGET_EXHAUSTED
    assert not ctl.lifecycle.finish(RunState.SUCCEEDED, "late", 2.0)


def test_runner_that_observes_the_end_itself_keeps_the_truth():
    ctl = RunControl(finish_on_cancel=False)
    ctl.cancel(CancelReason.USER_REQUESTED, 1.0)
    # the process had already exited 0 before the kill landed: that is what happened
    assert ctl.lifecycle.finish(RunState.SUCCEEDED, "exit 0", 1.1)


def test_every_cancel_reason_ends_a_run_in_a_state():
    """A reason added without its terminal was a KeyError on the Hand when the Mind sent it (found
    when `recording_failed` arrived): every reason maps to the terminal it ends a run in."""
    from protocol.codes import CancelReason
    from protocol.control import REASON_TO_STATE

    assert set(REASON_TO_STATE) == set(CancelReason)
