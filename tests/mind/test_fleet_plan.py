"""The fleet plan (mind/core/fleet.py): concurrency, the error budget (SSM's counting), delivery
windows, fail-fast, Ctrl-C, and the aggregate derived from the members only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mind.core import fleet as f
from mind.core.fleet import Cancel, FleetPlan, Skip, Start


def starts(acts):
    return [a.hand for a in acts if isinstance(a, Start)]


def names(n: int, online: bool = True) -> list[tuple[str, bool]]:
    return [(f"h{i:02d}", online) for i in range(n)]


def test_all_succeed():
    p = FleetPlan(names(3), max_concurrency=50)
    assert starts(p.next(0)) == ["h00", "h01", "h02"]
    for h in ("h00", "h01", "h02"):
        p.on_end(h, "succeeded", 1)
    agg = p.aggregate()
    assert p.done and agg.exit_code == 0 and agg.counts == {"succeeded": 3} and not agg.not_succeeded


def test_concurrency_limit_and_refill():
    p = FleetPlan(names(5), max_concurrency=2, max_errors=10)
    assert starts(p.next(0)) == ["h00", "h01"]
    assert starts(p.on_end("h01", "succeeded", 1)) == ["h02"]
    assert p.in_flight == {"h00", "h02"}


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_budget_is_exact_with_concurrency_one(budget):
    """Every run fails: exactly budget+1 run, the rest end not_started."""
    p = FleetPlan(names(10), max_concurrency=1, max_errors=budget)
    acts = p.next(0)
    ran = 0
    while True:
        s = starts(acts)
        if not s:
            break
        assert len(s) == 1
        ran += 1
        acts = p.on_end(s[0], "failed", ran)
    agg = p.aggregate()
    assert ran == budget + 1
    assert agg.counts == {"failed": budget + 1, "not_started": 10 - budget - 1}
    assert agg.budget_spent and agg.exit_code == f.EXIT_FLEET_BUDGET


def test_runs_in_flight_finish_and_are_counted_after_the_budget_is_spent():
    p = FleetPlan(names(6), max_concurrency=3, max_errors=0)
    assert starts(p.next(0)) == ["h00", "h01", "h02"]
    acts = p.on_end("h00", "failed", 1)
    assert [a for a in acts if isinstance(a, Skip)] == [
        Skip("h03", "not_started"),
        Skip("h04", "not_started"),
        Skip("h05", "not_started"),
    ]
    assert not any(isinstance(a, Cancel) for a in acts)  # not fail-fast: in flight finishes
    p.on_end("h01", "failed", 2)
    p.on_end("h02", "succeeded", 3)
    agg = p.aggregate()
    assert agg.errors == 2 and agg.counts == {"failed": 2, "succeeded": 1, "not_started": 3}


def test_fail_fast_cancels_in_flight():
    p = FleetPlan(names(4), max_concurrency=3, max_errors=5, fail_fast=True)
    p.next(0)
    acts = p.on_end("h01", "timed_out", 1)
    assert {a.hand for a in acts if isinstance(a, Cancel)} == {"h00", "h02"}
    assert Skip("h03", "not_started") in acts
    p.on_end("h00", "cancelled", 2)
    p.on_end("h02", "succeeded", 2)
    assert p.done and p.aggregate().exit_code == f.EXIT_FLEET_BUDGET


def test_offline_hands_end_hand_offline_at_once_and_are_not_errors():
    p = FleetPlan([("a", True), ("b", False), ("c", True)], max_concurrency=1)
    acts = p.next(0)
    assert Skip("b", "hand_offline") in acts and starts(acts) == ["a"]
    assert starts(p.on_end("a", "succeeded", 1)) == ["c"]
    p.on_end("c", "succeeded", 2)
    agg = p.aggregate()
    assert agg.errors == 0 and agg.exit_code == f.EXIT_FLEET_UNREACHED and agg.not_succeeded == {"b": "hand_offline"}


def test_deliver_within_waits_for_the_hand_then_undeliverable():
    p = FleetPlan([("a", True), ("late", False), ("never", False)], max_concurrency=5, deliver_within=10, now=100)
    assert starts(p.next(100)) == ["a"]
    assert p.deadline() == 110
    assert starts(p.on_online("late", 105)) == ["late"]
    assert p.next(109.9) == []
    assert p.next(110) == [Skip("never", "undeliverable")]
    p.on_end("a", "succeeded", 111)
    p.on_end("late", "succeeded", 111)
    assert p.aggregate().counts == {"succeeded": 2, "undeliverable": 1}


def test_a_hand_that_went_offline_since_the_selection_waits_within_the_window():
    p = FleetPlan([("a", True)], max_concurrency=1, deliver_within=5, now=0)
    p.next(0)
    assert p.on_end("a", "hand_offline", 1) == []
    assert "a" not in p.ends and p.deadline() == 5
    assert starts(p.on_online("a", 2)) == ["a"]
    p.on_end("a", "succeeded", 3)
    assert p.aggregate().exit_code == 0


def test_interrupt_cancels_in_flight_and_starts_nothing():
    p = FleetPlan(names(4), max_concurrency=2)
    p.next(0)
    acts = p.interrupt(1)
    assert {a.hand for a in acts if isinstance(a, Cancel)} == {"h00", "h01"}
    assert {a.hand for a in acts if isinstance(a, Skip)} == {"h02", "h03"}
    assert p.interrupt(1) == []  # a second time changes nothing
    p.on_end("h00", "cancelled", 2)
    p.on_end("h01", "succeeded", 2)  # a result that raced the cancel stands
    agg = p.aggregate()
    assert agg.exit_code == f.EXIT_FLEET_INTERRUPTED and agg.counts["succeeded"] == 1


def test_an_end_twice_or_for_a_stranger_changes_nothing():
    p = FleetPlan(names(2), max_concurrency=2)
    p.next(0)
    p.on_end("h00", "succeeded", 1)
    p.on_end("h00", "failed", 2)
    p.on_end("zz", "failed", 2)
    assert p.ends == {"h00": "succeeded"} and p.errors == 0


def test_within_budget_failures_are_fleet_failed():
    p = FleetPlan(names(3), max_concurrency=3, max_errors=1)
    p.next(0)
    p.on_end("h00", "failed", 1)
    p.on_end("h01", "succeeded", 1)
    p.on_end("h02", "succeeded", 1)
    agg = p.aggregate()
    assert not agg.budget_spent and agg.exit_code == f.EXIT_FLEET_FAILED


@pytest.mark.parametrize(
    ("text", "total", "conc", "errs"),
    [
        ("50", 3, 50, 50),
        ("10%", 15, 2, 1),
        ("100%", 1000, 1000, 1000),
        ("1%", 5, 1, 0),
        ("0%", 7, None, 0),
        ("33%", 10, 4, 3),
    ],
)
def test_percent_rounding(text, total, conc, errs):
    if conc is None:
        with pytest.raises(f.LimitError):
            f.resolve_concurrency(text, total)
    else:
        assert f.resolve_concurrency(text, total) == conc  # rounded up, at least 1
    assert f.resolve_errors(text, total) == errs  # rounded down


@pytest.mark.parametrize("bad", ["", "x", "-1", "1.5", "101%", "%", "5 %x"])
def test_bad_limits(bad):
    with pytest.raises(f.LimitError):
        f.parse_limit(bad, "max-errors")


OUTCOMES = st.sampled_from(["succeeded", "succeeded", "failed", "timed_out", "lost", "cancelled"])


@given(
    n=st.integers(1, 25),
    offline=st.sets(st.integers(0, 24)),
    conc=st.integers(1, 8),
    budget=st.integers(0, 5),
    outcomes=st.lists(OUTCOMES, min_size=25, max_size=25),
    order=st.randoms(use_true_random=False),
    fail_fast=st.booleans(),
)
def test_properties(n, offline, conc, budget, outcomes, order, fail_fast):
    """Under any interleaving of ends: never more than max_concurrency in flight; every Hand ends
    exactly once; errors <= budget + concurrency (budget + 1 with concurrency 1); once the budget is
    spent nothing starts; the aggregate's counts add up to the selection."""
    hands = [(f"h{i:02d}", i not in offline) for i in range(n)]
    p = FleetPlan(hands, max_concurrency=conc, max_errors=budget, fail_fast=fail_fast)
    eff_budget = 0 if fail_fast else budget
    acts = p.next(0)
    started: list[str] = []
    t = 0.0
    while True:
        for a in acts:
            if isinstance(a, Start):
                assert not p.budget_spent or a.hand not in started
                started.append(a.hand)
        assert len(p.in_flight) <= conc
        if not p.in_flight:
            break
        h = order.choice(sorted(p.in_flight))
        spent_before = p.budget_spent
        t += 1
        acts = p.on_end(h, outcomes[int(h[1:])], t)
        if spent_before:
            assert not any(isinstance(a, Start) for a in acts)
    assert p.done
    assert len(started) == len(set(started))
    agg = p.aggregate()
    assert sum(agg.counts.values()) == n
    assert agg.errors <= eff_budget + conc
    if conc == 1:
        assert agg.errors <= eff_budget + 1
        if agg.budget_spent:
            assert agg.errors == eff_budget + 1
    assert (agg.errors > eff_budget) == agg.budget_spent
    assert all(h in p.ends for h, _ in hands)
    if not agg.budget_spent:
        assert "not_started" not in agg.counts


def test_the_cli_exit_code_table_agrees_with_the_plan():
    from mind.cli import exits as output

    assert output.EXIT_FLEET_UNREACHED == f.EXIT_FLEET_UNREACHED
    assert output.EXIT_FLEET_FAILED == f.EXIT_FLEET_FAILED
    assert output.EXIT_FLEET_BUDGET == f.EXIT_FLEET_BUDGET
    assert output.EXIT_CANCELLED == f.EXIT_FLEET_INTERRUPTED
    single = {output.EXIT_TIMED_OUT, output.EXIT_REFUSED, output.EXIT_BUDGET, output.EXIT_INCOMPLETE, output.EXIT_LOST}
    single |= {v for k, v in vars(output).items() if k.startswith("EXIT_") and isinstance(v, int) and "FLEET" not in k}
    assert not single & {f.EXIT_FLEET_UNREACHED, f.EXIT_FLEET_FAILED, f.EXIT_FLEET_BUDGET}


def test_a_lost_connection_ends_runs_in_flight_lost_and_starts_nothing():
    p = FleetPlan([("a", True), ("b", True), ("c", False)], max_concurrency=1, deliver_within=60)
    p.next(0)
    acts = p.abandon(1)
    assert Skip("a", "lost") in acts and Skip("b", "not_started") in acts and Skip("c", "not_started") in acts
    assert p.done and p.aggregate().exit_code == f.EXIT_FLEET_LOST == 255
