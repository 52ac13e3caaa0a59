"""Reconciliation at scale (see scripts/bench-reconcile)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

from benchlib.reconcile import measure, seed  # shared with scripts/bench reconcile

from mind.testing.cluster import Cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=10_000, help="retained tasks on the Hand")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cl = Cluster(Path(tmp))
        try:
            cl.start_mind()
            cl.add_hand("bench")
            seed(Path(tmp) / "state-bench", args.n)
            first, rtts1, _ = measure(cl, 1, lambda: cl.start_hand("bench"))
            cl.hands["bench"].stop()
            second, rtts2, _ = measure(cl, 2, lambda: cl.start_hand("bench"))
            lag1, lag2 = max(rtts1), max(rtts2)
        finally:
            cl.stop_all()
    print(f"{'pass':<34} {'tasks':>7} {'adopted':>8} {'unchanged':>9} {'duration ms':>12} {'worst client RTT ms':>20}")
    for label, line, lag in (
        ("first (Mind knows none: adopt)", first, lag1),
        ("again (all known: unchanged)", second, lag2),
    ):
        print(
            f"{label:<34} {line['hand_tasks']:>7} {line['adopted']:>8} {line['unchanged']:>9} {line['duration_ms']:>12} {lag:>20.1f}"
        )


if __name__ == "__main__":
    main()
