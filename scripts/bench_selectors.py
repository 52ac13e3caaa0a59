"""Fleet selectors at scale (see scripts/bench-selectors): no processes, only the pure core."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mind.core.selector import MAX_PATTERN_ATOMS, SelectorError, parse


def hands(n: int) -> list[tuple[str, dict[str, str]]]:
    return [(f"hand{i:05d}", {"role": f"r{i % 7}", "dc": f"dc{i % 5}", "rack": str(i % 40)}) for i in range(n)]


def selectors() -> dict[str, str]:
    half = MAX_PATTERN_ATOMS // 2
    return {
        "attack3_2048_names": ",".join(f"x{i:x}" for i in range(2048))[:4096].rstrip(","),
        "names_all_hit": ",".join(f"hand{i:05d}" for i in range(0, 10_000, 25))[:4096].rstrip(","),
        "globs_max": ",".join(f"*{i}*9?" for i in range(MAX_PATTERN_ATOMS)),
        "labels_max": ",".join(f"dc=dc*+role=zz{i}*" for i in range(half)),
        "star": "*",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=10_000, help="registered Hands")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    table = hands(args.n)
    rows = {}
    for name, text in selectors().items():
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            sel = parse(text)
            matched = sel.select(table)
            best = min(best, time.perf_counter() - t0)
        rows[name] = {"ms": round(best * 1000, 2), "matched": len(matched)}
    try:
        parse(",".join(f"*{i}*" for i in range(2048))[:4096].rstrip(","))
        rows["attack3_2048_globs"] = {"refused": False}
    except SelectorError:
        rows["attack3_2048_globs"] = {"refused": True}
    worst = max(r.get("ms", 0.0) for r in rows.values())
    print(json.dumps({"hands": args.n, "selectors": rows, "worst_ms": worst, "target_ms": 50}, indent=1))


if __name__ == "__main__":
    main()
