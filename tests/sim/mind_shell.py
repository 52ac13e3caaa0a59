"""The Mind, simulated: the REAL `mind.core.registry.RunRegistry`, the REAL snapshot store
(`mind.store.snapshots.SnapshotStore` on SQLite in memory, its scripts and the rules of
`mind.core.snapshots`: `sim.snapshot_table`), the REAL task-start decisions of
`mind.core.taskstart` (driven here as the task service drives them) and the REAL scope verdicts of
`mind.core.admission`, inside a synchronous copy of the asyncio glue around them.
`tests/sim/test_mirrors.py` fails when the mirrored classes of `mind/daemon/` change without this
copy being checked again.

What is mirrored, and from where (keep in step with the real files):
- `mind/daemon/server.py` (`Mind`): `perform` (SendToHand only onto the live connection of that
  generation), `ask`, the ticker, and restart (`mark_all_stale` before serving).
- `mind/daemon/connections.py` (`Connections`): `serve_hand` (a newer connection replaces the older
  one at once: its runs `lost`; the older one's pending asks fail when its reader ends), the end of
  a Hand connection (pending asks fail, runs `lost`, snapshots stale), the end of a client's.
- `mind/daemon/dispatch.py` (`Dispatch`): `on_hand_message`, `on_client_message`, `_admit_offline`.
- `mind/daemon/taskservice.py`: `start` and `start_ended` (`_drive`, `_perform`: the decisions are
  the core's), `get` (`_refresh`), `cancel`, `on_update` and `reconcile`, as generators that yield
  where the real coroutines await (`m.db`, `m.ask`).

A Mind crash is the loss of this object: its registry, asks, starts in flight and connections.
What survives is outside it: the snapshot store and the generation counter (both on disk).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.network import Link
from sim.runtime import Fut

from mind.core import taskstart
from mind.core.admission import RunNames
from mind.core.registry import Action, FrameToClient, FrameToHand, Log, SendToClient, SendToHand, StartEnded
from mind.core.routing import Facts, Kind, Route, decide
from mind.core.scope import FULL
from mind.core.snapshots import Snapshot
from mind.daemon.taskservice import ASK_TIMEOUT_S
from protocol.codes import CancelReason, ErrorCode, TaskCancelStatus
from protocol.messages import (
    Accepted,
    Background,
    CancelResult,
    CancelRunResult,
    Error,
    Exec,
    Message,
    Progress,
    Rejected,
    Result,
    Rpc,
    Started,
    StreamData,
    StreamNumbers,
    TaskCancel,
    TaskCancelReply,
    TaskCancelResult,
    TaskGet,
    TaskInfo,
    TaskInventory,
    TaskInventoryPage,
    TaskStart,
    TaskStatus,
    TaskUpdate,
)

if TYPE_CHECKING:
    from sim.simulation import World

REPLY_TYPES = (TaskInfo, TaskCancelResult, TaskInventoryPage)
STORE_CALLS = {taskstart.ReadSnapshot: "get", taskstart.FinishStart: "finish_start", taskstart.DeleteSnapshot: "delete"}


@dataclass(eq=False)
class HandPeer:
    """`mind.daemon.peer.Peer` of a Hand connection."""

    label: str
    gen: int
    link: Link
    pending: dict[str, Fut] = field(default_factory=dict)

    def fail_pending(self) -> None:
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            fut.fail(ConnectionError("hand disconnected"))


class SimMind:
    def __init__(self, world: World) -> None:
        self.world = world
        self._gone_clients: set[str] = set()
        """Client connections that ended (a request answered after a database hop checks it)."""
        self._admitting: dict[str, Fut] = {}
        """Named runs whose admission waits on a database hop (`Peer.admitting`)."""
        self._names: dict[str, RunNames] = {}
        """Each client connection's run names (`Peer.names`; the door, not modelled, makes them
        with a random prefix: here the connection's id is the prefix)."""
        self.clock = world.clock
        self.life = world.events["mind_start"]
        """Which life of the Mind this is: run ids are only unique within one registry."""
        self.loop = world.new_loop("mind")
        self.registry = world.rules.registry_cls()
        self.snapshots = world.snapshots
        self.hands: dict[str, HandPeer] = {}
        """The live connection of each Hand (`Mind.hands`)."""
        self.hands_changed = True
        """Set when a Hand connects or goes (the checker then looks at every snapshot)."""
        self.peers: dict[Link, HandPeer] = {}
        """Every Hand connection whose reader still runs, replaced ones included."""
        self.starts: taskstart.TaskStarts[tuple[str, str]] = taskstart.TaskStarts()
        self.snapshots.mark_all_stale()  # Mind.run(): before serving anything

    # --- plumbing -------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.now

    def db(self, fn: Any, *args: Any) -> Fut:
        """`await m.db(fn, *args)`: one database thread, so submission order is execution order."""
        return self.loop.io(fn, *args)

    def ask(self, peer: HandPeer, msg: Message, timeout: float) -> Fut:
        """`Mind.ask`: send with a fresh envelope id, wait for the reply with that id, or time out."""
        id_ = self.world.next_id("m")
        fut = Fut()
        peer.pending[id_] = fut
        peer.link.send(peer.link.down, msg, id_, self.now)

        def expire() -> None:
            if peer.pending.pop(id_, None) is fut:
                fut.fail(TimeoutError())

        timer = self.loop.call_at(self.now + timeout, expire, label="ask_timeout")
        fut.then(lambda _f: timer.cancel())
        return fut

    def perform(self, actions: list[Action]) -> None:
        check = self.world.checker
        for a in actions:
            if isinstance(a, (SendToHand, SendToClient)) and isinstance(a.msg, StreamNumbers):
                continue  # the peers' channels keep them; the simulated ends name streams as before
            if isinstance(a, SendToHand):
                peer = self.hands.get(a.hand)
                if isinstance(a.msg, Rpc):
                    check.on_rpc_sent(self.life, a.msg.run_id, a.gen)
                if peer is not None and peer.gen == a.gen:
                    peer.link.send(peer.link.down, a.msg, None, self.now)
            elif isinstance(a, SendToClient):
                self.world.to_client(a.client, a.req_id, a.msg)
            elif isinstance(a, FrameToHand):  # a data frame, delivered as the chunk the Hand's channel makes of it
                peer = self.hands.get(a.hand)
                if peer is not None and peer.gen == a.gen:
                    peer.link.send(peer.link.down, _chunk(a), None, self.now)
            elif isinstance(a, FrameToClient):
                run = self.registry.get(a.run_id)
                if run is not None:
                    self.world.to_client(a.client, run.req_id, _chunk(a))
            elif isinstance(a, StartEnded):
                check.on_start_ended(a)
                self.loop.spawn(self.start_ended(a), f"start_ended {a.run_id}")
            elif isinstance(a, Log):
                check.on_mind_log(self.life, a)

    def _admit(
        self,
        run_id: str,
        req: Exec,
        client: str | None,
        req_id: str,
        gen: int | None,
        known: bool,
        background: Background | None = None,
    ) -> None:
        self.perform(self.registry.admit(run_id, req, client, req_id, gen, known, self.now, self.now, background))
        run = self.registry.get(run_id)
        if run is not None and not run.terminal:  # the ticker would notice the Mind's deadline then
            self.loop.call_at(run.mind_deadline, self.tick, label="mind_deadline")

    def tick(self) -> None:
        self.perform(self.registry.on_tick(self.now, self.now))

    # --- hand connections (Connections.serve_hand) --------------------------------------------

    def hand_connected(self, link: Link) -> None:
        label = link.hand
        peer = HandPeer(label, link.gen, link)
        self.peers[link] = peer
        old = self.hands.get(label)
        self.hands[label] = peer
        self.hands_changed = True
        if old is not None:  # the newer connection wins at once
            self.perform(self.registry.on_hand_gone(label, old.gen, self.now, self.now))
            self.world.mind_close(old.link, "replaced")
        self.loop.spawn(self.reconcile(peer), f"reconcile {label} gen{link.gen}")

    def hand_link_ended(self, link: Link) -> None:
        """The reader of `link` ended (closed, reset, replaced, or its keepalive expired)."""
        peer = self.peers.pop(link, None)
        if peer is None:
            return
        peer.fail_pending()
        if self.hands.get(link.hand) is peer:
            del self.hands[link.hand]
            self.hands_changed = True
            self.perform(self.registry.on_hand_gone(link.hand, link.gen, self.now, self.now))
            self.db(self.snapshots.mark_hand_stale, link.hand)

    def on_hand_message(self, link: Link, env_id: str | None, msg: Message) -> None:
        """`Dispatch.on_hand_message`."""
        peer = self.peers.get(link)
        assert peer is not None, f"a frame on {link} whose reader has ended"
        label, gen = peer.label, peer.gen
        r = self.registry
        check = self.world.checker
        now = self.now
        if isinstance(msg, Progress):
            before = check.run_state(r, msg.run_id)
            acts = r.on_progress(msg, label, gen)
            check.on_progress(r, msg.run_id, before, acts)
        elif isinstance(msg, (Accepted, Started, Rejected, Result, CancelResult)):
            before = check.run_state(r, msg.run_id)
            if isinstance(msg, Accepted):
                acts = r.on_accepted(msg.run_id, label, gen, now)
            elif isinstance(msg, Started):
                acts = r.on_started(msg.run_id, label, gen, now)
            elif isinstance(msg, Rejected):
                acts = r.on_rejected(msg.run_id, label, gen, msg.code, msg.message, now, now)
            elif isinstance(msg, Result):
                acts = r.on_result(msg, label, gen, now, now)
            else:
                acts = r.on_cancel_result(msg.run_id, label, gen, msg.status, now, now)
            check.on_hand_input(self.life, r, msg, label, gen, before)
        elif env_id is not None and env_id in peer.pending:
            check.on_reply(label, msg)
            peer.pending.pop(env_id).resolve(msg)
            return
        elif isinstance(msg, TaskUpdate):
            self.loop.spawn(self.on_update(peer, msg.task), f"on_update {msg.task.task_id}")
            return
        elif isinstance(msg, REPLY_TYPES) and env_id is not None:
            check.on_reply(label, msg)
            return  # a late reply whose ask gave up
        elif isinstance(msg, Error):
            return
        else:
            raise AssertionError(f"a hand may not send {msg.TYPE} here")
        self.perform(acts)

    # --- clients (Connections.serve_client, Dispatch.on_client_message) -----------------------

    def client_gone(self, conn: str) -> None:
        self._gone_clients.add(conn)
        self.perform(self.registry.on_client_gone(conn, self.now, self.now))

    def on_exec(self, conn: str, req_id: str, msg: Exec) -> str:
        if msg.run_id is not None:  # `Dispatch._exec`: the REAL rule of what a connection may name
            problem = self._names.setdefault(conn, RunNames(conn)).take(msg.run_id)
            assert problem is None, f"a simulated client named a run it may not: {problem}"
        run_id = msg.run_id or self.world.next_id("r")
        live = self.hands.get(msg.hand)
        if decide(Facts(Kind.EXEC, here=live is not None)) is Route.LOOKUP:
            # `_admit_offline`: the credentials table says which, after a database hop
            if msg.run_id is not None:
                self._admitting[run_id] = Fut()
            self.loop.spawn(self._admit_offline(conn, req_id, msg, run_id), "admit offline")
        else:
            assert live is not None
            self._admit(run_id, msg, conn, req_id, live.gen, True)
        return run_id

    def _admit_offline(self, conn: str, req_id: str, msg: Exec, run_id: str) -> Generator[Any, Any, None]:
        try:
            known = yield self.db(lambda: msg.hand in self.world.hand_labels)
            if conn in self._gone_clients:  # the client left meanwhile: nothing is admitted
                return
            live = self.hands.get(msg.hand)  # it may have connected meanwhile: then the run goes to it
            self._admit(run_id, msg, conn, req_id, live.gen if live else None, known or live is not None)
        finally:
            if (done := self._admitting.pop(run_id, None)) is not None:
                done.resolve()

    def on_cancel_run(self, conn: str, req_id: str, run_id: str) -> None:
        admitting = self._admitting.get(run_id)
        run = self.registry.get(run_id)
        route = decide(Facts(Kind.CANCEL, here=run is not None, admitting=admitting is not None))
        if route is Route.AFTER_ADMISSION:  # `Dispatch._after_admission`
            assert admitting is not None
            admitting.then(lambda _: self.on_cancel_run(conn, req_id, run_id))
            return
        status, acts = self.registry.on_cancel(run_id, CancelReason.USER_REQUESTED, self.now, self.now)
        run = self.registry.get(run_id)
        if route is Route.UNKNOWN:
            self.world.to_client(conn, req_id, Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {run_id}"))
        else:
            self.world.to_client(conn, req_id, CancelRunResult(run_id=run_id, status=status, state=run.state))
        self.perform(acts)

    def on_task_start(self, conn: str, req_id: str, msg: TaskStart) -> None:
        self.loop.spawn(self.start(conn, req_id, msg), f"start {msg.task_id}")

    def on_task_get(self, conn: str, req_id: str, msg: TaskGet) -> None:
        self.loop.spawn(self.get(conn, req_id, msg), f"get {msg.task_id}")

    def on_task_cancel(self, conn: str, req_id: str, task_id: str) -> None:
        self.loop.spawn(self.cancel(conn, req_id, task_id), f"cancel {task_id}")

    # --- taskservice ----------------------------------------------------------------------------

    def start(self, conn: str, req_id: str, req: TaskStart) -> Generator[Any, Any, None]:
        task_id = req.task_id or self.world.next_id("tm")
        # the simulated clients hold the full scope: the REAL checks, which always pass here
        facts = self._facts(req.hand, task_id)
        start, step = self.starts.begin((conn, req_id), req, task_id, FULL, conn, self.now, facts)
        yield from self._drive(start, step)

    def start_ended(self, a: StartEnded) -> Generator[Any, Any, None]:
        ending, step = self.starts.ended(a)
        yield from self._drive(ending, step)

    def _facts(self, hand: str, task_id: str) -> taskstart.Facts:
        live, run = self.hands.get(hand), self.registry.get(task_id)
        return taskstart.Facts(live.gen if live else None, run is not None and run.background is None)

    def _drive(self, proc: Any, step: taskstart.Step) -> Generator[Any, Any, None]:
        """`TaskService._drive` (a store call that fails is not simulated)."""
        while True:
            for act in step.actions:
                yield from self._perform_start(act)
            if step.need is None:
                return
            value = yield from self._perform_start(step.need)
            step = proc.on_result(value, self._facts(proc.hand, proc.task_id))

    def _perform_start(self, act: Any) -> Generator[Any, Any, Any]:
        """`TaskService._perform`: every store call on the one database thread."""
        if isinstance(act, taskstart.Reply):
            self.world.to_client(act.waiter[0], act.waiter[1], act.msg)
        elif isinstance(act, taskstart.Admit):
            self._admit(act.task_id, act.exec, None, act.waiter[1], act.gen, True, act.background)
        elif isinstance(act, taskstart.Restart):
            self.loop.spawn(self.start(act.waiter[0], act.waiter[1], act.req), f"start {act.req.task_id} again")
        elif isinstance(act, taskstart.LookUpHand):
            return (yield self.db(lambda: act.hand in self.world.hand_labels))
        elif isinstance(act, taskstart.ReportStart):
            return (yield self.db(self.snapshots.report, act.hand, act.info, self.now))
        elif isinstance(act, (taskstart.InsertSnapshot, taskstart.RetryStart)):
            insert = isinstance(act, taskstart.InsertSnapshot)
            return (yield self.db(self.snapshots.insert_new if insert else self.snapshots.retry_start, act.snapshot))
        elif isinstance(act, (taskstart.ReadSnapshot, taskstart.FinishStart, taskstart.DeleteSnapshot)):
            call = STORE_CALLS[type(act)]
            return (yield self.db(getattr(self.snapshots, call), act.task_id))
        return None  # logs, denials (never, with the full scope)

    def _refresh(self, snap: Snapshot) -> Generator[Any, Any, Snapshot]:
        live = self.hands.get(snap.hand)
        if live is None or snap.start_pending:
            return snap
        try:
            reply = yield self.ask(live, TaskStatus(task_id=snap.task_id), ASK_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            return snap
        if isinstance(reply, TaskInfo) and reply.task_id == snap.task_id:
            new, _ = yield self.db(self.snapshots.report, snap.hand, reply, self.now)
            return new or snap
        return snap

    def get(self, conn: str, req_id: str, req: TaskGet) -> Generator[Any, Any, None]:
        snap = yield self.db(self.snapshots.get, req.task_id)
        if snap is None:
            self.world.to_client(conn, req_id, Error(code=ErrorCode.UNKNOWN_TASK, message=f"no task {req.task_id}"))
            return
        snap = yield from self._refresh(snap)
        self.world.to_client(conn, req_id, snap.view())

    def cancel(self, conn: str, req_id: str, task_id: str) -> Generator[Any, Any, None]:
        snap = yield self.db(self.snapshots.get, task_id)
        if snap is None:
            self.world.to_client(conn, req_id, TaskCancelReply(task_id=task_id, status=TaskCancelStatus.UNKNOWN_TASK))
            return
        if snap.terminal:
            self.world.to_client(
                conn, req_id, TaskCancelReply(task_id=task_id, status=TaskCancelStatus.ALREADY_DONE, view=snap.view())
            )
            return
        live = self.hands.get(snap.hand)
        if live is not None and not snap.start_pending:
            try:
                reply = yield self.ask(
                    live, TaskCancel(task_id=task_id, reason=CancelReason.USER_REQUESTED), ASK_TIMEOUT_S
                )
            except (TimeoutError, ConnectionError):
                reply = None
            if isinstance(reply, TaskCancelResult):
                if reply.task is not None and reply.task.task_id == task_id:  # never adopts another id
                    new, _ = yield self.db(self.snapshots.report, snap.hand, reply.task, self.now, False)
                    snap = new or snap
                self.world.to_client(
                    conn, req_id, TaskCancelReply(task_id=task_id, status=reply.status, view=snap.view())
                )
                return
        snap = (yield self.db(self.snapshots.set_cancel_pending, task_id, CancelReason.USER_REQUESTED.value)) or snap
        self.world.to_client(
            conn, req_id, TaskCancelReply(task_id=task_id, status=TaskCancelStatus.PENDING_DELIVERY, view=snap.view())
        )

    def on_update(self, peer: HandPeer, info: TaskInfo) -> Generator[Any, Any, None]:
        yield self.db(self.snapshots.report, peer.label, info, self.now, False)  # never adopts (issue 13)

    def reconcile(self, peer: HandPeer) -> Generator[Any, Any, None]:
        """After each `welcome`: realign every snapshot of this Hand with its database (DESIGN §8)."""
        hand = peer.label
        since = self.now
        rows: dict[str, TaskInfo] = {}
        after: str | None = None
        try:
            while True:
                page = yield self.ask(peer, TaskInventory(after=after, limit=self.world.config.inventory_page), 30.0)
                if not isinstance(page, TaskInventoryPage):
                    return
                for t in page.tasks:
                    rows[t.task_id] = t
                if page.next_after is None or not page.tasks:
                    break
                after = page.next_after
        except (TimeoutError, ConnectionError):
            return
        plan = yield self.db(self.snapshots.reconcile, hand, rows, self.now, since)
        self.world.checker.on_reconciled(hand, peer.gen, plan)
        for task_id, _reason in plan.cancels:
            try:
                reply = yield self.ask(
                    peer, TaskCancel(task_id=task_id, reason=CancelReason.USER_REQUESTED), ASK_TIMEOUT_S
                )
            except (TimeoutError, ConnectionError):
                break
            if isinstance(reply, TaskCancelResult):
                if reply.task is not None and reply.task.task_id == task_id:  # never adopts another id
                    yield self.db(self.snapshots.report, hand, reply.task, self.now, False)
                yield self.db(self.snapshots.clear_cancel_pending, task_id)


def _chunk(a: FrameToHand | FrameToClient) -> StreamData:
    """A relayed data frame as the receiving end's channel reads it (`Channel.receive_chunk`)."""
    return StreamData.model_construct(
        run_id=a.run_id, stream=a.stream, offset=a.offset, data=bytes(a.payload), eof=a.eof
    )
