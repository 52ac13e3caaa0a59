"""The client's backoff (mind/client/retry.py): it grows to its cap, never waits past the deadline
left, spreads clients apart (jitter), and gives up at once on refusals no retry can change."""

from __future__ import annotations

import random

from mind.client.retry import FIRST_S, LONGEST_S, Backoff, retryable
from mind.errors import ClientCode, ClientError
from protocol.codes import ErrorCode


def test_delays_double_to_the_cap_each_in_the_upper_half_of_its_step():
    b = Backoff(random.Random(1))
    step = FIRST_S
    for _ in range(12):
        d = b.next(100.0)
        assert step / 2 <= d <= step
        step = min(LONGEST_S, step * 2)
    assert step == LONGEST_S


def test_a_delay_never_outlasts_what_is_left_of_the_window():
    b = Backoff(random.Random(2))
    for _ in range(10):
        b.next(100.0)
    assert b.next(0.3) <= 0.3 and b.next(0.0) == 0.0 and b.next(-1.0) == 0.0


def test_two_clients_cut_at_once_do_not_knock_in_step():
    a, b = Backoff(random.Random(3)), Backoff(random.Random(4))
    assert [a.next(100.0) for _ in range(6)] != [b.next(100.0) for _ in range(6)]


def test_a_refused_credential_is_not_retried_a_busy_or_absent_mind_is():
    for code in (ErrorCode.AUTH_FAILED, ErrorCode.REVOKED, ClientCode.TLS, ClientCode.CONFIG):
        assert not retryable(ClientError(code, "no"))
    for code in (ClientCode.UNREACHABLE, ClientCode.CLOSED, ErrorCode.BUSY, ErrorCode.RATE_LIMITED, ErrorCode.SHUTDOWN):
        assert retryable(ClientError(code, "later"))
