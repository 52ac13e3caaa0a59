"""Frames queued together leave in one write (`protocol.io.batching`), intact and in order, over a real
WebSocket on loopback; closing still works as websockets does it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from hand.aio.agent import BatchingConnection as HandConnection
from mind.daemon.outbox import BatchingConnection as MindConnection


@contextlib.asynccontextmanager
async def _linked(handler: Callable[[MindConnection], Awaitable[None]], **size: Any) -> AsyncIterator[HandConnection]:
    """A Mind-side connection serving `handler` on a free loopback port, and a Hand-side one to it
    (both batching, no compression): the client's end, while both are open."""
    async with serve(handler, "127.0.0.1", 0, create_connection=MindConnection, compression=None, **size) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", create_connection=HandConnection, compression=None, **size) as ws:
            yield ws


async def test_a_burst_is_one_write_and_arrives_whole_in_both_directions():
    frames = [bytes([i % 256]) * (1 + i * 37 % 3000) for i in range(200)]
    writes: dict[str, int] = {}
    burst: dict[str, int] = {}
    got_by_server: list[bytes] = []

    def counted(conn, name: str) -> None:
        # A write is what one `data_to_send` hands over: one `sendmsg` (or one `writelines` of
        # what the socket did not take), whatever the number of frames in it.
        protocol = conn.protocol
        original = protocol.data_to_send

        def data_to_send():
            chunks = original()
            if chunks:
                writes[name] = writes.get(name, 0) + 1
            return chunks

        protocol.data_to_send = data_to_send

    async def handler(ws: MindConnection) -> None:
        counted(ws, "mind")
        await ws.send_many(frames)
        burst["mind"] = writes["mind"]
        for _ in frames:
            got_by_server.append(await ws.recv())
        await ws.close()

    async with _linked(handler) as ws:
        counted(ws, "hand")
        got = [await asyncio.wait_for(ws.recv(), 10) for _ in frames]
        await ws.send_many(frames)
        burst["hand"] = writes["hand"]
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert got == frames and got_by_server == frames
    assert burst == {"mind": 1, "hand": 1}  # 200 frames each way, one write each
    assert writes["mind"] >= 2  # the closing handshake went through the same path


async def test_frames_written_as_header_and_payload_arrive_whole_both_ways():
    # A Hand's stream chunks go as (header, payload), framed and masked by `BatchedWrites` with a
    # fresh key each (the payload's key turned by the header's length); the Mind's unmasked. Read
    # by the peer (websockets' reader and ours), each is the header and the payload joined.
    import os

    sizes = [1, 2, 3, 4, 5, 125, 126, 127, 65535, 65536, 200_000]
    parts = [(bytes([0xA5]) * (h % 7 + 10), os.urandom(n)) for h, n in enumerate(sizes)]
    parts.append((b"h" * 14, memoryview(os.urandom(1000))[3:900]))
    want = [h + bytes(p) for h, p in parts]
    got_by_server: list[bytes] = []

    async def handler(ws: MindConnection) -> None:
        for _ in parts:
            got_by_server.append(await ws.recv())
        await ws.send_many(list(parts))
        await ws.close()

    async with _linked(handler) as ws:
        for one in parts[:3]:  # one at a time, then the rest together
            await ws.send_many([one])
        await ws.send_many(list(parts[3:]))
        got = [await asyncio.wait_for(ws.recv(), 10) for _ in parts]
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert got_by_server == want
    assert got == want


async def test_a_burst_larger_than_the_socket_takes_arrives_whole_and_in_order():
    # 24 MiB at once while the peer does not read yet: `sendmsg` takes what the socket holds, the
    # transport keeps the rest (from the middle of a buffer) and sends it once the peer reads.
    import os

    parts = [(i.to_bytes(14, "big"), os.urandom(512 << 10)) for i in range(48)]
    want = [h + p for h, p in parts]
    got: list[bytes] = []

    async def handler(ws: MindConnection) -> None:
        await asyncio.sleep(0.3)
        for _ in parts:
            got.append(await ws.recv())
        await ws.send_many(list(parts))
        await ws.close()

    async with _linked(handler) as ws:
        await ws.send_many(list(parts))
        await asyncio.sleep(0.3)  # the Mind's burst waits for this reader too
        back = [await asyncio.wait_for(ws.recv(), 10) for _ in parts]
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert got == want
    assert back == want


async def test_large_whole_frames_framed_here_arrive_whole_both_ways():
    # A whole frame from LARGE_FRAME on is framed by `BatchedWrites` (an empty header, the frame as
    # the payload: masked with its key from byte 0 on the client side), smaller ones by websockets;
    # alone (`write_frames` of one) and in bursts mixed with (header, payload) parts.
    import os

    from protocol.io.batching import LARGE_FRAME, write_frames

    sizes = [LARGE_FRAME - 1, LARGE_FRAME, LARGE_FRAME + 1, 65535, 65536, 4 << 20, 1, 125]
    frames: list = [os.urandom(n) for n in sizes]
    frames.insert(3, (b"h" * 14, os.urandom(LARGE_FRAME)))
    want = [f if isinstance(f, bytes) else f[0] + f[1] for f in frames]
    got_by_server: list[bytes] = []

    async def handler(ws: MindConnection) -> None:
        for _ in range(2 * len(frames)):
            got_by_server.append(await ws.recv())
        for f in frames:
            await write_frames(ws, [f])
        await write_frames(ws, frames)
        await ws.close()

    async with _linked(handler, max_size=None) as ws:
        for f in frames:
            await write_frames(ws, [f])
        await write_frames(ws, frames)
        got = [await asyncio.wait_for(ws.recv(), 10) for _ in range(2 * len(frames))]
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert got_by_server == want + want
    assert got == want + want


async def test_the_outbox_writes_at_the_end_of_a_turn_and_by_its_task_in_one_order():
    # `TurnWriter`: frames queued while the writer task is parked are written by a callback at the
    # end of the turn, the rest (flow control paused by a peer that does not read) by the task. The
    # peer must get every frame whole and in the order queued, across both hand-overs: small
    # frames turn by turn, a 24 MiB burst while it does not read, then small frames again.
    import os

    from mind.daemon.outbox import Outbox
    from protocol import frames as data_frames
    from protocol.envelope import Channel

    sizes = [100 + i for i in range(30)] + [512 << 10] * 48 + [200 + i for i in range(30)]
    payloads = [os.urandom(n) for n in sizes]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    want = [data_frames.header(1, off, False) + p for off, p in zip(offsets, payloads, strict=True)]
    reading = asyncio.Event()
    reading.set()
    caught_up = asyncio.Event()
    counted = {"end of turn": 0, "task": 0}

    async def handler(ws: MindConnection) -> None:
        write_now, send_many = ws.write_now, ws.send_many

        def at_end_of_turn(frames: list[Any]) -> None:
            counted["end of turn"] += len(frames)
            write_now(frames)

        async def by_task(frames: list[Any]) -> None:
            counted["task"] += len(frames)
            await send_many(frames)

        ws.write_now, ws.send_many = at_end_of_turn, by_task  # type: ignore[method-assign]
        box = Outbox(ws, Channel())
        writer = asyncio.create_task(box.run())
        await asyncio.sleep(0)  # the task runs, finds nothing, parks
        for i, (off, p) in enumerate(zip(offsets, payloads, strict=True)):
            if i == 30:
                reading.clear()  # the peer stops reading: the burst fills the socket, then pauses
            box.put_frame(1, off, False, p)
            if i < 30 or i >= 78:
                await asyncio.sleep(0.002)  # one put per turn: each is the end-of-turn write's
            elif i % 8 == 5:
                await asyncio.sleep(0)  # the burst over six turns: after the first, writing is paused
            if i == 77:
                reading.set()
                await asyncio.wait_for(caught_up.wait(), 10)  # the peer read the burst: the task parks
                await asyncio.sleep(0.01)
        box.close()
        await asyncio.wait_for(writer, 10)
        await ws.close()

    async with _linked(handler, max_size=None) as ws:
        got: list[bytes] = []
        while len(got) < len(want):
            await asyncio.wait_for(reading.wait(), 10)
            got.append(await asyncio.wait_for(ws.recv(), 10))
            if len(got) == 78:
                caught_up.set()
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert [len(g) for g in got] == [len(w) for w in want]
    assert got == want
    assert counted["end of turn"] + counted["task"] == len(want)
    assert counted["end of turn"] >= 60  # each small frame, put alone in its turn
    assert counted["task"] >= 1  # what the burst left behind a paused connection
