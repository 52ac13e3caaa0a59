"""Following one run, sans-I/O: the rules every client of a run obeys, written once.

`mind exec` and `mind attach` (mind/cli/execloop.py: one blocking socket, threads writing our
stdout), the library (`RunHandle`, mind/client/run.py: asyncio) and through it `mind mcp`, and the
continuity simulation (tests/sim/stream_clients.py: a virtual clock) all follow runs. They used to
hold the rules each in their own way and disagreed: a bad chunk failed one and was reported as
offsets by the other; `attach` to a run with open stdin closed it in one and left it waiting for
ever in the other; one always used the default window. Here, once:
- **numbers and windows**: an `Incoming` per output stream (order, its window, acknowledgement
  pacing, the point to resume from after a cut), an `Outgoing` for stdin (credit, the bytes sent
  and not acknowledged, kept for a resend);
- **each byte handed over once**: a chunk resent after a resume is dropped; a chunk that cannot be
  placed (a gap, a window overrun: the Mind broke the rules) breaks that stream only, and the run
  is followed to its authoritative end, whose verdict says which bytes are missing;
- **the attachment**: `attached` says where each stream stands (a new consumer starts where the
  Hand resends from), stdin is resent from where the Hand's side stands, and a follower with no
  stdin to give closes the run's stdin at its first attachment (the command would otherwise wait
  for input nobody can send); `replaced` and a refusal end the following, `resume_pending` asks
  to attach again later;
- **the verdict** (`delivery`): per stream, were all the bytes the command wrote delivered, and do
  they match the Hand's digest. `mind exec` exits 122 on an incomplete 0; the library and MCP say
  `complete: false` and why.

It reads no socket and no clock. A shell feeds it what the Mind sent (`on_message`, or `on_error`
for a refusal its session core already turned into an error), tells it of a cut (`on_cut`), of the
bytes its consumer took (`consume`) and of stdin to send (`send_stdin`), and performs the actions
returned, in order. Messages are read by `TYPE` and fields only, so the fast path's `wire.Msg` and
the pydantic models are both fine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError
from protocol.streams import Incoming, Outgoing, WindowTuner

PROTOCOL = "protocol"
"""The code of a run whose events broke the rules (`ClientCode.PROTOCOL`)."""

# --- what to do (returned by the follower's inputs) --------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """New bytes of output stream `stream`, in order, each once: hand them to the consumer, and
    `consume` them when it took them (that opens the window again)."""

    stream: str
    offset: int
    data: bytes
    eof: bool


@dataclass(frozen=True, slots=True)
class SendAck:
    """Send `stream_ack` (`closed`: our reader went away; the Hand closes the pipe)."""

    stream: str
    offset: int
    closed: bool = False
    window: int | None = None
    """The window we now grant, when it changed (`protocol.streams.WindowTuner`)."""


@dataclass(frozen=True, slots=True)
class SendStdin:
    """Send this piece of stdin (`stream_data` of stream `stdin`)."""

    offset: int
    data: bytes
    eof: bool


@dataclass(frozen=True, slots=True)
class Show:
    """A run event the caller sees (`run_update`, `run_output`)."""

    msg: Any


@dataclass(frozen=True, slots=True)
class Took:
    """`attached`: the run is followed on this connection now. `first`: the follower's first
    attachment (`mind attach`'s, whose streams it makes)."""

    msg: Any
    first: bool


@dataclass(frozen=True, slots=True)
class Ended:
    """The run's authoritative end (last)."""

    end: Any


@dataclass(frozen=True, slots=True)
class Broken:
    """The run cannot be followed any more (last): a refusal, `replaced`, or events of another
    run. `code` is an `ErrorCode` or the client's `protocol`."""

    code: Any
    message: str


@dataclass(frozen=True, slots=True)
class AttachLater:
    """The Mind has not got the run back from its Hand yet (`resume_pending`): attach again
    shortly, within the window. This attachment is answered."""


@dataclass(frozen=True, slots=True)
class Credit:
    """stdin's credit or state changed (an acknowledgement, a resume): send what waits."""


Action = Deliver | SendAck | SendStdin | Show | Took | Ended | Broken | AttachLater | Credit
LAST = (Ended, Broken, AttachLater)
"""Actions after which nothing more comes under the attachment's envelope id."""


# --- the verdict ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamDelivery:
    """One output stream as this follower received it."""

    bytes: int
    """The stream's offset reached (from its start: a consumer that attached later began there)."""
    sha256: str
    """Of the bytes received by this follower (compared only when it received them from 0; empty
    when the follower was asked not to hash)."""
    complete: bool


@dataclass(frozen=True, slots=True)
class Delivery:
    """Whether every byte the command wrote reached this follower, and if not, what is missing."""

    complete: bool
    streams: dict[str, StreamDelivery]
    notes: list[str]
    """One sentence per shortfall, e.g. "stdout: bytes from offset 40960 of 81920 were not delivered"."""


@dataclass(eq=False)
class _Out:
    rx: Incoming
    start: int
    hash: Any = None
    """The sha256 of what arrived (None: not asked for, the caller verifies its own digest)."""
    gap: int | None = None
    """The offset from which nothing more could be placed (the Mind broke the stream's rules)."""
    closed: bool = False
    """Our reader went away (EPIPE): the Hand was told to stop."""
    eof: bool = False


class Follower:
    """One run as one client follows it, through any number of attachments."""

    def __init__(
        self,
        *,
        window: int = limits.STREAM_WINDOW,
        run_id: str | None = None,
        streams: Iterable[str] = (),
        stdin: bool = False,
        digest: bool = True,
        clock: Callable[[], float] | None = None,
        named: str | None = None,
    ) -> None:
        """`run_id` given: made by an `attach` (the streams come with `attached`); else by an
        `exec`, whose output `streams` are known (`stdout`, `stderr`; or `pty`) and whose first
        event names the run, or which named it itself (`named`, `Exec.run_id`): every event must
        then be that run's. `stdin`: this follower sends the run's stdin. `digest`: check what
        arrives against the Hand's sha256 (off for a copy, which checks the file's own digest:
        hashing every byte twice cost a copy's throughput). `clock` (seconds): each output stream's
        window grows as the link needs (`protocol.streams.WindowTuner`); None: the opening's."""
        self.window = window
        self.clock = clock
        self.digest = digest
        self.run_id = run_id or named
        self.hand: str | None = None
        self.state: Any = None
        self.hand_away_since: float | None = None
        """Wall time since which the run's Hand has been away, as the Mind last said (None: here)."""
        self.outs: dict[str, _Out] = {name: self._out(0) for name in streams}
        self.stdin: Outgoing | None = Outgoing(window) if stdin else None
        self.stdin_closed = False
        """The command closed its stdin (or it cannot be resumed): nothing more is sent."""
        self.stdin_broken: str | None = None
        self.attaching = run_id is not None
        """An `attach` of this follower waits for its answer."""
        self.attachments = 0
        self.by_attach = run_id is not None
        """Made by an `attach`: its first `attached` names its streams (and closes a stdin left open)."""
        self.ready = run_id is None
        """Attached on the live connection: stdin and acknowledgements may be sent now (else they
        are kept, and the next attachment's positions say them)."""
        self.end: Any = None
        self.broken: Broken | None = None

    @property
    def over(self) -> bool:
        return self.end is not None or self.broken is not None

    # --- what the shell tells the follower ---

    def on_message(self, msg: Any) -> list[Action]:
        """One message the Mind sent under this run's envelope id (its events, in order)."""
        kind = msg.TYPE
        if self.over:
            return []
        if kind == "error":
            return self.on_error(msg.code, msg.message)
        if self.run_id is None:
            self.run_id = msg.run_id
        elif msg.run_id != self.run_id:
            return self._break(PROTOCOL, f"the Mind sent events of run {msg.run_id} for run {self.run_id}")
        if kind == "stream_data":
            return self._data(msg)
        if kind == "stream_ack":
            return self._stdin_ack(msg)
        if kind == "stream_resume":
            return self._resend(msg.offset, msg.consumed, msg.window) if msg.stream == "stdin" else []
        if kind == "attached":
            return self._attached(msg)
        if kind == "run_update":
            self.state = msg.state
            self.hand_away_since = msg.hand_away_since
            return [Show(msg)]
        if kind == "run_output":
            return [Show(msg)]
        if kind == "run_end":
            self.end = msg
            return [Ended(msg)]
        if kind == "replaced":
            why = (
                f"run {self.run_id} was attached by a newer client of the same identity "
                "(the newest attachment wins): this one gets nothing more of it"
            )
            return self._break(ErrorCode.REPLACED, why)
        if kind == "stream_numbers":
            return []
        return self._break(PROTOCOL, f"the Mind answered a run with {kind}")

    def on_error(self, code: Any, message: str) -> list[Action]:
        """The Mind refused the run's request (its `exec` or an `attach`), or the client's session
        core turned an `error` or a `replaced` into this."""
        if self.over:
            return []
        if code == ErrorCode.RESUME_PENDING and self.attaching:
            self.attaching = False
            return [AttachLater()]
        if code == ErrorCode.UNKNOWN_RUN and self.attaching and (self.attachments or not self.by_attach):
            why = (
                f"the Mind does not know run {self.run_id} (it restarted without it, or the cut took "
                "the request that started it): its fate is unknown here"
            )
            return self._break(code, why)
        return self._break(code, message)

    def on_cut(self) -> None:
        """The connection the run was attached on ended. Everything received and sent is kept:
        the next attachment says where to go on from."""
        self.ready = False
        self.attaching = False

    def resume_points(self) -> list[tuple[str, int, int, int]]:
        """(stream, offset, consumed, window) of each output stream, for an `attach`: what arrived,
        what the consumer took (which also stands for any acknowledgement the cut lost), and the
        window we grant now (a change of it may have been lost in the cut too)."""
        self.attaching = True
        self.ready = False
        return [(name, *out.rx.resume_point(), out.rx.receiver.window) for name, out in self.outs.items()]

    def consume(self, stream: str, n: int) -> list[Action]:
        """The consumer took `n` more bytes of `stream`: the acknowledgement due, if any."""
        out = self.outs.get(stream)
        if out is None or n <= 0:
            return []
        out.rx.consume(n)
        offset = out.rx.ack_due()
        if offset is None or not self.ready or self.over:
            return []  # (not attached here: the next resume point says it)
        return [SendAck(stream, offset, window=out.rx.changed_window())]

    def took(self, stream: str, upto: int) -> list[Action]:
        """The consumer of `stream` has taken everything before offset `upto` (a writer that
        counts what it wrote, as `mind exec`'s threads do): `consume` of the difference."""
        out = self.outs.get(stream)
        return self.consume(stream, upto - out.rx.consumed) if out is not None else []

    def reader_closed(self, stream: str, upto: int) -> list[Action]:
        """Our reader of `stream` went away (EPIPE) with everything before offset `upto` taken
        (the consumer goes on taking what comes and discarding it): the Hand is told to close the
        pipe (the command then gets SIGPIPE, as `cmd | head` on one machine), and the output
        limit's cut is no shortfall of ours."""
        out = self.outs.get(stream)
        if out is None or out.closed:
            return []
        out.closed = True
        if upto > out.rx.consumed:
            out.rx.consume(upto - out.rx.consumed)
        if not self.ready or self.over:
            return []
        return [SendAck(stream, out.rx.consumed, closed=True)]

    def ack_all(self) -> list[Action]:
        """Acknowledge everything taken (before a detach: the next consumer starts right after)."""
        if not self.ready or self.over:
            return []
        out: list[Action] = []
        for name, o in self.outs.items():
            r = o.rx.receiver
            if r.consumed > r.acked:
                r.acked = r.consumed
                out.append(SendAck(name, r.acked))
        return out

    # --- stdin ---

    def stdin_credit(self) -> int:
        """How many bytes of stdin may be sent now (0 while not attached or once closed)."""
        if self.stdin is None or self.stdin_closed or self.stdin.eof or self.over:
            return 0
        return self.stdin.credit()

    def send_stdin(self, data: bytes) -> list[Action]:
        """Send `data` (at most `stdin_credit()` bytes). Kept until acknowledged; while not
        attached it is only kept, and goes with the resend the next attachment asks for."""
        assert self.stdin is not None
        chunks = self.stdin.send(data, limits.STREAM_CHUNK_MAX)
        if not self.ready:
            return []
        return [SendStdin(o, d, e) for o, d, e in chunks]

    def close_stdin(self) -> list[Action]:
        """The end of stdin (once)."""
        if self.stdin is None or self.stdin.eof or self.stdin_closed or self.over:
            return []
        offset, data, eof = self.stdin.close()
        return [SendStdin(offset, data, eof)] if self.ready else []

    # --- the verdict ---

    def received(self, stream: str) -> int:
        out = self.outs.get(stream)
        return out.rx.offset if out is not None else 0

    def delivery(self, end: Any = None) -> Delivery:
        """What reached this follower against what the Hand says it sent (`end`'s tails; without
        them, as for a lost run, only a stream that reached its end is known complete)."""
        end = end if end is not None else self.end
        notes: list[str] = []
        streams: dict[str, StreamDelivery] = {}
        for name, out in self.outs.items():
            ok = True
            tail = getattr(end, name, None) if end is not None else None
            sent = getattr(tail, "sent", None)
            got = out.rx.offset
            if tail is None or sent is None:  # the Hand's account never came (the run is lost)
                if not out.eof:
                    ok = False
                    notes.append(f"{name}: delivered up to offset {got}; whether more was written is unknown")
            elif out.gap is not None:
                ok = False
                notes.append(f"{name}: bytes from offset {out.gap} were not delivered (the stream broke)")
            elif got < sent:
                ok = False
                notes.append(f"{name}: bytes from offset {got} of {sent} were not delivered")
            elif (
                tail.sha256 is not None
                and out.start == 0
                and out.hash is not None
                and out.hash.hexdigest() != tail.sha256
            ):
                ok = False
                notes.append(f"{name}: the bytes delivered do not match the Hand's digest")
            if tail is not None and sent is not None and tail.total > sent and not out.closed:
                ok = False
                notes.append(
                    f"{name}: cut at offset {sent} by the output limit; "
                    f"{tail.total - sent} bytes of {tail.total} were not delivered"
                )
            streams[name] = StreamDelivery(got, out.hash.hexdigest() if out.hash is not None else "", ok)
        if self.stdin_broken is not None:
            notes.append(self.stdin_broken)
        return Delivery(not notes, streams, notes)

    # --- the rules ---

    def _out(self, start: int) -> _Out:
        tuner = WindowTuner(self.clock, self.window) if self.clock is not None else None
        rx = Incoming(self.window, start=start, tuner=tuner)
        return _Out(rx, start, hashlib.sha256() if self.digest else None)

    def _break(self, code: Any, message: str) -> list[Action]:
        self.broken = Broken(code, message)
        self.attaching = False
        return [self.broken]

    def _data(self, msg: Any) -> list[Action]:
        out = self.outs.get(msg.stream)
        if out is None:  # a stream the exec did not name (an older Mind): followed all the same
            out = self.outs[msg.stream] = self._out(0)
        if out.gap is not None:
            return []
        try:
            if not out.rx.on_data(msg.offset, len(msg.data), msg.eof):
                return []  # a repeat of bytes already here (a resend after a resume)
        except ProtocolError:
            out.gap = out.rx.offset  # nothing from here on can be placed: the verdict says so
            # ... and the Hand stops sending it (its pipe closed, as for a reader gone): waiting on
            # credit that can never come, the run would never end, and nobody would be told.
            return [] if not self.ready or self.over else [SendAck(msg.stream, out.rx.consumed, closed=True)]
        if msg.data and out.hash is not None:
            out.hash.update(msg.data)
        if msg.eof:
            out.eof = True
        return [Deliver(msg.stream, msg.offset, msg.data, msg.eof)]

    def _stdin_ack(self, msg: Any) -> list[Action]:
        if msg.stream != "stdin" or self.stdin is None:
            return []
        try:
            self.stdin.on_ack(msg.offset, msg.window)
        except ProtocolError:
            pass  # the Mind checked it; a wrong one opens no credit
        if msg.closed:
            self.stdin_closed = True
        return [Credit()]

    def _attached(self, msg: Any) -> list[Action]:
        first = self.attachments == 0 and self.by_attach
        self.attaching = False
        self.attachments += 1
        self.hand = msg.hand
        self.state = msg.state
        self.hand_away_since = msg.hand_away_since
        out: list[Action] = [Took(msg, first)]
        for pos in msg.streams:
            if pos.stream == "stdin":
                if self.stdin is not None:
                    self.ready = True
                    out += self._resend(pos.offset, pos.consumed, pos.window)
                elif first:  # nobody here can give it input: close it, or it waits for ever
                    out.append(SendStdin(pos.offset, b"", True))
            elif pos.stream not in self.outs:  # a new consumer starts where the Hand resends from
                self.outs[pos.stream] = self._out(pos.offset)
        self.ready = True
        return [*out, Credit()]

    def _resend(self, offset: int, consumed: int, window: int | None = None) -> list[Action]:
        """The stdin bytes the Hand's side lacks, sent again before anything new (under `window`,
        if the Hand's receiver changed it)."""
        if self.stdin is None or self.stdin_closed:
            return []
        try:
            chunks = self.stdin.resume(offset, consumed, window)
        except ProtocolError as exc:  # a position we cannot have: nothing more can be placed
            self.stdin_closed = True
            self.stdin_broken = f"stdin: cannot resume from offset {offset}: {exc.message}"
            return [Credit()]
        return [*(SendStdin(o, d, e) for o, d, e in chunks), Credit()]
