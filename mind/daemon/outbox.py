"""One writer per connection: frames are stamped when written, so seq order is wire order.

The registry's actions are performed without awaiting the network: a slow reader must never stall the
Mind. State messages queue without limit (they are few and must not be lost); progress is `droppable`
and is dropped, counted, when the queue is already long.
"""

from __future__ import annotations

import asyncio
from collections import deque

import structlog
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from protocol.envelope import Channel
from protocol.errors import ProtocolError
from protocol.io.batching import BatchedWrites
from protocol.messages import Message

log = structlog.get_logger(component="mind.outbox")

MAX_BATCH = 64
"""Frames written together at most: a long queue still yields to the loop between batches."""


class BatchingConnection(BatchedWrites, ServerConnection):
    """The Mind's connections: frames queued together leave in one write (`protocol.batching`)."""


class Outbox:
    def __init__(self, ws: Connection, channel: Channel, droppable_limit: int = 1024) -> None:
        self._ws = ws
        self._channel = channel
        self._q: deque[tuple[Message, str | None]] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._limit = droppable_limit
        self.dropped = 0
        self.drained = asyncio.Event()
        self.drained.set()

    def put(self, msg: Message, id: str | None = None, droppable: bool = False) -> None:
        if self._closed:
            return
        if droppable and len(self._q) >= self._limit:
            self.dropped += 1
            return
        self._q.append((msg, id))
        self.drained.clear()
        self._wake.set()

    def close(self) -> None:
        """Stop after what is already queued has been written."""
        self._closed = True
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                while self._q:
                    frames: list[bytes] = []
                    while self._q and len(frames) < MAX_BATCH:
                        msg, id_ = self._q.popleft()
                        try:
                            frames.append(self._channel.stamp(msg, id_))
                        except ProtocolError as exc:
                            log.error("outbound_frame_refused", type=msg.TYPE, error=exc.message)
                    if len(frames) == 1 or not isinstance(self._ws, BatchingConnection):
                        for data in frames:
                            await self._ws.send(data)
                    elif frames:
                        await self._ws.send_many(frames)
                self.drained.set()
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
        except ConnectionClosed:
            self._closed = True
            self.drained.set()
