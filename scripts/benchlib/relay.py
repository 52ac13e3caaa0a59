"""The reference: a raw WebSocket relay with msgpack, in its own processes.

    client --ws--> relay --ws--> peer --ws--> relay --ws--> client

Each hop decodes and re-encodes msgpack (the relay routes by a connection tag it adds and removes),
`compression=None` everywhere, nothing else: no validation, no state, no logging. What mindhand's
client -> Mind -> Hand -> Mind -> client path costs on top of this is mindhand's own overhead.

Run as a script (one process each):
    relay.py relay               listen on a free loopback port, print {"port": N}
    relay.py peer ws://...       register as the answering peer, print {"ready": true}
    relay.py bare                a bare websockets server holding idle connections, print {"port": N}
    relay.py hop ws://...        one more raw hop in front of the relay: each client connection
                                 forwarded on a connection of its own to the relay, every message
                                 decoded and re-encoded (as a relay routes), print {"port": N}
Each exits when its stdin closes (or on SIGTERM).

Imported: `RelayClient` is the client side, used in the benchmark's own process.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import msgpack
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

MAX_SIZE = 8 << 20
BODY = {"data": b"x" * 100, "size": 100, "offset": 0, "eof": True}


async def until_stdin_closes() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    eof = asyncio.ensure_future(stdin.read())
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({eof, waiter}, return_when=asyncio.FIRST_COMPLETED)
    eof.cancel()
    waiter.cancel()


async def run_relay() -> None:
    peer: list = []
    clients: dict[int, object] = {}
    counter = [0]

    async def handler(ws) -> None:
        first = await ws.recv()
        if first == b"peer":
            peer[:] = [ws]
            await ws.send(b"ok")
            async for data in ws:
                m = msgpack.unpackb(data)
                c = clients.get(m.pop("c"))
                if c is not None:
                    await c.send(msgpack.packb(m))
            return
        counter[0] += 1
        cid = counter[0]
        clients[cid] = ws
        try:
            await ws.send(b"ok")
            async for data in ws:
                m = msgpack.unpackb(data)
                m["c"] = cid
                await peer[0].send(msgpack.packb(m))
        finally:
            clients.pop(cid, None)

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=MAX_SIZE) as server:
        print(json.dumps({"port": next(iter(server.sockets)).getsockname()[1]}), flush=True)
        await until_stdin_closes()


async def run_peer(url: str) -> None:
    async with connect(url, compression=None, max_size=MAX_SIZE) as ws:
        await ws.send(b"peer")
        assert await ws.recv() == b"ok"
        print(json.dumps({"ready": True}), flush=True)
        answering = asyncio.ensure_future(_answer(ws))
        await until_stdin_closes()
        answering.cancel()


async def _answer(ws) -> None:
    async for data in ws:
        m = msgpack.unpackb(data)
        await ws.send(msgpack.packb({"id": m["id"], "c": m["c"], "v": BODY}))


async def run_hop(url: str) -> None:
    """The reference for a routed call's extra hop between Mind nodes (issue 27): a call through
    hop -> relay -> peer against the same call through relay -> peer costs one more process on the
    way, two more WebSocket reads and writes per round trip, and nothing of mindhand's."""

    async def handler(ws) -> None:
        async with connect(url, compression=None, max_size=MAX_SIZE) as up:

            async def down() -> None:
                async for data in up:
                    await ws.send(
                        data if isinstance(data, str) or data in (b"ok",) else msgpack.packb(msgpack.unpackb(data))
                    )

            back = asyncio.ensure_future(down())
            try:
                async for data in ws:
                    await up.send(data if data in (b"client",) else msgpack.packb(msgpack.unpackb(data)))
            finally:
                back.cancel()

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=MAX_SIZE) as server:
        print(json.dumps({"port": next(iter(server.sockets)).getsockname()[1]}), flush=True)
        await until_stdin_closes()


async def run_bare() -> None:
    async def handler(ws) -> None:
        await ws.wait_closed()

    async with serve(
        handler, "127.0.0.1", 0, compression=None, max_size=MAX_SIZE, ping_interval=10, ping_timeout=10, backlog=1024
    ) as server:
        print(json.dumps({"port": next(iter(server.sockets)).getsockname()[1]}), flush=True)
        await until_stdin_closes()


class RelayClient:
    """The client end of the relay (one connection, requests pipelined by id)."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None

    @classmethod
    async def connect(cls, url: str) -> RelayClient:
        ws = await connect(url, compression=None, max_size=MAX_SIZE, open_timeout=10)
        await ws.send(b"client")
        assert await ws.recv() == b"ok"
        return cls(ws)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.ws.close()

    def _msg(self) -> tuple[int, bytes]:
        self._next += 1
        return self._next, msgpack.packb({"id": self._next, "tool": "read_file", "args": {"path": "small.txt"}})

    async def sequential(self, n: int) -> list[float]:
        """n calls one after another; their round trips in ms."""
        out = []
        for _ in range(n):
            id_, data = self._msg()
            t0 = time.perf_counter()
            await self.ws.send(data)
            reply = msgpack.unpackb(await self.ws.recv())
            out.append((time.perf_counter() - t0) * 1000)
            assert reply["id"] == id_
        return out

    async def _read(self) -> None:
        async for data in self.ws:
            m = msgpack.unpackb(data)
            fut = self._waiting.pop(m["id"], None)
            if fut is not None and not fut.done():
                fut.set_result(m)

    async def pipelined(self, inflight: int, seconds: float) -> tuple[int, float]:
        """`inflight` callers each calling in a loop for `seconds`: (calls done, elapsed s)."""
        self._reader = asyncio.ensure_future(self._read())
        loop = asyncio.get_running_loop()
        done = 0
        t0 = time.perf_counter()
        end = t0 + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                id_, data = self._msg()
                fut = loop.create_future()
                self._waiting[id_] = fut
                await self.ws.send(data)
                await fut
                done += 1

        await asyncio.gather(*(worker() for _ in range(inflight)))
        elapsed = time.perf_counter() - t0
        self._reader.cancel()
        self._reader = None
        return done, elapsed


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "relay":
        asyncio.run(run_relay())
    elif mode == "peer":
        asyncio.run(run_peer(sys.argv[2]))
    elif mode == "bare":
        asyncio.run(run_bare())
    elif mode == "hop":
        asyncio.run(run_hop(sys.argv[2]))
    else:
        raise SystemExit("usage: relay.py relay | peer URL | bare | hop URL")


if __name__ == "__main__":
    main()
