"""The data plane's arithmetic (`protocol.streams`): offsets, half-close and credit, including what
a peer that breaks the rules gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.streams import Receiver, Relay, Sender, chunks


def test_a_sender_never_has_more_than_a_window_unacknowledged() -> None:
    s = Sender(window=100)
    assert s.credit() == 100 and s.take(60) == 0 and s.take(40) == 60
    assert s.credit() == 0
    with pytest.raises(ValueError):
        s.take(1)
    assert s.on_ack(30) and s.credit() == 30
    assert not s.on_ack(30) and not s.on_ack(10), "old or repeated acknowledgements open nothing"
    with pytest.raises(ProtocolError):
        s.on_ack(101)  # bytes never sent
    assert s.close() == 100 and s.eof
    with pytest.raises(ValueError):
        s.take(0)


def test_a_receiver_checks_order_and_window_and_batches_acks() -> None:
    r = Receiver(window=100)
    r.on_data(0, 10, False)
    with pytest.raises(ProtocolError, match="expected 10"):
        r.on_data(5, 1, False)  # an overlap
    with pytest.raises(ProtocolError, match="expected 10"):
        r.on_data(20, 1, False)  # a gap
    with pytest.raises(ProtocolError, match="window"):
        r.on_data(10, 91, False)
    r.consume(10)
    assert r.ack_due() == 10, "everything consumed: acknowledge at once"
    r.on_data(10, 90, False)
    r.consume(10)
    assert r.ack_due() is None, "a little more consumed: the ack can wait"
    r.consume(20)
    assert r.ack_due() == 40, "a quarter window: acknowledge"
    r.consume(60)
    r.on_data(100, 0, True)
    assert r.ack_due() == 100 and r.done
    with pytest.raises(ProtocolError, match="after the end"):
        r.on_data(100, 1, False)


def test_the_mind_relays_within_the_window_the_receiver_granted() -> None:
    relay = Relay(window=100)
    relay.on_data(0, 100, False)
    assert relay.in_flight == 100
    with pytest.raises(ProtocolError, match="window"):
        relay.on_data(100, 1, False)
    with pytest.raises(ProtocolError):
        relay.on_ack(101)
    assert relay.on_ack(50) and not relay.on_ack(50)
    relay.on_data(100, 50, True)
    assert relay.in_flight == 100


@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 64), st.integers(1, 500))
def test_sender_receiver_and_relay_agree_on_any_schedule(writes: list[int], chunk: int, window: int) -> None:
    """Whatever the sizes, a sender that sends only within its credit never trips the relay or
    the receiver, and everything sent is eventually acknowledged."""
    s, relay, r = Sender(window), Relay(window), Receiver(window)
    total = 0
    for n in writes:
        while n:
            k = min(n, chunk, s.credit())
            if k == 0:  # the reader catches up: consume and acknowledge everything
                r.consume(r.offset - r.consumed)
                ack = r.ack_due()
                assert ack is not None
                assert relay.on_ack(ack) and s.on_ack(ack)
                continue
            off = s.take(k)
            relay.on_data(off, k, False)
            r.on_data(off, k, False)
            n -= k
            total += k
    end = s.close()
    relay.on_data(end, 0, True)
    r.on_data(end, 0, True)
    r.consume(r.offset - r.consumed)
    ack = r.ack_due()
    if total:
        assert ack == total
    assert r.done and r.offset == total


def test_chunks_cover_the_data_in_order() -> None:
    data = bytes(range(256)) * 10
    parts = chunks(data, 1000, size=300)
    assert [o for o, _ in parts] == list(range(1000, 1000 + len(data), 300))
    assert b"".join(p for _, p in parts) == data
