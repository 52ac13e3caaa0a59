"""The Hand's background tasks: `hand.tasks.TaskManager`, as generators on the Hand's loop.

The decisions are the REAL plain functions of `hand/tasks.py` (`admit`, `next_to_start`, `ending`,
`cancel_action`, `lost_reason`, `purge_cutoff`) and rows are real `TaskRow`s reported with the real
`to_info`. The shell around them is mirrored from `TaskManager` (keep in step), with a `yield` at
every `await`:
- durable before accepted: the row is inserted (and the insert completed) before `accepted` and the
  start run's `result` go out; duplicates, conflicts and the quota are decided under the admission
  lock, and a refused start stores nothing;
- at most `max_running` run, the others wait `queued` (FIFO); every transition is committed
  (version + 1) BEFORE it is pushed as a `task_update` on the live connection, if any;
- the truth wins on cancel and on `max_runtime_ms`; a queued task is cancelled without running;
- restart (`open`): every queued/running row becomes `lost`, nothing re-runs, the orphan is killed.
Executions belong to the Hand (its loop), not to a connection: a dropped connection touches no task.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator

from hand.tasks import (
    BACKGROUND_TOOLS,
    Admission,
    CancelAction,
    Ending,
    admit,
    cancel_action,
    ending,
    lost_reason,
    next_to_start,
    purge_cutoff,
)
from hand.taskstore import TaskRow, to_info
from hand.tools import Refusal
from protocol.codes import CancelReason, ErrorCode, RejectCode, TaskCancelStatus
from protocol.digest import args_digest, binding_digest
from protocol.messages import (
    Accepted,
    Error,
    Message,
    Rejected,
    Result,
    Rpc,
    TaskCancel,
    TaskCancelResult,
    TaskInfo,
    TaskInventory,
    TaskInventoryPage,
    TaskStartValue,
    TaskStatus,
    TaskUpdate,
)
from protocol.states import TASK_TRANSITIONS, RunState, TaskState
from sim.jobs import JobSpec, VProcess
from sim.runtime import Proc, SimLock

if TYPE_CHECKING:
    from sim.hand_agent import HandProcess

PURGE_EVERY_S = 60.0
Send = Callable[[Message], None]


class LogSink:
    """`hand.tasks.LogSink` as a size: opened with O_TRUNC, head-bounded at `cap`."""

    def __init__(self, sizes: dict[str, int], task_id: str, cap: int) -> None:
        self._sizes = sizes
        self._task_id = task_id
        self.cap = cap
        self.size = 0
        self.truncated = False
        self.error: str | None = None
        self._open = True
        sizes[task_id] = 0

    def append(self, data: bytes) -> None:
        if not self._open:
            self.truncated = True
            return
        piece = data[: self.cap - self.size]
        self.size += len(piece)
        self._sizes[self._task_id] = self.size
        if len(piece) < len(data):
            self.truncated = True
            self._open = False

    def close(self) -> None:
        self._open = False


@dataclass(eq=False)
class _Live:
    row: TaskRow
    spec: JobSpec
    cancel: CancelReason | None = None
    proc: VProcess | None = None
    sink: LogSink | None = None
    runner: Proc | None = None


class HandTasks:
    inventory_waits_for_admissions = True
    """As `hand/tasks.py` does since the simulation found the race (see `sim.variants.HandBeforeFix`):
    `inventory` reads its page under the admission lock, so a start admitted on an earlier
    connection (its row not yet committed when that connection dropped) is in the inventory of the
    next one. Without it, the Mind's reconciliation declares such a task `lost` ("unknown to hand")
    while the Hand runs it."""

    def __init__(self, hand: "HandProcess") -> None:
        self.hand = hand
        self.loop = hand.loop
        self.store = hand.store
        self.limits = hand.world.config.task_limits
        self._queued: dict[str, _Live] = {}
        self._running: dict[str, _Live] = {}
        self._push: Send | None = None
        self._admit_lock = SimLock()

    @property
    def now(self) -> float:
        return self.hand.clock.now

    def busy(self) -> bool:
        return bool(self._queued or self._running)

    # --- lifecycle ---

    def open(self) -> None:
        """Restart recovery, then purge: done before the first dial, as `TaskManager.open`."""
        self._recover()
        self._purge()
        self._schedule_purge()

    def _schedule_purge(self) -> None:
        def purge() -> None:
            self._purge()
            self._schedule_purge()

        self.loop.call_at(self.now + PURGE_EVERY_S, purge, label="periodic purge")

    def attach(self, push: Send | None) -> None:
        self._push = push

    def _recover(self) -> None:
        for row in self.store.unfinished():
            killed = False
            orphan = self.hand.machine.alive(row.pid) if row.pid_start_time == row.pid else None
            if orphan is not None:
                orphan.orphan_kill()
                killed = True
            size = self.store.log_sizes.get(row.task_id, row.log_bytes)
            self.store.update(row.task_id, state=TaskState.LOST, reason=lost_reason(killed), finished_at=self.now,
                              log_bytes=size)

    def _purge(self) -> None:
        self.store.purge(purge_cutoff(self.now, self.limits.retention_s))

    # --- start ---

    def on_start(self, rpc: Rpc, send: Send) -> Generator[Any, Any, None]:
        """The admission runs in the Hand's owner; the reader only waits for it (shielded)."""
        job = self.loop.spawn(self._start(rpc, send), f"task_start {rpc.run_id}")
        yield job.done

    def _prepare(self, rpc: Rpc) -> JobSpec:
        if rpc.tool not in BACKGROUND_TOOLS:
            raise Refusal(RejectCode.INVALID_REQUEST, "only exec and shell can run as background tasks")
        if not self.hand.policy.allowed(rpc.tool):
            raise Refusal(RejectCode.DENIED_BY_POLICY, f"tool {rpc.tool!r} is denied by this hand's policy")
        spec = JobSpec.from_args(rpc.args)
        if spec is None:
            raise Refusal(RejectCode.INVALID_REQUEST, "bad arguments")
        return spec

    def _look(self, task_id: str, cutoff: float) -> tuple[TaskRow | None, int]:
        self.store.purge(cutoff)
        return self.store.get(task_id), self.store.count()

    def _start(self, rpc: Rpc, send: Send) -> Generator[Any, Any, None]:
        assert rpc.background is not None
        task_id = rpc.run_id
        try:
            yield from self._admit_lock.acquire()
            try:
                spec = self._prepare(rpc)
                max_runtime_ms = rpc.background.max_runtime_ms
                digest = args_digest(rpc.tool, rpc.args)
                binding = binding_digest(rpc.tool, rpc.args, max_runtime_ms)
                now = self.now
                existing, retained = yield self.loop.io(self._look, task_id,
                                                        purge_cutoff(now, self.limits.retention_s))
                decision = admit(existing, binding, retained, self.limits.max_retained)
                if decision is Admission.CONFLICT:
                    raise Refusal(RejectCode.CONFLICTING_DUPLICATE, f"task {task_id} already exists")
                if decision is Admission.OVER_QUOTA:
                    raise Refusal(RejectCode.QUOTA_EXCEEDED, f"this hand already keeps {retained} tasks")
                if decision is Admission.DUPLICATE:
                    assert existing is not None
                    self._started(send, task_id, self._info(existing), duplicate=True)
                    return
                row = TaskRow(task_id=task_id, tool=rpc.tool, args_digest=digest, binding_digest=binding,
                              state=TaskState.QUEUED, version=1, max_runtime_ms=max_runtime_ms, created_at=now)
                yield self.loop.io(self.store.insert, row)  # committed before `accepted`
                self._queued[task_id] = _Live(row, spec)
            finally:
                self._admit_lock.release()
            self._started(send, task_id, to_info(row), duplicate=False)
            self._pump()
        except Refusal as refusal:
            send(Rejected(run_id=task_id, code=refusal.code, message=refusal.message))

    @staticmethod
    def _started(send: Send, task_id: str, info: TaskInfo, *, duplicate: bool) -> None:
        send(Accepted(run_id=task_id))
        value = TaskStartValue(task=info, duplicate=duplicate).model_dump(mode="python")
        send(Result(run_id=task_id, state=RunState.SUCCEEDED, value=value))

    def _pump(self) -> None:
        for task_id in next_to_start(list(self._queued), len(self._running), self.limits.max_running):
            live = self._queued.pop(task_id)
            self._running[task_id] = live
            live.runner = self.loop.spawn(self._execute(live), f"task {task_id}")

    # --- execution ---

    def _execute(self, live: _Live) -> Generator[Any, Any, None]:
        row = live.row
        timer = self.loop.call_at(self.now + row.max_runtime_ms / 1000,
                                  lambda: self._kill(live, CancelReason.DEADLINE_EXCEEDED), label="task_deadline")
        try:
            end = yield from self._run(live)
            yield from self._conclude(live, end)
        except Exception as exc:  # the real shell logs it; here it is a bug worth a failing seed
            self.hand.world.checker.fail("hand_task_conclude", f"{row.task_id}: {type(exc).__name__}: {exc}")
        timer.cancel()
        if live.sink is not None:
            live.sink.close()
        self._running.pop(row.task_id, None)
        self._pump()

    def _run(self, live: _Live) -> Generator[Any, Any, Ending]:
        task_id, max_ms = live.row.task_id, live.row.max_runtime_ms
        live.sink = yield self.loop.io(LogSink, self.store.log_sizes, task_id, self.limits.log_max)
        proc = VProcess(self.hand.machine, live.spec, (self.hand.label, "task", task_id), grace=self.hand.kill_grace,
                        on_output=lambda _stream, data: self._output(live, data),
                        on_spawn=lambda pid: self._on_spawn(live, pid))
        live.proc = proc
        if live.cancel is not None:
            proc.kill()
        try:
            out = yield from proc.run()
        except OSError as exc:
            return ending(None, None, max_ms, f"cannot start: {exc.strerror or exc}")
        return ending(out, live.cancel, max_ms, live.sink.error)

    def _output(self, live: _Live, data: bytes) -> None:
        if self.loop.alive and live.sink is not None:
            live.sink.append(data)

    def _on_spawn(self, live: _Live, pid: int) -> Generator[Any, Any, None]:
        yield from self._commit(live, state=TaskState.RUNNING, started_at=self.now, pid=pid, pid_start_time=pid)

    def _kill(self, live: _Live, reason: CancelReason) -> None:
        if live.cancel is None:
            live.cancel = reason
        if live.proc is not None:
            live.proc.kill()

    def _final(self, live: _Live, end: Ending) -> dict[str, Any]:
        sink = live.sink
        return dict(state=end.state, finished_at=self.now, reason=end.reason, exit_code=end.exit_code,
                    signal=end.signal, stage=end.stage, error=end.error,
                    log_bytes=sink.size if sink is not None else live.row.log_bytes,
                    truncated=sink.truncated if sink is not None else live.row.truncated)

    def _conclude(self, live: _Live, end: Ending) -> Generator[Any, Any, None]:
        if live.row.state is TaskState.QUEUED and end.state not in TASK_TRANSITIONS[TaskState.QUEUED]:
            yield from self._commit(live, state=TaskState.RUNNING, started_at=self.now)
        yield from self._commit(live, **self._final(live, end))

    def _commit(self, live: _Live, **changes: Any) -> Generator[Any, Any, TaskRow]:
        """Commit a change of the row (version + 1), THEN push it."""
        if live.sink is not None and "log_bytes" not in changes:
            changes.update(log_bytes=live.sink.size, truncated=live.sink.truncated)
        live.row = yield self.loop.io(self.store.update, live.row.task_id, **changes)
        self._send_update(live.row)
        return live.row

    def _send_update(self, row: TaskRow) -> None:
        if self._push is not None:
            self._push(TaskUpdate(task=self._info(row)))

    def _info(self, row: TaskRow) -> TaskInfo:
        live = self._running.get(row.task_id)
        if live is not None and live.sink is not None and not row.terminal:
            row = dataclasses.replace(row, log_bytes=live.sink.size, truncated=live.sink.truncated)
        return to_info(row)

    # --- requests ---

    def answer(self, msg: Message) -> Generator[Any, Any, Message]:
        if isinstance(msg, TaskStatus):
            return (yield from self.status(msg))
        if isinstance(msg, TaskCancel):
            return (yield from self.cancel(msg))
        if isinstance(msg, TaskInventory):
            return (yield from self.inventory(msg))
        raise TypeError(f"not a task request: {msg.TYPE}")

    def _current(self, task_id: str) -> Generator[Any, Any, TaskRow | None]:
        row = yield self.loop.io(self.store.get, task_id)
        if row is not None and not row.terminal and task_id not in self._queued and task_id not in self._running:
            row = yield self.loop.io(self.store.get, task_id)
        return row

    def status(self, msg: TaskStatus) -> Generator[Any, Any, TaskInfo | Error]:
        row = yield from self._current(msg.task_id)
        if row is None:
            return Error(code=ErrorCode.UNKNOWN_TASK, message=f"this hand has no task {msg.task_id}")
        return self._info(row)

    def cancel(self, msg: TaskCancel) -> Generator[Any, Any, TaskCancelResult]:
        task_id = msg.task_id
        queued, running = self._queued.get(task_id), self._running.get(task_id)
        row = None
        if queued is None and running is None:
            row = yield self.loop.io(self.store.get, task_id)
            queued, running = self._queued.get(task_id), self._running.get(task_id)
        action = cancel_action(queued is not None, running is not None, row)
        if action is CancelAction.DEQUEUE:
            assert queued is not None
            del self._queued[task_id]
            row = yield from self._commit(queued, state=TaskState.CANCELLED, finished_at=self.now,
                                          reason=msg.reason.value)
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED, task=self._info(row))
        if action is CancelAction.KILL:
            assert running is not None
            self._kill(running, msg.reason)
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED,
                                    task=self._info(running.row))
        if action is CancelAction.UNKNOWN:
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.UNKNOWN_TASK)
        assert row is not None
        return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.ALREADY_DONE, task=self._info(row))

    def inventory(self, msg: TaskInventory) -> Generator[Any, Any, TaskInventoryPage]:
        if self.inventory_waits_for_admissions:
            yield from self._admit_lock.acquire()
            try:
                rows = yield self.loop.io(self.store.page, msg.after, msg.limit + 1)
            finally:
                self._admit_lock.release()
        else:
            rows = yield self.loop.io(self.store.page, msg.after, msg.limit + 1)
        more = len(rows) > msg.limit
        rows = rows[: msg.limit]
        return TaskInventoryPage(tasks=[self._info(r) for r in rows],
                                 next_after=rows[-1].task_id if more and rows else None)


