"""Our frame reader against websockets' own, as the oracle: the same bytes, cut into the same
chunks, fed to a connection with `FrameReader` and to a plain one must give the same messages (in
order, byte for byte), write the same bytes back (pongs, close frames) and end in the same state
with the same close codes: pings, closes, text, fragments, reserved bits, wrong masks and frames
over the limit included. Each connection has a real transport (one end of a socket pair)."""

from __future__ import annotations

import asyncio
import os
import socket

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.connection import Connection
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import CLIENT, SERVER, Protocol, Side, State
from websockets.streams import StreamReader

from protocol.io.framereader import FrameReader

MAX = 70_000


class Ours(FrameReader, Connection):
    pass


FRAMES = st.one_of(
    st.tuples(st.just("binary"), st.sampled_from([0, 1, 125, 126, 127, 65535, 65536, MAX]) | st.integers(0, 3000)),
    st.tuples(st.just("ping"), st.integers(0, 125)),
    st.tuples(st.just("pong"), st.integers(0, 125)),
    st.tuples(st.just("text"), st.integers(0, 300)),
    st.tuples(st.just("fragments"), st.integers(0, 3000)),
    st.tuples(st.just("first_fragment"), st.integers(0, 300)),
    st.tuples(st.just("rsv1"), st.integers(0, 100)),
    st.tuples(st.just("wrong_mask"), st.integers(0, 100)),
    st.tuples(st.just("too_big"), st.sampled_from([MAX + 1, 1 << 20])),
    st.tuples(st.just("big_ping"), st.just(200)),
    st.tuples(st.just("close"), st.just(0)),
)


def _wire(frames: list[tuple[str, int]], side: Side) -> bytes:
    """What the peer of a `side` connection sends (masked toward a server)."""
    mask = side is SERVER
    out = []
    for kind, n in frames:
        data = os.urandom(n)
        if kind == "binary":
            out.append(Frame(Opcode.BINARY, data).serialize(mask=mask))
        elif kind == "ping":
            out.append(Frame(Opcode.PING, data).serialize(mask=mask))
        elif kind == "pong":
            out.append(Frame(Opcode.PONG, data).serialize(mask=mask))
        elif kind == "text":
            out.append(Frame(Opcode.TEXT, b"x" * n).serialize(mask=mask))
        elif kind == "fragments":
            out.append(Frame(Opcode.BINARY, data[: n // 2], fin=False).serialize(mask=mask))
            out.append(Frame(Opcode.CONT, data[n // 2 :]).serialize(mask=mask))
        elif kind == "first_fragment":  # no continuation follows: a binary frame next is an error
            out.append(Frame(Opcode.BINARY, data, fin=False).serialize(mask=mask))
        elif kind == "rsv1":
            wire = Frame(Opcode.BINARY, data).serialize(mask=mask)
            out.append(bytes([wire[0] | 0x40]) + wire[1:])
        elif kind == "wrong_mask":
            out.append(Frame(Opcode.BINARY, data).serialize(mask=not mask))
        elif kind in ("too_big", "big_ping"):  # the header alone: its length says it all
            op = 0x82 if kind == "too_big" else 0x89
            head = bytes([op, (0x80 if mask else 0) | 127]) + n.to_bytes(8, "big")
            out.append(head + (os.urandom(4) if mask else b"") + os.urandom(64))
        elif kind == "close":
            out.append(Frame(Opcode.CLOSE, Close(1000, "bye").serialize()).serialize(mask=mask))
    return b"".join(out)


def _frames_in(written: bytes, side: Side) -> list[tuple[Opcode, bytes, bool]]:
    """The frames a `side` connection wrote, unmasked (a client masks each with a random key)."""
    reader = StreamReader()
    reader.feed_data(written)
    reader.feed_eof()
    out = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=side is CLIENT)
        try:
            while True:
                next(parser)
        except StopIteration as done:
            f = done.value
            out.append((f.opcode, bytes(f.data), f.fin))
    return out


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def _read_into(conn: Ours, chunk: bytes) -> None:
    """What a transport does with a `BufferedProtocol`: each read goes into the room it offers."""
    off = 0
    while off < len(chunk):
        room = conn.get_buffer(-1)
        n = min(len(room), len(chunk) - off)
        room[:n] = chunk[off : off + n]
        room.release()
        conn.buffer_updated(n)
        off += n


async def _feed(
    cls: type[Connection], side: Side, chunks: list[bytes], eof: bool = True, buffered: bool = False
) -> tuple:
    loop = asyncio.get_running_loop()
    mine, theirs = socket.socketpair()
    theirs.setblocking(False)
    proto = Protocol(side, state=State.OPEN, max_size=MAX)
    conn = cls(proto, ping_interval=None, close_timeout=None, max_queue=None)
    transport, _ = await loop.connect_accepted_socket(lambda: conn, mine)
    try:
        for chunk in chunks:
            if buffered:
                assert isinstance(conn, Ours)
                _read_into(conn, chunk)
            else:
                conn.data_received(chunk)
        if eof:
            conn.eof_received()
        await asyncio.sleep(0)
        messages = [(f.opcode, bytes(f.data), f.fin) for f in conn.recv_messages.frames.queue]
        written = b""
        while True:
            try:
                got = theirs.recv(1 << 20)
            except BlockingIOError:
                break
            if not got:
                break
            written += got
        rcvd, sent = proto.close_rcvd, proto.close_sent
        return (
            messages,
            _frames_in(written, side),
            proto.state,
            rcvd and (rcvd.code, rcvd.reason),
            sent and (sent.code, sent.reason),
        )
    finally:
        transport.abort()
        theirs.close()


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(FRAMES, min_size=1, max_size=8),
    points=st.lists(st.integers(0, 1 << 30), max_size=12),
    server=st.booleans(),
    eof=st.booleans(),
    buffered=st.booleans(),
)
def test_our_reader_does_what_websockets_does(frames, points, server, eof, buffered):
    # `buffered`: read as a transport reads a `BufferedProtocol` (into the room the reader offers),
    # else given as bytes (`data_received`: the handshake's leftovers, a mixin's held bytes)
    side = SERVER if server else CLIENT
    chunks = _cuts(_wire(frames, side), points)

    async def both():
        return await _feed(Ours, side, chunks, eof, buffered), await _feed(Connection, side, chunks, eof)

    ours, theirs = asyncio.run(both())
    assert ours == theirs


def test_a_binary_frame_is_one_message_whatever_the_chunks():
    payload = os.urandom(20_000)  # a 16-bit length, every byte of it fed alone in the first pass
    wire = Frame(Opcode.BINARY, payload).serialize(mask=True) * 2
    for step in (1, 7, 4096, len(wire) // 2 - 1, len(wire)):
        chunks = [wire[i : i + step] for i in range(0, len(wire), step)]
        for buffered in (False, True):
            messages, written, *_ = asyncio.run(_feed(Ours, SERVER, chunks, buffered=buffered))
            assert messages == [(Opcode.BINARY, payload, True)] * 2
            assert written == []


def test_every_kind_of_frame_before_and_after_every_other():
    # What random lists reach rarely: a binary frame right after a fragment left open, a ping
    # announcing more than a control frame may carry with nothing after it, and so on.
    kinds = [
        ("binary", 300),
        ("binary", 70_000),
        ("ping", 3),
        ("pong", 3),
        ("text", 5),
        ("fragments", 40),
        ("first_fragment", 9),
        ("rsv1", 4),
        ("wrong_mask", 4),
        ("too_big", MAX + 1),
        ("big_ping", 200),
        ("close", 0),
    ]

    async def pairs():
        for side in (SERVER, CLIENT):
            for a in kinds:
                for b in kinds:
                    wire = _wire([a, b], side)
                    for chunks in ([wire], _cuts(wire, [len(wire) // 3, len(wire) // 2 + 1])):
                        for eof in (False, True):
                            theirs = await _feed(Connection, side, chunks, eof)
                            for buffered in (False, True):
                                ours = await _feed(Ours, side, chunks, eof, buffered)
                                assert ours == theirs, (side, a, b, len(chunks), eof, buffered)

    asyncio.run(pairs())


def test_frames_in_the_chunk_of_the_handshake_response_wherever_it_is_cut():
    # A client reads the server's 101 response and its first frames; the chunks may cut anywhere,
    # the end of the head (`\r\n\r\n`) included. Every frame reaches the queue, whole, once.
    from websockets.asyncio.client import ClientConnection
    from websockets.client import ClientProtocol
    from websockets.server import ServerProtocol
    from websockets.uri import parse_uri

    class OursClient(FrameReader, ClientConnection):
        pass

    # The middle one looks like frames of ours from inside: a reader that took over mid-frame says so
    payloads = [os.urandom(10), b"\x82\x05" * 150, os.urandom(70_000)]

    async def one(cut: int) -> list[bytes]:
        loop = asyncio.get_running_loop()
        mine, theirs = socket.socketpair()
        client = ClientProtocol(parse_uri("ws://example/"), max_size=1 << 20)
        conn = OursClient(client, ping_interval=None, close_timeout=None, max_queue=None)
        transport, _ = await loop.connect_accepted_socket(lambda: conn, mine)
        try:
            request = client.connect()
            client.send_request(request)
            server = ServerProtocol(max_size=1 << 20)
            server.receive_data(b"".join(client.data_to_send()))
            server.send_response(server.accept(server.events_received()[0]))
            for p in payloads:
                server.send_binary(p)
            wire = b"".join(server.data_to_send())
            for piece in (wire[:cut], wire[cut : cut + 250], wire[cut + 250 :]):  # then one mid-frame
                conn.data_received(piece)
            return [bytes(f.data) for f in conn.recv_messages.frames.queue]
        finally:
            transport.abort()
            theirs.close()

    async def every_cut():
        for cut in range(1, 400):
            assert await one(cut) == payloads, cut

    asyncio.run(every_cut())


def test_the_buffer_grows_for_a_stream_and_an_idle_connection_gives_it_back(monkeypatch):
    # What a connection holds: `SMALL` while idle, `READ_MAX` while streaming (each read offered
    # at least half of it), a frame's worth for a frame larger than that (as its bytes come), and `SMALL` again once
    # the stream has quieted. Every frame arrives whole and in order throughout.
    from protocol.io import framereader

    big = os.urandom(3 << 20)
    stream = [os.urandom(256 << 10) for _ in range(12)]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        mine, theirs = socket.socketpair()
        proto = Protocol(SERVER, state=State.OPEN, max_size=8 << 20)
        conn = Ours(proto, ping_interval=None, close_timeout=None, max_queue=None)
        transport, _ = await loop.connect_accepted_socket(lambda: conn, mine)
        queue = conn.recv_messages.frames.queue
        try:
            offered: list[int] = []

            def read(wire: bytes) -> None:  # as a transport reads a busy socket: every room filled
                off = 0
                while off < len(wire):
                    room = conn.get_buffer(-1)
                    offered.append(len(room))
                    n = min(len(room), len(wire) - off)
                    room[:n] = wire[off : off + n]
                    room.release()
                    conn.buffer_updated(n)
                    off += n

            read(Frame(Opcode.BINARY, b"hello").serialize(mask=True))
            assert [bytes(f.data) for f in queue] == [b"hello"]
            assert conn._buf is not None and len(conn._buf) == framereader.SMALL
            queue.clear()

            read(b"".join(Frame(Opcode.BINARY, p).serialize(mask=True) for p in stream))
            assert [bytes(f.data) for f in queue] == stream
            assert conn._buf is not None and len(conn._buf) == framereader.READ_MAX
            assert min(offered[2:]) >= framereader.READ_MAX // 2  # once grown, never a sliver
            queue.clear()

            wire = Frame(Opcode.BINARY, big).serialize(mask=True)
            read(wire[:20])  # its header says 3 MiB: room grows as the bytes come, not at its word
            room = conn.get_buffer(-1)
            assert len(room) <= framereader.READ_MAX
            room.release()
            read(wire[20:])
            assert [bytes(f.data) for f in queue] == [big]
            assert conn._buf is None or len(conn._buf) <= framereader.READ_MAX  # the frame's buffer let go
            queue.clear()

            monkeypatch.setattr(framereader, "IDLE_S", 0.0)  # the stream's last full read is long past
            read(Frame(Opcode.BINARY, b"quiet").serialize(mask=True))
            read(Frame(Opcode.BINARY, b"again").serialize(mask=True))
            assert [bytes(f.data) for f in queue] == [b"quiet", b"again"]
            assert conn._buf is not None and len(conn._buf) == framereader.SMALL
        finally:
            transport.abort()
            theirs.close()

    asyncio.run(run())
