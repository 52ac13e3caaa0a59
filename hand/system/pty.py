"""Run one child on a pseudo-terminal, as `ssh -t host cmd` and `ssh host` do (DESIGN §11, terminals).

Programs decide how to behave by asking whether they talk to a terminal: a REPL prompts and edits
lines (`python3 -i`, `bash`), `stty size` and curses read the window size, an editor draws. A pipe
gives none of that, which is why a terminal run allocates a pty on the Hand instead.

- **The slave is the child's controlling terminal, in its own session.** `start_new_session` makes
  the child a session leader with no terminal; `TIOCSCTTY` (in the child, before `exec`) makes the
  slave its controlling terminal. Only then does the kernel's terminal machinery reach the program:
  the line discipline turns Ctrl-C (byte 0x03 from the client) into SIGINT for the foreground
  process group, Ctrl-Z into SIGTSTP and a window change into SIGWINCH; `/dev/tty` opens; a shell
  can give the terminal to a job (`tcsetpgrp` works only on one's own controlling terminal). A pty
  that were merely fd 0, 1 and 2 would print a prompt, but Ctrl-C would stay a byte and bash would
  say "no job control in this shell".
- **stdout and stderr are one stream.** Both are the slave, and what comes out of the master is one
  byte stream already shaped by the line discipline (`\\n` becomes `\\r\\n`, typed input is echoed in
  between). Nothing at the master says which descriptor wrote a byte; `ssh -t` merges them for the
  same reason, and a pty run has one `pty` stream each way.
- **End of output** is EIO from a read of the master: every holder of the slave has closed it (the
  child and whatever it left behind). The parent closes its own copy right after the spawn, or EIO
  would never come. The kernel keeps what was written before the close readable until then.
- **Flow control.** `pause_output()` stops reading the master; the terminal's buffers fill (a few
  KiB to 64 KiB) and the child blocks in `write()`, exactly as a slow ssh client blocks the remote
  program. Nothing is dropped. `resume_output()` goes on where it stopped.
- **Input** goes to the master through `write_stdin()`, which never blocks: what the kernel does not
  take at once is queued and written as the terminal accepts it (a program that does not read its
  input keeps it queued). `stdin_consumed` is how many bytes the kernel has taken, the offset a
  receiver acknowledges; `on_stdin_consumed` reports it as it moves and `drain()` waits until the
  queue is empty. The caller's window bounds the queue.
- **The whole session is killed.** A job-control shell puts every pipeline in a process group of
  its own, all inside the session, so killing the child's group (as `ProcessRun` does) would miss
  them. Kill = SIGHUP, SIGTERM and SIGCONT to every process group of the session, a grace period,
  then SIGKILL to every group. SIGHUP because that is what a terminal going away sends (an
  interactive bash ignores SIGTERM but leaves on SIGHUP and passes it on to its jobs). As with
  `ProcessRun`, only a process that calls `setsid` itself leaves; closing the master at the end
  hangs up the terminal for such a process if it still holds it. When the child ends on its own,
  what is left of its session is killed the same way (a foreground run leaves no stragglers).
- **The sandbox** is `ProcessRun`'s: the caller's scrubbed environment (plus TERM), the rlimit plan,
  `run_as`. Unlike `ProcessRun`, a preexec function always runs, because `TIOCSCTTY` must be done
  in the child between `setsid` and `exec` and `subprocess` has no option for it; it calls only
  functions bound in the parent (the rlimit plan, then one `ioctl`), which is what `hand.system.sandbox`
  asks of a preexec function. With `run_as`, the slave is given to that user (mode 0620, group
  `tty`), as sshd and login do, so programs that open their terminal by name (`tty`, `ssh`, `sudo`)
  can.

The terminal starts with the kernel's default modes (canonical, echo, ISIG, `^C` interrupts, DEL
erases): what a client's own terminal uses is not copied, unlike sshd's pty-req modes.
"""

from __future__ import annotations

import asyncio
import fcntl
import grp
import os
import pwd
import signal
import subprocess
import termios
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hand.system.cgroups import RunCgroup
from hand.system.cputime import parse_stat
from hand.system.process import (
    DEFAULT_GRACE_S,
    DRAIN_S,
    FIRST_POLL_S,
    REAP_BOUND_S,
    SCAN_ROUNDS,
    STRAGGLER_GRACE_S,
    WATCHED_POLL_S,
    Killable,
    Tail,
    split_returncode,
)
from hand.system.sandbox import ResourceLimits, RunAs, preexec_for, rlimit_plan
from protocol.codes import KillStage

PTY_STREAM = "pty"
"""The name of the one stream each way (DESIGN §11)."""
OnOutput = Callable[[str, bytes], None]
OnClosed = Callable[[str], None]
OnConsumed = Callable[[int], None]

READ_MAX = 64 * 1024
"""Bytes taken from the master per readiness: one read per loop turn keeps other runs served."""
WRITE_MAX = 64 * 1024
HANGUP: tuple[int, ...] = (signal.SIGHUP, signal.SIGTERM, signal.SIGCONT)
"""The first signals of a kill, to every group of the session (see the module docstring)."""
WINSIZE_MAX = 0xFFFF
"""`struct winsize` holds unsigned shorts; 0 means "unknown", as the kernel allows."""


TERMINAL_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
"""Reset to their default in a terminal's child, as login and sshd do: an ignored disposition is
inherited across `exec`, and a Hand (or a test) started under `nohup` would give every shell a
SIGHUP it ignores: a hung-up terminal (`close_output`, `~.`) would not end it."""


def _child_setup(
    rlimits: Callable[[], None] | None,
    ioctl: Callable[[int, int, int], Any],
    request: int,
    reset: Callable[[int, Any], Any] = signal.signal,
) -> None:
    """Runs in the forked child after `setsid` and the user switch, before `exec`: the terminal's
    signals back to their defaults, the rlimit plan (and the run's cgroup), then the slave (already
    fd 0) becomes the controlling terminal of the new session."""
    for sig in TERMINAL_SIGNALS:
        reset(sig, signal.SIG_DFL)
    if rlimits is not None:
        rlimits()
    ioctl(0, request, 0)


def check_size(rows: int, cols: int) -> tuple[int, int]:
    """(rows, cols) if both fit a `struct winsize`; raises ValueError (a size from the wire)."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= WINSIZE_MAX:
            raise ValueError(f"{name} must be an integer from 0 to {WINSIZE_MAX}, not {value!r}")
    return rows, cols


def login_shell(run_as: RunAs | None = None) -> tuple[str, list[str]]:
    """The program and argv of the user's login shell, as `login` and sshd start it: the shell named
    in the passwd entry (of `run_as`, else the Hand's own user), with argv[0] `-` + its name, the
    convention by which a shell knows it is a login shell (and reads /etc/profile, ~/.profile).
    Pass them as `PtyRun(argv, executable=program)`."""
    uid = run_as.uid if run_as is not None else os.getuid()
    try:
        shell = pwd.getpwuid(uid).pw_shell or "/bin/sh"
    except KeyError:
        shell = "/bin/sh"
    return shell, ["-" + os.path.basename(shell)]


# --- the session ---------------------------------------------------------------------------------


def session_groups(sid: int) -> set[int] | None:
    """The process groups of session `sid`'s live (non-zombie) members: empty once none is left,
    None when /proc cannot be read or new processes keep appearing (count that as alive).

    Reading /proc is not atomic: a member may fork and exit while it is read, so that its child is
    missing from the listing. Whatever was created meanwhile had a live creator, so the listing is
    taken again until it shows no process that was not read yet (as `process._scan` does)."""
    seen: set[str] = set()
    groups: set[int] = set()
    for _ in range(SCAN_ROUNDS):
        try:
            fresh = [name for name in os.listdir("/proc") if name.isdigit() and name not in seen]
        except OSError:
            return None
        if not fresh:
            return groups
        seen.update(fresh)
        for name in fresh:
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = parse_stat(f.read())
            except OSError:  # gone meanwhile
                continue
            if stat is not None and stat.session == sid and stat.state not in ("Z", "X"):
                groups.add(stat.pgrp)
    return None


def _signal_groups(groups: set[int], signals: tuple[int, ...]) -> None:
    for pgid in groups:
        for sig in signals:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass


async def _until_session_gone(
    sid: int, exited: asyncio.Future[None] | None, until: float, signals: tuple[int, ...], signalled: set[int]
) -> bool:
    """Wait until no live member of session `sid` is left (True) or loop time `until` passes (False).
    Every group seen that has not had `signals` yet gets them: a group made after the first signal
    (a job started meanwhile) is not spared; where /proc cannot be read, the session's own group
    (`sid`) still gets them.

    The main process's exit is an event (the child watcher); the rest is polled, from FIRST_POLL_S
    doubling up to WATCHED_POLL_S, each scan in a thread: a session has no single group a pidfd
    could stand for, a whole /proc scan costs ~3 us per process of the machine, and the loop serves
    every other run meanwhile. The usual kill (SIGHUP ends the shell) needs one or two scans."""
    loop = asyncio.get_running_loop()
    if exited is not None and not exited.done():
        await asyncio.wait({exited}, timeout=max(0.0, until - loop.time()))
        if not exited.done():
            return False
    step = FIRST_POLL_S
    while True:
        groups = await asyncio.to_thread(session_groups, sid)
        if groups is not None and not groups:
            return True
        fresh = (groups if groups is not None else {sid}) - signalled
        _signal_groups(fresh, signals)
        signalled |= fresh
        remaining = until - loop.time()
        if remaining <= 0:
            return False
        await asyncio.sleep(min(step, remaining))
        step = min(step * 2, WATCHED_POLL_S)


async def kill_session(
    sid: int, grace: float, exited: asyncio.Future[None] | None = None, *, hung_up: frozenset[int] = frozenset()
) -> tuple[KillStage, bool]:
    """SIGHUP + SIGTERM + SIGCONT to every group of session `sid`, `grace` seconds for it to be gone,
    then SIGKILL to every group. Returns the stage that ended it and whether it was seen gone (False
    only past REAP_BOUND_S after SIGKILL, a process stuck in the kernel).

    `exited`: the main process's exit, while it is not reaped (the session is gone when it has
    exited and no member is left). `hung_up`: groups that already had the first signals."""
    loop = asyncio.get_running_loop()
    signalled = set(hung_up)
    if await _until_session_gone(sid, exited, loop.time() + grace, HANGUP, signalled):
        return KillStage.TERM, True
    return KillStage.KILL, await _until_session_gone(sid, exited, loop.time() + REAP_BOUND_S, (signal.SIGKILL,), set())


# --- the run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PtyOutcome:
    exit_code: int | None
    """The main process's exit status, or None if a signal ended it."""
    signal: int | None
    killed: bool
    """We started killing the session before the main process exited on its own."""
    stage: KillStage | None
    """Which signals ended the session, when `killed`: TERM for the first set (SIGHUP, SIGTERM)."""
    output: Tail
    """The last bytes of the one output stream and its total (stdout and stderr are one here)."""
    duration: float
    stragglers_killed: bool = False
    """Leftovers of the session (or the run's cgroup) were killed after the main process exited on
    its own."""
    stdin_dropped: int = 0
    """Input bytes never taken by the terminal: queued when the run ended, or written after it."""
    contained: bool = False
    """The run had a cgroup of its own (see `ProcessOutcome.contained`)."""

    @property
    def stdout(self) -> Tail:
        """The shape of `ProcessOutcome`, for code that reports either: the one stream is stdout."""
        return self.output

    @property
    def stderr(self) -> Tail:
        """Always empty: the child's stderr is the terminal too."""
        return Tail()


class _Exit(asyncio.SubprocessProtocol):
    """The child's exit, from the event loop's child watcher (no pipes: the terminal is ours)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def _check_stream(stream: str) -> None:
    if stream != PTY_STREAM:
        raise ValueError(f"a terminal run has one output stream, {PTY_STREAM!r}, not {stream!r}")


class PtyRun(Killable):
    """One child on a pseudo-terminal.

    The control surface is `ProcessRun`'s, so a run's stream plumbing can drive either: `kill()`,
    `pause_output`/`resume_output`/`close_output` (the stream is always "pty"), `write_stdin`,
    `close_stdin`, callbacks `on_output(stream, data)`, `on_output_closed(stream)` and
    `on_stdin_consumed(total)`; plus `resize()`. Each may be called at any time, from any callback
    (`on_output` included), before, during or after `run()`: what needs the terminal waits for it
    (input is queued, the size is kept for the spawn) or is a no-op once it is gone (input is then
    counted as dropped)."""

    def __init__(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        rows: int,
        cols: int,
        term: str,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        executable: str | None = None,
        on_output: OnOutput | None = None,
        on_output_closed: OnClosed | None = None,
        on_stdin_consumed: OnConsumed | None = None,
        grace: float = DEFAULT_GRACE_S,
        drain: float = DRAIN_S,
        straggler_grace: float = STRAGGLER_GRACE_S,
        limits: ResourceLimits | None = None,
        run_as: RunAs | None = None,
        cgroup: RunCgroup | None = None,
    ) -> None:
        """`rows`, `cols` and `term` come from the client's first frame; `env` is the run's
        environment already built by `Sandbox.child_env` (None: the Hand's own), TERM set on top.
        `executable` runs instead of argv[0] (a login shell's `-bash`: see `login_shell`).
        `cgroup`: the run's own, as for `ProcessRun`."""
        if not argv:
            raise ValueError("argv must not be empty")
        super().__init__()
        self._argv = list(argv)
        self._size = check_size(rows, cols)
        self._cwd = cwd
        self._env = dict(os.environ if env is None else env, TERM=term)
        self._executable = executable
        self._on_output = on_output
        self._on_output_closed = on_output_closed
        self._on_stdin_consumed = on_stdin_consumed
        self._grace = grace
        self._drain = drain
        self._straggler_grace = straggler_grace
        self._run_as = run_as
        self._plan = rlimit_plan(limits)
        self.cgroup = cgroup
        self._master: int | None = None
        self._closed = False
        """The terminal is gone (hung up or the run is over): input is dropped from now on."""
        self._reading = True
        """Not paused by the caller (whether a reader is installed also needs the master)."""
        self._resumed = 0
        """How many times reading was resumed: the end-of-output wait tells a quiet terminal from
        one that was paused for part of the wait."""
        self._eof = asyncio.Event()
        self._queue: deque[memoryview] = deque()
        self._queued = 0
        self._line_start = True
        """The last input byte was a newline (or there was none): one VEOF ends the input."""
        self._drained: list[asyncio.Future[None]] = []
        self.output = Tail()
        self.stdin_consumed = 0
        """Input bytes the terminal has taken, in order: the offset a receiver acknowledges."""
        self.stdin_dropped = 0

    # --- control, from any callback ------------------------------------------------------------

    def _first_signals(self, pid: int) -> None:
        """SIGHUP, SIGTERM and SIGCONT to the child's group; `run()` finds the rest of the session
        and goes on with the kill sequence."""
        _signal_groups({pid}, HANGUP)
        if self.cgroup is not None:  # what left the session gets the SIGTERM too
            self.cgroup.signal(signal.SIGTERM)
            self.cgroup.signal(signal.SIGCONT)

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (`TIOCSWINSZ` on the master sets the slave's): the kernel sends
        SIGWINCH to the terminal's foreground process group, which redraws. Raises ValueError for a
        size that does not fit; before the spawn, the size is the one the child starts with."""
        self._size = check_size(rows, cols)
        if self._master is not None:
            try:
                termios.tcsetwinsize(self._master, self._size)
            except OSError:  # the terminal is going away: nobody left to redraw
                pass

    @property
    def size(self) -> tuple[int, int]:
        return self._size

    def pause_output(self, stream: str = PTY_STREAM) -> None:
        """Stop reading output (the caller's window is exhausted): the child blocks on write."""
        _check_stream(stream)
        self._reading = False
        if self._master is not None and not self._eof.is_set():
            asyncio.get_running_loop().remove_reader(self._master)

    def resume_output(self, stream: str = PTY_STREAM) -> None:
        _check_stream(stream)
        if self._reading:
            return
        self._reading = True
        self._resumed += 1
        if self._master is not None and not self._eof.is_set():
            asyncio.get_running_loop().add_reader(self._master, self._readable)

    @property
    def reading(self) -> bool:
        return self._reading

    def close_output(self, stream: str = PTY_STREAM) -> None:
        """The reader of the output went away: hang up the terminal (close the master), which is to
        a terminal what a closed pipe is to `cmd | head`. The kernel sends SIGHUP to the session's
        leader and foreground group; the run then ends as the child does (or as a kill makes it)."""
        _check_stream(stream)
        self._hang_up()
        if not self._eof.is_set():
            self._end_of_output()

    def write_stdin(self, data: bytes) -> None:
        """Queue `data` as typed input (Ctrl-C is byte 0x03: the line discipline makes it SIGINT).
        Never blocks; `stdin_consumed` moves as the terminal takes it."""
        if not data:
            return
        data = bytes(data)
        if self._closed:
            self.stdin_dropped += len(data)
            self._report_consumed(len(data))
            return
        self._queue.append(memoryview(data))
        self._queued += len(data)
        self._line_start = data[-1:] in (b"\r", b"\n")
        if self._master is not None and len(self._queue) == 1:
            self._writable()

    def close_stdin(self) -> None:
        """End of input, as a terminal says it: the end-of-file character (VEOF, normally Ctrl-D),
        once at the start of a line and twice after a partial one (the first sends the line). In
        canonical mode the program's read then returns 0 (`cat`, `python3` reading a script see the
        end). A pty has no half-close (the master is also the output), so this is the only way to say
        it; ssh sends nothing at all for a terminal session, and a program in raw mode gets a byte."""
        veof = b"\x04"
        if self._master is not None:
            try:  # the termios calls on the master read the slave's settings
                char = termios.tcgetattr(self._master)[6][termios.VEOF]
                veof = char if isinstance(char, bytes) else bytes([char])
            except OSError:
                pass
        self.write_stdin(veof if self._line_start else veof * 2)
        self._line_start = True

    @property
    def stdin_pending(self) -> int:
        """Input bytes queued and not yet taken by the terminal."""
        return self._queued

    async def drain(self) -> None:
        """Return once every queued input byte was taken by the terminal, or dropped because the
        terminal is gone."""
        if not self._queued:
            return
        fut = asyncio.get_running_loop().create_future()
        self._drained.append(fut)
        await fut

    # --- the master ------------------------------------------------------------------------------

    def _readable(self) -> None:
        master = self._master
        if master is None:
            return
        try:
            data = os.read(master, READ_MAX)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EIO: every holder of the slave has closed it (nothing else is expected)
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(master)
            self._end_of_output()
            return
        self.output.feed(data)
        if self._on_output is not None:
            self._on_output(PTY_STREAM, data)

    def _end_of_output(self) -> None:
        self._eof.set()
        if self._on_output_closed is not None:
            self._on_output_closed(PTY_STREAM)

    def _writable(self) -> None:
        master = self._master
        if master is None:
            return
        loop = asyncio.get_running_loop()
        taken = 0
        while self._queue:
            chunk = self._queue[0]
            try:
                n = os.write(master, chunk[:WRITE_MAX])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # EIO: nobody holds the slave any more; the input has no reader
                loop.remove_writer(master)
                self._drop_queue()
                return
            taken += n
            self._queued -= n
            if n == len(chunk):
                self._queue.popleft()
            else:
                self._queue[0] = chunk[n:]
        if self._queue:
            loop.add_writer(master, self._writable)
        else:
            loop.remove_writer(master)
            self._wake_drained()
        self._report_consumed(taken)

    def _report_consumed(self, n: int) -> None:
        """Dropped input counts as consumed too: a sender must never wait for a reader that is gone."""
        if n:
            self.stdin_consumed += n
            if self._on_stdin_consumed is not None:
                self._on_stdin_consumed(self.stdin_consumed)

    def _drop_queue(self) -> None:
        dropped, self._queued = self._queued, 0
        self._queue.clear()
        self.stdin_dropped += dropped
        self._wake_drained()
        self._report_consumed(dropped)

    def _wake_drained(self) -> None:
        waiters, self._drained = self._drained, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _hang_up(self) -> None:
        """Stop watching the master and close it: the terminal hangs up for whoever still holds the
        slave (an escapee gets SIGHUP if it is their terminal, EIO otherwise); queued input is
        dropped."""
        self._closed = True
        master, self._master = self._master, None
        if master is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(master)
            loop.remove_writer(master)
            os.close(master)
        self._drop_queue()

    # --- the run -----------------------------------------------------------------------------------

    def _spawn_args(self, slave: int) -> dict[str, Any]:
        args: dict[str, Any] = {
            "stdin": slave,
            "stdout": slave,
            "stderr": slave,
            "cwd": self._cwd,
            "env": self._env,
            "start_new_session": True,
            "preexec_fn": partial(
                _child_setup,
                preexec_for(self._plan, self.cgroup.open_join() if self.cgroup is not None else ()),
                fcntl.ioctl,
                termios.TIOCSCTTY,
            ),
        }
        if self._executable is not None:
            args["executable"] = self._executable
        if self._run_as is not None:
            args.update(self._run_as.popen_args())
        return args

    def _give_terminal(self, slave: int) -> None:
        """The slave to the run-as user, as login does (see the module docstring)."""
        if self._run_as is None:
            return
        try:
            tty_gid = grp.getgrnam("tty").gr_gid
        except KeyError:
            tty_gid = self._run_as.gid
        os.fchown(slave, self._run_as.uid, tty_gid)
        os.fchmod(slave, 0o620)

    async def run(self) -> PtyOutcome:
        """Start the child, serve the terminal until the child has exited and its output is read to
        the end (or the run is killed), and report the exit as `ProcessRun` does. Raises OSError when
        the command cannot start (the terminal is closed again)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self._kill.is_set():  # cancelled before it could start: start nothing
            self._hang_up()
            return PtyOutcome(None, None, True, None, self.output, 0.0, stdin_dropped=self.stdin_dropped)
        master, slave = os.openpty()
        try:
            termios.tcsetwinsize(slave, self._size)
            self._give_terminal(slave)
            exit_watch = _Exit(loop)
            transport, _ = await loop.subprocess_exec(lambda: exit_watch, *self._argv, **self._spawn_args(slave))
        except subprocess.SubprocessError as exc:  # the preexec function failed: it did not start
            os.close(master)
            self._hang_up()
            raise OSError(f"the terminal could not be set up ({exc})") from None
        except BaseException:
            os.close(master)
            self._hang_up()
            raise
        finally:
            os.close(slave)  # the child holds it now; ours would keep EIO from ever coming
            if self.cgroup is not None:
                self.cgroup.closed_join()
        self.pid = pid = transport.get_pid()
        self._exited = exit_watch.exited
        killed, stage, stragglers, finished = False, None, False, False
        try:
            if self._closed:  # hung up (close_output) while it was starting
                os.close(master)
            else:
                self._master = master
                os.set_blocking(master, False)
                if self._size != termios.tcgetwinsize(master):  # resized while it was starting
                    termios.tcsetwinsize(master, self._size)
                if self._reading:
                    loop.add_reader(master, self._readable)
                if self._queue:
                    self._writable()
            self._armed = True
            if await self._exit_or_kill(exit_watch.exited):
                killed = True
                stage, _ = await kill_session(pid, self._grace, exit_watch.exited, hung_up=frozenset({pid}))
            elif await asyncio.to_thread(session_groups, pid) != set():  # exited, leaving part of its session
                stragglers = True
                await kill_session(pid, self._straggler_grace)
            if self.cgroup is not None and await self.cgroup.empty(self._straggler_grace):
                stragglers = stragglers or not killed  # what left the session is the run's too
            await self._read_to_end(killed)
            finished = True
        finally:
            self._armed = False  # the session is not ours to signal any more: its id may be reused
            self._hang_up()
            transport.close()
            if not finished:  # cancelled or failed mid-way: leave nothing running
                _signal_groups((session_groups(pid) or set()) | {pid}, (signal.SIGKILL,))
                if self.cgroup is not None:
                    self.cgroup.kill()
        exit_code, sig = split_returncode(transport.get_returncode())
        return PtyOutcome(
            exit_code=exit_code,
            signal=sig,
            killed=killed,
            stage=stage,
            output=self.output,
            duration=loop.time() - started,
            stragglers_killed=stragglers,
            stdin_dropped=self.stdin_dropped,
            contained=self.cgroup is not None,
        )

    async def _read_to_end(self, killed: bool) -> None:
        """Wait for the end of output after the session is gone. Killed: at most `drain` seconds.
        Otherwise for as long as reading is paused (the caller's flow control holds it; its cancel,
        `kill()`, ends the wait), and while reading, until EIO or until `drain` seconds pass with no
        byte at all: then something outside the session (a `setsid` escapee) holds the terminal, and
        closing the master hangs it up."""
        if self._eof.is_set():
            return
        eof = asyncio.ensure_future(self._eof.wait())
        try:
            if killed:
                await asyncio.wait({eof}, timeout=self._drain)
                return
            kill_wait = asyncio.ensure_future(self._kill.wait())
            try:
                while not eof.done() and not kill_wait.done():
                    before = (self.output.total, self._resumed, self._reading)
                    await asyncio.wait({eof, kill_wait}, timeout=self._drain, return_when=asyncio.FIRST_COMPLETED)
                    if before == (self.output.total, self._resumed, True) and self._reading:
                        return  # read the whole interval, and nothing came
            finally:
                kill_wait.cancel()
        finally:
            eof.cancel()
