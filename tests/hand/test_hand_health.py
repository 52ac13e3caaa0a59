"""The Hand's local HTTP port (`hand.aio.health`): the pure parser and router fed bytes, then the shell
on a loopback port with short bounds (a head that never completes, too many connections)."""

import asyncio
import json

import pytest
import structlog
from hand_support import until

from hand.aio import health
from hand.aio.health import HealthServer
from hand.aio.metrics import HandMetrics
from hand.core.http import Request, Response, examine, parse_listen, route, shown_url


@pytest.mark.parametrize(
    "raw, want",
    [
        (b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", Request("GET", "/metrics")),
        (b"GET / HTTP/1.0\r\n\r\n", Request("GET", "/")),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 3\r\n\r\n", Request("POST", "/healthz")),
        (b"GET /healthz HTTP/1.1\r\n", None),  # the head goes on
        (b"GET /heal", None),
        (b"GARBAGE\r\n", 400),  # refused as soon as the request line is complete
        (b"GET healthz HTTP/1.1\r\n\r\n", 400),
        (b"GET /a b HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 400),
        (b"G\x00T / HTTP/1.1\r\n\r\n", 400),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n folded: no\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno-colon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"a: b\r\n" * 100 + b"\r\n", 400),
        (b"x" * (health.MAX_HEAD_BYTES + 1), 400),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * health.MAX_HEAD_BYTES + b"\r\n\r\n", 400),
    ],
)
def test_examine(raw, want):
    got = examine(raw)
    if isinstance(want, int):
        assert isinstance(got, Response) and got.status == want
    else:
        assert got == want


def test_route_answers_only_get_of_the_two_paths():
    h = lambda: {"status": "ok"}
    m = lambda: b"# metrics\n"
    assert route(Request("GET", "/healthz"), h, m) == Response(200, b'{"status": "ok"}', "application/json")
    assert route(Request("GET", "/metrics"), h, m).body == b"# metrics\n"
    assert route(Request("GET", "/"), h, m).status == 404
    r = route(Request("HEAD", "/metrics"), h, m)
    assert r.status == 405 and ("Allow", "GET") in r.headers
    wire = r.encode()
    assert wire.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and b"Connection: close\r\n" in wire


def test_parse_listen_and_shown_url():
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9470") == ("::1", 9470)
    assert parse_listen("localhost:1") == ("localhost", 1)
    for bad in ("127.0.0.1", ":80", "::1:80", "host:99999", "host:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)
    assert shown_url("wss://user:secret@mind.example:7470/hands?token=t#x") == "wss://mind.example:7470/hands"
    assert shown_url("ws://[::1]:7470") == "ws://[::1]:7470"


async def _ask(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    async with asyncio.timeout(10):
        data = await reader.read()
    writer.close()
    return data


async def test_shell_times_out_a_silent_peer_and_bounds_connections(tmp_path, monkeypatch):
    monkeypatch.setattr(health, "READ_TIMEOUT_S", 0.2)
    monkeypatch.setattr(health, "MAX_CONNECTIONS", 2)
    metrics = HandMetrics()
    addr_file = tmp_path / "metrics.addr"
    server = HealthServer(
        "127.0.0.1",
        0,
        health=lambda: {"status": "ok"},
        metrics=metrics.render,
        log=structlog.get_logger(),
        addr_file=addr_file,
    )
    address = await server.start()
    port = int(address.rsplit(":", 1)[1])
    serving = asyncio.create_task(server.serve())
    try:
        await until(addr_file.exists, 10, "the address file (written once it listens)")
        assert addr_file.read_text() == address + "\n" and (addr_file.stat().st_mode & 0o777) == 0o600
        assert (await _ask(port, b"")).startswith(b"HTTP/1.1 408 ")  # connected, said nothing
        monkeypatch.setattr(health, "READ_TIMEOUT_S", 30.0)  # the held ones below must stay held
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0)  # let the server take both in
        third = await _ask(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert third == b""  # over the bound: dropped on accept, not queued
        for _, w in held:
            w.close()
        async with asyncio.timeout(10):
            while True:  # once the held ones are gone, it answers again
                data = await _ask(port, b"GET /healthz HTTP/1.1\r\n\r\n")
                if data:
                    break
                await asyncio.sleep(0.05)
        assert data.startswith(b"HTTP/1.1 200 ") and json.loads(data.split(b"\r\n\r\n", 1)[1]) == {"status": "ok"}
    finally:
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
    assert not addr_file.exists()
