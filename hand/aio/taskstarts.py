"""Background starts on the Hand, taken in and answered: the order of `hand.core.tasks.Admissions`
(one batch at a time, a batch is what arrived meanwhile), performed by one drainer task.

Rules this module keeps (DESIGN §7):
- Durable before accepted: a batch's new rows are committed in ONE write of the group commit
  (`hand.aio.groupcommit`), and only then do `accepted` and the start run's `result` go out. The
  start run's `timeout_ms` bounds that admission, never the task. A failed look or commit refuses
  every start of its batch.
- Admission decides everything before anything is stored: the refusals of `hand.core.runs` (in the
  order and with the sentences of a foreground run), arguments and paths (`hand.system.tools`),
  then duplicates, conflicts and the quota (`admit_batch`, after purging expired rows).
- The deciding happens in a drainer owned by the Hand's task group, never in a connection's
  reader: a reader cancelled half-way cannot strand rows that are committed but not queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from hand.aio.metrics import HandMetrics
from hand.core.rows import Insert, TaskRow, to_info
from hand.core.runs import SHUTTING_DOWN, Refused
from hand.core.sanitize import Sanitizer
from hand.core.tasks import (
    ADMIT_BACKLOG,
    Admission,
    Admissions,
    Answer,
    Duplicate,
    StartRequest,
    TaskLimits,
    admit_batch,
    answer_for,
    purge_cutoff,
    start_request,
    started,
    store_failed,
)
from hand.system.tools import ProcessSpec, Refusal
from protocol.audit import AuditEvent
from protocol.codes import RejectCode
from protocol.messages import Message, Rejected, Rpc, TaskInfo

Send = Callable[[Message], None]
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]
Look = Callable[[Iterable[str], float], tuple[dict[str, TaskRow], int]]


@dataclass(eq=False)
class _Start:
    """A start taken in, waiting for its group commit; `send` is its connection's."""

    req: StartRequest
    spec: ProcessSpec
    send: Send
    log: Any


class TaskStarts:
    """The starts of `TaskManager`: `on_start` takes one in (refused at once, or batched), one
    drainer decides and commits the batches, `settle` waits until every start taken in is
    answered. What it needs of the manager comes in as callables: `prepare` (refusals, arguments),
    `look` (in a thread: purge, then the rows under the ids and the row count), `commit` (the
    group commit), `queue` (a committed row will run), `info` (a row as reported), `decided`
    (after each batch: start what may start)."""

    def __init__(
        self,
        *,
        spawn: Spawn,
        prepare: Callable[[Rpc], ProcessSpec],
        look: Look,
        commit: Callable[[Insert], Awaitable[Any]],
        queue: Callable[[TaskRow, ProcessSpec, Any], None],
        info: Callable[[TaskRow], TaskInfo],
        decided: Callable[[], None],
        clock: Callable[[], float],
        limits: TaskLimits,
        sanitize: Sanitizer,
        log: Any,
        metrics: HandMetrics,
    ) -> None:
        self._spawn = spawn
        self._prepare = prepare
        self._look = look
        self._commit = commit
        self._queue = queue
        self._info = info
        self._decided = decided
        self._clock = clock
        self.limits = limits
        self._sanitize = sanitize
        self._log = log
        self._metrics = metrics
        self.lock = asyncio.Lock()
        """Held while a batch of starts is decided and committed (and by readers that must see
        every start taken in before them: `TaskManager.inventory`)."""
        self._admissions: Admissions[_Start] = Admissions()
        """Starts taken in, in arrival order, and whether a drainer is deciding them."""
        self._drainer: asyncio.Task[None] | None = None
        self.closing = False
        """Set by the manager's shutdown: every start still to be decided is refused."""

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
            spec = self._prepare(rpc)
            req = start_request(rpc)
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

    async def _drain(self) -> None:
        """The group commit's owner task: admit batches until no start is waiting. One batch is
        what arrived while the previous commit was in progress (`Admissions`)."""
        try:
            async with self.lock:
                while (batch := self._admissions.next_batch()) is not None:
                    try:
                        await self._admit_batch(batch)
                    except Exception:  # a bug loses one batch's answers, never the agent
                        self._log.exception("task_batch_crashed", starts=len(batch))
        finally:
            self._drainer = None  # no await since the last look at the waiting starts: nothing is stranded
            self._admissions.drainer_ended()

    async def _admit_batch(self, batch: list[_Start]) -> None:
        """Decide a batch (`admit_batch`), commit its new rows in ONE transaction, and only then
        answer. A failed look or commit refuses every start of the batch: no `accepted` goes out
        for a row that may not be stored."""
        if self.closing:
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
                await self._commit(Insert(tuple(rows)))
        except Exception as exc:  # the database failed: refuse the batch, keep the agent
            self._log.exception("task_batch_failed", starts=len(batch))
            self._refuse(batch, store_failed(exc))
            return
        for start, verdict in zip(batch, verdicts, strict=True):
            try:
                self._answer_start(start, answer_for(verdict, start.req.task_id, self.limits.max_retained))
            except Exception:  # a bug in one answer must not strand the rest of the batch
                start.log.exception("task_start_failed")
        self._decided()

    def _answer_start(self, start: _Start, answer: Answer) -> None:
        req, log = start.req, start.log
        if isinstance(answer, Refused):
            self._refuse([start], answer)
        elif isinstance(answer, Duplicate):
            for msg in started(req.task_id, self._info(answer.row), duplicate=True):
                start.send(msg)
            log.info(AuditEvent.TASK_DUPLICATE, state=answer.row.state.value, args_digest=req.args_digest)
            self._metrics.task_starts.labels("duplicate").inc()
        else:
            self._queue(answer.row, start.spec, log)  # committed: it will run
            for msg in started(req.task_id, to_info(answer.row), duplicate=False):
                start.send(msg)
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
