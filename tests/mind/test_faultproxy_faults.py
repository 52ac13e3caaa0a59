"""Each fault of the shipped fault proxy (`mind/testing/faultproxy/`), measured by its own test,
with the engine in this test's event loop in front of a real echo server (TCP) or a real WebSocket
server carrying our envelopes. No process is started: these run in the fast loop.

Durations are lower bounds a fault must cause (a latency adds at least its value), never upper
bounds on how fast the machine is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from mind.testing.faultproxy import FaultProxyError, InProcessProxy, Step, random_schedule, start_proxy
from mind.testing.faultproxy.frames import Framer, Unit
from mind.testing.vocabulary import WHERE, Fault
from protocol import PROTOCOL_VERSION


async def _echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.write_eof()
    except ConnectionError:
        pass
    finally:
        w.close()


@pytest.fixture
async def proxy() -> AsyncIterator[InProcessProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server:
        fp = await start_proxy(server.sockets[0].getsockname()[1])
        try:
            yield fp
        finally:
            await fp.close()


async def conn(fp: InProcessProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", fp.port)
    await asyncio.sleep(0)
    return r, w


async def roundtrip(r: asyncio.StreamReader, w: asyncio.StreamWriter, payload: bytes = b"ping") -> bytes:
    w.write(payload)
    await w.drain()
    return await asyncio.wait_for(r.readexactly(len(payload)), 10)


async def read_all(r: asyncio.StreamReader, timeout: float = 10) -> bytes:
    out = b""
    async with asyncio.timeout(timeout):
        while chunk := await r.read(65536):
            out += chunk
    return out


# --- L4 faults ---


async def test_latency_with_jitter_adds_delay_and_keeps_order(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    assert await roundtrip(r, w) == b"ping"
    proxy.latency(200, jitter=100, direction="up")
    t0 = time.monotonic()
    for i in range(10):
        w.write(b"%02d" % i)
    await w.drain()
    got = await asyncio.wait_for(r.readexactly(20), 10)
    assert time.monotonic() - t0 >= 0.1  # 200 ms - 100 ms of jitter at least
    assert got == b"".join(b"%02d" % i for i in range(10))  # in order, whatever each piece's jitter
    assert proxy.status()["connections"][0]["up"]["jitter"] == 0.1
    w.close()


async def test_bandwidth_bounds_throughput_in_kib_per_second(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    proxy.bandwidth(16, direction="down")
    t0 = time.monotonic()
    assert await roundtrip(r, w, b"x" * 4096) == b"x" * 4096
    # 4 KiB at 16 KiB/s, paced in tenths of a second: 1.6 KiB a tenth, so the third tenth ends it
    assert time.monotonic() - t0 >= 0.18
    w.close()


async def test_limit_data_closes_after_exactly_n_bytes(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    proxy.limit_data(10, direction="down")
    w.write(b"0123456789abcdefghij")
    await w.drain()
    assert await read_all(r) == b"0123456789"  # then the connection is closed
    w.close()


async def test_slicer_forwards_in_pieces_of_the_size_asked(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    proxy.slicer(10, delay_us=1000, direction="down")
    payload = bytes(range(100))
    assert await roundtrip(r, w, payload) == payload
    c = proxy.status()["connections"][0]
    assert c["down_writes"] == 10 and c["up_writes"] == 1
    w.close()


async def test_slow_close_passes_the_close_on_late(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    proxy.slow_close(300, direction="down")
    assert await roundtrip(r, w) == b"ping"
    t0 = time.monotonic()
    w.write_eof()  # the echo server closes in turn; its FIN reaches us 300 ms late
    assert await read_all(r) == b""
    assert time.monotonic() - t0 >= 0.3
    w.close()


async def test_timeout_drops_the_data_and_closes_after_t(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    t0 = time.monotonic()
    proxy.timeout(300, direction="up")
    w.write(b"lost")
    await w.drain()
    assert await read_all(r) == b""  # nothing came back, and then the connection closed
    assert time.monotonic() - t0 >= 0.3
    w.close()


async def test_timeout_zero_never_closes(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    proxy.timeout(0, direction="up")
    w.write(b"lost")
    await w.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.read(1), 0.2)
    assert proxy.status()["connections"][0]["up_dropped"] == 4
    proxy.clear()  # data flows again
    assert await roundtrip(r, w) == b"ping"
    w.close()


async def test_reset_peer_resets_after_t(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    assert await roundtrip(r, w) == b"ping"
    t0 = time.monotonic()
    proxy.reset_peer(200)
    with pytest.raises(ConnectionResetError):
        await read_all(r)
    assert time.monotonic() - t0 >= 0.2
    w.close()


async def test_down_closes_everything_and_refuses_until_up(proxy: InProcessProxy) -> None:
    r, w = await conn(proxy)
    assert await roundtrip(r, w) == b"ping"
    proxy.down()
    assert await read_all(r) == b""
    r2, w2 = await conn(proxy)
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await roundtrip(r2, w2)
    proxy.up()
    r3, w3 = await conn(proxy)
    assert await roundtrip(r3, w3) == b"ping"
    for x in (w, w2, w3):
        x.close()


async def test_a_fault_without_a_connection_id_applies_to_later_connections(proxy: InProcessProxy) -> None:
    proxy.limit_data(3, direction="down")
    r, w = await conn(proxy)  # made after the command: it gets the fault too
    w.write(b"abcdef")
    await w.drain()
    assert await read_all(r) == b"abc"
    w.close()


async def decisions(fp: InProcessProxy, seed: int, n: int = 16) -> list[int]:
    """Which of `n` new connections (numbered from 1 on a fresh proxy) got `latency ... p=0.5`."""
    fp.reset()
    fp.seed(seed)
    fp.latency(50, direction="up", p=0.5)
    conns = [await conn(fp) for _ in range(n)]
    await asyncio.gather(*(roundtrip(r, w) for r, w in conns))  # the delayed ones wait side by side
    picked = sorted(c["id"] for c in fp.status()["connections"] if c["up"]["delay"] > 0)
    for _, w in conns:
        w.close()
    await asyncio.wait_for(_until(lambda: not fp.status()["connections"]), 5)
    return picked


async def test_probability_is_decided_per_connection_from_the_seed(proxy: InProcessProxy) -> None:
    a = await decisions(proxy, 7)
    assert 0 < len(a) < 16  # some connections, not all
    # the same seed and the same connection numbers decide the same way: a fresh proxy replays it
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server:
        again = await start_proxy(server.sockets[0].getsockname()[1])
        try:
            assert await decisions(again, 7) == a
            assert await decisions(again, 8) != [n + 16 for n in a]  # another seed, other choices
        finally:
            await again.close()


def test_a_seeded_schedule_is_reproducible_and_speaks_the_vocabulary() -> None:
    a, b, c = random_schedule(1, duration=30), random_schedule(1, duration=30), random_schedule(2, duration=30)
    assert a == b and a != c and len(a) > 5
    assert all(isinstance(s, Step) and s.fault in WHERE and "proxy" in WHERE[s.fault] for s in a)
    assert [s.at for s in a] == sorted(s.at for s in a)


async def test_every_step_of_a_schedule_is_a_command_the_proxy_performs(proxy: InProcessProxy) -> None:
    for seed in range(20):
        for step in random_schedule(seed, duration=20):
            assert proxy.send(step.command).startswith("ok"), step
    proxy.reset()


async def test_bad_commands_are_errors_not_crashes(proxy: InProcessProxy) -> None:
    bad = (
        "explode",
        "delay",
        "delay abc",
        "cut fin 999",
        "blackhole sideways",
        "latency -5",
        "frame explode result",
        "frame hold",
        "latency 10 p=2",
        "",
    )
    for line in bad:
        with pytest.raises(FaultProxyError):
            proxy.send(line)
    assert proxy.status()["refusing"] is False and proxy.status()["defaults"] == []


# --- frames ---


WsProxy = tuple[InProcessProxy, list[tuple[str, int]]]


def envelope(t: str, seq: int) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, "t": t, "id": None, "seq": seq, "gen": None, "p": {"n": seq}})


def kind_seq(data: bytes | str) -> tuple[str, int]:
    raw = msgpack.unpackb(data)
    return raw["t"], raw["seq"]


@pytest.fixture
async def ws_proxy() -> AsyncIterator[WsProxy]:
    """A WebSocket server that records each envelope it receives and answers an `rpc` with
    `accepted`, then three `result`s (seq 1, 2, 3)."""
    seen: list[tuple[str, int]] = []

    async def handler(ws: ServerConnection) -> None:
        async for data in ws:
            seen.append(kind_seq(data))
            if seen[-1][0] == "rpc":
                await ws.send(envelope("accepted", 0))
                for i in (1, 2, 3):
                    await ws.send(envelope("result", i))

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        fp = await start_proxy(port)
        try:
            yield fp, seen
        finally:
            await fp.close()


async def recv(ws: ClientConnection, timeout: float = 10) -> tuple[str, int]:
    return kind_seq(await asyncio.wait_for(ws.recv(), timeout))


async def test_frames_are_named_by_type_in_both_directions(ws_proxy: WsProxy) -> None:
    fp, seen = ws_proxy
    async with connect(fp.url, compression=None) as ws:
        await ws.send(envelope("rpc", 1))
        assert [await recv(ws) for _ in range(4)] == [("accepted", 0), ("result", 1), ("result", 2), ("result", 3)]
        c = fp.status()["connections"][0]
        assert c["framing"] == "ws"
        assert c["up_frames"] == {"http": 1, "rpc": 1}  # masked frames, client to server
        assert c["down_frames"] == {"http": 1, "accepted": 1, "result": 3}  # unmasked, the way back
        assert fp.frames_seen("rpc", "up") == 1


async def test_a_held_frame_and_those_after_it_are_delivered_in_order_on_release(ws_proxy: WsProxy) -> None:
    fp, seen = ws_proxy
    fp.hold("result", direction="down", k=2)
    async with connect(fp.url, compression=None, ping_interval=None) as ws:
        await ws.send(envelope("rpc", 1))
        assert await recv(ws) == ("accepted", 0)
        assert await recv(ws) == ("result", 1)
        with pytest.raises(TimeoutError):
            await recv(ws, 0.3)  # result 2 is held, and result 3 behind it
        pong = await ws.ping()  # control frames still pass: keepalives do not kill a held link
        await asyncio.wait_for(pong, 5)
        await ws.send(envelope("cancel", 2))  # the other direction flows: the cancel goes through
        await asyncio.wait_for(_until(lambda: ("cancel", 2) in seen), 5)
        assert fp.held() > 0
        fp.release()
        assert [await recv(ws), await recv(ws)] == [("result", 2), ("result", 3)]


async def test_drop_and_duplicate_the_kth_frame_of_a_type(ws_proxy: WsProxy) -> None:
    fp, seen = ws_proxy
    fp.frame("drop", "result", direction="down", k=2)
    fp.frame("duplicate", "rpc", direction="up")
    async with connect(fp.url, compression=None) as ws:
        await ws.send(envelope("rpc", 1))
        got = [await recv(ws) for _ in range(7)]  # two rpcs, each answered: accepted, result 1, 3
        assert got == [("accepted", 0), ("result", 1), ("result", 3), ("accepted", 0)] + [
            ("result", i) for i in (1, 2, 3)
        ]
        assert seen == [("rpc", 1), ("rpc", 1)]


async def test_frame_rules_match_their_direction_only(ws_proxy: WsProxy) -> None:
    fp, seen = ws_proxy
    fp.frame("drop", "rpc", direction="down")  # no rpc ever goes down: nothing is dropped
    fp.frame("drop", "result", direction="up")
    async with connect(fp.url, compression=None) as ws:
        await ws.send(envelope("rpc", 1))
        assert [await recv(ws) for _ in range(4)][-1] == ("result", 3)
    assert seen == [("rpc", 1)]


async def test_delay_holds_a_frame_for_its_time(ws_proxy: WsProxy) -> None:
    fp, _ = ws_proxy
    fp.frame("delay", "accepted", direction="down", ms=300)
    async with connect(fp.url, compression=None) as ws:
        t0 = time.monotonic()
        await ws.send(envelope("rpc", 1))
        assert await recv(ws) == ("accepted", 0)
        assert time.monotonic() - t0 >= 0.3
        assert await recv(ws) == ("result", 1)  # and the frames behind it, in order


async def test_cut_between_accepted_and_result(ws_proxy: WsProxy) -> None:
    fp, _ = ws_proxy
    fp.frame("cut", "accepted", direction="down", after=True)
    async with connect(fp.url, compression=None) as ws:
        await ws.send(envelope("rpc", 1))
        assert await recv(ws) == ("accepted", 0)
        with pytest.raises(ConnectionClosed):
            await recv(ws)  # no result: the link was cut right after the accepted


# --- which connections a frame rule touches (issue 24 item 6) ---


async def answered(fp: InProcessProxy) -> bool:
    """One connection through the proxy: True when it got its `accepted` and three `result`s, False
    when a rule cut it. The connection is closed either way, as a Hand's reconnect would open anew."""
    async with connect(fp.url, compression=None) as ws:
        await ws.send(envelope("rpc", 1))
        try:
            got = [await recv(ws) for _ in range(4)]
        except ConnectionClosed:
            return False
        return got[-1] == ("result", 3)


async def test_a_frame_rule_set_on_a_live_connection_cuts_it_once_and_a_reconnect_goes_through(
    ws_proxy: WsProxy,
) -> None:
    """Cut at the first `accepted` and let it reconnect: the live connection is cut, the reconnect is
    not (the old default made the rule every later connection's too, so every reconnect was cut)."""
    fp, _ = ws_proxy
    async with connect(fp.url, compression=None) as ws:
        await _until(lambda: fp.status()["connections"])
        assert fp.frame("cut", "accepted", direction="down", after=True) == "ok 1"  # the live one
        assert fp.status()["defaults"] == []
        await ws.send(envelope("rpc", 1))
        assert await recv(ws) == ("accepted", 0)
        with pytest.raises(ConnectionClosed):
            await recv(ws)
    assert await answered(fp) and await answered(fp)


async def test_a_frame_rule_set_with_no_live_connection_touches_the_next_one_only(ws_proxy: WsProxy) -> None:
    fp, _ = ws_proxy
    fp.frame("cut", "accepted", direction="down", after=True)
    assert [d.split()[:4] for d in fp.status()["defaults"]] == [["frame", "cut", "accepted", "down"]]
    assert "next" in fp.status()["defaults"][0].split()
    assert not await answered(fp)  # the next connection: cut
    assert fp.status()["defaults"] == []
    assert await answered(fp)  # the one after it: untouched


async def test_every_makes_a_frame_rule_every_later_connections_until_clear(ws_proxy: WsProxy) -> None:
    fp, _ = ws_proxy
    fp.frame("cut", "accepted", direction="down", after=True, every=True)  # the old default, said
    assert not await answered(fp) and not await answered(fp)
    fp.clear()
    assert fp.status()["defaults"] == [] and await answered(fp)
    fp.send("frame cut accepted down after every")  # the same from the control line
    assert not await answered(fp)
    fp.reset()
    assert await answered(fp)


async def test_a_frame_rule_given_a_connection_touches_that_one_only(ws_proxy: WsProxy) -> None:
    fp, _ = ws_proxy
    async with connect(fp.url, compression=None) as a, connect(fp.url, compression=None) as b:
        await _until(lambda: len(fp.status()["connections"]) == 2)
        first, second = sorted(c["id"] for c in fp.status()["connections"])
        fp.frame("drop", "result", direction="down", times=0, conn=second)
        assert fp.status()["defaults"] == []
        for ws in (a, b):
            await ws.send(envelope("rpc", 1))
        assert [await recv(a) for _ in range(4)][-1] == ("result", 3)
        assert await recv(b) == ("accepted", 0)
        with pytest.raises(TimeoutError):
            await recv(b, 0.3)  # every result dropped on that connection only
    assert await answered(fp)


async def test_a_link_that_is_not_websocket_is_raw_and_no_frame_rule_matches(proxy: InProcessProxy) -> None:
    proxy.frame("drop", "*", times=0)
    r, w = await conn(proxy)
    tls_hello = b"\x16\x03\x01\x00\x05hello"  # what a TLS link starts with
    assert await roundtrip(r, w, tls_hello) == tls_hello
    assert proxy.status()["connections"][0]["framing"] == "raw"
    w.close()


def test_the_framer_cuts_fragmented_and_large_frames_whole() -> None:
    payload = envelope("result", 9)
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    half = len(payload) // 2
    frag1 = bytes([0x02, half]) + payload[:half]  # binary, not final
    ping = bytes([0x89, 0])
    frag2 = bytes([0x80, len(payload) - half]) + payload[half:]  # continuation, final
    long = b"\x00" * 70000
    frame64 = bytes([0x82, 127]) + (len(long)).to_bytes(8, "big") + long
    f = Framer()
    stream = head + frag1 + ping + frag2 + frame64
    units = [u for i in range(0, len(stream), 7) for u in f.feed(stream[i : i + 7])]
    assert [u.kind for u in units] == ["http", "ping", "result", "?"]
    assert b"".join(u.raw for u in units) == head + ping + frag1 + frag2 + frame64


def test_a_short_first_message_that_is_not_http_passes_at_once() -> None:
    """PostgreSQL answers a client's SSL request with one byte ('N'): the proxy in front of a
    database (tests of a node cut from it) forwards it at once instead of waiting for four."""
    f = Framer()
    assert f.feed(b"N") == [Unit(b"N", "bytes")]
    assert f.feed(b"R\x00") == [Unit(b"R\x00", "bytes")]
    g = Framer()
    assert g.feed(b"GE") == []  # could still be an HTTP head
    assert [u.kind for u in g.feed(b"T / HTTP/1.1\r\n\r\n")] == ["http"]


def test_the_vocabulary_says_who_performs_each_fault() -> None:
    assert set(WHERE) == set(Fault)
    assert {f for f, who in WHERE.items() if "sim" in who} >= {Fault.LATENCY, Fault.CUT, Fault.BLACKHOLE}


async def _until(cond: Callable[[], object]) -> None:
    while True:
        if cond():
            return
        await asyncio.sleep(0.01)


def test_a_data_frame_is_named_stream_data_for_frame_rules() -> None:
    """Stream bytes are data frames, not envelopes (protocol/frames.py): a rule still names them."""
    from mind.testing.faultproxy.frames import message_type
    from protocol import frames

    assert message_type(frames.encode(7, 0, b"bytes", False)) == "stream_data"
    assert message_type(b"\xc1") == "stream_data"  # a broken one too: the proxy forwards, never judges
    assert message_type(b"not msgpack") == "?"
