"""When the Mind pings a connected peer, and when it gives one up (DESIGN §3, keepalive). Pure: the
shell (`mind.daemon.keepalive`) feeds it times and does what it says.

Every Hand pings its Mind (its own `--ping-interval`, 10 s by default, as the Mind's), and the
Mind used to ping every Hand too, so that each silent interval cost two ping/pong exchanges where
one proves the same thing: the bytes arrive. Measured on the `nodes` benchmark, 10,000 idle Hands
cost each node 16 % of a core and the simulator as much again, half of it the Mind's own pings.

So the Mind only listens: anything heard from a peer (a frame, the Hand's ping, a pong) counts.
A peer silent for `PING_AFTER` intervals (one that does not ping, or a Hand configured with a
longer interval than the Mind) gets one ping, which any live peer answers; a peer silent for
`DEAD_AFTER` intervals is given up: its connection is cut, as a failed websockets keepalive cut
it before. The bound is unchanged: a dead peer is noticed within two intervals (`DEAD_AFTER` plus
one sweep, `SWEEP`).
"""

from __future__ import annotations

from enum import Enum

PING_AFTER = 1.1
"""Silence, in intervals, after which the Mind pings: past the Hand's own next ping (it pings every
interval; the 10 % is its scheduling and the network's jitter), so a pinging Hand is never pinged."""
DEAD_AFTER = 1.75
"""Silence, in intervals, after which the peer is dead: its courtesy ping had 0.65 of an interval."""
SWEEP = 0.1
"""How often the shell asks, in intervals: the detection bound is `DEAD_AFTER + SWEEP` < 2."""


class Verdict(Enum):
    QUIET = "quiet"
    """Heard recently enough, or already pinged and still within its time: nothing to do."""
    PING = "ping"
    DEAD = "dead"


def verdict(now: float, heard: float, pinged: float | None, interval: float) -> Verdict:
    """What to do with a peer last heard at `heard`, pinged by us at `pinged` (None: not since it
    was last heard), at `now` (one monotonic clock; `interval` > 0 in its seconds)."""
    silent = now - heard
    if silent >= DEAD_AFTER * interval:
        return Verdict.DEAD
    if silent >= PING_AFTER * interval and (pinged is None or pinged < heard):
        return Verdict.PING
    return Verdict.QUIET
