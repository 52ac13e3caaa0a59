"""How a client waits between attempts to reach the Mind again: exponential backoff with jitter,
bounded by a deadline (the resume window the Mind announced, DESIGN §15).

Jitter matters more than the curve: when a Mind restarts, every client it had comes back at once,
and without it they would all knock again in the same millisecond, attempt after attempt. Each
delay is drawn uniformly from the upper half of the current step, so clients spread out while none
waits much longer than the step says. Pure arithmetic: the caller sleeps and reads the clock.
"""

from __future__ import annotations

import random

from mind.errors import ClientCode, ClientError
from protocol.codes import ErrorCode

FIRST_S = 0.05
"""The first step: a link that is back at once (a reset) costs about this much."""
LONGEST_S = 2.0
"""The largest step: a Mind back after a restart is seen within about this long."""

PERMANENT = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.REVOKED, ClientCode.TLS, ClientCode.CONFIG})
"""Refusals that another attempt cannot change: the credential or the Mind's identity is wrong."""


class Backoff:
    """Delays before successive attempts: FIRST_S, doubling up to LONGEST_S, each jittered."""

    __slots__ = ("_step", "_rng")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._step = FIRST_S
        self._rng = rng or random.Random()

    def next(self, remaining: float) -> float:
        """The next delay, never past `remaining` seconds (what is left of the deadline)."""
        delay = self._rng.uniform(self._step / 2, self._step)
        self._step = min(LONGEST_S, self._step * 2)
        return max(0.0, min(delay, remaining))


def retryable(exc: ClientError) -> bool:
    """Whether another attempt to connect may succeed where this one failed."""
    return exc.code not in PERMANENT
