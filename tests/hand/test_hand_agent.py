"""The agent's connection loop against a scripted Mind endpoint on loopback.

The endpoint below is test scaffolding, not the Mind: it speaks the handshake with `protocol.auth`
and lets each test write and read raw frames, so the Hand's reactions to a well-behaved, a refusing,
a misbehaving and a vanishing Mind can each be checked with real sockets and real processes.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from dataclasses import dataclass

import pytest
from hand_support import pid_alive, read_pid, until
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from hand.agent import Agent, AgentConfig
from hand.backoff import Backoff
from protocol import limits
from protocol.auth import Credential, client_mac, mind_mac, transcript
from protocol.codes import CancelReason, ErrorCode
from protocol.envelope import Channel, Envelope, decode
from protocol.messages import (
    Accepted,
    Challenge,
    Error,
    Hello,
    Message,
    Progress,
    Proof,
    Result,
    Rpc,
    Started,
    Welcome,
)
from protocol.states import RunState


@dataclass
class Conn:
    ws: ServerConnection
    channel: Channel
    gen: int
    hello: Hello

    async def send(self, msg: Message) -> None:
        await self.ws.send(self.channel.stamp(msg))

    async def recv(self, timeout: float = 10.0) -> Envelope:
        env = self.channel.receive(await asyncio.wait_for(self.ws.recv(), timeout))
        assert env.gen == self.gen
        return env

    async def until_result(self, run_id: str) -> list[Message]:
        msgs = []
        while True:
            msg = (await self.recv()).msg
            msgs.append(msg)
            if isinstance(msg, Result) and msg.run_id == run_id:
                return msgs

    async def closed_by_hand(self, timeout: float = 10.0) -> None:
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(self.ws.recv(), timeout)


class ScriptedMind:
    def __init__(self, cred: Credential) -> None:
        self.cred = cred
        self.gen = 0
        self.handshakes = 0
        self.conns: asyncio.Queue[Conn] = asyncio.Queue()
        self.script: list[str] = []  # per handshake: "refuse", "forge", "silent" or "ok" (default)
        self.hand_errors: list[Error] = []
        self.url = ""

    async def handler(self, ws: ServerConnection) -> None:
        ch = Channel()
        hello = ch.receive(await ws.recv()).msg
        assert isinstance(hello, Hello)
        step = self.script.pop(0) if self.script else "ok"
        self.handshakes += 1
        if step == "refuse":
            await ws.send(ch.stamp(Error(code=ErrorCode.AUTH_FAILED, message="no")))
            return
        if step == "silent":  # never answer the hello
            env = decode(await asyncio.wait_for(ws.recv(), 10))
            self.hand_errors.append(env.msg)
            return
        challenge = Challenge(mind_id="mind1", handshake_id=f"hs{self.handshakes}", nonce=os.urandom(32),
                              expires_in_ms=10_000)
        await ws.send(ch.stamp(challenge))
        proof = ch.receive(await ws.recv()).msg
        assert isinstance(proof, Proof)
        t = transcript(hello, challenge)
        assert hmac.compare_digest(proof.mac, client_mac(self.cred.secret, t))
        self.gen += 1
        ch.gen = self.gen
        mac = os.urandom(32) if step == "forge" else mind_mac(self.cred.secret, t, self.gen)
        await ws.send(ch.stamp(Welcome(gen=self.gen, mac=mac, ping_interval_s=1.0)))
        if step == "forge":
            env = decode(await asyncio.wait_for(ws.recv(), 10))
            self.hand_errors.append(env.msg)
            return
        await self.conns.put(Conn(ws, ch, self.gen, hello))
        await ws.wait_closed()

    async def next_conn(self, timeout: float = 10.0) -> Conn:
        return await asyncio.wait_for(self.conns.get(), timeout)


@pytest.fixture
async def world(tmp_path):
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    mind = ScriptedMind(cred)
    root = tmp_path / "root"
    root.mkdir()
    async with serve(mind.handler, "127.0.0.1", 0, compression=None, max_size=limits.MAX_FRAME_BYTES) as server:
        port = server.sockets[0].getsockname()[1]
        mind.url = f"ws://127.0.0.1:{port}"
        cfg = AgentConfig(url=mind.url, credential=cred, root=root, ping_interval=1.0, kill_grace=0.5)
        agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
        task = asyncio.create_task(agent.run())
        try:
            yield mind, agent, task, tmp_path
        finally:
            agent.request_stop()
            assert await asyncio.wait_for(task, 10) == 0


async def test_handshake_and_a_run_round_trip(world):
    mind, agent, _, _ = world
    conn = await mind.next_conn()
    assert conn.hello.role == "hand" and conn.hello.label == "h1" and conn.hello.claims.hostname
    await until(lambda: agent.gen == conn.gen, what="the agent to be welcomed")
    await conn.send(Rpc(run_id="r1", tool="shell", args={"command": "echo hi"}, timeout_ms=10_000))
    msgs = await conn.until_result("r1")
    assert [type(m) for m in msgs] == [Accepted, Started, Progress, Result]
    assert msgs[-1].state is RunState.SUCCEEDED and msgs[-1].stdout.data == b"hi\n"


async def test_a_dropped_connection_cancels_its_runs_and_the_hand_reconnects(world):
    mind, agent, _, tmp = world
    conn = await mind.next_conn()
    pidfile = tmp / "child.pid"
    await conn.send(Rpc(run_id="r1", tool="shell", args={"command": f"sleep 100 & echo $! > {pidfile}; wait"},
                        timeout_ms=60_000))
    child = await until(lambda: read_pid(pidfile), what="the command to start")
    conn.ws.transport.abort()  # the Mind vanishes without a close frame
    await until(lambda: not pid_alive(child), timeout=10, what="the command to be killed")
    conn2 = await mind.next_conn()
    assert conn2.gen == conn.gen + 1
    # Nothing from the old connection is resent: the new one stays silent until asked.
    with pytest.raises(TimeoutError):
        await conn2.recv(timeout=0.3)
    await conn2.send(Rpc(run_id="r1", tool="shell", args={"command": "true"}, timeout_ms=10_000))
    env = await conn2.recv()
    assert env.msg.code.value == "duplicate_run"  # never run the same run id twice


async def test_refusals_and_a_forged_welcome_never_stop_the_hand(world):
    mind, agent, _, _ = world
    first = await mind.next_conn()
    mind.script = ["refuse", "forge", "refuse"]
    await first.ws.close()
    conn = await mind.next_conn()
    assert mind.handshakes == 5 and conn.gen == 3
    [err] = mind.hand_errors
    assert err.code is ErrorCode.AUTH_FAILED  # the Hand told the forger why, then left


@pytest.mark.parametrize(
    "frame, code",
    [
        (b"\xc1", ErrorCode.MALFORMED_FRAME),
        ("text frame", ErrorCode.MALFORMED_FRAME),
        (Challenge(mind_id="m", handshake_id="h", nonce=b"n" * 32, expires_in_ms=10), ErrorCode.UNEXPECTED_MESSAGE),
        ("wrong-gen", ErrorCode.GEN_MISMATCH),
        ("repeat-seq", ErrorCode.SEQ_VIOLATION),
    ],
)
async def test_a_bad_frame_gets_an_error_frame_and_a_close(world, frame, code):
    mind, agent, _, _ = world
    conn = await mind.next_conn()
    if frame == "wrong-gen":
        conn.channel.gen = conn.gen + 7
        data = conn.channel.stamp(Rpc(run_id="r", tool="shell", args={"command": "true"}, timeout_ms=1000))
        conn.channel.gen = conn.gen
    elif frame == "repeat-seq":
        data = conn.channel.stamp(Rpc(run_id="r", tool="shell", args={"command": "true"}, timeout_ms=1000))
        await conn.ws.send(data)
        assert isinstance((await conn.recv()).msg, Accepted)  # then the very same frame again
    elif isinstance(frame, Message):
        data = conn.channel.stamp(frame)
    else:
        data = frame
    await conn.ws.send(data)
    while True:
        env = await conn.recv()
        if isinstance(env.msg, Error):
            break
    assert env.msg.code is code and env.id is None
    await conn.closed_by_hand()
    assert (await mind.next_conn()).gen == conn.gen + 1


async def test_an_error_frame_from_the_mind_makes_the_hand_reconnect(world):
    mind, _, _, _ = world
    conn = await mind.next_conn()
    await conn.send(Error(code=ErrorCode.REPLACED, message="go away"))
    await conn.closed_by_hand()
    assert (await mind.next_conn()).gen == conn.gen + 1


async def test_shutdown_cancels_runs_reports_them_and_exits_zero(world):
    mind, agent, task, tmp = world
    conn = await mind.next_conn()
    pidfile = tmp / "child.pid"
    await conn.send(Rpc(run_id="r1", tool="shell", args={"command": f"sleep 100 & echo $! > {pidfile}; wait"},
                        timeout_ms=60_000))
    child = await until(lambda: read_pid(pidfile), what="the command to start")
    agent.request_stop()
    msgs = await conn.until_result("r1")
    result = msgs[-1]
    assert result.state is RunState.CANCELLED and result.reason == CancelReason.SHUTDOWN.value
    assert await asyncio.wait_for(task, 10) == 0
    assert not pid_alive(child)
    await conn.closed_by_hand()


async def test_stop_while_the_mind_is_unreachable(tmp_path):
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    cfg = AgentConfig(url="ws://127.0.0.1:9", credential=cred, root=tmp_path)
    agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
    task = asyncio.create_task(agent.run())
    await until(lambda: agent._backoff.attempt >= 3, what="a few failed attempts")
    agent.request_stop()
    assert await asyncio.wait_for(task, 5) == 0


async def test_a_mind_that_never_answers_the_hello_times_the_handshake_out(world, monkeypatch):
    mind, _, _, _ = world
    first = await mind.next_conn()
    monkeypatch.setattr(limits, "HANDSHAKE_TIMEOUT_S", 0.3)
    mind.script = ["silent"]
    await first.ws.close()
    conn = await mind.next_conn()
    assert conn.gen == 2
    [err] = mind.hand_errors
    assert err.code is ErrorCode.HANDSHAKE_TIMEOUT
