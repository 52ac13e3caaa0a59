"""Real child processes: exit codes, bounded output, killing whole trees, no stragglers."""

import asyncio
import errno
import os
import signal
import subprocess
import sys
import time

import pytest
from hand_support import pid_alive, read_pid, until

from hand.system import process
from hand.system.process import ProcessRun, Tail, group_alive, live_members
from protocol import limits
from protocol.codes import KillStage


@pytest.fixture(params=["pidfd", "no-pidfd", "pidfd-refused", "pidfd-capped"])
def pidfds(request, monkeypatch):
    """The kill sequence watches exits through pidfds where it can; without them (no
    `os.pidfd_open`, the kernel or a seccomp filter refusing it, a group too large to watch) it
    must reach the same end."""
    if request.param == "pidfd-capped":
        monkeypatch.setattr(process, "WATCH_MAX", 1)
    elif request.param == "no-pidfd":
        monkeypatch.setattr(process, "_pidfd_open", None)
    elif request.param == "pidfd-refused":

        def refused(pid: int) -> int:
            raise OSError(errno.ENOSYS, "pidfd_open")

        monkeypatch.setattr(process, "_pidfd_open", refused)
    return request.param


def sh(script: str, **kw) -> ProcessRun:
    return ProcessRun(["/bin/sh", "-c", script], **kw)


async def run_bounded(p: ProcessRun, timeout: float = 15.0):
    async with asyncio.timeout(timeout):
        return await p.run()


@pytest.mark.slow
async def test_exit_codes_and_separate_streams():
    out = await run_bounded(sh("echo out; echo err >&2; exit 0"))
    assert (out.exit_code, out.signal, out.killed, out.stage) == (0, None, False, None)
    assert out.stdout.data == b"out\n" and out.stderr.data == b"err\n"
    out = await run_bounded(sh("printf x; exit 3"))
    assert out.exit_code == 3 and out.stdout.data == b"x" and out.stdout.total == 1


@pytest.mark.slow
async def test_killed_by_a_signal_we_did_not_send():
    out = await run_bounded(sh("kill -9 $$"))
    assert out.exit_code is None and out.signal == signal.SIGKILL and not out.killed


@pytest.mark.slow
async def test_stdin_bytes_and_dev_null_by_default():
    out = await run_bounded(ProcessRun(["cat"], stdin=b"hello\x00world"))
    assert out.stdout.data == b"hello\x00world"
    out = await run_bounded(ProcessRun(["cat"]))  # /dev/null: EOF at once, no hang
    assert out.exit_code == 0 and out.stdout.data == b""


@pytest.mark.slow
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


@pytest.mark.slow
async def test_cancel_terminates_a_normal_tree_at_the_term_stage(tmp_path, pidfds):
    pidfile = tmp_path / "child.pid"
    p = sh(f"sleep 100 & echo $! > {pidfile}; wait", grace=5)
    task = asyncio.ensure_future(run_bounded(p))
    child = await until(lambda: read_pid(pidfile), what="the child to start")
    p.kill()
    out = await task
    assert out.killed and out.stage is KillStage.TERM and out.signal == signal.SIGTERM
    assert not pid_alive(child)


@pytest.mark.slow
async def test_cancel_kills_a_grandchild_that_ignores_sigterm(tmp_path, pidfds):
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


@pytest.mark.slow
async def test_background_child_holding_stdout_does_not_hang_the_run(tmp_path):
    pidfile = tmp_path / "bg.pid"
    p = sh(f"sleep 100 & echo $! > {pidfile}; echo done", drain=0.2)
    out = await run_bounded(p, timeout=5)  # would hang on Process.wait(): sleep holds stdout
    assert out.exit_code == 0 and not out.killed and out.stage is None
    assert out.stdout.data == b"done\n" and out.stragglers_killed
    assert not pid_alive(read_pid(pidfile))


@pytest.mark.slow
async def test_straggler_not_holding_pipes_is_killed_too(tmp_path):
    pidfile = tmp_path / "bg.pid"
    p = sh(f"(trap '' TERM; exec sleep 100) >/dev/null 2>&1 & echo $! > {pidfile}", straggler_grace=0.2)
    out = await run_bounded(p, timeout=5)
    assert out.exit_code == 0 and out.stragglers_killed
    assert not pid_alive(read_pid(pidfile))


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("turns", range(5))
async def test_a_cancel_at_any_point_of_the_spawn_ends_at_once_and_leaves_nothing(tmp_path, turns):
    # The cancel lands after `turns` turns of the loop: before the fork, while asyncio still connects
    # the pipes (the grandchild `sleep 100` holding stdout already), or once it runs. The loop is
    # then held (a blocking wait) until the grandchild is up, so it exists at the cancel wherever
    # the spawn stands. In every case the runner ends at once and the tree is gone: asyncio's own
    # answer to a cancel mid-spawn kills the main process alone and waits for every pipe to close,
    # 100 s here.
    pidfile = tmp_path / "child.pid"
    p = sh(f"sleep 100 & echo $! > {pidfile}; wait")
    task = asyncio.ensure_future(p.run())
    for _ in range(turns):
        await asyncio.sleep(0)
    deadline = time.monotonic() + 1.0  # forked by now, or not before the loop turns again
    while read_pid(pidfile) is None and time.monotonic() < deadline:
        time.sleep(0.005)  # noqa: ASYNC251 -- holding the loop is the point
    task.cancel()
    child = read_pid(pidfile)
    try:
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done, f"the runner was still ending 10 s after a cancel {turns} turns in"
        assert task.cancelled()
        child = read_pid(pidfile)  # a spawn the cancel let finish was killed at once
        if child is not None:
            await until(lambda: not pid_alive(child), timeout=5, what="the grandchild to die")
    finally:
        if child is not None and pid_alive(child):
            os.kill(child, signal.SIGKILL)  # let a hung runner go
        await asyncio.wait({task}, timeout=10)


@pytest.mark.slow
async def test_a_member_outliving_the_main_process_is_waited_for_within_the_grace(tmp_path, pidfds):
    # The main shell dies at SIGTERM; the grandchild traps it, and its handler forks a new member
    # (`sleep 0.3`, never signalled) before exiting: the tree ends on its own, so stage TERM.
    pidfile = tmp_path / "gc.pid"
    script = f"sh -c 'trap \"sleep 0.3; exit 0\" TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done' & wait"
    p = sh(script, grace=10)
    task = asyncio.ensure_future(run_bounded(p))
    grandchild = await until(lambda: read_pid(pidfile), what="the grandchild to start")
    p.kill()
    out = await task
    assert out.killed and out.stage is KillStage.TERM
    assert not pid_alive(grandchild) and not group_alive(p.pid)


@pytest.mark.slow
async def test_a_member_forked_after_sigterm_is_found_and_killed(tmp_path, pidfds):
    # The grandchild's SIGTERM handler starts `sleep 100` (which never got SIGTERM) and exits: the
    # group is not empty although every process seen at the signal is gone. Only SIGKILL ends it.
    pidfile, late = tmp_path / "gc.pid", tmp_path / "late.pid"
    script = (
        f'sh -c \'trap "sleep 100 & echo \\$! > {late}; exit 0" TERM; echo $$ > {pidfile}; '
        f"while :; do sleep 0.05; done' & wait"
    )
    p = sh(script, grace=0.5)
    task = asyncio.ensure_future(run_bounded(p))
    await until(lambda: read_pid(pidfile), what="the grandchild to start")
    p.kill()
    out = await task
    assert out.killed and out.stage is KillStage.KILL
    assert read_pid(late) is not None and not pid_alive(read_pid(late))
    assert not group_alive(p.pid)


@pytest.mark.slow
async def test_kill_sends_sigterm_before_returning(tmp_path):
    # The child blocks SIGTERM, so a SIGTERM sent stays pending where /proc shows it: it must be
    # there as soon as kill() returns, before the event loop runs anything (no await in between).
    code = (
        "import signal,time; signal.pthread_sigmask(signal.SIG_BLOCK,{signal.SIGTERM}); "
        "print('ready',flush=True); time.sleep(100)"
    )
    p = ProcessRun([sys.executable, "-c", code], grace=0.2)
    task = asyncio.ensure_future(run_bounded(p))
    await until(lambda: p.stdout.data == b"ready\n", what="the child to block SIGTERM")
    p.kill()
    assert signal.SIGTERM in _pending(p.pid)
    out = await task
    assert out.killed and out.stage is KillStage.KILL and out.signal == signal.SIGKILL


@pytest.mark.slow
async def test_a_detached_grandchild_holding_stdout_does_not_hang_a_cancelled_run(tmp_path, pidfds):
    # `setsid` takes the grandchild out of the group (nothing but cgroups could follow it): the kill
    # cannot reach it and it keeps stdout open; the run still ends after the drain period.
    pidfile = tmp_path / "escapee.pid"
    p = sh(f"setsid sleep 100 & echo $! > {pidfile}; wait", drain=0.2)
    task = asyncio.ensure_future(run_bounded(p, timeout=10))
    escapee = await until(lambda: read_pid(pidfile), what="the escapee to start")
    try:
        p.kill()
        out = await task
        assert out.killed and out.stage is KillStage.TERM
    finally:
        process._signal_group(escapee, signal.SIGKILL)


@pytest.mark.slow
async def test_group_liveness_counts_zombies_as_gone():
    child = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        assert await live_members(child.pid) == [child.pid] and group_alive(child.pid)
        child.kill()
        await until(lambda: _state(child.pid) == "Z", what="the child to be a zombie")
        assert await live_members(child.pid) == [] and not group_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert await live_members(child.pid) == [] and not group_alive(child.pid)  # no member at all


@pytest.mark.slow
def test_a_scan_relists_proc_until_nothing_new_shows_up():
    # The race: /proc is listed while a member forks and exits, so the listing holds the creator
    # (gone by the time its stat is read) and not the child. Here: a listing of one process that
    # no longer exists, and a live member it does not show. The scan must still find the member.
    child = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        assert process._scan(child.pid, [("999999999", 1)]) == [child.pid]
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
async def test_a_scan_rereads_only_new_processes_and_the_groups_session(tmp_path):
    pidfile = tmp_path / "child.pid"
    leader = subprocess.Popen(["sh", "-c", f"sleep 100 & echo $! > {pidfile}; wait"], start_new_session=True)
    try:
        member = await until(lambda: read_pid(pidfile), what="the member to start")
        assert sorted(process._scan(leader.pid, process._listing())) == sorted([leader.pid, member])
        keys = {int(k[0]): k for k in process._listing() if int(k[0]) in (leader.pid, member)}
        assert process._seen[keys[member]] == leader.pid  # remembered with its session
        # A process remembered in another session is not read again (it could never join)...
        process._seen[keys[member]] = 1
        assert process._scan(leader.pid, process._listing()) == [leader.pid]
        # ...except the leader itself: seen between its fork and its setsid, it was elsewhere.
        process._seen[keys[leader.pid]] = 1
        assert process._scan(leader.pid, process._listing()) == [leader.pid]
    finally:
        process._seen.clear()
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


@pytest.mark.slow
async def test_a_long_grace_does_not_poll_hot(tmp_path, monkeypatch):
    # While a SIGTERM-ignoring member is watched by a pidfd, the group is rescanned only as a
    # backstop: a handful of scans in a second of grace, where a busy loop would make thousands.
    scans = 0
    scan = process._scan

    def counting(pgid, names):
        nonlocal scans
        scans += 1
        return scan(pgid, names)

    monkeypatch.setattr(process, "_scan", counting)
    pidfile = tmp_path / "grandchild.pid"
    p = sh(f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 100' & wait", grace=1.0)
    task = asyncio.ensure_future(run_bounded(p))
    grandchild = await until(lambda: read_pid(pidfile), what="the grandchild to start")
    p.kill()
    out = await task
    assert out.stage is KillStage.KILL and not pid_alive(grandchild)
    assert scans < 1.0 / process.WATCHED_POLL_S * 3


def _pending(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    mask = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
