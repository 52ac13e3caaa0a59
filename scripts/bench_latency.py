"""Baseline latency figures for later work to beat (see scripts/bench-latency). `scripts/bench latency exec`
measures the same against a reference (benchlib)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

from benchlib.core import pct  # scripts/bench covers this and more, against a reference

from mind.client.aio import MindClient, load_credential
from mind.testing.cluster import Cluster


async def measure(url: str, cred_path: Path, n: int) -> list[tuple[str, list[float]]]:
    cred = load_credential(cred_path)
    out = []
    async with await MindClient.connect(url, cred) as mc:
        cases = [
            ("read_file 100 B", "read_file", {"path": "small.txt"}),
            ("exec -- true", "exec", {"argv": ["true"]}),
        ]
        for label, tool, args in cases:
            for _ in range(min(50, n)):  # warm-up
                await mc.call("bench", tool, args)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                end = await mc.exec("bench", tool, args)
                times.append((time.perf_counter() - t0) * 1000)
                assert end.state.value == "succeeded", end
            out.append((label, times))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=1000, help="calls per figure")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cl = Cluster(Path(tmp))
        try:
            cl.start_mind()
            cl.start_hand("bench")
            cl.wait_connected("bench")
            (Path(tmp) / "root-bench" / "small.txt").write_bytes(b"x" * 100)
            results = asyncio.run(measure(cl.url, cl.home / "admin.cred", args.n))
        finally:
            cl.stop_all()
    print(f"{'figure':<18} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'min':>7} {'max':>7} {'mean':>7}")
    for label, xs in results:
        print(
            f"{label:<18} {len(xs):>6} {statistics.median(xs):>8.3f} {pct(xs, 99):>8.3f} "
            f"{min(xs):>7.3f} {max(xs):>7.3f} {statistics.fmean(xs):>7.3f}"
        )


if __name__ == "__main__":
    main()
