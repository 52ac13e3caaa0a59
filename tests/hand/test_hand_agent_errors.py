"""The Hand's error policy, by injecting failures into a real agent (against the scripted Mind on
loopback): a failure while handling one frame ends that request, logged with its traceback; the
connection and its other runs go on (a dropped connection would end every run on it `lost`)."""

from __future__ import annotations

import asyncio
import os

import pytest
import structlog
from hand_support import until
from scripted_mind import ScriptedMind
from websockets.asyncio.server import serve

from hand.aio.agent import Agent, AgentConfig
from hand.aio.runs import RunTable
from hand.core.backoff import Backoff
from protocol import limits
from protocol.auth import Credential
from protocol.codes import ErrorCode, RejectCode
from protocol.messages import Error, Rejected, Result, Rpc, TaskStatus
from protocol.states import RunState


class Injected(RuntimeError):
    """The failure these tests inject: a bug in one handler."""


@pytest.fixture
async def world(tmp_path, monkeypatch):
    original = RunTable.on_rpc

    def failing(self, rpc):
        if rpc.run_id.startswith("boom"):
            raise Injected("the rpc handler broke")
        return original(self, rpc)

    monkeypatch.setattr(RunTable, "on_rpc", failing)
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    mind = ScriptedMind(cred)
    root = tmp_path / "root"
    root.mkdir()
    (root / "f.txt").write_text("hello\n")
    async with serve(mind.handler, "127.0.0.1", 0, compression=None, max_size=limits.MAX_FRAME_BYTES) as server:
        mind.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        cfg = AgentConfig(url=mind.url, credential=cred, root=root, ping_interval=1.0, kill_grace=0.5)
        agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
        task = asyncio.create_task(agent.run())
        try:
            conn = await mind.next_conn()
            await until(lambda: agent.gen == conn.gen, what="the agent to be welcomed")
            yield mind, agent, conn
        finally:
            agent.request_stop()
            assert await asyncio.wait_for(task, 10) == 0


def read(run_id: str) -> Rpc:
    return Rpc(run_id=run_id, tool="read_file", args={"path": "f.txt"}, timeout_ms=10_000)


async def test_a_failing_rpc_is_rejected_with_internal_error_and_the_connection_goes_on(world, monkeypatch):
    mind, agent, conn = world
    with structlog.testing.capture_logs() as events:
        await conn.send(read("boom-1"))
        env = await conn.until(lambda e: getattr(e.msg, "run_id", None) == "boom-1")
    assert isinstance(env.msg, Rejected) and env.msg.code is RejectCode.INTERNAL_ERROR
    [failure] = [e for e in events if e["event"] == "request_failed"]
    assert failure["exc_info"] and failure["run_id"] == "boom-1" and failure["type"] == "rpc"
    await conn.send(read("r2"))  # the same connection serves the next run
    msgs = await conn.until_result("r2")
    assert msgs[-1].state is RunState.SUCCEEDED and msgs[-1].value["data"] == b"hello\n"

    async def failing_answer(self, msg):
        raise Injected("the task status handler broke")

    monkeypatch.setattr(Agent, "_task_answer", failing_answer)
    await conn.send(TaskStatus(task_id="t1"), id="q1")  # a request with an id gets an error for that id
    env = await conn.until(lambda e: e.id == "q1")
    assert isinstance(env.msg, Error) and env.msg.code is ErrorCode.INTERNAL_ERROR
    monkeypatch.undo()
    await conn.send(read("r3"))
    assert (await conn.until_result("r3"))[-1].state is RunState.SUCCEEDED
    assert agent.gen == conn.gen and mind.conns.empty() and mind.handshakes == 1  # never reconnected


@pytest.mark.slow
async def test_a_failing_rpc_leaves_a_run_in_flight_on_the_same_connection_alone(world, tmp_path):
    mind, agent, conn = world
    gate = tmp_path / "root" / "gate"
    slow = Rpc(
        run_id="slow",
        tool="shell",
        args={"command": "while [ ! -e gate ]; do sleep 0.01; done; echo finished"},
        timeout_ms=20_000,
    )
    await conn.send(slow)
    await conn.until(lambda e: e.msg.TYPE == "started" and e.msg.run_id == "slow")
    await conn.send(read("boom-2"))
    env = await conn.until(lambda e: getattr(e.msg, "run_id", None) == "boom-2")
    assert isinstance(env.msg, Rejected) and env.msg.code is RejectCode.INTERNAL_ERROR
    gate.touch()
    end = await conn.until(lambda e: isinstance(e.msg, Result) and e.msg.run_id == "slow")
    assert end.msg.state is RunState.SUCCEEDED and end.msg.stdout.data == b"finished\n"
    assert agent.gen == conn.gen and mind.handshakes == 1
