"""The Mind's authenticated connections, from `welcome` to their end: the connection table, one
task group per connection (its writer and its requests), the reader, and what a Hand's arrival
and departure mean for its runs and snapshots.

A Hand has one live connection: a newer one replaces the older at once (the old may be a dead
socket nobody noticed yet), its runs end `lost`, and when the live one ends, the Hand's snapshots
are marked stale (DESIGN §8). Every frame read goes to `Dispatch`; a protocol error from a peer
ends its connection with an `error` it can read, a bug while serving one frame ends that frame's
request only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog
from websockets.exceptions import ConnectionClosed

from mind.core.budgets import CLIENT_REQUESTS_IN_FLIGHT, ClientRates, relays_for_clients
from mind.core.nodes import LEASE_LOST_MESSAGE
from mind.daemon.dispatch import Dispatch
from mind.daemon.door import CountedConnection
from mind.daemon.host import Host
from mind.daemon.peer import CLOSE_INTERNAL, CLOSE_PROTOCOL, CLOSE_REPLACED, Peer, close_quietly
from mind.daemon.taskservice import TaskService
from mind.store.api import StoreUnavailable
from protocol import frames, limits
from protocol.codes import ErrorCode
from protocol.envelope import PayloadRefused
from protocol.errors import ProtocolError
from protocol.io import heap
from protocol.messages import Error, Message, StreamAck

log = structlog.get_logger(component="mind")


class Connections:
    def __init__(self, mind: Host, dispatch: Dispatch, tasks: TaskService) -> None:
        self.mind = mind
        self.dispatch = dispatch
        self.tasks = tasks
        self.rates = ClientRates()
        """Each client credential's request rate, shared by its connections (`mind.core.budgets`)."""

    async def serve(self, peer: Peer) -> None:
        """Serve a welcomed peer until its connection ends: its writer and its requests on one task
        group. Every request is guarded; a failure here is the last resort, logged where we look."""
        ident, outbox = peer.ident, peer.outbox
        try:
            async with asyncio.TaskGroup() as tg:
                peer.tg = tg
                writer = tg.create_task(outbox.run())
                try:
                    if ident.role == "hand":
                        await self.serve_hand(peer)
                    else:
                        await self.serve_client(peer)
                finally:
                    outbox.close()
                    try:
                        async with asyncio.timeout(2):
                            await asyncio.shield(writer)
                    except (TimeoutError, ConnectionClosed):
                        writer.cancel()
        except Exception:  # every request is guarded; this is the last resort, logged where we look
            log.exception("connection_failed", role=ident.role, label=ident.label, gen=peer.gen, conn=peer.conn_id)
            await close_quietly(peer.ws, CLOSE_INTERNAL, "internal error")

    # --- hands ---

    async def serve_hand(self, peer: Peer) -> None:
        m = self.mind
        label, gen = peer.ident.label, peer.gen
        hlog = log.bind(hand=label, gen=gen)
        old = m.hands.get(label)
        m.hands[label] = peer
        if old is not None:
            # The newer connection wins at once: the old one may be a dead socket nobody noticed yet.
            hlog.info("hand_replaced", old_gen=old.gen)
            m.last_seen[label] = time.time()
            m.perform(m.registry.on_hand_gone(label, old.gen, time.monotonic(), time.time()))
            old.outbox.close()
            m.spawn(close_quietly(old.ws, CLOSE_REPLACED, "replaced by a newer connection"))
        hlog.info("hand_connected", claims=peer.ident.claims.model_dump() if peer.ident.claims else None)
        m.metrics.hands_connected.set(len(m.hands))
        peer.spawn(self.tasks.reconcile(peer))
        try:
            await self.read_loop(peer, self._held(peer, self.dispatch.on_hand_message))
        finally:
            if m.nodes is not None:
                m.nodes.released(label, gen)
            peer.fail_pending("hand disconnected")
            if m.hands.get(label) is peer:
                del m.hands[label]
                m.last_seen[label] = time.time()
                m.perform(m.registry.on_hand_gone(label, gen, time.monotonic(), time.time()))
                m.metrics.hands_connected.set(len(m.hands))
                try:
                    staled: int | None = await m.db(m.snapshots.mark_hand_stale, label)
                except (
                    StoreUnavailable
                ):  # the database away: the Hand is gone all the same (the snapshots stay as they were)
                    staled = None
                hlog.info("hand_disconnected", snapshots_marked_stale=staled)
            else:
                hlog.info("hand_disconnected", replaced=True)

    def _held(
        self, peer: Peer, on_message: Callable[[Peer, str | None, Message], None]
    ) -> Callable[[Peer, str | None, Message], None]:
        """On a shared database a Hand's messages are acted on only while this node holds it by
        this connection's claim and its lease is live (`mind.core.nodes`): a node woken from a
        pause, or told of a newer claim, reads nothing more from the stale connection (it is
        being closed)."""
        nodes = self.mind.nodes
        if nodes is None:
            return on_message
        label, gen = peer.ident.label, peer.gen

        def held(p: Peer, id_: str | None, msg: Message) -> None:
            if nodes.acts(label, gen):
                on_message(p, id_, msg)

        return held

    # --- clients ---

    def _live(
        self, on_message: Callable[[Peer, str | None, Message], None]
    ) -> Callable[[Peer, str | None, Message], None]:
        """On a shared database a client's request is acted on only while this node's lease is
        live: one that comes to a node woken from a pause (before its ticker ran) is answered
        `busy` with the lease sentence, never started, and every connection is closed."""
        nodes = self.mind.nodes
        if nodes is None:
            return on_message

        def live(p: Peer, id_: str | None, msg: Message) -> None:
            if nodes.live():
                on_message(p, id_, msg)
                return
            if id_ is not None:
                p.outbox.put(Error(code=ErrorCode.BUSY, message=LEASE_LOST_MESSAGE), id_)
            nodes.refusal()  # the lease's end performed: every connection closed (queued answers written first)

        return live

    async def serve_client(self, peer: Peer) -> None:
        m = self.mind
        m.clients[peer.conn_id] = peer
        peer.outbox.channel.max_containers = limits.ARGS_MAX_ITEMS  # a million empty lists: refused as built
        if not relays_for_clients(peer.ident.label, m.router is not None):
            peer.rate = self.rates.join(peer.ident.label, time.monotonic())
        m.metrics.clients_connected.set(len(m.clients))
        clog = log.bind(client=peer.ident.label, conn=peer.conn_id)
        clog.debug("client_connected")
        try:
            await self.read_loop(peer, self._live(self.dispatch.on_client_message))
        finally:
            if peer.rate is not None:
                self.rates.leave(peer.ident.label)
            if peer.outbox.bound.peak >= heap.LARGE_FRAME:
                # its queue's buffers are free now (a reader that kept up never queues this much):
                # give them back, as after a large frame (issue 23 attack 4: held after it left)
                m.large_frames = True
            m.clients.pop(peer.conn_id, None)
            m.metrics.clients_connected.set(len(m.clients))
            m.perform(m.registry.on_client_gone(peer.conn_id, time.monotonic(), time.time()))
            if m.router is not None:
                m.router.client_gone(peer, m.cfg.resume_window > 0)
            clog.debug("client_disconnected")

    # --- the reader ---

    async def read_loop(self, peer: Peer, on_message: Callable[[Peer, str | None, Message], None]) -> None:
        channel = peer.outbox.channel
        read = 0
        try:
            async for data in peer.ws:
                read += 1
                if read % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # the other connections' frames get their turn
                if len(data) >= heap.LARGE_FRAME:
                    self.mind.large_frames = True
                env = None
                try:
                    if frames.is_frame(data):  # stream bytes: routed on the header, never decoded
                        self.dispatch.on_frame(peer, data)
                        if peer.rate is not None:
                            await _within_rate(peer, len(data), True)
                        del data
                        continue
                    env = channel.receive(data)
                    assert env is not None
                    on_message(peer, env.id, env.msg)
                    if peer.rate is not None:  # a client: its rate, and its requests in flight (issue 23)
                        await _within_rate(peer, len(data), isinstance(env.msg, StreamAck))
                        await peer.wait_for_room(CLIENT_REQUESTS_IN_FLIGHT)
                except PayloadRefused as exc:  # its envelope in order, its payload too big to build
                    log.warning("request_refused", label=peer.ident.label, conn=peer.conn_id, reason=exc.message)
                    peer.outbox.put(Error(code=exc.code, message=exc.message), exc.header.get("id"))
                    if peer.rate is not None:
                        await _within_rate(peer, len(data), False)
                except ProtocolError as exc:
                    log.warning(
                        "peer_protocol_error",
                        role=peer.ident.role,
                        label=peer.ident.label,
                        gen=peer.gen,
                        code=exc.code.value,
                        reason=exc.message,
                    )
                    peer.outbox.put(Error(code=exc.code, message=exc.message))
                    peer.outbox.close()
                    await peer.outbox.drained.wait()
                    await close_quietly(peer.ws, CLOSE_PROTOCOL, exc.code.value)
                    return
                except Exception:
                    self.dispatch.failed(peer, env)
                del data, env  # hold no frame while waiting for the next: a 4 MiB result would stay alive
        except ConnectionClosed:
            return


YIELD_EVERY = 32
"""Frames one connection's reader handles before it lets the loop serve the others: a read of 1 MiB
holds thousands of small requests, all already parsed and queued, which the reader would otherwise
handle in one turn of the loop (a client opening 10,000 forwarded connections at once held it for
~0.1 s at a time, and another client's call crossing it several times waited 1-2.7 s). Every 32
frames: 0.23-0.44 s, p90 0.13-0.2 s. Every 8 did better there (0.19-0.29 s, p90 64-68 ms) and worse
against a client flooding refused requests (`scripts/bench flood`: the other client's `read_file`
p99 10.8-12.3 ms, against 2.4 at 32, 2.1-6.8 at 64 and 3.4-8.2 without yielding)."""


async def _within_rate(peer: Peer, size: int, stream: bool) -> None:
    """Charge a frame of `size` to the client's rate; over it, the client waits, its socket unread.
    While it is held back it is not heard (`mind.core.liveness`): one that keeps over its rate for
    the keepalive's bound is cut, an honest burst only waits."""
    assert peer.rate is not None
    now = time.monotonic()
    wait = peer.rate.take(size, now, stream)
    ws = peer.ws
    if wait <= 0:
        if isinstance(ws, CountedConnection):
            ws.unread_since = None
        return
    if isinstance(ws, CountedConnection) and ws.unread_since is None:
        ws.unread_since = now
    await asyncio.sleep(wait)
