"""The Mind's own verdicts (`mind.core.admission`): scope, the handshake rate limit, and the task
starts it answers without asking a Hand."""

from __future__ import annotations

from mind.core.admission import (
    AskHand,
    AuthFailures,
    Denial,
    JoinStart,
    StartReply,
    args_problem,
    denial_message,
    existing_start,
    joined_outcome,
    start_without_snapshot,
    touch_denial,
    use_denial,
)
from mind.core.scope import FULL, Scope
from mind.core.snapshots import Snapshot
from protocol.codes import RejectCode
from protocol.states import TaskState

WEB_EXEC = Scope(hands=("web-*",), tools=("exec",))


def test_scope_checks_the_hand_before_the_tool() -> None:
    assert use_denial(WEB_EXEC, "web-1", "exec") is None
    d = use_denial(WEB_EXEC, "db-1", "read_file")
    assert d == Denial("use hand 'db-1'", {"hand": "db-1"}), "nothing about tools on a hand it may not use"
    assert use_denial(WEB_EXEC, "web-1", "shell") == Denial("use tool 'shell'", {"tool": "shell"})
    assert denial_message("ci", d) == "denied_by_scope: credential 'ci' may not use hand 'db-1'"
    assert use_denial(FULL, "anything", "anything") is None


def test_whose_runs_a_client_may_touch() -> None:
    assert touch_denial(WEB_EXEC, "ci", "web-1", "ci", "cancel run r1") is None
    assert touch_denial(WEB_EXEC, "ci", "web-1", "other", "cancel run r1", run_id="r1") == Denial(
        "cancel run r1", {"run_id": "r1"}
    )
    assert touch_denial(WEB_EXEC, "ci", "db-1", "ci", "read run r1") is not None
    assert touch_denial(FULL, "admin", "db-1", "someone", "read run r1") is None


def test_the_rate_limit_slides_and_stays_bounded() -> None:
    f = AuthFailures(max_addresses=3)
    for t in range(3):
        assert not f.limited("a", float(t), limit=3, window=10.0)
        f.failed("a", float(t))
    assert f.limited("a", 5.0, limit=3, window=10.0)
    assert not f.limited("b", 5.0, limit=3, window=10.0), "per address"
    assert not f.limited("a", 10.5, limit=3, window=10.0), "the oldest failure aged out"
    for addr in ("b", "c", "d", "e"):
        f.failed(addr, 11.0)
    assert f.recent() <= 3 + 2, "a spray of addresses forgets the oldest"


def snap(hand: str = "h1", binding: str = "b", version: int = 3, state: TaskState = TaskState.RUNNING) -> Snapshot:
    return Snapshot(
        task_id="t1",
        hand=hand,
        tool="exec",
        args_digest="a",
        binding_digest=binding,
        state=state,
        stale=False,
        created_at=1.0,
        version=version,
    )


def verdict_for(s: Snapshot, *, in_flight: bool = False, hand_connected: bool = True) -> object:
    return existing_start(s, "t1", "h1", "b", in_flight=in_flight, hand_connected=hand_connected)


def test_a_start_the_hand_has_reported_is_a_duplicate_and_a_different_one_a_conflict() -> None:
    dup = verdict_for(snap())
    assert isinstance(dup, StartReply) and dup.outcome == "duplicate"
    assert dup.view is not None and dup.view.task_id == "t1"
    for other in (snap(hand="h2"), snap(binding="x"), snap(hand="h2", version=0), snap(binding="x", version=0)):
        r = verdict_for(other, in_flight=True)
        assert isinstance(r, StartReply) and r.outcome == "rejected" and r.code is RejectCode.CONFLICTING_DUPLICATE


def test_a_start_the_hand_never_answered_is_settled_by_the_hand_not_the_mind() -> None:
    """Issue 14, item 2: the Mind's record of what it sent is no answer."""
    unanswered = snap(version=0, state=TaskState.QUEUED)
    assert isinstance(verdict_for(unanswered, in_flight=True), JoinStart)
    ask = verdict_for(unanswered)
    assert isinstance(ask, AskHand) and ask.snapshot.start_pending and ask.snapshot.stale
    assert ask.snapshot.state is TaskState.QUEUED
    away = verdict_for(unanswered, hand_connected=False)
    assert isinstance(away, StartReply) and away.outcome == "unknown" and "unknown" in away.message
    assert joined_outcome("accepted") == "duplicate" and joined_outcome("unknown") == "unknown"
    assert joined_outcome("rejected") == "rejected"


def test_a_start_with_no_snapshot() -> None:
    def verdict(**kw: bool) -> RejectCode | None:
        args = {"used_by_run": False, "hand_connected": True, "hand_known": True, **kw}
        r = start_without_snapshot("t1", "h1", **args)
        return None if r is None else r.code

    assert verdict() is None
    assert verdict(used_by_run=True, hand_connected=False) is RejectCode.CONFLICTING_DUPLICATE
    assert verdict(hand_connected=False) is RejectCode.HAND_OFFLINE
    assert verdict(hand_connected=False, hand_known=False) is RejectCode.UNKNOWN_HAND


def test_arguments_are_bounded_by_their_count_of_values_before_any_work() -> None:
    assert args_problem({"argv": ["ls", "-l"], "env": {"A": "1"}}, max_items=10) is None
    assert args_problem({"pad": [[]] * 11}, max_items=10) is not None
    assert args_problem({"pad": [[[]] * 4] * 3}, max_items=10) is not None, "nested lists count too"
    assert args_problem({str(i): i for i in range(6)}, max_items=10) is not None, "keys count"
    deep: list[object] = []
    for _ in range(5000):  # deeper than any recursion limit: the walk is iterative
        deep = [deep]
    assert args_problem({"d": deep}, max_items=10_000) is None
    assert "more than 100" in (args_problem({"pad": list(range(1000))}, max_items=100) or "")
