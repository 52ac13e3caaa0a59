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
"""

from __future__ import annotations

from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError

WINDOW = limits.STREAM_WINDOW
CHUNK = limits.STREAM_CHUNK_MAX


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_PAYLOAD, message)


def check_chunk(
    expected: int, acked: int, window: int, ended: bool, offset: int, size: int, eof: bool
) -> tuple[int, bool]:
    """One chunk as a receiver or a relay sees it: in order, contiguous, within the window granted
    after `acked`, not after the end. Returns the new (offset, eof)."""
    if ended:
        raise _bad("data after the end of the stream")
    if offset != expected:
        raise _bad(f"chunk at offset {offset}, expected {expected}")
    if expected + size - acked > window:
        raise _bad(f"the sender exceeded its window of {window} bytes")
    return expected + size, eof


class Sender:
    """The sending side of one stream: what has been sent, what the receiver has consumed."""

    __slots__ = ("acked", "eof", "offset", "window")

    def __init__(self, window: int = WINDOW) -> None:
        self.offset = 0
        """The offset of the next byte to send (= bytes sent)."""
        self.acked = 0
        """What the receiver says it has consumed."""
        self.window = window
        self.eof = False

    def credit(self) -> int:
        """How many more bytes may be sent now."""
        return max(0, self.acked + self.window - self.offset)

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

    def on_ack(self, offset: int) -> bool:
        """The receiver consumed everything before `offset`. True if that opened credit."""
        if offset > self.offset:
            raise _bad(f"acknowledged offset {offset} of a stream sent up to {self.offset}")
        if offset <= self.acked:
            return False  # an old or repeated acknowledgement: nothing new
        self.acked = offset
        return True

    @property
    def drained(self) -> bool:
        """Everything sent has been consumed."""
        return self.acked >= self.offset


class Receiver:
    """The receiving side of one stream: checks each chunk and decides when to acknowledge.

    Acknowledgements are batched: one per quarter window consumed, and one when everything is
    consumed (so a sender waiting on its last bytes is never left hanging)."""

    __slots__ = ("acked", "consumed", "eof", "offset", "window")

    def __init__(self, window: int = WINDOW) -> None:
        self.offset = 0
        """The offset the next chunk must have (= bytes received)."""
        self.consumed = 0
        self.acked = 0
        self.window = window
        self.eof = False

    def on_data(self, offset: int, size: int, eof: bool) -> None:
        self.offset, self.eof = check_chunk(self.offset, self.acked, self.window, self.eof, offset, size, eof)

    def consume(self, n: int) -> None:
        """`n` more bytes were consumed (written where they belong)."""
        if self.consumed + n > self.offset:
            raise ValueError("consumed more than was received")
        self.consumed += n

    def ack_due(self) -> int | None:
        """The offset to acknowledge now, or None if an acknowledgement can wait."""
        if self.consumed <= self.acked:
            return None
        if self.consumed - self.acked >= self.window // 4 or self.consumed == self.offset:
            self.acked = self.consumed
            return self.acked
        return None

    @property
    def done(self) -> bool:
        """The end came and everything before it was consumed."""
        return self.eof and self.consumed == self.offset


class Relay:
    """What the Mind checks of one stream it relays: the sender stays within the window the
    final receiver granted, chunks are contiguous, acknowledgements only cover bytes relayed.
    It holds no bytes: a chunk is forwarded as soon as it passes."""

    __slots__ = ("acked", "eof", "offset", "window")

    def __init__(self, window: int = WINDOW) -> None:
        self.offset = 0
        self.acked = 0
        self.window = window
        self.eof = False

    def on_data(self, offset: int, size: int, eof: bool) -> None:
        self.offset, self.eof = check_chunk(self.offset, self.acked, self.window, self.eof, offset, size, eof)

    def on_ack(self, offset: int) -> bool:
        """True if the acknowledgement is new and must be forwarded."""
        if offset > self.offset:
            raise _bad(f"acknowledged offset {offset} of a stream relayed up to {self.offset}")
        if offset <= self.acked:
            return False
        self.acked = offset
        return True

    @property
    def in_flight(self) -> int:
        """Bytes relayed but not yet consumed: what this stream may cost the Mind (<= window)."""
        return self.offset - self.acked


def chunks(data: bytes, offset: int, size: int = CHUNK) -> list[tuple[int, bytes]]:
    """`data` (starting at stream `offset`) cut into chunks a frame may carry."""
    return [(offset + i, data[i : i + size]) for i in range(0, len(data), size)]
