"""Background tasks on the Hand: execution, logs, cancel, queries, restart and shutdown.

The Hand's task database (`hand.system.taskdb`) is the authority (DESIGN §3, §7). Two state
machines share one id: the start run (an `rpc` with `background`; it succeeds once the row is
committed: `hand.aio.taskstarts`) and the task itself (`queued -> running ->
succeeded|failed|cancelled|timed_out`, `queued|running -> lost`). The rules are
`hand.core.tasks`' and `hand.core.runs`'; every write goes through the group commit
(`hand.aio.groupcommit`); the log files are `hand.system.tasklogs`'.

Rules this module keeps:
- At most `max_running` tasks run; the others wait `queued`, first come first served.
- Raw arguments never enter the database or a log: digests only. A queued task keeps its prepared
  arguments in memory; a Hand that restarts has lost them, which is one reason nothing re-runs.
- Tasks belong to the agent, not to a connection: executions are spawned into an owner that
  outlives every connection, output keeps going to the log file while the Hand is offline, and a
  dropped connection touches no task. `task_update` is pushed on the live connection if there is
  one (best effort: the database is the truth, the Mind reconciles after reconnecting).
- Every transition is committed (`version` + 1) BEFORE it is pushed or logged.
- The truth wins: a command that exited on its own before a kill landed reports its real exit;
  only a kill we performed makes a task `cancelled` (a cancel) or `timed_out` (`max_runtime_ms`,
  on the Hand's own timer).
- Sandboxing and limits are the foreground runs' (`hand.system.sandbox`): the same scrubbed
  environment, user and `setrlimit`s, and the same tree-wide CPU budget (`hand.system.cputime`).
  A task has no `budget_exhausted` state (`TaskState` is the protocol's): a task whose tree spends
  its `cpu_seconds` is killed as a tree and ends `failed` with reason "cpu budget of N s
  exhausted" (also when the kernel's per-process CPU limit killed it).
- Hand restart (`open`, `hand.aio.taskrecovery`): every `queued`/`running` row becomes `lost`;
  nothing re-runs; the log stays readable; an orphaned process group still alive is killed.
- Clean shutdown (`shutdown`, on SIGTERM/SIGINT): running tasks are killed as trees and end
  `cancelled` with reason `shutdown`; queued ones end `cancelled` with reason `shutdown` (nothing
  ran). Not `lost`: the Hand itself observed the end, so the outcome is known. `lost` is reserved
  for "nobody can know", i.e. a crash. Bounded by the kill grace + 1 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import structlog

from hand.aio.groupcommit import GroupCommit
from hand.aio.metrics import HandMetrics
from hand.aio.taskrecovery import purge, purge_forever, recover
from hand.aio.taskrun import LiveTask
from hand.aio.taskstarts import TaskStarts
from hand.core.policy import Policy, ToolPolicy
from hand.core.rows import Change, TaskRow, to_info
from hand.core.sanitize import Sanitizer
from hand.core.tasks import (
    CancelAction,
    Ending,
    TaskLimits,
    background_refusal,
    cancel_action,
    next_to_start,
    removal,
    starts_first,
    stream_truncated,
)
from hand.system.disk import free_bytes
from hand.system.process import DEFAULT_GRACE_S, start_time
from hand.system.sandbox import Sandbox
from hand.system.taskdb import STREAMS, TaskStore
from hand.system.tasklogs import log_page, stream_log_size
from hand.system.tools import DEFAULT_SANDBOX, ProcessSpec, Refusal, prepare
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, ErrorCode, KillStage, TaskCancelStatus
from protocol.messages import (
    Error,
    Message,
    Rpc,
    TaskCancel,
    TaskCancelResult,
    TaskInfo,
    TaskInventory,
    TaskInventoryPage,
    TaskLogPage,
    TaskLogs,
    TaskRemove,
    TaskStatus,
    TaskUpdate,
)
from protocol.states import TASK_TRANSITIONS, TaskState

Send = Callable[[Message], None]
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]

SHUTDOWN_REASON = CancelReason.SHUTDOWN.value


class TaskManager:
    """Owns the background tasks of one Hand, across connections.

    Lifecycle: `await open()` once before connecting (restart recovery, purge), `attach(send)` per
    connection (`attach(None)` when it ends), `await shutdown()` once at the end. Requests:
    `on_start(rpc, send)` for an `rpc` with `background`, `answer(msg)` for `task_status`,
    `task_logs`, `task_cancel`, `task_remove` and `task_inventory`. `spawn` must belong to an owner
    that outlives connections (the agent's task group). `on_start` returns before the start is
    decided (its answer goes to its `send`); `await settle()` waits until every start taken in is
    decided.
    """

    def __init__(
        self,
        *,
        state_dir: Path,
        root: Path,
        spawn: Spawn,
        policy: ToolPolicy | None = None,
        limits: TaskLimits | None = None,
        kill_grace: float = DEFAULT_GRACE_S,
        sanitize: Sanitizer | None = None,
        log: Any = None,
        clock: Callable[[], float] = time.time,
        sandbox: Sandbox = DEFAULT_SANDBOX,
        metrics: HandMetrics | None = None,
    ) -> None:
        self._metrics = metrics or HandMetrics()
        self._state_dir = Path(state_dir)
        self._sandbox = sandbox
        self._root = root
        self._spawn = spawn
        self._policy = policy or Policy()
        self.limits = limits or TaskLimits()
        self._grace = kill_grace
        self._sanitize = sanitize or Sanitizer(root)
        self._log = log if log is not None else structlog.get_logger(component="hand")
        self._clock = clock
        self._store: TaskStore | None = None
        self._writes: GroupCommit
        """Every write but the purge goes through it (set by `open`)."""
        self._queued: dict[str, LiveTask] = {}
        """Insertion order is creation order: FIFO."""
        self._running: dict[str, LiveTask] = {}
        self._push: Send | None = None
        self._starts = TaskStarts(
            spawn=spawn,
            prepare=self._prepare,
            look=self._look,
            commit=lambda write: self._writes.write(write),
            queue=self._queue,
            info=self._info,
            decided=self._pump,
            clock=clock,
            limits=self.limits,
            sanitize=self._sanitize,
            log=self._log,
            metrics=self._metrics,
        )
        self._closing = False
        self._closed = asyncio.Event()
        self._purger: asyncio.Task[None] | None = None
        self._uncommitted: dict[str, LiveTask] = {}
        """Tasks that ended while their terminal commit failed (DESIGN §7: a known outcome is never
        thrown away): kept here, reported with `uncommitted`, and committed by `_recommit`."""
        self._recommitter: asyncio.Task[None] | None = None

    @property
    def store(self) -> TaskStore:
        assert self._store is not None, "TaskManager.open() was not awaited"
        return self._store

    # --- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the database, settle what a previous run of the Hand left unfinished, purge."""
        self._store = await asyncio.to_thread(TaskStore, self._state_dir)
        self._writes = GroupCommit(self._store, self._spawn)
        await recover(
            self._store, self._writes.write, grace=self._grace, clock=self._clock, log=self._log, metrics=self._metrics
        )
        retention, clock, log = self.limits.retention_s, self._clock, self._log
        await purge(self._store, retention_s=retention, clock=clock, log=log)
        self._purger = self._spawn(purge_forever(self._store, retention_s=retention, clock=clock, log=log))

    def live(self) -> dict[str, int]:
        """How many tasks are queued and running now, and how many ended with their outcome not yet
        committed: memory only, so a scrape can ask any time."""
        return {"queued": len(self._queued), "running": len(self._running), "uncommitted": len(self._uncommitted)}

    def attach(self, push: Send | None) -> None:
        """Where `task_update` goes: the live connection's send, or None while offline."""
        self._push = push

    async def shutdown(self) -> None:
        """Kill running tasks, cancel queued ones (both `cancelled`, reason `shutdown`), close the
        database. Idempotent; bounded by the kill grace + 1 s."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = self._starts.closing = True
        try:
            await self.settle()  # starts taken in are decided first (refused: we are closing)
            if self._purger is not None:
                self._purger.cancel()
            if self._store is None:
                return
            queued, self._queued = list(self._queued.values()), {}
            for live in queued:
                await self._dequeue(live, SHUTDOWN_REASON)
            for live in list(self._running.values()):
                live.kill(CancelReason.SHUTDOWN)
            runners = {live.runner for live in self._running.values() if live.runner is not None}
            if runners:
                _, late = await asyncio.wait(runners, timeout=self._grace + 1)
                for runner in late:  # past the bound: the group is SIGKILLed, the row still ends
                    runner.cancel()
                if late:
                    await asyncio.wait(late, timeout=1.0)
            if self._purger is not None:
                await asyncio.wait({self._purger}, timeout=1.0)
            await self._writes.idle()  # a write whose writer was cancelled still lands (or fails) first
            if self._recommitter is not None:
                self._recommitter.cancel()
            if self._uncommitted and not await self._commit_kept():
                self._log.error("tasks_outcomes_lost_at_shutdown", tasks=sorted(self._uncommitted))
            await asyncio.to_thread(self._store.close)
        finally:
            self._closed.set()

    # --- start ----------------------------------------------------------------------------------

    async def on_start(self, rpc: Rpc, send: Send) -> None:
        """Take a background start in (`TaskStarts.on_start`): refused at once, or handed to the
        group commit, which answers `accepted` + `result` once ITS row is committed."""
        await self._starts.on_start(rpc, send)

    def deciding(self) -> bool:
        """Some start taken in is not answered yet."""
        return self._starts.deciding()

    async def settle(self) -> None:
        """Wait until every start taken in so far is decided (committed and answered, or refused)."""
        await self._starts.settle()

    def _prepare(self, rpc: Rpc) -> ProcessSpec:
        size = len(msgpack.packb(rpc.args, use_bin_type=True))
        refused = background_refusal(
            rpc.tool,
            allowed=self._policy.allowed(rpc.tool),
            closing=self._closing,
            args_size=size,
            state_free=free_bytes(self._state_dir),
        )
        if refused is not None:
            raise Refusal(refused.code, refused.message)
        spec = prepare(rpc.tool, rpc.args, self._root, self._sandbox)
        assert isinstance(spec, ProcessSpec)
        return spec

    def _look(self, task_ids: Iterable[str], cutoff: float) -> tuple[dict[str, TaskRow], int]:
        """(in a thread) Purge expired rows, then read the rows under these ids and the row count."""
        purged = self.store.purge(cutoff)
        if purged:
            self._log.info("tasks_purged", count=len(purged))
        return self.store.get_many(task_ids), self.store.count()

    def _queue(self, row: TaskRow, spec: ProcessSpec, log: Any) -> None:
        self._queued[row.task_id] = LiveTask(row, spec, log)

    def _pump(self) -> None:
        """Start queued tasks while there is room."""
        if self._closing:
            return
        for task_id in next_to_start(list(self._queued), len(self._running), self.limits.max_running):
            live = self._queued.pop(task_id)
            self._running[task_id] = live
            try:
                live.runner = self._spawn(self._execute(live))
            except RuntimeError:  # the owner is closing: shutdown settles it as queued
                del self._running[task_id]
                self._queued[task_id] = live
                return

    # --- execution ------------------------------------------------------------------------------

    async def _execute(self, live: LiveTask) -> None:
        loop = asyncio.get_running_loop()
        row = live.row
        timer = loop.call_later(row.max_runtime_ms / 1000, live.kill, CancelReason.DEADLINE_EXCEEDED)
        try:
            try:
                end = await live.run(
                    log_path=self.store.log_path(row.task_id),
                    stream_paths={s: self.store.stream_log_path(row.task_id, s) for s in STREAMS},
                    log_max=self.limits.log_max,
                    grace=self._grace,
                    sanitize=self._sanitize,
                    on_spawn=partial(self._on_spawn, live),
                )
                try:
                    await self._conclude(live, end)
                except Exception as exc:  # the database refused the ending: keep it (a full disk)
                    self._keep_outcome(live, end, exc)
            except asyncio.CancelledError:
                # The shutdown bound passed: ProcessRun SIGKILLed the group on its way out.
                self._conclude_now(
                    live,
                    Ending(TaskState.CANCELLED, (live.cancel or CancelReason.SHUTDOWN).value, stage=KillStage.KILL),
                )
                raise
            except Exception:  # e.g. the database failed; the row ends `lost` at restart
                live.log.exception("task_conclude_failed")
        finally:
            timer.cancel()
            if live.sink is not None:
                live.sink.close()
            self._running.pop(row.task_id, None)
            self._pump()

    async def _on_spawn(self, live: LiveTask, pid: int) -> None:
        await self._commit(
            live, state=TaskState.RUNNING, started_at=self._clock(), pid=pid, pid_start_time=start_time(pid)
        )
        live.log.info("task_running", pid=pid)

    async def _conclude(self, live: LiveTask, end: Ending) -> None:
        if starts_first(live.row.state, end.state):
            # It never got to run (the program could not start): it did start, then failed.
            await self._commit(live, state=TaskState.RUNNING, started_at=self._clock())
        await self._commit(live, **live.final(end, self._clock()))
        live.log_terminal(self._metrics)

    def _keep_outcome(self, live: LiveTask, end: Ending, exc: Exception) -> None:
        """The task ended, the commit failed: the outcome stays in memory (with the time it ended),
        is reported as `uncommitted`, and is committed as soon as the database takes it. Only a
        crash before then makes the task `lost` (at restart)."""
        live.outcome = live.final(end, self._clock())
        self._uncommitted[live.row.task_id] = live
        self._metrics.tasks_uncommitted.set(len(self._uncommitted))
        live.log.error(
            "task_outcome_uncommitted",
            state=end.state.value,
            exit_code=end.exit_code,
            signal=end.signal,
            error=f"{type(exc).__name__}: {exc}"[:300],
        )
        self._send_update(live.row)  # the Mind hears at once that the task ended, uncommitted
        if self._recommitter is None or self._recommitter.done():
            try:
                self._recommitter = self._spawn(self._recommit())
            except RuntimeError:  # the owner is closing: shutdown tries once more
                pass

    async def _recommit(self) -> None:
        """Retry the kept outcomes until each is committed (1 s, then up to 10 s apart)."""
        delay = 1.0
        while self._uncommitted:
            await asyncio.sleep(delay)
            if await self._commit_kept():
                delay = 1.0
            else:
                delay = min(10.0, delay * 2)

    async def _commit_kept(self) -> bool:
        """One attempt for every kept outcome; True if any was committed."""
        progressed = False
        for task_id, live in list(self._uncommitted.items()):
            assert live.outcome is not None
            try:
                if starts_first(live.row.state, live.outcome["state"]):
                    await self._commit(live, state=TaskState.RUNNING, started_at=live.outcome["finished_at"])
                await self._commit(live, **live.outcome)
            except Exception as exc:
                live.log.warning("task_outcome_still_uncommitted", error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            del self._uncommitted[task_id]
            live.outcome = None
            self._metrics.tasks_uncommitted.set(len(self._uncommitted))
            live.log.info("task_outcome_committed")
            live.log_terminal(self._metrics)
            progressed = True
        return progressed

    def _conclude_now(self, live: LiveTask, end: Ending) -> None:
        """Synchronous terminal commit for a runner cancelled at shutdown (no await possible)."""
        try:
            current = self.store.get(live.row.task_id)
            if current is None or current.terminal:
                return
            if current.state is TaskState.RUNNING or end.state in TASK_TRANSITIONS[current.state]:
                live.row = self.store.update(live.row.task_id, **live.final(end, self._clock()))
                self._send_update(live.row)
                live.log_terminal(self._metrics)
        except Exception:
            live.log.exception("task_conclude_failed")

    async def _commit(self, live: LiveTask, **changes: Any) -> TaskRow:
        """Commit a change of the row (version + 1), THEN push it."""
        if live.sink is not None and "log_bytes" not in changes:
            changes.update(log_bytes=live.sink.size, truncated=live.sink.truncated)
        live.row = await self._writes.write(Change(live.row.task_id, changes))
        self._send_update(live.row)
        return live.row

    def _send_update(self, row: TaskRow) -> None:
        push = self._push
        if push is None:
            return  # offline: the Mind reconciles from the database after reconnecting
        try:
            push(TaskUpdate(task=self._info(row)))
        except Exception:  # best effort
            self._log.warning("task_update_unsendable", task_id=row.task_id)

    def _info(self, row: TaskRow) -> TaskInfo:
        """The row as reported; a running task's log size is the live one (persisted on the next
        transition), so `task get` shows the log growing. A task that ended with its outcome not
        committed is reported in its committed state with `uncommitted` saying how it ended: a
        terminal state is only ever reported once it is on disk, so it never changes."""
        live = self._running.get(row.task_id)
        if live is not None and live.sink is not None and not row.terminal:
            row = dataclasses.replace(row, log_bytes=live.sink.size, truncated=live.sink.truncated)
        info = to_info(row)
        kept = self._uncommitted.get(row.task_id)
        if kept is not None and kept.outcome is not None and not row.terminal:
            o = kept.outcome
            how = o["state"].value + (f", exit code {o['exit_code']}" if o.get("exit_code") is not None else "")
            how += f", signal {o['signal']}" if o.get("signal") is not None else ""
            info = info.model_copy(
                update={"uncommitted": f"ended ({how}); the Hand could not record it yet and will when it can"}
            )
        return info

    # --- cancel, status, logs, inventory -------------------------------------------------------

    async def answer(self, msg: Message) -> Message:
        """The reply to a task request (send it with the request's envelope id)."""
        if isinstance(msg, TaskInventory):
            return await self.inventory(msg)
        await self.settle()  # a request sees every start read before it, as when starts were serial
        if isinstance(msg, TaskStatus):
            return await self.status(msg)
        if isinstance(msg, TaskLogs):
            return await self.logs(msg)
        if isinstance(msg, TaskCancel):
            return await self.cancel(msg)
        if isinstance(msg, TaskRemove):
            return await self.remove(msg)
        raise TypeError(f"not a task request: {msg.TYPE}")

    async def _current(self, task_id: str) -> TaskRow | None:
        row = await asyncio.to_thread(self.store.get, task_id)
        if row is not None and not row.terminal and task_id not in self._queued and task_id not in self._running:
            row = await asyncio.to_thread(self.store.get, task_id)  # it just ended: read the terminal row
        return row

    async def status(self, msg: TaskStatus) -> TaskInfo | Error:
        row = await self._current(msg.task_id)
        if row is None:
            return Error(code=ErrorCode.UNKNOWN_TASK, message=f"this hand has no task {msg.task_id}")
        return self._info(row)

    async def logs(self, msg: TaskLogs) -> TaskLogPage | Error:
        row = await self._current(msg.task_id)
        if row is None:
            return Error(code=ErrorCode.UNKNOWN_TASK, message=f"this hand has no task {msg.task_id}")
        info = self._info(row)  # the size now: at least this many bytes are in the file
        if msg.stream is not None:
            return await self._stream_logs(msg, msg.stream, row, info)
        path = self.store.log_path(msg.task_id)
        return await asyncio.to_thread(
            log_page, msg.task_id, path, msg.offset, msg.limit, info.log_bytes, info.state, info.truncated, row.terminal
        )

    async def _stream_logs(self, msg: TaskLogs, stream: str, row: TaskRow, info: TaskInfo) -> TaskLogPage | Error:
        """One page of one stream's own file: offsets, size, `truncated` and `eof` are that
        stream's. Its size is the file's (every append is written before the loop goes on, so the
        file is never behind what the task produced); the page never reads past it."""
        task_id = msg.task_id
        path = self.store.stream_log_path(task_id, stream)
        size = await asyncio.to_thread(stream_log_size, path, self.store.log_path(task_id))
        if size is None:
            return Error(
                code=ErrorCode.NO_STREAM_LOG,
                message=f"task {task_id} was logged before this hand kept stdout and stderr apart: "
                "only its combined log exists (read it without --stream)",
            )
        live = self._running.get(task_id)
        if live is not None and live.sink is not None and not row.terminal:
            truncated = live.sink.streams[stream].truncated
        else:
            truncated = stream_truncated(size, self.limits.log_max, row.truncated, row.error is not None)
        return await asyncio.to_thread(
            log_page, task_id, path, msg.offset, msg.limit, size, info.state, truncated, row.terminal
        )

    async def cancel(self, msg: TaskCancel) -> TaskCancelResult:
        task_id = msg.task_id
        queued, running = self._queued.get(task_id), self._running.get(task_id)
        row = None
        if queued is None and running is None:
            row = await asyncio.to_thread(self.store.get, task_id)
            queued, running = self._queued.get(task_id), self._running.get(task_id)  # moved meanwhile?
        action = cancel_action(queued is not None, running is not None, row)
        if action is CancelAction.DEQUEUE:
            assert queued is not None
            del self._queued[task_id]  # before any await: it can no longer be started
            row = await self._dequeue(queued, msg.reason.value)
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED, task=self._info(row))
        if action is CancelAction.KILL:
            assert running is not None
            running.kill(msg.reason)
            running.log.info(AuditEvent.TASK_CANCEL_REQUESTED, reason=msg.reason.value)
            return TaskCancelResult(
                task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED, task=self._info(running.row)
            )
        if action is CancelAction.UNKNOWN:
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.UNKNOWN_TASK)
        assert row is not None
        return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.ALREADY_DONE, task=self._info(row))

    async def remove(self, msg: TaskRemove) -> TaskInfo | Error:
        """`mind task rm`: forget a finished task, its row and its log files (`removal` says which
        may go), so it no longer counts against `max_retained`. Under the admission lock: a start
        of the same id being decided meanwhile sees the row or its absence, never half of both.
        Answers the task as it was, or why not."""
        task_id = msg.task_id
        async with self._starts.lock:
            row = await asyncio.to_thread(self.store.get, task_id)
            held = self._queued.get(task_id) or self._running.get(task_id)
            live = held.row.state if held is not None else None
            refused = removal(task_id, row, live=live, uncommitted=task_id in self._uncommitted)
            if refused is not None:
                return refused
            removed = await asyncio.to_thread(self.store.remove, task_id)
        if removed is None:  # forgotten meanwhile (the retention purge)
            return Error(code=ErrorCode.UNKNOWN_TASK, message=f"this hand has no task {task_id}")
        self._log.bind(task_id=task_id).info(
            AuditEvent.TASK_REMOVED,
            state=removed.state.value,
            log_bytes=removed.log_bytes,
            args_digest=removed.args_digest,
        )
        return to_info(removed)

    async def _dequeue(self, live: LiveTask, reason: str) -> TaskRow:
        """A queued task ends `cancelled` without having run."""
        row = await self._commit(live, state=TaskState.CANCELLED, finished_at=self._clock(), reason=reason)
        live.log_terminal(self._metrics)
        return row

    async def inventory(self, msg: TaskInventory) -> TaskInventoryPage:
        # Under the admission lock, after the waiting starts are decided: a start still being
        # admitted (its connection may have dropped mid-commit) is committed, and listed, before
        # the page is read; else the Mind's reconciliation would call it `lost` while this Hand
        # runs it (found by tests/sim).
        await self.settle()
        async with self._starts.lock:  # no batch half-way through its commit while the page is read
            rows = await asyncio.to_thread(self.store.page, msg.after, msg.limit + 1)
        more = len(rows) > msg.limit
        rows = rows[: msg.limit]
        return TaskInventoryPage(
            tasks=[self._info(r) for r in rows], next_after=rows[-1].task_id if more and rows else None
        )
