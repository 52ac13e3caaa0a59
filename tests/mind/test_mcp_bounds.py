"""`mind mcp` at its seams, without processes: the bearer pool (one check per bearer, none holding
another, a bound, refusals remembered), the byte budget of the runs it follows, every offset a marker
names readable, and which listen addresses and Host headers it accepts. The same properties performed
with real processes: tests/integration/test_mcp_seams.py."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mind.cli.main import parse
from mind.errors import ClientCode, ClientError
from mind.mcp import listen
from mind.mcp.bearers import FAILED_FOR_S, PENDING_MAX, Pool, Refusal
from mind.mcp.budget import RUN_FLOOR, Ledger, OverBudget
from mind.mcp.results import HEAD_KEEP, WINDOW_FLOOR, Retained, render
from mind.mcp.runs import Feed, Followed, Runs
from protocol.codes import ErrorCode
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

CONTENT = b"".join(b"%d\n" % i for i in range(1, 720_001))  # 4.9 MB: more than a window keeps


def bearer(label: str = "agent") -> str:
    return f"mh1:client:{label}:{secrets.token_hex(32)}"


# --- every offset a marker names can be read ---------------------------------------------------------


def named_offsets(shown: str) -> list[int]:
    return [int(m) for m in re.findall(r"offset=(\d+)\)", shown)]


def read_all(r: Retained, offset: int) -> bytes:
    got = b""
    while offset < r.total:
        start, data = r.read(offset, 100_000)
        assert start == offset, f"a page from {offset} started at {start}"
        got, offset = got + data, offset + len(data)
    return got


@pytest.mark.parametrize("cap", [4 << 20, 100_000, 9_000])
@pytest.mark.parametrize("limit", [8 << 10, 1 << 10])
def test_every_offset_a_marker_names_reads_exactly_those_bytes(cap: int, limit: int) -> None:
    r = Retained(cap=cap)
    for i in range(0, len(CONTENT), 65_536):
        r.append(CONTENT[i : i + 65_536])
    shown = render(r.view(), "r1", "stdout", limit)
    offsets = named_offsets(shown)
    assert offsets, shown[limit // 2 - 10 : limit // 2 + 300]
    for offset in offsets:
        # up to the next gone byte (the head's end, when a gap follows it), then nothing is skipped
        gone = r.gone()
        end = gone[0] if gone is not None and offset < gone[0] else len(CONTENT)
        start, data = r.read(offset, end - offset)
        assert (start, data) == (offset, CONTENT[offset:end])
    gone = r.gone()
    assert gone == (HEAD_KEEP, len(CONTENT) - cap)
    assert f"bytes {max(limit // 2, HEAD_KEEP)} to {len(CONTENT) - cap} are no longer kept" in shown
    assert read_all(r, r.base) == CONTENT[r.base :]


def test_a_read_at_a_gone_offset_says_which_bytes_are_gone_and_where_it_goes_on() -> None:
    from mind.mcp.tools import page

    r = Retained()
    for i in range(0, len(CONTENT), 65_536):
        r.append(CONTENT[i : i + 65_536])
    out = page("r1", "stdout", r, True, 4096, 1000)  # the offset the old marker named
    assert out["gone"] == {"from": HEAD_KEEP, "to": r.base} and out["offset"] == r.base
    assert f"bytes {HEAD_KEEP} to {r.base} of stdout are no longer kept" in out["note"]
    assert out["data"].encode() == CONTENT[r.base : r.base + 1000]
    out = page("r1", "stdout", r, True, 0, 10)
    assert "gone" not in out and (out["offset"], out["data"]) == (0, "1\n2\n3\n4\n5\n")
    out = page("r1", "stdout", r, True, len(CONTENT) + 1, 10)
    assert out["state"] == "error" and out["code"] == "invalid_request" and str(len(CONTENT)) in out["error"]


# --- the byte budget --------------------------------------------------------------------------------


class Handle:
    """What `Runs` reads of a `RunHandle`: its id and its events, given by the test."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    async def events(self) -> AsyncIterator[object]:
        while (ev := await self.queue.get()) is not None:
            yield ev

    def out(self, n: int, stream: str = "stdout") -> None:
        for i in range(0, n, 256 << 10):  # in frames as the Mind sends them (each at most 512 KiB)
            chunk = b"x" * min(256 << 10, n - i)
            self.queue.put_nowait(StreamData(run_id=self.run_id, stream=stream, offset=i, data=chunk))

    def end(self) -> None:
        self.queue.put_nowait(RunEnd(run_id=self.run_id, state=RunState.SUCCEEDED, hand="h", tool="exec"))
        self.queue.put_nowait(None)


async def settled() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def start(runs: Runs, name: str) -> tuple[Handle, Followed]:
    h = Handle(name)
    with runs.reserve() as held:
        f = runs.follow(h, "h", held=held)  # type: ignore[arg-type]
    return h, f


async def test_a_run_beyond_the_budget_is_refused_and_room_comes_back_when_one_ends() -> None:
    runs = Runs(client=None, ledger=Ledger(4 << 20))  # type: ignore[arg-type]
    handles = []
    for i in range(40):
        try:
            h, f = await start(runs, f"r{i}")
        except OverBudget as exc:
            assert "not started" in exc.message and "4 MiB" in exc.message and "cancel" in exc.message
            break
        h.out(3 << 20)  # each prints more than its share: the budget, not the runs, decides
        handles.append(h)
        await settled()
        assert runs.ledger.used <= runs.ledger.limit
    else:
        raise AssertionError("no run was refused")
    assert 1 < len(handles) < 40
    held = sum(f.held for f in runs._all)
    assert held == runs.ledger.used <= 4 << 20
    # every running run kept at least its floor (its last lines), whatever the others printed
    assert all(f.stdout.held >= min(3 << 20, HEAD_KEEP + WINDOW_FLOOR) for f in runs._all)
    handles[0].end()
    await settled()
    last, _ = await start(runs, "after")  # the ended one is let go to make room: admitted
    assert runs.get("r0") is None and runs.ledger.used <= 4 << 20
    for h in [*handles[1:], last]:
        h.end()
    await settled()
    await runs.close()
    assert runs.ledger.used == 0


async def test_the_server_budget_binds_across_credentials() -> None:
    server = Ledger(1 << 20)
    a = Runs(client=None, ledger=Ledger(1 << 20, server))  # type: ignore[arg-type]
    b = Runs(client=None, ledger=Ledger(1 << 20, server))  # type: ignore[arg-type]
    for i in range((1 << 20) // RUN_FLOOR):
        await start(a, f"a{i}")
    with pytest.raises(OverBudget, match="every agent of this server"):
        b.reserve()
    with pytest.raises(OverBudget, match="this credential's"):
        a.reserve()
    assert server.used == 1 << 20


async def test_a_start_that_fails_gives_its_floor_back() -> None:
    runs = Runs(client=None, ledger=Ledger(1 << 20))  # type: ignore[arg-type]
    with pytest.raises(ClientError), runs.reserve(3):
        assert runs.ledger.used == 3 * RUN_FLOOR
        raise ClientError(ClientCode.UNREACHABLE, "the Mind went away")
    assert runs.ledger.used == 0


async def test_stdin_not_read_yet_counts_in_the_budget_and_is_let_go_as_it_is_read() -> None:
    runs = Runs(client=None, ledger=Ledger(1 << 20))  # type: ignore[arg-type]
    feed = Feed()
    with runs.reserve() as held:
        f = runs.add(Followed(Handle("r1"), "h", feed=feed), held)  # type: ignore[arg-type]
    feed.write(b"x" * (512 << 10), False)
    assert runs.ledger.used == (512 << 10) and f.may_queue(256 << 10) and not f.may_queue(600 << 10)
    chunks = feed.chunks()
    assert await anext(chunks) == b"x" * (512 << 10)  # the command took it
    assert feed.queued == 0 and runs.ledger.used == RUN_FLOOR


# --- bearers ----------------------------------------------------------------------------------------


class FakeClient:
    riding_out = True

    async def close(self) -> None:
        pass


class Mind:
    """`MindClient.connect` as the pool sees it: counts handshakes; each takes `delay` and accepts
    only the bearers in `valid`."""

    def __init__(self, delay: float = 0.0) -> None:
        self.valid: set[str] = set()
        self.delay = delay
        self.handshakes: list[str] = []

    async def connect(self, url: str, cred: Any, **kw: Any) -> FakeClient:
        self.handshakes.append(cred.label)
        await asyncio.sleep(self.delay)
        if cred.label not in self.valid:
            raise ClientError(ErrorCode.AUTH_FAILED, "authentication failed")
        return FakeClient()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(mind: Mind, clock: Clock | None = None) -> Pool:
    return Pool("ws://mind", None, None, 60.0, clock=clock or Clock(), connect=mind.connect)


async def test_a_known_bearer_is_never_held_by_a_check_in_progress() -> None:
    mind = Mind()
    mind.valid.add("agent")
    p = pool(mind)
    agent = bearer("agent")
    known = await p.runs_for(agent)
    mind.delay = 30.0  # every handshake from now on hangs
    checks = [asyncio.ensure_future(p.runs_for(bearer(f"x{i}"))) for i in range(PENDING_MAX)]
    await settled()
    async with asyncio.timeout(0.5):
        assert await p.runs_for(agent) is known
    for c in checks:
        c.cancel()
    await p.close()


async def test_one_check_per_bearer_the_others_of_it_wait_for_it() -> None:
    mind = Mind(delay=0.05)
    mind.valid.add("agent")
    p = pool(mind)
    token = bearer("agent")
    got = await asyncio.gather(*(p.runs_for(token) for _ in range(10)))
    assert mind.handshakes == ["agent"] and all(r is got[0] for r in got)
    await p.close()


async def test_unknown_bearers_beyond_the_bound_are_refused_at_once() -> None:
    mind = Mind(delay=30.0)
    p = pool(mind)
    checks = [asyncio.ensure_future(p.runs_for(bearer(f"x{i}"))) for i in range(PENDING_MAX)]
    await settled()
    async with asyncio.timeout(0.5):
        with pytest.raises(Refusal) as refused:
            await p.runs_for(bearer("one-more"))
    assert refused.value.status == 429 and "retry" in refused.value.message
    assert len(mind.handshakes) == PENDING_MAX
    for c in checks:
        c.cancel()
    await p.close()


async def test_a_bearer_just_refused_is_refused_again_without_a_handshake() -> None:
    mind, clock = Mind(), Clock()
    p = pool(mind, clock)
    wrong = bearer("intruder")
    with pytest.raises(Refusal) as first:
        await p.runs_for(wrong)
    assert first.value.status == 401 and len(mind.handshakes) == 1
    clock.now += FAILED_FOR_S / 2
    with pytest.raises(Refusal) as again:
        await p.runs_for(wrong)
    assert again.value.status == 401 and "not checked again" in again.value.message
    assert len(mind.handshakes) == 1  # from memory
    clock.now += FAILED_FOR_S
    with pytest.raises(Refusal):
        await p.runs_for(wrong)
    assert len(mind.handshakes) == 2  # checked again once the memory passed
    for token, why in [("nonsense", "not a mindhand credential"), (f"mh1:hand:box:{'0' * 64}", "client")]:
        with pytest.raises(Refusal, match=why):
            await p.runs_for(token)
    assert len(mind.handshakes) == 2  # malformed: no handshake at all
    await p.close()


# --- listen addresses and Host headers --------------------------------------------------------------


def test_which_addresses_are_loopback() -> None:
    assert all(listen.loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(listen.loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com", ""))
    assert listen.split(":7480") == ("127.0.0.1", 7480) and listen.split("[::1]:7480") == ("::1", 7480)


def test_allowed_hosts_follow_the_listen_address() -> None:
    assert listen.allowed_hosts("10.0.0.5", 7480) == ["10.0.0.5", "10.0.0.5:7480"]
    local = listen.allowed_hosts("127.0.0.1", 7480)
    assert {"127.0.0.1:7480", "localhost:7480", "[::1]:7480"} <= set(local) and "evil.example:7480" not in local
    wild = listen.allowed_hosts("0.0.0.0", 7480, ["mcp.example.com", "proxy.example.com:8443"])
    assert "127.0.0.1:7480" in wild and "mcp.example.com" in wild and "mcp.example.com:*" in wild
    assert "proxy.example.com:8443" in wild and "proxy.example.com:8443:*" not in wild
    assert "http://mcp.example.com:*" in listen.allowed_origins(wild)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--listen", "0.0.0.0:7480"], "--insecure-http"),
        (["--listen", "10.0.0.5:7480"], "--tls-cert"),
        (["--listen", "0.0.0.0:7480", "--insecure-http", "--tls-cert", "c", "--tls-key", "k"], "exclude"),
        (["--insecure-http"], "go with --listen"),
    ],
)
def test_plain_http_beyond_loopback_is_refused(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["mcp", *argv])
    assert args.handler(args) == 2
    assert said in capsys.readouterr().err
