"""One foreground run in the Hand's memory, and the execution of its command: a process tree or a
terminal session, its output sent as progress (dropped past the caps: observation only) or as
streams (never dropped: the client's credit sets the pace), its cancellation and CPU budget wired to
the kill. `hand.aio.runs.RunTable` owns it, decides its result by `hand.core.runs` and sends it.

- CPU seconds are a budget (seed 000): while a command with `limits.cpu_seconds` runs, its tree's
  CPU time is reserved on the run's budget as it is spent (`hand.system.cputime`); the reservation
  that does not fit ends the run through `RunControl.exhaust` (the fact `budget_exhausted` first,
  then the cancel broadcast that kills the tree: SIGTERM, grace, SIGKILL).
- Progress is observation only: past the caps it is dropped and counted (`progress_dropped`),
  execution goes on, and no progress is sent after the result.
- Continuity (DESIGN §15): with a resume window a run outlives its connection, and its result is
  kept (`KeptResult`) until the Mind acknowledges it; `presented` is how either is described to the
  Mind on the next connection (`runs_present`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hand.aio.metrics import HandMetrics
from hand.aio.streams import RunStreams
from hand.core.cpu import CPU_SECONDS
from hand.core.runs import progress_pieces
from hand.system.cgroups import RunCgroup
from hand.system.cputime import stop_watching, tree_reader, watch_cpu
from hand.system.process import ProcessOutcome, ProcessRun, Stream
from hand.system.pty import PtyOutcome, PtyRun
from hand.system.sandbox import cgroup_limits
from hand.system.tools import Prepared, ProcessSpec
from protocol.control import RunAborted, RunControl
from protocol.messages import Message, PresentedRun, Progress, Result, Rpc, RunExited, Usage

Send = Callable[[Message], None]


@dataclass(eq=False)
class ActiveRun:
    """A run this connection holds in memory, from `accepted` to its `result`."""

    rpc: Rpc
    ctl: RunControl
    prepared: Prepared
    grace: float
    digest: str
    log: Any
    offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    dropped: int = 0
    task: asyncio.Task[None] | None = None
    streams: RunStreams | None = None
    """Set when the run's bytes are streams (the client is attached): output is never dropped."""
    started: bool = False
    """`started` was sent (the process exists): what the run's presentation says."""
    told_to_stop: bool = False
    """The Mind sent a `cancel` for it: its result goes out at once, whatever its streams wait for
    (the Mind ended the run, or wants the truth now)."""
    usage: Usage | None = None
    """What the process run used, as its cgroup counted it (None: it had none)."""
    memory_limit: int | None = None
    """The memory limit its cgroup had: named when the kernel killed for it."""

    def presented(self, now: float) -> PresentedRun:
        """The run as the Hand presents it after a cut: enough for a Mind that restarted to adopt it."""
        deadline = self.ctl.deadline if self.ctl.deadline is not None else now
        return PresentedRun(
            run_id=self.rpc.run_id,
            started=self.started,
            streams=self.streams.positions() if self.streams is not None else [],
            owner=self.rpc.owner,
            tool=self.rpc.tool,
            remaining_ms=max(0, int((deadline - now) * 1000)),
            grace_ms=self.rpc.grace_ms,
            spec=self.rpc.streams,
            args_digest=self.digest,
            timeout_ms=self.rpc.timeout_ms,
            seal=self.rpc.seal,
            sealed_at=self.rpc.sealed_at,
        )

    async def run_process(self, spec: ProcessSpec, send: Send, metrics: HandMetrics) -> ProcessOutcome | PtyOutcome:
        """Run the command, on a terminal or not, with its output as progress (or streams), in a
        cgroup of its own where the Hand has them (`hand.system.cgroups`): what it used is kept in
        `usage` once the cgroup is empty and gone. Raises OSError when it cannot start."""
        cg = spec.cgroups.create(f"run-{self.rpc.run_id}", cgroup_limits(spec.limits)) if spec.cgroups else None
        try:
            return await self._run_process(spec, send, metrics, cg)
        finally:
            if cg is not None:
                self.usage = await cg.close(remove_soon=True)  # after the result is sent
                self.memory_limit = spec.limits.memory if spec.limits is not None else None

    async def _run_process(
        self, spec: ProcessSpec, send: Send, metrics: HandMetrics, cg: RunCgroup | None
    ) -> ProcessOutcome | PtyOutcome:
        streams = self.streams
        pty = streams.spec.pty if streams is not None else None
        proc: ProcessRun | PtyRun
        if streams is not None and pty is not None:
            proc = PtyRun(
                list(spec.argv),
                rows=pty.rows,
                cols=pty.cols,
                term=pty.term,
                cwd=spec.cwd,
                env=spec.env,
                executable=spec.executable,
                on_output=streams.on_output,
                on_output_closed=streams.on_output_end,
                on_stdin_consumed=streams.on_stdin_consumed,
                grace=self.grace,
                limits=spec.limits,
                run_as=spec.run_as,
                cgroup=cg,
            )
            streams.attach(proc)
            return await self._supervise(spec, proc, streams, send)
        proc = ProcessRun(
            spec.argv,
            cwd=spec.cwd,
            env=spec.env,
            stdin=spec.stdin if streams is None or not streams.wants_stdin else None,
            on_output=partial(self._progress, send, metrics) if streams is None else streams.on_output,
            grace=self.grace,
            limits=spec.limits,
            run_as=spec.run_as,
            stdin_stream=streams is not None and streams.wants_stdin,
            on_stdin_consumed=streams.on_stdin_consumed if streams is not None else None,
            on_output_closed=streams.on_output_end if streams is not None else None,
            pipe_size=streams.spec.window if streams is not None else None,
            cgroup=cg,
        )
        if streams is not None:
            streams.attach(proc)
        return await self._supervise(spec, proc, streams, send)

    async def _supervise(
        self, spec: ProcessSpec, proc: ProcessRun | PtyRun, streams: RunStreams | None, send: Send
    ) -> ProcessOutcome | PtyOutcome:
        """Run `proc` with the run's cancellation and CPU budget wired to it; for a streamed run,
        every byte owed is sent before the outcome is (or the run stops)."""
        unregister = self.ctl.cancellation.on_cancel(lambda _reason: proc.kill())
        watcher = None
        if cpu_limit(spec) is not None:
            read = tree_reader(proc.cgroup)
            watcher = asyncio.get_running_loop().create_task(watch_cpu(lambda: proc.pid, self._charge_cpu, read=read))
        try:
            out = await proc.run()
            if streams is not None:  # every byte owed is sent before the result (or the run stops)
                if not streams.flushed.is_set():  # the Mind hears the process ended meanwhile
                    send(RunExited(run_id=self.rpc.run_id, exit_code=out.exit_code, signal=out.signal))
                await self._flushed(streams)
            return out
        finally:
            if streams is not None:
                streams.abandon()
            unregister()
            if watcher is not None:  # owned here: stopped and awaited, its failure seen
                failure = await stop_watching(watcher)
                if failure is not None:  # metering broke; the run's own outcome stands
                    self.log.error("run_cpu_watch_failed", error=type(failure).__name__)

    async def _flushed(self, streams: RunStreams) -> None:
        """Wait until the output streams have sent everything (the client's reading sets the
        pace), or the run is cancelled (deadline, client gone, shutdown)."""
        if streams.flushed.is_set():
            return
        stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def stop(_reason: object) -> None:
            if not stopped.done():
                stopped.set_result(None)

        unregister = self.ctl.cancellation.on_cancel(stop)
        flushed: asyncio.Future[bool] = asyncio.ensure_future(streams.flushed.wait())
        either: list[asyncio.Future[Any]] = [flushed, stopped]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unregister()
            flushed.cancel()

    def _charge_cpu(self, seconds: float) -> bool:
        """Reserve CPU the tree has spent; False (stop watching) once the run cannot go on. A
        reservation over the budget ends the run `budget_exhausted` inside `reserve`."""
        try:
            self.ctl.reserve(CPU_SECONDS, seconds, asyncio.get_running_loop().time())
        except RunAborted:
            return False
        return True

    def _progress(self, send: Send, metrics: HandMetrics, stream: Stream, data: bytes) -> None:
        stopped = self.ctl.cancellation.cancelled or self.ctl.lifecycle.done
        for offset, piece, sent in progress_pieces(self.offsets, stream, data, self.ctl.budget, stopped=stopped):
            if sent:
                send(Progress(run_id=self.rpc.run_id, stream=stream, offset=offset, data=piece))
            else:
                self.dropped += 1
                metrics.progress_dropped(len(piece))


@dataclass(eq=False)
class KeptResult:
    """A result the Mind has not acknowledged yet (kept only with a resume window): presented and
    sent again after a cut. A streamed run's result goes out only after its output streams were
    resumed (their bytes first, then the end, then the result: the Mind takes no bytes of a run
    that has ended)."""

    run: ActiveRun
    result: Result
    sent: bool = False
    """Sent on the current connection."""

    @property
    def held(self) -> bool:
        """Its output waits for the Mind to say where the client stands (`stream_resume`)."""
        streams = self.run.streams
        return streams is not None and streams.awaiting and not self.run.told_to_stop

    def presented(self) -> PresentedRun:
        run = self.run
        return PresentedRun(
            run_id=run.rpc.run_id,
            started=run.started,
            streams=run.streams.positions() if run.streams is not None else [],
            result_pending=True,
            owner=run.rpc.owner,
            tool=run.rpc.tool,
            remaining_ms=0,
            grace_ms=run.rpc.grace_ms,
            spec=run.rpc.streams,
            args_digest=run.digest,
            timeout_ms=run.rpc.timeout_ms,
            seal=run.rpc.seal,
            sealed_at=run.rpc.sealed_at,
        )


def cpu_limit(prepared: Prepared) -> int | None:
    """The CPU seconds a command may spend as a tree, if it has a budget."""
    if isinstance(prepared, ProcessSpec) and prepared.limits is not None:
        return prepared.limits.cpu_seconds
    return None
