"""One run as the Python client holds it: its events, its streams, and its life across cuts.

A `RunHandle` is what `MindClient.start` and `MindClient.attach` return. It drives the one stream
endpoint of `protocol/streams.py` (DESIGN §11b, §15): an `Incoming` per output stream (order,
window, acknowledgement pacing, and after a cut the point to resume from) and an `Outgoing` for
stdin (credit, and the bytes sent but not yet acknowledged, kept for a resend). Because both ends
keep their positions in this process, a cut of the connection is not the end of the run: the client
(mind/client/aio.py) reconnects and re-attaches, the handle says where each stream stands, and the
events go on in the same handle: the caller sees no gap and no repeat.

The handle never reads the socket: the client feeds it every message of its run (`on_message`, in
order, synchronously) and tells it when the connection is cut and when a new attachment begins.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import BinaryIO, Protocol

from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import MindhandError, ProtocolError
from protocol.messages import (
    Attached,
    CancelRunResult,
    Error,
    Message,
    Replaced,
    RunEnd,
    RunOutput,
    RunUpdate,
    StreamAck,
    StreamData,
    StreamNumbers,
    StreamPosition,
    StreamResume,
)
from protocol.streams import Chunk, Incoming, Outgoing


class RunClient(Protocol):
    """What a `RunHandle` asks of the client that carries it (`mind.client.aio.MindClient`)."""

    def queue(self, msg: Message, id_: str) -> None:
        """Queue a frame on the live connection now, in order; `ClientError` if there is none."""

    def kick(self) -> None:
        """Write what is queued soon."""

    async def flush_quietly(self) -> None:
        """Write what is queued; a cut is not an error here (the resume repairs it)."""

    def attach_later(self, handle: RunHandle) -> None:
        """Attach `handle` again shortly (the Mind said `resume_pending`)."""

    async def cancel(self, run_id: str) -> CancelRunResult: ...

    async def detach_run(self, handle: RunHandle, keep: float | None) -> float: ...


RunEvent = RunUpdate | RunOutput | StreamData | RunEnd
Stdin = bytes | BinaryIO | AsyncIterable[bytes]
"""What `MindClient.start(stdin=...)` sends as the run's standard input: all of it, any size."""

RUN_MESSAGES = (RunUpdate, RunOutput, StreamData, StreamAck, RunEnd, Attached, Replaced, StreamResume, StreamNumbers)
"""What the Mind may send under a run's envelope id: its events, and the answers about its attachment."""


class RunFailed(ClientError):
    def __init__(self, end: RunEnd) -> None:
        why = end.error or end.reason or end.state.value
        super().__init__(ClientCode(end.state.value), f"run {end.run_id} on {end.hand} ended {end.state.value}: {why}")
        self.end = end


class StillRunning(MindhandError):
    """A wait bound (`handle.wait(timeout=)`, `mc.exec(..., wait=)`) passed before the run ended:
    the run was detached and goes on, kept by the Mind for `keep_s` seconds; `mc.attach(run_id)`
    takes it up again (its output from where this handle stopped, and its end). Not a `ClientError`:
    nothing failed, and a caller that does not expect it should not mistake it for a failure."""

    def __init__(self, run_id: str, keep_s: float) -> None:
        super().__init__(f"still running: mind attach {run_id} (kept {keep_s:g} s unattended)")
        self.run_id = run_id
        self.keep_s = keep_s


class RunHandle:
    """One run in flight: iterate its events, await its end, request a cancel, or detach."""

    def __init__(
        self,
        client: RunClient,
        req_id: str,
        stdin: Stdin | None = None,
        *,
        window: int = limits.STREAM_WINDOW,
        run_id: str | None = None,
    ) -> None:
        self._client = client
        self.req_id = req_id
        """The envelope id the run's events come under (a new one at each attachment)."""
        self.run_id: str | None = run_id
        self.hand: str | None = None
        self.hand_away_since: float | None = None
        """Wall time since which the run's Hand has been away (its leg cut, or the Mind restarted),
        as the Mind last said; None while it is there. The run waits for it within the window."""
        self._events: asyncio.Queue[RunEvent | MindhandError] = asyncio.Queue()
        self._id_known = asyncio.Event()
        if run_id is not None:
            self._id_known.set()
        self._failed: ClientError | None = None
        self.end: RunEnd | None = None
        self.detached = False
        self._window = window
        self._rx: dict[str, Incoming] = {}
        """Output streams: a chunk counts as consumed once `events()` has handed it over, so a
        caller that reads slowly slows the remote command instead of filling memory."""
        self._stdin = stdin
        self._tx = Outgoing(window)
        self._stdin_closed = False  # the command closed its stdin: nothing more is wanted
        self._credit = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        """Attached on the live connection: stdin and acknowledgements may be sent. Cleared at a
        cut, set again when the Mind answers the re-attachment (after the resend is queued)."""
        self._settled = asyncio.Event()  # ready again, or failed, or ended: a waiting cancel goes on
        self._cancel: asyncio.Future[CancelRunResult] | None = None  # one request at a time
        self._handed: StreamData | None = None
        """The chunk `events()` handed over last; consumed when its consumer asks for the next."""
        self.attaching = False
        """An `attach` of this handle is waiting for its answer."""
        self._id_given = run_id is not None  # made by `attach`, not by `start`
        if run_id is None:  # started on this connection: its `exec` is the attachment
            self._ready.set()

    @property
    def live(self) -> bool:
        """The run has an id, has not ended, and this handle still follows it."""
        return self.run_id is not None and self.end is None and self._failed is None and not self.detached

    # --- what the client tells the handle ---

    def on_message(self, msg: Message) -> bool:
        """One message the Mind sent under this run's envelope id. True when it was the run's last
        (its end, or a failure): the client stops routing that id here."""
        if isinstance(msg, Error):
            if msg.code is ErrorCode.RESUME_PENDING and self.attaching:
                # the Mind has not heard from the run's Hand yet: this attachment is answered (the
                # client's retry attaches only a handle not attaching; left set, it never retried and
                # failed the run at the window's end whenever a client came back before the Hand)
                self.attaching = False
                self._client.attach_later(self)
                return True
            if msg.code is ErrorCode.UNKNOWN_RUN and self.attaching and self._followed():
                why = f"the Mind no longer knows run {self.run_id} (it restarted without it): its fate is unknown here"
                return self._fail(ClientError(msg.code, why))
            return self._fail(ClientError(msg.code, msg.message))
        if not isinstance(msg, RUN_MESSAGES):
            return self._fail(ClientError(ClientCode.PROTOCOL, f"the Mind answered a run with {msg.TYPE}"))
        if self.run_id is None:
            self.run_id = msg.run_id
            self._id_known.set()
            if self._stdin is not None and self._pump is None:
                self._pump = asyncio.get_running_loop().create_task(self._send_stdin())
        elif msg.run_id != self.run_id:
            return self._fail(
                ClientError(ClientCode.PROTOCOL, f"the Mind sent events of run {msg.run_id} for run {self.run_id}")
            )
        if isinstance(msg, StreamNumbers):  # the session's channel took them: data frames are named by them
            return False
        if isinstance(msg, (Attached, RunUpdate)):
            self.hand_away_since = msg.hand_away_since
        if isinstance(msg, Attached):
            return self._attached(msg)
        if isinstance(msg, Replaced):
            why = (
                f"run {self.run_id} was attached by a newer client of the same identity "
                "(the newest attachment wins): this one gets nothing more of it"
            )
            return self._fail(ClientError(ErrorCode.REPLACED, why))
        if isinstance(msg, StreamResume):
            if msg.stream == "stdin" and self._stdin is not None:
                return self._resend(msg.offset, msg.consumed)
            return False
        if isinstance(msg, StreamAck):
            if msg.stream == "stdin":
                try:
                    self._tx.on_ack(msg.offset)
                except ProtocolError:
                    pass
                if msg.closed:
                    self._stdin_closed = True
                self._credit.set()
            return False
        if isinstance(msg, StreamData):
            rx = self._rx.get(msg.stream)
            if rx is None:
                rx = self._rx[msg.stream] = Incoming(self._window)
            try:
                if not rx.on_data(msg.offset, len(msg.data), msg.eof):
                    return False  # a repeat of bytes already here (a resend after a resume)
            except ProtocolError as exc:
                return self._fail(ClientError(ClientCode.PROTOCOL, f"stream {msg.stream}: {exc.message}"))
        self._events.put_nowait(msg)
        if isinstance(msg, RunEnd):
            self.end = msg
            self._settle()
            return True
        return False

    def _followed(self) -> bool:
        """This handle followed the run before (this is a re-attachment, not a first `attach`)."""
        return not self._id_given or self.hand is not None

    def on_cut(self) -> None:
        """The connection this run was attached on ended; the client is reconnecting. Everything
        received and sent is kept: the re-attachment says where to go on from."""
        self._ready.clear()
        self._settled.clear()
        self.attaching = False

    def attach_request(self) -> list[StreamPosition]:
        """Where this handle stands on each output stream, for an `attach` (a resume point
        acknowledges what was consumed, which also stands for any acknowledgement the cut lost)."""
        self.attaching = True
        out = []
        for name, rx in self._rx.items():
            offset, consumed = rx.resume_point()
            out.append(StreamPosition(stream=name, offset=offset, consumed=consumed))  # type: ignore[arg-type]
        return out

    async def attached(self) -> None:
        """Return once the Mind answered this handle's attachment (`ClientError` if it refused)."""
        await self._settled.wait()
        if self._failed is not None:
            raise self._failed

    def fail(self, error: ClientError) -> None:
        """The run cannot be followed any more (the connection is gone for good)."""
        self._fail(error)

    # --- the rules ---

    def _attached(self, msg: Attached) -> bool:
        self.attaching = False
        self.hand = msg.hand
        for pos in msg.streams:
            if pos.stream == "stdin":
                if self._stdin is not None and self._resend(pos.offset, pos.consumed):
                    return True
            elif pos.stream not in self._rx:  # a new consumer starts where the Hand resends from
                self._rx[pos.stream] = Incoming(self._window, start=pos.offset)
        self._ready.set()
        self._settled.set()
        self._credit.set()
        return False

    def _resend(self, offset: int, consumed: int) -> bool:
        """The stdin bytes the Hand's side lacks, sent again before anything new."""
        try:
            chunks = self._tx.resume(offset, consumed)
        except ProtocolError as exc:
            return self._fail(ClientError(ClientCode.PROTOCOL, f"cannot resume stdin: {exc.message}"))
        self._queue(chunks)
        self._client.kick()
        self._credit.set()
        return False

    def _queue(self, chunks: list[Chunk]) -> bool:
        """Queue stdin chunks on the connection, in order, without yielding (so a resend and a new
        chunk can never swap). False if the connection is gone: the chunks stay kept in `_tx`."""
        assert self.run_id is not None
        try:
            for offset, data, eof in chunks:
                self._client.queue(
                    StreamData(run_id=self.run_id, stream="stdin", offset=offset, data=data, eof=eof), self.req_id
                )
        except ClientError:
            self._ready.clear()
            return False
        return True

    def _fail(self, error: ClientError) -> bool:
        if self.end is not None or self._failed is not None:
            return True
        self._failed = error
        self._id_known.set()  # a `cancel` waiting for the id learns there is nothing to cancel
        self._settle()
        self._events.put_nowait(error)
        return True

    def _settle(self) -> None:
        self._settled.set()
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    async def _send_stdin(self) -> None:
        """The run's stdin, within the credit the Hand grants; then its end. Owned by this handle
        (cancelled when the run ends: a command that never reads stdin never blocks its result).
        A cut does not end it: it waits for the re-attachment, which resends what was lost."""
        assert self.run_id is not None and self._stdin is not None
        async for data in chunks_of(self._stdin):
            while data:
                while not (self._ready.is_set() and (self._tx.credit() > 0 or self._stdin_closed)):
                    self._credit.clear()
                    await (self._credit.wait() if self._ready.is_set() else self._ready.wait())
                if self._stdin_closed:
                    return
                n = min(len(data), self._tx.credit(), limits.STREAM_CHUNK_MAX)
                self._queue(self._tx.send(data[:n]))  # kept until acknowledged, sent or not
                data = data[n:]
                await self._client.flush_quietly()
        await self._ready.wait()
        if not self._stdin_closed:
            self._queue([self._tx.close()])
            await self._client.flush_quietly()

    def _consume(self, item: StreamData) -> Incoming | None:
        rx = self._rx.get(item.stream)
        if rx is None or not item.data:
            return None
        rx.consume(len(item.data))
        return rx

    async def _consumed(self, item: StreamData) -> None:
        rx = self._consume(item)
        if rx is None or self.run_id is None:
            return
        offset = rx.ack_due()
        if offset is not None and self.end is None and self._ready.is_set():  # else the resume point says it
            try:
                self._client.queue(StreamAck(run_id=self.run_id, stream=item.stream, offset=offset), self.req_id)
            except ClientError:
                return
            await self._client.flush_quietly()

    # --- the caller's side ---

    @property
    def stdin_sent(self) -> int:
        """Bytes of stdin sent so far (what a resumed copy counts: nothing acknowledged is resent)."""
        return self._tx.offset

    async def events(self) -> AsyncIterator[RunEvent]:
        """The run's events in order: state changes, output (`StreamData` for a streamed run:
        every byte, in order, `eof` closing each stream), and last its `RunEnd`."""
        while True:
            item = await self._events.get()
            if isinstance(item, MindhandError):
                self._events.put_nowait(item)  # a later `wait()` says the same
                raise item
            self._handed = item if isinstance(item, StreamData) else None
            yield item
            if self._handed is not None:
                self._handed = None
                await self._consumed(item)  # type: ignore[arg-type]
            if isinstance(item, RunEnd):
                return

    async def wait(
        self,
        on_event: Callable[[RunEvent], None] | None = None,
        *,
        timeout: float | None = None,
        keep: float | None = None,
    ) -> RunEnd:
        """The run's end. With `timeout` (seconds): if the run has not ended by then, it is
        detached (kept by the Mind for its resume window, or `keep` seconds) and `StillRunning`
        is raised, naming the run: `mc.attach(run_id)` picks it up again from where this stopped."""
        if timeout is None:
            return await self._wait(on_event)
        try:
            return await asyncio.wait_for(self._wait(on_event), timeout)
        except TimeoutError:
            pass
        await self._id_known.wait()
        if self.end is not None:  # it ended just as the bound passed
            return self.end
        keep_s = await self.detach(keep)
        assert self.run_id is not None
        raise StillRunning(self.run_id, keep_s)

    async def _wait(self, on_event: Callable[[RunEvent], None] | None) -> RunEnd:
        async for ev in self.events():
            if on_event is not None:
                on_event(ev)
            if isinstance(ev, RunEnd):
                return ev
        raise ClientError(ErrorCode.INTERNAL_ERROR, "event stream ended without run_end")  # pragma: no cover

    async def cancel(self) -> CancelRunResult:
        """Ask the Mind to cancel the run. During an outage the request waits for the
        re-attachment and is sent once then, however many times it was asked for meanwhile."""
        await self._id_known.wait()
        if self.run_id is None:
            assert self._failed is not None
            raise self._failed
        if self._cancel is None:
            self._cancel = asyncio.ensure_future(self._cancel_once(self.run_id))
        return await asyncio.shield(self._cancel)

    async def _cancel_once(self, run_id: str) -> CancelRunResult:
        try:
            if not self._ready.is_set():
                await self._settled.wait()
            if self._failed is not None:
                raise self._failed
            return await self._client.cancel(run_id)
        finally:
            self._cancel = None  # the next request (after this one's answer) is asked afresh

    async def detach(self, keep: float | None = None) -> float:
        """Leave the run running unattended: the Mind keeps it for its resume window, or `keep`
        seconds (capped by the Mind's `--keep-max`). Returns the seconds granted. This handle gets
        nothing more of the run (its iteration raises `StillRunning`); `mc.attach(run_id)`, from
        any client of the same identity, resumes it from what this handle handed over."""
        await self._id_known.wait()
        if self.run_id is None:
            assert self._failed is not None
            raise self._failed
        if self._handed is not None:  # handed over, its consumer not back yet: it counts
            self._consume(self._handed)
            self._handed = None
        self._ack_all()  # what was handed over is acknowledged: the next consumer starts after it
        keep_s = await self._client.detach_run(self, keep)
        self.detached = True
        self._settle()
        while not self._events.empty():  # received, not handed over: the next consumer gets them
            self._events.get_nowait()
        self._events.put_nowait(StillRunning(self.run_id, keep_s))
        return keep_s

    def _ack_all(self) -> None:
        if self.run_id is None or not self._ready.is_set():
            return  # not attached here: the resume point will say what was consumed
        for name, rx in self._rx.items():
            r = rx.receiver
            if r.consumed <= r.acked:
                continue
            r.acked = r.consumed
            try:
                self._client.queue(StreamAck(run_id=self.run_id, stream=name, offset=r.acked), self.req_id)  # type: ignore[arg-type]
            except ClientError:
                return


async def chunks_of(stdin: Stdin) -> AsyncIterator[bytes]:
    """Any `Stdin` as an async iterator of chunks (a file is read in a thread: it may block)."""
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        data = bytes(stdin)
        for i in range(0, len(data), limits.STREAM_CHUNK_MAX):
            yield data[i : i + limits.STREAM_CHUNK_MAX]
    elif hasattr(stdin, "read"):
        while chunk := await asyncio.to_thread(stdin.read, limits.STREAM_CHUNK_MAX):
            yield chunk
    else:
        async for chunk in stdin:
            if chunk:
                yield bytes(chunk)
