"""One run as the Python client holds it: its events, its streams, and its life across cuts.

A `RunHandle` is what `MindClient.start` and `MindClient.attach` return. The rules of following a
run (DESIGN §11b, §15: numbers, windows, acknowledgements, attachments, the stdin resend, gaps and
digests, the verdict) are the run follower's (mind/client/follow.py), shared with `mind exec`; the
handle is its asyncio shell: a queue of events, the stdin pump, cancel and detach. Because both ends
keep their positions in this process, a cut of the connection is not the end of the run: the client
(mind/client/aio.py) reconnects and re-attaches, the handle says where each stream stands, and the
events go on in the same handle: the caller sees no gap and no repeat.

The handle never reads the socket: the client feeds it every message of its run (`on_message`, in
order, synchronously) and tells it when the connection is cut and when a new attachment begins.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import BinaryIO, Protocol

from mind.client.follow import (
    PROTOCOL,
    Action,
    AttachLater,
    Broken,
    Credit,
    Deliver,
    Delivery,
    Ended,
    Follower,
    SendAck,
    SendStdin,
    Show,
    Took,
)
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import MindhandError
from protocol.messages import (
    CancelRunResult,
    Message,
    RunEnd,
    RunOutput,
    RunUpdate,
    StreamAck,
    StreamData,
    StreamPosition,
)


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
    """One run in flight: iterate its events, await its end, request a cancel, or detach. The rules
    of following it are the follower's (mind/client/follow.py, as for `mind exec`); this is its
    asyncio shell: a queue of events, the stdin pump, the cancel and detach requests."""

    def __init__(
        self,
        client: RunClient,
        req_id: str,
        stdin: Stdin | None = None,
        *,
        window: int = limits.STREAM_WINDOW,
        run_id: str | None = None,
        streams: tuple[str, ...] = (),
        digest: bool = True,
        named: str | None = None,
    ) -> None:
        """`run_id`: an attachment of that run; else started by an `exec` under `req_id`, which
        named its run `named` (`Exec.run_id`; None: its first event names it)."""
        self._client = client
        self.req_id = req_id
        """The envelope id the run's events come under (a new one at each attachment)."""
        self.follower = Follower(
            window=window,
            run_id=run_id,
            streams=streams,
            stdin=stdin is not None,
            digest=digest,
            clock=time.monotonic,
            named=named,
        )
        self._events: asyncio.Queue[RunEvent | MindhandError] = asyncio.Queue()
        self._id_known = asyncio.Event()
        if self.follower.run_id is not None:
            self._id_known.set()
        self._failed: ClientError | None = None
        self.end: RunEnd | None = None
        self.detached = False
        self._stdin = stdin
        self._credit = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        """Attached on the live connection. Cleared at a cut, set again when the Mind answers the
        re-attachment (after the resend is queued)."""
        self._settled = asyncio.Event()  # ready again, or failed, or ended: a waiting cancel goes on
        self._cancel: asyncio.Future[CancelRunResult] | None = None  # one request at a time
        self._handed: StreamData | None = None
        """The chunk `events()` handed over last; consumed when its consumer asks for the next."""
        if run_id is None:  # started on this connection: its `exec` is the attachment
            self._ready.set()

    @property
    def run_id(self) -> str | None:
        return self.follower.run_id

    @property
    def hand(self) -> str | None:
        return self.follower.hand

    @property
    def hand_away_since(self) -> float | None:
        """Wall time since which the run's Hand has been away (its leg cut, or the Mind restarted),
        as the Mind last said; None while it is there. The run waits for it within the window."""
        return self.follower.hand_away_since

    @property
    def attaching(self) -> bool:
        """An `attach` of this handle is waiting for its answer."""
        return self.follower.attaching

    @property
    def live(self) -> bool:
        """The run has an id, has not ended, and this handle still follows it."""
        return self.run_id is not None and self.end is None and self._failed is None and not self.detached

    def delivery(self) -> Delivery:
        """Whether every output byte the command wrote reached this handle (and matches the Hand's
        digest); `notes` say what is missing (a broken stream, the output limit, stdin that could
        not be resumed). As `mind exec` exits 122 on an incomplete 0."""
        return self.follower.delivery(self.end)

    # --- what the client tells the handle ---

    def on_message(self, msg: Message) -> bool:
        """One message the Mind sent under this run's envelope id. True when it was the run's last
        (its end, a failure, or an attachment the Mind asked to repeat): the client stops routing
        that id here."""
        had_id = self.run_id is not None
        actions = self.follower.on_message(msg)
        learnt = not had_id and self.run_id is not None
        if learnt:
            self._id_known.set()
        if self._stdin is not None and self._pump is None and (learnt or msg.TYPE == "stream_numbers"):
            # the Mind numbers a run's streams before anything else of it (a named run hears nothing
            # earlier): a stdin chunk can name its stream now
            self._pump = asyncio.get_running_loop().create_task(self._send_stdin())
        return self._act(actions, msg)

    def _act(self, actions: list[Action], msg: Message | None = None) -> bool:
        last = False
        if any(isinstance(a, (SendAck, SendStdin)) for a in actions):
            # written soon, whoever queued: a resend the Mind asked for (`stream_resume` after the
            # Hand's leg was cut) may fill the whole window, and then no pump flushes it (a copy
            # cut at half stalled for ever)
            self._client.kick()
        for a in actions:
            if isinstance(a, Deliver):
                self._events.put_nowait(msg)  # type: ignore[arg-type]
            elif isinstance(a, Show):
                self._events.put_nowait(a.msg)
            elif isinstance(a, (SendAck, SendStdin)):
                if not self._send(a):
                    break
            elif isinstance(a, Took):
                self._client.kick()
                self._ready.set()
                self._settled.set()
                self._credit.set()
            elif isinstance(a, Credit):
                self._credit.set()
            elif isinstance(a, Ended):
                self.end = a.end
                self._events.put_nowait(a.end)
                self._settle()
                last = True
            elif isinstance(a, Broken):
                last = self._fail(ClientError(ClientCode.PROTOCOL if a.code == PROTOCOL else a.code, a.message))
            elif isinstance(a, AttachLater):
                self._client.attach_later(self)
                last = True
        return last

    def _send(self, a: SendAck | SendStdin) -> bool:
        """Queue one frame on the connection, in order, without yielding (a resend and a new chunk
        can never swap). False if the connection is gone: what was sent stays kept for a resume."""
        assert self.run_id is not None
        msg: Message
        if isinstance(a, SendAck):
            msg = StreamAck(run_id=self.run_id, stream=a.stream, offset=a.offset, closed=a.closed, window=a.window)  # type: ignore[arg-type]
        else:
            msg = StreamData(run_id=self.run_id, stream="stdin", offset=a.offset, data=a.data, eof=a.eof)
        try:
            self._client.queue(msg, self.req_id)
        except ClientError:
            self._ready.clear()
            return False
        return True

    def on_cut(self) -> None:
        """The connection this run was attached on ended; the client is reconnecting. Everything
        received and sent is kept: the re-attachment says where to go on from."""
        self.follower.on_cut()
        self._ready.clear()
        self._settled.clear()

    def attach_request(self) -> list[StreamPosition]:
        """Where this handle stands on each output stream, for an `attach`."""
        return [
            StreamPosition(stream=name, offset=offset, consumed=consumed, window=window)  # type: ignore[arg-type]
            for name, offset, consumed, window in self.follower.resume_points()
        ]

    async def attached(self) -> None:
        """Return once the Mind answered this handle's attachment (`ClientError` if it refused)."""
        await self._settled.wait()
        if self._failed is not None:
            raise self._failed

    def fail(self, error: ClientError) -> None:
        """The run cannot be followed any more (the connection is gone for good)."""
        self._fail(error)

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
        A cut does not end it: what it sends meanwhile is kept, and the re-attachment resends it."""
        assert self.run_id is not None and self._stdin is not None
        f = self.follower
        async for data in chunks_of(self._stdin):
            while data:
                while (credit := f.stdin_credit()) <= 0:
                    if f.stdin_closed:
                        return
                    self._credit.clear()
                    await self._credit.wait()
                n = min(len(data), credit, limits.STREAM_CHUNK_MAX)
                self._act(f.send_stdin(data[:n]))
                data = data[n:]
                await self._client.flush_quietly()
        await self._ready.wait()
        self._act(f.close_stdin())
        await self._client.flush_quietly()

    async def _consumed(self, item: StreamData) -> None:
        actions = self.follower.consume(item.stream, len(item.data)) if item.data else []
        if actions:
            self._act(actions)
            await self._client.flush_quietly()

    # --- the caller's side ---

    @property
    def stdin_sent(self) -> int:
        """Bytes of stdin sent so far (what a resumed copy counts: nothing acknowledged is resent)."""
        stdin = self.follower.stdin
        return stdin.offset if stdin is not None else 0

    def events(self) -> AsyncIterator[RunEvent]:
        """The run's events in order: state changes, output (`StreamData` for a streamed run:
        every byte, in order, `eof` closing each stream), and last its `RunEnd`. Once the end was
        handed over, it stays: a later `events()` yields it alone and a later `wait()` returns it
        (before, a `wait()` after the events had been read waited for ever). A chunk counts as
        consumed when its consumer asks for the next event."""
        return _Events(self)

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
            self._act(self.follower.consume(self._handed.stream, len(self._handed.data)))
            self._handed = None
        self._act(self.follower.ack_all())  # what was handed over is acknowledged: the next consumer starts after it
        keep_s = await self._client.detach_run(self, keep)
        self.detached = True
        self._settle()
        while not self._events.empty():  # received, not handed over: the next consumer gets them
            self._events.get_nowait()
        self._events.put_nowait(StillRunning(self.run_id, keep_s))
        return keep_s


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


class _Events:
    """`RunHandle.events()`: an iterator object, not an async generator. A caller that stops at
    the end (`wait()` returns from inside its loop) leaves a generator suspended, and asyncio
    finalizes an abandoned async generator by waking its loop from "another thread" to close it
    in a task of its own: a write to the loop's self-pipe, one more turn and one more task for
    every call (found in the client's profile: a third of its socket writes). An object left
    behind is simply collected."""

    __slots__ = ("_handle", "_last", "_over")

    def __init__(self, handle: RunHandle) -> None:
        self._handle = handle
        self._last: RunEvent | None = None
        self._over = False
        """The end was handed over, or a failure raised: nothing more comes from this iterator."""

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> RunEvent:
        if self._over:
            raise StopAsyncIteration
        h, last = self._handle, self._last
        self._last = None
        if last is not None:
            if h._handed is not None:  # asked for the next: the chunk handed over last was taken
                h._handed = None
                await h._consumed(last)  # type: ignore[arg-type]
            if isinstance(last, RunEnd):
                self._over = True
                raise StopAsyncIteration
        item = await h._events.get()
        if isinstance(item, MindhandError | RunEnd):
            h._events.put_nowait(item)  # a later `wait()` says the same
        if isinstance(item, MindhandError):
            self._over = True
            raise item
        h._handed = item if isinstance(item, StreamData) else None
        self._last = item
        return item
