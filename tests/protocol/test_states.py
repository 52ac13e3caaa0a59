import pytest

from protocol.states import (
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    TASK_TERMINAL,
    TASK_TRANSITIONS,
    IllegalTransition,
    RunState,
    TaskState,
    advance,
)


def test_terminals_never_change():
    for t in RUN_TERMINAL:
        for s in RunState:
            with pytest.raises(IllegalTransition):
                advance(RUN_TRANSITIONS, t, s)
    for t in TASK_TERMINAL:
        for s in TaskState:
            with pytest.raises(IllegalTransition):
                advance(TASK_TRANSITIONS, t, s)


def test_happy_path_and_cancel_requested_still_reaches_succeeded():
    s = RunState.ADMITTED
    for nxt in (RunState.SENT, RunState.ACCEPTED, RunState.RUNNING, RunState.CANCEL_REQUESTED, RunState.SUCCEEDED):
        s = advance(RUN_TRANSITIONS, s, nxt)
    assert s is RunState.SUCCEEDED


def test_result_before_accepted_is_illegal():
    with pytest.raises(IllegalTransition):
        advance(RUN_TRANSITIONS, RunState.SENT, RunState.SUCCEEDED)


def test_every_non_terminal_can_reach_lost_or_is_unsent():
    for s in RunState:
        if s not in RUN_TERMINAL:
            assert RunState.LOST in RUN_TRANSITIONS[s]
