"""Continuity of one stream (DESIGN §15): the sender keeps what the receiver has not acknowledged,
at most a window, and on resume resends exactly what the receiver lacks. Unit rows, then a
property: any schedule of sends, acknowledgements, cuts of either leg (a cut discards everything in
flight on that leg) and resumes delivers every byte once, in order, through the Mind's relay."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from protocol import limits
from protocol.errors import ProtocolError
from protocol.messages import StreamPosition, Streams, Welcome
from protocol.streams import Incoming, Outgoing, Relay, check_window


def data(start: int, n: int) -> bytes:
    """The stream's bytes at [start, start + n): a pattern whose every byte depends on its offset,
    so a byte out of place cannot pass for the right one."""
    return bytes((i * 7 + i // 251) & 0xFF for i in range(start, start + n))


def test_the_sender_keeps_what_is_unacknowledged_and_lets_it_go_on_ack() -> None:
    out = Outgoing(window=100)
    sent = out.send(data(0, 60), size=25)
    assert [(o, len(d)) for o, d, _ in sent] == [(0, 25), (25, 25), (50, 10)]
    assert out.kept == 60 and out.credit() == 40
    assert out.on_ack(30) and out.kept == 30, "a partial chunk is trimmed: kept == sent - acked"
    assert not out.on_ack(30) and not out.on_ack(10)
    assert out.resume(30) == [(30, data(30, 20), False), (50, data(50, 10), False)]
    with pytest.raises(ValueError):
        out.send(data(60, 71))  # more than the credit (100 - (60 - 30))


def test_resume_returns_exactly_the_missing_bytes_and_the_end() -> None:
    out = Outgoing(window=100)
    out.send(data(0, 40), size=10)
    out.close()
    assert out.resume(20, consumed=15) == [(20, data(20, 10), False), (30, data(30, 10), False), (40, b"", True)]
    assert out.acked == 15 and out.kept == 25, "the resume carried the lost acknowledgement"
    assert out.resume(40) == [(40, b"", True)], "all bytes there: only the end again"


def test_resume_refuses_an_offset_the_receiver_cannot_have() -> None:
    out = Outgoing(window=100)
    out.send(data(0, 50))
    out.on_ack(20)
    with pytest.raises(ProtocolError, match="resume from offset 10"):
        out.resume(10)  # below what it acknowledged
    with pytest.raises(ProtocolError, match="resume from offset 51"):
        out.resume(51)  # past what was sent
    with pytest.raises(ProtocolError, match="consumed offset 40"):
        out.resume(30, consumed=40)
    relay = Relay(window=100)
    relay.on_data(0, 50, False)
    relay.on_ack(20)
    with pytest.raises(ProtocolError):
        relay.resume(19)
    with pytest.raises(ProtocolError):
        relay.resume(51)


def test_a_receiver_resumes_from_what_it_holds_and_drops_repeats() -> None:
    inc = Incoming(window=100)
    assert inc.on_data(0, 30, False)
    inc.consume(10)
    assert inc.resume_point() == (30, 10)
    assert inc.ack_due() is None, "the resume carried the acknowledgement"
    assert not inc.on_data(20, 10, False), "a chunk sent before the resume and sent again"
    assert inc.on_data(30, 5, False)
    with pytest.raises(ProtocolError):
        inc.on_data(30, 10, False)  # an overlap (part old, part new) is still a broken sender
    assert inc.on_data(35, 0, True) and not inc.on_data(35, 0, True), "the end again is dropped"


def test_a_new_consumer_starts_where_the_acknowledgement_left_it() -> None:
    inc = Incoming(window=100, start=4096)
    assert inc.resume_point() == (4096, 4096)
    assert inc.on_data(4096, 10, False)


def test_the_relay_rewinds_to_the_returning_receiver_and_drops_old_repeats() -> None:
    relay = Relay(window=100)
    assert relay.on_data(0, 10, False) and relay.on_data(10, 10, False)
    relay.resume(10, consumed=5)
    assert relay.offset == 10 and relay.acked == 5
    assert relay.on_data(10, 10, False), "in flight before the resume, and the next bytes: forwarded"
    assert not relay.on_data(10, 10, False), "the same chunk resent: dropped"
    assert relay.on_data(20, 0, True)
    relay.expect_resend()  # the sender came back, the receiver's leg held: nothing rewinds
    assert relay.offset == 20 and relay.eof
    assert not relay.on_data(10, 10, False) and not relay.on_data(20, 0, True), "repeats, the end too"


def test_a_window_is_checked_within_the_bounds() -> None:
    assert check_window(limits.STREAM_WINDOW) == limits.STREAM_WINDOW
    for bad in (0, limits.STREAM_WINDOW_MIN - 1, limits.STREAM_WINDOW_MAX + 1):
        with pytest.raises(ProtocolError, match="stream window"):
            check_window(bad)


# --- the property --------------------------------------------------------------------------------

OPS = (
    "write",
    "close",
    "deliver_down1",
    "deliver_down2",
    "deliver_up1",
    "deliver_up2",
    "consume",
    "ack",
    "cut1",
    "cut2",
    "heal1",
    "heal2",
)


class World:
    """A sender (the Hand) -> leg 1 -> the Mind's relay -> leg 2 -> a receiver (the client), and
    the rules of the shells that will drive them: a leg that is cut loses what it carried; while
    the receiver's leg is away the relay takes no chunk (nobody to forward to); the returning
    receiver says its resume point, the relay rewinds to it and tells the sender; a returning
    sender is told the relay's position when the receiver's leg is up (else the receiver's return
    will tell it)."""

    def __init__(self, window: int, chunk: int) -> None:
        self.window = window
        self.chunk = chunk
        self.tx = Outgoing(window)
        self.relay = Relay(window)
        self.rx = Incoming(window)
        self.down1: deque[Any] = deque()
        self.up1: deque[Any] = deque()
        self.down2: deque[Any] = deque()
        self.up2: deque[Any] = deque()
        self.up = [True, True, True]  # legs 1 and 2
        self.got = bytearray()
        self.issued = 0
        """Resumes told to the sender, numbered; a chunk carries the number of the last one the
        sender had taken when it sent the chunk."""
        self.epoch = 0
        self.refused = 0
        self.dropped = 0

    def send(self, chunks: list[tuple[int, bytes, bool]]) -> None:
        if self.up[1]:  # else lost with the leg: the sender keeps them and resends on resume
            self.down1.extend((o, d, e, self.epoch) for o, d, e in chunks)

    def tell_sender(self, offset: int, consumed: int) -> None:
        self.issued += 1
        self.up1.append(("resume", offset, (consumed, self.issued)))

    def check(self) -> None:
        assert self.tx.kept == self.tx.offset - self.tx.acked <= self.window, "memory bounded by the window"
        assert bytes(self.got) == data(0, len(self.got)), "in order, nothing lost or repeated"
        assert self.relay.offset - self.relay.acked <= self.window

    def step(self, op: str, n: int) -> None:
        if op == "write" and not self.tx.eof:
            k = min(n, self.tx.credit())
            if k:
                self.send(self.tx.send(data(self.tx.offset, k), size=self.chunk))
        elif op == "close" and not self.tx.eof:
            self.send([self.tx.close()])
        elif op == "deliver_down1" and self.down1:
            offset, chunk, eof, epoch = self.down1.popleft()
            if not self.up[2]:
                return  # the receiver is away: the Mind has nobody to forward to
            try:
                forward = self.relay.on_data(offset, len(chunk), eof)
            except ProtocolError:
                # only a chunk sent before the sender took the latest resume may be refused
                assert epoch < self.issued, "a chunk sent after the resume was refused"
                self.refused += 1
                return
            if forward:
                self.down2.append((offset, chunk, eof))
            else:
                self.dropped += 1
        elif op == "deliver_down2" and self.down2:
            offset, chunk, eof = self.down2.popleft()
            if self.rx.on_data(offset, len(chunk), eof):
                self.got += chunk
        elif op == "consume":
            self.rx.consume(min(n, self.rx.offset - self.rx.consumed))
        elif op == "ack" and self.up[2]:
            ack = self.rx.ack_due()
            if ack is not None:
                self.up2.append(("ack", ack))
        elif op == "deliver_up2" and self.up2:
            _, ack = self.up2.popleft()
            if self.relay.on_ack(ack) and self.up[1]:
                self.up1.append(("ack", ack, None))
        elif op == "deliver_up1" and self.up1:
            kind, offset, consumed = self.up1.popleft()
            if kind == "ack":
                self.tx.on_ack(offset)
            else:
                consumed, self.epoch = consumed
                self.send(self.tx.resume(offset, consumed))
        elif op in ("cut1", "cut2"):
            leg = int(op[-1])
            self.up[leg] = False
            for q in (self.down1, self.up1) if leg == 1 else (self.down2, self.up2):
                q.clear()
        elif op == "heal2" and not self.up[2]:
            self.up[2] = True
            offset, consumed = self.rx.resume_point()
            self.relay.resume(offset, consumed)
            if self.up[1]:
                self.tell_sender(offset, consumed)
        elif op == "heal1" and not self.up[1]:
            self.up[1] = True
            if self.up[2]:
                self.relay.expect_resend()
                self.tell_sender(self.relay.offset, self.relay.acked)
        self.check()

    def settle(self) -> None:
        """Heal both legs, close the stream, and run everything to the end."""
        self.step("heal2", 0)
        self.step("heal1", 0)
        for _ in range(100_000):
            if self.rx.done and self.tx.eof:
                return
            progressed = False
            for q, op in ((self.up1, "deliver_up1"), (self.down1, "deliver_down1"), (self.down2, "deliver_down2")):
                if q:
                    self.step(op, 0)
                    progressed = True
            self.step("consume", 1 << 30)
            self.step("ack", 0)
            while self.up2:
                self.step("deliver_up2", 0)
            if not progressed and not self.tx.eof:
                self.step("close", 0)
        raise AssertionError("the stream never completed")


@given(
    st.integers(4, 400),
    st.integers(1, 64),
    st.lists(st.tuples(st.sampled_from(OPS), st.integers(1, 500)), max_size=120),
)
def test_any_schedule_of_cuts_and_resumes_delivers_every_byte_once_in_order(
    window: int, chunk: int, ops: list[tuple[str, int]]
) -> None:
    w = World(window, chunk)
    for op, n in ops:
        w.step(op, n)
    w.settle()
    assert bytes(w.got) == data(0, w.tx.offset), "0 bytes lost, 0 duplicated"
    assert w.rx.done and w.rx.offset == w.tx.offset


def test_chunks_in_flight_across_a_rewind_are_refused_or_dropped_and_resent_once() -> None:
    """The receiver's leg is cut after the relay forwarded 20 bytes it never got; the relay rewinds
    to 0 while the sender's later chunks are still on their way: they are refused (a gap), the
    sender resends from 0, and the bytes arrive once."""
    w = World(window=100, chunk=10)
    w.step("write", 40)
    w.step("deliver_down1", 0)
    w.step("deliver_down1", 0)
    w.step("cut2", 0)
    w.step("heal2", 0)  # the receiver has nothing: the relay rewinds to 0 and tells the sender
    w.step("deliver_down1", 0)  # offset 20, sent before the resume: refused
    w.step("deliver_up1", 0)  # the sender resends 0..40
    w.settle()
    assert w.refused >= 1 and bytes(w.got) == data(0, 40)


def test_chunks_in_flight_that_fit_the_rewind_pass_and_their_resent_copies_drop() -> None:
    w = World(window=100, chunk=10)
    w.step("write", 30)
    w.step("deliver_down1", 0)
    w.step("deliver_down2", 0)  # the receiver holds 0..10
    w.step("cut2", 0)
    w.step("heal2", 0)  # resume from 10: the relay is there already
    w.step("deliver_down1", 0)  # 10..20, sent before the resume: exactly the next bytes
    w.step("deliver_down1", 0)
    w.step("deliver_up1", 0)  # the sender resends 10..30
    w.settle()
    assert w.dropped == 2 and w.refused == 0 and bytes(w.got) == data(0, 30)


def test_a_returning_sender_resends_from_what_the_relay_forwarded() -> None:
    w = World(window=100, chunk=10)
    w.step("write", 30)
    w.step("deliver_down1", 0)
    w.step("cut1", 0)  # chunks at 10 and 20 are lost with the sender's leg
    w.step("heal1", 0)  # the receiver's leg held: resend from what the relay forwarded (10)
    w.step("deliver_up1", 0)
    w.settle()
    assert bytes(w.got) == data(0, 30) and w.refused == 0


def test_the_window_is_a_field_of_the_opening_and_the_new_fields_are_optional() -> None:
    assert Streams().window == limits.STREAM_WINDOW, "a peer that says nothing gets today's window"
    assert Streams(window=limits.STREAM_WINDOW_MIN).window == limits.STREAM_WINDOW_MIN
    for bad in (limits.STREAM_WINDOW_MIN - 1, limits.STREAM_WINDOW_MAX + 1):
        with pytest.raises(ValidationError):
            Streams(window=bad)
    welcome = Welcome(gen=1, mac=b"m" * 32, ping_interval_s=10.0)
    assert welcome.resume_window_s == 0.0, "no window announced: no continuity"
    with pytest.raises(ValidationError):
        StreamPosition(stream="stdout", offset=5, consumed=6)  # consumed what it does not have
