"""Virtual commands: what the operating system of a simulated Hand machine runs.

A command is a job with a duration, an exit status and a few output chunks, described by its tool
arguments (so the Mind's digests and bindings cover it like real arguments). It is started at most
once per `VProcess`, and every start is reported to the checker: "no task executed twice" is
counted here, where the side effect happens, not inferred from states.

Like a real process group started in its own session, a job outlives the Hand that started it: a
Hand crash leaves it running (an orphan) until it ends or the restarted Hand kills it. Its timers
belong to the machine, not to the Hand's loop. Killing follows `hand.system.process.ProcessRun`: the
truth wins (a job that exited before the kill request was observed is not `killed`), SIGTERM ends
a cooperative job after a short delay, otherwise SIGKILL after the grace.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from sim.runtime import Clock, Fut

from hand.system.process import ProcessOutcome, Tail
from protocol.codes import KillStage

TERM_DELAY_S = 0.05
PROGRAM = "job"
"""argv[0] of every simulated job."""
SIGTERM, SIGKILL = 15, 9


@dataclass(frozen=True)
class JobSpec:
    duration: float
    rc: int = 0
    chunks: int = 0
    term: bool = True
    """Dies on SIGTERM; False: ignores it and needs the SIGKILL after the grace."""
    nostart: bool = False
    """The program does not exist (`cannot start job: No such file or directory`, exit 127): nothing runs."""

    def args(self) -> dict[str, Any]:
        return {"d": self.duration, "rc": self.rc, "out": self.chunks, "term": self.term, "ns": self.nostart}

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> JobSpec | None:
        try:
            return cls(float(args["d"]), int(args["rc"]), int(args["out"]), bool(args["term"]), bool(args["ns"]))
        except (KeyError, TypeError, ValueError):
            return None


class Machine:
    """The OS of one Hand machine: its process table survives Hand crashes."""

    def __init__(self, label: str, clock: Clock, on_exec: Callable[[tuple[str, str, str]], None]) -> None:
        self.label = label
        self.clock = clock
        self.on_exec = on_exec
        self.table: dict[int, VProcess] = {}
        self._next_pid = 100

    def spawn(self, proc: VProcess) -> int:
        self._next_pid += 1
        self.table[self._next_pid] = proc
        self.on_exec(proc.key)
        return self._next_pid

    def alive(self, pid: int | None) -> VProcess | None:
        proc = self.table.get(pid) if pid is not None else None
        return proc if proc is not None and proc.alive else None

    def running(self) -> list[VProcess]:
        return [p for p in self.table.values() if p.alive]


OnOutput = Callable[[str, bytes], None]
OnSpawn = Callable[[int], Generator[Any, Any, Any]]


class VProcess:
    """One command as `hand.system.process.ProcessRun` runs it: `kill()` only records the request."""

    def __init__(
        self,
        machine: Machine,
        spec: JobSpec,
        key: tuple[str, str, str],
        *,
        grace: float,
        on_output: OnOutput | None = None,
        on_spawn: OnSpawn | None = None,
    ) -> None:
        self.machine = machine
        self.spec = spec
        self.key = key
        self.grace = grace
        self.on_output = on_output
        self.on_spawn = on_spawn
        self.pid: int | None = None
        self.alive = False
        self.exited = False
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.kill_requested = False
        self._exited = Fut()
        self._wake: Fut | None = None
        self._stage = KillStage.TERM

    def kill(self) -> None:
        self.kill_requested = True
        if self._wake is not None:
            self._wake.resolve(None)

    def run(self) -> Generator[Any, Any, ProcessOutcome]:
        clock = self.machine.clock
        started = clock.now
        if self.kill_requested:  # cancelled before it could start: start nothing
            return ProcessOutcome(None, None, True, None, Tail(), Tail(), 0.0)
        if self.spec.nostart:
            raise OSError(2, "No such file or directory", PROGRAM)  # as subprocess names it: argv[0]
        self.pid = self.machine.spawn(self)
        self.alive = True
        clock.at(started + self.spec.duration, lambda: self._die(self.spec.rc, None), label="job")
        for i in range(self.spec.chunks):
            at = started + self.spec.duration * (i + 1) / (self.spec.chunks + 1)
            clock.at(at, lambda i=i: self._emit(i), label="job")
        if self.on_spawn is not None:
            yield from self.on_spawn(self.pid)
        killed, stage = False, None
        if not self.exited and not self.kill_requested:
            self._wake = Fut()
            yield self._wake
        if not self.exited:  # the kill request came first: the truth is "we killed it"
            killed = True
            self._terminate()
            yield self._exited
            stage = self._stage
        return ProcessOutcome(self.exit_code, self.signal, killed, stage, Tail(), Tail(), clock.now - started)

    def _terminate(self) -> None:
        clock = self.machine.clock
        self._stage = KillStage.TERM
        if self.spec.term:
            clock.at(clock.now + TERM_DELAY_S, lambda: self._die(None, SIGTERM), label="job")
        else:

            def sigkill() -> None:
                if self.alive:
                    self._stage = KillStage.KILL
                    self._die(None, SIGKILL)

            clock.at(clock.now + self.grace, sigkill, label="job")

    def orphan_kill(self) -> None:
        """A restarted Hand kills the group a crashed one left behind."""
        self._die(None, SIGKILL)

    def _die(self, exit_code: int | None, signal: int | None) -> None:
        if not self.alive:
            return
        self.alive = False
        self.exited = True
        self.exit_code, self.signal = exit_code, signal
        self._exited.resolve(None)
        if self._wake is not None:
            self._wake.resolve(None)

    def _emit(self, i: int) -> None:
        if self.alive and self.on_output is not None:
            self.on_output("stdout", b"chunk %d of %s\n" % (i, self.key[2].encode()))
