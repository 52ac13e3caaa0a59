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
from collections import deque
from collections.abc import Callable
from typing import Any

from hand.aio.copyrun import Interrupted, _either, _Gate
from hand.aio.streams import RunStreams
from hand.core.forwards import endpoint
from hand.system.tools import (
    ClaimTarget,
    ForwardTarget,
    ListenTarget,
    StreamCall,
    ToolFailed,
    ip_literal,
    resolve_forward,
)
from protocol.control import RunControl
from protocol.io.sockets import ChunkSocket


class _Socket(ChunkSocket):
    """The connection to the destination (`protocol.io.sockets`): each read goes to the run's
    stdout in the transport's own callback. Nothing is read until the run carries the connection
    (`carry`), and then only while the client has credit (`pause`/`resume`, driven by
    `RunStreams`): a slow client slows the destination's sends, never our memory, and a `-R`
    connection parked for its claim is not read at all."""

    def __init__(self, on_made: Callable[[_Socket], None] | None = None) -> None:
        super().__init__()
        self._on_made = on_made
        self._streams: RunStreams | None = None
        self._credit = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.set_reading(False)
        if self._on_made is not None:
            self._on_made(self)

    def carry(self, streams: RunStreams) -> None:
        """Read into `streams`' stdout from now on, while it has credit."""
        self._streams = streams
        self.set_reading(self._credit)

    def pause(self) -> None:
        self._credit = False
        self.set_reading(False)

    def resume(self) -> None:
        self._credit = True
        self.set_reading(self._streams is not None)

    def chunk(self, data: bytes) -> None:
        if self._streams is not None:
            self._streams.on_output("stdout", data)

    def ended(self) -> None:
        if self._streams is not None:
            self._streams.on_output_end("stdout")

    def abort(self) -> None:
        """Reset the connection; nothing more reaches the run's streams (they may have ended)."""
        self._streams = None
        super().abort()


class _Pipes:
    """`RunStreams`' pipes for a connection: the read side follows the client's credit, and stdin
    chunks are queued for the writer."""

    def __init__(self, sock: _Socket) -> None:
        self.sock = sock
        self.chunks: list[bytes] = []
        self.eof = False
        self.ready = asyncio.Event()
        self.gone = asyncio.Event()
        """The client stopped reading the run's stdout (it went away)."""

    def pause_output(self, stream: str) -> None:
        if stream == "stdout":
            self.sock.pause()

    def resume_output(self, stream: str) -> None:
        if stream == "stdout":
            self.sock.resume()

    def close_output(self, stream: str) -> None:
        if stream == "stdout":
            self.gone.set()

    def write_stdin(self, data: bytes) -> None:
        self.chunks.append(data)
        self.ready.set()

    def close_stdin(self) -> None:
        self.eof = True
        self.ready.set()


async def _connect(target: ForwardTarget) -> _Socket:
    loop = asyncio.get_running_loop()
    if target.path is not None:
        return (await loop.create_unix_connection(_Socket, str(target.path)))[1]
    assert target.port is not None
    if ip_literal(target.host or "") is not None:  # nothing to look up: no thread hop for it
        addresses = resolve_forward(target)
    else:
        addresses = await asyncio.to_thread(resolve_forward, target)  # the addresses checked are the ones tried
    last: OSError | None = None
    for address in addresses:
        try:
            return (await loop.create_connection(_Socket, address, target.port))[1]
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
_parked: dict[str, tuple[_Socket, asyncio.TimerHandle]] = {}


def _park(sock: _Socket) -> str | None:
    if len(_parked) >= PARK_MAX:
        sock.abort()
        return None
    token = secrets.token_hex(16)
    timer = asyncio.get_running_loop().call_later(PARK_S, _expire, token)
    _parked[token] = (sock, timer)
    return token


def _expire(token: str) -> None:
    entry = _parked.pop(token, None)
    if entry is not None:
        entry[0].abort()


def _unpark(token: str) -> _Socket | None:
    entry = _parked.pop(token, None)
    if entry is None:
        return None
    entry[1].cancel()
    return entry[0]


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
                taken.abort()
                return {"sent": 0, "received": 0}
            return await _carry(target, taken, streams, stopped)
        try:
            sock = await _connect(target)
        except OSError as exc:
            raise _failure(target, exc) from None
        return await _carry(target, sock, streams, stopped)
    finally:
        unregister()


async def _carry(
    target: ForwardTarget | ClaimTarget, sock: _Socket, streams: RunStreams, stopped: asyncio.Event
) -> dict[str, Any]:
    """Both ways at once until both are closed (one failing stops the other)."""
    try:
        sock.nodelay()
        pipes = _Pipes(sock)
        streams.attach(pipes)  # stdin that came early is fed now (at most a window)
        streams.on_output_end("stderr")
        sock.carry(streams)
        sent = [0]
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_from_destination(sock, pipes, stopped))
                tg.create_task(_to_destination(sock, streams, pipes, stopped, sent))
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
        return {"sent": sent[0], "received": sock.received}
    finally:
        sock.abort()  # a run stopped or failed midway resets the other side


async def _listen(target: ListenTarget, streams: RunStreams, stopped: asyncio.Event) -> dict[str, Any]:
    """`-R`: listen on the Hand; each accepted connection is parked under a token and announced on
    stdout as a JSON line (`{"accepted": TOKEN, "peer": ...}`), after one `{"listening": ...}`.
    Lines wait for the client's credit like any output. Ends only by a cancel (the client's forward
    closing, the run's deadline, the Hand's shutdown): the listener closes, and what it accepted and
    nobody took is reset."""
    pipes = _Gate()
    streams.attach(pipes)
    streams.on_output_end("stderr")
    lines: deque[bytes] = deque()
    wake = asyncio.Event()
    mine: set[str] = set()

    def accepted(sock: _Socket) -> None:
        token = _park(sock)
        if token is None:
            return
        mine.add(token)
        peer = sock.peer()
        shown = endpoint(str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else "?"
        lines.append(json.dumps({"accepted": token, "peer": shown}).encode() + b"\n")
        wake.set()

    try:
        server = await asyncio.get_running_loop().create_server(lambda: _Socket(accepted), target.bind, target.port)
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


async def _from_destination(sock: _Socket, pipes: _Pipes, stopped: asyncio.Event) -> None:
    """Until the destination's EOF (the socket feeds stdout itself, `_Socket`); the connection's
    error if it broke; `Interrupted` if the run stopped or the client stopped reading."""
    done = asyncio.ensure_future(sock.read_ended.wait())
    waits = [done, asyncio.ensure_future(stopped.wait()), asyncio.ensure_future(pipes.gone.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if stopped.is_set() or pipes.gone.is_set():
        raise Interrupted("the reader went away")
    if sock.failed is not None:
        raise sock.failed


async def _to_destination(
    sock: _Socket, streams: RunStreams, pipes: _Pipes, stopped: asyncio.Event, sent: list[int]
) -> None:
    while True:
        await _either(pipes.ready, stopped)
        if stopped.is_set():
            raise Interrupted("stopped")
        pipes.ready.clear()
        chunks, pipes.chunks = pipes.chunks, []
        if chunks:
            sock.writelines(chunks)
            await sock.drain()
            sent[0] += sum(len(c) for c in chunks)
            streams.on_stdin_consumed(sent[0])
        if pipes.eof and not pipes.chunks:
            sock.write_eof()  # the half-close: the destination reads EOF, its answer still comes
            return
