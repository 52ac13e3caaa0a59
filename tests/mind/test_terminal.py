"""The CLI's local terminal (mind/cli/terminal.py) on a real pseudo-terminal: raw mode inside, the
exact original attributes after every exit path a process can catch, window size and SIGWINCH.

Each case runs a small program whose controlling terminal is the slave of a pty this test opened,
and reads the terminal's attributes from outside, through the slave it holds."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from mind.cli.terminal import DEFAULT_SIZE, RawMode, WindowSize, raw_attributes, terminal_type, window_size

PRELUDE = """
import os, select, signal, sys, time
from mind.cli.terminal import RawMode, WindowWatch, window_size
def say(text):
    sys.stdout.write(text + "\\n"); sys.stdout.flush()
def key():
    return os.read(0, 1)
"""

CASES = {
    # the end of the `with` block: the normal end, the remote exit
    "normal": "with RawMode(0):\n    say('raw'); key()\nsay('done')",
    # an exception, and the crash it becomes when nothing catches it
    "exception": "with RawMode(0):\n    say('raw'); key(); raise RuntimeError('crash')",
    # signals from `kill`, while raw (Ctrl-C would be a byte)
    "sigterm": "with RawMode(0):\n    say('raw'); time.sleep(60)",
    "sighup": "with RawMode(0):\n    say('raw'); time.sleep(60)",
    "sigquit": "with RawMode(0):\n    say('raw'); time.sleep(60)",
    "sigint": "with RawMode(0):\n    say('raw'); time.sleep(60)",  # KeyboardInterrupt unwinds the block
    "sigint-dfl": "signal.signal(signal.SIGINT, signal.SIG_DFL)\nwith RawMode(0):\n    say('raw'); time.sleep(60)",
    # an interpreter exit that skips the block: atexit restores
    "atexit": "RawMode(0).enter()\nsay('raw'); key(); sys.exit(3)",
}
SIGNALS = {
    "sigterm": signal.SIGTERM,
    "sighup": signal.SIGHUP,
    "sigquit": signal.SIGQUIT,
    "sigint": signal.SIGINT,
    "sigint-dfl": signal.SIGINT,
}


JOB_CONTROL = """
import os, sys
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
os.setpgid(child, child)
os.tcsetpgrp(0, child)
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""What a job-control shell does: the program in a process group of its own, the terminal's
foreground group, with the shell (here, this) as its parent in the same session. Only then can it be
stopped at all: the kernel discards SIGTSTP to a process group with no such parent (an orphaned one)."""


class Pty:
    """A pty whose slave becomes the controlling terminal of the program started on it."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        attrs = termios.tcgetattr(self.slave)
        attrs[3] &= ~termios.ECHOCTL  # not the kernel's defaults, so "restored" means these exactly
        attrs[0] |= termios.IXANY
        attrs[6][termios.VERASE] = b"\x08"
        termios.tcsetattr(self.slave, termios.TCSANOW, attrs)
        self.original = termios.tcgetattr(self.slave)
        self.proc: subprocess.Popen | None = None

    def start(self, code: str, job_control: bool = False) -> subprocess.Popen:
        argv = (
            [sys.executable, "-c", JOB_CONTROL, PRELUDE + code]
            if job_control
            else [sys.executable, "-c", PRELUDE + code]
        )
        self.proc = subprocess.Popen(
            argv,
            stdin=self.slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_child_setup,
        )
        return self.proc

    def line(self, timeout: float = 10.0) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], deadline - time.monotonic())
            if ready:
                return self.proc.stdout.readline().decode().strip()
        raise AssertionError("the program printed nothing in time")

    def attrs(self) -> list:
        return termios.tcgetattr(self.slave)

    def wait(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self.master, self.slave):
            os.close(fd)


def _child_setup() -> None:
    """In the child: the pty as its terminal, and SIGINT and SIGQUIT at their defaults (a suite
    started in the background inherits them ignored, and the child would inherit that)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture
def pty():
    p = Pty()
    try:
        yield p
    finally:
        p.close()


def assert_raw(attrs: list) -> None:
    iflag, oflag, _cflag, lflag = attrs[:4]
    assert not lflag & (termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
    assert not oflag & termios.OPOST and not iflag & (termios.ICRNL | termios.IXON)
    assert attrs[6][termios.VMIN] == 1 and attrs[6][termios.VTIME] == 0


@pytest.mark.alone  # a child dies by a signal within 10 s (SIGQUIT dumps core)
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_raw_inside_and_exactly_restored_after(pty, case):
    proc = pty.start(CASES[case])
    assert pty.line() == "raw"
    assert_raw(pty.attrs())
    if case in SIGNALS:
        proc.send_signal(SIGNALS[case])
    else:
        os.write(pty.master, b"\x03")  # in raw mode Ctrl-C is the byte the program reads
    rc = pty.wait()
    assert pty.attrs() == pty.original
    expected = {
        "normal": 0,
        "exception": 1,
        "atexit": 3,
        "sigterm": -signal.SIGTERM,  # restored, then died by the signal: the parent sees the same status
        "sighup": -signal.SIGHUP,
        "sigquit": -signal.SIGQUIT,
        "sigint": -signal.SIGINT,  # Python re-raises an unhandled KeyboardInterrupt as the signal
        "sigint-dfl": -signal.SIGINT,
    }[case]
    assert rc == expected, proc.stderr.read() if proc.stderr else b""
    if case == "exception":
        assert b"RuntimeError: crash" in proc.stderr.read()


@pytest.mark.slow
def test_a_stop_restores_and_a_continue_goes_raw_again(pty):
    code = "with RawMode(0):\n    say('raw %d' % os.getpid()); key(); say('still raw'); key()\nsay('done')"
    pty.start(code, job_control=True)
    word, pid = pty.line().split()
    assert word == "raw"
    os.kill(int(pid), signal.SIGTSTP)  # `kill -TSTP`: Ctrl-Z would be a byte
    deadline = time.monotonic() + 10
    while _state(int(pid)) != "T":
        assert time.monotonic() < deadline, "the program did not stop"
        time.sleep(0.01)
    assert pty.attrs() == pty.original  # stopped with the terminal usable
    os.kill(int(pid), signal.SIGCONT)
    os.write(pty.master, b"x")
    assert pty.line() == "still raw"
    assert_raw(pty.attrs())
    os.write(pty.master, b"y")
    assert pty.line() == "done" and pty.wait() == 0
    assert pty.attrs() == pty.original


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow
def test_window_size_and_sigwinch(pty):
    termios.tcsetwinsize(pty.master, (30, 100))
    code = (
        "with RawMode(0), WindowWatch(0) as w:\n"
        "    say('size %d %d' % w.last)\n"
        "    while True:\n"
        "        ready, _, _ = select.select([0], [], [], 0.05)\n"
        "        new = w.changed()\n"
        "        if new: say('size %d %d' % new)\n"
        "        if ready: break\n"
    )
    pty.start(code)
    assert pty.line() == "size 30 100"
    termios.tcsetwinsize(pty.master, (50, 132))  # the kernel sends SIGWINCH to the foreground group
    assert pty.line() == "size 50 132"
    termios.tcsetwinsize(pty.master, (51, 133))
    assert pty.line() == "size 51 133"
    os.write(pty.master, b"q")
    assert pty.wait() == 0 and pty.attrs() == pty.original


def test_window_size_of_a_terminal_and_of_something_else():
    master, slave = os.openpty()
    try:
        termios.tcsetwinsize(slave, (33, 111))
        assert window_size(slave) == WindowSize(33, 111) and window_size(master) == (33, 111)
    finally:
        os.close(master)
        os.close(slave)
    r, w = os.pipe()
    try:
        assert window_size(r) is None
    finally:
        os.close(r)
        os.close(w)
    assert DEFAULT_SIZE == (24, 80)


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default action and SIGINT at Python's own, as in a CLI that set nothing: what
    RawMode watches. A test run that started processes has the reaper's SIGTERM handler there, and a
    suite started in the background (`cmd &` in a script) inherits SIGINT ignored; RawMode rightly
    leaves a handler or an ignored signal be."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def test_raw_mode_refuses_what_is_not_a_terminal(default_sigterm):
    r, w = os.pipe()
    try:
        raw = RawMode(r)
        with pytest.raises(termios.error):
            raw.enter()
        assert not raw.active and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        raw.restore()  # nothing to restore: a no-op
    finally:
        os.close(r)
        os.close(w)


def test_raw_mode_in_process_restores_and_puts_handlers_back(default_sigterm):
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        term_before = signal.getsignal(signal.SIGTERM)
        with RawMode(slave) as raw:
            assert raw.active
            assert_raw(termios.tcgetattr(slave))
            assert signal.getsignal(signal.SIGTERM) not in (term_before, signal.SIG_IGN)
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own: left alone
        assert termios.tcgetattr(slave) == before and signal.getsignal(signal.SIGTERM) == term_before
        raw.restore()  # idempotent
    finally:
        os.close(master)
        os.close(slave)


def test_raw_attributes_are_sshs():
    cc = [b"\x00"] * 32
    attrs = [
        termios.ICRNL | termios.IXON | termios.BRKINT,
        termios.OPOST | termios.ONLCR,
        termios.CS8,
        -1,
        38400,
        38400,
        cc,
    ]
    iflag, oflag, cflag, lflag, ispeed, ospeed, new_cc = raw_attributes(attrs)
    assert iflag & termios.IGNPAR and not iflag & (termios.ICRNL | termios.IXON) and iflag & termios.BRKINT
    assert oflag == termios.ONLCR and cflag == termios.CS8 and (ispeed, ospeed) == (38400, 38400)
    assert not lflag & (termios.ISIG | termios.ICANON | termios.ECHO | termios.IEXTEN)
    assert lflag & termios.TOSTOP  # flags raw mode does not name are kept
    assert new_cc[termios.VMIN] == 1 and new_cc[termios.VTIME] == 0 and cc[termios.VMIN] == b"\x00"


def test_terminal_type():
    assert terminal_type({"TERM": "screen-256color"}) == "screen-256color"
    assert terminal_type({}) == "dumb" and terminal_type({"TERM": ""}) == "dumb"
