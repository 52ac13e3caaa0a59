"""`protocol.io.sockets.ChunkSocket`, the socket at both ends of a tunnelled connection, against a
real peer on loopback: every byte once and in order however its reading is paused and resumed,
the end said once and after the last chunk, the half-close (our answer still reaches a peer that
sent its EOF), and a reset told as the error it is, never as an end."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket

import pytest

from protocol.io.sockets import READ_CHUNK, ChunkSocket

WAIT_S = 10.0


class Recorder(ChunkSocket):
    def __init__(self) -> None:
        super().__init__()
        self.got = bytearray()
        self.sizes: list[int] = []
        self.ends = 0
        self.got_after_end = False
        self.got_some = asyncio.Event()

    def chunk(self, data: bytes) -> None:
        assert isinstance(data, bytes)  # a copy of its own, never a view of the buffer read into
        if self.ends:
            self.got_after_end = True
        self.got += data
        self.sizes.append(len(data))
        self.got_some.set()

    def ended(self) -> None:
        self.ends += 1


async def _pair() -> tuple[Recorder, socket.socket]:
    """Our protocol on one end of a loopback TCP connection, a plain blocking socket on the other."""
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    listener.close()
    ours.setblocking(False)
    _, proto = await asyncio.get_running_loop().connect_accepted_socket(Recorder, ours)
    return proto, peer


async def test_every_byte_arrives_once_in_order_while_reading_pauses_and_resumes() -> None:
    sock, peer = await _pair()
    data = os.urandom(3 * READ_CHUNK + 12345)
    sender = asyncio.get_running_loop().run_in_executor(
        None, lambda: (peer.sendall(data), peer.shutdown(socket.SHUT_WR))
    )
    try:
        turn = 0
        while not sock.read_ended.is_set():
            turn += 1
            sock.set_reading(turn % 3 != 0)  # a reader without credit every third turn
            await asyncio.sleep(0.001)
            if turn > 20_000:
                pytest.fail("the stream never ended")
        await asyncio.wait_for(sender, WAIT_S)
        sock.set_reading(True)  # after the end: must not read the EOF a second time
        await asyncio.sleep(0.01)
        assert hashlib.sha256(sock.got).digest() == hashlib.sha256(data).digest()
        assert sock.received == len(data)
        assert max(sock.sizes) <= READ_CHUNK
        assert sock.ends == 1 and not sock.got_after_end
        assert sock.failed is None
    finally:
        sock.abort()
        peer.close()


async def test_a_half_close_still_carries_the_answer_back() -> None:
    sock, peer = await _pair()
    try:
        peer.sendall(b"question")
        peer.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(sock.read_ended.wait(), WAIT_S)
        assert bytes(sock.got) == b"question" and sock.ends == 1
        sock.write(b"answer")
        await sock.drain()
        sock.write_eof()
        peer.settimeout(WAIT_S)
        got = b""
        while chunk := peer.recv(100):
            got += chunk
        assert got == b"answer"
        assert await sock.close(WAIT_S)
    finally:
        sock.abort()
        peer.close()


async def test_a_reset_is_an_error_not_an_end() -> None:
    sock, peer = await _pair()
    try:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        peer.close()  # SO_LINGER 0: a reset
        await asyncio.wait_for(sock.closed.wait(), WAIT_S)
        assert isinstance(sock.failed, ConnectionResetError)
        assert sock.ends == 0
        with pytest.raises(ConnectionResetError):
            sock.write(b"x")
        with pytest.raises(ConnectionResetError):
            await sock.drain()
    finally:
        sock.abort()


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_an_idle_connection_costs_no_read_buffer_of_its_own() -> None:
    """`mind forward` may hold thousands of connections at once (a flood of 10,000 is refused past
    the budget, but each is accepted first): a 512 KiB buffer each would be gigabytes. 300 idle
    connections that each read a byte must cost well under 64 KiB each."""
    pairs = []
    try:
        before = _rss_kib()
        for _ in range(300):
            sock, peer = await _pair()
            pairs.append((sock, peer))
            peer.sendall(b"x")
        for sock, _ in pairs:
            await asyncio.wait_for(sock.got_some.wait(), WAIT_S)
        grown = _rss_kib() - before
        assert grown < 300 * 64, f"{grown} KiB for 300 idle connections"
    finally:
        for sock, peer in pairs:
            sock.abort()
            peer.close()
