"""One authenticated connection to the Mind, a Hand's or a client's, as the daemon holds it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.connection import Connection

from mind.core.handshake import Identity
from mind.core.scope import FULL, Scope
from mind.daemon.outbox import Outbox
from protocol.ids import new_id
from protocol.messages import Message


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
    pending: dict[str, asyncio.Future[Message]] = field(default_factory=dict)
    """Requests this Mind sent to the peer (a Hand), by envelope id, waiting for their reply."""

    def spawn(self, coro: Any) -> None:
        assert self.tg is not None
        self.tg.create_task(coro)

    def fail_pending(self, why: str) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(why))
        self.pending.clear()
