"""The data plane's rules (DESIGN §11), pure: byte offsets, half-close and credit-based flow control.

A stream carries one direction of a run's bytes: `stdin` (client -> Hand), `stdout` and `stderr`
(Hand -> client), or `pty` (Hand -> client, a terminal run's one output stream). Unlike progress
it is never dropped: every chunk names its byte `offset`, chunks arrive in order and contiguous,
and `eof` closes the direction (a command reading stdin sees end of input).

Flow control is end to end. The final receiver acknowledges the offset it has *consumed* (written
to its file descriptor, or to the child's pipe); the sender never has more than `window` bytes
beyond the last acknowledgement. The Mind, which relays both ways, checks the same arithmetic
(`Relay`), so it holds at most one window per stream whatever the stream's size or the reader's
speed: a slow reader slows the producer (the Hand stops reading the child's pipe; the child blocks
on write, exactly as over ssh), and nothing is dropped to keep up.

These classes only count; the shells move the bytes. A peer that breaks the rules (a gap, an
overlap, more than a window, an acknowledgement of bytes never sent) gets a `ProtocolError`.

Continuity (DESIGN §15) adds the one per-stream endpoint every shell drives: `Outgoing` keeps what
it sent until the receiver acknowledges it (at most the window, so memory stays bounded), and
`Incoming` says where to resume after a cut (`resume_point`). On resume the sender resends exactly
the bytes the receiver does not have, from the offsets alone: 0 bytes lost, 0 duplicated, whatever
the cut. The window is a field of the stream's opening (`Streams.window`), checked by
`check_window`, not a constant every peer assumes.

The receiver may change the window as the stream goes (`stream_ack`'s `window`): a far link needs
more bytes in flight than a near one (the bandwidth-delay product), and a slow reader needs fewer.
Every party keeps the *limit*, the offset the sender may send up to: `acked + window` as of the
newest acknowledgement, and never lower than a limit already granted (TCP's rule: a window shrinks
by the limit moving on more slowly, never by moving back), so a chunk sent under a larger window
is never refused after a smaller one. `WindowTuner` is the receiver's rule for choosing it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError

WINDOW = limits.STREAM_WINDOW
CHUNK = limits.STREAM_CHUNK_MAX


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_PAYLOAD, message)


def check_window(window: int) -> int:
    """A window a stream's opening asks for, within what every peer agrees to hold."""
    if not limits.STREAM_WINDOW_MIN <= window <= limits.STREAM_WINDOW_MAX:
        raise _bad(
            f"a stream window of {window} bytes is outside [{limits.STREAM_WINDOW_MIN}, {limits.STREAM_WINDOW_MAX}]"
        )
    return window


def check_resume(acked: int, sent: int, offset: int, consumed: int | None) -> None:
    """A receiver's resume point as its sender (or the relay) sees it: the receiver cannot have
    less than it acknowledged, nor more than was sent; it cannot have consumed what it lacks."""
    if not acked <= offset <= sent:
        raise _bad(f"resume from offset {offset} of a stream acknowledged up to {acked} and sent up to {sent}")
    if consumed is not None and consumed > offset:
        raise _bad(f"consumed offset {consumed} beyond the resume offset {offset}")


def replayed(expected: int, ended: bool, offset: int, size: int, eof: bool) -> bool:
    """A chunk that repeats bytes already received: after a resume the sender resends from the
    receiver's offset, and chunks it sent before it heard of the resume may still arrive. They
    carry the same bytes at the same offsets (the sender keeps its chunks as it cut them), so the
    first copy counts and the repeat is dropped, never delivered twice."""
    return offset + size <= expected and (size > 0 or eof) and (ended or not eof)


def check_chunk(expected: int, limit: int, ended: bool, offset: int, size: int, eof: bool) -> tuple[int, bool]:
    """One chunk as a receiver or a relay sees it: in order, contiguous, within the limit granted
    (see the module docstring), not after the end. Returns the new (offset, eof)."""
    if ended:
        raise _bad("data after the end of the stream")
    if offset != expected:
        raise _bad(f"chunk at offset {offset}, expected {expected}")
    if expected + size > limit:
        raise _bad(f"the sender exceeded its window: bytes up to {expected + size}, granted up to {limit}")
    return expected + size, eof


GRANTS_KEPT = 16
"""How many recent limits a receiver remembers: acknowledgements go out a quarter window apart, so
the sender has heard one of the last few when it runs out of credit."""


GROWTH_GAIN = 1.25
"""A larger window is kept only if it delivered at least this much more per second than the one
before: on a far link a doubled window nearly doubles the rate; where the link's bandwidth (or the
machine) is the bound, it buys nothing but a longer queue."""
HOLD_WINDOWS = 16
"""After a growth that bought nothing, this many windows of bytes pass before the next try."""
MEASURE_MIN_S = 0.05
"""A window's rate is measured over one window of bytes and at least this long: on loopback a
window passes in 10 ms, and a rate over 10 ms is mostly noise (a page cache writeback, a thread's
wakeup), which with a gain of 1.1 doubled the window by luck, twice running. On a far link a window
takes a round trip anyway."""


class WindowTuner:
    """The receiver's choice of window as a stream goes: more bytes in flight while the window is
    what holds the stream back, fewer while the reader is, and no more than pays.

    The sign that the window holds the stream back needs no clock: a chunk that ends exactly at a
    limit we granted lately means the sender stopped there, its credit used up, and waits for our
    acknowledgement (`stalled`; we acknowledge a quarter window at a time, so it may have heard any
    of our last few limits by then, and a chunk of a command's own output rarely ends on one by
    chance). If our reader had taken nearly everything before that chunk came (within a quarter
    window), the bytes were waiting on the link, not on us. But a link whose bandwidth is the bound,
    with a deep buffer before it, looks the same, and there a larger window only queues more bytes
    ahead of everything else on the connection (its keepalives too). So the tuner measures: under
    each window, over one window of its bytes (after one window sent under the one before), the
    rate (`clock`, seconds). The window doubles if the rate under it was at least `GROWTH_GAIN`
    times the rate under the one before (or it is the first measured); if not, the growth bought nothing, and the window goes back to half, to try
    again only after `HOLD_WINDOWS` windows of bytes. A rate is measured over at least
    `MEASURE_MIN_S`, so noise does not pass for a gain. On a far link that climbs by doubling until
    the machine, not the window, is the bound; on loopback or a slow link it probes once and comes
    back. If our reader was behind (over half a window unconsumed), a larger window would only hold
    more bytes in the Mind: it halves, never below the opening's. `ceiling` bounds it (the Mind
    also lowers what it forwards to what the client's stream budget allows)."""

    __slots__ = ("_bytes", "_clock", "_hold", "_rate", "_received", "_since", "_skip", "_stall", "ceiling", "floor")

    def __init__(
        self, clock: Callable[[], float], floor: int = WINDOW, ceiling: int = limits.STREAM_WINDOW_GROWN_MAX
    ) -> None:
        self._clock = clock
        self.floor = floor
        self.ceiling = max(floor, ceiling)
        self._stall: int | None = None
        """The smallest unconsumed backlog at a stall since the last acknowledgement."""
        self._since: float | None = None
        """When the measurement of the current window began (None: not measuring)."""
        self._skip: int | None = None
        """Bytes still to come before the measurement begins (a window just changed: the bytes
        already in flight were sent under the old one); None: no measurement is due."""
        self._bytes = 0
        """Bytes received since `_since`."""
        self._rate: float | None = None
        """Bytes per second under the window before the current one (None: nothing to beat)."""
        self._received = 0
        self._hold = 0
        """No growth is tried before `_received` reaches this."""

    def received(self, n: int) -> None:
        """`n` more bytes arrived."""
        self._received += n
        if self._since is not None:
            self._bytes += n
        elif self._skip is not None:
            self._skip -= n
            if self._skip <= 0:
                self._since, self._bytes, self._skip = self._clock(), 0, None

    def stalled(self, backlog: int) -> None:
        """The sender reached the limit; `backlog`: the bytes received before its last chunk and
        not yet consumed when that chunk came."""
        self._stall = backlog if self._stall is None else min(self._stall, backlog)

    def _measure_after(self, skip: int) -> None:
        """Measure the window from `skip` bytes on (0: from now)."""
        self._since, self._bytes, self._skip = None, 0, skip
        if skip <= 0:
            self._since, self._skip = self._clock(), None

    def next_window(self, window: int) -> int:
        """The window to grant with the acknowledgement being made now."""
        stall, self._stall = self._stall, None
        if stall is None or window // 4 < stall <= window // 2:
            return window
        if stall > window // 2:  # our reader is behind: fewer bytes in flight do as well
            self._rate = None
            self._measure_after(window)
            return max(self.floor, window // 2)
        if self._since is None:
            if self._skip is None:  # the first sign: measure this window
                self._measure_after(0)
            return window
        elapsed = self._clock() - self._since
        if self._bytes < window or elapsed < MEASURE_MIN_S:
            return window
        rate = self._bytes / elapsed
        if self._rate is not None and rate < self._rate * GROWTH_GAIN:  # the last growth bought nothing
            self._rate = None
            self._hold = self._received + HOLD_WINDOWS * window
            self._measure_after(window)
            return max(self.floor, window // 2)
        if window >= self.ceiling or self._received < self._hold:
            self._rate = None  # measured afresh when growth is tried again
            self._measure_after(0)
            return window
        self._rate = rate
        self._measure_after(window)  # what is in flight now was sent under the old window
        return min(self.ceiling, window * 2)


class Sender:
    """The sending side of one stream: what has been sent, what the receiver has consumed."""

    __slots__ = ("acked", "eof", "limit", "offset", "window")

    def __init__(self, window: int = WINDOW) -> None:
        self.offset = 0
        """The offset of the next byte to send (= bytes sent)."""
        self.acked = 0
        """What the receiver says it has consumed."""
        self.window = window
        self.limit = window
        """The offset the receiver lets us send up to (module docstring)."""
        self.eof = False

    def credit(self) -> int:
        """How many more bytes may be sent now."""
        return max(0, self.limit - self.offset)

    def take(self, n: int) -> int:
        """Record `n` bytes about to be sent (at most the credit); returns their offset."""
        if self.eof:
            raise ValueError("the stream is closed")
        if n > self.credit():
            raise ValueError(f"{n} bytes exceed the credit of {self.credit()}")
        start = self.offset
        self.offset += n
        return start

    def close(self) -> int:
        """The end of the stream; returns its final offset (the eof chunk's)."""
        self.eof = True
        return self.offset

    def on_ack(self, offset: int, window: int | None = None) -> bool:
        """The receiver consumed everything before `offset` (and now grants `window`, if it says).
        True if that opened credit."""
        if offset > self.offset:
            raise _bad(f"acknowledged offset {offset} of a stream sent up to {self.offset}")
        if window is not None:
            self.window = check_window(window)
        self.acked = max(self.acked, offset)  # an old or repeated acknowledgement moves nothing back
        limit = max(self.limit, self.acked + self.window)
        opened, self.limit = limit > self.limit, limit
        return opened

    @property
    def drained(self) -> bool:
        """Everything sent has been consumed."""
        return self.acked >= self.offset


class Receiver:
    """The receiving side of one stream: checks each chunk and decides when to acknowledge.

    Acknowledgements are batched: one per quarter window consumed, and one when everything is
    consumed (so a sender waiting on its last bytes is never left hanging)."""

    __slots__ = ("_grants", "acked", "announced", "consumed", "eof", "limit", "offset", "tuner", "window")

    def __init__(self, window: int = WINDOW, tuner: WindowTuner | None = None) -> None:
        self.offset = 0
        """The offset the next chunk must have (= bytes received)."""
        self.consumed = 0
        self.acked = 0
        self.window = window
        self.announced = window
        """The window the sender was last told (the opening's, or the newest acknowledgement's)."""
        self.limit = window
        self.eof = False
        self.tuner = tuner
        """Chooses the window as the stream goes (None: the opening's, for the stream's life)."""
        self._grants: deque[int] = deque([window], maxlen=GRANTS_KEPT)
        """The limits granted lately: the sender stops at one of them when its credit runs out."""

    def start_at(self, offset: int) -> None:
        """A consumer that takes the stream up at `offset` (its predecessor consumed the rest)."""
        self.offset = self.consumed = self.acked = offset
        self.limit = max(self.limit, offset + self.window)
        self._grants.append(self.limit)

    def on_data(self, offset: int, size: int, eof: bool) -> None:
        self.offset, self.eof = check_chunk(self.offset, self.limit, self.eof, offset, size, eof)
        if self.tuner is not None and size:
            self.tuner.received(size)
            if self.offset in self._grants:
                self.tuner.stalled(offset - self.consumed)  # what was still ours to take before it

    def consume(self, n: int) -> None:
        """`n` more bytes were consumed (written where they belong)."""
        if self.consumed + n > self.offset:
            raise ValueError("consumed more than was received")
        self.consumed += n

    def ack_due(self) -> int | None:
        """The offset to acknowledge now, or None if an acknowledgement can wait. The window it
        grants is `window` (`changed_window` says whether to tell it)."""
        if self.consumed <= self.acked:
            return None
        if self.consumed - self.acked >= self.window // 4 or self.consumed == self.offset:
            if self.tuner is not None:
                self.window = self.tuner.next_window(self.window)
            self.acked = self.consumed
            self.limit = max(self.limit, self.acked + self.window)
            self._grants.append(self.limit)
            return self.acked
        return None

    def changed_window(self) -> int | None:
        """The window to put in the acknowledgement being sent, if the sender does not know it
        yet (then it does)."""
        if self.window == self.announced:
            return None
        self.announced = self.window
        return self.window

    @property
    def done(self) -> bool:
        """The end came and everything before it was consumed."""
        return self.eof and self.consumed == self.offset


class Relay:
    """What the Mind checks of one stream it relays: the sender stays within the window the
    final receiver granted, chunks are contiguous, acknowledgements only cover bytes relayed.
    It holds no bytes: a chunk is forwarded as soon as it passes."""

    __slots__ = ("acked", "eof", "limit", "offset", "relayed", "resumed", "window")

    def __init__(self, window: int = WINDOW, start: int = 0) -> None:
        self.offset = start
        self.relayed = start
        """The furthest offset ever relayed: a resume may rewind `offset`, but the sender still
        holds everything it sent (up to here at least), and a receiver may have all of it."""
        self.acked = start
        self.window = window
        self.limit = start + window
        self.eof = False
        self.resumed = False
        """A resume happened: a chunk that repeats bytes already relayed is dropped, not refused."""

    @property
    def holds(self) -> int:
        """The bytes this stream may still put in flight through the Mind: its window, or nothing
        once it has ended and every byte was acknowledged (a `forward` run's stderr ends at once)."""
        return 0 if self.eof and self.acked >= self.offset else self.window

    def on_data(self, offset: int, size: int, eof: bool) -> bool:
        """True if the chunk must be forwarded; False for a repeat after a resume (`replayed`)."""
        if self.resumed and replayed(self.offset, self.eof, offset, size, eof):
            return False
        self.offset, self.eof = check_chunk(self.offset, self.limit, self.eof, offset, size, eof)
        self.relayed = max(self.relayed, self.offset)
        return True

    def resume(self, offset: int, consumed: int | None = None) -> None:
        """The stream's receiver came back (a new connection, or a new consumer): it has every byte
        before `offset` and consumed those before `consumed`. Bytes relayed past `offset` were lost
        in the cut; the sender resends them from there, and the relay expects them again."""
        check_resume(self.acked, self.relayed, offset, consumed)
        self.offset = offset
        self.eof = False  # the end, if it was sent, is sent again after the bytes before it
        self.resumed = True
        if consumed is not None and consumed > self.acked:
            self.acked = consumed
        self.limit = max(self.limit, self.acked + self.window)

    def take_up(self, offset: int, consumed: int, window: int | None = None) -> None:
        """A stream adopted as its sender presents it (a restarted Mind, another node): sent up
        to `offset`, acknowledged up to `consumed`, under `window` if the receiver had changed it."""
        self.offset, self.acked = offset, consumed
        self.relayed = offset
        if window is not None:
            self.window = window
        self.limit = max(offset, consumed + self.window)
        self.resumed = True

    def narrow(self, window: int) -> None:
        """A receiver resuming states its window: a smaller one than ours (a change the cut kept
        from us) is taken; a larger one is not, on its word alone. The limit stays where it was."""
        self.window = min(self.window, check_window(window))

    def expect_resend(self) -> None:
        """The stream's sender came back while its receiver's leg held: it resends from this
        relay's offset (everything relayed reaches the receiver), so repeats of chunks it sent
        before the cut drop quietly. Nothing rewinds, the end included."""
        self.resumed = True

    def on_ack(self, offset: int, window: int | None = None) -> bool:
        """True if the acknowledgement is new (it moves the acknowledged offset, or changes the
        window) and must be forwarded."""
        if offset > self.offset:
            raise _bad(f"acknowledged offset {offset} of a stream relayed up to {self.offset}")
        new = offset > self.acked or (window is not None and window != self.window)
        if window is not None:
            self.window = check_window(window)
        self.acked = max(self.acked, offset)
        self.limit = max(self.limit, self.acked + self.window)
        return new

    @property
    def in_flight(self) -> int:
        """Bytes relayed but not yet consumed: what this stream may cost the Mind (<= window)."""
        return self.offset - self.acked


Chunk = tuple[int, bytes, bool]
"""One chunk to send: (offset, data, eof)."""


class Outgoing:
    """One stream this peer sends, as every shell drives it (DESIGN §11b, §15): credit from the
    receiver's acknowledgements, the end, and the bytes sent but not yet acknowledged, kept so a
    resume after a cut resends exactly what the receiver lacks. What is kept never exceeds the
    window: the credit rule already stops the sender there, so continuity costs no extra memory
    bound, only the window's bytes held a little longer."""

    __slots__ = ("_kept", "kept", "sender")

    def __init__(self, window: int = WINDOW) -> None:
        self.sender = Sender(window)
        self._kept: deque[tuple[int, bytes]] = deque()
        """The chunks sent and not yet acknowledged, as they were cut (a repeat after a resume
        then has the same offsets and sizes as the original, see `replayed`)."""
        self.kept = 0
        """Bytes kept (== sent - acknowledged <= window)."""

    @property
    def offset(self) -> int:
        return self.sender.offset

    @property
    def acked(self) -> int:
        return self.sender.acked

    @property
    def eof(self) -> bool:
        return self.sender.eof

    @property
    def drained(self) -> bool:
        return self.sender.drained

    def credit(self) -> int:
        return self.sender.credit()

    def send(self, data: bytes, size: int = CHUNK) -> list[Chunk]:
        """`data` (at most the credit) as the chunks to send now; each is kept until acknowledged."""
        start = self.sender.take(len(data))
        out: list[Chunk] = []
        for i in range(0, len(data), size):
            piece = data[i : i + size]
            self._kept.append((start + i, piece))
            out.append((start + i, piece, False))
        self.kept += len(data)
        return out

    def close(self) -> Chunk:
        """The end of the stream, as the chunk to send."""
        return (self.sender.close(), b"", True)

    @property
    def window(self) -> int:
        return self.sender.window

    @property
    def granted(self) -> int:
        """The bytes the receiver lets us have unacknowledged now: the window, or more while a
        limit granted before a smaller window still stands (what a presentation states)."""
        return self.sender.limit - self.sender.acked

    def on_ack(self, offset: int, window: int | None = None) -> bool:
        """The receiver consumed everything before `offset` (and grants `window`, if it says):
        those bytes are let go. True if that opened credit."""
        before = self.sender.acked
        opened = self.sender.on_ack(offset, window)
        if self.sender.acked == before:
            return opened
        kept = self._kept
        while kept:
            start, piece = kept[0]
            end = start + len(piece)
            if end <= offset:
                kept.popleft()
                self.kept -= len(piece)
                continue
            if start < offset:
                kept[0] = (offset, piece[offset - start :])
                self.kept -= offset - start
            break
        return opened

    def resume(self, offset: int, consumed: int | None = None, window: int | None = None) -> list[Chunk]:
        """The receiver came back with every byte before `offset`, having consumed those before
        `consumed`, granting `window` (an acknowledgement the cut may have lost, its window
        included). Returns exactly the chunks to send again: the bytes from `offset` to what was
        sent, and the end if it was sent. An offset the receiver cannot have (below what it
        acknowledged, past what was sent) is refused."""
        check_resume(self.sender.acked, self.sender.offset, offset, consumed)
        if consumed is not None or window is not None:
            self.on_ack(self.sender.acked if consumed is None else consumed, window)
        out: list[Chunk] = []
        for start, piece in self._kept:
            end = start + len(piece)
            if end <= offset:
                continue
            if start < offset:
                piece, start = piece[offset - start :], offset
            out.append((start, piece, False))
        if self.sender.eof:
            out.append((self.sender.offset, b"", True))
        return out


class Incoming:
    """One stream this peer receives, as every shell drives it: order, window and end checked,
    acknowledgements paced (`Receiver`), and after a cut the point to resume from."""

    __slots__ = ("receiver", "resumed")

    def __init__(self, window: int = WINDOW, start: int = 0, tuner: WindowTuner | None = None) -> None:
        """`start`: a new consumer of a stream already under way (`mind attach` after the first
        consumer died) begins where its predecessor's acknowledgement left it."""
        self.receiver = Receiver(window, tuner)
        self.receiver.start_at(start)
        self.resumed = False

    @property
    def offset(self) -> int:
        return self.receiver.offset

    @property
    def consumed(self) -> int:
        return self.receiver.consumed

    @property
    def done(self) -> bool:
        return self.receiver.done

    def on_data(self, offset: int, size: int, eof: bool) -> bool:
        """True if the chunk is new (deliver it); False for a repeat after a resume. Anything
        else out of order raises `ProtocolError`."""
        r = self.receiver
        if self.resumed and replayed(r.offset, r.eof, offset, size, eof):
            return False
        r.on_data(offset, size, eof)
        return True

    def consume(self, n: int) -> None:
        self.receiver.consume(n)

    def ack_due(self) -> int | None:
        return self.receiver.ack_due()

    def changed_window(self) -> int | None:
        return self.receiver.changed_window()

    @property
    def granted(self) -> int:
        """The bytes the sender may have beyond what we acknowledged (what a presentation states)."""
        return self.receiver.limit - self.receiver.acked

    def resume_point(self) -> tuple[int, int]:
        """(offset, consumed) to tell the sender after a cut: every byte before `offset` is here
        (received bytes survive a cut of the connection, they are in this process), those before
        `consumed` are consumed. The resume acknowledges `consumed`, so no acknowledgement lost
        in the cut is owed any more. The sender resumes under what the resume says (a presentation
        states the limit granted, which may be more than the window), so the next acknowledgement
        says the window again."""
        r = self.receiver
        r.acked = max(r.acked, r.consumed)
        r.limit = max(r.limit, r.acked + r.window)  # as the acknowledgement it stands for would
        r.announced = 0
        self.resumed = True
        return r.offset, r.consumed


def chunks(data: bytes, offset: int, size: int = CHUNK) -> list[tuple[int, bytes]]:
    """`data` (starting at stream `offset`) cut into chunks a frame may carry."""
    return [(offset + i, data[i : i + size]) for i in range(0, len(data), size)]
