"""The fault proxy itself: each fault does what it says, per direction and per connection, with
an echo server behind it (real sockets, real subprocess)."""

import asyncio
import subprocess
import time

import pytest

from mind.testing.cluster import BIN
from mind.testing.faultproxy import FaultProxy

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


def script(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "mindhand-faultproxy"), *args], capture_output=True, timeout=timeout)


def test_the_console_script_sends_commands_and_refuses_bad_input_with_a_sentence():
    proxy = FaultProxy.start(1)  # the target is never dialled here
    try:
        ok = script("--control", f"127.0.0.1:{proxy.control_port}", "--send", "latency 5 up")
        assert ok.returncode == 0 and ok.stdout.startswith(b"ok")
        bad = script("--control", f"127.0.0.1:{proxy.control_port}", "--send", "latency -5")
        assert bad.returncode == 1 and bad.stdout.startswith(b"error")
    finally:
        proxy.stop()
    unreachable = script("--control", f"127.0.0.1:{proxy.control_port}", "--send", "status")
    assert unreachable.returncode == 2 and b"cannot read the token file" in unreachable.stderr  # gone with it
    assert b"Traceback" not in unreachable.stderr
    for args in (["--listen", "nonsense"], ["--control", "127.0.0.1:1", "--listen", "127.0.0.1:1"]):
        r = script("--target", "127.0.0.1:1", *args)
        assert r.returncode != 0 and b"Traceback" not in r.stderr and b"mindhand-faultproxy" in r.stderr, r.stderr
    h = script("--help")
    assert h.returncode == 0 and b"frame ACTION TYPE" in h.stdout and b"limit_data" in h.stdout


def test_a_proxy_without_a_target_holds_connections_until_told(tmp_path):
    async def go() -> None:
        async def handle(r, w):
            w.write(await r.read(100))
            await w.drain()
            w.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server:
            proxy = await asyncio.to_thread(FaultProxy.start, None)
            try:
                r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
                w.write(b"early")
                await w.drain()
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(r.read(5), 0.3)  # held: nowhere to go yet
                await asyncio.to_thread(proxy.target, server.sockets[0].getsockname()[1])
                assert await asyncio.wait_for(r.readexactly(5), 10) == b"early"
                w.close()
            finally:
                await asyncio.to_thread(proxy.stop)

    asyncio.run(go())
