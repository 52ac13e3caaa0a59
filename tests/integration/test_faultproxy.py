"""The fault proxy itself: each fault does what it says, per direction and per connection, with
an echo server behind it (real sockets, real subprocess)."""

import asyncio
import time

import pytest
from support.faultproxy import FaultProxy

pytestmark = pytest.mark.slow  # the fault proxy runs as its own process


@pytest.fixture
async def echo():
    async def handle(r, w):
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        proxy = await asyncio.to_thread(FaultProxy.start, server.sockets[0].getsockname()[1])
        try:
            yield proxy
        finally:
            await asyncio.to_thread(proxy.stop)


async def ctl(proxy, cmd):
    return await asyncio.to_thread(proxy.send, cmd)


async def roundtrip(r, w, payload=b"ping", timeout=5.0):
    w.write(payload)
    await w.drain()
    return await asyncio.wait_for(r.readexactly(len(payload)), timeout)


async def test_forwards_and_reports_bytes(echo):
    r, w = await asyncio.open_connection("127.0.0.1", echo.port)
    assert await roundtrip(r, w) == b"ping"
    st = await asyncio.to_thread(echo.status)
    assert st["connections"][0]["up_bytes"] == 4 and st["connections"][0]["down_bytes"] == 4
    w.close()


async def test_blackhole_holds_in_order_then_resume_delivers(echo):
    r, w = await asyncio.open_connection("127.0.0.1", echo.port)
    await roundtrip(r, w)
    await ctl(echo, "blackhole down")
    w.write(b"one-two-three")
    await w.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.readexactly(1), 0.5)  # silence, but the socket stays open
    await ctl(echo, "resume")
    assert await asyncio.wait_for(r.readexactly(13), 5) == b"one-two-three"
    w.close()


async def test_delay_adds_latency_one_way(echo):
    r, w = await asyncio.open_connection("127.0.0.1", echo.port)
    await ctl(echo, "delay 300 up")
    t0 = time.monotonic()
    await roundtrip(r, w)
    assert time.monotonic() - t0 >= 0.3
    await ctl(echo, "delay 0")
    w.close()


async def test_throttle_bounds_throughput(echo):
    r, w = await asyncio.open_connection("127.0.0.1", echo.port)
    await ctl(echo, "throttle 20000 down")
    t0 = time.monotonic()
    assert await roundtrip(r, w, b"x" * 20000, timeout=10) == b"x" * 20000
    assert time.monotonic() - t0 >= 0.9  # 20 kB at 20 kB/s
    w.close()


async def test_cut_fin_closes_and_refuse_keeps_it_down_per_connection(echo):
    r1, w1 = await asyncio.open_connection("127.0.0.1", echo.port)
    r2, w2 = await asyncio.open_connection("127.0.0.1", echo.port)
    await roundtrip(r1, w1)
    await roundtrip(r2, w2)
    ids = sorted(c["id"] for c in (await asyncio.to_thread(echo.status))["connections"])
    await ctl(echo, f"cut fin {ids[0]}")
    assert await asyncio.wait_for(r1.read(), 5) == b""  # closed
    assert await roundtrip(r2, w2) == b"ping"  # the other connection is untouched
    await ctl(echo, "refuse")
    try:  # the path is down: the connection is reset at once (or closed before any byte)
        r3, w3 = await asyncio.open_connection("127.0.0.1", echo.port)
        assert await asyncio.wait_for(r3.read(), 5) == b""
        w3.close()
    except ConnectionError:
        pass
    await ctl(echo, "accept")
    r4, w4 = await asyncio.open_connection("127.0.0.1", echo.port)
    assert await roundtrip(r4, w4) == b"ping"
    for w in (w2, w4):
        w.close()


async def test_bad_commands_are_errors_not_crashes(echo):
    for bad in ("explode", "delay", "delay abc", "cut fin 999", "blackhole sideways"):
        with pytest.raises(RuntimeError):
            await ctl(echo, bad)
    assert (await asyncio.to_thread(echo.status))["refusing"] is False
