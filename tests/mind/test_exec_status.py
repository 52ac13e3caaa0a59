"""`mind exec`'s status line (mind/cli/execloop.py) around the command's own output: after a Ctrl-C
the command often talks (its trap), and the line must not be drawn in front of what it says
(issue 24). No process is started: the session is fed events by hand, stderr is a fake terminal."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest

from mind.cli import execloop
from mind.cli.progress import Status
from protocol.states import RunState


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def session(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    tty = FakeTTY()
    args = SimpleNamespace(json=False, events=False, tty=False, no_stdin=True, hand="box")
    s = execloop.ExecSession(SimpleNamespace(), args)  # type: ignore[arg-type]
    s.status = Status(tty)  # stderr as a terminal
    s.run_id, s.state, s.cancel_wanted = "r-1", RunState.RUNNING, True
    s.t0 = time.monotonic() - 10
    yield s, tty
    for out in s.outs.values():
        out.finish(timeout=5.0)


def test_a_pending_cancel_shows_its_line_while_the_command_is_quiet(session):
    s, tty = session
    s._tick()
    assert "cancel requested; waiting for hand box" in tty.getvalue()


def test_the_line_is_erased_and_stays_away_while_the_command_talks(session, capfd):
    s, tty = session
    s._tick()
    assert s.status.shown
    s._act(
        s.follower.on_message(
            SimpleNamespace(
                TYPE="stream_data", run_id="r-1", stream="stdout", offset=0, data=b"trap says bye\n", eof=False
            )
        )
    )
    assert not s.status.shown and tty.getvalue().endswith("\r\x1b[K")
    drawn = len(tty.getvalue())
    s._tick()  # the writer thread may not have written yet: no line in front of it
    assert len(tty.getvalue()) == drawn and not s.status.shown
    s.last_output -= execloop.STATUS_AFTER_S  # quiet a while: the line may come back
    s._tick()
    assert s.status.shown
