"""One background task in the Hand's memory, and its execution: the process as a killable tree
with its output in the task's log files, its CPU spent as a budget, and how it ended by the rules
of `hand.core.tasks.ending` (the truth wins: only a kill we performed makes it `cancelled`,
`timed_out` or, its CPU budget spent, `failed`). `hand.aio.tasks.TaskManager` owns it, commits
its transitions and reports them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hand.aio.metrics import HandMetrics
from hand.core.cpu import CPU_SECONDS
from hand.core.rows import TaskRow
from hand.core.sanitize import Sanitizer
from hand.core.spawn import SpawnFailure, spawn_failure
from hand.core.tasks import Ending, ending, not_started
from hand.system.cgroups import RunCgroup
from hand.system.cputime import stop_watching, tree_reader, watch_cpu
from hand.system.process import ProcessRun, Stream
from hand.system.sandbox import cgroup_limits
from hand.system.tasklogs import TaskLog
from hand.system.tools import ProcessSpec
from protocol.audit import AuditEvent
from protocol.codes import CancelReason
from protocol.control import Budget
from protocol.messages import Usage


def proc_args(
    spec: ProcessSpec, output: Callable[[Stream, bytes], None], grace: float, on_spawn: Callable[[int], Awaitable[None]]
) -> dict[str, Any]:
    return dict(
        cwd=spec.cwd,
        env=spec.env,
        stdin=spec.stdin,
        on_output=output,
        grace=grace,
        on_spawn=on_spawn,
        limits=spec.limits,
        run_as=spec.run_as,
    )


@dataclass(eq=False)
class LiveTask:
    """A task this Hand holds in memory: queued (with its prepared arguments) or running."""

    row: TaskRow
    spec: ProcessSpec
    log: Any
    cancel: CancelReason | None = None
    proc: ProcessRun | None = None
    sink: TaskLog | None = None
    runner: asyncio.Task[None] | None = None
    cpu: Budget | None = None
    outcome: dict[str, Any] | None = None
    """The ending the Hand knows but could not commit yet (a full disk): kept, retried, reported."""
    usage: Usage | None = None
    """What the task used, as its cgroup counted it once empty (None: it had none)."""

    async def run(
        self,
        *,
        log_path: Path,
        stream_paths: dict[str, Path],
        log_max: int,
        grace: float,
        sanitize: Sanitizer,
        on_spawn: Callable[[int], Awaitable[None]],
    ) -> Ending:
        """Open the log, run the process to its end (or its kill), and say how it ended."""
        spec = self.spec
        max_ms = self.row.max_runtime_ms
        try:
            self.sink = await asyncio.to_thread(TaskLog, log_path, stream_paths, log_max)
        except OSError as exc:
            return ending(None, None, max_ms, f"cannot open the task log: {exc.strerror or exc}")
        try:
            cg = spec.cgroups.create(f"task-{self.row.task_id}", cgroup_limits(spec.limits)) if spec.cgroups else None
        except OSError as exc:
            return not_started(SpawnFailure(None, "tool failed", sanitize(f"cannot start {spec.argv[0]}: {exc}")))
        try:
            return await self._run(proc_args(spec, self._output, grace, on_spawn), cg, sanitize)
        finally:
            if cg is not None:
                self.usage = await cg.close()

    async def _run(self, args: dict[str, Any], cg: RunCgroup | None, sanitize: Sanitizer) -> Ending:
        spec = self.spec
        max_ms = self.row.max_runtime_ms
        proc = ProcessRun(spec.argv, cgroup=cg, **args)
        self.proc = proc
        if self.cancel is not None:
            proc.kill()
        cpu_seconds = spec.limits.cpu_seconds if spec.limits is not None else None
        watcher = None
        if cpu_seconds is not None:
            self.cpu = Budget({CPU_SECONDS: cpu_seconds})
            read = tree_reader(cg)
            watcher = asyncio.get_running_loop().create_task(watch_cpu(lambda: proc.pid, self._charge_cpu, read=read))
        try:
            out = await proc.run()
        except OSError as exc:  # the command could not start: 127 / 126 as a shell says, if it is the program's
            how = spawn_failure(exc, spec.argv[0])
            return not_started(dataclasses.replace(how, error=sanitize(how.error)))
        except Exception as exc:
            self.log.exception("task_crashed")
            return ending(None, None, max_ms, sanitize(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            if watcher is not None:  # owned here: stopped and awaited, its failure seen
                failure = await stop_watching(watcher)
                if failure is not None:  # metering broke; the task's own outcome stands
                    self.log.error("task_cpu_watch_failed", error=type(failure).__name__)
        used = self.cpu.used(CPU_SECONDS) if self.cpu is not None else 0.0
        assert self.sink is not None
        oom = (cg.read_usage().oom_kills or 0) if cg is not None else 0
        memory = spec.limits.memory if spec.limits is not None else None
        return ending(out, self.cancel, max_ms, self.sink.error, cpu_seconds, used, oom, memory)

    def _charge_cpu(self, seconds: float) -> bool:
        """Spend CPU the tree used; past the budget, kill the tree (it ends `failed`)."""
        assert self.cpu is not None
        if self.cancel is not None:
            return False
        if not self.cpu.try_reserve(CPU_SECONDS, seconds):
            self.log.info("task_cpu_budget_exhausted", cpu_seconds=self.cpu.limit(CPU_SECONDS))
            self.kill(CancelReason.BUDGET_EXHAUSTED)
            return False
        return True

    def _output(self, stream: Stream, data: bytes) -> None:
        assert self.sink is not None
        self.sink.append(stream, data)

    def kill(self, reason: CancelReason) -> None:
        """Request the end of a running task; the first reason wins (a cancel, the deadline, shutdown)."""
        if self.cancel is None:
            self.cancel = reason
        if self.proc is not None:
            self.proc.kill()

    def log_terminal(self, metrics: HandMetrics) -> None:
        """The audited terminal of the task as committed, counted once."""
        row = self.row
        metrics.tasks_finished.labels(row.state.value).inc()
        duration = None
        if row.started_at is not None and row.finished_at is not None:
            duration = round(row.finished_at - row.started_at, 3)
        self.log.info(
            AuditEvent.TASK_TERMINAL,
            state=row.state.value,
            reason=row.reason,
            exit_code=row.exit_code,
            signal=row.signal,
            stage=row.stage.value if row.stage else None,
            duration=duration,
            log_bytes=row.log_bytes,
            truncated=row.truncated,
            args_digest=row.args_digest,
        )

    def final(self, end: Ending, now: float) -> dict[str, Any]:
        """The row's changes that record `end` (at `now`), with the log's size as it ended."""
        sink = self.sink
        return dict(
            state=end.state,
            finished_at=now,
            reason=end.reason,
            exit_code=end.exit_code,
            signal=end.signal,
            stage=end.stage,
            error=end.error,
            log_bytes=sink.size if sink is not None else self.row.log_bytes,
            truncated=sink.truncated if sink is not None else self.row.truncated,
            usage=self.usage.model_dump_json(exclude_none=True) if self.usage is not None else None,
        )
