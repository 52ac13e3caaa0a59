"""Timing of failed handshakes: unknown label vs wrong secret (see scripts/bench-auth-timing)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

from websockets.asyncio.client import connect

from mind.testing.cluster import Cluster
from protocol.auth import ClientHandshake, Credential
from protocol.envelope import Channel


async def attempt(url: str, cred: Credential) -> tuple[float, float]:
    """(hello -> challenge, proof -> refusal) in microseconds: the Mind looks the label up in the
    first step and fails the proof in the second; neither may depend on whether the label exists."""
    async with connect(url, compression=None) as ws:
        ch = Channel()
        hs = ClientHandshake(cred, os.urandom(32))
        t0 = time.perf_counter()
        await ws.send(ch.stamp(hs.hello()))
        challenge = ch.receive(await ws.recv()).msg
        t1 = time.perf_counter()
        proof = hs.on_challenge(challenge)
        t2 = time.perf_counter()
        await ws.send(ch.stamp(proof))
        err = ch.receive(await ws.recv()).msg
        t3 = time.perf_counter()
        assert err.TYPE == "error" and err.code.value == "auth_failed", err
        return (t1 - t0) * 1e6, (t3 - t2) * 1e6


def summary(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"{statistics.median(xs):>9.1f} {q[0]:>9.1f} {q[-1]:>9.1f}"


async def run(url: str, n: int) -> dict[str, list[float]]:
    wrong = Credential(role="client", label="admin", secret=os.urandom(32))
    unknown = Credential(role="client", label="nobody-by-this-name", secret=os.urandom(32))
    out: dict[str, list[tuple[float, float]]] = {"wrong secret": [], "unknown label": []}
    for _ in range(20):  # warm-up
        await attempt(url, wrong)
        await attempt(url, unknown)
    for _ in range(n):
        out["wrong secret"].append(await attempt(url, wrong))
        out["unknown label"].append(await attempt(url, unknown))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cl = Cluster(Path(tmp))
        try:
            cl.start_mind("--auth-fail-limit", str(10 * (args.n + 50)))
            res = asyncio.run(run(cl.url, args.n))
        finally:
            cl.stop_all()
    print(f"{'failed handshake step (us)':<40} {'median':>9} {'p10':>9} {'p90':>9}")
    for step, name in ((0, "hello -> challenge"), (1, "proof -> refusal")):
        w = [x[step] for x in res["wrong secret"]]
        u = [x[step] for x in res["unknown label"]]
        print(f"{name + ', wrong secret':<40} {summary(w)}")
        print(f"{name + ', unknown label':<40} {summary(u)}")
        noise = abs(statistics.median(w[: len(w) // 2]) - statistics.median(w[len(w) // 2 :]))
        diff = abs(statistics.median(w) - statistics.median(u))
        print(f"  difference of medians {diff:.1f} us; noise between two halves of one kind {noise:.1f} us")


if __name__ == "__main__":
    main()
