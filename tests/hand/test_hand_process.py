"""Real child processes: exit codes, bounded output, killing whole trees, no stragglers."""

import asyncio
import signal

from hand_support import pid_alive, read_pid, until

from hand.process import ProcessRun, Tail
from protocol import limits
from protocol.codes import KillStage


def sh(script: str, **kw) -> ProcessRun:
    return ProcessRun(["/bin/sh", "-c", script], **kw)


async def run_bounded(p: ProcessRun, timeout: float = 15.0):
    async with asyncio.timeout(timeout):
        return await p.run()


async def test_exit_codes_and_separate_streams():
    out = await run_bounded(sh("echo out; echo err >&2; exit 0"))
    assert (out.exit_code, out.signal, out.killed, out.stage) == (0, None, False, None)
    assert out.stdout.data == b"out\n" and out.stderr.data == b"err\n"
    out = await run_bounded(sh("printf x; exit 3"))
    assert out.exit_code == 3 and out.stdout.data == b"x" and out.stdout.total == 1


async def test_killed_by_a_signal_we_did_not_send():
    out = await run_bounded(sh("kill -9 $$"))
    assert out.exit_code is None and out.signal == signal.SIGKILL and not out.killed


async def test_stdin_bytes_and_dev_null_by_default():
    out = await run_bounded(ProcessRun(["cat"], stdin=b"hello\x00world"))
    assert out.stdout.data == b"hello\x00world"
    out = await run_bounded(ProcessRun(["cat"]))  # /dev/null: EOF at once, no hang
    assert out.exit_code == 0 and out.stdout.data == b""


async def test_large_output_keeps_a_bounded_tail_and_right_totals():
    seen = {"stdout": 0, "stderr": 0}
    script = "head -c 5000000 /dev/zero | tr '\\0' a; printf END; head -c 70000 /dev/zero >&2"
    p = sh(script, on_output=lambda stream, data: seen.__setitem__(stream, seen[stream] + len(data)))
    out = await run_bounded(p)
    assert out.exit_code == 0
    assert out.stdout.total == 5_000_003 and seen["stdout"] == 5_000_003
    assert len(out.stdout.data) == limits.OUTPUT_TAIL_MAX and out.stdout.truncated
    assert out.stdout.data.endswith(b"aaaEND")
    assert out.stderr.total == 70_000 and out.stderr.truncated and seen["stderr"] == 70_000


def test_tail_keeps_the_last_bytes():
    t = Tail(cap=4)
    for chunk in (b"ab", b"cd", b"efg", b"", b"0123456"):
        t.feed(chunk)
    assert t.data == b"3456" and t.total == 14 and t.truncated
    t2 = Tail(cap=4)
    t2.feed(b"abc")
    assert t2.data == b"abc" and not t2.truncated


async def test_cancel_terminates_a_normal_tree_at_the_term_stage(tmp_path):
    pidfile = tmp_path / "child.pid"
    p = sh(f"sleep 100 & echo $! > {pidfile}; wait", grace=5)
    task = asyncio.ensure_future(run_bounded(p))
    child = await until(lambda: read_pid(pidfile), what="the child to start")
    p.kill()
    out = await task
    assert out.killed and out.stage is KillStage.TERM and out.signal == signal.SIGTERM
    assert not pid_alive(child)


async def test_cancel_kills_a_grandchild_that_ignores_sigterm(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # The grandchild ignores SIGTERM and execs sleep (which inherits the ignored disposition).
    script = f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 100' & wait"
    p = sh(script, grace=0.3)
    task = asyncio.ensure_future(run_bounded(p))
    grandchild = await until(lambda: read_pid(pidfile), what="the grandchild to start")
    main = p.pid
    p.kill()
    out = await task
    assert out.killed and out.stage is KillStage.KILL
    assert not pid_alive(grandchild) and not pid_alive(main)


async def test_kill_before_start_starts_nothing():
    p = sh("echo should-not-run")
    p.kill()
    out = await run_bounded(p)
    assert out.killed and out.exit_code is None and out.stdout.total == 0 and p.pid is None


async def test_background_child_holding_stdout_does_not_hang_the_run(tmp_path):
    pidfile = tmp_path / "bg.pid"
    p = sh(f"sleep 100 & echo $! > {pidfile}; echo done", drain=0.2)
    out = await run_bounded(p, timeout=5)  # would hang on Process.wait(): sleep holds stdout
    assert out.exit_code == 0 and not out.killed and out.stage is None
    assert out.stdout.data == b"done\n" and out.stragglers_killed
    assert not pid_alive(read_pid(pidfile))


async def test_straggler_not_holding_pipes_is_killed_too(tmp_path):
    pidfile = tmp_path / "bg.pid"
    p = sh(f"(trap '' TERM; exec sleep 100) >/dev/null 2>&1 & echo $! > {pidfile}", straggler_grace=0.2)
    out = await run_bounded(p, timeout=5)
    assert out.exit_code == 0 and out.stragglers_killed
    assert not pid_alive(read_pid(pidfile))


async def test_a_kill_after_the_process_exited_on_its_own_reports_the_real_exit(tmp_path):
    pidfile = tmp_path / "bg.pid"
    # The leftover ignores SIGTERM and holds stdout, so the run is still draining after the exit.
    p = sh(f"(trap '' TERM; exec sleep 100) & echo $! > {pidfile}; exit 0", straggler_grace=0.3)
    task = asyncio.ensure_future(run_bounded(p))
    await until(lambda: p.exited, what="the main process to exit")
    assert not task.done()
    p.kill()
    out = await task
    assert out.exit_code == 0 and not out.killed and out.stage is None
    assert not pid_alive(read_pid(pidfile))


async def test_cancelling_the_runner_task_kills_the_tree(tmp_path):
    pidfile = tmp_path / "child.pid"
    p = sh(f"sleep 100 & echo $! > {pidfile}; wait")
    task = asyncio.ensure_future(p.run())
    child = await until(lambda: read_pid(pidfile), what="the child to start")
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await until(lambda: not pid_alive(child), timeout=5, what="the child to die")
