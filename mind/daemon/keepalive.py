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
    received: int
    probe: tuple[float, bool] | None
    unread_since: float | None

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
            v = verdict(now, conn.heard, conn.pinged, conn.interval, conn.unread_since, conn.received, conn.probe)
            if v is Verdict.QUIET:
                continue
            if v is Verdict.PING:
                conn.pinged = now
                spawn(_ping(conn))
                continue
            if v is Verdict.PROBE:
                conn.probe = (now, False)
                conn.received = 0
                spawn(_probe(conn, now))
                continue
            peer = conn.transport.get_extra_info("peername")
            addr = str(peer[0]) if peer else "?"
            if v is Verdict.BEHIND:  # its pong waited behind its own frames
                assert conn.probe is not None
                log.warning("peer_behind", peer=addr, pong_wait_s=round(now - conn.probe[0], 2))
            elif conn.unread_since is not None and conn.unread_since < conn.heard:  # held back, not silent
                log.warning("peer_over_rate_too_long", peer=addr, unread_s=round(now - conn.unread_since, 2))
            else:
                log.warning("peer_silent", peer=addr, silent_s=round(now - conn.heard, 2))
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


async def _probe(conn: Keepable, sent: float) -> None:
    """Ping a busy peer and mark the probe answered when its pong is read (the sweep cuts the peer
    if that takes too long; a closed connection ends this with it)."""
    try:
        async with asyncio.timeout(PING_SEND_TIMEOUT_S + 4 * conn.interval):
            pong = await conn.ping()
            await pong
    except (ConnectionClosed, TimeoutError, RuntimeError):
        return
    if conn.probe is not None and conn.probe[0] == sent:
        conn.probe = (sent, True)


async def _ping(conn: Keepable) -> None:
    try:
        async with asyncio.timeout(PING_SEND_TIMEOUT_S):
            await conn.ping()  # the pong is heard as any bytes are; its waiter is not needed
    except (ConnectionClosed, TimeoutError, RuntimeError):
        pass
