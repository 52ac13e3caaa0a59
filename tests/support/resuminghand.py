"""A Hand written by hand that resumes its streams (DESIGN §15), to test the client leg's streams
end to end through a real Mind before (and apart from) the real Hand's own resumption.

It serves `exec` runs of two kinds, decided by the run's opening:
- without stdin: it sends `PATTERN` bytes (`size`, a byte count, from the run's args) on stdout,
  paced, within the credit the client grants, keeping what is not acknowledged (`Outgoing`);
- with stdin: it is `sha256sum`: it takes stdin (`Incoming`: order, repeats dropped, acknowledgements
  paced) and, at its end, prints the digest as `sha256sum` does.
A `stream_resume` from the Mind (the client came back) resends exactly from the offset named.
The result goes once every output byte is acknowledged, with the digest of what was sent.
Every frame is stamped and written under one lock: the envelope's sequence numbers stay in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from protocol.auth import ClientHandshake, Credential
from protocol.envelope import Channel
from protocol.messages import (
    Accepted,
    HandClaims,
    Message,
    OutputTail,
    Result,
    Rpc,
    Started,
    StreamAck,
    StreamData,
    StreamResume,
)
from protocol.states import RunState
from protocol.streams import Incoming, Outgoing

CLAIMS = HandClaims(hostname="fake", platform="p", machine="m", python="3", version="0")
PATTERN = bytes(range(251))  # a prime length: a chunk boundary never lines up with a repeat


def pattern(size: int) -> bytes:
    return (PATTERN * (size // len(PATTERN) + 1))[:size]


class ResumingHand:
    def __init__(self, ws: ClientConnection, channel: Channel) -> None:
        self.ws = ws
        self.ch = channel
        self.lock = asyncio.Lock()
        self.out: dict[str, Outgoing] = {}
        self.credit: dict[str, asyncio.Event] = {}
        self.stdin: dict[str, Incoming] = {}
        self.digest: dict[str, Any] = {}
        self.resumes = 0
        self.tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def connect(cls, url: str, cred: Credential) -> ResumingHand:
        ws = await connect(url, compression=None, max_size=None)
        ch = Channel()
        hs = ClientHandshake(cred, os.urandom(32), CLAIMS)
        async with asyncio.timeout(15):
            await ws.send(ch.stamp(hs.hello()))
            await ws.send(ch.stamp(hs.on_challenge(ch.receive(await ws.recv()).msg)))
            ch.gen = hs.on_welcome(ch.receive(await ws.recv()).msg)
        return cls(ws, ch)

    async def send(self, msg: Message) -> None:
        async with self.lock:
            await self.ws.send(self.ch.stamp(msg))

    async def serve(self) -> None:
        async for frame in self.ws:
            msg = self.ch.receive(frame).msg
            if isinstance(msg, Rpc):
                self.prepare(msg)  # now, not in the task: stdin may be the very next frame
                self.spawn(self.run(msg))
            elif isinstance(msg, StreamAck) and msg.run_id in self.out:
                self.out[msg.run_id].on_ack(msg.offset)
                self.credit[msg.run_id].set()
            elif isinstance(msg, StreamResume) and msg.stream == "stdout" and msg.run_id in self.out:
                self.resumes += 1
                for offset, data, eof in self.out[msg.run_id].resume(msg.offset, msg.consumed):
                    await self.send(StreamData(run_id=msg.run_id, stream="stdout", offset=offset, data=data, eof=eof))
                self.credit[msg.run_id].set()
            elif isinstance(msg, StreamData) and msg.stream == "stdin" and msg.run_id in self.stdin:
                await self.take_stdin(msg)

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def prepare(self, rpc: Rpc) -> None:
        rid = rpc.run_id
        assert rpc.streams is not None, "the fake serves streamed runs only"
        window = rpc.streams.window
        self.out[rid] = Outgoing(window)
        self.credit[rid] = asyncio.Event()
        if rpc.streams.stdin:
            self.stdin[rid] = Incoming(window)
            self.digest[rid] = (hashlib.sha256(), asyncio.get_running_loop().create_future())

    async def run(self, rpc: Rpc) -> None:
        rid = rpc.run_id
        assert rpc.streams is not None
        await self.send(Accepted(run_id=rid))
        await self.send(Started(run_id=rid))
        if rpc.streams.stdin:
            data = (await self.digest[rid][1]).encode() + b"  -\n"
        else:
            data = pattern(int(rpc.args["size"]))
        sent = hashlib.sha256()
        out = self.out[rid]
        at = 0
        while at < len(data):
            while out.credit() == 0:
                self.credit[rid].clear()
                await self.credit[rid].wait()
            n = min(out.credit(), 16 << 10, len(data) - at)
            for offset, piece, _ in out.send(data[at : at + n]):
                await self.send(StreamData(run_id=rid, stream="stdout", offset=offset, data=piece))
            sent.update(data[at : at + n])
            at += n
            await asyncio.sleep(0.005)  # paced: a cut falls mid-stream
        offset, _, eof = out.close()
        await self.send(StreamData(run_id=rid, stream="stdout", offset=offset, eof=eof))
        await self.send(StreamData(run_id=rid, stream="stderr", offset=0, eof=True))
        while not out.drained:  # the result goes once the client has every byte
            self.credit[rid].clear()
            await self.credit[rid].wait()
        tail = OutputTail(data=data[-4096:], total=len(data), sent=len(data), sha256=sent.hexdigest())
        await self.send(Result(run_id=rid, state=RunState.SUCCEEDED, exit_code=0, stdout=tail))

    async def take_stdin(self, msg: StreamData) -> None:
        rx = self.stdin[msg.run_id]
        hasher, done = self.digest[msg.run_id]
        if not rx.on_data(msg.offset, len(msg.data), msg.eof):
            return  # a repeat after a resume
        hasher.update(msg.data)
        rx.consume(len(msg.data))
        ack = rx.ack_due()
        if ack is not None:
            await self.send(StreamAck(run_id=msg.run_id, stream="stdin", offset=ack))
        if msg.eof and not done.done():
            done.set_result(hasher.hexdigest())

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await self.ws.close()
