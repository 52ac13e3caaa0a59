"""The Hand's background tasks: `hand.aio.tasks.TaskManager`, as generators on the Hand's loop.

The rules are the REAL ones of `hand/core/tasks.py` and `hand/core/runs.py`: the decisions
(`admit_batch`, `answer_for`, `started`, `background_refusal` (the refusals of a foreground run, in
their order), `store_failed`, `next_to_start`, `ending`, `starts_first`, `cancel_action`,
`orphaned`, `recovered`, `purge_cutoff`) and the ORDER of admission (`Admissions`: one drainer, one batch at a
time, a batch is what arrived meanwhile). Rows are real `TaskRow`s reported with the real `to_info`,
writes are the real `Insert`/`Change`, a task in memory is the real `LiveTask` (its `kill` and
`final`). What is still modelled by hand is the asyncio glue between them (a `yield` at every
`await`), and `tests/sim/test_mirrors.py` fails when `TaskManager`, `TaskStarts`, `LiveTask`,
`GroupCommit` or `LogSink` change without this model being checked again
(`tests/sim/mirrors.py`):
- starts are taken in on arrival (`on_start` never waits): a policy/argument refusal is answered at
  once with nothing stored, the others are queued; one drainer in the Hand's owner takes every
  queued start as ONE batch under the admission lock, decides it with `admit_batch` (arrival order;
  each start sees the rows admitted before it in the batch), commits the new rows in one write of
  the group commit, and only then answers (`accepted` + `result`, or `rejected`) and queues them;
  a failed look or commit refuses the whole batch. A batch is what arrived while the previous one
  was being decided: the frames the reader read in one go, or during a slow disk;
- durable before accepted; duplicates, conflicts and the quota are decided under the admission
  lock; every request (`inventory`, and `status`/`cancel` through `settle`) first decides the starts
  taken in before it, in ITS OWN task (as the real `settle`/`inventory` do);
- one writer (`GroupCommit`): every write waits, one drainer commits all waiting writes in one
  transaction, a batch's rows and RUNNING/terminal changes of running tasks together;
- at most `max_running` run, the others wait `queued` (FIFO); every transition is committed
  (version + 1) BEFORE it is pushed as a `task_update` on the live connection, if any;
- the truth wins on cancel and on `max_runtime_ms`; a queued task is cancelled without running;
- restart (`open`): every queued/running row becomes `lost`, nothing re-runs, the orphan is killed.
Executions belong to the Hand (its loop), not to a connection: a dropped connection touches no task.
Not modelled: clean shutdown (`_closing`), the argument size check (the simulated starts are small), `ADMIT_BACKLOG` (never reached),
a terminal commit that fails (the shell keeps the outcome, `_keep_outcome`, and `_recommit`s it: the
simulated store fails only insert-only commits, so a conclude failure here is a bug, as it was), and
the per-stream log files (the model keeps log sizes only).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.jobs import PROGRAM, JobSpec, VProcess
from sim.runtime import Fut, Loop, Proc, SimLock

from hand.aio.taskrun import LiveTask
from hand.core.rows import Change, Insert, TaskRow, Write, to_info
from hand.core.spawn import spawn_failure
from hand.core.tasks import (
    ADMIT_BACKLOG,
    Admission,
    Admissions,
    Answer,
    CancelAction,
    Duplicate,
    Ending,
    Refused,
    StartRequest,
    admit_batch,
    answer_for,
    background_refusal,
    cancel_action,
    ending,
    next_to_start,
    not_started,
    orphaned,
    purge_cutoff,
    recovered,
    start_request,
    started,
    starts_first,
    store_failed,
)
from hand.system.tools import Refusal
from protocol.codes import CancelReason, ErrorCode, RejectCode, TaskCancelStatus
from protocol.messages import (
    Error,
    Message,
    Rejected,
    Rpc,
    TaskCancel,
    TaskCancelResult,
    TaskInfo,
    TaskInventory,
    TaskInventoryPage,
    TaskStatus,
    TaskUpdate,
)
from protocol.states import TaskState

if TYPE_CHECKING:
    from sim.hand_agent import HandProcess

PURGE_EVERY_S = 60.0
Send = Callable[[Message], None]


class LogSink:
    """`hand.system.tasklogs.LogSink` as a size: opened with O_TRUNC, head-bounded at `cap`."""

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
class _Live(LiveTask):
    """The REAL `hand.aio.taskrun.LiveTask` (its `kill` and `final`), holding a `JobSpec`, a
    `VProcess` and a `LogSink` model; its asyncio `run` is modelled by `HandTasks._run`."""

    log: Any = None


@dataclass(eq=False)
class _Start:
    """A start taken in, waiting for its batch; `send` is its connection's."""

    req: StartRequest
    spec: JobSpec
    send: Send


class GroupCommit:
    """`hand.aio.groupcommit.GroupCommit`: the one writer. Writes wait in `_waiting`; one drainer commits all
    that are waiting in one `write_many` (one I/O), then wakes each writer with ITS result."""

    def __init__(self, store: Any, loop: Loop) -> None:
        self._store = store
        self._loop = loop
        self._waiting: list[tuple[Write, Fut]] = []
        self._drainer: Proc | None = None

    def write(self, write: Write) -> Generator[Any, Any, Any]:
        fut = Fut()
        self._waiting.append((write, fut))
        if self._drainer is None:
            self._drainer = self._loop.spawn(self._drain(), "group commit")
        return (yield fut)

    def _drain(self) -> Generator[Any, Any, None]:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = yield self._loop.io(self._store.write_many, [w for w, _ in batch])
                except Exception as exc:  # the commit failed: no write of the batch is done
                    results = [exc] * len(batch)
                for (_, fut), result in zip(batch, results, strict=True):
                    if isinstance(result, BaseException):
                        fut.fail(result)
                    else:
                        fut.resolve(result)
        finally:
            self._drainer = None


class HandTasks:
    inventory_waits_for_admissions = True
    """As `hand/aio/tasks.py` does since the simulation found the race (see `sim.variants.HandBeforeFix`):
    `inventory` decides the waiting starts and reads its page under the admission lock, so a start
    taken in on an earlier connection (its row not yet committed when that connection dropped) is in
    the inventory of the next one. Without it, the Mind's reconciliation declares such a task `lost`
    ("unknown to hand") while the Hand runs it."""

    admit_in_owner = True
    """True as `hand/aio/tasks.py` ships: every batch is decided by the drainer in the Hand's owner and
    callers (`settle`, `answer`, `inventory`) only wait for it. False as the group commit first
    shipped ("hand-batch-before-fix"): they decided waiting starts in the CALLER's task, the
    connection's reader, and a reader cancelled while its batch's commit was in flight (this model
    cancels it when the connection ends) left the committed rows `queued` in the database and in no
    queue: never run, never answered, until a restart called them `lost`."""

    def __init__(self, hand: HandProcess) -> None:
        self.hand = hand
        self.loop = hand.loop
        self.store = hand.store
        self.limits = hand.world.config.task_limits
        self._queued: dict[str, _Live] = {}
        self._running: dict[str, _Live] = {}
        self._push: Send | None = None
        self._admit_lock = SimLock()
        self._admissions: Admissions[_Start] = Admissions()
        """The REAL bookkeeping of `hand.core.tasks`: starts taken in, and whether a drainer runs."""
        self._drainer: Proc | None = None
        self._deciding = 0
        """Batches between their look and their answers (for the fault counters only)."""
        self._writes = GroupCommit(self.store, self.loop)
        self.batches = hand.world.checker.notes
        """Where batch sizes and verdicts are counted (shown by `scripts/sim`)."""

    @property
    def now(self) -> float:
        return self.hand.clock.now

    def busy(self) -> bool:
        return bool(self._queued or self._running or self._admissions.backlog())

    def undecided(self) -> bool:
        """Starts taken in whose batch is not answered yet (waiting, or being looked up/committed)."""
        return bool(self._admissions.backlog() or self._deciding)

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
        """The shell's recovery (`hand.aio.taskrecovery.recover`) with its rules, the core's
        `orphaned` and `recovered`; a simulated process's start time is its pid."""
        for row in self.store.unfinished():
            killed = False
            orphan = self.hand.machine.alive(row.pid) if row.pid is not None else None
            if orphan is not None and orphaned(row, row.pid):
                orphan.orphan_kill()
                killed = True
            self.store.update(row.task_id, **recovered(row, killed, self.store.log_sizes.get(row.task_id), self.now))

    def _purge(self) -> None:
        self.store.purge(purge_cutoff(self.now, self.limits.retention_s))

    # --- start ---

    def on_start(self, rpc: Rpc, send: Send) -> Generator[Any, Any, None]:
        """Refused at once, or queued for the drainer's next batch; returns before it is decided."""
        task_id = rpc.run_id
        try:
            spec = self._prepare(rpc)
            req = start_request(rpc)
        except Refusal as refusal:
            send(Rejected(run_id=task_id, code=refusal.code, message=refusal.message))
            return
        self._admissions.take(_Start(req, spec, send))
        self._ensure_drainer()
        if self._admissions.backlog() >= ADMIT_BACKLOG:
            yield from self.settle()

    def _ensure_drainer(self) -> None:
        if self._admissions.needs_drainer():
            self._drainer = self.loop.spawn(self._drain(), "admit drainer")
            self._admissions.drainer_started()

    def settle(self) -> Generator[Any, Any, None]:
        """Every start taken in so far is decided (in the CALLER's proc, as the real `settle`)."""
        if self.admit_in_owner:
            yield from self._wait_drainer()
            return
        yield from self._admit_lock.acquire()
        try:
            yield from self._admit_pending()
        finally:
            self._admit_lock.release()

    def _wait_drainer(self) -> Generator[Any, Any, None]:
        """Wait, shielded, for the owner's drainer to decide every start taken in (`TaskManager.settle`)."""
        while self._admissions.deciding():
            self._ensure_drainer()
            assert self._drainer is not None
            yield self._drainer.done

    def _prepare(self, rpc: Rpc) -> JobSpec:
        refused = background_refusal(rpc.tool, allowed=self.hand.policy.allowed(rpc.tool), closing=False, args_size=0)
        if refused is not None:
            raise Refusal(refused.code, refused.message)
        spec = JobSpec.from_args(rpc.args)
        if spec is None:
            raise Refusal(RejectCode.INVALID_REQUEST, "bad arguments")
        return spec

    def _drain(self) -> Generator[Any, Any, None]:
        """The drainer, in the Hand's owner: admit batches until no start is waiting."""
        try:
            yield from self._admit_lock.acquire()
            try:
                yield from self._admit_pending()
            finally:
                self._admit_lock.release()
        finally:
            self._drainer = None
            self._admissions.drainer_ended()

    def _admit_pending(self) -> Generator[Any, Any, None]:
        while (batch := self._admissions.next_batch()) is not None:
            self._deciding += 1
            try:
                yield from self._admit_batch(batch)
            except Exception as exc:  # the real shell logs it; here it is a bug worth a failing seed
                self.hand.world.checker.fail("hand_task_batch", f"{type(exc).__name__}: {exc}")
            finally:
                self._deciding -= 1

    def _look(self, task_ids: set[str], cutoff: float) -> tuple[dict[str, TaskRow], int]:
        self.store.purge(cutoff)
        return self.store.get_many(task_ids), self.store.count()

    def _admit_batch(self, batch: list[_Start]) -> Generator[Any, Any, None]:
        now = self.now
        reqs = [s.req for s in batch]
        notes = self.batches
        notes[f"admit_batch:size{min(len(batch), 4)}{'+' if len(batch) >= 4 else ''}"] += 1
        try:
            existing, retained = yield self.loop.io(
                self._look, {r.task_id for r in reqs}, purge_cutoff(now, self.limits.retention_s)
            )
            verdicts = admit_batch(reqs, existing, retained, self.limits.max_retained, now)
            rows = [v.row for v in verdicts if v.admission is Admission.INSERT and v.row is not None]
            if rows:  # committed before any `accepted`; one write: all of the batch's rows or none
                yield from self._writes.write(Insert(tuple(rows)))
        except Exception as exc:  # the database failed: refuse the batch
            if not isinstance(exc, sqlite3.Error):  # anything else is a bug of the model or the decision
                self.hand.world.checker.fail("hand_task_batch", f"{type(exc).__name__}: {exc}")
            notes["admit_batch:refused_by_commit"] += 1
            if self.hand.world.tracer is not None:
                self._trace(f"{self.hand.label} batch {[r.task_id for r in reqs]} refused: {type(exc).__name__}: {exc}")
            self._refuse(batch, store_failed(exc))
            return
        if len(batch) > 1:
            ids = [r.task_id for r in reqs]
            if len(set(ids)) < len(ids):
                notes["admit_batch:same_id_twice"] += 1
            for v in verdicts[1:]:
                notes[f"admit_batch:later_{v.admission.value}"] += 1
        if self.hand.world.tracer is not None:
            self._trace(
                f"{self.hand.label} batch decided: "
                + " ".join(f"{r.task_id}:{v.admission.value}" for r, v in zip(reqs, verdicts, strict=True))
            )
        for start, verdict in zip(batch, verdicts, strict=True):
            self._answer_start(start, answer_for(verdict, start.req.task_id, self.limits.max_retained))
        self._pump()

    def _trace(self, what: str) -> None:
        tracer = self.hand.world.tracer
        if tracer is not None:
            tracer.note(what)

    def _answer_start(self, start: _Start, answer: Answer) -> None:
        req = start.req
        if isinstance(answer, Refused):
            self._refuse([start], answer)
        elif isinstance(answer, Duplicate):
            for msg in started(req.task_id, self._info(answer.row), duplicate=True):
                start.send(msg)
        else:
            self._queued[req.task_id] = _Live(answer.row, start.spec)  # committed: it will run
            for msg in started(req.task_id, to_info(answer.row), duplicate=False):
                start.send(msg)

    @staticmethod
    def _refuse(starts: list[_Start], refused: Refused) -> None:
        for start in starts:
            start.send(Rejected(run_id=start.req.task_id, code=refused.code, message=refused.message))

    def _pump(self) -> None:
        for task_id in next_to_start(list(self._queued), len(self._running), self.limits.max_running):
            live = self._queued.pop(task_id)
            self._running[task_id] = live
            live.runner = self.loop.spawn(self._execute(live), f"task {task_id}")

    # --- execution ---

    def _execute(self, live: _Live) -> Generator[Any, Any, None]:
        row = live.row
        timer = self.loop.call_at(
            self.now + row.max_runtime_ms / 1000,
            lambda: live.kill(CancelReason.DEADLINE_EXCEEDED),
            label="task_deadline",
        )
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
        proc = VProcess(
            self.hand.machine,
            live.spec,
            (self.hand.label, "task", task_id),
            grace=self.hand.kill_grace,
            on_output=lambda _stream, data: self._output(live, data),
            on_spawn=lambda pid: self._on_spawn(live, pid),
        )
        live.proc = proc
        if live.cancel is not None:
            proc.kill()
        try:
            out = yield from proc.run()
        except OSError as exc:
            return not_started(spawn_failure(exc, PROGRAM))
        return ending(out, live.cancel, max_ms, live.sink.error)

    def _output(self, live: _Live, data: bytes) -> None:
        if self.loop.alive and live.sink is not None:
            live.sink.append(data)

    def _on_spawn(self, live: _Live, pid: int) -> Generator[Any, Any, None]:
        yield from self._commit(live, state=TaskState.RUNNING, started_at=self.now, pid=pid, pid_start_time=pid)

    def _conclude(self, live: _Live, end: Ending) -> Generator[Any, Any, None]:
        if starts_first(live.row.state, end.state):
            yield from self._commit(live, state=TaskState.RUNNING, started_at=self.now)
        yield from self._commit(live, **live.final(end, self.now))

    def _commit(self, live: _Live, **changes: Any) -> Generator[Any, Any, TaskRow]:
        """Commit a change of the row (version + 1), THEN push it."""
        if live.sink is not None and "log_bytes" not in changes:
            changes.update(log_bytes=live.sink.size, truncated=live.sink.truncated)
        live.row = yield from self._writes.write(Change(live.row.task_id, changes))
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
        if isinstance(msg, TaskInventory):
            return (yield from self.inventory(msg))
        yield from self.settle()  # a request sees every start read before it
        if isinstance(msg, TaskStatus):
            return (yield from self.status(msg))
        if isinstance(msg, TaskCancel):
            return (yield from self.cancel(msg))
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
            row = yield from self._commit(
                queued, state=TaskState.CANCELLED, finished_at=self.now, reason=msg.reason.value
            )
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED, task=self._info(row))
        if action is CancelAction.KILL:
            assert running is not None
            running.kill(msg.reason)
            return TaskCancelResult(
                task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED, task=self._info(running.row)
            )
        if action is CancelAction.UNKNOWN:
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.UNKNOWN_TASK)
        assert row is not None
        return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.ALREADY_DONE, task=self._info(row))

    def inventory(self, msg: TaskInventory) -> Generator[Any, Any, TaskInventoryPage]:
        if self.inventory_waits_for_admissions:
            if self.admit_in_owner:
                yield from self._wait_drainer()
            yield from self._admit_lock.acquire()
            try:
                if not self.admit_in_owner:
                    yield from self._admit_pending()
                rows = yield self.loop.io(self.store.page, msg.after, msg.limit + 1)
            finally:
                self._admit_lock.release()
        else:
            rows = yield self.loop.io(self.store.page, msg.after, msg.limit + 1)
        more = len(rows) > msg.limit
        rows = rows[: msg.limit]
        return TaskInventoryPage(
            tasks=[self._info(r) for r in rows], next_after=rows[-1].task_id if more and rows else None
        )
