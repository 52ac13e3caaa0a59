"""A Hand's word after a restart of the Mind (DESIGN §15), attacked with real processes: a Hand
credential presents made-up runs "owned" by a client it names. Before, the restarted Mind adopted
them and counted them against that client's stream budget: the victim's every `mind exec` was
refused `quota_exceeded` (125) while the fake Hand stayed, and one message of 10,000 runs taken any
number of times grew the Mind by hundreds of MiB. Now a run is adopted only with the seal of what a
Mind of this database sent to that Hand, and a Hand presents once per welcome."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from websockets.asyncio.client import connect

from mind.client.aio import load_credential
from mind.testing.cluster import running, wait_until
from protocol.auth import ClientHandshake
from protocol.envelope import Channel
from protocol.messages import HandClaims, PresentedRun, RunsPresent, Streams

pytestmark = pytest.mark.slow  # a real Mind (restarted), a real Hand, a fake hostile one, the CLI

WINDOW = ("--resume-window", "30")
FAKE_RUNS = 10_000


async def hostile_hand(url: str, cred, victim: str, times: int) -> object:
    """Authenticates as its own Hand, then presents `FAKE_RUNS` made-up streamed runs owned by
    `victim`, `times` times over, as a compromised Hand would."""
    ws = await connect(url, compression=None, max_size=None)
    ch = Channel()
    hs = ClientHandshake(
        cred, os.urandom(32), HandClaims(hostname="evil", platform="p", machine="m", python="3", version="0")
    )
    await ws.send(ch.stamp(hs.hello()))
    await ws.send(ch.stamp(hs.on_challenge(ch.receive(await ws.recv()).msg)))
    ch.gen = hs.on_welcome(ch.receive(await ws.recv()).msg)
    for t in range(times):
        runs = [
            PresentedRun(
                run_id=f"rfake{t}x{i}",
                started=True,
                owner=victim,
                tool="exec",
                remaining_ms=86_400_000,
                spec=Streams(window=64 << 20),
                args_digest="0" * 64,
                timeout_ms=86_400_000,
                seal="0" * 32,  # a guess: no Hand can make the Mind's seal
                sealed_at=time.time(),
            )
            for i in range(FAKE_RUNS)
        ]
        await ws.send(ch.stamp(RunsPresent(runs=runs)))
    return ws


@pytest.mark.alone  # 30,000 presented runs against keepalives of 1 s
async def test_made_up_runs_of_another_client_are_never_adopted_and_the_victim_runs_on(tmp_path):
    with running(tmp_path, "box", mind_args=WINDOW) as cl:
        cl.client_credential("victim")
        evil = load_credential(cl.add_hand("evil"))
        # a run goes on over the restart: this life may leave runs, so the next one adopts for a window
        keep = cl.cli("exec", "--detach", "box", "--", "sleep", "60")
        assert keep.returncode == 0, keep.stderr
        port = cl.port
        cl.mind.signal(signal.SIGKILL)
        cl.mind.p.wait(timeout=20)
        cl.start_mind(*WINDOW, port=port)
        ws = await hostile_hand(cl.url, evil, "victim", times=3)
        try:

            def refused() -> list[dict]:
                return [
                    e
                    for e in cl.mind.events()
                    if e.get("event") in ("hand_presented_unsealed", "runs_present_repeated")
                ]

            await asyncio.to_thread(wait_until, lambda: len(refused()) >= 3, 30, "the presentations refused")
            first, *repeats = refused()
            assert first["event"] == "hand_presented_unsealed" and first["hand"] == "evil", first
            assert first["refused"] == FAKE_RUNS and "seal" in first["why"], first  # one line, every run counted
            assert [e["event"] for e in repeats] == ["runs_present_repeated"] * 2  # not even read again
            # the victim is not held back: its exec runs (it was `quota_exceeded`, 125)
            victim = str(cl.client_credential("victim"))
            r = await asyncio.to_thread(cl.cli, "exec", "--credential", victim, "box", "--", "echo", "mine")
            assert r.returncode == 0 and r.stdout == b"mine\n", r.stderr
            runs = json.loads((await asyncio.to_thread(cl.cli, "runs", "--json")).stdout)
            rows = runs if isinstance(runs, list) else runs.get("runs", [])
            assert not [row for row in rows if row.get("hand") == "evil"], rows
        finally:
            await ws.close()
