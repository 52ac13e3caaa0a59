"""What one client may cost the Mind (issue 23, must-hold 2), pure: time is passed in.

Three bounds, so no single client can move another's latency or the Mind's memory by more than a
known amount:

- a **rate** of frames and of request bytes read from it (`TokenBucket`): a client over it is not
  refused but *waited for* (the shell stops reading its socket until the bucket refills), so TCP
  slows the flood at its source and an honest burst only slows down (attack: a sustained flood of
  1 MiB frames of empty arrays raised other clients' median latency 2 -> 237 ms);
- a budget of **stream bytes in flight** across all its streamed runs (`stream_budget_problem`):
  each output stream may hold a window of unacknowledged bytes in the Mind, so the number of
  streamed runs a client holds at once is bounded (attack 4: 1,000 downloads read one frame per
  0.5 s took the Mind from 45 to 1,052 MiB);
- a byte bound on its **outbox** (`OutboxBound`): a peer that does not read is closed, not
  buffered.
"""

from __future__ import annotations

from mind.core.nodes import NODE_LABEL
from protocol import limits

STREAM_BUDGET_BYTES = 128 * limits.STREAM_WINDOW
"""Stream bytes one client (one credential, over all its connections) may have in flight: 64
streamed runs of `exec` at once (two windows each), above a fleet's default concurrency (50)."""
OUTBOX_MAX_BYTES = 48 << 20
"""Bytes queued for one connection before it is closed as a peer that does not read: a client
reading its streams keeps this near zero whatever its budget, since the Mind sends a window's
bytes only as fast as the client's acknowledgements allow."""
OUTBOX_FRAME_OVERHEAD = 256
"""What a queued frame is counted at, on top of the bytes it carries (its envelope and fields)."""
CLIENT_FRAMES_PER_S = 4000.0
CLIENT_FRAMES_BURST = 8000.0
"""Frames a second one client may send: above an honest upload (a 200 MB/s upload is ~3,000
chunks a second), below what holds the loop."""
CLIENT_REQUEST_BYTES_PER_S = float(8 << 20)
CLIENT_REQUEST_BYTES_BURST = float(16 << 20)
"""Bytes a second of requests (every frame but a run's stream bytes): decoding is what a request
costs before any check, about 10 ms per 1 MiB frame of empty arrays, so this bounds a flood of
them to a small share of the loop; stream chunks carry bytes, cheap to decode, and are bounded by
their flow control instead."""


CLIENT_REQUESTS_IN_FLIGHT = 16
"""Requests of one connection answered off the read loop (lists, status, task calls) at once: the
reader waits for one to end before it reads the next frame, so a client pipelining thousands of
them queues them in its own socket, not on the Mind's threads."""


class TokenBucket:
    """`rate` tokens a second up to `burst`; a take beyond them is owed, and `take` says how long
    the caller should wait before it has paid (0.0: nothing to wait)."""

    __slots__ = ("burst", "rate", "_level", "_at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._level = burst
        self._at = now

    def take(self, cost: float, now: float) -> float:
        self._level = min(self.burst, self._level + (now - self._at) * self.rate)
        self._at = now
        self._level -= cost
        return 0.0 if self._level >= 0 else -self._level / self.rate


class ClientRate:
    """One client's frames, and bytes of requests: `take(size, now, stream)` is the seconds to wait
    before reading on (`stream`: the frame was a run's stream bytes, counted as a frame only)."""

    __slots__ = ("bytes", "frames")

    def __init__(self, now: float) -> None:
        self.frames = TokenBucket(CLIENT_FRAMES_PER_S, CLIENT_FRAMES_BURST, now)
        self.bytes = TokenBucket(CLIENT_REQUEST_BYTES_PER_S, CLIENT_REQUEST_BYTES_BURST, now)

    def take(self, size: int, now: float, stream: bool = False) -> float:
        return max(self.frames.take(1.0, now), self.bytes.take(0.0 if stream else float(size), now))


class ClientRates:
    """One `ClientRate` per credential label, shared by its connections (a client opening more
    connections gets no more rate); forgotten when its last connection goes."""

    def __init__(self) -> None:
        self._rates: dict[str, tuple[ClientRate, int]] = {}

    def join(self, label: str, now: float) -> ClientRate:
        rate, users = self._rates.get(label, (None, 0))
        if rate is None:
            rate = ClientRate(now)
        self._rates[label] = (rate, users + 1)
        return rate

    def leave(self, label: str) -> None:
        rate, users = self._rates.get(label, (None, 0))
        if rate is None:
            return
        if users <= 1:
            del self._rates[label]
        else:
            self._rates[label] = (rate, users - 1)

    def __len__(self) -> int:
        return len(self._rates)


STREAM_WINDOW_CAP = limits.STREAM_WINDOW_GROWN_MAX
"""The largest window one stream may ask of this Mind, at its opening or as it goes (the protocol
allows 64 MiB): 32 MiB keeps a 100 ms link at 2.6 Gbit/s, and one run's windows under a quarter of
its client's budget. A receiver grows its windows up to the same (`WindowTuner`)."""


def grown_window(
    asked: int, current: int, held: int, cap: int = STREAM_WINDOW_CAP, budget: int = STREAM_BUDGET_BYTES
) -> int:
    """The window a receiver's acknowledgement may grant as it passes the Mind: what it asked,
    within the cap, and while the client's streams hold (`held`, this one at `current`) under half
    its budget: growth takes at most that half, so the client's new runs still find the rest at
    their opening windows. Never below `current` (a window granted stays granted); a smaller window
    passes as asked."""
    if asked <= current:
        return asked
    room = budget // 2 - held + current
    return max(current, min(asked, cap, room))


def stream_windows(stdin: bool, pty: bool, window: int = limits.STREAM_WINDOW, tool: str = "") -> int:
    """The bytes a streamed run may hold in the Mind: the window it asked (`Streams.window`) per
    stream it relays (stdout and stderr, or the terminal; and stdin when the client sends it).
    Counted at the asked window, not the default: a client asking 64 MiB windows holds 32 times
    what one at the default does, and its budget must say so. A `forward` run (one tunnelled
    connection) has no stderr: the Hand ends it at once, so it holds its stdout and stdin only."""
    outputs = 1 if pty or tool == "forward" else 2
    streams = outputs + (1 if stdin and not pty else 0)
    return streams * window


def window_problem(window: int, cap: int = STREAM_WINDOW_CAP) -> str | None:
    """Why a stream's asked window is refused by this Mind (the sentence for the client), or None."""
    if window <= cap:
        return None
    return f"a stream window of {window >> 20} MiB is over this mind's cap of {cap >> 20} MiB: ask for less"


def stream_budget_problem(in_flight: int, want: int, budget: int = STREAM_BUDGET_BYTES) -> str | None:
    """Why a new streamed run is refused (the sentence for the client), or None: `in_flight` is what
    the client's streamed runs may already hold in the Mind, `want` what the new one may add."""
    if in_flight + want <= budget:
        return None
    return (
        f"this client's streamed runs may hold {in_flight >> 20} MiB in the mind already "
        f"(budget {budget >> 20} MiB): wait for some to end"
    )


class OutboxBound:
    """Bytes queued for one peer: `add` says False once they pass `limit` (close the peer).
    `peak` is the most ever queued: a connection that held megabytes leaves that much of the heap
    free when it goes, for the shell to give back (`protocol.io.heap`)."""

    __slots__ = ("limit", "queued", "peak")

    def __init__(self, limit: int = OUTBOX_MAX_BYTES) -> None:
        self.limit = limit
        self.queued = 0
        self.peak = 0

    def add(self, size: int) -> bool:
        self.queued += size + OUTBOX_FRAME_OVERHEAD
        self.peak = max(self.peak, self.queued)
        return self.queued <= self.limit

    def sent(self, size: int) -> None:
        self.queued = max(0, self.queued - size - OUTBOX_FRAME_OVERHEAD)


def relays_for_clients(label: str, shared: bool) -> bool:
    """A node link (another Mind node of a shared database, authenticated by the node credential)
    relays the requests of many clients, each already charged its own rate and requests in flight
    at the node it reached (its door). Charged again here as one client, a few busy clients on that
    node held back every other client's calls through it (7.4 s instead of 6 ms), and the held link
    was then cut as a peer over its rate, moving every run on it: a node link is not rated again."""
    return shared and label == NODE_LABEL
