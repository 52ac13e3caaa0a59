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


@pytest.mark.parametrize("kind", ["over_rate", "costly"])
async def test_a_flooding_client_is_cut_and_another_is_still_served(tmp_path, kind):
    """Two floods, each cut within the keepalive's bounds while an honest client is served:
    `over_rate`, 1 MiB frames cheap to decode, past the client's byte rate: held back unread
    (`mind.core.budgets`), and a client held back is not heard; `costly`, 1 MiB frames of a million
    empty lists, each ~0.15 s to decode, within the byte rate: the Mind falls behind it, and its
    pong (it is busy: probed) waits behind them. Before, websockets' keepalive cut both because
    their pongs sat unread behind the flood."""
    import msgpack
    from support.rawpeer import handshake
    from websockets.exceptions import ConnectionClosed

    from mind.client.aio import MindClient, load_credential
    from protocol import PROTOCOL_VERSION

    with running(tmp_path, "box", mind_args=("--resume-window", "0")) as cl:
        (cl.tmp / "root-box" / "small.txt").write_bytes(b"x" * 100)
        path = tmp_path / "flood.cred"
        assert cl.cli("client", "add", "flooder", "--tools", "read_file", "--out", str(path)).returncode == 0
        ws, ch = await handshake(cl.url, load_credential(path))
        n = (limits.CLIENT_MAX_FRAME_BYTES - 256) // 10
        pad: object = "x" * (limits.CLIENT_MAX_FRAME_BYTES - 512) if kind == "over_rate" else [[[]] * n] * 10
        sent = 0

        async def flood() -> None:
            nonlocal sent
            seq = 2
            try:
                while True:
                    seq += 1
                    args = {"path": "small.txt", "pad": pad}
                    p = {"hand": "box", "tool": "read_file", "args": args, "timeout_ms": 1000}
                    env = {"v": PROTOCOL_VERSION, "t": "exec", "id": f"f{seq}", "seq": seq, "gen": ch.gen, "p": p}
                    await ws.send(msgpack.packb(env, use_bin_type=True))
                    sent += 1
            except ConnectionClosed:
                pass

        async def drain() -> None:
            try:
                async for _ in ws:
                    pass
            except ConnectionClosed:
                pass

        mark = len(cl.mind.events()) if cl.mind else 0
        flooding = asyncio.create_task(flood())
        reading = asyncio.create_task(drain())
        t0 = time.monotonic()
        async with await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred")) as mc:
            while not flooding.done() and time.monotonic() - t0 < 15:
                end = await mc.exec("box", "read_file", {"path": "small.txt"})
                assert end.state.value == "succeeded"  # served while the other floods
                await asyncio.sleep(0.05)
        assert flooding.done(), "the flooder was never cut"
        took = time.monotonic() - t0
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        assert sent > (16 if kind == "over_rate" else 2)  # it did flood (past its 16 MiB burst)
        assert cl.mind is not None
        # held back past its rate, or behind its own frames (its pong waits behind the flood either
        # way: whichever bound it reaches first)
        cut = [e for e in cl.mind.events(mark) if e.get("event") in ("peer_over_rate_too_long", "peer_behind")]
        assert cut, [str(e) for e in cl.mind.events(mark) if e.get("level") != "info"][:3]
        assert took < 10
