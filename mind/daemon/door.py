"""The Mind's door: every connection from its TCP accept to its `welcome`, or its refusal.

What a stranger can make the Mind hold before proving a credential is bounded here (issue 13,
items 6 to 13): sockets not yet upgraded (`Unwelcomed`, counted from the accept), handshakes in
progress (`mind.core.slots`: nobody refused, the oldest silent one evicted to make room),
failed handshakes per address (`AuthFailures`: a limited address is slowed and told
`rate_limited`, never locked out), and the handshake's own deadline. The rules are in
`mind.core.admission` and `mind.core.handshake`; this room performs them and hands the server an
authenticated `Peer`, or nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import cast

import structlog
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from mind.core.admission import AuthFailures, RunNames
from mind.core.handshake import AUTH_FAILED_MESSAGE, Identity, ServerHandshake
from mind.core.scope import Scope
from mind.core.slots import HandshakeSlots
from mind.daemon.host import Host
from mind.daemon.keepalive import Kept
from mind.daemon.onerequest import OneRequest
from mind.daemon.outbox import BatchingConnection, Outbox
from mind.daemon.peer import (
    CLOSE_INTERNAL,
    CLOSE_POLICY,
    CLOSE_PROTOCOL,
    CLOSE_REVOKED,
    CLOSE_TRY_LATER,
    Peer,
    close_quietly,
)
from mind.store.api import STORE_UNAVAILABLE_MESSAGE, NotLive, StoreUnavailable
from protocol import limits
from protocol.audit import AuditEvent
from protocol.codes import ErrorCode
from protocol.envelope import Channel
from protocol.errors import ProtocolError
from protocol.ids import new_id
from protocol.messages import Error, Hello, Message, Proof

log = structlog.get_logger(component="mind")

OPEN_TIMEOUT_S = 5.0
"""A connection that has not finished its HTTP upgrade by then is closed (issue 13, item 10)."""
MAX_PENDING_PER_ADDRESS = 1024
"""Silent handshakes (no `hello` yet) one address may hold; a newer one evicts the oldest (issue 23).
As large as the default table: a burst of peers behind one address all connect before any speaks
(300 at once from one process were cut at any smaller quota); a full table is what bounds them,
and it evicts the oldest silent handshake of the address holding the most, so a flood from one
address only ever evicts its own."""
HELLO_TIMEOUT_S = 3.0
"""A connection that has not sent its `hello` by then is closed: a peer speaks at once, only a
silent stranger waits, and it should not hold a slot for the whole proof deadline (issue 23)."""
LIMITED_DELAY_S = 1.0
"""A rate-limited address waits this long for its challenge: a legitimate peer still gets in, a
prober gets a handful of tries a second (issue 13, items 9 and 13)."""
LOOKUP_PAD_S = 0.005
"""The challenge leaves no sooner than this after the hello, whatever the credential lookup cost:
the answer's timing does not tell a known label from an unknown one (issue 13, item 13)."""
REFUSAL_CLOSE = {
    ErrorCode.AUTH_FAILED: CLOSE_POLICY,
    ErrorCode.HANDSHAKE_TIMEOUT: CLOSE_POLICY,
    ErrorCode.RATE_LIMITED: CLOSE_TRY_LATER,
    ErrorCode.BUSY: CLOSE_TRY_LATER,
    ErrorCode.REVOKED: CLOSE_REVOKED,
    ErrorCode.INTERNAL_ERROR: CLOSE_INTERNAL,
}
"""The close code of a refused handshake, by its error code (any other: a protocol error)."""


class Unwelcomed:
    """Open connections not yet welcomed, per peer address (issue 13, item 10): counted from the TCP
    accept, before the HTTP upgrade, so sockets that never upgrade cannot use up the Mind's files.
    The same rule as pending handshakes (`mind.core.slots`): nobody is refused (issue 23); a full
    address or table gives up its oldest silent socket, and a socket that said `hello` no longer
    counts against its address; the rest end at the upgrade or handshake deadline."""

    def __init__(self, per_address: int = 1024, total: int = 1024) -> None:
        self._slots = HandshakeSlots(total, per_address)
        self._conns: dict[int, asyncio.Transport] = {}

    @property
    def max_total(self) -> int:
        return self._slots.total

    @max_total.setter
    def max_total(self, total: int) -> None:
        self._slots.total = total

    def admit(self, key: int, addr: str, transport: asyncio.Transport) -> bool:
        """Never refuses (issue 23): the oldest silent socket of a full address, or table, goes."""
        for evicted in self._slots.admit(key, addr):
            old = self._conns.pop(evicted, None)
            if old is not None:
                old.abort()
        self._conns[key] = transport
        return True

    def spoke(self, key: int) -> None:
        """Its `hello` came: no longer counted against its address's quota of silent sockets."""
        self._slots.spoke(key)

    def release(self, key: int) -> None:
        self._slots.done(key)
        self._conns.pop(key, None)


class CountedConnection(OneRequest, BatchingConnection):
    """A server connection that holds a slot in `Unwelcomed` from accept until welcome or close,
    then is kept alive by the Mind's sweep (`Kept`) until it closes."""

    unwelcomed: Unwelcomed
    kept: Kept
    heard = 0.0
    """When bytes last came from the peer (monotonic): its liveness (`mind.core.liveness`)."""
    pinged: float | None = None
    interval = 0.0
    received = 0
    """Bytes heard since the keepalive last probed this peer (`liveness.BUSY_BYTES`)."""
    probe: tuple[float, bool] | None = None
    """When the keepalive last probed this peer, and whether its pong came."""
    unread_since: float | None = None
    """Since when the reader has held this client back over its rate (None: read as it sends)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.heard = time.monotonic()
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        addr = str(peer[0]) if peer else "?"
        if not self.unwelcomed.admit(id(self), addr, cast(asyncio.Transport, transport)):
            cast(asyncio.Transport, transport).abort()

    def spoke(self) -> None:
        self.unwelcomed.spoke(id(self))

    def buffer_updated(self, nbytes: int) -> None:
        """Every read of the socket comes here (the reader is a `BufferedProtocol`; what it passes
        on to `data_received` was counted here already)."""
        self.heard = time.monotonic()
        self.received += nbytes
        super().buffer_updated(nbytes)

    def welcomed(self, interval: float | None = None) -> None:
        """Out of `Unwelcomed`; with an `interval`, into the keepalive sweep."""
        self.unwelcomed.release(id(self))
        if interval is not None:
            self.interval = interval
            self.kept.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.unwelcomed.release(id(self))
        self.kept.discard(self)
        super().connection_lost(exc)


class Door:
    """The handshakes of one Mind: admission per address, the rate limit, the exchange itself."""

    def __init__(self, mind: Host) -> None:
        self.mind = mind
        self.unwelcomed = Unwelcomed()
        self.kept = Kept()
        self._pending = HandshakeSlots(mind.cfg.max_pending_handshakes, MAX_PENDING_PER_ADDRESS)
        self._pending_ws: dict[int, tuple[str, Connection]] = {}
        """Each pending handshake's address and connection, to close the one `_pending` evicts."""
        self._evicted: set[int] = set()
        self._failures = AuthFailures()

    def connection_class(self) -> type[CountedConnection]:
        """The server's connection class, counting its sockets in this door's `unwelcomed`."""
        return type("MindConnection", (CountedConnection,), {"unwelcomed": self.unwelcomed, "kept": self.kept})

    def _rate_limited(self, addr: str, now: float) -> bool:
        cfg = self.mind.cfg
        return self._failures.limited(addr, now, cfg.auth_fail_limit, cfg.auth_fail_window)

    def _failed(self, addr: str, now: float) -> None:
        self._failures.failed(addr, now)

    async def welcome(self, ws: ServerConnection) -> Peer | None:
        """The handshake of a new connection: its `Peer` once welcomed, or None once refused (the
        refusal said and the socket closed)."""
        m = self.mind
        channel = Channel()
        peer_addr = ws.remote_address[0] if ws.remote_address else "?"
        now = time.monotonic()
        # A limited address is slowed and its failures are answered `rate_limited`, but a correct
        # proof is still welcomed: strangers behind the same NAT cannot lock a peer out (item 9).
        limited = self._rate_limited(peer_addr, now)
        seen_epoch = m.epoch
        key = id(ws)
        self._pending.total = m.cfg.max_pending_handshakes  # (reloadable)
        for evicted in self._pending.admit(key, peer_addr):
            old = self._pending_ws.pop(evicted, None)
            if old is not None:  # the oldest silent one of its address, or of the table: not a failure
                log.warning(AuditEvent.HANDSHAKE_REFUSED, peer=old[0], why="evicted")
                self._evicted.add(evicted)
                m.spawn(close_quietly(old[1], CLOSE_TRY_LATER, "busy: evicted for a newer handshake"))
        self._pending_ws[key] = (peer_addr, ws)
        stage: list[str] = []  # "hello" once a challenge is owed: a close after it is an abandon (item 13)
        try:
            async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
                ident, gen, secret, scope, run_ids = await self._handshake(ws, channel, limited, stage)
        except TimeoutError:
            m.metrics.handshakes.labels("failed").inc()
            self._failed(peer_addr, now)
            log.info(AuditEvent.HANDSHAKE_FAILED, peer=peer_addr, code=ErrorCode.HANDSHAKE_TIMEOUT.value)
            await self._refuse(ws, channel, ProtocolError(ErrorCode.HANDSHAKE_TIMEOUT, "handshake took too long"))
            return None
        except ProtocolError as exc:
            m.metrics.handshakes.labels("failed").inc()
            self._failed(peer_addr, now)
            if limited and exc.code is ErrorCode.AUTH_FAILED:
                log.warning(AuditEvent.HANDSHAKE_REFUSED, peer=peer_addr, why="rate_limited", code=exc.code.value)
                exc = ProtocolError(ErrorCode.RATE_LIMITED, "too many failed handshakes from this address; try later")
            else:
                log.info(AuditEvent.HANDSHAKE_FAILED, peer=peer_addr, code=exc.code.value, reason=exc.message)
            await self._refuse(ws, channel, exc)
            return None
        except ConnectionClosed:
            if stage and key not in self._evicted:
                m.metrics.handshakes.labels("failed").inc()
                self._failed(peer_addr, now)
                log.info(AuditEvent.HANDSHAKE_FAILED, peer=peer_addr, code="abandoned")
            return None
        except StoreUnavailable as exc:  # the shared database is away: say so; another node may serve
            m.metrics.handshakes.labels("failed").inc()
            log.error("handshake_store_unavailable", peer=peer_addr, error=str(exc))
            why = str(exc) if isinstance(exc, NotLive) else STORE_UNAVAILABLE_MESSAGE
            await self._refuse(ws, channel, ProtocolError(ErrorCode.BUSY, why))
            return None
        except Exception:  # our failure, not the peer's: not counted against its address
            m.metrics.handshakes.labels("failed").inc()
            log.exception("handshake_crashed", peer=peer_addr)
            await self._refuse(
                ws, channel, ProtocolError(ErrorCode.INTERNAL_ERROR, "the mind failed during the handshake; try again")
            )
            return None
        finally:
            self._pending.done(key)
            self._pending_ws.pop(key, None)
            self._evicted.discard(key)
        outbox = Outbox(ws, channel)
        peer = Peer(
            ident=ident,
            gen=gen,
            ws=ws,
            outbox=outbox,
            since=time.time(),
            secret_digest=hashlib.sha256(secret).digest(),
            names=RunNames(run_ids) if run_ids is not None else None,
        )
        if ident.role == "hand":
            outbox.on_refused = peer.fail_request
        outbox.on_overflow = ws.transport.abort  # a peer that does not read is closed, not buffered
        if scope is not None:
            # Full scope is what the credential was created with (no stored scope), never a name.
            peer.scope = scope
        # The ticker sweeps the registered peers when the credentials change; this one registers
        # only when served (with no await between this return and that): a change it noticed since
        # the handshake began is checked here, until none slipped in (item 6).
        while m.epoch != seen_epoch:
            seen_epoch = m.epoch
            if await m.creds(m.store.secret, ident.role, ident.label) != secret:
                log.warning(AuditEvent.CREDENTIAL_CLOSED, role=ident.role, label=ident.label, gen=gen, why="revoked")
                await self._refuse(ws, channel, ProtocolError(ErrorCode.REVOKED, "this credential was revoked"))
                return None
        log.info(AuditEvent.HANDSHAKE_OK, peer=peer_addr, role=ident.role, label=ident.label, gen=gen)
        m.metrics.handshakes.labels("ok").inc()
        return peer

    async def _refuse(self, ws: Connection, channel: Channel, exc: ProtocolError) -> None:
        code = REFUSAL_CLOSE.get(exc.code, CLOSE_PROTOCOL)
        try:
            await ws.send(channel.stamp(Error(code=exc.code, message=exc.message)))
            await ws.close(code, exc.code.value)
        except (ConnectionClosed, ProtocolError):
            pass

    async def _recv(self, ws: Connection, channel: Channel) -> Message:
        data = await ws.recv()
        return channel.receive(data).msg

    async def _handshake(
        self, ws: Connection, channel: Channel, limited: bool = False, stage: list[str] | None = None
    ) -> tuple[Identity, int, bytes, Scope | None, str | None]:
        m = self.mind
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                msg = await self._recv(ws, channel)
        except TimeoutError:
            raise ProtocolError(ErrorCode.HANDSHAKE_TIMEOUT, "no hello in time") from None
        if not isinstance(msg, Hello):
            raise ProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE, f"expected hello, got {msg.TYPE}: nothing is acted on before welcome"
            )
        if stage is not None:
            stage.append("hello")
        self._pending.spoke(id(ws))
        if isinstance(ws, CountedConnection):
            ws.spoke()
        if m.nodes is not None and (refusal := m.nodes.refusal()) is not None:
            raise NotLive(refusal)  # a node without its lease says so at once, before any statement
        started = loop.time()
        secret = await m.creds(m.store.secret, msg.role, msg.label)
        hs = ServerHandshake(m.mind_id, new_id("hs"), os.urandom(limits.NONCE_BYTES), loop.time())
        challenge = hs.on_hello(msg, secret, os.urandom(limits.SECRET_BYTES), loop.time())
        await asyncio.sleep(max(0.0, started + (LIMITED_DELAY_S if limited else LOOKUP_PAD_S) - loop.time()))
        await ws.send(channel.stamp(challenge))
        proof = await self._recv(ws, channel)
        if not isinstance(proof, Proof):
            raise ProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE, f"expected proof, got {proof.TYPE}: nothing is acted on before welcome"
            )
        ident = hs.on_proof(proof, loop.time())
        assert secret is not None  # a verified proof implies a known secret
        # Revoked or rotated while this handshake waited for its proof (item 6): the table decides
        # now, not when the hello came in. Same answer as any wrong secret. A Hand on a node of
        # many: the re-read is part of its claim's statement (one round trip, `PgNodes.welcome`).
        hand_on_node = m.nodes is not None and ident.role == "hand"
        if not hand_on_node and await m.creds(m.store.secret, ident.role, ident.label) != secret:
            raise ProtocolError(ErrorCode.AUTH_FAILED, AUTH_FAILED_MESSAGE)
        if m.nodes is not None:  # one node of many: still live, and a Hand claimed (a fencing token)
            if (refusal := m.nodes.refusal()) is not None:
                raise NotLive(refusal)
            if hand_on_node:
                claim = await m.nodes.claim(ident.label, secret)
                if claim is None:
                    raise ProtocolError(ErrorCode.AUTH_FAILED, AUTH_FAILED_MESSAGE)
                gen = claim
            else:
                gen = await m.creds(m.store.next_generation, ident.role, ident.label)
        else:
            gen = await m.creds(m.store.next_generation, ident.role, ident.label)
        channel.gen = gen
        # Past the proof the peer may send full-size frames: a Hand's results, a client's requests.
        ws.protocol.max_message_size = limits.MAX_FRAME_BYTES if ident.role == "hand" else limits.CLIENT_MAX_FRAME_BYTES
        if isinstance(ws, CountedConnection):
            ws.welcomed(m.cfg.ping_interval)
        scope = None
        if ident.role == "client":  # read once here: the client is told its tools, the peer keeps it
            scope = Scope.from_json(await m.creds(m.store.scope, "client", ident.label))
        tools = list(scope.tools) if scope is not None else None
        run_ids = new_id("r") if ident.role == "client" else None  # this connection's alone (`Exec.run_id`)
        await ws.send(channel.stamp(hs.welcome(gen, m.cfg.ping_interval, m.cfg.resume_window, tools, run_ids)))
        return ident, gen, secret, scope, run_ids
