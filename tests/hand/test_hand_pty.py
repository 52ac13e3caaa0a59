"""Terminal runs on real pseudo-terminals (hand/system/pty.py): the child's controlling terminal and
size, resize, Ctrl-C, exit status, flow control both ways, and killing the whole session."""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import pwd
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hand_support import pid_alive, read_pid, until

from hand.system.pty import PTY_STREAM, PtyRun, check_size, login_shell, session_groups
from hand.system.sandbox import lookup_user
from protocol.codes import KillStage

PY = sys.executable
WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}.get(platform.machine())


class Term:
    """A PtyRun with its output collected, started as a task."""

    def __init__(self, argv: list[str], rows: int = 24, cols: int = 80, **kw) -> None:
        self.out = bytearray()
        self.closed: list[str] = []
        self.consumed: list[int] = []
        self.on_data = None
        self.run = PtyRun(
            argv,
            rows=rows,
            cols=cols,
            term=kw.pop("term", "xterm-256color"),
            on_output=self._output,
            on_output_closed=self.closed.append,
            on_stdin_consumed=self.consumed.append,
            **kw,
        )
        self.task: asyncio.Task | None = None

    def _output(self, stream: str, data: bytes) -> None:
        assert stream == PTY_STREAM
        self.out += data
        if self.on_data is not None:
            self.on_data(data)

    def start(self) -> Term:
        self.task = asyncio.get_running_loop().create_task(self.run.run())
        return self

    async def until(self, needle: bytes, timeout: float = 10.0) -> None:
        await until(lambda: needle in self.out, timeout, f"{needle!r} in the output (have {bytes(self.out)[-300:]!r})")

    async def outcome(self, timeout: float = 20.0):
        assert self.task is not None
        async with asyncio.timeout(timeout):
            return await self.task


def py(code: str) -> list[str]:
    return [PY, "-c", code]


# --- pure ------------------------------------------------------------------------------------------


def test_window_sizes_must_fit_a_winsize():
    assert check_size(24, 80) == (24, 80) and check_size(0, 0) == (0, 0) and check_size(65535, 1) == (65535, 1)
    for rows, cols in ((-1, 80), (24, 65536), (True, 80), (24.0, 80)):
        with pytest.raises(ValueError):
            check_size(rows, cols)  # type: ignore[arg-type]


async def test_kill_before_start_starts_nothing():
    run = PtyRun(["/bin/true"], rows=24, cols=80, term="xterm")
    run.write_stdin(b"typed ahead")
    run.kill()
    outcome = await run.run()
    assert outcome.killed and outcome.exit_code is None and run.pid is None
    assert outcome.stdin_dropped == len(b"typed ahead") and run.stdin_consumed == len(b"typed ahead")


def test_login_shell_is_the_passwd_shell_with_a_dash():
    program, argv = login_shell()
    assert program == (pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh")
    assert argv == ["-" + os.path.basename(program)]


# --- the terminal itself ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_size_term_controlling_terminal_and_exit_code():
    t = Term(["/bin/sh", "-c", 'stty size; echo "$TERM"; echo out; echo err >&2; exit 3'], rows=31, cols=97).start()
    outcome = await t.outcome()
    assert outcome.exit_code == 3 and outcome.signal is None and not outcome.killed
    # stdout and stderr are one stream, shaped by the line discipline (ONLCR)
    assert bytes(t.out) == b"31 97\r\nxterm-256color\r\nout\r\nerr\r\n"
    assert outcome.output.data == bytes(t.out) and outcome.stdout is outcome.output and outcome.stderr.total == 0
    assert t.closed == [PTY_STREAM]

    code = (
        "import os; fd = os.open('/dev/tty', os.O_WRONLY); os.write(fd, b'via /dev/tty '); "
        "print(os.getsid(0) == os.getpid() == os.getpgrp(), os.tcgetpgrp(0) == os.getpgrp(), "
        "os.ttyname(0) == os.ttyname(1) == os.ttyname(2))"
    )
    t = Term(py(code)).start()
    assert (await t.outcome()).exit_code == 0
    # its own session, the terminal's foreground group, and /dev/tty is this terminal
    assert bytes(t.out) == b"via /dev/tty True True True\r\n"


@pytest.mark.slow
async def test_resize_reaches_the_child_as_sigwinch():
    code = (
        "import os, signal, sys\n"
        "def winch(*_):\n"
        "    print('winch %d %d' % os.get_terminal_size(0)[::-1], flush=True)\n"
        "signal.signal(signal.SIGWINCH, winch)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    t = Term(py(code), rows=24, cols=80).start()
    await t.until(b"ready")
    t.run.resize(40, 120)
    await t.until(b"winch 40 120")
    assert t.run.size == (40, 120)
    t.run.resize(41, 121)
    await t.until(b"winch 41 121")
    t.run.write_stdin(b"\r")
    assert (await t.outcome()).exit_code == 0

    # before the spawn, a resize is the size the child starts with
    t = Term(["/bin/sh", "-c", "stty size"], rows=10, cols=20)
    t.run.resize(11, 21)
    t.start()
    assert (await t.outcome()).exit_code == 0 and bytes(t.out) == b"11 21\r\n"


@pytest.mark.slow
async def test_ctrl_c_interrupts_a_python_repl_that_keeps_running():
    t = Term([PY, "-i", "-q"]).start()
    await t.until(b">>> ")
    t.run.write_stdin(b"while True: pass\r\r")
    await t.until(b"... \r\n")
    t.run.write_stdin(b"\x03")  # the byte; the line discipline turns it into SIGINT
    await t.until(b"KeyboardInterrupt\r\n>>> ")
    t.run.write_stdin(b"print(6 * 7)\r")
    await t.until(b"42\r\n")
    t.run.write_stdin(b"raise SystemExit(7)\r")
    outcome = await t.outcome()
    assert outcome.exit_code == 7 and not outcome.killed


@pytest.mark.slow
async def test_a_signal_ending_the_child_is_reported_as_such():
    t = Term(["/bin/sh", "-c", "kill -TERM $$"]).start()
    outcome = await t.outcome()
    assert outcome.exit_code is None and outcome.signal == signal.SIGTERM and not outcome.killed


@pytest.mark.slow
async def test_close_stdin_types_end_of_file():
    t = Term(["cat"]).start()
    t.run.write_stdin(b"abc")  # a partial line: the first VEOF sends it, the second ends the input
    t.run.close_stdin()
    outcome = await t.outcome()
    assert outcome.exit_code == 0 and bytes(t.out) == b"abcabc"  # the echo, then cat's copy


@pytest.mark.slow
async def test_close_output_hangs_up_the_terminal():
    t = Term(py("import time; print('ready', flush=True); time.sleep(60)")).start()
    await t.until(b"ready")
    t.run.close_output(PTY_STREAM)
    outcome = await t.outcome()
    assert outcome.signal == signal.SIGHUP and not outcome.killed and t.closed == [PTY_STREAM]
    with pytest.raises(ValueError):
        t.run.close_output("stdout")


# --- flow control ------------------------------------------------------------------------------------


def _blocked_writing_stdout(pid: int) -> bool:
    """The process sleeps inside write(1, ...): its terminal is full."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    if WRITE_SYSCALL is None:  # another architecture: the kernel's wait channel names the tty write
        try:
            with open(f"/proc/{pid}/wchan") as f:
                return "write" in f.read()
        except OSError:
            return False
    return len(fields) > 1 and fields[0] == str(WRITE_SYSCALL) and int(fields[1], 16) == 1


@pytest.mark.slow
async def test_paused_output_blocks_the_child_and_loses_nothing():
    n = 1_000_000
    t = Term(py(f"import sys; sys.stdout.write('x' * {n}); sys.stdout.flush(); print('END')"))
    t.on_data = lambda _data: t.run.pause_output()  # a window of one read
    t.start()
    # The child may block in write(1) before our first read (a loaded machine): wait for the pause too.
    await until(
        lambda: t.run.pid and not t.run.reading and _blocked_writing_stdout(t.run.pid),
        what="the child blocked in write(1) with reading paused",
    )
    assert not t.run.exited and not t.run.reading and 0 < len(t.out) < n
    t.on_data = None
    t.run.resume_output()
    outcome = await t.outcome()
    assert outcome.exit_code == 0 and bytes(t.out) == b"x" * n + b"END\r\n" and outcome.output.total == n + 5


@pytest.mark.slow
async def test_output_paused_after_the_exit_is_still_delivered_whole():
    """The child has exited; its last output waits in the terminal until the reader has room."""
    n = 10_000  # fits in what the terminal holds (~17 KiB here), so the child can exit meanwhile
    t = Term(py(f"import sys; sys.stdout.write('y' * {n}); sys.stdout.flush()"), drain=0.05)
    t.on_data = lambda _data: t.run.pause_output()
    t.start()
    await until(lambda: t.run.exited, what="the child's exit")
    have = len(t.out)
    await asyncio.sleep(6 * 0.05)  # six drain periods: a paused reader is not silence to give up on
    assert not t.task.done() and len(t.out) == have < n
    t.on_data = None
    t.run.resume_output()
    outcome = await t.outcome()
    assert outcome.exit_code == 0 and bytes(t.out) == b"y" * n


@pytest.mark.slow
async def test_input_waits_for_the_reader_and_consumed_counts_what_the_terminal_took(tmp_path):
    data = os.urandom(300_000)  # every byte value, Ctrl-C included: the child's terminal is raw
    gate = tmp_path / "gate"
    code = (
        "import hashlib, os, sys, time, tty\n"
        "tty.setraw(0)\n"
        "print('ready', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)\n"
        "h, left = hashlib.sha256(), %d\n"
        "while left:\n"
        "    chunk = os.read(0, left)\n"
        "    h.update(chunk)\n"
        "    left -= len(chunk)\n"
        "print(h.hexdigest(), flush=True)\n"
    ) % len(data)
    t = Term(py(code)).start()
    await t.until(b"ready")
    t.run.write_stdin(data)
    assert t.run.stdin_pending > 0 and t.run.stdin_consumed < len(data)  # the child is not reading
    drained = asyncio.ensure_future(t.run.drain())
    await asyncio.sleep(0)
    assert not drained.done()
    gate.touch()
    async with asyncio.timeout(20):
        await drained
    assert t.run.stdin_pending == 0 and t.run.stdin_consumed == len(data) and t.consumed[-1] == len(data)
    assert t.consumed == sorted(t.consumed)
    outcome = await t.outcome()
    assert outcome.exit_code == 0 and hashlib.sha256(data).hexdigest().encode() in t.out
    assert outcome.stdin_dropped == 0


# --- killing ----------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_cancel_kills_the_whole_session_every_group_of_it(tmp_path):
    """A member in a process group of its own (as a job-control shell makes them) that ignores
    SIGHUP and SIGTERM: killed at the SIGKILL stage, with the rest of the session."""
    pidfile = tmp_path / "grandchild"
    code = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    os.setpgid(0, 0)\n"
        "    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(120)\n"
    )
    t = Term(py(code), grace=0.3).start()
    grandchild = await until(lambda: read_pid(pidfile), what="the grandchild's pid")
    sid = t.run.pid
    assert os.getsid(grandchild) == sid and os.getpgid(grandchild) != sid
    t.run.kill()
    outcome = await t.outcome()
    assert outcome.killed and outcome.stage is KillStage.KILL and outcome.signal == signal.SIGHUP
    assert not pid_alive(grandchild) and session_groups(sid) == set()


@pytest.mark.slow
async def test_cancel_ends_an_interactive_shell_and_its_jobs_by_hangup(tmp_path):
    """An interactive bash ignores SIGTERM; SIGHUP, what a terminal going away sends, ends it and
    its background jobs before the grace is over."""
    t = Term(["bash", "--norc", "--noprofile", "-i"], grace=30, env={"PATH": os.environ["PATH"], "PS1": "$ "})
    t.start()
    await t.until(b"$ ")
    t.run.write_stdin(b"sleep 100 & echo job=$!; sleep 200 | cat & echo pipe=$! end\r")
    found = await until(lambda: re.search(rb"job=(\d+)\r\n.*pipe=(\d+) end", t.out, re.S), what="the jobs' pids")
    job, pipe = int(found[1]), int(found[2])  # (the echo of the typed line shows `$!`, not digits)
    sid = t.run.pid
    assert {os.getpgid(job), os.getpgid(pipe)} != {sid}  # jobs in groups of their own
    t.run.kill()
    outcome = await t.outcome()
    assert outcome.killed and outcome.stage is KillStage.TERM and outcome.signal == signal.SIGHUP
    assert not pid_alive(job) and not pid_alive(pipe) and session_groups(sid) == set()


@pytest.mark.slow
async def test_stragglers_of_the_session_are_killed_when_the_child_exits(tmp_path):
    """A leftover in another group of the session holds the terminal: the run would never see EIO."""
    pidfile = tmp_path / "straggler"
    leftover = (
        f"import os, time; os.setpgid(0, 0); open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(100)"
    )
    t = Term(["/bin/sh", "-c", f'{PY} -c "{leftover}" & while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 4']).start()
    outcome = await t.outcome()
    straggler = read_pid(pidfile)
    assert outcome.exit_code == 4 and outcome.stragglers_killed and not outcome.killed
    assert straggler is not None and not pid_alive(straggler)


@pytest.mark.slow
async def test_an_escapee_holding_the_terminal_does_not_hang_the_run(tmp_path):
    pidfile = tmp_path / "escapee"
    t = Term(["/bin/sh", "-c", f"setsid /bin/sh -c 'echo $$ > {pidfile}; exec sleep 100' & sleep 0.2; echo done"])
    t.start()
    try:
        outcome = await t.outcome()
        assert outcome.exit_code == 0 and not outcome.killed and b"done" in t.out
    finally:
        escapee = read_pid(pidfile)
        if escapee is not None and pid_alive(escapee):
            os.kill(escapee, signal.SIGKILL)


# --- the sandbox ------------------------------------------------------------------------------------


@pytest.fixture
def throwaway_user(as_root):
    name = f"mindhand-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True, timeout=30)
    try:
        yield lookup_user(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.mark.slow
async def test_run_as_gets_its_own_terminal(throwaway_user, tmp_path):
    who = throwaway_user
    script = 'id -u; stat -c %u "$(tty)"; echo hi > /dev/tty; ulimit -n'
    t = Term(["/bin/sh", "-c", script], cwd="/", run_as=who).start()
    outcome = await t.outcome()
    assert outcome.exit_code == 0, bytes(t.out)
    uid, owner, hi, _ = bytes(t.out).decode().split("\r\n", 3)
    assert int(uid) == who.uid != 0 and int(owner) == who.uid and hi == "hi"

    from hand.system.sandbox import ResourceLimits

    t = Term(["/bin/sh", "-c", "ulimit -n"], cwd="/", run_as=who, limits=ResourceLimits(open_files=37)).start()
    assert (await t.outcome()).exit_code == 0 and bytes(t.out) == b"37\r\n"


@pytest.mark.slow
async def test_a_login_shell_knows_it_is_one():
    program, argv = login_shell()
    t = Term(argv, executable=program, env={"PATH": os.environ["PATH"], "HOME": str(Path.home())}).start()
    t.run.write_stdin(b'echo "zero=$0"; exit 5\r')
    outcome = await t.outcome()
    assert outcome.exit_code == 5 and f"zero={argv[0]}".encode() in t.out


@pytest.mark.slow
async def test_a_program_that_does_not_exist_raises_and_leaves_no_terminal():
    before = set(os.listdir("/proc/self/fd"))
    run = PtyRun(["/nonexistent/program"], rows=24, cols=80, term="xterm")
    with pytest.raises(FileNotFoundError):
        await run.run()
    assert set(os.listdir("/proc/self/fd")) <= before  # master and slave closed again
