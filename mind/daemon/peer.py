"""One authenticated connection to the Mind, a Hand's or a client's, as the daemon holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog
from websockets.asyncio.connection import Connection

from mind.core.admission import RunNames
from mind.core.budgets import ClientRate
from mind.core.handshake import Identity
from mind.core.scope import FULL, Scope
from mind.daemon.outbox import Outbox
from mind.store.api import STORE_UNAVAILABLE_MESSAGE, StoreUnavailable
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError
from protocol.ids import new_id
from protocol.messages import Error, Message

log = structlog.get_logger(component="mind")

STORE_UNAVAILABLE = Error(code=ErrorCode.BUSY, message=STORE_UNAVAILABLE_MESSAGE)
"""The answer to a request that needed the shared database while it was away (DESIGN §16)."""
INTERNAL_ERROR = Error(
    code=ErrorCode.INTERNAL_ERROR,
    message="the mind failed while serving this request (its log has the traceback); the connection goes on",
)
"""The answer to a request whose handling raised: that request ends, nothing else does."""

CLOSE_PROTOCOL = 1002
CLOSE_POLICY = 1008
CLOSE_REPLACED = 4001
CLOSE_REVOKED = 4003
CLOSE_TRY_LATER = 1013
CLOSE_INTERNAL = 1011
"""The close codes the Mind ends a connection with (the reason names the error code)."""


async def close_quietly(ws: Connection, code: int, reason: str) -> None:
    """Close `ws`; a socket already gone is nothing to report."""
    try:
        await ws.close(code, reason)
    except Exception:  # the socket may already be gone; nothing to do
        pass


@dataclass
class Peer:
    ident: Identity
    gen: int
    ws: Connection
    outbox: Outbox
    since: float
    conn_id: str = field(default_factory=lambda: new_id("c"))
    tg: asyncio.TaskGroup | None = None
    scope: Scope = FULL
    secret_digest: bytes = b""
    """SHA-256 of the secret this connection authenticated with: a rotation or revocation is seen by
    comparing it with the store's current one."""
    rate: ClientRate | None = None
    """A client's read rate (`mind.core.budgets`), shared by its credential's connections."""
    in_flight: int = 0
    """Work spawned for this connection and not yet done (a client's requests answered off the
    read loop): the reader waits while it is at `mind.core.budgets.CLIENT_REQUESTS_IN_FLIGHT`."""
    room: asyncio.Event = field(default_factory=asyncio.Event)
    pending: dict[str, asyncio.Future[Message]] = field(default_factory=dict)
    """Requests this Mind sent to the peer (a Hand), by envelope id, waiting for their reply."""
    names: RunNames | None = None
    """A client's: the run ids it may name (its `welcome`'s prefix, `Exec.run_id`)."""
    admitting: dict[str, asyncio.Event] = field(default_factory=dict)
    """Runs this client named whose admission waits on a lookup (set when it is done): a request
    for one meanwhile waits for it (routing's `Route.AFTER_ADMISSION`)."""

    def spawn(self, coro: Coroutine[Any, Any, None], reply_to: str | None = None) -> None:
        """Run `coro` on this connection's task group, guarded: its failure can take down neither
        this connection nor its other requests. It is logged with its traceback and, if the work
        answers a request (`reply_to`, the request's envelope id), that request gets `internal_error`."""
        assert self.tg is not None
        self.in_flight += 1  # counted now, not when it first runs: the reader checks before then
        self.tg.create_task(self._guarded(coro, reply_to))

    async def wait_for_room(self, limit: int) -> None:
        """Until fewer than `limit` spawned works are running (issue 23: 1,000 pipelined
        `list_hands` held the credential thread a minute, and nobody could even log in)."""
        while self.in_flight >= limit:
            self.room.clear()
            await self.room.wait()

    async def _guarded(self, coro: Coroutine[Any, Any, None], reply_to: str | None) -> None:
        try:
            await coro
        except StoreUnavailable as exc:  # the shared database is away: a clear answer, no traceback
            log.error("request_store_unavailable", role=self.ident.role, label=self.ident.label, error=str(exc))
            if reply_to is not None:
                self.outbox.put(STORE_UNAVAILABLE, reply_to)
        except Exception:
            log.exception(
                "request_failed" if reply_to is not None else "connection_work_failed",
                role=self.ident.role,
                label=self.ident.label,
                gen=self.gen,
                conn=self.conn_id,
                req=reply_to,
                work=getattr(coro, "__qualname__", None),
            )
            if reply_to is not None:
                self.outbox.put(INTERNAL_ERROR, reply_to)
        finally:
            self.in_flight -= 1
            self.room.set()

    def answered(self, id_: str, msg: Message) -> bool:
        """`msg` answers our request `id_` to this peer (a Hand): its waiter gets it. False if no
        request of ours waits under that id (it gave up, or the id is the peer's own)."""
        fut = self.pending.pop(id_, None)
        if fut is None:
            return False
        if not fut.done():
            fut.set_result(msg)
        return True

    def fail_request(self, id_: str, why: ProtocolError) -> None:
        """Our request `id_` to this peer (a Hand) could not be sent: its waiter learns it now,
        not at its timeout (the outbox's `on_refused`)."""
        fut = self.pending.pop(id_, None)
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(f"the request could not be sent: {why.message}"))

    def fail_pending(self, why: str) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(why))
        self.pending.clear()
