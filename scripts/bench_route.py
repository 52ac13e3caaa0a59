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

Then `mind runs` (`--runs K`, default 300 runs on each node): a page of 100 through node B,
merged from both nodes' pages, against the same page of a lone SQLite Mind holding 2K runs, and
all 2K runs page after page ("own" is the lone Mind there, "other" the node of two).

    scripts/bench-route [-n CALLS]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # benchlib

from benchlib.route import SMALL, fill, measure, measure_find, measure_runs, p50, p99
from support.postgres import remove, start_server

from mind.testing.cluster import Cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000, help="calls per figure and per node")
    ap.add_argument("--runs", type=int, default=300, help="finished runs on each node for the `mind runs` figures")
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
                (a.tmp / "root-box" / "small.txt").write_bytes(SMALL)
                cred = a.home / "admin.cred"
                results = asyncio.run(measure(a.url, b.url, cred, "box", args.n))
                results += asyncio.run(measure_find(a.url, b.url, cred, "box", args.n))
                (Path(tmp) / "lone").mkdir()
                lone = Cluster(Path(tmp) / "lone")  # SQLite: one Mind, as before many
                try:
                    lone.start_mind()
                    b.add_hand("box2")
                    b.start_hand("box2", url=b.url)
                    b.wait_connected("box2")
                    lone.add_hand("box")
                    lone.start_hand("box", url=lone.url)
                    lone.wait_connected("box")
                    # a client of its own: only its runs are listed (the admin's are all the others)
                    lone_cred, lister = lone.client_credential("lister"), a.client_credential("lister")
                    for url, via, hand, k in (
                        (a.url, lister, "box", args.runs),
                        (b.url, lister, "box2", args.runs),
                        (lone.url, lone_cred, "box", 2 * args.runs),
                    ):
                        asyncio.run(fill(url, via, hand, k))
                    results += asyncio.run(measure_runs(lone.url, lone_cred, b.url, lister, 2 * args.runs, args.n))
                finally:
                    lone.stop_all()
            finally:
                b.stop_all()
                a.stop_all()
    finally:
        remove(server)
    print(f"{'figure':<18} {'n':>6} {'own p50':>8} {'other p50':>10} {'+ms':>7} {'own p99':>8} {'other p99':>10}")
    for label, own, other in results:
        p50o, p50t = p50(own), p50(other)
        p99o, p99t = p99(own), p99(other)
        print(f"{label:<18} {len(own):>6} {p50o:>8.3f} {p50t:>10.3f} {p50t - p50o:>+7.3f} {p99o:>8.3f} {p99t:>10.3f}")


if __name__ == "__main__":
    main()
