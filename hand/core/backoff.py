"""Reconnect delays: exponential backoff with full jitter (DESIGN §8: reconnect forever).

Full jitter (a uniform draw in [0, ceiling]) spreads a fleet of Hands that lost the same Mind at
the same moment, so a restarted Mind is not hit by all of them at once. The ceiling grows
`base * factor**attempt` up to `cap`, and falls back to `base` after a connection that lived long
enough to count as healthy, so one blip after a week of uptime does not cost a 30 s wait.

Pure: the random source is injected and nothing sleeps, so tests check the bounds directly.
"""

from __future__ import annotations

import random

HEALTHY_AFTER_S = 10.0


class Backoff:
    def __init__(
        self,
        base: float = 0.5,
        factor: float = 2.0,
        cap: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if base <= 0 or factor < 1 or cap < base:
            raise ValueError("backoff needs base > 0, factor >= 1 and cap >= base")
        self.base = base
        self.factor = factor
        self.cap = cap
        self._rng = rng or random.Random()
        self.attempt = 0

    def ceiling(self) -> float:
        """The largest delay the next call may return."""
        # min() before the power would overflow: factor**attempt grows without bound.
        if self.attempt > 64:
            return self.cap
        return min(self.cap, self.base * self.factor**self.attempt)

    def next_delay(self) -> float:
        delay = self._rng.uniform(0, self.ceiling())
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0

    def connection_ended(self, lived_s: float | None) -> None:
        """`lived_s`: seconds from `welcome` to the drop, or None if there was no welcome."""
        if lived_s is not None and lived_s >= HEALTHY_AFTER_S:
            self.reset()
