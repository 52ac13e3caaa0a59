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
- `-R` (`_listen`): a run that listens on the Hand's loopback and announces, one JSON line each on
  stdout, where it listens and each connection it accepted, parked under a random token until the
  client's `forward` run of `accepted` takes it (then carried as above) or drops it (`close`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import secrets
import socket
from collections import deque
from typing import Any

from hand.aio.copyrun import Interrupted, _either, _Gate
from hand.aio.streams import RunStreams
from hand.core.forwards import endpoint
from hand.system.tools import ClaimTarget, ForwardTarget, ListenTarget, StreamCall, ToolFailed, resolve_forward
from protocol.control import RunControl

READ_CHUNK = 256 << 10


class _Pipes(_Gate):
    """`RunStreams`' pipes for a connection: the read side open while the client has credit (a
    copy's `_Gate`), and stdin chunks queued for the writer."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[bytes] = []
        self.eof = False
        self.ready = asyncio.Event()

    def write_stdin(self, data: bytes) -> None:
        self.chunks.append(data)
        self.ready.set()

    def close_stdin(self) -> None:
        self.eof = True
        self.ready.set()


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


def _failure(target: ForwardTarget | ClaimTarget, exc: OSError) -> ToolFailed:
    if isinstance(exc, ConnectionRefusedError):
        return ToolFailed(f"{target.shown} refused the connection")
    if isinstance(exc, ConnectionResetError | BrokenPipeError) or exc.errno == errno.ENOTCONN:
        return ToolFailed(f"connection reset by {target.shown}")  # ENOTCONN: the half-close met a reset
    if isinstance(exc, FileNotFoundError):
        return ToolFailed(f"{target.shown}: no such socket")
    return ToolFailed(f"cannot reach {target.shown}: {exc.strerror or type(exc).__name__}")


KINDS = frozenset({"forward", "listen", "claim"})
PARK_S = 60.0
"""How long a connection accepted for a `-R` forward waits for the client to take it (its run may
be held up by a cut of the client's leg): then it is reset."""
PARK_MAX = 1024
"""Accepted connections waiting at once, every listener together: past it a new one is reset."""
_parked: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.TimerHandle]] = {}


def _park(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
    if len(_parked) >= PARK_MAX:
        writer.transport.abort()
        return None
    token = secrets.token_hex(16)
    timer = asyncio.get_running_loop().call_later(PARK_S, _expire, token)
    _parked[token] = (reader, writer, timer)
    return token


def _expire(token: str) -> None:
    entry = _parked.pop(token, None)
    if entry is not None:
        entry[1].transport.abort()


def _unpark(token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    entry = _parked.pop(token, None)
    if entry is None:
        return None
    entry[2].cancel()
    return entry[0], entry[1]


async def drive(call: StreamCall, streams: RunStreams, ctl: RunControl) -> dict[str, Any]:
    """Carry the connection (or, for `-R`, listen); its value, or `ToolFailed`, or `Interrupted`."""
    target = call.make()
    stopped = asyncio.Event()
    unregister = ctl.cancellation.on_cancel(lambda _reason: stopped.set())
    try:
        if ctl.cancellation.cancelled:
            raise Interrupted("stopped before it began")
        if isinstance(target, ListenTarget):
            return await _listen(target, streams, stopped)
        if isinstance(target, ClaimTarget):
            taken = _unpark(target.token)
            if taken is None:
                raise ToolFailed("the connection accepted on the hand is gone (not taken within 60 s)")
            if target.close:  # the client could not reach its side: the peer sees a reset at once
                taken[1].transport.abort()
                return {"sent": 0, "received": 0}
            return await _carry(target, *taken, streams, stopped)
        try:
            reader, writer = await _connect(target)
        except OSError as exc:
            raise _failure(target, exc) from None
        return await _carry(target, reader, writer, streams, stopped)
    finally:
        unregister()


async def _carry(
    target: ForwardTarget | ClaimTarget,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    streams: RunStreams,
    stopped: asyncio.Event,
) -> dict[str, Any]:
    """Both ways at once until both are closed (one failing stops the other)."""
    try:
        _nodelay(writer)
        pipes = _Pipes()
        streams.attach(pipes)  # stdin that came early is fed now (at most a window)
        streams.on_output_end("stderr")
        counts = {"sent": 0, "received": 0}
        try:
            async with asyncio.TaskGroup() as tg:
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
        writer.transport.abort()  # a run stopped or failed midway resets the other side


async def _listen(target: ListenTarget, streams: RunStreams, stopped: asyncio.Event) -> dict[str, Any]:
    """`-R`: listen on the Hand; each accepted connection is parked under a token and announced on
    stdout as a JSON line (`{"accepted": TOKEN, "peer": ...}`), after one `{"listening": ...}`.
    Lines wait for the client's credit like any output. Ends only by a cancel (the client's forward
    closing, the run's deadline, the Hand's shutdown): the listener closes, and what it accepted and
    nobody took is reset."""
    pipes = _Pipes()
    streams.attach(pipes)
    streams.on_output_end("stderr")
    lines: deque[bytes] = deque()
    wake = asyncio.Event()
    mine: set[str] = set()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        token = _park(reader, writer)
        if token is None:
            return
        mine.add(token)
        peer = writer.get_extra_info("peername")
        shown = endpoint(str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else "?"
        lines.append(json.dumps({"accepted": token, "peer": shown}).encode() + b"\n")
        wake.set()

    try:
        server = await asyncio.start_server(accepted, target.bind, target.port, limit=READ_CHUNK)
    except OSError as exc:
        raise ToolFailed(f"cannot listen on {endpoint(target.bind, target.port)}: {exc.strerror or exc}") from None
    try:
        host, port = server.sockets[0].getsockname()[:2]
        lines.append(json.dumps({"listening": endpoint(str(host), int(port))}).encode() + b"\n")
        wake.set()
        while True:
            await _either(wake, stopped)
            if stopped.is_set() or pipes.gone:
                raise Interrupted("the listener was closed")
            wake.clear()
            while lines:
                if not pipes.open.is_set():  # no credit: the lines wait (bounded by PARK_MAX)
                    await _either(pipes.open, stopped)
                    if stopped.is_set() or pipes.gone:
                        raise Interrupted("the listener was closed")
                streams.on_output("stdout", lines.popleft())
    finally:
        server.close()
        for token in mine:
            _expire(token)


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
