"""A light Hand simulator: N Hands as N WebSocket connections in ONE asyncio process.

Each simulated Hand does the real handshake (`protocol.auth.ClientHandshake`, with its own hand
credential) and then answers what a Mind sends: an `rpc` with `accepted`, `started` and a
`read_file`-shaped `result` (100 bytes), a `task_inventory` with an empty page, a `cancel` with
`already_done`; a background start is `rejected`. Nothing runs, nothing is stored. After a
`welcome` announcing a resume window it presents its runs (`runs_present`, none), as a real Hand.

    handsim.py --url ws://... --creds FILE [--concurrency 30] [--ping-interval 10]
    handsim.py --url ws://a,ws://b --url ws://c ...  # several Mind nodes (protocol/urls.py)
    handsim.py --url ws://... --raw --count N      # N plain idle WebSocket connections, no protocol

Several URLs: each Hand goes round them as a real Hand does (`protocol.urls.Rotation`: a random
start, the next at once on a refused connection, a short jittered pause once every URL failed), and
when its connection ends it connects again (a Hand whose node died moves to another).

Talks JSON lines: prints {"ready": true} once imported, connects when it reads `go` on stdin, prints
{"connected": n, "seconds": s, "busy": b, "errors": e, "by_url": {url: n}} when every Hand is
welcomed (or after --deadline), then holds the connections until stdin closes (or SIGTERM). A line
`watch URL` on stdin times the move of the Hands now on URL (its node is about to be killed): it
prints {"watched": k, "moved": m, "seconds": s, "by_url": {...}} once every one of them is welcomed
again elsewhere and has answered that node's first `task_inventory` (reconciled), or after
--deadline.

The Mind refuses handshakes past `--max-pending-handshakes` (64) with `busy`: at most --concurrency
handshakes are in progress here at once, and a `busy` refusal is retried after a short pause.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the real packages first (tests/protocol would shadow them)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidHandshake  # noqa: E402

from protocol import limits  # noqa: E402
from protocol.auth import ClientHandshake, Credential  # noqa: E402
from protocol.codes import CancelStatus, ErrorCode, RejectCode  # noqa: E402
from protocol.envelope import Channel  # noqa: E402
from protocol.errors import ProtocolError  # noqa: E402
from protocol.messages import (  # noqa: E402
    Accepted,
    Cancel,
    CancelResult,
    Challenge,
    Error,
    HandClaims,
    Rejected,
    Result,
    Rpc,
    RunsPresent,
    Started,
    TaskInventory,
    TaskInventoryPage,
    Welcome,
)
from protocol.states import RunState  # noqa: E402
from protocol.urls import Rotation, split_urls  # noqa: E402

CLAIMS = HandClaims(hostname="handsim", platform="Linux", machine="sim", python="3", version="handsim")
VALUE = {"data": b"x" * 100, "size": 100, "offset": 0, "eof": True}


class Watch:
    """The move of the Hands that were on one URL when `watch URL` came: timed until every one of
    them is welcomed elsewhere and reconciled there (its first `task_inventory` answered)."""

    def __init__(self, url: str, hands: set[int]) -> None:
        self.url = url
        self.hands = hands
        self.waiting = set(hands)
        self.t0 = time.perf_counter()
        self.done = asyncio.Event()
        if not self.waiting:
            self.done.set()

    def reconciled(self, k: int, url: str) -> None:
        if k in self.waiting and url != self.url:
            self.waiting.discard(k)
            if not self.waiting:
                self.done.set()


class Sim:
    def __init__(self, urls: list[str], n: int, concurrency: int, ping: float | None) -> None:
        self.urls = urls
        self.n = n
        self.sem = asyncio.Semaphore(concurrency)
        self.ping = ping
        self.connected = 0
        self.busy = 0
        self.errors = 0
        self.all = asyncio.Event()
        self.calls = 0
        self.where: dict[int, str] = {}
        """The URL each connected Hand is on now (by its index)."""
        self.watch: Watch | None = None

    async def _dial(self, url: str) -> ClientConnection:
        return await connect(
            url,
            compression=None,
            proxy=None,  # no proxy lookup in the environment for each of 10,000 connects (3 % of the simulator)
            max_size=limits.MAX_FRAME_BYTES,
            ping_interval=self.ping,
            ping_timeout=self.ping,
            open_timeout=30,
            close_timeout=1,
        )

    def _up(self) -> None:
        self.connected += 1
        if self.connected >= self.n:
            self.all.set()

    def by_url(self) -> dict[str, int]:
        out = dict.fromkeys(self.urls, 0)
        for url in self.where.values():
            out[url] += 1
        return out

    async def raw(self) -> None:
        for _ in range(100):
            async with self.sem:
                try:
                    ws = await self._dial(self.urls[0])
                except (OSError, InvalidHandshake, TimeoutError):
                    self.errors += 1
                    await asyncio.sleep(0.05)
                    continue
            self._up()
            await ws.wait_closed()
            return

    async def hand(self, k: int, cred: Credential) -> None:
        """One Hand, for as long as the simulator runs: connect (going round the URLs), serve,
        and connect again when the connection ends."""
        rot = Rotation(self.urls)
        first = True
        while True:
            ws, ch = await self._connect(rot, cred)
            url = rot.current
            self.where[k] = url
            if first:
                self._up()
                first = False
            try:
                await self._serve(ws, ch, k, url)
            except (ConnectionClosed, ProtocolError):
                pass
            finally:
                self.where.pop(k, None)
            await asyncio.sleep(random.random() * 0.05)  # (a real Hand backs off with jitter too)

    async def _connect(self, rot: Rotation, cred: Credential) -> tuple[ClientConnection, Channel]:
        for _ in range(5000):
            async with self.sem:
                try:
                    ws = await self._dial(rot.current)
                except (OSError, InvalidHandshake, TimeoutError):
                    self.errors += 1
                    if not rot.failed():  # every URL refused: a short pause before the next round
                        await asyncio.sleep(0.05 + random.random() * 0.05)
                    continue
                ch = Channel()
                try:
                    ok = await self._handshake(ws, ch, cred)
                except (ConnectionClosed, ProtocolError, TimeoutError):
                    self.errors += 1
                    ok = False
                if not ok:
                    await ws.close()
            if ok:
                rot.worked()
                return ws, ch
            await asyncio.sleep(0.02 + random.random() * 0.03)
        raise RuntimeError("a simulated hand gave up connecting")

    async def _handshake(self, ws: ClientConnection, ch: Channel, cred: Credential) -> bool:
        hs = ClientHandshake(cred, os.urandom(limits.NONCE_BYTES), claims=CLAIMS)
        async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
            try:
                await ws.send(ch.stamp(hs.hello()))
            except ConnectionClosed:
                pass  # refused before it read the hello: the reason is queued
            msg = ch.receive(await ws.recv()).msg
            if isinstance(msg, Error):
                if msg.code is ErrorCode.BUSY:
                    self.busy += 1
                else:
                    self.errors += 1
                return False
            assert isinstance(msg, Challenge), msg.TYPE
            await ws.send(ch.stamp(hs.on_challenge(msg)))
            msg = ch.receive(await ws.recv()).msg
            if not isinstance(msg, Welcome):
                self.errors += 1
                return False
            ch.gen = hs.on_welcome(msg)
            if msg.resume_window_s > 0:  # a real Hand presents the runs it holds: none here
                await ws.send(ch.stamp(RunsPresent(runs=[])))
        return True

    async def _serve(self, ws: ClientConnection, ch: Channel, k: int, url: str) -> None:
        reconciled = False
        async for data in ws:
            env = ch.receive(data)
            msg = env.msg
            if isinstance(msg, Rpc):
                if msg.background is not None:
                    await ws.send(
                        ch.stamp(
                            Rejected(
                                run_id=msg.run_id,
                                code=RejectCode.INVALID_REQUEST,
                                message="a simulated hand keeps no tasks",
                            )
                        )
                    )
                    continue
                await ws.send(ch.stamp(Accepted(run_id=msg.run_id)))
                await ws.send(ch.stamp(Started(run_id=msg.run_id)))
                await ws.send(ch.stamp(Result(run_id=msg.run_id, state=RunState.SUCCEEDED, value=VALUE)))
                self.calls += 1
            elif isinstance(msg, TaskInventory):
                await ws.send(ch.stamp(TaskInventoryPage(tasks=[]), env.id))
                if not reconciled:
                    reconciled = True
                    if self.watch is not None:
                        self.watch.reconciled(k, url)
            elif isinstance(msg, Cancel):
                await ws.send(ch.stamp(CancelResult(run_id=msg.run_id, status=CancelStatus.ALREADY_DONE)))
            elif isinstance(msg, Error):
                return
            elif env.id is not None:
                await ws.send(
                    ch.stamp(Error(code=ErrorCode.UNKNOWN_TASK, message="a simulated hand keeps no tasks"), env.id)
                )


async def amain(args: argparse.Namespace, creds: list[Credential]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    n = args.count if args.raw else len(creds)
    sim = Sim(split_urls(args.url), n, args.concurrency, args.ping_interval or None)
    print(json.dumps({"ready": True}), flush=True)
    if (await stdin.readline()).strip() != b"go":
        return
    t0 = time.perf_counter()
    if args.raw:
        jobs = [asyncio.ensure_future(sim.raw()) for _ in range(n)]
    else:
        jobs = [asyncio.ensure_future(sim.hand(k, c)) for k, c in enumerate(creds)]
    try:
        async with asyncio.timeout(args.deadline):
            await sim.all.wait()
    except TimeoutError:
        pass
    print(
        json.dumps(
            {
                "connected": sim.connected,
                "seconds": time.perf_counter() - t0,
                "busy": sim.busy,
                "errors": sim.errors,
                "by_url": sim.by_url(),
            }
        ),
        flush=True,
    )
    waiter = asyncio.ensure_future(stop.wait())
    while True:
        line = asyncio.ensure_future(stdin.readline())
        await asyncio.wait({line, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done() or not line.result():
            line.cancel()
            break
        cmd = line.result().decode().split()
        if cmd[:1] == ["watch"] and len(cmd) == 2:
            w = sim.watch = Watch(cmd[1], {k for k, url in sim.where.items() if url == cmd[1]})
            try:
                async with asyncio.timeout(args.deadline):
                    await w.done.wait()
            except TimeoutError:
                pass
            moved = len(w.hands) - len(w.waiting)
            print(
                json.dumps(
                    {
                        "watched": len(w.hands),
                        "moved": moved,
                        "seconds": time.perf_counter() - w.t0,
                        "by_url": sim.by_url(),
                        "errors": sim.errors,
                        "busy": sim.busy,
                    }
                ),
                flush=True,
            )
    for j in jobs:
        j.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)
    print(json.dumps({"calls": sim.calls}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, action="append", help="a Mind URL or a comma list; repeat for several")
    ap.add_argument("--creds", help="file of hand credentials, one token a line")
    ap.add_argument("--raw", action="store_true", help="plain idle WebSocket connections, no protocol")
    ap.add_argument("--count", type=int, default=0, help="connections in --raw mode")
    ap.add_argument("--concurrency", type=int, default=30, help="handshakes in progress at once")
    ap.add_argument("--ping-interval", type=float, default=10.0, help="keepalive ping of each connection (0: none)")
    ap.add_argument("--deadline", type=float, default=60.0, help="give up waiting for all connections after this")
    args = ap.parse_args()
    creds = []  # read before the loop starts: nothing else runs yet, and nothing then blocks it
    if not args.raw:
        creds = [Credential.parse(ln) for ln in Path(args.creds).read_text().splitlines() if ln.strip()]
    asyncio.run(amain(args, creds))


if __name__ == "__main__":
    main()
