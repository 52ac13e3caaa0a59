"""Background tasks on the Hand: admission, quotas, execution, logs, cancel, restart and shutdown.

The Hand's task database (`hand.taskstore`) is the authority (DESIGN §3, §7). Two state machines
share one id: the start run (an `rpc` with `background`; it succeeds once the row is committed) and
the task itself (`queued -> running -> succeeded|failed|cancelled|timed_out`, `queued|running ->
lost`).

Rules this module keeps:
- Durable before accepted: the row is inserted and COMMITTED, and only then do `accepted` and the
  start run's `result` go out. The start run's `timeout_ms` bounds that admission, never the task.
  Group commit: starts that arrive while a commit is in progress are decided together and their
  rows committed in ONE transaction (one fsync for many); each start's `accepted` still waits for
  that commit, and a failed commit refuses every start of its batch.
- Admission decides everything before anything is stored: the tool (only `exec`/`shell` run in the
  background), policy, arguments and paths exactly as for foreground runs (`hand.tools.prepare`),
  then duplicates (same id and binding -> the existing task, nothing runs; another binding ->
  `conflicting_duplicate`), then quotas (expired terminal rows are purged first; at
  `max_retained` rows -> `quota_exceeded` with nothing stored); within a batch each start sees
  the rows admitted before it (`admit_batch`). At most `max_running` tasks run;
  the others wait `queued`, first come first served.
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
- Sandboxing and limits are the foreground runs' (`hand.sandbox`): the same scrubbed environment,
  user and `setrlimit`s, and the same tree-wide CPU budget (`hand.cputime`). A task has no
  `budget_exhausted` state (`TaskState` is the protocol's, and a task's outcome is one of
  succeeded/failed/cancelled/timed_out/lost): a task whose tree spends its `cpu_seconds` is killed
  as a tree and ends `failed` with reason "cpu budget of N s exhausted" (also when the kernel's
  per-process CPU limit killed it).
- The log keeps the HEAD, bounded by `log_max` bytes: offsets stay stable for paging, and the
  first bytes (the command line echo, the first error) are usually the ones worth keeping. Past
  the bound nothing more is written and `truncated` is set. Chunks are appended on the event loop:
  a page-cache append of at most a pipe buffer takes microseconds, and a single writer keeps
  stdout and stderr interleaved in arrival order. Beside that combined log each stream has a file
  of its own, bounded the same way (`TaskLog`), so `task logs --stream stderr` pages by stable
  offsets in that stream's bytes; a task logged before that answers `no_stream_log` for it.
- Hand restart (`open`): every `queued`/`running` row becomes `lost` ("hand restarted before
  completion"); nothing re-runs; the log stays readable. If a `running` row's process is still
  alive (same pid AND same /proc start time) its process group, orphaned by the crash, is killed.
- Clean shutdown (`shutdown`, on SIGTERM/SIGINT): running tasks are killed as trees and end
  `cancelled` with reason `shutdown`; queued ones end `cancelled` with reason `shutdown` (nothing
  ran). Not `lost`: the Hand itself observed the end, so the outcome is known. `lost` is reserved
  for "nobody can know", i.e. a crash. Bounded by the kill grace + 1 s.

The decisions are plain functions at the top (fed with rows, counts and `now`); `TaskManager` is
the asyncio shell that performs them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import structlog

from hand.aio.metrics import HandMetrics
from hand.core.policy import Policy, ToolPolicy
from hand.core.rows import Change, Insert, TaskRow, Write, to_info
from hand.core.sanitize import Sanitizer
from hand.core.spawn import spawn_failure
from hand.core.tasks import (
    ADMIT_BACKLOG,
    SHUTTING_DOWN,
    Admission,
    Admissions,
    Answer,
    CancelAction,
    Duplicate,
    Ending,
    Refused,
    StartRequest,
    TaskLimits,
    admit_batch,
    answer_for,
    at_eof,
    background_refusal,
    cancel_action,
    ending,
    lost_reason,
    next_to_start,
    not_started,
    page_length,
    purge_cutoff,
    store_failed,
    stream_truncated,
)
from hand.system.cputime import CPU_SECONDS, stop_watching, watch_cpu
from hand.system.process import DEFAULT_GRACE_S, ProcessRun, Stream, kill_group, start_time
from hand.system.sandbox import Sandbox
from hand.system.taskdb import STREAMS, TaskStore
from hand.system.tools import DEFAULT_SANDBOX, ProcessSpec, Refusal, prepare
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, ErrorCode, KillStage, RejectCode, TaskCancelStatus
from protocol.control import Budget
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
    TaskLogPage,
    TaskLogs,
    TaskStartValue,
    TaskStatus,
    TaskUpdate,
)
from protocol.states import TASK_TRANSITIONS, RunState, TaskState

Send = Callable[[Message], None]
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]

PURGE_EVERY_S = 60.0
SHUTDOWN_REASON = CancelReason.SHUTDOWN.value


# --- the task log -------------------------------------------------------------------------------


class LogSink:
    """Append-only, head-bounded log file of one task (0600). Stops writing at `cap` bytes and
    sets `truncated`; a write error stops writing too and is remembered as `error`."""

    def __init__(self, path: Path, cap: int) -> None:
        self.cap = cap
        self.size = 0
        self.truncated = False
        self.error: str | None = None
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        os.fchmod(self._fd, 0o600)

    def append(self, data: bytes) -> None:
        if not data:
            return
        if self._fd is None:  # closed at the bound (or by a write error): drop, and say so
            self.truncated = True
            return
        room = self.cap - self.size
        piece = data if len(data) <= room else data[:room]
        try:
            view = memoryview(piece)
            while view:
                n = os.write(self._fd, view)
                self.size += n
                view = view[n:]
        except OSError as exc:
            self.error = f"task log write failed: {exc.strerror or exc}"
            self.truncated = True
            self.close()
            return
        if len(piece) < len(data):
            self.truncated = True
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_log(path: Path, offset: int, length: int) -> bytes:
    if length <= 0:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return b""
    try:
        chunks: list[bytes] = []
        got = 0
        while got < length:
            chunk = os.pread(fd, length - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class TaskLog:
    """The log of one task, as three `LogSink`s bounded at the same `cap`: the combined file (both
    streams in arrival order: its size is the row's `log_bytes`, its offsets the ones `task logs`
    pages by, exactly as before streams were kept apart) and one file per stream (issue 14: `task
    logs --stream`, offsets in that stream's bytes). Keeping the streams apart costs at most the
    bytes once more; it never changes the combined log.

    The stream files are created first: a combined file without them is a task logged before they
    existed (`stream_log_size` says so), never a task of this Hand that lost one."""

    def __init__(self, path: Path, stream_paths: dict[str, Path], cap: int) -> None:
        self.streams: dict[str, LogSink] = {}
        try:
            for stream, stream_path in stream_paths.items():
                self.streams[stream] = LogSink(stream_path, cap)
            self.combined = LogSink(path, cap)
        except BaseException:
            for sink in self.streams.values():
                sink.close()
            raise

    @property
    def size(self) -> int:
        return self.combined.size

    @property
    def truncated(self) -> bool:
        return self.combined.truncated

    @property
    def error(self) -> str | None:
        """The first write error of any of the files: part of the log is missing, and the task says so."""
        for sink in (self.combined, *self.streams.values()):
            if sink.error is not None:
                return sink.error
        return None

    def append(self, stream: str, data: bytes) -> None:
        self.combined.append(data)
        self.streams[stream].append(data)

    def close(self) -> None:
        self.combined.close()
        for sink in self.streams.values():
            sink.close()


def stream_log_size(path: Path, combined: Path) -> int | None:
    """(in a thread) The bytes in a stream's file now: 0 while the task has no log at all (not
    started yet, or its log could not be opened); None for a task logged before streams were kept
    apart (a combined file, no stream file). The combined file is looked at first: it is created
    after the stream files, so a task starting meanwhile is never taken for an old one."""
    if not combined.exists():
        return 0
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


# --- the asyncio shell --------------------------------------------------------------------------


@dataclass(eq=False)
class _Live:
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


@dataclass(eq=False)
class _Start:
    """A start taken in, waiting for its group commit; `send` is its connection's."""

    req: StartRequest
    spec: ProcessSpec
    send: Send
    log: Any


class GroupCommit:
    """The one writer of the task database: every write waits here, and one owned task commits
    all the writes that are waiting in ONE transaction (`TaskStore.write_many`: one fsync for
    many), then wakes each writer once ITS write is committed (or with its own error). While a
    commit is in progress the next writes queue up and share the next one: a batch of admitted
    starts, RUNNING and terminal transitions ride together. Measured on a VM disk, the fsyncs of
    `synchronous=FULL` were a third of a task's CPU (mostly kernel time) and serialised every
    start behind the previous one's: sharing them is the throughput."""

    def __init__(self, store: TaskStore, spawn: Spawn) -> None:
        self._store = store
        self._spawn = spawn
        self._waiting: list[tuple[Write, asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def write(self, write: Write) -> Any:
        """The write's result (see `TaskStore.write_many`) once committed; its error otherwise."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((write, fut))
        if self._drainer is None:
            try:
                self._drainer = self._spawn(self._drain())
            except RuntimeError:  # the owner is closing: commit this one alone, here
                self._waiting.pop()
                return _result(await asyncio.to_thread(self._store.write_many, [write]))
        return await fut

    async def idle(self) -> None:
        """Wait until every write handed over so far is committed (or failed)."""
        if self._drainer is not None:
            await asyncio.wait({self._drainer})

    async def _drain(self) -> None:
        batch: list[tuple[Write, asyncio.Future[Any]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = await asyncio.to_thread(self._store.write_many, [w for w, _ in batch])
                except Exception as exc:  # the commit failed: no write of the batch is done
                    results = [exc] * len(batch)
                for (_, fut), result in zip(batch, results, strict=True):
                    if fut.done():  # its writer was cancelled
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
                batch = []
        except BaseException:  # cancelled with the owner: nobody is left to wait
            for _, fut in batch + self._waiting:
                fut.cancel()
            self._waiting = []
            raise
        finally:
            self._drainer = None  # no await since the last look at `_waiting`: nothing is stranded


def _result(results: list[Any]) -> Any:
    if isinstance(results[0], BaseException):
        raise results[0]
    return results[0]


class TaskManager:
    """Owns the background tasks of one Hand, across connections.

    Lifecycle: `await open()` once before connecting (restart recovery, purge), `attach(send)` per
    connection (`attach(None)` when it ends), `await shutdown()` once at the end. Requests:
    `on_start(rpc, send)` for an `rpc` with `background`, `answer(msg)` for `task_status`,
    `task_logs`, `task_cancel` and `task_inventory`. `spawn` must belong to an owner that outlives
    connections (the agent's task group). `on_start` returns before the start is decided (its
    answer goes to its `send`); `await settle()` waits until every start taken in is decided.
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
        self._queued: dict[str, _Live] = {}
        """Insertion order is creation order: FIFO."""
        self._running: dict[str, _Live] = {}
        self._push: Send | None = None
        self._admit_lock = asyncio.Lock()
        """Held while a batch of starts is decided and committed (and by readers that must see
        every start taken in before them: `settle`)."""
        self._admissions: Admissions[_Start] = Admissions()
        """Starts taken in, in arrival order, and whether a drainer is deciding them."""
        self._drainer: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._purger: asyncio.Task[None] | None = None
        self._uncommitted: dict[str, _Live] = {}
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
        await self._recover()
        await self._purge()
        self._purger = self._spawn(self._purge_loop())

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
        self._closing = True
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
                self._kill(live, CancelReason.SHUTDOWN)
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
        """Take a background start in: refused at once (`rejected`, nothing stored), or handed to
        the group commit, which answers `accepted` + `result` once ITS row is committed.

        Returns once the start is handed over, not decided, so the connection's reader goes on
        reading and the starts that arrive while a commit is in progress share the next one. The
        commit runs in the owner's task group: if the reader is cancelled half-way, a committed
        task is still queued and started, never stranded between the database and memory. Past
        `ADMIT_BACKLOG` undecided starts the reader waits for them.
        """
        task_id = rpc.run_id
        log = self._log.bind(task_id=task_id, tool=rpc.tool)
        try:
            assert rpc.background is not None
            spec = self._prepare(rpc)
            max_runtime_ms = rpc.background.max_runtime_ms
            req = StartRequest(
                task_id=task_id,
                tool=rpc.tool,
                args_digest=args_digest(rpc.tool, rpc.args),
                binding_digest=binding_digest(rpc.tool, rpc.args, max_runtime_ms),
                max_runtime_ms=max_runtime_ms,
            )
        except Refusal as refusal:
            shown = self._sanitize(refusal.message)
            send(Rejected(run_id=task_id, code=refusal.code, message=shown))
            log.info(AuditEvent.TASK_START_REJECTED, code=refusal.code.value, reason=shown)
            self._metrics.task_starts.labels("rejected").inc()
            return
        except Exception as exc:  # a bug refuses one start, never the agent
            log.exception("task_start_failed")
            self._metrics.task_starts.labels("rejected").inc()
            send(
                Rejected(
                    run_id=task_id,
                    code=RejectCode.INTERNAL_ERROR,
                    message=self._sanitize(f"internal error: {type(exc).__name__}: {exc}"),
                )
            )
            return
        self._admissions.take(_Start(req, spec, send, log))
        if not self._ensure_drainer():
            return
        if self._admissions.backlog() >= ADMIT_BACKLOG:
            await self.settle()

    def _ensure_drainer(self) -> bool:
        """A drainer owned by the task group is deciding the waiting starts; False if the owner is
        closing (then the waiting starts are refused: nothing was stored)."""
        if self._admissions.needs_drainer():
            try:
                self._drainer = self._spawn(self._drain())
            except RuntimeError:
                self._refuse(self._admissions.abandon(), SHUTTING_DOWN)
                return False
            self._admissions.drainer_started()
        return True

    def deciding(self) -> bool:
        """Some start taken in is not answered yet."""
        return self._admissions.deciding()

    async def settle(self) -> None:
        """Wait until every start taken in so far is decided (committed and answered, or refused).
        Requests read after a start see it, as if starts were admitted one at a time.

        The deciding happens in the drainer, owned by the task group, never in the caller's task:
        a caller cancelled meanwhile (the reader of a connection that dropped) cannot strand a
        batch whose rows are committed but neither queued nor answered (found by tests/sim)."""
        while self.deciding():
            if not self._ensure_drainer():
                return
            assert self._drainer is not None
            await asyncio.wait({self._drainer})  # cancelling the caller does not cancel the drainer

    def _prepare(self, rpc: Rpc) -> ProcessSpec:
        size = len(msgpack.packb(rpc.args, use_bin_type=True))
        refused = background_refusal(
            rpc.tool, allowed=self._policy.allowed(rpc.tool), closing=self._closing, args_size=size
        )
        if refused is not None:
            raise Refusal(refused.code, refused.message)
        spec = prepare(rpc.tool, rpc.args, self._root, self._sandbox)
        assert isinstance(spec, ProcessSpec)
        return spec

    async def _drain(self) -> None:
        """The group commit's owner task: admit batches until no start is waiting. One batch is
        what arrived while the previous commit was in progress (`Admissions`)."""
        try:
            async with self._admit_lock:
                while (batch := self._admissions.next_batch()) is not None:
                    try:
                        await self._admit_batch(batch)
                    except Exception:  # a bug loses one batch's answers, never the agent
                        self._log.exception("task_batch_crashed", starts=len(batch))
        finally:
            self._drainer = None  # no await since the last look at the waiting starts: nothing is stranded
            self._admissions.drainer_ended()

    def _look(self, task_ids: Iterable[str], cutoff: float) -> tuple[dict[str, TaskRow], int]:
        """(in a thread) Purge expired rows, then read the rows under these ids and the row count."""
        purged = self.store.purge(cutoff)
        if purged:
            self._log.info("tasks_purged", count=len(purged))
        return self.store.get_many(task_ids), self.store.count()

    async def _admit_batch(self, batch: list[_Start]) -> None:
        """Decide a batch (`admit_batch`), commit its new rows in ONE transaction, and only then
        answer. A failed look or commit refuses every start of the batch: no `accepted` goes out
        for a row that may not be stored."""
        if self._closing:
            self._refuse(batch, SHUTTING_DOWN)
            return
        now = self._clock()
        reqs = [s.req for s in batch]
        try:
            existing, retained = await asyncio.to_thread(
                self._look, {r.task_id for r in reqs}, purge_cutoff(now, self.limits.retention_s)
            )
            verdicts = admit_batch(reqs, existing, retained, self.limits.max_retained, now)
            rows = [v.row for v in verdicts if v.admission is Admission.INSERT and v.row is not None]
            if rows:  # committed before any `accepted`; one write: all of the batch's rows or none
                await self._writes.write(Insert(tuple(rows)))
        except Exception as exc:  # the database failed: refuse the batch, keep the agent
            self._log.exception("task_batch_failed", starts=len(batch))
            self._refuse(batch, store_failed(exc))
            return
        for start, verdict in zip(batch, verdicts, strict=True):
            try:
                self._answer_start(start, answer_for(verdict, start.req.task_id, self.limits.max_retained))
            except Exception:  # a bug in one answer must not strand the rest of the batch
                start.log.exception("task_start_failed")
        self._pump()

    def _answer_start(self, start: _Start, answer: Answer) -> None:
        req, log = start.req, start.log
        if isinstance(answer, Refused):
            self._refuse([start], answer)
        elif isinstance(answer, Duplicate):
            self._started(start.send, req.task_id, self._info(answer.row), duplicate=True)
            log.info(AuditEvent.TASK_DUPLICATE, state=answer.row.state.value, args_digest=req.args_digest)
            self._metrics.task_starts.labels("duplicate").inc()
        else:
            self._queued[req.task_id] = _Live(answer.row, start.spec, log)  # committed: it will run
            self._started(start.send, req.task_id, to_info(answer.row), duplicate=False)
            log.info(AuditEvent.TASK_QUEUED, args_digest=req.args_digest, max_runtime_ms=req.max_runtime_ms)
            self._metrics.task_starts.labels("accepted").inc()

    def _refuse(self, starts: Iterable[_Start], refused: Refused) -> None:
        message = self._sanitize(refused.message)
        for start in starts:
            try:
                start.send(Rejected(run_id=start.req.task_id, code=refused.code, message=message))
            except Exception:  # best effort, like every send to a connection that may be gone
                start.log.warning("task_start_unsendable")
            start.log.info(AuditEvent.TASK_START_REJECTED, code=refused.code.value, reason=message)
            self._metrics.task_starts.labels("rejected").inc()

    @staticmethod
    def _started(send: Send, task_id: str, info: TaskInfo, *, duplicate: bool) -> None:
        send(Accepted(run_id=task_id))
        value = TaskStartValue(task=info, duplicate=duplicate).model_dump(mode="python")
        send(Result(run_id=task_id, state=RunState.SUCCEEDED, value=value))

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

    async def _execute(self, live: _Live) -> None:
        loop = asyncio.get_running_loop()
        row = live.row
        timer = loop.call_later(row.max_runtime_ms / 1000, self._kill, live, CancelReason.DEADLINE_EXCEEDED)
        try:
            try:
                end = await self._run(live)
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

    async def _run(self, live: _Live) -> Ending:
        spec = live.spec
        max_ms = live.row.max_runtime_ms
        try:
            task_id = live.row.task_id
            streams = {s: self.store.stream_log_path(task_id, s) for s in STREAMS}
            live.sink = await asyncio.to_thread(TaskLog, self.store.log_path(task_id), streams, self.limits.log_max)
        except OSError as exc:
            return ending(None, None, max_ms, f"cannot open the task log: {exc.strerror or exc}")
        proc = ProcessRun(
            spec.argv,
            cwd=spec.cwd,
            env=spec.env,
            stdin=spec.stdin,
            on_output=partial(self._output, live),
            grace=self._grace,
            on_spawn=partial(self._on_spawn, live),
            limits=spec.limits,
            run_as=spec.run_as,
        )
        live.proc = proc
        if live.cancel is not None:
            proc.kill()
        cpu_seconds = spec.limits.cpu_seconds if spec.limits is not None else None
        watcher = None
        if cpu_seconds is not None:
            live.cpu = Budget({CPU_SECONDS: cpu_seconds})
            watcher = asyncio.get_running_loop().create_task(
                watch_cpu(lambda: proc.pid, partial(self._charge_cpu, live))
            )
        try:
            out = await proc.run()
        except OSError as exc:  # the command could not start: 127 / 126 as a shell says, if it is the program's
            how = spawn_failure(exc, spec.argv[0])
            return not_started(dataclasses.replace(how, error=self._sanitize(how.error)))
        except Exception as exc:
            live.log.exception("task_crashed")
            return ending(None, None, max_ms, self._sanitize(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            if watcher is not None:  # owned here: stopped and awaited, its failure seen
                failure = await stop_watching(watcher)
                if failure is not None:  # metering broke; the task's own outcome stands
                    live.log.error("task_cpu_watch_failed", error=type(failure).__name__)
        used = live.cpu.used(CPU_SECONDS) if live.cpu is not None else 0.0
        return ending(out, live.cancel, max_ms, live.sink.error, cpu_seconds, used)

    def _charge_cpu(self, live: _Live, seconds: float) -> bool:
        """Spend CPU the tree used; past the budget, kill the tree (it ends `failed`)."""
        assert live.cpu is not None
        if live.cancel is not None:
            return False
        if not live.cpu.try_reserve(CPU_SECONDS, seconds):
            live.log.info("task_cpu_budget_exhausted", cpu_seconds=live.cpu.limit(CPU_SECONDS))
            self._kill(live, CancelReason.BUDGET_EXHAUSTED)
            return False
        return True

    @staticmethod
    def _output(live: _Live, stream: Stream, data: bytes) -> None:
        assert live.sink is not None
        live.sink.append(stream, data)

    async def _on_spawn(self, live: _Live, pid: int) -> None:
        await self._commit(
            live, state=TaskState.RUNNING, started_at=self._clock(), pid=pid, pid_start_time=start_time(pid)
        )
        live.log.info("task_running", pid=pid)

    def _kill(self, live: _Live, reason: CancelReason) -> None:
        """Request the end of a running task; the first reason wins (a cancel, the deadline, shutdown)."""
        if live.cancel is None:
            live.cancel = reason
        if live.proc is not None:
            live.proc.kill()

    def _final(self, live: _Live, end: Ending) -> dict[str, Any]:
        sink = live.sink
        error = end.error
        return dict(
            state=end.state,
            finished_at=self._clock(),
            reason=end.reason,
            exit_code=end.exit_code,
            signal=end.signal,
            stage=end.stage,
            error=error,
            log_bytes=sink.size if sink is not None else live.row.log_bytes,
            truncated=sink.truncated if sink is not None else live.row.truncated,
        )

    async def _conclude(self, live: _Live, end: Ending) -> None:
        if live.row.state is TaskState.QUEUED and end.state not in TASK_TRANSITIONS[TaskState.QUEUED]:
            # It never got to run (the program could not start): it did start, then failed.
            await self._commit(live, state=TaskState.RUNNING, started_at=self._clock())
        await self._commit(live, **self._final(live, end))
        self._log_terminal(live)

    def _keep_outcome(self, live: _Live, end: Ending, exc: Exception) -> None:
        """The task ended, the commit failed: the outcome stays in memory (with the time it ended),
        is reported as `uncommitted`, and is committed as soon as the database takes it. Only a
        crash before then makes the task `lost` (at restart)."""
        live.outcome = self._final(live, end)
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
                if (
                    live.row.state is TaskState.QUEUED
                    and live.outcome["state"] not in TASK_TRANSITIONS[TaskState.QUEUED]
                ):
                    await self._commit(live, state=TaskState.RUNNING, started_at=live.outcome["finished_at"])
                await self._commit(live, **live.outcome)
            except Exception as exc:
                live.log.warning("task_outcome_still_uncommitted", error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            del self._uncommitted[task_id]
            live.outcome = None
            self._metrics.tasks_uncommitted.set(len(self._uncommitted))
            live.log.info("task_outcome_committed")
            self._log_terminal(live)
            progressed = True
        return progressed

    def _conclude_now(self, live: _Live, end: Ending) -> None:
        """Synchronous terminal commit for a runner cancelled at shutdown (no await possible)."""
        try:
            current = self.store.get(live.row.task_id)
            if current is None or current.terminal:
                return
            if current.state is TaskState.RUNNING or end.state in TASK_TRANSITIONS[current.state]:
                live.row = self.store.update(live.row.task_id, **self._final(live, end))
                self._send_update(live.row)
                self._log_terminal(live)
        except Exception:
            live.log.exception("task_conclude_failed")

    def _log_terminal(self, live: _Live) -> None:
        row = live.row
        self._metrics.tasks_finished.labels(row.state.value).inc()
        duration = None
        if row.started_at is not None and row.finished_at is not None:
            duration = round(row.finished_at - row.started_at, 3)
        live.log.info(
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

    async def _commit(self, live: _Live, **changes: Any) -> TaskRow:
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
        length = page_length(msg.offset, msg.limit, info.log_bytes)
        data = await asyncio.to_thread(read_log, self.store.log_path(msg.task_id), msg.offset, length)
        end = msg.offset + len(data)
        return TaskLogPage(
            task_id=msg.task_id,
            offset=msg.offset,
            data=data,
            next_offset=end,
            log_bytes=info.log_bytes,
            state=info.state,
            truncated=info.truncated,
            eof=at_eof(end, info.log_bytes, row.terminal),
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
        length = page_length(msg.offset, msg.limit, size)
        data = await asyncio.to_thread(read_log, path, msg.offset, length)
        end = msg.offset + len(data)
        return TaskLogPage(
            task_id=task_id,
            offset=msg.offset,
            data=data,
            next_offset=end,
            log_bytes=size,
            state=info.state,
            truncated=truncated,
            eof=at_eof(end, size, row.terminal),
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
            self._kill(running, msg.reason)
            running.log.info(AuditEvent.TASK_CANCEL_REQUESTED, reason=msg.reason.value)
            return TaskCancelResult(
                task_id=task_id, status=TaskCancelStatus.CANCEL_REQUESTED, task=self._info(running.row)
            )
        if action is CancelAction.UNKNOWN:
            return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.UNKNOWN_TASK)
        assert row is not None
        return TaskCancelResult(task_id=task_id, status=TaskCancelStatus.ALREADY_DONE, task=self._info(row))

    async def _dequeue(self, live: _Live, reason: str) -> TaskRow:
        """A queued task ends `cancelled` without having run."""
        row = await self._commit(live, state=TaskState.CANCELLED, finished_at=self._clock(), reason=reason)
        self._log_terminal(live)
        return row

    async def inventory(self, msg: TaskInventory) -> TaskInventoryPage:
        # Under the admission lock, after the waiting starts are decided: a start still being
        # admitted (its connection may have dropped mid-commit) is committed, and listed, before
        # the page is read; else the Mind's reconciliation would call it `lost` while this Hand
        # runs it (found by tests/sim).
        await self.settle()
        async with self._admit_lock:  # no batch half-way through its commit while the page is read
            rows = await asyncio.to_thread(self.store.page, msg.after, msg.limit + 1)
        more = len(rows) > msg.limit
        rows = rows[: msg.limit]
        return TaskInventoryPage(
            tasks=[self._info(r) for r in rows], next_after=rows[-1].task_id if more and rows else None
        )

    # --- restart and retention ------------------------------------------------------------------

    async def _recover(self) -> None:
        rows = await asyncio.to_thread(self.store.unfinished)
        if not rows:
            return
        async with asyncio.TaskGroup() as tg:
            for row in rows:
                tg.create_task(self._recover_one(row))
        self._log.info("tasks_recovered", lost=len(rows))

    async def _recover_one(self, row: TaskRow) -> None:
        killed = False
        if row.pid is not None and row.pid_start_time is not None and start_time(row.pid) == row.pid_start_time:
            await kill_group(row.pid, self._grace)  # the crashed Hand's tree: nobody else will stop it
            killed = True
        try:
            size = os.stat(self.store.log_path(row.task_id)).st_size
        except OSError:
            size = row.log_bytes
        new = await self._writes.write(
            Change(
                row.task_id,
                dict(state=TaskState.LOST, reason=lost_reason(killed), finished_at=self._clock(), log_bytes=size),
            )
        )
        self._log.bind(task_id=row.task_id).info(
            AuditEvent.TASK_TERMINAL,
            state=new.state.value,
            reason=new.reason,
            log_bytes=new.log_bytes,
            args_digest=new.args_digest,
            orphan_killed=killed,
        )
        self._metrics.tasks_finished.labels(new.state.value).inc()

    async def _purge(self) -> None:
        cutoff = purge_cutoff(self._clock(), self.limits.retention_s)
        ids = await asyncio.to_thread(self.store.purge, cutoff)
        if ids:
            self._log.info("tasks_purged", count=len(ids))

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(PURGE_EVERY_S)
            try:
                await self._purge()
            except Exception:  # try again next time
                self._log.exception("tasks_purge_failed")
