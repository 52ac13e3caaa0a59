"""One writer per connection: frames are stamped when written, so seq order is wire order.

The registry's actions are performed without awaiting the network: a slow reader must never stall the
Mind. State messages queue without limit (they are few and must not be lost); progress is `droppable`
and is dropped, counted, when the queue is already long.

A frame that cannot be sent (over the frame limit, or failing to encode) is never silence for the
peer waiting on it: a reply to a client's request becomes an `error` reply for that request id, so
no request of a client can hang (DESIGN §11).

The queue is bounded in bytes (`mind.core.budgets.OutboxBound`, issue 23 attack 4): a peer that
does not read is closed, not buffered. Its queue is dropped and `on_overflow` is told (the shell
aborts the connection, whose reader then cleans up as for any lost peer).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from mind.core.budgets import OutboxBound
from protocol import frames as data_frames
from protocol.codes import ErrorCode
from protocol.envelope import Channel
from protocol.errors import ProtocolError
from protocol.io.batching import MAX_BATCH, BatchedWrites, TurnWriter, write_frames
from protocol.io.framereader import FrameReader
from protocol.messages import Error, Message

log = structlog.get_logger(component="mind.outbox")


class BatchingConnection(BatchedWrites, FrameReader, ServerConnection):
    """The Mind's connections: frames queued together leave in one write (`protocol.io.batching`);
    binary frames are read by our own reader (`protocol.io.framereader`)."""


class Outbox(TurnWriter):
    def __init__(
        self,
        ws: Connection,
        channel: Channel,
        droppable_limit: int = 1024,
        on_refused: Callable[[str, ProtocolError], None] | None = None,
    ) -> None:
        """`on_refused(id, why)` is told of a refused frame that carried an envelope id. Without it
        (a client's connection, where ids name the client's requests) the request is answered with
        an `error` instead; a Hand's connection passes one, since there the ids name the Mind's own
        requests and a Hand ends the connection on an `error`."""
        self._channel = channel
        self._q: deque[tuple[Message | _Frame | _Raw, str | None, int]] = deque()
        super().__init__(ws)
        self._closed = False
        self._limit = droppable_limit
        self.on_refused = on_refused
        self.dropped = 0
        self.refused = 0
        self.bound = OutboxBound()
        self.on_overflow: Callable[[], None] | None = None
        self.overflowed = False
        self.drained = asyncio.Event()
        self.drained.set()

    @property
    def channel(self) -> Channel:
        """The connection's channel: the reader decodes with it what the writer stamps."""
        return self._channel

    def put(self, msg: Message, id: str | None = None, droppable: bool = False) -> None:
        if self._closed:
            return
        if droppable and len(self._q) >= self._limit:
            self.dropped += 1
            return
        carried = _carried(msg)
        if not self.bound.add(carried):
            self._overflow()
            return
        self._q.append((msg, id, carried))
        self.drained.clear()
        self._kick()

    def put_raw(self, t: str, p: dict[str, Any], id: str | None = None) -> None:
        """A message of type `t` whose payload map `p` is forwarded as it came (DESIGN §16: a node
        relaying another node's answer to its client never builds the model; the client, which
        reads it, validates it). Stamped when written, under this connection's seq, like `put`;
        counted in the queue's bound as the same message would be."""
        if self._closed:
            return
        carried = _carried_fields(p)
        if not self.bound.add(carried):
            self._overflow()
            return
        self._q.append((_Raw(t, p), id, carried))
        self.drained.clear()
        self._kick()

    def put_frame(self, number: int, offset: int, eof: bool, payload: memoryview | bytes) -> None:
        """A data frame to relay (DESIGN §11b): its header is built here, its payload is written as
        the buffer it came in. Never droppable; counted in the queue's bound like any chunk."""
        if self._closed:
            return
        if not self.bound.add(len(payload)):
            self._overflow()
            return
        self._q.append((_Frame(data_frames.header(number, offset, eof), payload), None, len(payload)))
        self.drained.clear()
        self._kick()

    def _overflow(self) -> None:
        self._q.clear()
        self.bound.queued = 0
        self._closed = self.overflowed = True
        self._wake.set()
        log.warning("outbox_overflow", limit=self.bound.limit)
        if self.on_overflow is not None:
            self.on_overflow()

    def close(self) -> None:
        """Stop after what is already queued has been written."""
        self._closed = True
        self._wake.set()

    def _stamp(self, msg: Message | _Raw, id_: str | None) -> bytes | None:
        """The frame for `msg`, or None if it cannot be sent; then whoever waits on `id_` is told."""
        t = msg.t if isinstance(msg, _Raw) else msg.TYPE
        try:
            if isinstance(msg, _Raw):
                return self._channel.stamp_raw(t, msg.p, id_)
            return self._channel.stamp(msg, id_)
        except ProtocolError as exc:
            why = exc
            log.error("outbound_frame_refused", type=t, id=id_, code=exc.code.value, error=exc.message)
        except Exception as exc:  # a value msgpack cannot encode: a bug, but one reply's, not the connection's
            why = ProtocolError(ErrorCode.INTERNAL_ERROR, f"it could not be encoded ({type(exc).__name__})")
            log.exception("outbound_frame_unencodable", type=t, id=id_)
        self.refused += 1
        if id_ is None or t == "error":
            return None  # nobody to answer (a push), or the answer itself failed: nothing smaller to say
        if self.on_refused is not None:
            self.on_refused(id_, why)
            return None
        answer = Error(code=why.code, message=f"the mind could not send its {t} reply: {why.message}")
        self._q.appendleft((answer, id_, 0))  # next, in this very batch: nothing queued later overtakes it
        return None

    def _pending(self) -> bool:
        return bool(self._q)

    def _stopping(self) -> bool:
        return self._closed

    def _write_failed(self) -> None:
        log.exception("outbox_write_failed")
        self._closed = True

    def _written(self) -> None:
        self.drained.set()

    def _batch(self) -> list[bytes | tuple[bytes, memoryview | bytes]]:
        """The next frames to write together (at most `MAX_BATCH`), stamped now, in queue order."""
        frames: list[bytes | tuple[bytes, memoryview | bytes]] = []
        while self._q and len(frames) < MAX_BATCH:
            msg, id_, carried = self._q.popleft()
            self.bound.sent(carried)
            if isinstance(msg, _Frame):
                frames.append((msg.head, msg.payload))
                continue
            frame = self._stamp(msg, id_)
            if frame is not None:
                frames.append(frame)
        return frames

    async def run(self) -> None:
        try:
            while True:
                while self._q:
                    await write_frames(self._ws, self._batch())
                self.drained.set()
                if self._closed:
                    return
                await self._park()
        except ConnectionClosed:
            self._closed = True
            self.drained.set()


class _Raw:
    """A queued message forwarded as its payload map (`put_raw`)."""

    __slots__ = ("t", "p")

    def __init__(self, t: str, p: dict[str, Any]) -> None:
        self.t = t
        self.p = p


class _Frame:
    """A queued data frame: its header and the payload as received."""

    __slots__ = ("head", "payload")

    def __init__(self, head: bytes, payload: memoryview | bytes) -> None:
        self.head = head
        self.payload = payload


LISTED_ITEM_BYTES = 512
"""What one item of a list reply (`hands_list`, `run_list`, ...) is counted at in the queue: a
little above the size of the Mind's items, so a page of them is not counted as nothing."""


def _carried(msg: Message) -> int:
    """The bytes a queued message holds beyond its fixed fields, estimated without encoding it:
    its data, for the messages that carry a run's bytes (`stream_data`, `run_output`), and its
    lists' items for the replies that page through them."""
    return _carried_fields(msg.__dict__)  # not getattr: a model without `data` would raise and catch inside pydantic


def _carried_fields(fields: dict[str, Any]) -> int:
    """`_carried` of a message's fields (a model's, or a forwarded payload map's)."""
    data = fields.get("data")
    if isinstance(data, (bytes, str)):
        return len(data)
    n = 0
    for v in fields.values():
        if type(v) is list:
            n += len(v)
    return n * LISTED_ITEM_BYTES
