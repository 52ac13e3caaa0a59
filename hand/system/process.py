"""Run one child process as a killable tree, with bounded output (DESIGN §6).

- The child starts in its own session (`start_new_session=True`), so its process group holds the
  whole tree it forks (short of a descendant calling `setsid` itself, which only cgroups could
  follow). Kill = SIGTERM (and SIGCONT, so a stopped member can act on it) to the group, a grace
  period, then SIGKILL to the group; `stage` records which one ended the tree. A grandchild that
  ignores SIGTERM therefore dies by SIGKILL: "no orphan survives".
- stdout and stderr are read concurrently as they arrive (a push protocol, so a slow consumer never
  stalls the child). Each chunk goes to the `on_output` callback (progress) and into a `Tail` that
  keeps only the LAST `OUTPUT_TAIL_MAX` bytes plus the total: memory stays bounded for any command.
- Foreground runs leave no stragglers. When the main process exits on its own, whatever is left of
  its process group (`cmd &`, `nohup cmd &`) is killed (SIGTERM, a short grace, SIGKILL), and pipes
  still held open by such a leftover are waited on only for a short drain period. A foreground run
  ends when its command ends; long-lived work belongs in background tasks, which have their own
  lifetime and logs. (Python 3.11's `Process.wait()` would wait for the pipes to close as well, i.e.
  hang on `sleep 100 &`; hence the protocol below, which sees the exit and the pipes separately.)

- Sandboxing (`hand.system.sandbox`) is applied by `subprocess` in the child before `exec`: the user and
  groups of `--run-as`, and `setrlimit` for the run's limits (a `preexec_fn` only when there are
  limits; see `hand.system.sandbox` for why that is safe enough). The tree-wide CPU budget is not here:
  the caller watches the tree (`hand.system.cputime`) and calls `kill()`.

"Gone" means no member of the group is alive. Zombies count as gone: where PID 1 does not reap
orphans (some containers), a killed grandchild stays a zombie forever, and it runs nothing.
Waiting for "gone" is event-driven, not a fixed sleep: the main process's exit comes from the child
watcher, the other members' through pidfds (Linux >= 5.3; without them, a poll from 0.5 ms backing
off to 5 ms), and /proc is scanned only once every member seen alive has exited. `kill()` sends
SIGTERM itself, at once, so a cancel costs the signal, the tree's own exit and one scan.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hand.system.cgroups import RunCgroup, check_program, shim_argv, shim_fits
from hand.system.sandbox import ResourceLimits, RunAs, preexec_for, rlimit_plan
from protocol import limits
from protocol.codes import KillStage
from protocol.io.pipes import grow_pipe

Stream = Literal["stdout", "stderr"]
OnOutput = Callable[[Stream, bytes], None]
OnSpawn = Callable[[int], Awaitable[None]]

DEFAULT_GRACE_S = 5.0
DRAIN_S = 0.2
"""How long pipes may stay open after the main process exited before we stop reading them."""
STRAGGLER_GRACE_S = 0.5
FIRST_POLL_S = 0.0005
POLL_S = 0.005
"""Without pidfds, a signalled group is re-checked after FIRST_POLL_S, then at doubling intervals
up to POLL_S."""
WATCHED_POLL_S = 0.05
"""With a pidfd on every live member, their exits wake us; the group is rescanned at this interval
only as a backstop (a member that left the group alive). A long grace costs ~20 scans a second."""
WATCH_MAX = 64
"""A group with more live members is polled instead: watching it would take one fd per member,
and running the Hand out of fds would break its connection too."""
REAP_BOUND_S = 5.0
"""Upper bound on waiting for a SIGKILLed tree to disappear (a process stuck in the kernel)."""
SCAN_ROUNDS = 20
"""Re-listings of /proc in one scan before giving up on a stable view (see `_scan`)."""
SCAN_INLINE_MAX = 1000
"""A scan that must read up to this many processes' /proc/PID/stat runs on the loop (~3 us each:
less than the hop to a thread and back on a busy machine); a larger one goes to a thread, so a
kill never stalls the loop for more than ~3 ms."""

_FDS: dict[int, Stream] = {1: "stdout", 2: "stderr"}


class Tail:
    """The last `cap` bytes of a stream and the stream's total size."""

    def __init__(self, cap: int = limits.OUTPUT_TAIL_MAX) -> None:
        self._cap = cap
        self._buf = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if len(data) >= self._cap:
            self._buf[:] = data[len(data) - self._cap :]
            return
        self._buf += data
        excess = len(self._buf) - self._cap
        if excess > 0:
            del self._buf[:excess]

    @property
    def data(self) -> bytes:
        return bytes(self._buf)

    @property
    def truncated(self) -> bool:
        return self.total > len(self._buf)


@dataclass(frozen=True)
class ProcessOutcome:
    exit_code: int | None
    """The main process's exit status, or None if a signal ended it."""
    signal: int | None
    killed: bool
    """We started killing the tree before the main process exited on its own."""
    stage: KillStage | None
    """Which signal ended the tree, when `killed`."""
    stdout: Tail
    stderr: Tail
    duration: float
    stragglers_killed: bool = False
    """Leftovers of the group (or the run's cgroup) were killed after the main process exited on
    its own."""
    contained: bool = False
    """The run had a cgroup of its own: nothing of it is left (a kill by process group only
    reaches the descendants that stayed in the group)."""


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_data: Callable[[int, bytes], None],
        on_closed: Callable[[int], None] | None = None,
        on_stdin_drained: Callable[[], None] | None = None,
    ) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: dict[int, asyncio.Future[None]] = {fd: loop.create_future() for fd in _FDS}
        self._on_data = on_data
        self._on_closed = on_closed
        self._on_stdin_drained = on_stdin_drained

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._on_data(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        fut = self.closed.get(fd)
        if fut is not None and not fut.done():
            fut.set_result(None)
        if self._on_closed is not None:
            self._on_closed(fd)

    def resume_writing(self) -> None:  # the stdin pipe's buffer is empty again
        if self._on_stdin_drained is not None:
            self._on_stdin_drained()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def size_pipes(transport: asyncio.SubprocessTransport, size: int) -> int:
    """Issue 25 item 2: the child's pipes hold a window (at most /proc/sys/fs/pipe-max-size), so
    the child writes and we read in chunks, not in the default 64 KiB pipe's pieces (measured: 4
    frames per 256 KiB chunk before, each with its costs on all three processes). Best effort: a
    user over /proc/sys/fs/pipe-user-pages-soft keeps the default size. Returns the size set on
    the output pipes (0: none)."""
    got = 0
    for fd_no in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd_no)
        if pipe is None:
            continue
        try:
            fd = pipe.get_extra_info("pipe").fileno()
        except (AttributeError, ValueError, OSError):
            continue
        size_set = grow_pipe(fd, size)
        if fd_no and size_set:
            got = size_set
            if hasattr(pipe, "max_size"):  # asyncio's read size for this pipe (default 256 KiB)
                pipe.max_size = max(pipe.max_size, min(size_set, limits.STREAM_CHUNK_MAX))
    return got


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exited_unreaped(pid: int) -> bool:
    """Has our child `pid` already exited, though the event loop has not seen it yet? Then a kill
    sent now ends nothing: the program exited on its own (issue 14, item 5: a Hand frozen past a
    run's deadline wakes to both the timer and the exit, and must report the exit, not
    `timed_out`). `waitid(WNOWAIT)` looks without collecting the status; a child already collected
    (by asyncio's watcher thread, its callback still queued) is no child of ours any more."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # collected already, unless something odd made it not ours: then look
        return not os.path.exists(f"/proc/{pid}")
    except OSError:
        return False
    return info is not None


def group_alive(pgid: int) -> bool:
    """Is any non-zombie process left in group `pgid`?"""
    entries = _entries(pgid)
    live = _scan(pgid, entries) if entries is not None else None
    return live is None or bool(live)


async def live_members(pgid: int) -> list[int] | None:
    """The pids of group `pgid`'s live (non-zombie) members, [] once it is gone; None when it exists
    but its members cannot be listed (no /proc, or not ours to signal): count that as alive."""
    entries = _entries(pgid)
    if entries is None:
        return None
    if sum(1 for key in entries if _unknown(key, pgid)) <= SCAN_INLINE_MAX:
        return _scan(pgid, entries)
    return await asyncio.to_thread(_scan, pgid, entries)


Entry = tuple[str, int]
"""A /proc entry: (pid, inode). A reused pid gets a new inode, so an entry names one process."""

_seen: dict[Entry, int | None] = {}
"""Processes already read, with their session id, or None once a zombie. A process outside session
G never joins group G (setpgid stays within a session; setsid makes a session of the caller's own
pid), and a zombie stays one: a scan for G skips both, and reads only the processes new since the
last scan and those of G's own session."""


def _unknown(key: Entry, pgid: int) -> bool:
    """Must this process be read to tell if it is a live member of group `pgid`? Process `pgid`
    itself always is: seen before its `setsid`, it was in another session."""
    return _seen.get(key, pgid) == pgid or key[0] == str(pgid)


def _entries(pgid: int) -> list[Entry] | None:
    """The /proc entries to scan for group `pgid`'s members: none when the group has no member at
    all, not even a zombie (one cheap syscall tells, the usual case once a tree is reaped); None
    when it exists and cannot be looked into."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        return None
    return _listing()


def _listing() -> list[Entry] | None:
    try:
        with os.scandir("/proc") as it:
            return [(e.name, e.inode()) for e in it if e.name.isdigit()]
    except OSError:
        return None  # no way to tell zombies apart here: assume alive


def _scan(pgid: int, entries: list[Entry]) -> list[int] | None:
    """The live members of group `pgid` among the processes of /proc listing `entries`, re-listing
    until nothing new shows up; None (count it as alive) if new processes keep showing up.

    Reading /proc is not atomic: a member may fork and exit while it is read, so that its child is
    missing from the listing and the member itself is already dead (the tree would be "gone" with
    the child running). Whatever was created meanwhile had a live creator; a re-listing with nothing
    new in it means no creator was missed."""
    global _seen
    if not entries:
        return []
    old = _seen
    _seen = {key: old[key] for key in entries if key in old}  # forget the processes gone
    want = str(pgid).encode()
    done: set[Entry] = set()
    for _ in range(SCAN_ROUNDS):
        fresh = [key for key in entries if key not in done and _unknown(key, pgid)]
        if not fresh:
            return []
        done.update(fresh)
        live = []
        for key in fresh:
            try:
                fd = os.open(f"/proc/{key[0]}/stat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                stat = os.read(fd, 512)  # pid (comm) state ppid pgrp session ...: all near the start
            except OSError:
                continue
            finally:
                os.close(fd)
            fields = stat[stat.rfind(b")") + 2 :].split(maxsplit=4)
            if len(fields) < 4:
                continue
            zombie = fields[0] in (b"Z", b"X")
            _seen[key] = None if zombie else int(fields[3])
            if not zombie and fields[2] == want:
                live.append(int(key[0]))
        if live:
            return live
        relisted = _listing()
        if relisted is None:
            return None
        entries = relisted
    return None


def _pidfd(pid: int, pgid: int) -> int | None:
    """A pidfd for member `pid` of group `pgid` (readable once that process has exited), or None: no
    pidfd support (not Linux >= 5.3, or a seccomp filter), or `pid` no longer names a member. The
    group is checked after the open, so the fd names a member or a process that already exited."""
    if _pidfd_open is None:
        return None
    try:
        fd = _pidfd_open(pid)
    except OSError:
        return None
    try:
        if os.getpgid(pid) == pgid:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


_pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None)


async def _until_exited(fds: list[int], timeout: float) -> bool:
    """Wait until every pidfd is readable (all those processes have exited) or `timeout` passes.
    False, at once, when this event loop cannot watch fds."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    pending = set(fds)

    def ready(fd: int) -> None:
        loop.remove_reader(fd)  # a pidfd stays readable: one report is enough
        pending.discard(fd)
        if not pending and not done.done():
            done.set_result(None)

    watching: list[int] = []
    try:
        for fd in fds:
            loop.add_reader(fd, ready, fd)
            watching.append(fd)
    except (NotImplementedError, OSError):
        fds = []
    try:
        if fds:
            await asyncio.wait({done}, timeout=timeout)
    finally:
        for fd in watching:
            loop.remove_reader(fd)
    return bool(fds)


async def _until_gone(pgid: int, exited: asyncio.Future[None] | None, until: float) -> bool:
    """Wait until the tree is gone (True) or loop time `until` passes (False), without a fixed sleep.

    Exits are events: the main process's (`exited`, from the child watcher) and, through pidfds,
    every member's. The group is scanned only when every member seen alive by the last scan has
    exited (a live one keeps the group alive anyway); that scan finds what was forked meanwhile.
    The timer is a backstop for a member that left the group alive (WATCHED_POLL_S), or, without
    pidfds, the poll itself (FIRST_POLL_S, doubling up to POLL_S)."""
    loop = asyncio.get_running_loop()
    if exited is not None and not exited.done():
        await asyncio.wait({exited}, timeout=max(0.0, until - loop.time()))
        if not exited.done():
            return False
    step = FIRST_POLL_S
    while True:
        live = await live_members(pgid)
        if live == []:
            return True
        remaining = until - loop.time()
        if remaining <= 0:
            return False
        watchable = live if live is not None and len(live) <= WATCH_MAX else []
        fds = [fd for pid in watchable if (fd := _pidfd(pid, pgid)) is not None]
        try:
            if live and len(fds) == len(live) and await _until_exited(fds, min(WATCHED_POLL_S, remaining)):
                continue
        finally:
            for fd in fds:
                os.close(fd)
        await asyncio.sleep(min(step, remaining))
        step = min(step * 2, POLL_S)


async def exit_or_kill(exited: asyncio.Future[None], kill: asyncio.Event) -> None:
    """Wait until the main process exits or a kill is requested, whichever comes first (for a
    process tree and for a terminal session alike)."""
    if exited.done():
        return
    kill_wait = asyncio.get_running_loop().create_task(kill.wait())
    either: set[asyncio.Future[Any]] = {exited, kill_wait}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        kill_wait.cancel()


def split_returncode(rc: int | None) -> tuple[int | None, int | None]:
    """asyncio's return code as (exit code, signal): negative means killed by that signal."""
    if rc is None:
        return None, None
    return (rc, None) if rc >= 0 else (None, -rc)


class Killable:
    """What a process tree (`ProcessRun`) and a terminal session (`hand.system.pty.PtyRun`) share:
    a kill request that may come at any time, from any callback, any number of times. It is
    recorded, and once the child runs (`_armed`) its first signals (`_first_signals`) go out at
    once, in the caller's own callback, not a loop turn later behind the frames and log lines that
    callback queued: a cancel's latency starts with them. `run()` performs the rest of the kill
    sequence and says, through `_exit_or_kill`, whether the truth is "we killed it"."""

    def __init__(self) -> None:
        self._kill = asyncio.Event()
        self._armed = False
        """The child runs (past `on_spawn`) and `run()` has not finished: `kill()` may signal it."""
        self._terminated = False
        self.pid: int | None = None
        self._exited: asyncio.Future[None] | None = None

    def kill(self) -> None:
        self._kill.set()
        if self._armed and not self.exited:
            self._terminate()

    def _terminate(self) -> None:
        """The first signals, once; none for a main process that exited first: it is not ours to
        claim (what is left of its group or session is stragglers)."""
        if not self._terminated and self.pid is not None:
            if exited_unreaped(self.pid):
                return
            self._terminated = True
            self._first_signals(self.pid)

    def _first_signals(self, pid: int) -> None:
        raise NotImplementedError

    @property
    def exited(self) -> bool:
        """The main process has exited (and been reaped); output may still be draining."""
        return self._exited is not None and self._exited.done()

    async def _exit_or_kill(self, exited: asyncio.Future[None]) -> bool:
        """Wait for the main process's exit or a kill request; True when we are killing it: the kill
        request came first, or `kill()` sent the first signals just before the exit was seen."""
        await exit_or_kill(exited, self._kill)
        if not exited.done():
            self._terminate()
        return self._terminated


class ProcessRun(Killable):
    """One child process tree. `kill()` may be called at any time, from any callback, any number of
    times: it records the request and, once the child runs, sends SIGTERM at once; `run()` performs
    the rest of the kill sequence."""

    def __init__(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        on_output: OnOutput | None = None,
        grace: float = DEFAULT_GRACE_S,
        drain: float = DRAIN_S,
        straggler_grace: float = STRAGGLER_GRACE_S,
        on_spawn: OnSpawn | None = None,
        limits: ResourceLimits | None = None,
        run_as: RunAs | None = None,
        stdin_stream: bool = False,
        on_stdin_consumed: Callable[[int], None] | None = None,
        on_output_closed: Callable[[Stream], None] | None = None,
        pipe_size: int | None = None,
        cgroup: RunCgroup | None = None,
    ) -> None:
        """`on_spawn(pid)` is awaited right after the child started, before anything else: a
        background task records `running` and the pid there. Output and exit are still observed
        meanwhile, and a `kill()` requested during it is honoured as soon as it returns.

        `limits` become `setrlimit` calls in the child, `run_as` its user and groups. `cgroup`:
        the run's own (made by the caller, who also closes it): the child enters it before it
        execs, the kill reaches everything in it, and the run is over only once it is empty.

        Streams (DESIGN §11): with `stdin_stream` the child's stdin is a pipe fed by `write_stdin`
        and closed by `close_stdin`; `on_stdin_consumed(n)` reports the bytes the child's pipe has
        taken so far (what may be acknowledged). `pause_output`/`resume_output` stop and restart
        reading one output pipe (flow control: the child blocks on write while paused), and
        `on_output_closed(stream)` says a pipe reached its end. `pipe_size`: the child's pipes
        are sized to it (a streamed run: its window) and read that much at a time (`size_pipes`)."""
        if not argv:
            raise ValueError("argv must not be empty")
        super().__init__()
        self._argv = list(argv)
        self._cwd = cwd
        self._env = env
        self._stdin = stdin
        self._stdin_stream = stdin_stream
        self._pipe_size = pipe_size
        self._on_stdin_consumed = on_stdin_consumed
        self._on_output_closed = on_output_closed
        self._stdin_pipe: asyncio.WriteTransport | None = None
        self._stdin_early: list[bytes] = []
        """Written before the child started: handed to its pipe when it has one."""
        self._stdin_written = 0
        self._stdin_reported = 0
        self._stdin_eof = False
        self._stdin_gone = False
        """The child's end of stdin is closed: what is written from now on is dropped (and counted
        as consumed, so a sender is never left waiting on a reader that went away)."""
        self._transport: asyncio.SubprocessTransport | None = None
        self._paused: set[int] = set()
        self._last_output = 0.0
        self._on_output = on_output
        self._grace = grace
        self._drain = drain
        self._straggler_grace = straggler_grace
        self._on_spawn = on_spawn
        self._sandbox: dict[str, Any] = {}
        """Extra `subprocess.Popen` keywords (`user`, ...), passed through `subprocess_exec`."""
        self._plan = rlimit_plan(limits)
        self.cgroup = cgroup
        if run_as is not None:
            self._sandbox.update(run_as.popen_args())
        self.stdout = Tail()
        self.stderr = Tail()

    def _first_signals(self, pid: int) -> None:
        """SIGTERM (and SIGCONT, so a stopped member can act on it) to the group, and to whatever
        of the run's cgroup left it."""
        _signal_group(pid, signal.SIGTERM)
        _signal_group(pid, signal.SIGCONT)
        if self.cgroup is not None:
            self.cgroup.signal(signal.SIGTERM)
            self.cgroup.signal(signal.SIGCONT)

    # --- streams ---

    def write_stdin(self, data: bytes) -> None:
        """Give the child `data` on its stdin (after what was written before)."""
        if self._stdin_eof:
            raise ValueError("stdin is closed")
        self._stdin_written += len(data)
        if self._stdin_gone:
            self._report_stdin()
        elif self._stdin_pipe is None:
            self._stdin_early.append(data)
        else:
            self._stdin_pipe.write(data)
            self._report_stdin()

    def close_stdin(self) -> None:
        """End of input: the child reads EOF once it has read what was written."""
        self._stdin_eof = True
        if self._stdin_pipe is not None and not self._stdin_gone:
            self._stdin_pipe.close()  # flushes first

    def _report_stdin(self) -> None:
        if self._stdin_gone or self._stdin_pipe is None:
            consumed = self._stdin_written if self._stdin_gone else 0
        else:
            consumed = self._stdin_written - self._stdin_pipe.get_write_buffer_size()
        if consumed > self._stdin_reported:
            self._stdin_reported = consumed
            if self._on_stdin_consumed is not None:
                self._on_stdin_consumed(consumed)

    def _pipe_closed(self, fd: int) -> None:
        if fd == 0:
            self._stdin_gone = True
            self._report_stdin()
            return
        stream = _FDS.get(fd)
        if stream is not None and self._on_output_closed is not None:
            self._on_output_closed(stream)

    def _read_pipe(self, stream: str) -> asyncio.ReadTransport | None:
        if self._transport is None:
            return None
        pipe = self._transport.get_pipe_transport(1 if stream == "stdout" else 2)
        return pipe if isinstance(pipe, asyncio.ReadTransport) else None

    def pause_output(self, stream: str) -> None:
        """Stop reading `stream`'s pipe (its window is full): the child blocks when the pipe is."""
        fd = 1 if stream == "stdout" else 2
        pipe = self._read_pipe(stream)
        if fd not in self._paused and pipe is not None and not pipe.is_closing():
            self._paused.add(fd)
            pipe.pause_reading()

    def resume_output(self, stream: str) -> None:
        fd = 1 if stream == "stdout" else 2
        pipe = self._read_pipe(stream)
        if fd in self._paused:
            self._paused.discard(fd)
            if pipe is not None and not pipe.is_closing():
                pipe.resume_reading()

    def close_output(self, stream: str) -> None:
        """The reader of `stream` went away: close our end, so the child's next write fails
        (SIGPIPE), as it would for `cmd | head` on one machine."""
        self._paused.discard(1 if stream == "stdout" else 2)
        pipe = self._read_pipe(stream)
        if pipe is not None:
            pipe.close()

    def _on_data(self, fd: int, data: bytes) -> None:
        stream = _FDS.get(fd)
        if stream is None or not data:
            return
        self._last_output = asyncio.get_running_loop().time()
        (self.stdout if fd == 1 else self.stderr).feed(data)
        if self._on_output is not None:
            self._on_output(stream, data)

    async def run(self) -> ProcessOutcome:
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self._kill.is_set():  # cancelled before it could start: start nothing
            return ProcessOutcome(None, None, True, None, self.stdout, self.stderr, 0.0)
        proto = _Protocol(loop, self._on_data, self._pipe_closed, self._report_stdin)
        piped = self._stdin is not None or self._stdin_stream
        argv = self._argv
        if self.cgroup is not None and not self._plan and "user" not in self._sandbox and shim_fits(argv, self._env):
            check_program(argv[0], self._cwd, self._env)  # fails as it would without the shell
            argv = shim_argv(self.cgroup, argv)  # vfork stays: see `shim_argv`
        else:
            preexec = preexec_for(self._plan, self.cgroup.open_join() if self.cgroup is not None else ())
            if preexec is not None:
                self._sandbox["preexec_fn"] = preexec
        # The spawn runs as its own task, shielded: a cancel landing while asyncio still connects
        # the pipes would make it kill the main process alone and then wait for every pipe to
        # close, which a grandchild holding stdout can make minutes. `_abandon_spawn` lets the
        # spawn finish (it is bounded: fork, exec, pipes) and then kills the whole tree.
        spawning = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: proto,
                *argv,
                stdin=asyncio.subprocess.PIPE if piped else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
                **self._sandbox,
            )
        )
        try:
            transport, _ = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            await self._abandon_spawn(spawning)
            raise
        except subprocess.SubprocessError as exc:  # the preexec function failed: it did not start
            raise OSError(f"the sandbox could not be set up ({exc})") from None
        finally:
            if self.cgroup is not None:
                self.cgroup.closed_join()
        pgid = transport.get_pid()
        self.pid = pgid
        self._transport = transport
        if self._pipe_size is not None:
            size_pipes(transport, self._pipe_size)
        self._exited = proto.exited
        finished = False
        try:
            if self._on_spawn is not None:
                await self._on_spawn(pgid)
            self._armed = True
            if self._stdin is not None:
                pipe = transport.get_pipe_transport(0)
                if pipe is not None:
                    assert isinstance(pipe, asyncio.WriteTransport)  # fd 0 is the child's stdin: a write pipe
                    pipe.write(self._stdin)
                    pipe.close()  # flushes, then EOF; a child that never reads gets EPIPE-closed
            elif self._stdin_stream:
                pipe = transport.get_pipe_transport(0)
                assert isinstance(pipe, asyncio.WriteTransport)
                # resume_writing() whenever the buffer empties: that is when written bytes are consumed
                pipe.set_write_buffer_limits(high=0)
                self._stdin_pipe = pipe
                for data in self._stdin_early:
                    pipe.write(data)
                self._stdin_early = []
                if self._stdin_eof:
                    pipe.close()
                self._report_stdin()
            killed, stage, gone = False, None, False
            if await self._exit_or_kill(proto.exited):
                killed = True
                stage, gone = await self._kill_group(pgid, self._grace, proto.exited, terminated=True)
                if self.cgroup is not None:  # what left the group had the SIGTERM too: now the rest
                    await self.cgroup.empty(self._straggler_grace)
            drained = await self._wait_output(proto)
            stragglers = False
            # Seen gone, it stays gone: a new member needs a live one to fork it.
            if not gone and (await live_members(pgid)) != []:
                stragglers = True
                await self._kill_group(pgid, self._straggler_grace, None)
            if self.cgroup is not None and await self.cgroup.empty(self._straggler_grace):
                stragglers = True  # what left the group (`setsid`, a daemon) is the run's too
            if not drained:
                await self._wait_closed(proto, self._drain)
            finished = True
        finally:
            self._armed = False  # the group is not ours to signal any more: its id may be reused
            transport.close()  # stop reading pipes a setsid'd escapee may still hold
            if not finished:  # cancelled or failed mid-way: leave nothing running
                _signal_group(pgid, signal.SIGKILL)
                if self.cgroup is not None:
                    self.cgroup.kill()
        exit_code, sig = split_returncode(transport.get_returncode())
        return ProcessOutcome(
            exit_code=exit_code,
            signal=sig,
            killed=killed,
            stage=stage,
            stdout=self.stdout,
            stderr=self.stderr,
            duration=loop.time() - started,
            stragglers_killed=stragglers,
            contained=self.cgroup is not None,
        )

    async def _abandon_spawn(self, spawning: asyncio.Future[tuple[asyncio.SubprocessTransport, Any]]) -> None:
        """Cancelled while spawning: wait for the spawn to end (a second cancel meanwhile changes
        nothing: the first one is re-raised by the caller), then SIGKILL the group and the cgroup
        and close the pipes, so nothing of the run is left and no pipe keeps anyone waiting."""
        while not spawning.done():
            try:
                await asyncio.wait({spawning})
            except asyncio.CancelledError:
                continue
        if spawning.cancelled() or spawning.exception() is not None:
            return  # nothing started
        transport, _ = spawning.result()
        _signal_group(transport.get_pid(), signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        transport.close()

    async def _wait_output(self, proto: _Protocol) -> bool:
        """After the main process exited: wait for its pipes to close, at most `drain` seconds of
        silence. A pipe paused for flow control is not silent: its reader is just slower than the
        child was, and every byte is still owed to it, so that wait has no bound here (the run's
        own deadline still applies)."""
        loop = asyncio.get_running_loop()
        while True:
            if await self._wait_closed(proto, self._drain):
                return True
            if not self._paused and loop.time() - self._last_output >= self._drain:
                return False

    @staticmethod
    async def _wait_closed(proto: _Protocol, timeout: float) -> bool:
        pending = [f for f in proto.closed.values() if not f.done()]
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=timeout)
        return not still

    @staticmethod
    async def _kill_group(
        pgid: int, grace: float, exited: asyncio.Future[None] | None, *, terminated: bool = False
    ) -> tuple[KillStage, bool]:
        """SIGTERM the group, give it `grace` seconds to be gone, then SIGKILL it. Returns the stage
        that ended it and whether it was seen gone (False only past REAP_BOUND_S after SIGKILL).

        `exited` is the main process's exit (None once it has been reaped): the tree is gone when
        the main process has exited and no member of the group is left alive. `terminated`: the
        SIGTERM is already out.
        """
        loop = asyncio.get_running_loop()
        if not terminated:
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)
        if await _until_gone(pgid, exited, loop.time() + grace):
            return KillStage.TERM, True
        _signal_group(pgid, signal.SIGKILL)
        return KillStage.KILL, await _until_gone(pgid, exited, loop.time() + REAP_BOUND_S)


async def kill_group(pgid: int, grace: float) -> KillStage:
    """Kill process group `pgid` (not our child: e.g. one left by a crashed Hand) as a whole tree:
    SIGTERM, `grace` seconds, SIGKILL."""
    return (await ProcessRun._kill_group(pgid, grace, None))[0]


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the pid, it names one
    process for good, so a pid reused after a restart is never mistaken for the one we started."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
