"""A `forward` run on the Hand (`mind forward`, DESIGN §18): one TCP connection (or one to a Unix
socket inside the root) connected to the run's streams, with the same credit windows as a process
run, so a tunnelled connection is an ordinary run: it rides out cuts of either leg and a restart of
the Mind like any other (its streams resume where they stood), is audited, scoped and policed as one.

- `stdin` -> the socket: a chunk is written, and acknowledged (`on_stdin_consumed`) only once the
  socket took it (`drain`), so a destination that does not read holds the client back by its window
  and no memory grows here. The stdin stream's end is a half-close (`shutdown(SHUT_WR)`): the answer
  still flows back.
- the socket -> `stdout`: read only while the client has credit (`pause_output`), so a slow client
  slows the destination's sends, not our memory. The socket's EOF ends the stream.
- The run ends `succeeded` once both directions are closed and every byte was sent, with what went
  each way; a connection refused, reset or unreachable ends it `failed` with one sentence naming the
  destination (the client then closes its side at once: no hang).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from hand.aio.copyrun import Interrupted, _either
from hand.aio.streams import RunStreams
from hand.system.tools import ForwardTarget, StreamCall, ToolFailed, resolve_forward
from protocol.control import RunControl

READ_CHUNK = 256 << 10


class _Pipes:
    """`RunStreams`' pipes for a connection: stdin chunks queued for the writer; the read side open
    while the client has credit."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.ready = asyncio.Event()
        self.open = asyncio.Event()
        self.open.set()
        self.gone = False

    def write_stdin(self, data: bytes) -> None:
        self.chunks.append(data)
        self.ready.set()

    def close_stdin(self) -> None:
        self.eof = True
        self.ready.set()

    def pause_output(self, stream: str) -> None:
        if stream == "stdout":
            self.open.clear()

    def resume_output(self, stream: str) -> None:
        if stream == "stdout":
            self.open.set()

    def close_output(self, stream: str) -> None:
        if stream == "stdout":
            self.gone = True
            self.open.set()


async def _connect(target: ForwardTarget) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if target.path is not None:
        return await asyncio.open_unix_connection(str(target.path), limit=READ_CHUNK)
    assert target.port is not None
    addresses = await asyncio.to_thread(resolve_forward, target)  # the addresses checked are the ones tried
    last: OSError | None = None
    for address in addresses:
        try:
            return await asyncio.open_connection(address, target.port, limit=READ_CHUNK)
        except OSError as exc:
            last = exc
    assert last is not None
    raise last


def _failure(target: ForwardTarget, exc: OSError) -> ToolFailed:
    if isinstance(exc, ConnectionRefusedError):
        return ToolFailed(f"{target.shown} refused the connection")
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return ToolFailed(f"connection reset by {target.shown}")
    if isinstance(exc, FileNotFoundError):
        return ToolFailed(f"{target.shown}: no such socket")
    return ToolFailed(f"cannot reach {target.shown}: {exc.strerror or type(exc).__name__}")


async def drive(call: StreamCall, streams: RunStreams, ctl: RunControl) -> dict[str, Any]:
    """Carry the connection; its value (bytes each way), or `ToolFailed`, or `Interrupted`."""
    target: ForwardTarget = call.make()
    stopped = asyncio.Event()
    unregister = ctl.cancellation.on_cancel(lambda _reason: stopped.set())
    writer: asyncio.StreamWriter | None = None
    try:
        if ctl.cancellation.cancelled:
            raise Interrupted("stopped before it began")
        try:
            reader, writer = await _connect(target)
        except OSError as exc:
            raise _failure(target, exc) from None
        _nodelay(writer)
        pipes = _Pipes()
        streams.attach(pipes)  # stdin that came early is fed now (at most a window)
        streams.on_output_end("stderr")
        counts = {"sent": 0, "received": 0}
        try:
            async with asyncio.TaskGroup() as tg:  # both ways at once; one failing stops the other
                tg.create_task(_to_client(reader, streams, pipes, stopped, counts))
                tg.create_task(_to_destination(writer, streams, pipes, stopped, counts))
        except ExceptionGroup as group:
            broken = [e for e in group.exceptions if isinstance(e, OSError)]
            if broken:
                raise _failure(target, broken[0]) from None
            if all(isinstance(e, Interrupted) for e in group.exceptions):
                raise Interrupted("stopped") from None
            raise
        await _either(streams.flushed, stopped)
        if not streams.flushed.is_set():
            raise Interrupted("the stream did not end")
        return counts
    finally:
        unregister()
        if writer is not None:
            writer.transport.abort()  # a run stopped or failed midway resets the destination's side


async def _to_client(
    reader: asyncio.StreamReader, streams: RunStreams, pipes: _Pipes, stopped: asyncio.Event, counts: dict[str, int]
) -> None:
    while True:
        await _either(pipes.open, stopped)
        if stopped.is_set() or pipes.gone:
            raise Interrupted("the reader went away")
        data = await reader.read(READ_CHUNK)
        if not data:
            streams.on_output_end("stdout")
            return
        counts["received"] += len(data)
        streams.on_output("stdout", data)


async def _to_destination(
    writer: asyncio.StreamWriter, streams: RunStreams, pipes: _Pipes, stopped: asyncio.Event, counts: dict[str, int]
) -> None:
    while True:
        await _either(pipes.ready, stopped)
        if stopped.is_set():
            raise Interrupted("stopped")
        pipes.ready.clear()
        chunks, pipes.chunks = pipes.chunks, []
        if chunks:
            writer.writelines(chunks)
            await writer.drain()
            counts["sent"] += sum(len(c) for c in chunks)
            streams.on_stdin_consumed(counts["sent"])
        if pipes.eof and not pipes.chunks:
            if writer.can_write_eof():
                writer.write_eof()  # the half-close: the destination reads EOF, its answer still comes
            return


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
