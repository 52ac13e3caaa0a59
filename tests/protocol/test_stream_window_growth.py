"""A window the receiver changes as the stream goes (`protocol.streams`: `WindowTuner`, the limit
every party keeps): a far link's stream grows its window until the link, not the window, bounds
it; a slow reader shrinks it again; and no chunk a sender sent within what it was granted is ever
refused, whatever the order in which the parties hear of a change."""

from __future__ import annotations

import heapq
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import limits
from protocol.errors import ProtocolError
from protocol.streams import HOLD_WINDOWS, Incoming, Outgoing, Relay, WindowTuner

MIB = 1 << 20
W = limits.STREAM_WINDOW
CHUNK = limits.STREAM_CHUNK_MAX


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _rounds(rounds: int, rtt: float, bandwidth: float, backlog: int = 0) -> list[int]:
    """A sender that always has data, over a link of round trip `rtt` (s) and `bandwidth` (B/s)
    with a deep buffer before it: each round it sends its whole credit, a chunk arriving a round
    trip after the acknowledgement it heard plus the time the bytes before it took at `bandwidth`;
    the receiver's reader takes each chunk as it comes, except the last `backlog` bytes before the newest; it acknowledges, and the sender hears the new window. The
    windows the sender had, round by round."""
    clock = Clock()
    out, rx = Outgoing(W), Incoming(W, tuner=WindowTuner(clock, W))
    relay = Relay(W)
    windows = []
    for _ in range(rounds):
        heard, sent = clock.now, 0  # the sender hears the acknowledgement and sends its credit
        while (n := min(out.credit(), CHUNK)) > 0:
            ((offset, data, eof),) = out.send(b"x" * n)
            sent += n
            clock.now = heard + rtt + sent / bandwidth  # when this chunk arrives
            assert relay.on_data(offset, len(data), eof)
            rx.consume(max(0, offset - backlog - rx.consumed))  # taken before this chunk came
            assert rx.on_data(offset, len(data), eof)
        rx.consume(max(0, rx.offset - backlog - rx.consumed))
        ack = rx.ack_due()
        assert ack is not None
        window = rx.changed_window()
        relay.on_ack(ack, window)
        out.on_ack(ack, window)
        windows.append(out.window)
    return windows


def test_a_far_links_window_doubles_while_each_doubling_pays_up_to_the_ceiling() -> None:
    """50 ms away, bandwidth to spare: 2 MiB a round trip is 40 MiB/s; each doubling doubles it."""
    windows = _rounds(30, rtt=0.05, bandwidth=1e12)
    assert max(windows) == limits.STREAM_WINDOW_GROWN_MAX
    assert windows[-1] == limits.STREAM_WINDOW_GROWN_MAX, "it stays there while it pays"
    grown = [w for i, w in enumerate(windows[1:]) if w > windows[i]]
    assert grown == [4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB], "one doubling at a time"


def test_where_the_bandwidth_is_the_bound_the_window_tries_once_and_comes_back() -> None:
    """4 MB/s with a deep buffer (a slow uplink): a larger window only queues more ahead of
    everything else on the connection. It is tried once, found to buy nothing, and given up."""
    windows = _rounds(40, rtt=0.05, bandwidth=4e6)
    assert max(windows) == 2 * W, "never past one doubling"
    tries = [i for i in range(1, len(windows)) if windows[i] > windows[i - 1]]
    assert len(tries) == 2 and tries[1] - tries[0] >= HOLD_WINDOWS, "tried again only after the hold"
    assert windows.count(2 * W) <= 8, "and most of the time at the opening's window"


def test_a_reader_that_falls_behind_does_not_grow_the_window() -> None:
    assert set(_rounds(12, rtt=0.05, bandwidth=1e12, backlog=W // 2)) == {W}


def test_a_stall_with_the_reader_behind_halves_the_window_never_below_the_opening() -> None:
    t = WindowTuner(Clock(), floor=W, ceiling=32 * MIB)
    t.stalled(6 * MIB)  # three quarters of the window not yet written out by our reader
    assert t.next_window(8 * MIB) == 4 * MIB
    t.stalled(3 * MIB)
    assert t.next_window(4 * MIB) == W
    t.stalled(W)
    assert t.next_window(W) == W, "the opening's window is the floor"
    t.stalled(W * 3 // 8)  # between a quarter and a half: neither
    assert t.next_window(W) == W


def _link(seconds: float, rtt: float, rate: Callable[[float], float]) -> list[int]:
    """A stream as the shells drive it, one event at a time: a sender that always has data sends
    `CHUNK`s within its credit, which leave at `rate(t)` (B/s: the machine's or the link's) and arrive
    half a round trip later; the receiver takes each at once and acknowledges a quarter window at
    a time (`Receiver.ack_due`), each acknowledgement reaching the sender half a round trip later.
    The windows the sender had, one per acknowledgement it heard, over `seconds`."""
    clock = Clock()
    out, rx = Outgoing(W), Incoming(W, tuner=WindowTuner(clock, W))
    events: list[tuple[float, int, str, int, int | None]] = []  # (when, order, what, offset, window)
    order, free, windows = 0, 0.0, []

    def send() -> None:
        nonlocal order, free
        while (n := min(out.credit(), CHUNK)) > 0:
            ((offset, data, eof),) = out.send(b"x" * n)
            start = max(free, clock.now)
            free = start + n / rate(start)
            order += 1
            heapq.heappush(events, (free + rtt / 2, order, "data", offset, len(data)))

    send()
    while events and clock.now < seconds:
        clock.now, _, what, offset, value = heapq.heappop(events)
        if what == "data":
            assert value is not None
            assert rx.on_data(offset, value, False)
            rx.consume(value)
            ack = rx.ack_due()
            if ack is not None:
                order += 1
                heapq.heappush(events, (clock.now + rtt / 2, order, "ack", ack, rx.changed_window()))
        else:
            out.on_ack(offset, value)
            windows.append(out.window)
            send()
    return windows


def _noisy(t: float) -> float:
    """Loopback as a real machine moves it: 200 MiB/s on average, 30 % faster or slower by turns
    every 20 ms (a page cache writeback, a thread's wakeup, another process's turn)."""
    return 200 * MIB * (1.3 if int(t / 0.02) % 2 else 0.7)


def test_on_loopback_noise_does_not_pass_for_a_gain() -> None:
    """A rate measured over one window (10 ms here) rode the noise: a faster stretch under a
    doubled window kept it, and the next doubling too (to 16 MiB on this machine's loopback, every
    byte of it waiting in the Mind). Measured over `MEASURE_MIN_S`, against `GROWTH_GAIN`, a
    doubling is tried and given up."""
    windows = _link(4.0, rtt=0.001, rate=_noisy)
    assert len(windows) > 100 and max(windows) <= 2 * W
    assert windows.count(W) >= 0.75 * len(windows), "most of the time at the opening's window"


def test_fifty_milliseconds_away_the_window_grows_to_what_the_link_needs() -> None:
    """40 MiB/s at the opening's window is the window's bound, not the link's: it grows until the
    rate (here the 300 MiB/s the machine moves) times the round trip is within it."""
    windows = _link(6.0, rtt=0.05, rate=lambda t: 300 * MIB)
    assert max(windows) >= 16 * MIB, "15 MiB in flight at 300 MiB/s"


def test_a_chunk_sent_under_a_larger_window_is_not_refused_after_a_smaller_one() -> None:
    """The receiver shrinks from 8 MiB to 4 MiB while the sender, not having heard, fills what it
    was granted: relay and receiver accept those bytes (the limit never moves back), and after
    the shrink the sender may only send as the limit moves on."""
    out, rx, relay = Outgoing(8 * MIB), Incoming(8 * MIB), Relay(8 * MIB)
    for offset, data, eof in out.send(b"x" * (8 * MIB)):
        relay.on_data(offset, len(data), eof)
        rx.on_data(offset, len(data), eof)
    rx.consume(2 * MIB)
    assert rx.ack_due() == 2 * MIB
    relay.on_ack(2 * MIB, 4 * MIB)  # the new window: the limit stays at 8 MiB (2 + 4 < 8)
    out.on_ack(2 * MIB, 4 * MIB)
    assert out.credit() == 0, "the old limit stands; nothing more until it is passed"
    assert out.granted == 6 * MIB and relay.limit == 8 * MIB
    relay.on_ack(6 * MIB, 4 * MIB)
    out.on_ack(6 * MIB, 4 * MIB)
    assert out.credit() == 2 * MIB and relay.limit == 10 * MIB
    more = out.send(b"y" * (2 * MIB))
    for offset, data, eof in more:
        relay.on_data(offset, len(data), eof)
    with pytest.raises(ProtocolError, match="window"):
        relay.on_data(10 * MIB, 1, False)


def test_a_relay_adopting_a_stream_relays_within_the_window_its_sender_presents() -> None:
    """A restarted Mind rebuilds the relay from the Hand's presentation: with the grown window it
    states, the bytes the Hand sent (and may still send) under it pass."""
    relay = Relay(W)
    relay.take_up(offset=10 * MIB, consumed=4 * MIB, window=16 * MIB)
    assert relay.limit == 20 * MIB
    relay.on_data(10 * MIB, 10 * MIB, False)
    with pytest.raises(ProtocolError, match="window"):
        relay.on_data(20 * MIB, 1, False)


def test_a_window_outside_the_protocols_bounds_is_refused() -> None:
    relay = Relay(W)
    relay.on_data(0, 10, False)
    with pytest.raises(ProtocolError, match="window"):
        relay.on_ack(10, limits.STREAM_WINDOW_MAX + 1)
    with pytest.raises(ProtocolError, match="window"):
        Outgoing(W).on_ack(0, limits.STREAM_WINDOW_MIN - 1)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["send", "consume", "ack", "deliver_ack"]),
            st.integers(1, 4 * MIB),
            st.sampled_from([None, 64 << 10, W, 4 * MIB, 16 * MIB]),
        ),
        max_size=60,
    )
)
def test_any_schedule_of_window_changes_never_trips_an_honest_sender(
    steps: list[tuple[str, int, int | None]],
) -> None:
    """The receiver changes its window at random; its acknowledgements reach the relay at once and
    the sender later, in order. A sender within its credit is never refused by the relay or the
    receiver, and what is in flight never exceeds the largest window granted so far."""
    out, rx, relay = Outgoing(W), Incoming(W), Relay(W)
    pending: list[tuple[int, int | None]] = []  # acknowledgements the relay passed, not yet at the sender
    largest = W
    for op, n, window in steps:
        if op == "send":
            k = min(n, out.credit())
            for offset, data, eof in out.send(b"z" * k, CHUNK) if k else []:
                assert relay.on_data(offset, len(data), eof)
                assert rx.on_data(offset, len(data), eof)
        elif op == "consume":
            rx.consume(min(n, rx.offset - rx.consumed))
        elif op == "ack":
            if rx.consumed > rx.receiver.acked or window is not None:
                rx.receiver.acked = rx.consumed
                if window is not None:
                    rx.receiver.window = window
                    largest = max(largest, window)
                rx.receiver.limit = max(rx.receiver.limit, rx.consumed + rx.receiver.window)
                relay.on_ack(rx.consumed, window)
                pending.append((rx.consumed, window))
        elif pending:
            offset, w = pending.pop(0)
            out.on_ack(offset, w)
        assert relay.in_flight <= largest and out.kept <= largest
        assert relay.limit >= out.sender.limit, "the relay never grants less than the sender was told"
