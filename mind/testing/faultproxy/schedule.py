"""Seeded fault schedules: the same seed gives the same list of timed commands, in the
vocabulary (`mind/testing/vocabulary.py`) the simulation also speaks.

A schedule is data (a list of `Step`), so a failing run prints it, a test can assert on it, and
`Commands.play` performs it against a proxy. What a seed fixes is the sequence of faults and their
times relative to the start; what it cannot fix on real processes is how the programs interleave
with those times (docs/testing.md, "Determinism and replay").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mind.testing.vocabulary import Fault

DEFAULT_KINDS: tuple[tuple[Fault, int], ...] = (
    (Fault.LATENCY, 25),
    (Fault.CUT, 25),
    (Fault.BLACKHOLE, 15),
    (Fault.PARTITION, 10),
    (Fault.HOLD, 10),
    (Fault.BANDWIDTH, 10),
    (Fault.RESET_PEER, 5),
)


@dataclass(frozen=True)
class Step:
    at: float
    """Seconds from the start of the schedule."""
    command: str
    fault: Fault


def _pick(rng: random.Random, weighted: tuple[tuple[Fault, int], ...]) -> Fault:
    x = rng.random() * sum(w for _, w in weighted)
    for kind, w in weighted:
        x -= w
        if x < 0:
            return kind
    return weighted[-1][0]


def random_schedule(
    seed: int,
    *,
    duration: float = 10.0,
    mean_gap: float = 1.0,
    kinds: tuple[tuple[Fault, int], ...] = DEFAULT_KINDS,
) -> list[Step]:
    """Faults at random times over `duration` seconds, each healed before the next begins (a
    blackhole is resumed, a partition ends, a latency is lifted), so the link is whole at the end."""
    rng = random.Random(seed)
    steps: list[Step] = []
    t = 0.0
    while True:
        t += rng.expovariate(1 / mean_gap)
        if t >= duration:
            break
        kind = _pick(rng, kinds)
        last = min(duration, t + rng.choice((0.2, 0.5, 1.0, 2.0)))
        direction = rng.choice(("up", "down", "both"))
        if kind is Fault.LATENCY:
            ms = rng.choice((20, 100, 300, 1000))
            steps += [Step(t, f"latency {ms} {direction} jitter={ms // 4}", kind), Step(last, "latency 0", kind)]
        elif kind is Fault.BANDWIDTH:
            kib = rng.choice((1, 8, 64))
            steps += [Step(t, f"bandwidth {kib} {direction}", kind), Step(last, "bandwidth 0", kind)]
        elif kind is Fault.BLACKHOLE:
            steps += [Step(t, f"blackhole {direction}", kind), Step(last, "resume", kind)]
        elif kind is Fault.HOLD:
            what = rng.choice(("result", "accepted", "run_end", "task_update", "*"))
            steps += [Step(t, f"frame hold {what} {direction}", kind), Step(last, "clear", kind)]
        elif kind is Fault.PARTITION:
            steps.append(Step(t, f"partition {int((last - t) * 1000)}", kind))
        elif kind is Fault.RESET_PEER:
            steps.append(Step(t, f"reset_peer {rng.choice((0, 100, 500))}", kind))
        else:
            steps.append(Step(t, f"cut {rng.choice(('fin', 'rst'))}", kind))
        t = last
    return steps
