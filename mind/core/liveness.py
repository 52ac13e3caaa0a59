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

A client over its rate is not read (`mind.core.budgets`: the shell stops reading its socket until
its bucket refills), and a peer the Mind does not read is not heard: from the moment the shell
starts holding it back (`unread_since`) until a read within its rate, its bytes do not count. So a
client that keeps flooding past its rate for `DEAD_AFTER` intervals is cut, as the websockets
keepalive cut it before (its pong sat unread behind the flood); an honest burst is held back for
moments and never comes near that.

A peer that sends much (`BUSY_BYTES` since its last probe) is probed: pinged at most once an
interval, its pong must come back within `PONG_WITHIN` intervals. Its pong waits behind everything
it sent before it, so a peer whose frames the Mind processes slower than they come (a flood of
frames each costly to decode, within its byte rate) falls behind and is cut: that is what the
keepalive of both sides measured before, kept only for the peers it concerns.
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
BUSY_BYTES = 1 << 20
"""Bytes heard from a peer since its last probe that make it worth probing (a Hand's pings and
results, a client's calls stay far below it in an interval; a flood or a stream does not)."""
PONG_WITHIN = 0.75
"""Intervals a busy peer's pong may take to be read, as websockets' keepalive allowed before."""


class Verdict(Enum):
    QUIET = "quiet"
    """Heard recently enough, or already pinged and still within its time: nothing to do."""
    PING = "ping"
    PROBE = "probe"
    """Busy: ping it and time the pong."""
    DEAD = "dead"
    """Silent (or held back unread) past the bound: cut."""
    BEHIND = "behind"
    """Its pong waited behind its own frames past the bound: cut."""


def verdict(
    now: float,
    heard: float,
    pinged: float | None,
    interval: float,
    unread_since: float | None = None,
    received: int = 0,
    probe: tuple[float, bool] | None = None,
) -> Verdict:
    """What to do with a peer last heard at `heard`, pinged by us at `pinged` (None: not since it
    was last heard), held back unread since `unread_since` (None: read as it sends), that sent
    `received` bytes since its last probe, whose last probe was sent at `probe[0]` and answered
    (`probe[1]`), at `now` (one monotonic clock; `interval` > 0 in its seconds)."""
    if probe is not None and not probe[1] and now - probe[0] >= PONG_WITHIN * interval:
        return Verdict.BEHIND
    if unread_since is not None and unread_since < heard:
        heard = unread_since
    silent = now - heard
    if silent >= DEAD_AFTER * interval:
        return Verdict.DEAD
    if silent >= PING_AFTER * interval and (pinged is None or pinged < heard):
        return Verdict.PING
    if received >= BUSY_BYTES and (probe is None or (probe[1] and now - probe[0] >= interval)):
        return Verdict.PROBE
    return Verdict.QUIET
