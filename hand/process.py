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

- Sandboxing (`hand.sandbox`) is applied by `subprocess` in the child before `exec`: the user and
  groups of `--run-as`, and `setrlimit` for the run's limits (a `preexec_fn` only when there are
  limits; see `hand.sandbox` for why that is safe enough). The tree-wide CPU budget is not here:
  the caller watches the tree (`hand.cputime`) and calls `kill()`.

"Gone" means no member of the group is alive. Zombies count as gone: where PID 1 does not reap
orphans (some containers), a killed grandchild stays a zombie forever, and it runs nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Literal

from hand.sandbox import ResourceLimits, RunAs, preexec_for, rlimit_plan
from protocol import limits
from protocol.codes import KillStage

Stream = Literal["stdout", "stderr"]
OnOutput = Callable[[Stream, bytes], None]
OnSpawn = Callable[[int], Awaitable[None]]

DEFAULT_GRACE_S = 5.0
DRAIN_S = 0.2
"""How long pipes may stay open after the main process exited before we stop reading them."""
STRAGGLER_GRACE_S = 0.5
POLL_S = 0.005
REAP_BOUND_S = 5.0
"""Upper bound on waiting for a SIGKILLed tree to disappear (a process stuck in the kernel)."""

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
    """Leftovers of the group were killed after the main process exited on its own."""


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_data: Callable[[int, bytes], None]) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: dict[int, asyncio.Future[None]] = {fd: loop.create_future() for fd in _FDS}
        self._on_data = on_data

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._on_data(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        fut = self.closed.get(fd)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Is any non-zombie process left in group `pgid`?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True  # no way to tell zombies apart here: assume alive
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


class ProcessRun:
    """One child process tree. `kill()` may be called at any time, from any callback, any number of
    times: it only records the request; `run()` performs the kill sequence."""

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
    ) -> None:
        """`on_spawn(pid)` is awaited right after the child started, before anything else: a
        background task records `running` and the pid there. Output and exit are still observed
        meanwhile, and a `kill()` requested during it is honoured as soon as it returns.

        `limits` become `setrlimit` calls in the child, `run_as` its user and groups."""
        if not argv:
            raise ValueError("argv must not be empty")
        self._argv = list(argv)
        self._cwd = cwd
        self._env = env
        self._stdin = stdin
        self._on_output = on_output
        self._grace = grace
        self._drain = drain
        self._straggler_grace = straggler_grace
        self._on_spawn = on_spawn
        self._sandbox: dict[str, object] = {}
        preexec = preexec_for(rlimit_plan(limits))
        if preexec is not None:
            self._sandbox["preexec_fn"] = preexec
        if run_as is not None:
            self._sandbox.update(run_as.popen_args())
        self._kill = asyncio.Event()
        self.stdout = Tail()
        self.stderr = Tail()
        self.pid: int | None = None
        self._exited: asyncio.Future[None] | None = None

    def kill(self) -> None:
        self._kill.set()

    @property
    def exited(self) -> bool:
        """The main process has exited (and been reaped); output may still be draining."""
        return self._exited is not None and self._exited.done()

    def _on_data(self, fd: int, data: bytes) -> None:
        stream = _FDS.get(fd)
        if stream is None or not data:
            return
        (self.stdout if fd == 1 else self.stderr).feed(data)
        if self._on_output is not None:
            self._on_output(stream, data)

    async def run(self) -> ProcessOutcome:
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self._kill.is_set():  # cancelled before it could start: start nothing
            return ProcessOutcome(None, None, True, None, self.stdout, self.stderr, 0.0)
        proto = _Protocol(loop, self._on_data)
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: proto,
                *self._argv,
                stdin=asyncio.subprocess.PIPE if self._stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
                **self._sandbox,
            )
        except subprocess.SubprocessError as exc:  # the preexec function failed: it did not start
            raise OSError(f"the sandbox could not be set up ({exc})") from None
        pgid = transport.get_pid()
        self.pid = pgid
        self._exited = proto.exited
        finished = False
        try:
            if self._on_spawn is not None:
                await self._on_spawn(pgid)
            if self._stdin is not None:
                pipe = transport.get_pipe_transport(0)
                if pipe is not None:
                    pipe.write(self._stdin)
                    pipe.close()  # flushes, then EOF; a child that never reads gets EPIPE-closed
            killed, stage = False, None
            if not proto.exited.done():
                kill_wait = loop.create_task(self._kill.wait())
                try:
                    await asyncio.wait({proto.exited, kill_wait}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    kill_wait.cancel()
            if not proto.exited.done():  # the kill request came first: the truth is "we killed it"
                killed = True
                stage = await self._kill_group(pgid, self._grace, proto.exited)
            drained = await self._wait_closed(proto, self._drain)
            stragglers = False
            if await asyncio.to_thread(group_alive, pgid):
                stragglers = True
                await self._kill_group(pgid, self._straggler_grace, None)
            if not drained:
                await self._wait_closed(proto, self._drain)
            finished = True
        finally:
            transport.close()  # stop reading pipes a setsid'd escapee may still hold
            if not finished:  # cancelled or failed mid-way: leave nothing running
                _signal_group(pgid, signal.SIGKILL)
        rc = transport.get_returncode()
        return ProcessOutcome(
            exit_code=rc if rc is not None and rc >= 0 else None,
            signal=-rc if rc is not None and rc < 0 else None,
            killed=killed,
            stage=stage,
            stdout=self.stdout,
            stderr=self.stderr,
            duration=loop.time() - started,
            stragglers_killed=stragglers,
        )

    @staticmethod
    async def _wait_closed(proto: _Protocol, timeout: float) -> bool:
        pending = [f for f in proto.closed.values() if not f.done()]
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=timeout)
        return not still

    @staticmethod
    async def _kill_group(pgid: int, grace: float, exited: asyncio.Future[None] | None) -> KillStage:
        """SIGTERM the group, give it `grace` seconds to be gone, then SIGKILL it.

        `exited` is the main process's exit (None once it has been reaped): the tree is gone when
        the main process has exited and no member of the group is left alive.
        """
        loop = asyncio.get_running_loop()
        _signal_group(pgid, signal.SIGTERM)
        _signal_group(pgid, signal.SIGCONT)
        deadline = loop.time() + grace
        while True:
            if (exited is None or exited.done()) and not await asyncio.to_thread(group_alive, pgid):
                return KillStage.TERM
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.sleep(min(POLL_S, remaining))
        _signal_group(pgid, signal.SIGKILL)
        bound = loop.time() + REAP_BOUND_S
        while loop.time() < bound:
            if (exited is None or exited.done()) and not await asyncio.to_thread(group_alive, pgid):
                break
            await asyncio.sleep(POLL_S)
        return KillStage.KILL


async def kill_group(pgid: int, grace: float) -> KillStage:
    """Kill process group `pgid` (not our child: e.g. one left by a crashed Hand) as a whole tree:
    SIGTERM, `grace` seconds, SIGKILL."""
    return await ProcessRun._kill_group(pgid, grace, None)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the pid, it names one
    process for good, so a pid reused after a restart is never mistaken for the one we started."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
