"""A tunnelled connection's socket, read a stream chunk at a time into a buffer of its own: what a
`mind forward` connection is at both of its ends (the client's local socket, `mind/client/forward.py`;
the Hand's socket to the destination, `hand/aio/forwardrun.py`).

asyncio's streams (`StreamReader`) copied every chunk twice (into the reader's buffer, then out of
it), woke a task for each, and read 256 KiB at most, so each of the three hops framed twice the
chunks a stream's 512 KiB allow (issue 40: the Hand's CPU a byte of a tunnel was 2.0 ns against a
process run's 1.4). Here the transport reads into one buffer (`recv_into`; one for every socket of
the thread), and each read is handed on as one copy of its own (`chunk`): the stream keeps a chunk
until the other end acknowledges it, so the buffer itself is never handed on. What the subclass does with a chunk, and when it lets the
transport read, is its own; writing follows the transport's flow control (`drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading

from protocol import limits

READ_CHUNK = limits.STREAM_CHUNK_MAX
"""The most one read takes: one stream chunk, so each hop frames a chunk once."""


_local = threading.local()


def _read_buffer() -> memoryview:
    """The buffer every socket of this thread reads into. One is enough: the transport reads into
    it and hands the bytes over (`buffer_updated`, which copies them out) in one callback, and a
    loop runs on one thread. One a socket would cost 512 KiB each: 10,000 connections at once (a
    flood `mind forward` must survive) were 5 GiB of zeroed pages."""
    buf: memoryview | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(READ_CHUNK))
    return buf


class ChunkSocket(asyncio.BufferedProtocol):
    """The socket's transport, its reads as chunks (`chunk`), its end (`ended`: the peer's EOF, or
    the connection gone), its error (`failed`), and writes with `drain`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = 0
        """Bytes read from the socket so far."""
        self.failed: OSError | None = None
        """What broke the connection (a reset, ...), if something did."""
        self.read_ended = asyncio.Event()
        """The peer's EOF came, or the connection is gone: nothing more will be read."""
        self.closed = asyncio.Event()
        """The connection is gone (`connection_lost`)."""
        self._writable = asyncio.Event()
        self._writable.set()

    # --- what a subclass says ---

    def chunk(self, data: bytes) -> None:
        """One read's bytes (a copy of its own)."""

    def ended(self) -> None:
        """The socket will give nothing more: its EOF, or the connection closed without an error."""

    # --- the transport's calls ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        self.chunk(bytes(_read_buffer()[:nbytes]))

    def eof_received(self) -> bool:
        self._end()
        return True  # a half-close: our side still writes (the other way still flows)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, OSError):
            self.failed = exc
        elif exc is None:
            self._end()  # closed without an EOF first: the end a read of b"" would have been
        self.read_ended.set()
        self.closed.set()
        self._writable.set()

    def _end(self) -> None:
        if not self.read_ended.is_set():
            self.read_ended.set()
            if self.failed is None:
                self.ended()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- reading and writing ---

    def set_reading(self, on: bool) -> None:
        """Let the transport read, or stop it (never after the end: a transport resumed after its
        EOF would read the EOF again)."""
        t = self.transport
        if t is None or t.is_closing() or self.read_ended.is_set():
            return
        if on and not t.is_reading():
            t.resume_reading()
        elif not on and t.is_reading():
            t.pause_reading()

    @property
    def lost(self) -> bool:
        return self.closed.is_set()

    def write(self, data: bytes) -> None:
        """Queue `data` (`drain` for the transport to take it); the connection's error if it broke."""
        if self.lost or self.transport is None:
            raise self.failed or ConnectionResetError("Connection lost")
        self.transport.write(data)

    def writelines(self, chunks: list[bytes]) -> None:
        if self.lost or self.transport is None:
            raise self.failed or ConnectionResetError("Connection lost")
        self.transport.writelines(chunks)

    async def drain(self) -> None:
        """Until the transport takes more (what `StreamWriter.drain` waits for); the connection's
        error if it broke."""
        await self._writable.wait()
        if self.lost:
            raise self.failed or ConnectionResetError("Connection lost")

    def write_eof(self) -> None:
        """The half-close (`shutdown(SHUT_WR)`), where the transport can and the connection stands."""
        t = self.transport
        if t is not None and not self.lost and not t.is_closing() and t.can_write_eof():
            t.write_eof()

    def peer(self) -> object:
        return self.transport.get_extra_info("peername") if self.transport is not None else None

    def nodelay(self) -> None:
        raw = self.transport.get_extra_info("socket") if self.transport is not None else None
        if raw is not None and raw.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def abort(self) -> None:
        """Close at once, dropping what is not written."""
        if self.transport is not None:
            self.transport.abort()

    def reset(self) -> None:
        """Close abortively (SO_LINGER 0): the peer gets a reset, not an EOF."""
        raw = self.transport.get_extra_info("socket") if self.transport is not None else None
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.abort()

    async def close(self, grace: float) -> bool:
        """Close once what is written went out; False (and reset) if that took over `grace` s."""
        if self.transport is not None:
            self.transport.close()
        try:
            await asyncio.wait_for(self.closed.wait(), grace)
            return True
        except TimeoutError:
            self.reset()
            return False
