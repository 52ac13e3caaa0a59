"""The Mind's keepalive (`mind.core.liveness`): it listens, and pings only the silent. A Hand that
pings is never pinged back (one exchange per interval, not two: half the idle cost of 10,000
Hands); a peer that does not ping is pinged and kept; a frozen Hand is given up within two
intervals. Real `mind serve` and `hand` processes, and a peer of our own that counts the pings it
is sent."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.frames import Opcode

from mind.testing.cluster import Cluster, running, wait_until
from protocol import limits
from protocol.auth import ClientHandshake, Credential
from protocol.envelope import Channel
from protocol.messages import HandClaims, TaskInventory, TaskInventoryPage

pytestmark = pytest.mark.slow  # a real Mind (and Hand)

INTERVAL = 1.0  # the Cluster's `--ping-interval`


class Counting(ClientConnection):
    """A client connection that counts the pings the Mind sends it (websockets answers them)."""

    pings = 0

    def process_event(self, event) -> None:  # type: ignore[no-untyped-def]
        if getattr(event, "opcode", None) is Opcode.PING:  # (the first event is the HTTP response)
            self.pings += 1
        super().process_event(event)


async def as_hand(cl: Cluster, name: str, ping_interval: float | None) -> tuple[Counting, asyncio.Task[None]]:
    """`name` welcomed as a Hand over a connection of our own that pings every `ping_interval`
    (None: never), answering the Mind's task inventory (an empty page) as a Hand would."""
    cred = Credential.parse((cl.tmp / f"{name}.cred").read_text().strip())
    ws = await connect(
        cl.url, create_connection=Counting, compression=None, ping_interval=ping_interval, ping_timeout=None
    )
    assert isinstance(ws, Counting)
    ch = Channel()
    hs = ClientHandshake(
        cred,
        os.urandom(limits.NONCE_BYTES),
        HandClaims(hostname="k", platform="p", machine="m", python="3", version="0"),
    )
    await ws.send(ch.stamp(hs.hello()))
    await ws.send(ch.stamp(hs.on_challenge(ch.receive(await ws.recv()).msg)))
    ch.gen = hs.on_welcome(ch.receive(await ws.recv()).msg)

    async def serve() -> None:
        async for data in ws:
            env = ch.receive(data)
            if isinstance(env.msg, TaskInventory):
                await ws.send(ch.stamp(TaskInventoryPage(tasks=[]), env.id))

    return ws, asyncio.create_task(serve())


def connected(cl: Cluster, name: str) -> bool:
    info = cl.hand_info(name)
    return bool(info and info.get("connected"))


async def test_a_hand_that_pings_is_not_pinged_and_a_silent_peer_is_pinged_and_kept(tmp_path):
    with running(tmp_path, None, mind_args=("--resume-window", "0")) as cl:
        cl.add_hand("pinger")
        cl.add_hand("quiet")
        pinger, t1 = await as_hand(cl, "pinger", INTERVAL)
        quiet, t2 = await as_hand(cl, "quiet", None)
        try:
            await asyncio.sleep(6 * INTERVAL)
            assert not pinger.state.name == "CLOSED" and not quiet.state.name == "CLOSED"
            assert await asyncio.to_thread(connected, cl, "pinger")
            assert await asyncio.to_thread(connected, cl, "quiet")
            # Every byte the pinger sends (its pings) proves it alive: the Mind sends it nothing.
            assert pinger.pings == 0
            # The quiet one is pinged after 1.1 intervals of silence, each pong resets the silence:
            # about one ping per 1.1 intervals, and it stays.
            assert quiet.pings >= 3
        finally:
            t1.cancel()
            t2.cancel()
            await pinger.close()
            await quiet.close()


def test_a_frozen_hand_is_given_up_within_two_intervals(tmp_path):
    with running(tmp_path, "box", mind_args=("--resume-window", "0")) as cl:
        hand = cl.hands["box"]
        mark = len(cl.mind.events()) if cl.mind else 0
        hand.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            wait_until(lambda: not connected(cl, "box"), 10, "the frozen Hand given up")
            took = time.monotonic() - t0
        finally:
            hand.signal(signal.SIGCONT)
        assert cl.mind is not None
        silent = [e for e in cl.mind.events(mark) if e.get("event") == "peer_silent"]
        assert silent and silent[0]["silent_s"] >= 1.75 * INTERVAL
        assert took < 2 * INTERVAL + 1.5  # the bound, plus this test's polling of `mind hands`
