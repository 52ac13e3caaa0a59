"""A client that floods its Mind node with `stream_ack`s of its own streamed run, within its own
rate (the node waits for it, as for any client), for `seconds`: run as a process of its own
(`python -m support.ackflood URL CRED HAND SECONDS`) so the test that measures another client is
not slowed by it. Prints the frames it sent."""

from __future__ import annotations

import asyncio
import sys
import time

from websockets.exceptions import ConnectionClosed

from mind.client.credentials import load_credential
from mind.core.budgets import CLIENT_FRAMES_PER_S
from protocol.envelope import decode
from protocol.messages import Exec, StreamAck, StreamNumbers, Streams
from support.rawpeer import handshake

RATE = 0.9 * CLIENT_FRAMES_PER_S
"""Frames a second: within the client's own rate, as an honest busy client."""


async def flood(url: str, cred: str, hand: str, seconds: float) -> int:
    ws, ch = await handshake(url, load_credential(cred))
    run = Exec(hand=hand, tool="exec", args={"argv": ["sleep", "60"]}, timeout_ms=120_000, streams=Streams())
    await ws.send(ch.stamp(run, "x1"))
    async with asyncio.timeout(20):
        while True:
            env = decode(await ws.recv())
            if isinstance(env.msg, StreamNumbers):
                run_id = env.msg.run_id
                break
    ack = StreamAck(run_id=run_id, stream="stdout", offset=0)
    start = time.monotonic()
    sent, end = 0, start + seconds
    try:
        while (now := time.monotonic()) < end:
            if sent > RATE * (now - start):  # paced to stay within this client's rate at its node
                await asyncio.sleep(0.005)
                continue
            await ws.send(ch.stamp(ack, "x1"))  # (each its own seq, as the channel requires)
            sent += 1
    except ConnectionClosed:
        return -sent  # cut: said as a negative count
    await ws.close()
    return sent


if __name__ == "__main__":
    print(asyncio.run(flood(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))), flush=True)
