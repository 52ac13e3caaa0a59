"""What the Mind does with each frame an authenticated peer sends: a Hand's reports to the run
registry (or to the ask that waits for them), a client's requests to the registry, the task service
or the views, and a failure while serving one frame to that frame's request only.

Fast and synchronous where it can be (the registry decides at once, and its actions are performed
before the next frame is read); anything that waits on a store or a Hand runs on the connection's
task group, guarded, so one slow or failing request holds up nothing else (`Peer.spawn`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import structlog

from mind.core.admission import Denial, args_problem, touch_denial, use_denial
from mind.core.budgets import stream_budget_problem, stream_windows, window_problem
from mind.core.fleetids import FleetOwners
from mind.core.nodes import request_owner
from mind.core.routing import Facts, Kind, Route, after_find, after_lookup, decide
from mind.core.runs import Run
from mind.daemon.host import Host
from mind.daemon.peer import INTERNAL_ERROR, Peer
from mind.daemon.recordingviews import RecordingViews
from mind.daemon.route import ROUTED_NUMBER_BASE, Forward, RoutedRun
from mind.daemon.taskservice import TaskService
from mind.daemon.views import Views
from protocol import frames
from protocol.codes import CancelReason, ErrorCode, RejectCode
from protocol.envelope import Envelope
from protocol.errors import ProtocolError
from protocol.ids import new_id
from protocol.messages import (
    Accepted,
    Attach,
    CancelResult,
    CancelRun,
    CancelRunResult,
    ConnectedNames,
    Detach,
    Error,
    Exec,
    FleetOpen,
    FleetOpened,
    GetRecording,
    GetRun,
    GetStatus,
    ListHands,
    ListRecordings,
    ListRuns,
    Message,
    Progress,
    Rejected,
    Resize,
    Result,
    RunExited,
    RunsPresent,
    SelectHands,
    Started,
    StreamAck,
    TaskCancelRequest,
    TaskCancelResult,
    TaskGet,
    TaskInfo,
    TaskInventoryPage,
    TaskList,
    TaskLogPage,
    TaskLogs,
    TaskRemoveRequest,
    TaskStart,
    TaskUpdate,
    VerifyRecordings,
    WhichConnected,
)

log = structlog.get_logger(component="mind")

REPLY_TYPES = (TaskInfo, TaskLogPage, TaskCancelResult, TaskInventoryPage)


class Dispatch:
    def __init__(self, mind: Host, tasks: TaskService, views: Views) -> None:
        self.mind = mind
        self.tasks = tasks
        self.views = views
        self.recordings = RecordingViews(mind)
        self.fleets = FleetOwners()
        """Which client opened each fleet id (`fleet_open`): only its runs may be members."""
        self._handlers = self._handler_table()

    # --- hands ---

    def on_hand_message(self, peer: Peer, id_: str | None, msg: Message) -> None:
        m = self.mind
        label, gen = peer.ident.label, peer.gen
        now, wall = time.monotonic(), time.time()
        r = m.registry
        if isinstance(msg, Progress):
            acts = r.on_progress(msg, label, gen)
        elif isinstance(msg, StreamAck):
            acts = r.on_hand_stream(msg, label, gen)
        elif isinstance(msg, Accepted):
            acts = r.on_accepted(msg.run_id, label, gen, now)
        elif isinstance(msg, Started):
            acts = r.on_started(msg.run_id, label, gen, now)
        elif isinstance(msg, Rejected):
            acts = r.on_rejected(msg.run_id, label, gen, msg.code, msg.message, now, wall)
        elif isinstance(msg, Result):
            acts = r.on_result(msg, label, gen, now, wall)
        elif isinstance(msg, CancelResult):
            acts = r.on_cancel_result(msg.run_id, label, gen, msg.status, now, wall)
        elif isinstance(msg, RunsPresent):  # after `welcome` on a new generation (DESIGN §15)
            acts = r.on_runs_present(label, gen, msg, now, wall)
        elif isinstance(msg, RunExited):
            acts = r.on_exited(msg, label, gen)
        elif id_ is not None and peer.answered(id_, msg):
            return
        elif isinstance(msg, TaskUpdate):
            peer.spawn(self.tasks.on_update(peer, msg.task))
            return
        elif isinstance(msg, REPLY_TYPES) and id_ is not None:
            # A reply whose request already gave up (timeout): harmless, and not a protocol error.
            log.info("late_reply", hand=label, gen=gen, type=msg.TYPE)
            return
        elif isinstance(msg, Error):
            log.warning("hand_error", hand=label, gen=gen, code=msg.code.value, reason=msg.message)
            return
        else:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a hand may not send {msg.TYPE} here")
        m.perform(acts)

    # --- data frames (DESIGN §11b) ---

    def on_frame(self, peer: Peer, data: bytes | str) -> None:
        """A data frame from a Hand or a client: its header is read and checked by the registry
        against the stream's relay; the payload is forwarded as the `memoryview` of the received
        buffer, never decoded or copied into a message. `ProtocolError` ends the connection."""
        number, offset, eof, payload = frames.decode(data)  # type: ignore[arg-type]
        r = self.mind.registry
        if number >= ROUTED_NUMBER_BASE and self.mind.router is not None and peer.ident.role == "client":
            self.mind.router.from_client_frame(peer, number, offset, eof, payload)  # a relayed run's stdin
            return
        if peer.ident.role == "hand":
            acts = r.on_hand_frame(peer.ident.label, peer.gen, number, offset, eof, payload)
        else:
            acts = r.on_client_frame(peer.conn_id, number, offset, eof, payload)
        if acts:
            self.mind.perform(acts)

    # --- clients ---

    def on_client_message(self, peer: Peer, id_: str | None, msg: Message) -> None:
        """A client's frame: stream flow control (no answer), else a request served by the handler
        of its type (`_handlers`), each asking `mind.core.routing` once where it is served."""
        m = self.mind
        if isinstance(msg, (StreamAck, Resize)):  # about a run's bytes, not a request: no answer
            if m.router is not None and m.router.from_client_stream(peer, msg):
                return  # a relayed run's: its holding node's flow control
            if isinstance(msg, Resize) and m.recorder is not None and msg.run_id in m.recorder.live:
                run = m.registry.get(msg.run_id)
                if run is not None and run.client == peer.conn_id:
                    m.recorder.resize(msg.run_id, msg.cols, msg.rows)
            m.perform(m.registry.on_client_stream(msg, peer.conn_id))
            return
        if id_ is None:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"a {msg.TYPE} request needs an envelope id")
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a client may not send {msg.TYPE}")
        if isinstance(msg, (Exec, TaskStart)) and (problem := args_problem(msg.args)) is not None:
            # before any digest, record or re-encode: their cost grows with the values
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message=f"invalid {msg.TYPE}: {problem}"), id_)
            return
        me = request_owner(peer.ident.label, getattr(msg, "on_behalf_of", None), m.router is not None)
        if me is None:  # a client posing as a node relaying another's request: refused, never obeyed
            other = str(getattr(msg, "on_behalf_of", ""))
            self._refuse(peer, id_, Denial("act on behalf of another client", {"on_behalf_of": other}))
            return
        handler(peer, id_, msg, me)

    def _handler_table(self) -> dict[type[Message], Callable[[Peer, str, Any, str], None]]:
        """Each request type a client may send, and who serves it (built once, looked up per frame)."""
        return {
            Exec: self._exec,
            CancelRun: self._touch,
            GetRun: self._touch,
            Attach: self._attach,
            Detach: self._detach,
            ListHands: lambda peer, id_, msg, me: peer.spawn(self.views.list_hands(peer, id_, msg), reply_to=id_),
            ListRuns: self._list_runs,
            SelectHands: lambda peer, id_, msg, me: peer.spawn(self.views.select_hands(peer, id_, msg), reply_to=id_),
            WhichConnected: self._which_connected,
            FleetOpen: self._fleet_open,
            GetStatus: lambda peer, id_, msg, me: peer.spawn(self.views.status(peer, id_), reply_to=id_),
            TaskStart: lambda peer, id_, msg, me: peer.spawn(self.tasks.start(peer, id_, msg), reply_to=id_),
            TaskGet: lambda peer, id_, msg, me: peer.spawn(self.tasks.get(peer, id_, msg), reply_to=id_),
            TaskLogs: lambda peer, id_, msg, me: peer.spawn(self.tasks.logs(peer, id_, msg), reply_to=id_),
            TaskCancelRequest: lambda peer, id_, msg, me: peer.spawn(self.tasks.cancel(peer, id_, msg), reply_to=id_),
            TaskList: lambda peer, id_, msg, me: peer.spawn(self.tasks.list(peer, id_, msg), reply_to=id_),
            TaskRemoveRequest: lambda peer, id_, msg, me: peer.spawn(self.tasks.remove(peer, id_, msg), reply_to=id_),
            ListRecordings: lambda peer, id_, msg, me: peer.spawn(self.recordings.list(peer, id_, msg), reply_to=id_),
            GetRecording: lambda peer, id_, msg, me: peer.spawn(self.recordings.get(peer, id_, msg), reply_to=id_),
            VerifyRecordings: lambda peer, id_, msg, me: peer.spawn(
                self.recordings.verify(peer, id_, msg), reply_to=id_
            ),
        }

    def _refuse(self, peer: Peer, id_: str, denial: Denial) -> None:
        """The one way a request outside the client's scope is answered: audited, then refused."""
        why = self.mind.deny(peer, denial.what, **denial.fields)
        peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)

    def _facts(self, kind: Kind, msg: Any, **known: bool) -> Facts:
        m = self.mind
        return Facts(
            kind, clustered=m.router is not None, relayed=getattr(msg, "on_behalf_of", None) is not None, **known
        )

    # --- exec ---

    def _exec(self, peer: Peer, id_: str, msg: Exec, me: str) -> None:
        m = self.mind
        if msg.run_id is not None:  # named by its client (DESIGN §4): checked before anything is started
            names = peer.names
            if msg.on_behalf_of is not None:  # relayed: named as its node checked it
                problem = None
            else:
                problem = names.take(msg.run_id) if names is not None else "this connection names no runs"
            if problem is None and m.registry.get(msg.run_id) is not None:
                problem = f"run {msg.run_id} exists"  # (a relaying node's bug: never two runs of one id)
            if problem is not None:
                peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message=f"invalid exec: {problem}"), id_)
                return
        refusal, msg = self._exec_refusal(peer, msg, me)
        live = m.hands.get(msg.hand)
        link = None
        if live is None and refusal is None and m.router is not None and msg.on_behalf_of is None:
            link = m.router.cached(msg.hand)
        facts = self._facts(
            Kind.EXEC,
            msg,
            here=live is not None,
            refused=refusal is not None,
            link_ready=link is not None and link.ready,
        )
        route = decide(facts)
        if route is Route.RELAY:  # held by another node, its link open: relayed now
            assert link is not None
            link.relay(msg.model_copy(update={"on_behalf_of": me}), Forward(peer, id_, me, True, msg.hand))
        elif route is Route.LOOKUP:  # the holder, or the credentials table, read off this loop
            if msg.run_id is not None:  # named: its client may ask for it before it is admitted
                peer.admitting[msg.run_id] = asyncio.Event()
            peer.spawn(self._admit_offline(peer, id_, msg, me), reply_to=id_)
        else:
            self._admit(peer, id_, msg, live, True, refusal, me)

    def _exec_refusal(self, peer: Peer, msg: Exec, me: str) -> tuple[tuple[RejectCode, str] | None, Exec]:
        """A check made here that refuses the run (recorded and answered as a refused run), and the
        request as it is admitted (a refused fleet id is never listed as a member)."""
        m = self.mind
        denial = use_denial(peer.scope, msg.hand, msg.tool)
        if denial is not None:
            return (RejectCode.DENIED_BY_SCOPE, m.deny(peer, denial.what, **denial.fields)), msg
        if msg.fleet is not None and msg.on_behalf_of is None and self.fleets.problem(msg.fleet, me) is not None:
            # (a relayed member's fleet id was minted and checked by the node that relayed it)
            why = m.deny(peer, f"join fleet {msg.fleet}", fleet=msg.fleet)
            return (RejectCode.DENIED_BY_SCOPE, why), msg.model_copy(update={"fleet": None})
        if msg.streams is not None:
            if (problem := window_problem(msg.streams.window)) is not None:
                return (RejectCode.QUOTA_EXCEEDED, problem), msg
            want = stream_windows(msg.streams.stdin, msg.streams.pty is not None, msg.streams.window, msg.tool)
            held = sum(x.holds for r in m.registry.active_of(me) for x in r.relays.values())
            if (problem := stream_budget_problem(held, want)) is not None:
                return (RejectCode.QUOTA_EXCEEDED, problem), msg
        return None, msg

    def _admit(
        self,
        peer: Peer,
        id_: str,
        msg: Exec,
        live: Peer | None,
        known: bool,
        refusal: tuple[RejectCode, str] | None,
        owner: str,
    ) -> None:
        m = self.mind
        run_id = msg.run_id or new_id("r")
        m.perform(
            m.registry.admit(
                run_id,
                msg,
                peer.conn_id,
                id_,
                live.gen if live else None,
                known,
                time.monotonic(),
                time.time(),
                owner=owner,
                refusal=refusal,
            )
        )
        if m.recorder is not None and m.recorder.on and (run := m.registry.get(run_id)) is not None:
            m.recorder.begin(run, msg, owner)

    async def _admit_offline(self, peer: Peer, id_: str, msg: Exec, owner: str) -> None:
        """An exec for a Hand with no connection here: relayed to the node holding it (DESIGN §16,
        at most one hop: never a request another node relayed), else `unknown_hand` or
        `hand_offline` by the store. If the Hand connected meanwhile, the run goes to it; if the
        client left, nothing is admitted. A named run's requests that came meanwhile (`admitting`)
        are served once this is done."""
        try:
            await self._admit_found(peer, id_, msg, owner)
        finally:
            if msg.run_id is not None and (done := peer.admitting.pop(msg.run_id, None)) is not None:
                done.set()

    async def _admit_found(self, peer: Peer, id_: str, msg: Exec, owner: str) -> None:
        m = self.mind
        if m.router is not None and msg.on_behalf_of is None:
            link = await m.router.holder(msg.hand)
            here = m.clients.get(peer.conn_id) is peer
            if after_lookup(link is not None, here, msg.hand in m.hands, relayed=False) is Route.RELAY:
                assert link is not None
                relayed = msg.model_copy(update={"on_behalf_of": owner})
                await link.forward(relayed, Forward(peer, id_, owner, True, msg.hand))
                return
        known = await m.creds(m.store.secret, "hand", msg.hand) is not None
        if m.clients.get(peer.conn_id) is not peer:
            return
        live = m.hands.get(msg.hand)
        self._admit(peer, id_, msg, live, known or live is not None, None, owner)

    # --- a run's requests: run get, cancel, attach, detach ---

    def _after_admission(self, peer: Peer, id_: str, run_id: str, serve: Callable[[], None]) -> None:
        """`Route.AFTER_ADMISSION`: `serve` the request again once the named run's admission is done."""
        admitting = peer.admitting[run_id]

        async def then() -> None:
            await admitting.wait()
            serve()

        peer.spawn(then(), reply_to=id_)

    def _touch(self, peer: Peer, id_: str, msg: CancelRun | GetRun, me: str) -> None:
        m = self.mind
        run = m.registry.get(msg.run_id)
        routed = m.router.runs.get(msg.run_id) if run is None and m.router is not None else None
        kind = Kind.CANCEL if isinstance(msg, CancelRun) else Kind.GET
        facts = self._facts(
            kind,
            msg,
            here=run is not None,
            routed=routed is not None,
            history=m.history is not None,
            admitting=msg.run_id in peer.admitting,
        )
        route = decide(facts)
        if route is Route.AFTER_ADMISSION:
            self._after_admission(peer, id_, msg.run_id, lambda: self._touch(peer, id_, msg, me))
        elif route is Route.HERE:
            assert run is not None
            self._touch_here(peer, id_, msg, me, run)
        elif route is Route.RELAY:  # a run relayed through this node: asked of its authority
            assert routed is not None
            self._touch_routed(peer, id_, msg, me, routed)
        elif route is Route.ASK_PEERS:  # started through another node: its node is asked
            peer.spawn(self._touch_found(peer, id_, msg, me), reply_to=id_)
        elif route is Route.HISTORY:  # another node's run, or this Mind's before a restart
            peer.spawn(self.views.run_from_history(peer, id_, msg.run_id), reply_to=id_)
        else:
            peer.outbox.put(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {msg.run_id}"), id_)

    def _touch_here(self, peer: Peer, id_: str, msg: CancelRun | GetRun, me: str, run: Run) -> None:
        m = self.mind
        scope = peer.scope
        if msg.on_behalf_of is not None and run.owner != me:
            # Relayed: the relaying node checked its client's scope but cannot know this run's
            # owner unless it relayed the run itself, so only the owner is served (a client
            # allowed others' runs reads them where they run, or from the shared history).
            scope = dataclasses.replace(scope, read_others=False)
        verb = "cancel" if isinstance(msg, CancelRun) else "read"
        denial = touch_denial(scope, me, run.hand, run.owner, f"{verb} run {msg.run_id}", run_id=msg.run_id)
        if denial is not None:
            self._refuse(peer, id_, denial)
        elif isinstance(msg, GetRun):
            peer.outbox.put(run.info(), id_)
        else:
            status, acts = m.registry.on_cancel(msg.run_id, CancelReason.USER_REQUESTED, time.monotonic(), time.time())
            m.perform(acts)  # the Hand's `cancel` is queued (and written) before the acknowledgement
            peer.outbox.put(CancelRunResult(run_id=msg.run_id, status=status, state=run.state), id_)

    def _attach(self, peer: Peer, id_: str, msg: Attach, me: str) -> None:
        m = self.mind
        run = m.registry.get(msg.run_id)
        routed = m.router.runs.get(msg.run_id) if run is None and m.router is not None else None
        admitting = msg.run_id in peer.admitting
        route = decide(
            self._facts(Kind.ATTACH, msg, here=run is not None, routed=routed is not None, admitting=admitting)
        )
        if route is Route.AFTER_ADMISSION:
            self._after_admission(peer, id_, msg.run_id, lambda: self._attach(peer, id_, msg, me))
        elif route is Route.RELAY:  # a run relayed through this node: attached at its authority
            assert routed is not None
            if not peer.scope.allows_hand(routed.hand):
                self._refuse(peer, id_, Denial(f"attach to run {msg.run_id}", {"run_id": msg.run_id}))
                return
            peer.spawn(self._attach_routed(peer, id_, msg, me, routed.hand), reply_to=id_)
        elif route is Route.ASK_PEERS:
            peer.spawn(self._attach_found(peer, id_, msg, me), reply_to=id_)
        else:
            self._attach_here(peer, id_, msg, me)

    def _attach_here(self, peer: Peer, id_: str, msg: Attach, me: str) -> None:
        """Only the run's owner may take it over; the newest attachment wins (DESIGN §15). A run not
        here yet is waited for by the registry: its Hand may be on its way."""
        m = self.mind
        run = m.registry.get(msg.run_id)
        if run is not None and not peer.scope.allows_hand(run.hand):
            self._refuse(peer, id_, Denial(f"attach to run {msg.run_id}", {"run_id": msg.run_id}))
            return
        now, wall = time.monotonic(), time.time()
        m.perform(m.registry.on_attach(msg.run_id, peer.conn_id, me, id_, now, wall, msg.streams))

    def _detach(self, peer: Peer, id_: str, msg: Detach, me: str) -> None:
        m = self.mind
        here = m.registry.get(msg.run_id) is not None
        routed = via = None
        if not here and m.router is not None:
            routed, via = m.router.runs.get(msg.run_id), m.router.streamed.get(msg.run_id)
        facts = self._facts(
            Kind.DETACH,
            msg,
            here=here,
            routed=routed is not None,
            attached_through_link=via is not None and via[1] == peer.conn_id,
        )
        if decide(facts) is Route.RELAY:  # this connection is the run's attachment through the link
            assert routed is not None
            peer.spawn(routed.link.forward(msg, Forward(peer, id_, me, False, routed.hand)), reply_to=id_)
            return
        m.perform(m.registry.on_detach(msg.run_id, peer.conn_id, id_, msg.keep_s, time.monotonic(), time.time()))

    # --- listings and fleets ---

    def _list_runs(self, peer: Peer, id_: str, msg: ListRuns, me: str) -> None:
        if self.mind.router is not None:  # every live node's runs (DESIGN §16)
            peer.spawn(self.views.list_runs_of_nodes(peer, id_, msg, me), reply_to=id_)
        else:
            self.views.list_runs(peer, id_, msg)

    def _which_connected(self, peer: Peer, id_: str, msg: WhichConnected, me: str) -> None:
        m = self.mind
        if m.router is not None:  # held by another live node counts: a member is relayed there
            peer.spawn(self.views.which_connected(peer, id_, msg), reply_to=id_)
            return
        up = [n for n in dict.fromkeys(msg.names) if n in m.hands and peer.scope.allows_hand(n)]
        peer.outbox.put(ConnectedNames(names=up), id_)

    def _fleet_open(self, peer: Peer, id_: str, msg: FleetOpen, me: str) -> None:
        fleet = new_id("fleet-")
        self.fleets.opened(fleet, me)
        peer.outbox.put(FleetOpened(fleet=fleet), id_)

    def _touch_routed(self, peer: Peer, id_: str, msg: CancelRun | GetRun, me: str, routed: RoutedRun) -> None:
        """`run get` or cancel of a run whose authority is another node: the client's scope and
        ownership checked here, then asked there for its owner."""
        verb = "cancel" if isinstance(msg, CancelRun) else "read"
        denial = touch_denial(peer.scope, me, routed.hand, routed.owner, f"{verb} run {msg.run_id}", run_id=msg.run_id)
        if denial is not None:
            self._refuse(peer, id_, denial)
            return
        relayed = msg.model_copy(update={"on_behalf_of": routed.owner})
        peer.spawn(routed.link.forward(relayed, Forward(peer, id_, routed.owner, False)), reply_to=id_)

    async def _touch_found(self, peer: Peer, id_: str, msg: CancelRun | GetRun, me: str) -> None:
        """`run get` or cancel of a run this node neither holds nor relayed (its client started it
        through another node, then came here): the live node holding it is found (`Router.find`)
        and asked. None has it live: an ended run is read from the shared history; else unknown."""
        m = self.mind
        assert m.router is not None
        found = await m.router.find(peer, msg.run_id, me)
        if m.clients.get(peer.conn_id) is not peer:
            return
        kind = Kind.CANCEL if isinstance(msg, CancelRun) else Kind.GET
        run = m.registry.get(msg.run_id)  # it may have been presented here meanwhile
        route = after_find(kind, found is not None, run is not None, m.history is not None)
        if route is Route.RELAY and isinstance(msg, GetRun):  # the answer found it with: fresh
            assert found is not None
            routed, info = found
            denial = touch_denial(
                peer.scope, me, routed.hand, routed.owner, f"read run {msg.run_id}", run_id=msg.run_id
            )
            if denial is not None:
                self._refuse(peer, id_, denial)
            else:
                peer.outbox.put(info, id_)
        elif route is Route.RELAY:
            assert found is not None
            self._touch_routed(peer, id_, msg, me, found[0])
        elif route is Route.HERE:
            assert run is not None
            self._touch_here(peer, id_, msg, me, run)
        elif route is Route.HISTORY:
            await self.views.run_from_history(peer, id_, msg.run_id)
        else:
            peer.outbox.put(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {msg.run_id}"), id_)

    async def _attach_found(self, peer: Peer, id_: str, msg: Attach, me: str) -> None:
        """An attach to a run this node neither holds nor relayed: at the live node holding it
        (`Router.find`); none has it: attached here, where a run not presented yet is waited for
        (its Hand may be on its way here, §15)."""
        m = self.mind
        assert m.router is not None
        found = await m.router.find(peer, msg.run_id, me)
        if m.clients.get(peer.conn_id) is not peer:
            return
        if after_find(Kind.ATTACH, found is not None, False, False) is Route.RELAY:
            assert found is not None
            routed = found[0]
            if not peer.scope.allows_hand(routed.hand):
                self._refuse(peer, id_, Denial(f"attach to run {msg.run_id}", {"run_id": msg.run_id}))
                return
            await self._attach_routed(peer, id_, msg, me, routed.hand)
            return
        self._attach_here(peer, id_, msg, me)

    async def _attach_routed(self, peer: Peer, id_: str, msg: Attach, me: str, hand: str) -> None:
        """An attach to a run relayed through this node: at the live node holding its Hand now. No
        other node holds it (its node died and the Hand is on its way, maybe here) or that node
        cannot be reached: attached here, where a run not presented yet is waited for (§15)."""
        m = self.mind
        assert m.router is not None
        link = await m.router.holder(hand)
        if link is not None and m.clients.get(peer.conn_id) is peer:
            relayed = msg.model_copy(update={"on_behalf_of": me})
            if await link.offer(relayed, Forward(peer, id_, me, True, hand), answer_failure=False):
                return
        if m.clients.get(peer.conn_id) is not peer:
            return
        self._attach_here(peer, id_, msg, me)

    # --- failures ---

    def failed(self, peer: Peer, env: Envelope[Message] | None) -> None:
        """A bug while serving one frame ends that request only; the connection and the daemon go
        on. A client's request gets `internal_error`. A Hand's report on a run ends that run `lost`
        (the Mind could not take in how it went: nobody can know) and the Hand is told to stop it;
        a Hand can only end its own runs this way, on its own generation."""
        m = self.mind
        msg = env.msg if env is not None else None
        log.exception(
            "request_failed",
            role=peer.ident.role,
            label=peer.ident.label,
            gen=peer.gen,
            conn=peer.conn_id,
            type=msg.TYPE if msg is not None else None,
            req=env.id if env is not None else None,
        )
        if env is None or msg is None:
            return  # the frame did not decode: nothing names what to answer
        try:
            if peer.ident.role == "client":
                if env.id is not None:
                    peer.outbox.put(INTERNAL_ERROR, env.id)
                return
            run_id = getattr(msg, "run_id", None)
            if isinstance(run_id, str):
                now, wall = time.monotonic(), time.time()
                m.perform(m.registry.on_internal_failure(run_id, peer.ident.label, peer.gen, msg.TYPE, now, wall))
        except Exception:
            log.exception("request_failure_unanswered", role=peer.ident.role, label=peer.ident.label, gen=peer.gen)
