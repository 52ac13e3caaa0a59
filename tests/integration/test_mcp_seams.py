"""`mind mcp` at its seams, performed with real processes (a Mind, a Hand, `mind mcp` as a subprocess)
and the official MCP SDK's client as its peer:

- made-up bearers flooding `--listen` never hold an agent already connected, and are all refused;
- plain HTTP beyond loopback is refused unless `--insecure-http` (which warns), and a foreign `Host`
  header is refused before its bearer costs anything (DNS rebinding);
- the runs followed hold at most their credential's byte budget: a run beyond it is refused, and the
  server's memory stays bounded while their output is not read;
- every offset a result's marker names can be read, and a gone offset is answered as gone.
"""

from __future__ import annotations

import json
import re
import secrets
import select
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from mind.mcp.budget import CREDENTIAL_BYTES
from mind.mcp.results import HEAD_KEEP, RETAIN_BYTES
from mind.testing.cluster import Cluster, program, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind, a Hand, and `mind mcp` as a subprocess

CALL_TIMEOUT_S = 60.0
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}


@pytest.fixture
def cl(tmp_path: Path) -> Iterator[Cluster]:
    with running(tmp_path, "box") as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    port: int
    p: subprocess.Popen[bytes]
    said: list[str] = field(default_factory=list)

    def stderr_until(self, text: str, timeout: float = 20.0) -> str:
        """What the server said on stderr, read until a line holding `text`."""
        assert self.p.stderr is not None
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.said):
            ready, _, _ = select.select([self.p.stderr], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"`mind mcp` did not say {text!r}: {self.said}"
            line = self.p.stderr.readline()
            assert line, f"`mind mcp` ended before saying {text!r}: {self.said}"
            self.said.append(line.decode())
        return "".join(self.said)

    def rss(self) -> int:
        """The server's resident memory in bytes (/proc)."""
        for line in Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


@contextmanager
def serving(cl: Cluster, *extra: str, host: str = "127.0.0.1") -> Iterator[Served]:
    """`mind mcp --listen HOST:PORT` as a subprocess (stopped by PID), reached over loopback."""
    port = free_port()
    p = subprocess.Popen(
        [*program("mind"), "mcp", "--listen", f"{host}:{port}", *extra],
        env=cl.env,
        bufsize=0,  # unbuffered: `select` then sees every line not yet read
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            assert p.poll() is None, f"mind mcp exited {p.returncode}"
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(up, timeout=30, what="mind mcp --listen to listen")
        yield Served(f"http://127.0.0.1:{port}/mcp", port, p)
    finally:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@asynccontextmanager
async def http_client(url: str, token: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as hc:
        async with Client(streamable_http_client(url, http_client=hc), read_timeout_seconds=CALL_TIMEOUT_S) as c:
            yield c


def stdio(cl: Cluster) -> Client:
    argv = [*program("mind"), "mcp"]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(cl.env))
    return Client(params, read_timeout_seconds=CALL_TIMEOUT_S)


def token(path: Path) -> str:
    return next(ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


def body(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(res.content[0].text)
    return out


def handshakes(cl: Cluster) -> dict[str, float]:
    """The Mind's handshake counters by result (its /metrics)."""
    url = cl.url.replace("ws://", "http://") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {m[0]: float(m[1]) for m in re.findall(r'^mindhand_handshakes_total\{result="(\w+)"\} (\S+)$', text, re.M)}


def made_up() -> str:
    return f"mh1:client:intruder{secrets.token_hex(4)}:{secrets.token_hex(32)}"


# --- row 3: made-up bearers never hold an agent already connected ------------------------------------

FLOOD_WORKERS = 32
"""More than `PENDING_MAX` at once: the bound on unknown bearers checked together is reached."""
FLOOD_MAX = 1500
FLOOD_S = 6.0
REFUSED = {401, 429, 503}


@pytest.mark.alone  # the agent's calls are bounded by its own baseline: other tests' load would be noise
async def test_http_a_flood_of_made_up_bearers_never_holds_an_agent_already_connected(cl: Cluster) -> None:
    """The attack: while an agent with a valid bearer makes calls, a loop of requests with made-up
    bearers runs (bounded in count and time, loopback only). Every call of the agent succeeds and is
    answered within a second of its unflooded baseline (before: held by one global lock while each
    made-up bearer's handshake failed, 23 s); every made-up bearer is refused; most are refused
    without a handshake with the Mind (a bound on those checked at once), and one refused a moment
    ago is refused again at once without another."""
    admin = token(cl.client_credential("admin2"))
    with serving(cl) as srv:
        async with http_client(srv.url, admin) as agent:

            async def call() -> float:
                started = time.monotonic()
                res = await agent.call_tool("hands", {})
                assert not res.is_error and [h["name"] for h in body(res)["hands"]] == ["box"]
                return time.monotonic() - started

            baseline = [await call() for _ in range(10)]
            before = handshakes(cl).get("failed", 0.0)
            statuses: dict[str, int] = {}
            flooding = anyio.Event()
            over = anyio.Event()

            async def flood() -> None:
                deadline = time.monotonic() + FLOOD_S

                async def worker(hc: httpx2.AsyncClient) -> None:
                    while len(statuses) < FLOOD_MAX and time.monotonic() < deadline:
                        bearer = made_up()
                        r = await hc.post(srv.url, json=PING, headers={"Authorization": f"Bearer {bearer}"})
                        statuses[bearer] = r.status_code
                        flooding.set()
                        await anyio.sleep(0.05)

                async with httpx2.AsyncClient(timeout=120) as hc, anyio.create_task_group() as tg:
                    for _ in range(FLOOD_WORKERS):
                        tg.start_soon(worker, hc)
                over.set()

            flooded: list[float] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(flood)
                await flooding.wait()
                while not over.is_set():
                    flooded.append(await call())
                    await anyio.sleep(0.05)
            checked = handshakes(cl).get("failed", 0.0) - before

            bound = max(baseline) + 1.0
            assert len(flooded) >= 5 and max(flooded) < bound, (sorted(flooded)[-5:], max(baseline))
            assert len(statuses) >= 100 and set(statuses.values()) <= REFUSED, set(statuses.values())
            assert 401 in statuses.values()  # the Mind was asked, and refused them
            assert checked <= len(statuses) / 2, (checked, len(statuses))  # the rest refused here, at once

            # a bearer refused a moment ago: refused again at once, the Mind not asked again
            bearer = made_up()
            async with httpx2.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {bearer}"}) as hc:
                first = await hc.post(srv.url, json=PING)
                asked = handshakes(cl).get("failed", 0.0)
                started = time.monotonic()
                again = await hc.post(srv.url, json=PING)
                took = time.monotonic() - started
            assert first.status_code in REFUSED and again.status_code == first.status_code
            assert "not checked again" in again.json()["error_description"] and took < 1.0
            assert handshakes(cl).get("failed", 0.0) == asked

            # the agent still works, and a new bearer's concurrent requests make one handshake
            assert await call() < bound
            fresh = token(cl.client_credential("agent2"))
            ok_before = handshakes(cl).get("ok", 0.0)
            async with httpx2.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {fresh}"}) as hc:
                answers = []

                async def one() -> None:
                    answers.append((await hc.post(srv.url, json=PING)).status_code)

                async with anyio.create_task_group() as tg:
                    for _ in range(10):
                        tg.start_soon(one)
            assert len(answers) == 10 and not REFUSED & set(answers), answers
            assert handshakes(cl).get("ok", 0.0) - ok_before == 1


# --- row 5: plain HTTP beyond loopback, foreign Host headers, the byte budget -------------------------


def test_http_beyond_loopback_without_tls_is_refused_unless_insecure_http_which_warns(cl: Cluster) -> None:
    port = free_port()
    for listen in (f"0.0.0.0:{port}", f"192.0.2.10:{port}"):
        r = subprocess.run(
            [*program("mind"), "mcp", "--listen", listen],
            env=cl.env,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        err = r.stderr.decode()
        assert r.returncode == 2, err
        assert listen in err and "--tls-cert" in err and "--insecure-http" in err and "clear text" in err
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing was served

    with serving(cl, "--insecure-http", host="0.0.0.0") as srv:
        said = srv.stderr_until("serving http://")
        assert "warning: --insecure-http" in said and "clear text" in said
        admin = token(cl.client_credential("admin2"))
        headers = {"Authorization": f"Bearer {admin}"}
        with httpx2.Client(timeout=30) as hc:
            foreign = hc.post(srv.url, json=PING, headers=headers | {"Host": f"evil.example:{srv.port}"})
            assert foreign.status_code == 421 and "--allow-host" in foreign.json()["error_description"]
            loop = hc.post(srv.url, json=PING, headers=headers)  # loopback is one of this machine's names
            assert loop.status_code not in REFUSED | {421, 403}, loop.text

    with serving(cl) as srv:  # loopback as before: no warning, nothing to add
        said = srv.stderr_until("serving http://")
        assert "warning" not in said


async def test_http_a_foreign_host_header_is_refused_before_its_bearer_costs_anything(cl: Cluster) -> None:
    admin = token(cl.client_credential("admin2"))
    with serving(cl, "--allow-host", "mcp.example.internal") as srv:
        with httpx2.Client(timeout=30) as hc:

            def post(bearer: str, **headers: str) -> httpx2.Response:
                return hc.post(srv.url, json=PING, headers={"Authorization": f"Bearer {bearer}", **headers})

            failed = handshakes(cl).get("failed", 0.0)
            for bearer in (admin, made_up()):
                r = post(bearer, Host=f"rebound.attacker.example:{srv.port}")
                assert r.status_code == 421, r.text
                assert "rebound.attacker.example" in r.json()["error_description"]
                r = post(bearer, Origin="http://rebound.attacker.example")
                assert r.status_code == 403, r.text
            assert handshakes(cl).get("failed", 0.0) == failed  # the made-up bearer never reached the Mind
            assert post(admin, Host="mcp.example.internal").status_code not in REFUSED | {421, 403}
            assert post(admin, Origin=f"http://127.0.0.1:{srv.port}").status_code not in REFUSED | {421, 403}


PRINTS = 5_000_000
"""Each run prints this much on stdout and on stderr: more than the 4 MiB a stream keeps, so each
run holds its two windows full (8 MiB) and eight of them fill a credential's budget."""


async def test_http_runs_beyond_the_byte_budget_are_refused_and_memory_stays_bounded(cl: Cluster) -> None:
    """Runs that print 10 MB each and stay running, their output never read: the server keeps at most
    the credential's budget of it (64 MiB), refuses a new run beyond it with a tool error saying why,
    its memory grows by about that much and no more, and a run ending makes room again."""
    admin = token(cl.client_credential("admin2"))
    command = f"yes o | head -c {PRINTS}; yes e | head -c {PRINTS} >&2; exec sleep 300"
    with serving(cl) as srv:
        async with http_client(srv.url, admin) as agent:
            assert not (await agent.call_tool("exec", {"hand": "box", "argv": ["true"]})).is_error  # warmed up
            rss_before = srv.rss()
            started: list[str] = []
            refusals: list[dict[str, Any]] = []
            for _ in range(16):
                res = await agent.call_tool("exec", {"hand": "box", "command": command, "wait_s": 0.2})
                out = body(res)
                if res.is_error:
                    assert out["code"] == "over_budget", out
                    refusals.append(out)
                    continue
                started.append(out["run"])
                deadline = time.monotonic() + 60
                while (out["stdout_bytes"], out["stderr_bytes"]) != (PRINTS, PRINTS):
                    assert time.monotonic() < deadline, out
                    await anyio.sleep(0.1)
                    out = body(await agent.call_tool("run_get", {"run": started[-1]}))
                assert out["still_running"] is True
            grown = srv.rss() - rss_before

            full = CREDENTIAL_BYTES // (2 * (RETAIN_BYTES + HEAD_KEEP))
            assert full - 1 <= len(started) <= full + 2 and len(refusals) == 16 - len(started), started
            said = refusals[0]["error"]
            assert "not started" in said and "64 MiB" in said and "cancel" in said
            # about the budget, and nowhere near what 16 unbounded runs would hold (128 MiB and more)
            assert grown < CREDENTIAL_BYTES + (48 << 20), grown >> 20

            # a run ending makes room: the ended one is let go, a new run starts
            assert not (await agent.call_tool("cancel", {"run": started[0]})).is_error
            res = await agent.call_tool("exec", {"hand": "box", "argv": ["echo", "room again"]})
            assert not res.is_error and body(res)["stdout"] == "room again\n", body(res)
            for run in started[1:]:
                await agent.call_tool("cancel", {"run": run})


# --- row 13: every offset a marker names can be read --------------------------------------------------


def named_offsets(shown: str) -> list[int]:
    return [int(m) for m in re.findall(r"offset=(\d+)\)", shown)]


async def read_from(c: Client, run: str, offset: int, expected: bytes) -> None:
    """Read the stream from `offset` to its end: every page starts where it was asked and holds
    exactly the known bytes, and nothing is skipped."""
    while True:
        page = body(await c.call_tool("read_output", {"run": run, "offset": offset, "max_bytes": 256 << 10}))
        assert "gone" not in page and page["offset"] == offset, {k: v for k, v in page.items() if k != "data"}
        data = page["data"].encode()
        assert data == expected[offset : offset + len(data)]
        offset += len(data)
        if page["eof"]:
            break
    assert offset == len(expected)


async def test_stdio_every_offset_a_marker_names_returns_exactly_those_bytes(cl: Cluster) -> None:
    """A run printing ~5 MB, more than the last 4 MiB kept: the marker names only offsets that can be
    read (before: offset=4096, whose page started at byte 805,748), each returns exactly the known
    bytes; an offset that is gone is answered as gone, with exactly which bytes and where reading
    goes on."""
    expected = b"".join(b"%d\n" % i for i in range(1, 720_001))
    assert len(expected) > RETAIN_BYTES + HEAD_KEEP
    base = len(expected) - RETAIN_BYTES
    assert cl.cli("exec", "box", "--", "seq", "1", "3000").returncode == 0  # a run this server never follows
    small = b"".join(b"%d\n" % i for i in range(1, 3001))
    async with stdio(cl) as c:
        out = body(await c.call_tool("exec", {"hand": "box", "command": "seq 1 720000"}))
        assert out["state"] == "succeeded" and out["stdout_bytes"] == len(expected)
        offsets = named_offsets(out["stdout"])
        assert offsets, out["stdout"][HEAD_KEEP - 20 : HEAD_KEEP + 300]
        for offset in offsets:
            await read_from(c, out["run"], offset, expected)
        assert offsets == [base] and f"bytes {HEAD_KEEP} to {base} are no longer kept" in out["stdout"]

        page = body(await c.call_tool("read_output", {"run": out["run"], "offset": HEAD_KEEP, "max_bytes": 1000}))
        assert page["gone"] == {"from": HEAD_KEEP, "to": base} and page["offset"] == base
        assert page["data"].encode() == expected[base : base + 1000] and str(base) in page["note"]
        page = body(await c.call_tool("read_output", {"run": out["run"], "offset": 0, "max_bytes": 65536}))
        assert page["data"].encode() == expected[:HEAD_KEEP] and page["next_offset"] == HEAD_KEEP  # the head

        # a run known only by the Mind's record of its end (its last 4 KiB): no offset named that is gone
        (other,) = [r for r in body(await c.call_tool("runs", {"hand": "box"}))["runs"] if r["run"] != out["run"]]
        shown = body(await c.call_tool("run_get", {"run": other["run"]}))["stdout"]
        assert "no longer kept" in shown and named_offsets(shown) == [], shown[:300]
        page = body(await c.call_tool("read_output", {"run": other["run"], "offset": 0}))
        kept = len(small) - 4096
        assert page["gone"] == {"from": 0, "to": kept} and page["data"].encode() == small[kept:]
