"""The Mind's own verdicts (`mind.core.admission`): scope, the handshake rate limit, and the task
starts it answers without asking a Hand."""

from __future__ import annotations

from mind.core.admission import (
    AuthFailures,
    Denial,
    denial_message,
    existing_start,
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


def snap(hand: str = "h1", binding: str = "b") -> Snapshot:
    return Snapshot(
        task_id="t1",
        hand=hand,
        tool="exec",
        args_digest="a",
        binding_digest=binding,
        state=TaskState.RUNNING,
        stale=False,
        created_at=1.0,
    )


def test_a_start_the_mind_already_holds() -> None:
    dup = existing_start(snap(), "t1", "h1", "b")
    assert dup.outcome == "duplicate" and dup.view is not None and dup.view.task_id == "t1"
    for other in (existing_start(snap(hand="h2"), "t1", "h1", "b"), existing_start(snap(binding="x"), "t1", "h1", "b")):
        assert other.outcome == "rejected" and other.code is RejectCode.CONFLICTING_DUPLICATE


def test_a_start_with_no_snapshot() -> None:
    def verdict(**kw: bool) -> RejectCode | None:
        args = {"used_by_run": False, "hand_connected": True, "hand_known": True, **kw}
        r = start_without_snapshot("t1", "h1", **args)
        return None if r is None else r.code

    assert verdict() is None
    assert verdict(used_by_run=True, hand_connected=False) is RejectCode.CONFLICTING_DUPLICATE
    assert verdict(hand_connected=False) is RejectCode.HAND_OFFLINE
    assert verdict(hand_connected=False, hand_known=False) is RejectCode.UNKNOWN_HAND
