"""A scripted Mind endpoint on loopback for the Hand tests.

Test scaffolding, not the Mind: it speaks the handshake with `protocol.auth` and lets each test write
and read raw frames, so the Hand's reactions to a well-behaved, a refusing, a misbehaving, a slow
and a vanishing Mind can each be checked with real sockets and real processes.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from dataclasses import dataclass

import pytest
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from protocol.auth import Credential, client_mac, mind_mac, transcript
from protocol.codes import ErrorCode
from protocol.envelope import Channel, Envelope, decode
from protocol.messages import Challenge, Error, Hello, Message, Proof, Result, Welcome


@dataclass
class Conn:
    ws: ServerConnection
    channel: Channel
    gen: int
    hello: Hello

    async def send(self, msg: Message, id: str | None = None) -> None:
        await self.ws.send(self.channel.stamp(msg, id=id))

    async def recv(self, timeout: float = 10.0) -> Envelope:
        env = self.channel.receive(await asyncio.wait_for(self.ws.recv(), timeout))
        assert env.gen == self.gen
        return env

    async def until(self, pred, timeout: float = 10.0) -> Envelope:
        """Read frames until one satisfies `pred(env)`; return it."""
        while True:
            env = await self.recv(timeout)
            if pred(env):
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
        # per handshake: "refuse" (rate_limited: try later), "deny" (auth_failed: never), "forge",
        # "silent", "hold" or "ok" (default)
        self.script: list[str] = []
        self.release = asyncio.Event()
        """A "hold" handshake waits for this before answering the hello (the Hand stays offline)."""
        self.hand_errors: list[Error] = []
        self.url = ""
        self.resume_window = 0.0
        """`welcome.resume_window_s` (DESIGN §15): above 0 the Hand keeps its runs across a cut."""

    async def handler(self, ws: ServerConnection) -> None:
        ch = Channel()
        hello = ch.receive(await ws.recv()).msg
        assert isinstance(hello, Hello)
        step = self.script.pop(0) if self.script else "ok"
        self.handshakes += 1
        if step == "refuse":
            await ws.send(ch.stamp(Error(code=ErrorCode.RATE_LIMITED, message="try later")))
            return
        if step == "deny":
            await ws.send(ch.stamp(Error(code=ErrorCode.AUTH_FAILED, message="unknown credential")))
            return
        if step == "hold":
            await self.release.wait()
        if step == "silent":  # never answer the hello
            env = decode(await asyncio.wait_for(ws.recv(), 10))
            self.hand_errors.append(env.msg)
            return
        challenge = Challenge(
            mind_id="mind1", handshake_id=f"hs{self.handshakes}", nonce=os.urandom(32), expires_in_ms=10_000
        )
        await ws.send(ch.stamp(challenge))
        proof = ch.receive(await ws.recv()).msg
        assert isinstance(proof, Proof)
        t = transcript(hello, challenge)
        assert hmac.compare_digest(proof.mac, client_mac(self.cred.secret, t))
        self.gen += 1
        ch.gen = self.gen
        mac = os.urandom(32) if step == "forge" else mind_mac(self.cred.secret, t, self.gen)
        await ws.send(ch.stamp(Welcome(gen=self.gen, mac=mac, ping_interval_s=1.0, resume_window_s=self.resume_window)))
        if step == "forge":
            env = decode(await asyncio.wait_for(ws.recv(), 10))
            self.hand_errors.append(env.msg)
            return
        await self.conns.put(Conn(ws, ch, self.gen, hello))
        await ws.wait_closed()

    async def next_conn(self, timeout: float = 10.0) -> Conn:
        return await asyncio.wait_for(self.conns.get(), timeout)
