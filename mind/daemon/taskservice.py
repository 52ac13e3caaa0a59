"""The Mind's side of background tasks: starts, queries, cancels, removals and the reconciliation pass.

The asyncio glue around `mind/core/taskstart.py` (how a start is decided), `mind/core/snapshots.py`
(the rules of a snapshot) and `mind/store/snapshots.py` (the table): it performs each step of a
start, asks the Hand when the Hand is connected (the authority), answers from the snapshot when it
is not (saying so: `stale`, `last_synced_at`), records cancels for later delivery, removes finished
tasks on request (`mind task rm`: the Hand's row and log, then the snapshot), and realigns every
snapshot of a Hand after each `welcome`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from mind.core import taskstart
from mind.core.admission import use_denial
from mind.core.paging import PAGE_ITEMS, page, parse_task_cursor, task_cursor
from mind.core.registry import Log, StartEnded
from mind.core.snapshots import Snapshot
from mind.core.taskstart import Ending, Facts, Start, Step, TaskStarts
from mind.daemon.host import Host
from mind.daemon.peer import INTERNAL_ERROR, Peer
from mind.daemon.route import Forward
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, ErrorCode, TaskCancelStatus
from protocol.envelope import payload_size
from protocol.ids import new_id
from protocol.messages import (
    Error,
    TaskCancel,
    TaskCancelReply,
    TaskCancelRequest,
    TaskCancelResult,
    TaskGet,
    TaskInfo,
    TaskInventory,
    TaskInventoryPage,
    TaskList,
    TaskListResult,
    TaskLogPage,
    TaskLogs,
    TaskRemove,
    TaskRemoved,
    TaskRemoveRequest,
    TaskStart,
    TaskStatus,
)

log = structlog.get_logger(component="mind.tasks")

LOG_LEVELS = {"task_start_bad_value": "warning"}
ASK_TIMEOUT_S = 10.0
INVENTORY_PAGE = 1000
RECONCILE_MAX_TASKS = 20_000
"""Tasks one reconciliation pass holds in memory at most: a Hand reporting more (a compromised machine
that never says "last page") ends the pass with nothing applied (issue 13). Above any sane
`--max-retained-tasks`."""
RECONCILE_MAX_PAGES = 2 * RECONCILE_MAX_TASKS // INVENTORY_PAGE
RECONCILE_DEADLINE_S = 120.0
"""The whole inventory, every page, within this; else the pass ends with nothing applied."""
HAND_TASKS_QUOTA = RECONCILE_MAX_TASKS
"""Snapshots one Hand may have in the Mind's database: reported ids beyond it are not adopted."""

T = TypeVar("T")
Waiter = tuple[Peer, str]
"""Who waits for a task start's answer: the connection and its request's envelope id."""


class TaskService:
    def __init__(self, mind: Host) -> None:
        """`mind`: the daemon that owns this service (`mind.daemon.host.Host`)."""
        self.mind = mind
        self.starts: TaskStarts[Waiter] = TaskStarts()
        """Task starts in flight to the Hand: who waits for each answer (`mind.core.taskstart`)."""
        self._calls: list[tuple[str, tuple[Any, ...], str | None, asyncio.Future[Any]]] = []
        self._flushing = False

    async def _db(self, fn: Callable[..., Awaitable[T]], *args: Any, hand: str | None = None) -> T:
        """A snapshot-store call on the Mind's database thread, batched with the calls made while
        the previous batch ran: one thread hop for many. At hundreds of starts/s (a snapshot
        written per start, a report per start and per `task_update`) the hops, not SQLite, were the
        Mind's cost. Same meaning as `mind.db`: calls run in order, each its own transaction, and
        the caller resumes after ITS call committed (a start's snapshot is stale before it is sent).

        `hand`: the call applies a report of this Hand. A batched call may reach the database after
        the Hand's disconnect marked its snapshots stale (`mark_hand_stale` does not wait in this
        queue); so if the Hand has no connection when the batch is handed to the database thread,
        its snapshots are marked stale again right after the report: an offline Hand's snapshot
        never looks fresh.
        """
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls.append((fn.__name__, args, hand, fut))  # a method of `Snapshots`, by name (`batch`)
        if not self._flushing:
            self._flushing = True
            try:
                self.mind.spawn(self._flush())  # owned by the Mind: outlives any one client or Hand
            except BaseException:
                self._flushing = False
                self._calls.pop()
                raise
        return await fut

    def _stale_after(self, hand: str | None) -> str | None:
        """(on the loop, as the batch is handed over) the Hand whose snapshots are marked stale
        after its call: the call's Hand if it is offline now (its disconnect's `mark_hand_stale`
        may have run already)."""
        return hand if hand is not None and self.mind.hands.get(hand) is None else None

    async def _flush(self) -> None:
        batch: list[tuple[str, tuple[Any, ...], str | None, asyncio.Future[Any]]] = []
        try:
            while self._calls:
                batch, self._calls = self._calls, []
                calls = [(name, args, self._stale_after(hand)) for name, args, hand, _ in batch]
                results = await self.mind.snapshots.batch(calls)
                for (_, _, _, fut), (ok, value) in zip(batch, results, strict=True):
                    if fut.done():  # its waiter was cancelled
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
                batch = []
        except Exception as exc:  # the database thread is gone: every waiter hears it
            for *_, fut in batch + self._calls:
                if not fut.done():
                    fut.set_exception(exc)
            self._calls = []
        except BaseException:  # cancelled: the Mind stops
            for *_, fut in batch + self._calls:
                fut.cancel()
            self._calls = []
            raise
        finally:
            self._flushing = False  # no await since the last look at `_calls`: nothing is stranded

    # --- start ---

    async def start(self, peer: Peer, id_: str, req: TaskStart) -> None:
        """A client's task start: the decisions are `mind.core.taskstart`'s, performed here. For a
        Hand another node holds (DESIGN §16), the client's scope is checked here and the start is
        relayed to that node for the client: the Hand's node writes the snapshot and starts it."""
        me = _me(peer, req)
        if self._relay_needed(req.hand, req):
            denial = use_denial(peer.scope, req.hand, req.tool)
            if denial is not None:  # the same refusal as a local start's
                why = self.mind.deny(peer, denial.what, **denial.fields)
                peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
                return
            if await self._relay(peer, id_, req, me, req.hand):
                return
        task_id = req.task_id or new_id("t")
        start, step = self.starts.begin(
            (peer, id_), req, task_id, peer.scope, me, time.time(), self._facts(req.hand, task_id)
        )
        await self._drive(start, step)

    def _relay_needed(
        self, hand: str, req: TaskStart | TaskGet | TaskLogs | TaskCancelRequest | TaskRemoveRequest
    ) -> bool:
        """A request for a Hand not connected here, not itself relayed, on a node that routes."""
        m = self.mind
        return m.router is not None and req.on_behalf_of is None and hand not in m.hands

    async def _relay(
        self,
        peer: Peer,
        id_: str,
        req: TaskStart | TaskGet | TaskLogs | TaskCancelRequest | TaskRemoveRequest,
        me: str,
        hand: str,
    ) -> bool:
        """Send `req` for `me` to the live node holding `hand` (its answer goes to the client as
        it comes). False: no other live node holds it (served here from the shared snapshot)."""
        m = self.mind
        if m.router is None or hand in m.hands:
            return False
        link = await m.router.holder(hand)
        if link is None or m.clients.get(peer.conn_id) is not peer:
            return False
        await link.forward(req.model_copy(update={"on_behalf_of": me}), Forward(peer, id_, me, False, hand))
        return True

    async def start_ended(self, a: StartEnded) -> None:
        """Settle the snapshot and answer the waiting clients. If settling fails, they hear
        `internal_error` rather than silence; the failure goes on to the Mind's spawn guard (logged
        with its traceback)."""
        ending, step = self.starts.ended(a)
        await self._drive(ending, step)

    def _facts(self, hand: str, task_id: str) -> Facts:
        """What a start decides on, read at the moment: the Hand's live generation, and whether a
        foreground run holds the id (a task's own start run does not)."""
        live = self.mind.hands.get(hand)
        run = self.mind.registry.get(task_id)
        return Facts(live.gen if live is not None else None, run is not None and run.background is None)

    async def _drive(self, proc: Start[Waiter] | Ending[Waiter], step: Step) -> None:
        """Perform each step of `proc` and feed it the answer of the step's need, until it is done."""
        while True:
            try:
                for act in step.actions:
                    await self._perform(act)
                if step.need is None:
                    return
                value = await self._perform(step.need)
            except Exception:
                for act in proc.failed(error=True):
                    await self._perform(act)
                raise
            except BaseException:
                proc.failed(error=False)
                raise
            step = proc.on_result(value, self._facts(proc.hand, proc.task_id))

    async def _perform(self, act: taskstart.Action | taskstart.Need) -> Any:
        """One action or need of a task start: replies and logs at once, store calls awaited (the
        snapshot writes batched, `_db`), their answer returned."""
        m = self.mind
        if isinstance(act, taskstart.Reply):
            peer, id_ = act.waiter
            peer.outbox.put(act.msg, id_)
        elif isinstance(act, Log):
            getattr(log, LOG_LEVELS.get(act.event, "info"))(act.event, **act.fields)
        elif isinstance(act, taskstart.Denied):
            m.deny(act.waiter[0], act.denial.what, **act.denial.fields)
        elif isinstance(act, taskstart.Admit):
            id_ = act.waiter[1]
            now, wall = time.monotonic(), time.time()
            bg, owner = act.background, act.owner
            m.perform(m.registry.admit(act.task_id, act.exec, None, id_, act.gen, True, now, wall, bg, owner))
        elif isinstance(act, taskstart.Restart):
            m.spawn(self.start(act.waiter[0], act.waiter[1], act.req))
        elif isinstance(act, taskstart.InternalError):
            peer, id_ = act.waiter
            peer.outbox.put(INTERNAL_ERROR, id_)
        elif isinstance(act, taskstart.ReadSnapshot):
            return await m.db(m.snapshots.get, act.task_id)
        elif isinstance(act, taskstart.LookUpHand):
            return await m.creds(m.store.secret, "hand", act.hand) is not None
        elif isinstance(act, taskstart.InsertSnapshot):
            return await self._db(m.snapshots.insert_new, act.snapshot)  # written stale before it is sent
        elif isinstance(act, taskstart.RetryStart):
            return await self._db(m.snapshots.retry_start, act.snapshot)
        elif isinstance(act, taskstart.ReportStart):
            return await self._db(m.snapshots.report, act.hand, act.info, time.time(), hand=act.hand)
        elif isinstance(act, taskstart.FinishStart):
            return await self._db(m.snapshots.finish_start, act.task_id)
        elif isinstance(act, taskstart.DeleteSnapshot):
            return await self._db(m.snapshots.delete, act.task_id)
        else:
            raise AssertionError(f"unknown task-start action {act!r}")
        return None

    # --- queries ---

    def _may(self, peer: Peer, snap: Snapshot, me: str) -> bool:
        return peer.scope.allows_hand(snap.hand) and peer.scope.may_touch(snap.owner, me)

    async def _visible(self, peer: Peer, id_: str, task_id: str, verb: str, me: str) -> Snapshot | None:
        """The snapshot if it exists and this client may `verb` it; otherwise answer and return None."""
        m = self.mind
        snap = await m.db(m.snapshots.get, task_id)
        if snap is None or not peer.scope.allows_hand(snap.hand):
            if snap is not None:  # audited, but answered as if absent: ids on other Hands do not leak
                m.deny(peer, f"{verb} task {task_id}", task_id=task_id)
            peer.outbox.put(Error(code=ErrorCode.UNKNOWN_TASK, message=f"no task {task_id}"), id_)
            return None
        if not self._may(peer, snap, me):
            why = m.deny(peer, f"{verb} task {task_id}", task_id=task_id)
            peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
            return None
        return snap

    async def _refresh(self, snap: Snapshot) -> Snapshot:
        """Ask the Hand (the authority) if it is connected; else return the snapshot as it is."""
        m = self.mind
        live = m.hands.get(snap.hand)
        if live is None or snap.start_pending:
            return snap
        try:
            reply = await m.ask(live, TaskStatus(task_id=snap.task_id), ASK_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            return snap
        if isinstance(reply, TaskInfo) and reply.task_id == snap.task_id:
            new, _ = await m.db(m.snapshots.report, snap.hand, reply, time.time())
            return new or snap
        return snap

    async def get(self, peer: Peer, id_: str, req: TaskGet) -> None:
        me = _me(peer, req)
        snap = await self._visible(peer, id_, req.task_id, "read", me)
        if snap is None:
            return
        if self._relay_needed(snap.hand, req) and await self._relay(peer, id_, req, me, snap.hand):
            return  # its Hand's node asks the Hand
        snap = await self._refresh(snap)
        peer.outbox.put(snap.view(), id_)

    async def list(self, peer: Peer, id_: str, req: TaskList) -> None:
        """One page, newest first, bounded in count and bytes (`mind.core.paging`). A page may hold
        fewer tasks than asked (some not this client's to see, or the byte bound) and still name a
        next one: only `next_after` None says the listing is complete."""
        m = self.mind
        after = None
        if req.after is not None:
            after = parse_task_cursor(req.after)
            if after is None:
                peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message="after: not a cursor of task_list"), id_)
                return
        fetch = min(req.limit, PAGE_ITEMS)
        snaps = await m.db(m.snapshots.list, req.hand, req.state, fetch, after)
        taken, cut = page(
            ((s, s.view()) for s in snaps if self._may(peer, s, peer.ident.label)),
            fetch,
            lambda sv: payload_size(sv[1]),
        )
        last = taken[-1][0] if cut else snaps[-1] if len(snaps) == fetch else None
        cursor = task_cursor(last.created_at, last.task_id) if last is not None else None
        peer.outbox.put(TaskListResult(tasks=[v for _, v in taken], next_after=cursor), id_)

    async def logs(self, peer: Peer, id_: str, req: TaskLogs) -> None:
        m = self.mind
        me = _me(peer, req)
        snap = await self._visible(peer, id_, req.task_id, "read the log of", me)
        if snap is None:
            return
        if self._relay_needed(snap.hand, req) and await self._relay(peer, id_, req, me, snap.hand):
            return  # the log lives on the Hand, connected to another node
        req = req.model_copy(update={"on_behalf_of": None})  # never sent to a Hand
        live = m.hands.get(snap.hand)
        if live is None:
            peer.outbox.put(
                Error(
                    code=ErrorCode.HAND_OFFLINE,
                    message=f"hand {snap.hand!r} is offline: task logs live on the hand; read them when it reconnects",
                ),
                id_,
            )
            return
        try:
            reply = await m.ask(live, req, ASK_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as exc:
            code = ErrorCode.HAND_TIMEOUT if isinstance(exc, TimeoutError) else ErrorCode.HAND_OFFLINE
            peer.outbox.put(Error(code=code, message=f"hand {snap.hand!r} did not answer: {exc or 'timeout'}"), id_)
            return
        if isinstance(reply, (TaskLogPage, Error)):
            peer.outbox.put(reply, id_)
        else:
            peer.outbox.put(Error(code=ErrorCode.INTERNAL_ERROR, message="unexpected answer from the hand"), id_)

    # --- cancel ---

    async def cancel(self, peer: Peer, id_: str, req: TaskCancelRequest) -> None:
        m = self.mind
        snap = await m.db(m.snapshots.get, req.task_id)
        if snap is None or not peer.scope.allows_hand(snap.hand):
            if snap is not None:  # audited, but answered as if absent: ids on other Hands do not leak
                m.deny(peer, f"cancel task {req.task_id}", task_id=req.task_id)
            peer.outbox.put(TaskCancelReply(task_id=req.task_id, status=TaskCancelStatus.UNKNOWN_TASK), id_)
            return
        me = _me(peer, req)
        if not self._may(peer, snap, me):
            why = m.deny(peer, f"cancel task {req.task_id}", task_id=req.task_id)
            peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
            return
        if not snap.terminal and self._relay_needed(snap.hand, req):
            if await self._relay(peer, id_, req, me, snap.hand):
                return  # delivered by the Hand's node, at once
        if snap.terminal:
            peer.outbox.put(
                TaskCancelReply(task_id=req.task_id, status=TaskCancelStatus.ALREADY_DONE, view=snap.view()), id_
            )
            return
        live = m.hands.get(snap.hand)
        if live is not None and not snap.start_pending:
            try:
                reply = await m.ask(
                    live, TaskCancel(task_id=req.task_id, reason=CancelReason.USER_REQUESTED), ASK_TIMEOUT_S
                )
            except (TimeoutError, ConnectionError):
                reply = None
            if isinstance(reply, TaskCancelResult):
                if reply.task is not None and reply.task.task_id == req.task_id:  # never adopt another id
                    new, _ = await m.db(m.snapshots.report, snap.hand, reply.task, time.time(), False)
                    snap = new or snap
                log.info(
                    AuditEvent.TASK_CANCEL_DELIVERED, task_id=req.task_id, hand=snap.hand, status=reply.status.value
                )
                peer.outbox.put(TaskCancelReply(task_id=req.task_id, status=reply.status, view=snap.view()), id_)
                return
        # Offline (or no answer): record it; the reconciliation pass delivers it after reconnect.
        snap = await m.db(m.snapshots.set_cancel_pending, req.task_id, CancelReason.USER_REQUESTED.value) or snap
        log.info(AuditEvent.TASK_CANCEL_RECORDED, task_id=req.task_id, hand=snap.hand)
        peer.outbox.put(
            TaskCancelReply(task_id=req.task_id, status=TaskCancelStatus.PENDING_DELIVERY, view=snap.view()), id_
        )

    # --- remove ---

    async def remove(self, peer: Peer, id_: str, req: TaskRemoveRequest) -> None:
        """`mind task rm`: forget a finished task on its Hand (its row and its log: the authority
        first, `TaskRemove`), then here (its snapshot), so it no longer counts against the Hand's
        retention quota; audited on both sides. The Hand decides whether it may go (only once it
        has ended and its outcome is on disk) and its refusal is the answer. Its Hand must be
        connected (through any node): the row and the log live there, and removing only the
        snapshot would be undone by the next reconciliation, which adopts the row back. A Hand
        that no longer has the task (retention forgot it, or an earlier removal's answer was
        lost) leaves only the snapshot to remove."""
        m = self.mind
        me = _me(peer, req)
        snap = await self._visible(peer, id_, req.task_id, "remove", me)
        if snap is None:
            return
        if self._relay_needed(snap.hand, req) and await self._relay(peer, id_, req, me, snap.hand):
            return  # its Hand's node asks the Hand
        if snap.start_pending:
            why = f"task {req.task_id} is still being started on hand {snap.hand!r}: nothing was removed"
            peer.outbox.put(Error(code=ErrorCode.NOT_ALLOWED, message=why), id_)
            return
        live = m.hands.get(snap.hand)
        if live is None:
            why = (
                f"hand {snap.hand!r} is offline: task {req.task_id}'s record and log live on the hand, so nothing "
                "was removed; remove it once the hand reconnects"
            )
            peer.outbox.put(Error(code=ErrorCode.HAND_OFFLINE, message=why), id_)
            return
        try:
            reply = await m.ask(live, TaskRemove(task_id=req.task_id), ASK_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as exc:
            code = ErrorCode.HAND_TIMEOUT if isinstance(exc, TimeoutError) else ErrorCode.HAND_OFFLINE
            why = (
                f"hand {snap.hand!r} did not answer: {exc or 'timeout'}; whether it removed task {req.task_id} is "
                f"not known here (`mind task rm {req.task_id}` again is safe)"
            )
            peer.outbox.put(Error(code=code, message=why), id_)
            return
        if isinstance(reply, TaskInfo) and reply.task_id == req.task_id:
            removed: TaskInfo | None = reply
        elif isinstance(reply, Error) and reply.code is ErrorCode.UNKNOWN_TASK:
            removed = None  # the Hand has nothing under the id: only the snapshot is left
        elif isinstance(reply, Error):
            peer.outbox.put(reply, id_)  # not ended (or the Hand failed): its own words
            return
        else:
            peer.outbox.put(Error(code=ErrorCode.INTERNAL_ERROR, message="unexpected answer from the hand"), id_)
            return
        gone = await m.db(m.snapshots.remove, req.task_id, snap.hand)
        log.info(
            AuditEvent.TASK_REMOVED,
            task_id=req.task_id,
            hand=snap.hand,
            client=me,
            state=(removed.state if removed is not None else snap.state).value,
            hand_had_it=removed is not None,
            snapshot_removed=gone is not None,
        )
        peer.outbox.put(TaskRemoved(task_id=req.task_id, hand=snap.hand, task=removed), id_)

    # --- pushes and reconciliation ---

    async def on_update(self, peer: Peer, info: TaskInfo) -> None:
        """A Hand's push about one task. Only tasks the Mind knows are updated: an id it never asked
        about is not adopted (a hostile Hand could fill the database or squat ids; reconciliation
        adopts, within a quota, what the Hand's inventory reports)."""
        m = self.mind
        snap, what = await self._db(
            m.snapshots.report, peer.ident.label, info, time.time(), False, hand=peer.ident.label
        )
        if what == "foreign":
            log.warning(AuditEvent.TASK_UPDATE_FOREIGN, hand=peer.ident.label, gen=peer.gen, task_id=info.task_id)
        elif what == "unknown":
            m.metrics.foreign.inc()
            log.warning(AuditEvent.TASK_UPDATE_UNSOLICITED, hand=peer.ident.label, gen=peer.gen, task_id=info.task_id)
        else:
            log.debug("task_update", hand=peer.ident.label, task_id=info.task_id, state=info.state.value, applied=what)

    async def reconcile(self, peer: Peer) -> None:
        """After each `welcome`: realign every snapshot of this Hand with its database (DESIGN §8)."""
        m = self.mind
        hand, gen = peer.ident.label, peer.gen
        t0 = time.monotonic()
        since = time.time()  # a report applied after this is newer than any page of the inventory
        rows: dict[str, TaskInfo] = {}
        after: str | None = None
        pages = 0
        try:
            # Bounded in pages, tasks and time (issue 13): a Hand that never says "last page", repeats
            # a cursor or sends oversized pages ends the pass with nothing applied.
            async with asyncio.timeout(RECONCILE_DEADLINE_S):
                while True:
                    page = await m.ask(peer, TaskInventory(after=after, limit=INVENTORY_PAGE), 30.0)
                    if isinstance(page, Error):
                        log.warning("reconcile_refused", hand=hand, gen=gen, code=page.code.value, reason=page.message)
                        return
                    if not isinstance(page, TaskInventoryPage):
                        log.warning("reconcile_bad_page", hand=hand, gen=gen, type=page.TYPE)
                        return
                    pages += 1
                    if len(page.tasks) > INVENTORY_PAGE or (
                        page.next_after is not None and after is not None and page.next_after <= after
                    ):
                        log.warning("reconcile_bad_page", hand=hand, gen=gen, type=page.TYPE, tasks=len(page.tasks))
                        return
                    for t in page.tasks:
                        rows[t.task_id] = t
                    if len(rows) > RECONCILE_MAX_TASKS or (pages >= RECONCILE_MAX_PAGES and page.next_after):
                        log.warning(
                            "reconcile_aborted",
                            hand=hand,
                            gen=gen,
                            error="too_many_tasks",
                            pages=pages,
                            tasks=len(rows),
                        )
                        return
                    if page.next_after is None or not page.tasks:
                        break
                    after = page.next_after
        except (TimeoutError, ConnectionError) as exc:
            log.warning("reconcile_aborted", hand=hand, gen=gen, error=type(exc).__name__, pages=pages, tasks=len(rows))
            return
        plan = await m.db(m.snapshots.reconcile, hand, rows, time.time(), since, HAND_TASKS_QUOTA)
        if plan.over_quota:
            log.warning("reconcile_over_quota", hand=hand, gen=gen, not_adopted=plan.over_quota, quota=HAND_TASKS_QUOTA)
        delivered = 0
        for task_id, _reason in plan.cancels:
            try:
                reply = await m.ask(
                    peer, TaskCancel(task_id=task_id, reason=CancelReason.USER_REQUESTED), ASK_TIMEOUT_S
                )
            except (TimeoutError, ConnectionError):
                break
            if isinstance(reply, TaskCancelResult):
                delivered += 1
                if reply.task is not None and reply.task.task_id == task_id:  # never adopt a reply's other id
                    await m.db(m.snapshots.report, hand, reply.task, time.time(), False)
                await m.db(m.snapshots.clear_cancel_pending, task_id)
        for tid in plan.foreign:
            log.warning(AuditEvent.RECONCILE_FOREIGN_TASK, hand=hand, gen=gen, task_id=tid)
        m.metrics.reconcile_seconds.observe(time.monotonic() - t0)
        log.info(
            "reconcile_done",
            hand=hand,
            gen=gen,
            hand_tasks=len(rows),
            pages=pages,
            updated=len(plan.updated),
            adopted=len(plan.adopted),
            lost=len(plan.lost),
            never_stored=len(plan.never_stored),
            unchanged=plan.unchanged,
            foreign=len(plan.foreign),
            cancels_delivered=delivered,
            duration_ms=round((time.monotonic() - t0) * 1000, 1),
        )


def _me(peer: Peer, req: TaskStart | TaskGet | TaskLogs | TaskCancelRequest | TaskRemoveRequest) -> str:
    """Whose request: the client relayed by a node (`on_behalf_of`; the dispatcher refused it
    from anyone but a node) or the sender."""
    return req.on_behalf_of or peer.ident.label
