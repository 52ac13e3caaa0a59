"""A streamed run's bytes on the Hand (DESIGN §11): its output as flow-controlled chunks (`StreamData`,
which the connection's channel sends as data frames, protocol/frames.py), its stdin from the client's
chunks, acknowledgements both ways.

The arithmetic is `protocol.streams`' (`Outgoing`, `Incoming`: the one stream endpoint every peer
drives); this module connects it to one process: output read from a pipe is sent while the client has credit, and once the credit is spent
the pipe is paused (the child blocks on write, as over ssh) until an acknowledgement opens it again.
Nothing is dropped to keep up. What the Hand will not deliver is only what passes the run's
`output_limit`: the command keeps running, its pipe keeps being read, and those bytes are counted
(the result's `total` exceeds `sent`), so the client can say where the stream was cut.

Continuity (DESIGN §15): each output stream keeps what it sent until the client acknowledges it
(`Outgoing`, at most the window). When the connection drops (`cut`), nothing more is sent until the
Mind says where the client stands (`on_resume`): the chunks from there are sent again, and output
waits for credit meanwhile, exactly as for a slow reader. `positions()` is what the Hand presents
for the run on its next connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from protocol import limits
from protocol.errors import ProtocolError
from protocol.messages import Message, OutputTail, StreamAck, StreamData, StreamPosition, StreamResume, Streams
from protocol.streams import Incoming, Outgoing, WindowTuner

Send = Callable[[Message], None]


class Pipes(Protocol):
    """What `RunStreams` needs of the process (`hand.system.process.ProcessRun`)."""

    def pause_output(self, stream: str) -> None: ...
    def resume_output(self, stream: str) -> None: ...
    def close_output(self, stream: str) -> None: ...
    def write_stdin(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...


class _Out:
    __slots__ = ("awaiting", "closed", "cut", "eof", "hash", "pending", "reader_gone", "sender")

    def __init__(self, window: int) -> None:
        self.sender = Outgoing(window)
        self.pending = bytearray()
        """Read from the pipe but not yet sent (the credit ran out mid-read): at most one read."""
        self.hash = hashlib.sha256()
        self.cut = 0
        """Bytes past the output limit: read and counted, never sent."""
        self.eof = False
        """The pipe reached its end."""
        self.closed = False
        """The end of the stream has been sent."""
        self.reader_gone = False
        self.awaiting = False
        """The connection was cut: nothing is sent until the Mind says where to resume from."""


def capped_spec(spec: Streams, cap: int | None) -> Streams:
    """The client's streams spec with its `output_limit` no higher than the Hand's own
    (`hand run --output-limit`, issue 23): the client's value alone went up to 2^50."""
    if cap is None or spec.output_limit <= cap:
        return spec
    return spec.model_copy(update={"output_limit": cap})


class RunStreams:
    def __init__(self, run_id: str, spec: Streams, send: Send, log: object, grow_stdin: bool = False) -> None:
        """`grow_stdin`: stdin's window grows as the link needs (`protocol.streams.WindowTuner`),
        for a consumer whose count of consumed bytes is the bytes it took for good (a copy's part
        file: counted once written). Not for a child's pipe or a tunnel's socket: their kernel
        buffers take megabytes at once, which the tuner would read as a fast reader."""
        self.run_id = run_id
        self.spec = spec
        self._send = send
        self._log = log
        names = ("pty",) if spec.pty is not None else ("stdout", "stderr")
        self._out = {name: _Out(spec.window) for name in names}
        tuner = WindowTuner(time.monotonic, spec.window) if grow_stdin else None
        self._stdin = Incoming(spec.window, tuner=tuner) if spec.stdin or spec.pty is not None else None
        self._pipes: Pipes | None = None
        self._early: list[StreamData] = []
        """stdin that came before the process existed (at most a window: `Incoming` checks)."""
        self.flushed = asyncio.Event()
        """Every output stream has sent its end and its receiver consumed every byte of it (or
        closed its reader): the result may follow. Not before the consumption: a result ends the
        run at the Mind, and a client whose link was cut while the last bytes were in flight could
        then never get them back (DESIGN §15); one acknowledgement's round trip is the price."""

    @property
    def wants_stdin(self) -> bool:
        return self._stdin is not None

    def on_resize(self, rows: int, cols: int) -> None:
        resize = getattr(self._pipes, "resize", None)
        if resize is not None:
            resize(rows, cols)

    def attach(self, pipes: Pipes) -> None:
        self._pipes = pipes
        early, self._early = self._early, []
        for msg in early:
            self._feed(msg)

    # --- output (Hand -> client) ---

    def on_output(self, stream: str, data: bytes) -> None:
        out = self._out.get(stream)
        if out is None or out.closed:
            return
        room = self.spec.output_limit - out.sender.offset - len(out.pending)
        if out.reader_gone:
            room = 0
        if room < len(data):
            out.cut += len(data) - max(room, 0)
            data = data[: max(room, 0)]
        if data and not out.pending and not out.awaiting and len(data) <= out.sender.credit():
            self._send_now(stream, out, data)  # the usual case: sent as read, no copy into `pending`
        elif data:
            out.pending += data
        self._flush(stream, out)

    def _send_now(self, stream: str, out: _Out, data: bytes) -> None:
        out.hash.update(data)
        for offset, piece, _eof in out.sender.send(data, limits.STREAM_CHUNK_MAX):
            self._send(
                StreamData.model_construct(run_id=self.run_id, stream=stream, offset=offset, data=piece, eof=False)
            )

    def sent_hash(self, stream: str) -> Any:
        """The running sha256 of the bytes sent on `stream` so far (a copy from byte 0 shares it)."""
        return self._out[stream].hash

    def on_output_end(self, stream: str) -> None:
        out = self._out.get(stream)
        if out is not None:
            out.eof = True
            self._flush(stream, out)

    def on_ack(self, ack: StreamAck) -> None:
        out = self._out.get(ack.stream)
        if out is None:
            return
        try:
            out.sender.on_ack(ack.offset, ack.window)
        except ProtocolError:
            return  # the Mind checked it already; a wrong one changes nothing here
        if ack.closed and not out.reader_gone:  # `mind exec ... | head`: the local reader is gone
            out.reader_gone = True
            out.cut += len(out.pending)
            out.pending.clear()
            if self._pipes is not None:
                self._pipes.close_output(ack.stream)
        self._flush(ack.stream, out)
        self._check_done()

    # --- continuity (DESIGN §15) ---

    def cut(self) -> None:
        """The connection dropped: hold every output stream until its `stream_resume` (what was
        sent is kept; what the child writes waits for credit, as for a slow reader)."""
        for out in self._out.values():
            out.awaiting = True

    @property
    def awaiting(self) -> bool:
        """Some output stream has not been resumed since the last cut."""
        return any(out.awaiting for out in self._out.values())

    def on_resume(self, msg: StreamResume) -> bool:
        """The Mind says where the client stands on an output stream: send again exactly the
        chunks it lacks (and the end, if it was sent), then go on. A point the stream cannot have
        reached is refused with a log: the run goes on, the stream stays held. True if the stream
        was resumed."""
        out = self._out.get(msg.stream)
        if out is None:
            self._log.warning("stream_resume_refused", stream=msg.stream, why="no such output stream")  # type: ignore[attr-defined]
            return False
        try:
            chunks = out.sender.resume(msg.offset, msg.consumed, msg.window)
        except ProtocolError as exc:
            self._log.warning("stream_resume_refused", stream=msg.stream, why=exc.message)  # type: ignore[attr-defined]
            return False
        out.awaiting = False
        for offset, data, eof in chunks:
            self._send(StreamData(run_id=self.run_id, stream=msg.stream, offset=offset, data=data, eof=eof))
        self._flush(msg.stream, out)
        return True

    def forsake(self) -> None:
        """Nobody will resume this run's output (the window passed, or the Mind ended the run while
        its streams were held): stop keeping what the child writes and close our ends of its pipes,
        so a killed tree's pipes end and the run can conclude. Call it after the kill, so the
        child's end is the kill's, not a broken pipe's."""
        for stream, out in self._out.items():
            if not out.awaiting or out.reader_gone:
                continue
            out.reader_gone = True
            out.cut += len(out.pending)
            out.pending.clear()
            if self._pipes is not None:
                self._pipes.close_output(stream)
        self._check_done()

    def positions(self) -> list[StreamPosition]:
        """Where each stream stands, for the run's presentation: output as sent and acknowledged
        (with the window its receiver grants, if that is no longer the opening's), stdin as received and consumed (that point acknowledges what was consumed, and repeats of
        chunks from before it are dropped from now on)."""
        out = [
            StreamPosition(
                stream=name,  # type: ignore[arg-type]
                offset=o.sender.offset,
                consumed=o.sender.acked,
                window=o.sender.granted if o.sender.granted != self.spec.window else None,
            )
            for name, o in self._out.items()
        ]
        if self._stdin is not None:
            offset, consumed = self._stdin.resume_point()
            granted = self._stdin.granted
            window = granted if granted != self.spec.window else None
            out.append(StreamPosition(stream="stdin", offset=offset, consumed=consumed, window=window))
        return out

    def _flush(self, stream: str, out: _Out) -> None:
        sender = out.sender
        while out.pending and sender.credit() > 0 and not out.awaiting:
            n = min(len(out.pending), sender.credit(), limits.STREAM_CHUNK_MAX)
            piece = bytes(out.pending[:n])
            del out.pending[:n]
            out.hash.update(piece)
            for offset, data, _eof in sender.send(piece, limits.STREAM_CHUNK_MAX):
                self._send(StreamData(run_id=self.run_id, stream=stream, offset=offset, data=data))  # type: ignore[arg-type]
        if self._pipes is not None and not out.eof and not out.reader_gone:
            if out.pending or sender.credit() == 0:
                self._pipes.pause_output(stream)
            else:
                self._pipes.resume_output(stream)
        if out.eof and not out.pending and not out.closed and not out.awaiting:
            out.closed = True
            offset, _data, _eof = sender.close()
            self._send(StreamData(run_id=self.run_id, stream=stream, offset=offset, eof=True))  # type: ignore[arg-type]
            self._check_done()

    def _check_done(self) -> None:
        if all(o.closed and (o.sender.drained or o.reader_gone) for o in self._out.values()):
            self.flushed.set()

    def abandon(self) -> None:
        """The run is ending without its output delivered (cancelled, failed to start): whatever
        is still waiting for credit is counted as not sent, and the streams end here."""
        for stream, out in self._out.items():
            out.cut += len(out.pending)
            out.pending.clear()
            out.eof = True
            self._flush(stream, out)

    def tails(self, stdout: OutputTail, stderr: OutputTail) -> tuple[OutputTail, OutputTail]:
        """The result's tails with what was sent of each stream, and its digest."""
        if "pty" in self._out:
            out = self._out["pty"]
            pty = OutputTail(data=stdout.data, total=stdout.total, sent=out.sender.offset, sha256=out.hash.hexdigest())
            return pty, stderr
        o, e = self._out["stdout"], self._out["stderr"]
        return (
            OutputTail(data=stdout.data, total=stdout.total, sent=o.sender.offset, sha256=o.hash.hexdigest()),
            OutputTail(data=stderr.data, total=stderr.total, sent=e.sender.offset, sha256=e.hash.hexdigest()),
        )

    # --- stdin (client -> Hand) ---

    def on_stdin(self, msg: StreamData) -> None:
        rx = self._stdin
        if rx is None:
            return
        try:
            fresh = rx.on_data(msg.offset, len(msg.data), msg.eof)
        except ProtocolError as exc:
            self._log.warning("stream_refused", stream="stdin", why=exc.message)  # type: ignore[attr-defined]
            return
        if not fresh:
            return  # sent before the client heard where the Hand stood, and sent again: once is enough
        if self._pipes is None:
            self._early.append(msg)
        else:
            self._feed(msg)

    def _feed(self, msg: StreamData) -> None:
        assert self._pipes is not None
        if msg.data:
            self._pipes.write_stdin(msg.data)
        if msg.eof and self.spec.pty is None:  # a terminal has no end of input to give (as sshd):
            self._pipes.close_stdin()  # typing Ctrl-D for the user would be a keystroke they never typed

    def on_stdin_consumed(self, total: int) -> None:
        """The child's pipe has taken `total` bytes of stdin: acknowledge them."""
        rx = self._stdin
        if rx is None:
            return
        rx.consume(min(total, rx.offset) - rx.consumed)
        offset = rx.ack_due()
        if offset is not None:
            self._send(StreamAck(run_id=self.run_id, stream="stdin", offset=offset, window=rx.changed_window()))
