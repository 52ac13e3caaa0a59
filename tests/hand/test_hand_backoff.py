import random

import pytest

from hand.core.backoff import Backoff


def test_ceiling_grows_exponentially_then_caps():
    b = Backoff(base=0.5, factor=2, cap=30, rng=random.Random(1))
    ceilings = []
    for _ in range(10):
        ceilings.append(b.ceiling())
        b.next_delay()
    assert ceilings == [0.5, 1, 2, 4, 8, 16, 30, 30, 30, 30]


def test_delays_are_full_jitter_within_bounds():
    b = Backoff(base=0.5, cap=8, rng=random.Random(7))
    delays = []
    for _ in range(200):
        ceiling = b.ceiling()
        d = b.next_delay()
        assert 0 <= d <= ceiling
        delays.append(d)
    assert max(delays) <= 8
    assert len({round(d, 6) for d in delays}) > 150  # jittered, not a fixed schedule
    tail = delays[10:]
    assert min(tail) < 2 and max(tail) > 6  # spread over the whole [0, cap] range


def test_reset_and_healthy_connection_reset():
    b = Backoff(base=0.5, cap=30, rng=random.Random(3))
    for _ in range(5):
        b.next_delay()
    assert b.ceiling() == 16
    b.connection_ended(None)  # never welcomed: keep growing
    assert b.ceiling() == 16
    b.connection_ended(3.0)  # a short-lived connection does not count as healthy
    assert b.ceiling() == 16
    b.connection_ended(10.0)
    assert b.ceiling() == 0.5
    b.next_delay()
    b.reset()
    assert b.attempt == 0


def test_huge_attempt_counts_do_not_overflow():
    b = Backoff(cap=30)
    b.attempt = 10_000
    assert b.ceiling() == 30
    assert 0 <= b.next_delay() <= 30


def test_bad_parameters():
    with pytest.raises(ValueError):
        Backoff(base=0)
    with pytest.raises(ValueError):
        Backoff(base=1, cap=0.5)
