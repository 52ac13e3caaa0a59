"""`mind runs --unattended` on the Mind's side (mind/daemon/views.py `unattended`, `ListRuns.unattended`):
a run still going with a leg away (its client gone or detached, or its Hand away) is listed; an
attended run and an ended one are not (DESIGN §15)."""

from mind.core.registry import RunRegistry
from mind.daemon.views import unattended
from protocol.messages import Exec, ListRuns, Result
from protocol.states import RunState

HAND = "laptop"


def registry() -> RunRegistry:
    reg = RunRegistry(resume_window=60.0)
    for run_id, client in (("r1", "c1"), ("r2", "c2"), ("r3", "c3")):
        req = Exec(hand=HAND, tool="exec", args={"argv": ["sleep", "20"]}, timeout_ms=600_000)
        reg.admit(run_id, req, client, "q-" + run_id, 1, True, now=0.0, wall=1000.0, owner="alice")
        reg.on_accepted(run_id, HAND, 1, 0.1)
        reg.on_started(run_id, HAND, 1, 0.2)
    return reg


def listed(reg: RunRegistry) -> list[str]:
    return sorted(r.run_id for r in reg.history() if unattended(r))


def test_only_runs_going_on_with_a_leg_away_are_unattended():
    reg = registry()
    assert listed(reg) == []
    reg.on_client_gone("c1", now=1.0, wall=1001.0)  # its client went away: kept for the window
    reg.on_detach("r2", "c2", "d1", None, now=1.0, wall=1001.0)  # left on purpose
    assert listed(reg) == ["r1", "r2"]
    reg.on_attach("r1", "c9", "alice", "a1", now=2.0, wall=1002.0)  # taken up again
    assert listed(reg) == ["r2"]
    reg.on_result(Result(run_id="r2", state=RunState.SUCCEEDED, exit_code=0), HAND, 1, 3.0, 1003.0)
    assert listed(reg) == []  # ended: nothing to attach to
    reg.on_hand_gone(HAND, 1, now=4.0, wall=1004.0)  # r1 and r3 wait for their Hand
    assert listed(reg) == ["r1", "r3"]


def test_the_filter_is_optional_and_off_by_default():
    assert ListRuns().unattended is False
    assert ListRuns(unattended=True).unattended is True
