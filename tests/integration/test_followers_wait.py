"""A command that follows a run or a task, started while the Mind restarts, waits for it within the
resume window, as a running `mind exec` rides out the same gap: `mind attach RUN` 1 s after a
restart exited 125 "connection refused". Real processes: a Mind killed (-9) and started again on
its port, a Hand that keeps its runs and tasks, the CLI as a user runs it."""

from __future__ import annotations

import signal
import time

import pytest

from mind.testing.cluster import running

pytestmark = pytest.mark.slow  # a real Mind (killed and restarted), a Hand, the CLI

WINDOW = ("--resume-window", "30")


def down(cl) -> int:
    port = cl.port
    cl.mind.signal(signal.SIGKILL)
    cl.mind.p.wait(timeout=20)
    return port


def test_attach_and_task_wait_started_during_a_restart_wait_for_the_mind(tmp_path):
    with running(tmp_path, "box", mind_args=WINDOW) as cl:
        r = cl.cli("exec", "--detach", "box", "--", "sh", "-c", "sleep 3; echo done; exit 5")
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.decode().strip().split()[-1]
        t = cl.cli("task", "start", "--hand", "box", "--", "sh", "-c", "sleep 3; echo task; exit 4")
        assert t.returncode == 0, t.stderr
        task_id = t.stdout.decode().strip().split()[-1]
        port = down(cl)
        attach = cl.cli_popen("attach", run_id)
        waiter = cl.cli_popen("task", "wait", task_id)
        follow = cl.cli_popen("task", "logs", task_id, "--follow")
        time.sleep(1.5)  # they start while nobody listens on the Mind's port
        cl.start_mind(*WINDOW, port=port)
        out, err = attach.communicate(timeout=60)
        assert attach.returncode == 5 and out == b"done\n", (attach.returncode, out, err)
        assert b"waiting up to" in err and b"Traceback" not in err, err
        out, err = waiter.communicate(timeout=60)
        again = cl.cli("task", "wait", task_id)  # the same question, asked with the Mind up all along
        assert waiter.returncode == again.returncode != 125, (waiter.returncode, again.returncode, err)
        out, err = follow.communicate(timeout=60)
        assert b"task\n" in out and follow.returncode == again.returncode, (follow.returncode, out, err)


def test_a_follower_gives_up_with_a_clear_error_when_no_mind_comes(tmp_path, monkeypatch):
    """The wait is bounded: with nothing listening it ends 125 with the reason, never hangs."""
    import mind.cli.connection as connection

    with running(tmp_path, "box", mind_args=WINDOW) as cl:
        r = cl.cli("exec", "--detach", "box", "--", "sleep", "30")
        run_id = r.stdout.decode().strip().split()[-1]
        down(cl)
        started = time.monotonic()
        gone = cl.cli("attach", run_id, timeout=connection.FOLLOW_WAIT_S + 30)
        took = time.monotonic() - started
        assert gone.returncode == 125 and b"waiting up to" in gone.stderr, gone.stderr
        assert took >= connection.FOLLOW_WAIT_S - 1 and b"Traceback" not in gone.stderr, (took, gone.stderr)


def test_attach_told_resume_pending_first_still_gets_every_byte(tmp_path):
    """An attach that reaches the restarted Mind before its Hand presents the run is told
    `resume_pending` and asks again. Before, that second `attached` made no output stream: the
    bytes were dropped unacknowledged, the Hand held the result for them, and attach waited for
    ever (seen 2 runs in 3). The timing is the restart's own: tried three times."""
    with running(tmp_path, "box", mind_args=WINDOW) as cl:
        for attempt in range(3):
            r = cl.cli("exec", "--detach", "box", "--", "sh", "-c", f"sleep 3; echo done {attempt}; exit 5")
            run_id = r.stdout.decode().strip().split()[-1]
            port = down(cl)
            attach = cl.cli_popen("attach", "--json", run_id)
            time.sleep(1.5)
            cl.start_mind(*WINDOW, port=port)
            out, err = attach.communicate(timeout=30)
            lines = out.decode().splitlines()
            assert attach.returncode == 5 and len(lines) == 2, (attempt, attach.returncode, out, err)
            assert '"attached"' in lines[0] and f'"stdout": "done {attempt}\\n"' in lines[1], lines
            cl.wait_connected("box", min_gen=attempt + 2)
