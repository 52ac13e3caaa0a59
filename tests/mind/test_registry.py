"""DESIGN §5's race table, row by row, on the sans-I/O registry: events fed in every order."""

import pytest

from mind.core.registry import MIND_DEADLINE_SLACK_S, Log, RunRegistry, SendToClient, SendToHand
from protocol import limits
from protocol.codes import CancelReason, CancelStatus, RejectCode
from protocol.messages import Cancel, Exec, Progress, Result, Rpc, RunEnd, RunOutput
from protocol.states import RunState

HAND = "laptop"


def setup_run(reg=None, gen=1, timeout_ms=10_000, grace_ms=1000, state="running"):
    reg = reg or RunRegistry()
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=timeout_ms, grace_ms=grace_ms)
    acts = reg.admit("r1", req, "c1", "q1", gen, True, now=0.0, wall=1000.0)
    assert any(isinstance(a, SendToHand) and isinstance(a.msg, Rpc) for a in acts)
    if state in ("accepted", "running"):
        reg.on_accepted("r1", HAND, gen, 0.1)
    if state == "running":
        reg.on_started("r1", HAND, gen, 0.2)
    return reg


def ends(acts):
    return [a.msg for a in acts if isinstance(a, SendToClient) and isinstance(a.msg, RunEnd)]


def logs(acts, event):
    return [a for a in acts if isinstance(a, Log) and a.event == event]


def ok(state="succeeded", **kw):
    return Result(run_id="r1", state=state, exit_code=0 if state == "succeeded" else None, **kw)


def test_happy_path_states_and_one_end_to_the_client():
    reg = setup_run()
    acts = reg.on_result(ok(), HAND, 1, 1.0, 1001.0)
    [end] = ends(acts)
    assert end.state is RunState.SUCCEEDED and end.exit_code == 0
    assert reg.get("r1").state is RunState.SUCCEEDED


def test_result_then_cancel_result_wins_and_cancel_is_already_done():
    reg = setup_run()
    reg.on_result(ok(), HAND, 1, 1.0, 1001.0)
    status, acts = reg.on_cancel("r1", CancelReason.USER_REQUESTED, 1.1, 1001.1)
    assert status is CancelStatus.ALREADY_DONE
    assert not any(isinstance(a, SendToHand) for a in acts)
    assert reg.get("r1").state is RunState.SUCCEEDED


def test_cancel_then_result_that_raced_it_is_still_succeeded():
    reg = setup_run()
    status, acts = reg.on_cancel("r1", CancelReason.USER_REQUESTED, 1.0, 1001.0)
    assert status is CancelStatus.CANCEL_REQUESTED
    assert [a.msg for a in acts if isinstance(a, SendToHand)] == [
        Cancel(run_id="r1", reason=CancelReason.USER_REQUESTED)
    ]
    assert reg.get("r1").state is RunState.CANCEL_REQUESTED  # a request, not an outcome
    acts = reg.on_result(ok(), HAND, 1, 1.1, 1001.1)
    assert ends(acts)[0].state is RunState.SUCCEEDED  # the command did run


def test_cancel_reaches_hand_first_and_hand_kills_tree():
    reg = setup_run()
    reg.on_cancel("r1", CancelReason.USER_REQUESTED, 1.0, 1001.0)
    reg.on_cancel_result("r1", HAND, 1, CancelStatus.CANCEL_REQUESTED, 1.05, 1001.05)
    acts = reg.on_result(Result(run_id="r1", state="cancelled", stage="term", signal=15), HAND, 1, 1.1, 1001.1)
    [end] = ends(acts)
    assert end.state is RunState.CANCELLED and end.stage.value == "term"


def test_accepting_connection_drops_before_result_is_lost_then_late_result_ignored():
    reg = setup_run()
    acts = reg.on_hand_gone(HAND, 1, 2.0, 1002.0)
    assert ends(acts)[0].state is RunState.LOST
    late = reg.on_result(ok(), HAND, 1, 2.1, 1002.1)
    assert not ends(late) and logs(late, "late_input")
    assert reg.get("r1").state is RunState.LOST and reg.late_inputs == 1


def test_reconnect_with_new_generation_old_runs_lost_and_new_gen_cannot_answer_them():
    reg = setup_run(gen=1)
    reg.on_hand_gone(HAND, 1, 2.0, 1002.0)
    acts = reg.on_result(ok(), HAND, 2, 2.1, 1002.1)
    assert not ends(acts)
    assert reg.get("r1").state is RunState.LOST


def test_result_from_wrong_generation_on_a_live_run_is_refused():
    reg = setup_run(gen=3)
    acts = reg.on_result(ok(), HAND, 4, 1.0, 1001.0)
    assert not ends(acts) and logs(acts, "hand_input_wrong_generation")
    assert reg.get("r1").state is RunState.RUNNING
    assert reg.foreign_inputs == 1


def test_another_hand_cannot_answer():
    reg = setup_run()
    acts = reg.on_result(ok(), "other-hand", 1, 1.0, 1001.0)
    assert not ends(acts) and reg.get("r1").state is RunState.RUNNING


def test_hand_deadline_reports_timed_out():
    reg = setup_run()
    acts = reg.on_result(Result(run_id="r1", state="timed_out", stage="kill", signal=9), HAND, 1, 10.0, 1010.0)
    assert ends(acts)[0].state is RunState.TIMED_OUT


def test_mind_deadline_with_no_answer_times_out_and_tells_the_hand():
    reg = setup_run(timeout_ms=1000, grace_ms=500)
    limit = 1.0 + 0.5 + MIND_DEADLINE_SLACK_S
    assert not reg.on_tick(limit - 0.01, 0)
    acts = reg.on_tick(limit, 0)
    assert ends(acts)[0].state is RunState.TIMED_OUT
    assert [a.msg for a in acts if isinstance(a, SendToHand)] == [
        Cancel(run_id="r1", reason=CancelReason.DEADLINE_EXCEEDED)
    ]
    assert not ends(reg.on_result(ok(), HAND, 1, limit + 1, 0))  # too late: first terminal won


def test_client_disconnect_cancels_unless_result_won():
    reg = setup_run()
    acts = reg.on_client_gone("c1", 1.0, 1001.0)
    assert [a.msg for a in acts if isinstance(a, SendToHand)] == [
        Cancel(run_id="r1", reason=CancelReason.CLIENT_DISCONNECTED)
    ]
    reg.on_result(Result(run_id="r1", state="cancelled", stage="term"), HAND, 1, 1.1, 1001.1)
    assert reg.get("r1").state is RunState.CANCELLED
    # and when the result won first, disconnect changes nothing
    reg2 = setup_run()
    reg2.on_result(ok(), HAND, 1, 1.0, 1001.0)
    assert not [a for a in reg2.on_client_gone("c1", 1.1, 0) if isinstance(a, SendToHand)]
    assert reg2.get("r1").state is RunState.SUCCEEDED


def test_cancel_of_accepted_then_hand_unknown_run_is_lost():
    reg = setup_run(state="accepted")
    reg.on_cancel("r1", CancelReason.USER_REQUESTED, 1.0, 0)
    acts = reg.on_cancel_result("r1", HAND, 1, CancelStatus.UNKNOWN_RUN, 1.1, 0)
    assert ends(acts)[0].state is RunState.LOST


def test_offline_and_unknown_hand_are_rejected_with_codes():
    reg = RunRegistry()
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=1000)
    [end] = ends(reg.admit("r1", req, "c1", "q1", None, True, 0.0, 0.0))
    assert end.state is RunState.REJECTED and end.reject_code is RejectCode.HAND_OFFLINE
    [end] = ends(reg.admit("r2", req, "c1", "q2", None, False, 0.0, 0.0))
    assert end.reject_code is RejectCode.UNKNOWN_HAND


def test_hand_rejection_is_terminal_and_nothing_after_counts():
    reg = setup_run(state="sent")
    acts = reg.on_rejected("r1", HAND, 1, RejectCode.DENIED_BY_POLICY, "tool exec is denied", 0.5, 0)
    assert ends(acts)[0].reject_code is RejectCode.DENIED_BY_POLICY
    assert not ends(reg.on_result(ok(), HAND, 1, 0.6, 0))


def test_result_before_accepted_is_the_acceptance_too():
    """A quick call's result comes alone (the Hand answers it at once, issue 25): the run passes
    through `accepted` and ends with the result, as if the `accepted` had come first."""
    reg = setup_run(state="sent")
    acts = reg.on_result(ok(), HAND, 1, 0.5, 0)
    moves = [(a.fields["old"], a.fields["new"]) for a in logs(acts, "run_state")]
    assert moves == [("sent", "accepted"), ("accepted", "succeeded")]
    assert [e.state for e in ends(acts)] == [RunState.SUCCEEDED] and not logs(acts, "hand_input_illegal")
    assert reg.get("r1").state is RunState.SUCCEEDED


def test_progress_never_moves_state_and_is_capped():
    reg = setup_run()
    chunk = b"x" * limits.PROGRESS_CHUNK_MAX
    forwarded = 0
    for i in range(400):
        acts = reg.on_progress(Progress(run_id="r1", stream="stdout", offset=i * len(chunk), data=chunk), HAND, 1)
        forwarded += sum(1 for a in acts if isinstance(a, SendToClient) and isinstance(a.msg, RunOutput))
        assert reg.get("r1").state is RunState.RUNNING
    assert forwarded == limits.PROGRESS_EVENTS_MAX
    assert forwarded * len(chunk) <= limits.PROGRESS_BYTES_MAX
    end = ends(reg.on_result(ok(progress_dropped=5), HAND, 1, 1.0, 0))[0]
    assert end.progress_dropped == 5 + (400 - forwarded)


def test_progress_saying_100_percent_is_not_success():
    reg = setup_run()
    reg.on_progress(Progress(run_id="r1", stream="stdout", offset=0, data=b"Build succeeded, 100%"), HAND, 1)
    assert reg.get("r1").state is RunState.RUNNING


def test_shutdown_marks_unfinished_runs_lost():
    reg = setup_run()
    acts = reg.on_shutdown(1.0, 0)
    assert ends(acts)[0].state is RunState.LOST


@pytest.mark.parametrize("order", ["result_first", "cancel_first", "gone_first", "tick_first"])
def test_exactly_one_end_whatever_the_order(order):
    reg = setup_run(timeout_ms=1000, grace_ms=0)
    events = {
        "result": lambda: reg.on_result(ok(), HAND, 1, 1.0, 0),
        "cancel": lambda: reg.on_cancel("r1", CancelReason.USER_REQUESTED, 1.0, 0)[1],
        "gone": lambda: reg.on_hand_gone(HAND, 1, 1.0, 0),
        "tick": lambda: reg.on_tick(100.0, 0),
    }
    first = order.split("_")[0]
    seq = [first] + [k for k in events if k != first]
    all_ends = []
    for k in seq:
        all_ends += ends(events[k]())
    assert len(all_ends) == 1
    assert reg.get("r1").state is all_ends[0].state


def test_finished_runs_are_retained_bounded():
    reg = RunRegistry(retain_finished=5)
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=1000)
    for i in range(20):
        reg.admit(f"r{i}", req, "c1", "q", None, True, 0.0, 0.0)
    assert reg.get("r0") is None and reg.get("r19") is not None


def test_the_hand_is_sent_the_run_first_and_a_watcher_still_hears_admitted_then_sent():
    """The Hand's `rpc` is the frame the answer waits for, so it leaves first (issue 25); what the
    client hears keeps its order (`mind exec --events` prints it)."""
    reg = RunRegistry()
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=1000, watch=True)
    acts = reg.admit("r1", req, "c1", "q1", 1, True, now=0.0, wall=0.0)
    sends = [a for a in acts if isinstance(a, (SendToHand, SendToClient))]
    assert isinstance(sends[0], SendToHand) and isinstance(sends[0].msg, Rpc)
    assert [a.msg.state.value for a in sends[1:]] == ["admitted", "sent"]
    events = [a.event for a in acts if isinstance(a, Log)]
    assert events == ["run_admitted", "run_state"]


def test_a_clients_active_runs_are_what_it_started_and_has_not_seen_end():
    """`active_of(owner)`: the runs a start's stream budget adds up (only its client's, not every
    active run), kept in step with admission, every end, and a Hand moving to another node."""
    reg = RunRegistry()
    for i, owner in enumerate(["ann", "bob", "ann", "ann"]):
        req = Exec(hand=HAND if i < 3 else "other", tool="exec", args={"argv": ["true"]}, timeout_ms=10_000)
        reg.admit(f"r{i}", req, f"c{i}", f"q{i}", 1, True, now=0.0, wall=1000.0, owner=owner)

    def ids(owner: str) -> set[str]:
        assert {r.run_id for r in reg.active_of(owner)} == {r.run_id for r in reg.active() if r.owner == owner}
        return {r.run_id for r in reg.active_of(owner)}

    assert ids("ann") == {"r0", "r2", "r3"} and ids("bob") == {"r1"} and ids("eve") == set()
    reg.on_accepted("r0", HAND, 1, 0.1)
    reg.on_result(Result(run_id="r0", state="succeeded", exit_code=0), HAND, 1, 0.5, 1000.5)
    assert ids("ann") == {"r2", "r3"}
    reg.on_cancel("r1", CancelReason.USER_REQUESTED, 0.6, 1000.6)  # bob's run waits for the Hand's end
    assert ids("bob") == {"r1"}
    moved, _ = reg.on_hand_moved(HAND, claim=2)  # another node claimed the Hand: its runs are that node's
    assert {r.run_id for r in moved} == {"r1", "r2"}
    assert ids("ann") == {"r3"} and ids("bob") == set()
