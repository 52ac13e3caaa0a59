"""The error policy, by injecting failures into a real Mind: a failure while serving one request or
one connection ends that request with `internal_error`, is logged with its traceback, and never
stops the daemon or drops an unrelated peer.

The Mind runs in this process (`Mind.run`, a real asyncio server on a free loopback port) with two
real Hand agents connected to it, so one handler can be made to fail (monkeypatched) and everything
around it observed through a real client. Only file tools run: no process is started.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from hand.aio.agent import Agent, AgentConfig
from hand.core.backoff import Backoff
from mind.client.aio import ClientError, MindClient, load_credential
from mind.core.registry import RunRegistry
from mind.daemon.dispatch import Dispatch
from mind.daemon.server import Mind, MindConfig
from mind.daemon.taskservice import TaskService
from protocol.auth import Credential
from protocol.messages import ListRuns
from protocol.states import RunState


class Injected(RuntimeError):
    """The failure these tests inject: a bug in one handler."""


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


@dataclass
class World:
    mind: Mind
    serving: asyncio.Task[None]
    agents: dict[str, Agent]
    admin: Credential

    async def client(self) -> MindClient:
        assert self.mind.url is not None
        return await MindClient.connect(self.mind.url, self.admin)

    def alive(self) -> bool:
        return not self.serving.done()


@pytest.fixture
async def world(tmp_path: Path):
    home = tmp_path / "home"
    mind = Mind(MindConfig(home=home, port=0, ping_interval=1.0, tick_interval=0.05))
    ready = asyncio.Event()
    serving = asyncio.create_task(mind.run(on_ready=lambda _url: ready.set()))
    await asyncio.wait_for(ready.wait(), 10)
    agents: dict[str, Agent] = {}
    running = []
    for name in ("h1", "h2"):
        root = tmp_path / f"root-{name}"
        root.mkdir()
        (root / "f.txt").write_text(f"hello from {name}\n")
        assert mind.url is not None
        cfg = AgentConfig(
            url=mind.url, credential=await mind.store.add("hand", name), root=root, ping_interval=1.0, kill_grace=0.5
        )
        agents[name] = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
        running.append(asyncio.create_task(agents[name].run()))
    await until(lambda: all(n in mind.hands for n in agents), what="both hands connected")
    try:
        yield World(mind, serving, agents, load_credential(home / "admin.cred"))
    finally:
        for agent in agents.values():
            agent.request_stop()
        assert await asyncio.wait_for(asyncio.gather(*running), 15) == [0, 0]
        mind.stop()
        await asyncio.wait_for(serving, 15)


async def read(mc: MindClient, hand: str) -> Any:
    end = await mc.exec(hand, "read_file", {"path": "f.txt"}, timeout=10)
    assert end.state is RunState.SUCCEEDED, end
    return end.value


def failures(events: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The logged failures named `event`, each with its exception (what the log renders as
    `exc_type`, `exc_message` and `traceback`: see tests/protocol/test_logs.py)."""
    return [e for e in events if e["event"] == event and e.get("exc_info")]


async def test_a_failing_client_request_gets_internal_error_and_nothing_else_stops(world, monkeypatch):
    original = Dispatch.on_client_message

    def failing(self, peer, id_, msg):
        if isinstance(msg, ListRuns) and msg.hand == "boom":
            raise Injected("the list handler broke")
        return original(self, peer, id_, msg)

    monkeypatch.setattr(Dispatch, "on_client_message", failing)
    mc = await world.client()
    gen = {n: p.gen for n, p in world.mind.hands.items()}
    try:
        before = await mc.start("h1", "read_file", {"path": "f.txt"})  # in flight on the same connection
        with structlog.testing.capture_logs() as events:
            with pytest.raises(ClientError) as err:
                await mc.list_runs(hand="boom")
        assert err.value.code == "internal_error"
        [failure] = failures(events, "request_failed")
        assert failure["type"] == "list_runs" and failure["role"] == "client"
        assert (await before.wait()).state is RunState.SUCCEEDED
        assert [h.name for h in await mc.hands()] == ["h1", "h2"]  # the same connection goes on
        assert "hello from h2" in str(await read(mc, "h2"))
        assert await mc.list_runs(hand="h1")
    finally:
        await mc.close()
    async with await world.client() as other:  # the daemon still takes new connections
        assert "hello from h1" in str(await read(other, "h1"))
    assert world.alive() and {n: p.gen for n, p in world.mind.hands.items()} == gen  # no Hand was dropped


async def test_a_failing_spawned_request_gets_internal_error_and_the_connection_goes_on(world, monkeypatch):
    async def failing(self, peer, id_, req):
        raise Injected("the task lookup broke")

    monkeypatch.setattr(TaskService, "get", failing)
    async with await world.client() as mc:
        with structlog.testing.capture_logs() as events:
            with pytest.raises(ClientError) as err:
                await mc.task_get("t-1")
        assert err.value.code == "internal_error"
        [failure] = failures(events, "request_failed")
        assert failure["work"].endswith("failing") and failure["req"] is not None
        assert await mc.task_list() == []  # the same connection, the next request
        assert "hello from h1" in str(await read(mc, "h1"))
    assert world.alive()


async def test_a_failing_report_from_a_hand_ends_that_run_lost_and_the_hand_stays(world, monkeypatch):
    original = RunRegistry.on_result
    armed = [True]

    def failing(self, res, hand, gen, now, wall):
        if hand == "h1" and armed[0]:
            armed[0] = False
            raise Injected("the result handler broke")
        return original(self, res, hand, gen, now, wall)

    monkeypatch.setattr(RunRegistry, "on_result", failing)
    h1 = world.mind.hands["h1"]
    async with await world.client() as mc:
        with structlog.testing.capture_logs() as events:
            end = await mc.exec("h1", "read_file", {"path": "f.txt"}, timeout=10)
        # Not left to its deadline: the Mind cannot know how the run went, so it says `lost` now.
        assert end.state is RunState.LOST and "the mind failed" in (end.reason or "")
        [failure] = failures(events, "request_failed")
        assert failure["role"] == "hand" and failure["label"] == "h1" and failure["type"] == "result"
        assert world.mind.hands["h1"] is h1  # the Hand's connection was not dropped
        assert "hello from h1" in str(await read(mc, "h1"))  # and serves the next run
        assert "hello from h2" in str(await read(mc, "h2"))
    assert world.alive() and world.agents["h1"].gen == h1.gen


async def test_a_failing_background_coroutine_or_tick_never_stops_the_daemon(world, monkeypatch):
    ran = asyncio.Event()

    async def broken() -> None:
        ran.set()
        raise Injected("a background job broke")

    with structlog.testing.capture_logs() as events:
        world.mind.spawn(broken())  # on the server's task group, where a failure used to stop `mind serve`
        await asyncio.wait_for(ran.wait(), 5)
        await until(lambda: failures(events, "background_failed"), what="the failure logged")
    original = RunRegistry.on_tick
    calls = [0]

    def failing_tick(self, now, wall):
        calls[0] += 1
        if calls[0] == 1:
            raise Injected("the ticker broke")
        return original(self, now, wall)

    monkeypatch.setattr(RunRegistry, "on_tick", failing_tick)
    with structlog.testing.capture_logs() as events:
        await until(lambda: calls[0] >= 3, what="ticks after the failing one")
    assert failures(events, "tick_failed")
    assert world.alive()
    async with await world.client() as mc:
        assert "hello from h2" in str(await read(mc, "h2"))
