"""The `reader` figure (issue 40 item 2): CPU per byte of reading WebSocket frames, our reader
(`protocol.io.framereader`) against websockets' own in the same run, each fed the same bytes in the
same 256 KiB chunks (what asyncio's socket transport reads at once) through a connection with a
real transport. Frames of 16, 64 and 256 KiB, masked (what a server reads: the Mind) and not (what
a client reads). No process and no socket traffic: only the parse, the unmasking and the hand-over
to the connection's queue, which is the part a reader of our own can change. Each chunk is copied
once on its way in, standing for the socket read's own copy: into a fresh `bytes` for websockets
(what `recv` gives it), into the room ours offers for ours (a `BufferedProtocol`: `recv_into`).

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from benchlib.core import Ctx, Row, med, verdict
from benchlib.figures import figure

CHUNK = 256 << 10
SIZES_KIB = (16, 64, 256)


async def _ns_per_byte(cls: type, server: bool, frame_kib: int, total: int) -> float:
    from websockets.frames import Frame, Opcode
    from websockets.protocol import CLIENT, SERVER, Protocol, State

    loop = asyncio.get_running_loop()
    mine, theirs = socket.socketpair()
    proto = Protocol(SERVER if server else CLIENT, state=State.OPEN, max_size=8 << 20)
    conn = cls(proto, ping_interval=None, close_timeout=None, max_queue=None)
    transport, _ = await loop.connect_accepted_socket(lambda: conn, mine)
    try:
        one = Frame(Opcode.BINARY, os.urandom(frame_kib << 10)).serialize(mask=server)
        wire = one * max(1, (4 << 20) // len(one))
        chunks = [wire[i : i + CHUNK] for i in range(0, len(wire), CHUNK)]
        queue = conn.recv_messages.frames.queue
        buffered = isinstance(conn, asyncio.BufferedProtocol)
        got = 0
        t0 = time.process_time()
        while got < total:
            for chunk in chunks:
                # ours copies a given chunk into the room it offers (as `recv_into` would fill it)
                conn.data_received(chunk if buffered else memoryview(chunk).tobytes())
            while queue:
                got += len(queue.popleft().data)
        return (time.process_time() - t0) * 1e9 / got
    finally:
        transport.abort()
        theirs.close()


@figure("reader", "CPU ns/byte of reading frames: our frame reader against websockets' own, same bytes, same chunks")
def fig_reader(ctx: Ctx) -> list[Row]:
    from websockets.asyncio.connection import Connection

    from protocol.io.framereader import FrameReader

    class Ours(FrameReader, Connection):
        pass

    total = (64 << 20) if ctx.quick else (512 << 20)
    rows: list[Row] = []
    for server in (True, False):
        for kib in SIZES_KIB:
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(ctx.rounds):
                theirs.append(asyncio.run(_ns_per_byte(Connection, server, kib, total)))
                ours.append(asyncio.run(_ns_per_byte(Ours, server, kib, total)))
            o, t = med(ours), med(theirs)
            side = "masked (a server reads)" if server else "unmasked (a client reads)"
            rows.append(
                Row(
                    "reader",
                    f"CPU ns/byte reading {kib} KiB frames, {side}",
                    f"{o:.2f}",
                    "",
                    f"{min(ours):.2f}-{max(ours):.2f}",
                    f"websockets {t:.2f}",
                    f"{o / t:.2f}x",
                    "<= websockets' (1.10x: noise)",
                    verdict(o <= t * 1.10),
                )
            )
    return rows
