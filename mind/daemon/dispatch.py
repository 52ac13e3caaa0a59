"""What the Mind does with each frame an authenticated peer sends: a Hand's reports to the run
registry (or to the ask that waits for them), a client's requests to the registry, the task service
or the views, and a failure while serving one frame to that frame's request only.

Fast and synchronous where it can be (the registry decides at once, and its actions are performed
before the next frame is read); anything that waits on a store or a Hand runs on the connection's
task group, guarded, so one slow or failing request holds up nothing else (`Peer.spawn`).
"""

from __future__ import annotations

import dataclasses
import time

import structlog

from mind.core.admission import args_problem, touch_denial, use_denial
from mind.core.budgets import stream_budget_problem, stream_windows
from mind.core.fleetids import FleetOwners
from mind.core.nodes import request_owner
from mind.daemon.host import Host
from mind.daemon.peer import INTERNAL_ERROR, Peer
from mind.daemon.route import ROUTED_NUMBER_BASE, Forward, RoutedRun
from mind.daemon.taskservice import TaskService
from mind.daemon.views import Views
from protocol import frames, limits
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
    GetRun,
    GetStatus,
    ListHands,
    ListRuns,
    Message,
    Progress,
    Rejected,
    Resize,
    Result,
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
    TaskStart,
    TaskUpdate,
    WhichConnected,
)

log = structlog.get_logger(component="mind")

REPLY_TYPES = (TaskInfo, TaskLogPage, TaskCancelResult, TaskInventoryPage)


class Dispatch:
    def __init__(self, mind: Host, tasks: TaskService, views: Views) -> None:
        self.mind = mind
        self.tasks = tasks
        self.views = views
        self.fleets = FleetOwners()
        """Which client opened each fleet id (`fleet_open`): only its runs may be members (issue 23)."""

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
        m = self.mind
        if isinstance(msg, (StreamAck, Resize)):  # about a run's bytes, not a request: no answer
            if m.router is not None and m.router.from_client_stream(peer, msg):
                return  # a relayed run's: its holding node's flow control
            m.perform(m.registry.on_client_stream(msg, peer.conn_id))
            return
        if id_ is None:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"a {msg.TYPE} request needs an envelope id")
        if isinstance(msg, (Exec, TaskStart)) and (problem := args_problem(msg.args)) is not None:
            # before any digest, record or re-encode: their cost grows with the values (item 5)
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message=f"invalid {msg.TYPE}: {problem}"), id_)
            return
        now, wall = time.monotonic(), time.time()
        scope = peer.scope
        me = request_owner(peer.ident.label, getattr(msg, "on_behalf_of", None), m.router is not None)
        if me is None:  # a client posing as a node relaying another's request: refused, never obeyed
            why = m.deny(peer, "act on behalf of another client", on_behalf_of=getattr(msg, "on_behalf_of", ""))
            peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
            return
        if isinstance(msg, Exec):
            refusal = None
            denial = use_denial(scope, msg.hand, msg.tool)
            if denial is not None:
                refusal = (RejectCode.DENIED_BY_SCOPE, m.deny(peer, denial.what, **denial.fields))
            elif msg.fleet is not None and msg.on_behalf_of is None and self.fleets.problem(msg.fleet, me) is not None:
                # (a relayed member's fleet id was minted and checked by the node that relayed it)
                refusal = (RejectCode.DENIED_BY_SCOPE, m.deny(peer, f"join fleet {msg.fleet}", fleet=msg.fleet))
                msg = msg.model_copy(update={"fleet": None})  # refused, and never listed as a member
            elif msg.streams is not None:
                want = stream_windows(msg.streams.stdin, msg.streams.pty is not None)
                held = sum(len(r.relays) for r in m.registry.active() if r.owner == me) * limits.STREAM_WINDOW
                if (problem := stream_budget_problem(held, want)) is not None:
                    refusal = (RejectCode.QUOTA_EXCEEDED, problem)
            live = m.hands.get(msg.hand)
            if live is None and refusal is None:
                if msg.on_behalf_of is None and m.router is not None:
                    link = m.router.cached(msg.hand)
                    if link is not None and link.ready:  # held by another node, its link open: relayed now
                        link.relay(msg.model_copy(update={"on_behalf_of": me}), Forward(peer, id_, me, True, msg.hand))
                        return
                # Offline or unknown: the credentials table says which, read on the database thread.
                peer.spawn(self._admit_offline(peer, id_, msg, me), reply_to=id_)
                return
            self._admit(peer, id_, msg, live, True, refusal, me)
        elif isinstance(msg, (CancelRun, GetRun)):
            run = m.registry.get(msg.run_id)
            if run is None and msg.on_behalf_of is None and m.router is not None:
                routed = m.router.runs.get(msg.run_id)
                if routed is not None:  # a run relayed through this node: asked of its authority
                    self._touch_routed(peer, id_, msg, me, routed)
                    return
                # neither here nor relayed here (started through another node): its node is asked
                peer.spawn(self._touch_found(peer, id_, msg, me), reply_to=id_)
                return
            if run is None and isinstance(msg, GetRun) and m.history is not None:
                peer.spawn(self.views.run_from_history(peer, id_, msg.run_id), reply_to=id_)  # another node's run
                return
            if run is None:
                peer.outbox.put(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {msg.run_id}"), id_)
                return
            verb = "cancel" if isinstance(msg, CancelRun) else "read"
            if msg.on_behalf_of is not None and run.owner != me:
                # Relayed: the relaying node checked its client's scope but cannot know this run's
                # owner unless it relayed the run itself, so only the owner is served (a client
                # allowed others' runs reads them where they run, or from the shared history).
                scope = dataclasses.replace(scope, read_others=False)
            denial = touch_denial(scope, me, run.hand, run.owner, f"{verb} run {msg.run_id}", run_id=msg.run_id)
            if denial is not None:
                why = m.deny(peer, denial.what, **denial.fields)
                peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
                return
            if isinstance(msg, GetRun):
                peer.outbox.put(run.info(), id_)
                return
            status, acts = m.registry.on_cancel(msg.run_id, CancelReason.USER_REQUESTED, now, wall)
            m.perform(acts)  # the Hand's `cancel` is queued (and written) before the acknowledgement
            peer.outbox.put(CancelRunResult(run_id=msg.run_id, status=status, state=run.state), id_)
        elif isinstance(msg, Attach):
            run = m.registry.get(msg.run_id)
            if run is None and msg.on_behalf_of is None and m.router is not None:
                routed = m.router.runs.get(msg.run_id)
                if routed is not None:  # a run relayed through this node: attached at its authority
                    if not scope.allows_hand(routed.hand):
                        why = m.deny(peer, f"attach to run {msg.run_id}", run_id=msg.run_id)
                        peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
                        return
                    peer.spawn(self._attach_routed(peer, id_, msg, me, routed.hand), reply_to=id_)
                    return
                peer.spawn(self._attach_found(peer, id_, msg, me), reply_to=id_)
                return
            if run is not None and not scope.allows_hand(run.hand):
                why = m.deny(peer, f"attach to run {msg.run_id}", run_id=msg.run_id)
                peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
                return
            # only the run's owner may take it over; the newest attachment wins (DESIGN §15)
            m.perform(m.registry.on_attach(msg.run_id, peer.conn_id, me, id_, now, wall, msg.streams))
        elif isinstance(msg, Detach):
            if m.registry.get(msg.run_id) is None and m.router is not None:
                via = m.router.streamed.get(msg.run_id)
                routed = m.router.runs.get(msg.run_id)
                if routed is not None and via is not None and via[1] == peer.conn_id:
                    # this connection is the run's attachment through the link: detached there
                    peer.spawn(routed.link.forward(msg, Forward(peer, id_, me, False, routed.hand)), reply_to=id_)
                    return
            m.perform(m.registry.on_detach(msg.run_id, peer.conn_id, id_, msg.keep_s, now, wall))
        elif isinstance(msg, ListHands):
            peer.spawn(self.views.list_hands(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, ListRuns):
            if m.router is not None:  # every live node's runs (DESIGN §16)
                peer.spawn(self.views.list_runs_of_nodes(peer, id_, msg, me), reply_to=id_)
                return
            self.views.list_runs(peer, id_, msg)
        elif isinstance(msg, SelectHands):
            peer.spawn(self.views.select_hands(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, WhichConnected):
            if m.router is not None:  # held by another live node counts: a member is relayed there
                peer.spawn(self.views.which_connected(peer, id_, msg), reply_to=id_)
                return
            up = [n for n in dict.fromkeys(msg.names) if n in m.hands and scope.allows_hand(n)]
            peer.outbox.put(ConnectedNames(names=up), id_)
        elif isinstance(msg, FleetOpen):
            fleet = new_id("fleet-")
            self.fleets.opened(fleet, me)
            peer.outbox.put(FleetOpened(fleet=fleet), id_)
        elif isinstance(msg, GetStatus):
            peer.spawn(self.views.status(peer, id_), reply_to=id_)
        elif isinstance(msg, TaskStart):
            peer.spawn(self.tasks.start(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskGet):
            peer.spawn(self.tasks.get(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskLogs):
            peer.spawn(self.tasks.logs(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskCancelRequest):
            peer.spawn(self.tasks.cancel(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskList):
            peer.spawn(self.tasks.list(peer, id_, msg), reply_to=id_)
        else:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a client may not send {msg.TYPE}")

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
        m.perform(
            m.registry.admit(
                new_id("r"),
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

    async def _admit_offline(self, peer: Peer, id_: str, msg: Exec, owner: str) -> None:
        """An exec for a Hand with no connection here: relayed to the node holding it (DESIGN §16,
        at most one hop: never a request another node relayed), else `unknown_hand` or
        `hand_offline` by the store. If the Hand connected meanwhile, the run goes to it; if the
        client left, nothing is admitted."""
        m = self.mind
        if m.router is not None and msg.on_behalf_of is None:
            link = await m.router.holder(msg.hand)
            if link is not None and m.clients.get(peer.conn_id) is peer and msg.hand not in m.hands:
                relayed = msg.model_copy(update={"on_behalf_of": owner})
                await link.forward(relayed, Forward(peer, id_, owner, True, msg.hand))
                return
        known = await m.creds(m.store.secret, "hand", msg.hand) is not None
        if m.clients.get(peer.conn_id) is not peer:
            return
        live = m.hands.get(msg.hand)
        self._admit(peer, id_, msg, live, known or live is not None, None, owner)

    def _touch_routed(self, peer: Peer, id_: str, msg: CancelRun | GetRun, me: str, routed: RoutedRun) -> None:
        """`run get` or cancel of a run whose authority is another node: the client's scope and
        ownership checked here, then asked there for its owner."""
        m = self.mind
        verb = "cancel" if isinstance(msg, CancelRun) else "read"
        denial = touch_denial(peer.scope, me, routed.hand, routed.owner, f"{verb} run {msg.run_id}", run_id=msg.run_id)
        if denial is not None:
            why = m.deny(peer, denial.what, **denial.fields)
            peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
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
        if found is not None and isinstance(msg, GetRun):  # the answer found it with: fresh
            routed, info = found
            denial = touch_denial(
                peer.scope, me, routed.hand, routed.owner, f"read run {msg.run_id}", run_id=msg.run_id
            )
            if denial is not None:
                why = m.deny(peer, denial.what, **denial.fields)
                peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
            else:
                peer.outbox.put(info, id_)
        elif found is not None:
            self._touch_routed(peer, id_, msg, me, found[0])
        elif isinstance(msg, GetRun) and m.history is not None:
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
        if found is not None:
            routed = found[0]
            if not peer.scope.allows_hand(routed.hand):
                why = m.deny(peer, f"attach to run {msg.run_id}", run_id=msg.run_id)
                peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
                return
            await self._attach_routed(peer, id_, msg, me, routed.hand)
            return
        run = m.registry.get(msg.run_id)  # it may have been presented here meanwhile
        if run is not None and not peer.scope.allows_hand(run.hand):
            why = m.deny(peer, f"attach to run {msg.run_id}", run_id=msg.run_id)
            peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
            return
        now, wall = time.monotonic(), time.time()
        m.perform(m.registry.on_attach(msg.run_id, peer.conn_id, me, id_, now, wall, msg.streams))

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
        now, wall = time.monotonic(), time.time()
        m.perform(m.registry.on_attach(msg.run_id, peer.conn_id, me, id_, now, wall, msg.streams))

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
