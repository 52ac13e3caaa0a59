"""Run the deterministic simulation over many seeds (see scripts/sim and tests/sim/simulation.py).

    scripts/sim                      # seeds 0..2999, 300 steps each, on every CPU
    scripts/sim --seeds 20000 --start 100000
    scripts/sim --seed 1234 --trace  # replay one seed, printing every step
    scripts/sim --variant hand-before-fix --seeds 5000   # the code before a fix: finds the bug
    scripts/sim --variant continuity --seeds 1000        # resume windows, streams, both legs resuming
    scripts/sim --variant nodes --seeds 300              # two Mind nodes, their database, a lease each

Prints seeds/s, steps/s and how often each event, fault and outcome was exercised. On a failure it
prints the violated invariant and the one-line command that replays the seed exactly, and exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # this file is not the `sim` package
sys.path.insert(0, str(ROOT))  # before tests/: tests/protocol etc. must not shadow the packages
sys.path.append(str(ROOT / "tests"))

from sim.checker import InvariantViolation  # noqa: E402
from sim.simulation import World  # noqa: E402
from sim.variants import VARIANTS  # noqa: E402

CHUNK = 25


def run_chunk(job: tuple[int, int, int, str]) -> tuple[Counter[str], list[str], int]:
    """Seeds [first, first + n): (events and outcomes, failure reports, steps run)."""
    first, n, steps, variant = job
    counts: Counter[str] = Counter()
    failures: list[str] = []
    ran = 0
    for seed in range(first, first + n):
        rules = VARIANTS[variant]
        world = (rules.world or World)(seed, steps, rules=rules)
        try:
            world.run()
        except InvariantViolation as violation:
            failures.append(str(violation))
        ran += world.step_no
        counts.update(world.events)
        counts.update(world.checker.notes)
    return counts, failures, ran


def show(line: str) -> None:
    try:
        print(line)
    except BrokenPipeError:  # `scripts/sim --seed N --trace | head`
        sys.stdout = open(os.devnull, "w")
        raise SystemExit(0) from None


def replay(args: argparse.Namespace) -> int:
    lines: list[str] = []
    trace = show if args.trace else lines.append
    rules = VARIANTS[args.variant]
    world = (rules.world or World)(args.seed, args.steps, rules=rules, trace=trace)
    try:
        world.run()
    except InvariantViolation as violation:
        print(f"FAIL {violation}", file=sys.stderr)
        return 1
    if args.digest:
        print(
            "digest",
            hashlib.sha256("\n".join(lines).encode()).hexdigest(),
            "steps",
            world.step_no,
            "time",
            round(world.clock.now, 6),
        )
    else:
        print(
            f"seed {args.seed}: every invariant held over {world.step_no} steps ({world.clock.now:.1f} virtual seconds)"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3000, help="how many seeds (default 3000)")
    p.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--steps", type=int, default=300, help="scheduler steps per seed (default 300)")
    p.add_argument("--seed", type=int, help="replay this one seed")
    p.add_argument("--trace", action="store_true", help="with --seed: print every step and what it changed")
    p.add_argument("--digest", action="store_true", help="with --seed: print a digest of the whole trace")
    p.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        default="fixed",
        help="the code under test: fixed (default), or as it was before a fix",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPUs)")
    args = p.parse_args()
    if args.seed is not None:
        return replay(args)

    jobs = [
        (s, min(CHUNK, args.start + args.seeds - s), args.steps, args.variant)
        for s in range(args.start, args.start + args.seeds, CHUNK)
    ]
    t0 = time.perf_counter()
    counts: Counter[str] = Counter()
    failures: list[str] = []
    steps = 0
    if args.jobs > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            results = list(pool.imap_unordered(run_chunk, jobs))
    else:
        results = [run_chunk(job) for job in jobs]
    for c, f, n in results:
        counts.update(c)
        failures.extend(f)
        steps += n
    elapsed = time.perf_counter() - t0

    print(
        f"{args.seeds} seeds ({args.start}..{args.start + args.seeds - 1}), {args.steps} steps each, "
        f"variant {args.variant}, {args.jobs} jobs"
    )
    print(f"{elapsed:.1f} s: {args.seeds / elapsed:.0f} seeds/s, {steps / elapsed:.0f} steps/s")
    groups: dict[str, list[tuple[str, int]]] = {}
    for key, n in sorted(counts.items()):
        group = key.split(":", 1)[0] if ":" in key else "other"
        groups.setdefault(group, []).append((key, n))
    for group, items in groups.items():
        print(f"  {group:12} " + "  ".join(f"{k.split(':', 1)[-1]}={n}" for k, n in items))
    if failures:
        print(f"\n{len(failures)} seed(s) FAILED:", file=sys.stderr)
        for f in sorted(failures)[:20]:
            print(f"  {f}", file=sys.stderr)
        return 1
    print("every invariant held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
