"""Calls through the other Mind node vs through the Hand's own node (issue 27 item 4, target
p50 <= +0.5 ms): two `mind serve --database` nodes on a PostgreSQL of the run's own
(tests/support/postgres.py), one real Hand connected to node A, one Python client on A and one on
B. The same call (`read_file` of 100 bytes, then `exec -- true`) alternates between the two clients,
so both series see the same machine at the same moments: the difference is the hop through B
(its scope check, the holder lookup in the database, the node link both ways).

A third figure: `run get` of a live run started on A, asked first through B (which did not relay
it, so it finds its node: the live nodes from the database, then `get_run` asked of each on the
link; `Router.find`) against the same ask on A, alternating. This is the price of asking instead
of recording every run's Hand in the database at admission, paid only by such a first ask.

    scripts/bench-route [-n CALLS]
"""

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

from support.postgres import remove, start_server

from mind.client.aio import MindClient, load_credential
from mind.testing.cluster import Cluster


async def measure(own: str, other: str, cred_path: Path, n: int) -> list[tuple[str, list[float], list[float]]]:
    cred = load_credential(cred_path)
    out = []
    async with await MindClient.connect(own, cred) as a, await MindClient.connect(other, cred) as b:
        for label, tool, args in (
            ("read_file 100 B", "read_file", {"path": "small.txt"}),
            ("exec -- true", "exec", {"argv": ["true"]}),
        ):
            series: dict[str, list[float]] = {"own": [], "other": []}
            for i in range(n + min(50, n)):  # the first 50 of each: warm-up, not counted
                for name, mc in (("own", a), ("other", b)):
                    t0 = time.perf_counter()
                    end = await mc.exec("box", tool, args)
                    took = (time.perf_counter() - t0) * 1000
                    assert end.state.value == "succeeded", end
                    if i >= min(50, n):
                        series[name].append(took)
            out.append((label, series["own"], series["other"]))
        own_s, found_s = [], []
        for i in range(min(n, 200) + 10):  # the first 10: warm-up, not counted
            h = await a.start("box", "exec", {"argv": ["sleep", "60"]}, stream=False)
            while h.run_id is None:  # noqa: ASYNC110 (the handle offers no admission event; ~1 ms)
                await asyncio.sleep(0.001)
            t0 = time.perf_counter()
            got = await b.get_run(h.run_id)  # B did not relay it: found on A
            t1 = time.perf_counter()
            await a.get_run(h.run_id)
            t2 = time.perf_counter()
            assert got.run_id == h.run_id and got.end is None, got
            if i >= 10:
                found_s.append((t1 - t0) * 1000)
                own_s.append((t2 - t1) * 1000)
            await a.cancel(h.run_id)
            await h.wait()
        out.append(("run get, found", own_s, found_s))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000, help="calls per figure and per node")
    args = ap.parse_args()
    server = start_server()
    try:
        dsn = server.createdb("bench_route")
        with tempfile.TemporaryDirectory() as tmp:
            nodes = []
            for name in ("a", "b"):
                (Path(tmp) / name).mkdir()
                c = Cluster(Path(tmp) / name)
                c.env["MINDHAND_DATABASE"] = dsn
                nodes.append(c)
            a, b = nodes
            try:
                a.start_mind()
                b.start_mind()
                a.add_hand("box")
                a.start_hand("box", url=a.url)
                a.wait_connected("box")
                (a.tmp / "root-box" / "small.txt").write_bytes(b"x" * 100)
                results = asyncio.run(measure(a.url, b.url, a.home / "admin.cred", args.n))
            finally:
                b.stop_all()
                a.stop_all()
    finally:
        remove(server)
    print(f"{'figure':<18} {'n':>6} {'own p50':>8} {'other p50':>10} {'+ms':>7} {'own p99':>8} {'other p99':>10}")
    for label, own, other in results:
        p50o, p50t = statistics.median(own), statistics.median(other)
        p99o = statistics.quantiles(own, n=100)[98]
        p99t = statistics.quantiles(other, n=100)[98]
        print(f"{label:<18} {len(own):>6} {p50o:>8.3f} {p50t:>10.3f} {p50t - p50o:>+7.3f} {p99o:>8.3f} {p99t:>10.3f}")


if __name__ == "__main__":
    main()
