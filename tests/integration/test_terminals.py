"""Terminal runs (`mind exec -t`, `mind shell`) under real pseudo-terminals, end to end: the size,
resize, keys (Ctrl-C) reaching the remote program, the exit code, `~.`, and the local terminal
restored however the CLI ends (DESIGN §11)."""

from __future__ import annotations

import json
import os
import termios
import time

import pytest
from support.term import Term

from mind.testing.cluster import BIN, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind, a real Hand, the CLI on a pty

MIND = str(BIN / "mind")


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("terminals")) as cl:
        yield cl


@pytest.fixture
def term(c):
    opened: list[Term] = []

    def open_(*args: str, rows: int = 24, cols: int = 80) -> Term:
        t = Term({**c.env, "TERM": "xterm-256color"}, [MIND, *args], rows, cols)
        opened.append(t)
        return t

    yield open_
    for t in opened:
        t.close()


def cooked() -> list:
    """A new pty's attributes: what the user's terminal was before the CLI touched it."""
    m, s = os.openpty()
    try:
        return termios.tcgetattr(s)
    finally:
        os.close(m)
        os.close(s)


def test_the_remote_terminal_has_our_size_type_and_is_controlling(term):
    t = term(
        "exec", "-t", "--hand", "box", "--", "sh", "-c", "stty size; echo TERM=$TERM; tty; exit 7", rows=33, cols=101
    )
    assert t.wait() == 7
    assert b"33 101" in t.out and b"TERM=xterm-256color" in t.out and b"/dev/pts/" in t.out
    assert t.attrs() == cooked(), "the local terminal is restored exactly"


def test_a_resize_reaches_the_remote_program(term):
    prog = (
        "import os, signal, shutil, sys, time\n"
        # os.write, not print: a SIGWINCH that lands while `print` holds stdout's buffer would make a
        # reentrant call into it (RuntimeError), which is the test's own bug, not a lost resize.
        "signal.signal(signal.SIGWINCH, lambda *a: os.write(1, b'SIZE %d %d\\n' % shutil.get_terminal_size()))\n"
        "print('READY', flush=True)\n"
        "time.sleep(20)\n"
    )
    t = term("exec", "-t", "--hand", "box", "--", "python3", "-c", prog, rows=24, cols=80)
    t.expect(b"READY")
    t.set_size(40, 120)
    t.expect(b"SIZE 120 40")
    t.type(b"\x03")  # Ctrl-C is a key for the remote program: it ends it (KeyboardInterrupt)
    assert t.wait() != 0


def test_ctrl_c_goes_to_a_remote_repl_which_keeps_running(term):
    t = term("exec", "-t", "--hand", "box", "--", "python3", "-i", "-q")
    t.expect(b">>> ")
    t.type(b"import time; time.sleep(60)\r")
    time.sleep(0.5)
    t.type(b"\x03")
    t.expect(b"KeyboardInterrupt")
    t.type(b"print(6 * 7)\r")
    t.expect(b"42")
    t.type(b"raise SystemExit(3)\r")
    assert t.wait() == 3
    assert t.attrs() == cooked()


def test_a_login_shell_and_its_exit_code(term):
    t = term("shell", "--hand", "box")
    t.type(b"echo $((6*7))-$0\r")
    t.expect(b"42--")  # argv[0] of a login shell starts with '-'
    t.type(b"exit 5\r")
    assert t.wait() == 5
    assert t.attrs() == cooked()


def test_tilde_dot_leaves_restores_the_terminal_and_cancels_the_run(c, term, tmp_path):
    marker = f"sleep-{os.getpid()}-{time.monotonic_ns()}"
    t = term("exec", "-t", "--hand", "box", "--", "python3", "-c", "import time; time.sleep(60)", marker)
    wait_until(lambda: _running(marker), 20, "the remote command to start")
    t.type(b"\r~?")
    t.expect(b"~.")  # the list of escapes
    t.type(b"\r~.")
    assert t.wait() == 255
    assert b"left the session" in t.out
    assert t.attrs() == cooked()
    wait_until(lambda: not _running(marker), 20, "the run to be cancelled on the Hand")


def test_the_terminal_is_restored_when_the_mind_is_killed(c, term):
    t = term("exec", "-t", "--hand", "box", "--", "sleep", "60")
    time.sleep(1.0)
    assert t.attrs() != cooked(), "raw mode is on while the run goes"
    c.mind.kill9()
    try:
        assert t.wait() == 255
        assert t.attrs() == cooked()
    finally:
        c.start_mind(*c.mind_args, port=c.port)
        c.wait_connected("box", min_gen=2)


def test_a_hand_that_denies_terminals_refuses_them(c, term, tmp_path):
    c.start_hand("closed", "--deny-pty")
    c.wait_connected("closed")
    t = term("exec", "-t", "--hand", "closed", "--", "true")
    assert t.wait() == 125
    assert b"denied" in t.out
    r = c.cli("exec", "--hand", "closed", "--", "echo", "no terminal, no problem")
    assert r.returncode == 0 and r.stdout == b"no terminal, no problem\n"


def _running(name: str) -> bool:
    """The remote command (a `python3` with `name` in its argv; the local CLI's argv holds it too)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                if cmd.startswith(b"python3\x00") and name.encode() in cmd:
                    return True
            except OSError:
                pass
    return False


def test_tilde_dot_cancels_at_once_on_a_mind_with_a_resume_window(tmp_path):
    """With a resume window a closed connection is a cut the Mind rides out: `~.` left the remote
    shell alive for the whole window (60 s) while saying it was cancelled. Now it asks the cancel
    first and says what the Mind answered; the remote command is gone well within the window."""
    with running(tmp_path, mind_args=("--resume-window", "60")) as cl:
        marker = f"sleep-{os.getpid()}-{time.monotonic_ns()}"
        argv = [MIND, "exec", "-t", "--hand", "box", "--", "python3", "-c", "import time; time.sleep(120)", marker]
        t = Term({**cl.env, "TERM": "xterm-256color"}, argv)
        try:
            wait_until(lambda: _running(marker), 20, "the remote command to start")
            t.type(b"\r~.")
            assert t.wait() == 255
            assert b"is being cancelled on hand box" in t.out, t.out
            wait_until(lambda: not _running(marker), 15, "the run to be cancelled on the Hand, within the window")
            state = json.loads(cl.cli("runs", "--json").stdout)
            rows = state if isinstance(state, list) else state.get("runs", [])
            assert [r["state"] for r in rows if r.get("tool") == "exec"] == ["cancelled"], rows
        finally:
            t.close()
