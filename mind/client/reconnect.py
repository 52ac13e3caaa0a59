"""How a client comes back after a cut (DESIGN §15): the pause before each new try, and the bound.

Both client shells reconnect by the same rule, so it is written once: the first try comes almost at
once (a reset link is usually back at once), then the pause doubles up to a cap, each one moved by
a random +-20 % so that many clients cut by one blink do not all knock again in the same instant.
Every try stays inside the Mind's resume window counted from the cut: past it the Mind has applied
the seed's rule (the run is cancelled) and trying again cannot change that.

Pure: no clock, no sleep. The caller passes the times and its random source, and sleeps itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable

FIRST_S = 0.05
CAP_S = 1.0
JITTER = 0.2


class Backoff:
    """The pauses between tries: `FIRST_S` doubling to `CAP_S`, each +-`JITTER`, never past the
    deadline (the cut plus the resume window)."""

    __slots__ = ("_next", "cap", "deadline", "jitter", "rand")

    def __init__(
        self,
        deadline: float,
        *,
        first: float = FIRST_S,
        cap: float = CAP_S,
        jitter: float = JITTER,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.deadline = deadline
        self.cap = cap
        self.jitter = jitter
        self.rand = rand
        self._next = first

    def left(self, now: float) -> float:
        """Seconds until the window ends (<= 0: give up)."""
        return self.deadline - now

    def pause(self, now: float) -> float:
        """How long to wait before the next try (0 once the deadline is reached)."""
        base = self._next
        self._next = min(self.cap, self._next * 2)
        wait = base * (1 + self.jitter * (2 * self.rand() - 1))
        return max(0.0, min(wait, self.deadline - now))
