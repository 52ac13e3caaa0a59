"""Issue 14, items 12 and 13: a task's outcome as the exit code of `mind task wait` and `mind task
logs --follow`, and stdout and stderr kept apart in a task's log (`--stream`, offsets per stream).

The end-to-end tests run a real Mind and Hand (mind.testing.cluster) and real commands; the pure parts
(the exit-code table, the per-stream `truncated` rule, the status lines, the Hand's `TaskLog` on
files) are tested without a process."""

import json
import os
from pathlib import Path

import pytest

from hand.core.tasks import stream_truncated
from hand.system.tasklogs import TaskLog, read_log, stream_log_size
from mind.cli.exits import EXIT_CANCELLED, EXIT_LOST, EXIT_TIMED_OUT, EXIT_WAIT_TIMEOUT, task_exit_code
from mind.cli.task import final_line, waiting_on
from mind.client.aio import ClientError
from mind.testing.cluster import running, wait_until
from protocol.messages import TaskInfo, TaskView
from protocol.states import TaskState

slow = pytest.mark.slow  # a real Mind and Hand; the unit tests below start nothing

WAIT_GATE = "while [ ! -e {gate} ]; do sleep 0.05; done"
N = 300
OUT = b"".join(b"out %d\n" % i for i in range(N))
ERR = b"".join(b"err %d: something on stderr\n" % i for i in range(N))
INTERLEAVED = f'i=0; while [ $i -lt {N} ]; do echo "out $i"; echo "err $i: something on stderr" >&2; i=$((i+1)); done'


@pytest.fixture
def c(tmp_path):
    with running(tmp_path) as cl:
        yield cl


@pytest.fixture
def pc(tmp_path):
    """A cluster whose Hand reaches the Mind through the fault proxy."""
    with running(tmp_path, via_proxy=True) as cl:
        yield cl


def start(c, task_id, shell, *extra):
    r = c.cli("task", "start", "--hand", "box", "--id", task_id, *extra, "--shell", shell)
    assert r.returncode == 0, r.stderr
    return r


def wait_state(c, task_id, state, timeout=30):
    return wait_until(lambda: (t := c.task(task_id))["state"] == state and t, timeout, f"task {task_id} {state}")


def finish(p, timeout=30):
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    return p.returncode, out, err


# --- item 13: stdout and stderr kept apart ------------------------------------------------------


@slow
async def test_streams_read_back_exactly_and_page_by_stable_per_stream_offsets(c):
    start(c, "mixed", INTERLEAVED)
    t = wait_state(c, "mixed", "succeeded")
    assert t["log_bytes"] == len(OUT) + len(ERR)  # the combined log is as before: both, every byte
    r = c.cli("task", "logs", "mixed", "--stream", "stdout")
    assert r.returncode == 0 and r.stdout == OUT, r.stderr
    r = c.cli("task", "logs", "mixed", "--stream", "stderr")
    assert r.returncode == 0 and r.stdout == ERR, r.stderr  # the log goes to stdout, whichever stream
    both = c.cli("task", "logs", "mixed")
    assert both.returncode == 0 and len(both.stdout) == len(OUT) + len(ERR)
    assert sorted(both.stdout.splitlines()) == sorted(OUT.splitlines() + ERR.splitlines())
    # --offset counts the named stream's bytes
    for stream, expected in (("stdout", OUT), ("stderr", ERR)):
        for off in (0, 1, 777, len(expected) - 1, len(expected)):
            r = c.cli("task", "logs", "mixed", "--stream", stream, "--offset", str(off))
            assert r.returncode == 0 and r.stdout == expected[off:], (stream, off)
    # page by page, through the client: offsets contiguous, each page the same when asked again
    async with await c.client("reader", "--read-others") as mc:
        for stream, expected in (("stdout", OUT), ("stderr", ERR)):
            got, off = b"", 0
            while True:
                page = await mc.task_logs("mixed", off, limit=500, stream=stream)
                again = await mc.task_logs("mixed", off, limit=500, stream=stream)
                assert again.data == page.data and page.offset == off
                assert page.log_bytes == len(expected) and page.truncated is False
                got += page.data
                off = page.next_offset
                if page.eof:
                    break
                assert len(page.data) == 500
            assert got == expected
        whole = await mc.task_logs("mixed", 0)
        assert whole.log_bytes == len(OUT) + len(ERR) and whole.data == both.stdout[: len(whole.data)]


@slow
def test_a_stream_is_bounded_by_itself_and_says_truncated_only_if_it_was(tmp_path):
    with running(tmp_path, "box", "--task-log-max", "1000") as cl:
        start(cl, "cut", "head -c 5000 /dev/zero | tr '\\000' x; printf 'small\\n' >&2")
        t = wait_state(cl, "cut", "succeeded")
        assert t["truncated"] is True and t["log_bytes"] == 1000
        r = cl.cli("task", "logs", "cut", "--stream", "stdout")
        assert r.stdout == b"x" * 1000 and b"stdout log was truncated" in r.stderr
        r = cl.cli("task", "logs", "cut", "--stream", "stderr")
        assert r.returncode == 0 and r.stdout == b"small\n" and b"truncated" not in r.stderr


@slow
async def test_a_task_logged_before_streams_were_kept_apart_answers_its_combined_log_only(c):
    start(c, "old", "echo one; echo two >&2")
    wait_state(c, "old", "succeeded")
    logs = c.hands["box"].state_dir / "logs"
    for stream in ("stdout", "stderr"):  # what a task of an older Hand has: the combined file only
        (logs / f"old.{stream}").unlink()
    r = c.cli("task", "logs", "old")
    assert r.returncode == 0 and sorted(r.stdout.splitlines()) == [b"one", b"two"]
    r = c.cli("task", "logs", "old", "--stream", "stderr")
    assert r.returncode == 125 and r.stdout == b""
    assert b"before this hand kept stdout and stderr apart" in r.stderr and b"Traceback" not in r.stderr
    async with await c.client("reader", "--read-others") as mc:
        with pytest.raises(ClientError) as caught:
            await mc.task_logs("old", stream="stdout")
        assert caught.value.code == "no_stream_log"
        assert (await mc.task_logs("old")).log_bytes == len(b"one\ntwo\n")


@slow
def test_stream_of_a_queued_task_is_empty_not_an_error(tmp_path):
    with running(tmp_path, "box", "--max-running-tasks", "1") as cl:
        start(cl, "first", "sleep 300")
        start(cl, "second", "echo never")
        assert cl.task("second")["state"] == "queued"
        r = cl.cli("task", "logs", "second", "--stream", "stdout")
        assert r.returncode == 0 and r.stdout == b""
        assert cl.cli("task", "cancel", "first").returncode == 0


# --- item 12: the outcome as the exit code -------------------------------------------------------


@slow
def test_logs_follow_exits_with_the_tasks_exit_code_and_plain_logs_exit_0(c):
    gate = c.hands["box"].root / "go"
    start(c, "three", f"echo begin; echo warn >&2; {WAIT_GATE.format(gate='go')}; echo end; exit 3")
    wait_state(c, "three", "running")
    both = c.cli_popen("task", "logs", "three", "--follow")
    err = c.cli_popen("task", "logs", "three", "--follow", "--stream", "stderr")
    wait_until(lambda: c.task("three")["log_bytes"] >= 11, 20, "the first bytes")
    gate.write_text("")
    code, out, _ = finish(both)
    assert code == 3 and sorted(out.splitlines()) == [b"begin", b"end", b"warn"]
    code, out, _ = finish(err)
    assert code == 3 and out == b"warn\n"
    r = c.cli("task", "logs", "three")  # not following: a log, not an outcome
    assert r.returncode == 0 and len(r.stdout) == len(b"begin\nwarn\nend\n")


@slow
def test_wait_exits_with_the_outcome_succeeded_failed_timed_out(c):
    start(c, "ok", "echo fine")
    start(c, "bad", "echo no >&2; exit 7")
    start(c, "slow", "sleep 60", "--max-runtime", "1s")
    r = c.cli("task", "wait", "ok")
    assert r.returncode == 0 and b"task ok succeeded (exit code 0)" in r.stderr and r.stdout == b""
    r = c.cli("task", "wait", "bad", "--json")
    assert r.returncode == 7 and b"task bad failed (exit code 7)" in r.stderr
    view = json.loads(r.stdout)
    assert view["state"] == "failed" and view["exit_code"] == 7 and view["stale"] is False
    r = c.cli("task", "wait", "slow")
    assert r.returncode == EXIT_TIMED_OUT and b"task slow timed_out" in r.stderr
    r = c.cli("task", "wait", "nosuch")
    assert r.returncode == 125 and b"Traceback" not in r.stderr
    r = c.cli("task", "wait", "ok", "--timeout", "soon")
    assert r.returncode == 2 and b"--timeout" in r.stderr


@slow
def test_wait_of_a_cancelled_task_exits_130(c):
    start(c, "doomed", "sleep 300")
    wait_state(c, "doomed", "running")
    p = c.cli_popen("task", "wait", "doomed")
    r = c.cli("task", "cancel", "doomed")
    assert r.returncode == 0, r.stderr
    code, out, err = finish(p)
    assert code == EXIT_CANCELLED and b"task doomed cancelled" in err and out == b""


@slow
def test_wait_timeout_passing_first_exits_121_and_the_task_goes_on(c):
    gate = c.hands["box"].root / "open"
    start(c, "gated", f"{WAIT_GATE.format(gate='open')}; echo done")
    wait_state(c, "gated", "running")
    r = c.cli("task", "wait", "gated", "--timeout", "1s", "--json")
    assert r.returncode == EXIT_WAIT_TIMEOUT
    assert b"has not ended after 1 s: running" in r.stderr and b"it goes on" in r.stderr
    assert json.loads(r.stdout)["state"] == "running"
    gate.write_text("")
    r = c.cli("task", "wait", "gated", "--timeout", "30s")
    assert r.returncode == 0 and b"succeeded" in r.stderr


@slow
def test_wait_on_a_stale_view_keeps_waiting_then_reports_the_hands_truth(pc):
    c = pc
    gen = c.hand_info("box")["generation"]
    gate = c.hands["box"].root / "late"
    start(c, "away", f"{WAIT_GATE.format(gate='late')}; exit 5")
    wait_state(c, "away", "running")
    c.proxy.send("refuse")
    c.proxy.send("cut fin")
    wait_until(lambda: not (c.hand_info("box") or {}).get("connected"), 20, "the Mind to see the Hand gone")
    gate.write_text("")  # the task ends on the Hand while the Mind cannot hear it
    wait_until(lambda: c.hand_tasks("box")["away"]["state"] == "failed", 20, "the Hand to record the end")
    r = c.cli("task", "wait", "away", "--timeout", "2s", "--json")
    assert r.returncode == EXIT_WAIT_TIMEOUT  # no guess from the stale view
    view = json.loads(r.stdout)
    assert view["stale"] is True and view["state"] == "running"
    assert b"is offline" in r.stderr
    p = c.cli_popen("task", "wait", "away")
    c.proxy.send("accept")
    c.wait_connected("box", min_gen=gen + 1, timeout=30)
    code, _, err = finish(p)
    assert code == 5 and b"task away failed (exit code 5)" in err


# --- the pure parts ---------------------------------------------------------------------------


def _view(state, exit_code=None, signal=None, *, stale=False, reason="", uncommitted=None, task=True):
    info = None
    if task:
        info = TaskInfo(
            task_id="t1",
            tool="shell",
            state=state,
            version=3,
            args_digest="0" * 64,
            binding_digest="1" * 64,
            max_runtime_ms=1000,
            created_at=1.0,
            exit_code=exit_code,
            signal=signal,
            reason=reason,
            uncommitted=uncommitted,
        )
    return TaskView(hand="box", task=info, task_id="t1", state=state, stale=stale, last_synced_at=None, created_at=1.0)


@pytest.mark.parametrize(
    ("state", "exit_code", "signal", "code"),
    [
        (TaskState.SUCCEEDED, 0, None, 0),
        (TaskState.FAILED, 3, None, 3),
        (TaskState.FAILED, 127, None, 127),
        (TaskState.FAILED, None, 9, 137),
        (TaskState.FAILED, None, None, 1),
        (TaskState.TIMED_OUT, None, 15, EXIT_TIMED_OUT),
        (TaskState.CANCELLED, None, 15, EXIT_CANCELLED),
        (TaskState.CANCELLED, 0, None, EXIT_CANCELLED),
        (TaskState.LOST, None, None, EXIT_LOST),
        (TaskState.RUNNING, None, None, None),
        (TaskState.QUEUED, None, None, None),
    ],
)
def test_task_exit_code_is_the_exec_table(state, exit_code, signal, code):
    assert task_exit_code(state, exit_code, signal) == code


def test_wait_timeout_code_is_distinct_from_every_outcome_code():
    assert EXIT_WAIT_TIMEOUT not in {0, 1, 2, 122, 123, 124, 125, 126, 127, EXIT_CANCELLED, EXIT_LOST}


def test_stream_truncated_only_when_the_combined_log_was():
    assert stream_truncated(1000, 1000, True, False) is True
    assert stream_truncated(10, 1000, True, False) is False  # the other stream filled the combined log
    assert stream_truncated(10, 1000, True, True) is True  # a log write failed: bytes are missing
    assert stream_truncated(1000, 1000, False, False) is False  # exactly the bound, nothing dropped


def test_status_and_final_lines_say_why_the_wait_goes_on():
    stale = _view(TaskState.RUNNING, stale=True)
    assert "hand 'box' is offline (last heard never), waiting for it to reconnect" in waiting_on(stale)
    kept = _view(TaskState.RUNNING, uncommitted="ended (failed, exit code 3); the Hand could not record it yet")
    assert waiting_on(kept).startswith("running; the hand says it ended (failed, exit code 3)")
    assert waiting_on(_view(TaskState.QUEUED, task=False)) == "queued"
    assert final_line(_view(TaskState.FAILED, 3)) == "task t1 failed (exit code 3)"
    assert final_line(_view(TaskState.FAILED, 3, reason="exit status 3")) == "task t1 failed (exit code 3)"
    assert final_line(_view(TaskState.CANCELLED, signal=15, reason="cancelled by client")) == (
        "task t1 cancelled (signal 15, cancelled by client)"
    )
    assert final_line(_view(TaskState.LOST, task=False)) == "task t1 lost"
    # no control character reaches a terminal
    assert final_line(_view(TaskState.LOST, reason="\x1b[2Jgone")) == "task t1 lost (\\x1b[2Jgone)"


def test_task_log_keeps_each_stream_apart_and_bounded_like_the_combined_one(tmp_path: Path):
    combined, out, err = tmp_path / "t.log", tmp_path / "t.stdout", tmp_path / "t.stderr"
    log = TaskLog(combined, {"stdout": out, "stderr": err}, cap=10)
    for stream, data in (("stdout", b"aaaa"), ("stderr", b"BB"), ("stdout", b"cccc"), ("stderr", b"DDDDDDDDDDDD")):
        log.append(stream, data)
    log.close()
    assert combined.read_bytes() == b"aaaaBBcccc" and log.size == 10 and log.truncated
    assert out.read_bytes() == b"aaaacccc" and not log.streams["stdout"].truncated
    assert err.read_bytes() == b"BBDDDDDDDD" and log.streams["stderr"].truncated
    assert log.error is None
    assert stream_log_size(out, combined) == 8 and read_log(out, 2, 4) == b"aacc"
    for f in (combined, out, err):
        assert os.stat(f).st_mode & 0o777 == 0o600


def test_stream_log_size_tells_an_old_task_from_one_that_has_not_run(tmp_path: Path):
    combined, out = tmp_path / "t.log", tmp_path / "t.stdout"
    assert stream_log_size(out, combined) == 0  # no log at all yet: an empty stream
    combined.write_bytes(b"old bytes")
    assert stream_log_size(out, combined) is None  # a combined log only: logged before streams were kept apart
