"""`mind.core.liveness`: the Mind pings only the silent and gives up the dead within two intervals."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mind.core.liveness import DEAD_AFTER, PING_AFTER, SWEEP, Verdict, verdict


def test_the_verdicts_at_their_edges():
    assert verdict(10.0, 9.0, None, 1.0) is Verdict.QUIET
    assert verdict(10.0 + PING_AFTER + 1e-9, 10.0, None, 1.0) is Verdict.PING
    assert verdict(10.0 + PING_AFTER - 0.01, 10.0, None, 1.0) is Verdict.QUIET
    assert verdict(10.0 + PING_AFTER, 10.0, 10.0 + PING_AFTER, 1.0) is Verdict.QUIET  # pinged once per silence
    assert verdict(10.0 + DEAD_AFTER + 1e-9, 10.0, 11.2, 1.0) is Verdict.DEAD
    assert verdict(20.0, 19.5, 19.0, 1.0) is Verdict.QUIET  # heard since the ping: its pong, or anything


def sweep(heard_at: list[float], answers: bool, interval: float, until: float) -> tuple[list[float], float | None]:
    """The shell's loop for one peer: sweeps every SWEEP intervals from 0; the peer is heard at
    `heard_at` (the first: its welcome; 0 if none) and, if it `answers`, right after each ping. Returns (ping times, time cut or None)."""
    pending = sorted(heard_at)
    heard, pinged, pings = (pending[0] if pending else 0.0), None, []
    t = 0.0
    while t <= until:
        t += SWEEP * interval
        while pending and pending[0] <= t:
            heard = max(heard, pending.pop(0))
        v = verdict(t, heard, pinged, interval)
        if v is Verdict.DEAD:
            return pings, t
        if v is Verdict.PING:
            pinged = t
            pings.append(t)
            if answers:
                pending.append(t + 0.01 * interval)
                pending.sort()
    return pings, None


@given(st.floats(0.1, 60.0), st.lists(st.floats(0.0, 0.999), min_size=0, max_size=5))
def test_a_peer_heard_every_interval_is_never_pinged_nor_cut(interval, jitters):
    # its own pings every interval (each up to a tenth late), for 20 intervals
    times = [(k + 1 + 0.099 * (jitters[k % len(jitters)] if jitters else 0)) * interval for k in range(20)]
    pings, cut = sweep(times, answers=False, interval=interval, until=19 * interval)
    assert pings == [] and cut is None


@given(st.floats(0.1, 60.0), st.floats(0.0, 10.0))
def test_a_silent_peer_that_answers_is_kept_and_a_dead_one_is_cut_within_two_intervals(interval, last):
    pings, cut = sweep([last * interval], answers=True, interval=interval, until=(last + 10) * interval)
    assert cut is None and len(pings) >= 5
    pings, cut = sweep([last * interval], answers=False, interval=interval, until=(last + 10) * interval)
    assert cut is not None and len(pings) == 1
    assert DEAD_AFTER * interval <= cut - last * interval <= 2 * interval


def test_a_peer_held_back_unread_is_not_heard_until_it_is_read_again():
    # held back since 10.0: its bytes since do not count, it is cut 1.75 intervals after
    assert verdict(11.7, 11.69, None, 1.0, unread_since=10.0) is Verdict.PING
    assert verdict(11.76, 11.75, 11.2, 1.0, unread_since=10.0) is Verdict.DEAD
    # read again within its rate (unread_since None): heard as ever
    assert verdict(11.76, 11.75, None, 1.0, unread_since=None) is Verdict.QUIET
    # held back only after it was last heard: its silence counts from when it was heard
    assert verdict(12.0, 10.0, None, 1.0, unread_since=11.0) is Verdict.DEAD


def test_a_busy_peer_is_probed_once_an_interval_and_cut_when_its_pong_falls_behind():
    from mind.core.liveness import BUSY_BYTES, PONG_WITHIN

    # heard just now, but much: probe it
    assert verdict(10.0, 9.99, None, 1.0, received=BUSY_BYTES) is Verdict.PROBE
    assert verdict(10.0, 9.99, None, 1.0, received=BUSY_BYTES - 1) is Verdict.QUIET
    # probe outstanding: nothing more until its time is up, then cut as behind
    assert verdict(10.5, 10.49, None, 1.0, received=BUSY_BYTES, probe=(10.0, False)) is Verdict.QUIET
    assert verdict(10.0 + PONG_WITHIN + 1e-9, 10.7, None, 1.0, probe=(10.0, False)) is Verdict.BEHIND
    # answered: the next probe waits an interval
    assert verdict(10.9, 10.89, None, 1.0, received=BUSY_BYTES, probe=(10.0, True)) is Verdict.QUIET
    assert verdict(11.0, 10.99, None, 1.0, received=BUSY_BYTES, probe=(10.0, True)) is Verdict.PROBE
