"""mind/client/reconnect.py: the pauses between tries after a cut, and the window's bound."""

from __future__ import annotations

import pytest

from mind.client.reconnect import Backoff


def test_pauses_double_from_50ms_to_1s_without_jitter():
    b = Backoff(100.0, rand=lambda: 0.5)  # 0.5: the middle of the jitter, no change
    assert [round(b.pause(0.0), 3) for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


@pytest.mark.parametrize("r", [0.0, 0.25, 0.999])
def test_jitter_stays_within_20_percent(r):
    b = Backoff(100.0, rand=lambda: r)
    for base in (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0):
        assert base * 0.8 - 1e-9 <= b.pause(0.0) <= base * 1.2 + 1e-9


def test_no_pause_reaches_past_the_window():
    b = Backoff(10.0, rand=lambda: 0.999)
    for _ in range(6):
        b.pause(0.0)
    assert b.pause(9.7) == pytest.approx(0.3)
    assert b.pause(10.0) == 0.0
    assert b.left(10.5) < 0
