"""What one client may cost the Mind (mind/core/budgets.py): rates are waited for, stream bytes in
flight and outboxes are bounded (issue 23, must-hold 2)."""

from __future__ import annotations

import pytest

from mind.core.budgets import (
    OUTBOX_FRAME_OVERHEAD,
    STREAM_BUDGET_BYTES,
    ClientRates,
    OutboxBound,
    TokenBucket,
    stream_budget_problem,
    stream_windows,
    window_problem,
)
from protocol import limits


def test_a_bucket_lets_a_burst_through_then_says_how_long_to_wait():
    b = TokenBucket(rate=10.0, burst=5.0, now=0.0)
    assert [b.take(1, 0.0) for _ in range(5)] == [0.0] * 5
    assert b.take(1, 0.0) == pytest.approx(0.1), "one token owed at 10/s"
    assert b.take(1, 0.0) == pytest.approx(0.2), "debts add up: a flood waits longer and longer"
    assert b.take(0, 10.0) == 0.0, "refilled after a pause, never above the burst"
    assert [b.take(1, 10.0) for _ in range(5)] == [0.0] * 5
    assert b.take(1, 10.0) > 0


def test_a_clients_connections_share_one_rate_and_it_is_forgotten_with_the_last():
    rates = ClientRates()
    a = rates.join("ci", 0.0)
    b = rates.join("ci", 0.0)
    assert a is b and len(rates) == 1
    assert rates.join("other", 0.0) is not a
    rates.leave("ci")
    assert len(rates) == 2
    rates.leave("ci")
    rates.leave("ci")  # harmless
    assert len(rates) == 1


def test_a_flood_of_large_requests_is_waited_for_by_its_bytes_but_stream_bytes_only_by_frames():
    rate = ClientRates().join("ci", 0.0)
    waits = [rate.take(1 << 20, 0.0) for _ in range(200)]
    assert waits[0] == 0.0 and waits[-1] > 0.0
    assert waits == sorted(waits)
    upload = ClientRates().join("up", 0.0)
    assert all(upload.take(64 << 10, i / 3000, stream=True) == 0.0 for i in range(3000)), "200 MB/s of chunks"


def test_a_streamed_run_holds_a_window_per_stream_it_relays():
    w = limits.STREAM_WINDOW
    assert stream_windows(stdin=False, pty=False) == 2 * w
    assert stream_windows(stdin=True, pty=False) == 3 * w
    assert stream_windows(stdin=True, pty=True) == w


def test_stream_budget():
    assert stream_budget_problem(0, 1 << 20) is None
    assert stream_budget_problem(STREAM_BUDGET_BYTES - (1 << 20), 1 << 20) is None
    problem = stream_budget_problem(STREAM_BUDGET_BYTES, 1 << 20)
    assert problem is not None and "budget" in problem


def test_an_outbox_over_its_bound_says_close_and_sent_bytes_are_given_back():
    ob = OutboxBound(limit=10_000)
    assert ob.add(5000)
    assert ob.add(4000)
    assert not ob.add(2000), "past the bound: the peer does not read"
    ob.sent(5000)
    ob.sent(4000)
    ob.sent(2000)
    assert ob.queued == 0
    ob.sent(1)
    assert ob.queued == 0
    assert ob.add(10_000 - OUTBOX_FRAME_OVERHEAD)


def test_an_outbox_remembers_the_most_it_ever_queued():
    """What the Mind gives back to the system when the connection goes (issue 23 attack 4)."""
    ob = OutboxBound(limit=1 << 20)
    ob.add(300_000)
    ob.add(300_000)
    ob.sent(300_000)
    ob.add(100)
    assert ob.peak == 600_000 + 2 * OUTBOX_FRAME_OVERHEAD
    assert ob.queued < ob.peak


def test_a_streamed_run_is_counted_at_the_window_it_asked():
    big = 32 << 20
    assert stream_windows(stdin=False, pty=False, window=big) == 2 * big
    assert stream_windows(stdin=True, pty=False, window=big) == 3 * big
    # the budget admits four such runs where it admits 64 at the default window
    assert stream_budget_problem(3 * 2 * big, 2 * big) is None
    assert stream_budget_problem(4 * 2 * big, 2 * big) is not None


def test_a_window_over_the_minds_cap_is_refused_with_the_cap_named():
    assert window_problem(32 << 20) is None
    why = window_problem(64 << 20)
    assert why is not None and "64 MiB" in why and "32 MiB" in why


def test_only_a_node_link_on_a_shared_database_goes_unrated():
    from mind.core.budgets import relays_for_clients
    from mind.core.nodes import NODE_LABEL

    assert relays_for_clients(NODE_LABEL, shared=True)
    assert not relays_for_clients(NODE_LABEL, shared=False)  # one Mind: no node may relay to it
    assert not relays_for_clients("ci-bot", shared=True)


def test_a_forward_run_holds_its_stdout_and_stdin_only_and_an_ended_stream_holds_nothing():
    """A tunnelled connection (`forward`) has no stderr: it is counted at two windows, so 100
    connections of one client fit its budget (issue 37); a stream that ended with every byte
    acknowledged holds nothing in the Mind any more."""
    from mind.core.budgets import stream_windows
    from protocol.streams import Relay

    assert stream_windows(True, False, 512 << 10, "forward") == 2 * (512 << 10)
    assert stream_windows(True, False, 512 << 10, "exec") == 3 * (512 << 10)
    relay = Relay(1 << 20)
    assert relay.holds == 1 << 20
    relay.on_data(0, 0, True)  # stderr of a forward run: ended at once, nothing sent
    assert relay.holds == 0
    busy = Relay(1 << 20)
    busy.on_data(0, 1000, True)  # ended, but 1,000 bytes not acknowledged yet
    assert busy.holds == 1 << 20
