"""The Mind's keepalive (`mind.core.liveness` decides): it listens, and pings only the silent.

`Kept` holds the welcomed connections with when each was last heard (stamped by the connection on
every read, `CountedConnection.data_received`) and when the Mind last pinged it. One sweep every
`SWEEP` intervals asks the core about each; websockets' own keepalive (a task and a ping per
connection per interval) is off on the Mind's server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import structlog
from websockets.exceptions import ConnectionClosed

from mind.core.liveness import SWEEP, Verdict, verdict

log = structlog.get_logger(component="mind")

PING_SEND_TIMEOUT_S = 5.0
"""A ping that cannot even be queued in this long (a connection stuck closing) is dropped: the
sweep gives the peer up anyway when its silence reaches the bound."""


class Keepable(Protocol):
    heard: float
    pinged: float | None
    interval: float
    transport: Any

    async def ping(self, data: str | bytes | None = None) -> Any: ...


class Kept:
    def __init__(self) -> None:
        self._conns: dict[int, Keepable] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def add(self, conn: Keepable) -> None:
        self._conns[id(conn)] = conn

    def discard(self, conn: Keepable) -> None:
        self._conns.pop(id(conn), None)

    def sweep(self, now: float, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> int:
        """Ping the silent, cut the dead; returns how many were cut."""
        cut = 0
        for conn in list(self._conns.values()):
            v = verdict(now, conn.heard, conn.pinged, conn.interval)
            if v is Verdict.QUIET:
                continue
            if v is Verdict.PING:
                conn.pinged = now
                spawn(_ping(conn))
                continue
            peer = conn.transport.get_extra_info("peername")
            log.warning("peer_silent", peer=str(peer[0]) if peer else "?", silent_s=round(now - conn.heard, 2))
            self.discard(conn)
            conn.transport.abort()  # the read loop ends with the connection: the peer is gone
            cut += 1
        return cut

    async def run(self, interval: Callable[[], float], spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Sweep until cancelled; `interval` is read each time (a reload applies to the next sweep,
        the per-connection interval stays the one it was welcomed with)."""
        while True:
            await asyncio.sleep(max(0.02, SWEEP * interval()))
            self.sweep(time.monotonic(), spawn)


async def _ping(conn: Keepable) -> None:
    try:
        async with asyncio.timeout(PING_SEND_TIMEOUT_S):
            await conn.ping()  # the pong is heard as any bytes are; its waiter is not needed
    except (ConnectionClosed, TimeoutError, RuntimeError):
        pass
