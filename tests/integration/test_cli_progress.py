"""The status line of long waits: a person on a terminal sees it (a real pty), a script never does.

The Hand is frozen (SIGSTOP) so a run waits to be accepted for as long as the test needs, and the
Mind's keepalive is slow here so it does not give up on the frozen Hand meanwhile. stderr is the
pty, stdout a pipe: the status goes to the terminal only, and not one byte of it into stdout.
"""

import json
import os
import pty
import select
import signal
import subprocess
import time

import pytest

from mind.testing.cluster import BIN, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind and Hand, and the CLI on a terminal

STATUS_BYTES = (b"\x1b[K", b"\r", b"waiting")


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("progress"), mind_args=("--ping-interval", "60")) as cl:
        yield cl


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} on the terminal; got {buf[-300:]!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: every writer closed the pty
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}; got {buf[-300:]!r}"
            buf += chunk
    return buf


def drain(fd: int, timeout: float = 10.0) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    return buf


def on_a_terminal(c, *args: str) -> tuple[subprocess.Popen, int]:
    master, slave = pty.openpty()
    p = subprocess.Popen(
        [str(BIN / "mind"), *args],
        env=c.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    return p, master


def erased_after_last_update(tty: bytes, text: bytes) -> bool:
    return b"\r\x1b[K" in tty[tty.rfind(text) :]


def frozen_hand_run(c, launch):
    """Freeze the Hand, start the CLI, let `launch` wait for what it needs, thaw the Hand."""
    hand = c.hands["box"]
    gen = c.hand_info("box")["generation"]
    hand.signal(signal.SIGSTOP)
    try:
        return launch()
    finally:
        hand.signal(signal.SIGCONT)
        c.wait_connected("box", min_gen=gen)


def test_exec_on_a_terminal_shows_the_wait_then_erases_it_and_stdout_stays_clean(c):
    def launch():
        p, master = on_a_terminal(c, "exec", "--hand", "box", "--", "echo", "done")
        try:
            return p, master, read_until(master, b"waiting for hand box to accept", 30)
        except BaseException:
            p.kill()
            raise

    p, master, seen = frozen_hand_run(c, launch)
    try:
        out, _ = p.communicate(timeout=60)
        tty = seen + drain(master)
    finally:
        os.close(master)
    # thawed, the Hand runs it, or finds its connection dead and the Mind reports the run lost
    assert p.returncode in (0, 255), tty
    assert erased_after_last_update(tty, b"waiting for hand box")
    assert not any(b in out for b in STATUS_BYTES)
    if p.returncode == 0:
        assert out == b"done\n"


def test_exec_piped_prints_no_status_at_all(c):
    def launch():
        p = c.cli_popen("exec", "--hand", "box", "--", "echo", "done")
        try:  # wait until the run has waited well past the point where a terminal would see a status
            run = wait_until(
                lambda: next((r for r in json.loads(c.cli("runs", "--json").stdout) if r["state"] == "sent"), None),
                20,
                "the run to be sent",
            )
            wait_until(lambda: time.time() - run["created_at"] > 2.5, 10, "the run to wait a while")
            return p
        except BaseException:
            p.kill()
            raise

    p = frozen_hand_run(c, launch)
    out, err = p.communicate(timeout=60)
    assert p.returncode in (0, 255), err
    assert not any(b in out for b in STATUS_BYTES)
    assert not any(b in err for b in STATUS_BYTES)


def test_task_logs_follow_on_a_terminal_says_what_it_waits_for(c):
    r = c.cli("task", "start", "--hand", "box", "--id", "quiet", "--", "sh", "-c", "echo first; exec sleep 300")
    assert r.returncode == 0, r.stderr
    p, master = on_a_terminal(c, "task", "logs", "quiet", "--follow")
    try:
        seen = read_until(master, b"bytes so far; waiting for output", 30)
        assert b"task quiet running, 6 bytes so far" in seen
        assert c.cli("task", "cancel", "quiet").returncode == 0
        out, _ = p.communicate(timeout=60)
        tty = seen + drain(master)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    assert p.returncode == 130  # --follow ends with the task's outcome: cancelled (issue 14)
    assert out == b"first\n"
    assert erased_after_last_update(tty, b"waiting for output")
