"""Frames queued together leave in one write: a mixin for websockets' asyncio connections.

Both shells (the Mind's server connections, the Hand's client connection) send bursts: a quick
tool's `accepted` and `result`, pipelined replies, a page of task updates. Written frame by frame,
each is a `send` syscall and a wakeup of the peer; on loopback a frame's `send` was a third of the
Mind's CPU per routed call. With this mixin (`create_connection=` of `serve`/`connect`) everything
the protocol has to send is written with one `writelines`, and `send_many` queues several frames
under one `send_context` (websockets' own state checks, flow control and closing). Frames and
their order are unchanged.

`TurnWriter` is the writer both shells build on it (the Mind's outbox, the Hand's wire): a task
that writes what is queued, and a callback at the end of a turn that writes it without waking the
task when nothing has to wait (`write_now`).

It lives in `protocol` because it is the one piece both shells share and neither may import the
other's; it opens nothing: the mixin only changes how a connection it is mixed into hands bytes to
its transport, and the writer's queue is its subclass's.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from typing import Any

from websockets.protocol import State

from protocol.io.buffers import IOV_MAX, turned, unsent

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets without its C extension
    from websockets.utils import apply_mask

Parts = tuple[bytes, "bytes | memoryview"]
"""A data frame as its header and its payload, written as two buffers (DESIGN §11b): the Mind
relays a payload as the buffer it received, never joined to its header in a new object."""

Frame = "bytes | Parts"

MAX_BATCH = 64
"""Frames written together at most: a long queue still yields to the loop between batches."""

LARGE_FRAME = 64 << 10
"""A whole frame at least this large is framed here as a part of its own (`_send_parts` with an
empty header), not by websockets: its `Frame.serialize` copies the payload into a `BytesIO`
(and a client's masked copy into it again). A 4 MiB `read_file` answer crossed each hop so; small
frames stay with websockets, where one copy costs less than the Python around it."""


class BatchedWrites:
    protocol: Any
    transport: Any

    def send_data(self) -> None:
        chunks = self.protocol.data_to_send()
        if all(chunks):
            if len(chunks) > 1:
                chunks = self._send_now(chunks)
            if chunks:
                self.transport.writelines(chunks)
            return
        for data in chunks:  # an EOF marker among them (closing): upstream's own handling
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                try:
                    self.transport.write_eof()
                except Exception:  # as websockets: write_eof() documents no exceptions
                    pass
            else:
                self.transport.close()

    def _send_now(self, chunks: list[Any]) -> list[Any]:
        """As much of `chunks` as the socket takes now, with one `sendmsg`: what is left, for the
        transport. Python 3.11's `writelines` joins its buffers into a new object first (3.12 no
        longer does), a copy of every byte of a stream, and of each frame's header and payload
        kept apart so far. Only on a plain socket transport with nothing waiting in its buffer (the
        order of bytes is kept); TLS, an error, a full socket: the transport's own way."""
        t = self.transport
        sock = getattr(t, "_sock", None)
        if type(sock) is not socket.socket or t.get_write_buffer_size() or t.is_closing():
            return chunks
        try:
            n = sock.sendmsg(chunks[:IOV_MAX])
        except (BlockingIOError, InterruptedError):
            return chunks
        except OSError:
            return chunks  # the transport meets it again, and handles it its way
        return unsent(chunks, n)

    async def send_many(self, frames: list[Any]) -> None:
        async with self.send_context():  # type: ignore[attr-defined]
            self._frame_all(frames)

    def writable_now(self) -> bool:
        """Frames may be written without awaiting anything: the connection is open, no close is
        under way, and flow control has not paused writing (what `send_context` would wait for)."""
        return (
            self.protocol.state is State.OPEN
            and not getattr(self, "paused", True)
            and not self.transport.is_closing()
            and not self.protocol.close_expected()
        )

    def write_now(self, frames: list[Any]) -> None:
        """`send_many` without its awaits, for a writer that found `writable_now` true in the same
        turn: the frames go to the socket (or the transport's buffer) before this returns."""
        self._frame_all(frames)
        self.send_data()

    def _frame_all(self, frames: list[Any]) -> None:
        for frame in frames:
            if isinstance(frame, tuple):
                self._send_parts(frame)
            elif len(frame) >= LARGE_FRAME:
                self._send_parts((b"", frame))
            else:
                self.protocol.send_binary(frame)

    def _send_parts(self, parts: Parts) -> None:
        """One binary message of `header + payload`, framed here so the payload reaches the
        transport as the buffer it is (websockets would copy it into a new frame, twice): a
        server's as it is, a client's masked (RFC 6455 5.3: a fresh key per frame), which is the
        one copy it costs. Only on an open connection without extensions (we never negotiate
        compression) and outside a fragmented message; anything else goes through websockets' own
        framing."""
        proto = self.protocol
        head, payload = parts
        writes = getattr(proto, "writes", None)
        if (
            writes is None
            or getattr(proto, "side", None) is None
            or proto.state.name != "OPEN"
            or getattr(proto, "extensions", None)
            or getattr(proto, "expect_continuation_frame", True)
            or not payload
        ):
            proto.send_binary(head + bytes(payload) if head else payload)
            return
        size = len(head) + len(payload)
        client = proto.side.name == "CLIENT"
        bit = 0x80 if client else 0
        if size < 126:
            ws_head = struct.pack("!BB", 0x82, bit | size)
        elif size < 65536:
            ws_head = struct.pack("!BBH", 0x82, bit | 126, size)
        else:
            ws_head = struct.pack("!BBQ", 0x82, bit | 127, size)
        if client:
            key = os.urandom(4)
            writes.append(ws_head + key + apply_mask(head, key) if head else ws_head + key)
            writes.append(apply_mask(payload, turned(key, len(head))))
            return
        writes.append(ws_head + head)
        writes.append(payload)


async def write_frames(ws: Any, frames: list[Any]) -> None:
    """The one frame writer of both shells (the Mind's outbox, the Hand's wire): frames queued
    together go under one `send_context` when the connection batches (`BatchedWrites`), else one
    `send` each. Either way in order; `ConnectionClosed` reaches the caller, who owns the queue."""
    if isinstance(ws, BatchedWrites):
        await ws.send_many(frames)
        return
    for frame in frames:
        if isinstance(frame, tuple):
            if isinstance(ws, BatchedWrites):
                await ws.send_many([frame])
            else:
                await ws.send(frame[0] + bytes(frame[1]))
        else:
            await ws.send(frame)


class TurnWriter:
    """A connection's one writer: a task that writes what is queued, and the end-of-turn write that
    spares waking it (both shells' writers are one: the Mind's outbox, the Hand's wire).

    A frame queued while the task is parked (waiting, nothing of its own in flight) is not handed
    to the task: one plain callback at the end of the turn writes everything the turn queued, in
    one write, synchronously (`BatchedWrites.write_now`). Waking the task instead cost a task step
    and websockets' `send_context` per write, and a routed call makes two such writes on the Mind
    and one on the Hand (profile of 3,000 `read_file`s: ~44 Python calls per call on the Mind).
    Order is kept because the callback writes only while the task is parked, and the task writes
    whatever the callback cannot (flow control paused, the connection closing, an error).

    A subclass holds the queue: `_pending` (anything queued), `_batch` (take the next frames, at
    most `MAX_BATCH`), `_stopping` (closed: the task writes what is left and returns) and
    `_write_failed` (an unexpected error while writing: the connection ends)."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._wake = asyncio.Event()
        self._parked = False
        self._soon = False
        """A `_write_soon` is scheduled."""

    def _pending(self) -> bool:
        raise NotImplementedError

    def _batch(self) -> list[Any]:
        raise NotImplementedError

    def _stopping(self) -> bool:
        raise NotImplementedError

    def _write_failed(self) -> None:
        raise NotImplementedError

    def _written(self) -> None:
        """The queue was written to the end by `_write_soon` (the outbox's `drained`)."""

    def _kick(self) -> None:
        """Have what was just queued written: at the end of this turn if the task is parked, else
        by the task."""
        if not self._parked:
            self._wake.set()
            return
        if self._soon:
            return
        try:
            asyncio.get_running_loop().call_soon(self._write_soon)
        except RuntimeError:  # no loop (a test driving a shell by hand): the task's way
            self._wake.set()
            return
        self._soon = True

    def _write_soon(self) -> None:
        self._soon = False
        ws = self._ws
        while self._pending() and self._parked and not self._stopping():
            if not (isinstance(ws, BatchedWrites) and ws.writable_now()):
                break
            try:
                ws.write_now(self._batch())
            except Exception:  # as websockets' `send_context`: a bug's last net, the connection ends
                self._write_failed()
                ws.transport.abort()
                self._wake.set()
                return
        if self._pending() or self._stopping():
            self._wake.set()
        else:
            self._written()

    async def _park(self) -> None:
        """Wait for work the end-of-turn write left to the task (or a stop)."""
        self._wake.clear()
        self._parked = True
        try:
            await self._wake.wait()
        finally:
            self._parked = False
