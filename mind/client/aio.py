"""The Python client: connect to the Mind, run tools on Hands, stream their events.

```python
async with await MindClient.connect(url, credential) as mc:
    end = await mc.exec("laptop", "exec", {"argv": ["uname", "-a"]}, timeout=30)
    print(end.state, end.exit_code, end.stdout.data)
```
Requests are pipelined on one connection: each gets its own envelope id, and a reader task (owned by
the client, cancelled by `close`) hands every frame to the session core (mind/client/session.py),
which routes it to the request or run it belongs to. This module is the asyncio shell around that
core: the `websockets` connection, futures and queues; the blocking fast path of `mind exec`
(mind/client/blocking.py) is the other shell around the same core.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from mind.client import files
from mind.client import session as core
from mind.client.credentials import load_credential
from mind.client.endpoint import check_pin, parse_url, tls_context, unreachable, verification_failed
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError
from protocol.messages import (
    PAGE_LIMIT_MAX,
    CancelRun,
    CancelRunResult,
    ConnectedNames,
    Exec,
    FleetOpen,
    FleetOpened,
    GetRun,
    GetStatus,
    HandInfo,
    HandsList,
    HandsSelected,
    ListHands,
    ListRuns,
    Message,
    RunEnd,
    RunInfo,
    RunList,
    RunOutput,
    RunUpdate,
    SelectedHand,
    SelectHands,
    StatusReply,
    StreamAck,
    StreamData,
    Streams,
    TaskCancelReply,
    TaskCancelRequest,
    TaskGet,
    TaskList,
    TaskListResult,
    TaskLogPage,
    TaskLogs,
    TaskStart,
    TaskStartResult,
    TaskView,
    WhichConnected,
)
from protocol.states import RunState, TaskState
from protocol.streams import Receiver, Sender

if TYPE_CHECKING:
    from mind.client.fleet import FleetRun


class RunFailed(ClientError):
    def __init__(self, end: RunEnd) -> None:
        why = end.error or end.reason or end.state.value
        super().__init__(ClientCode(end.state.value), f"run {end.run_id} on {end.hand} ended {end.state.value}: {why}")
        self.end = end


RunEvent = RunUpdate | RunOutput | StreamData | RunEnd
R = TypeVar("R", bound=Message)
Stdin = bytes | BinaryIO | AsyncIterable[bytes]
"""What `MindClient.start(stdin=...)` sends as the run's standard input: all of it, any size."""


class RunHandle:
    """One run in flight: iterate its events, await its end, or request a cancel."""

    def __init__(self, client: MindClient, req_id: str, stdin: Stdin | None = None) -> None:
        self._client = client
        self.req_id = req_id
        self.run_id: str | None = None
        self._events: asyncio.Queue[RunEvent | ClientError] = asyncio.Queue()
        self._id_known = asyncio.Event()
        self._failed: ClientError | None = None
        self.end: RunEnd | None = None
        self._rx: dict[str, Receiver] = {}
        """Output streams: a chunk counts as consumed once `events()` has handed it over, so a
        caller that reads slowly slows the remote command instead of filling memory."""
        self._stdin = stdin
        self._tx = Sender()
        self._credit = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None

    def _feed(self, item: Message | ClientError) -> None:
        if isinstance(item, StreamAck):
            if item.stream == "stdin":
                try:
                    self._tx.on_ack(item.offset)
                except ProtocolError:
                    pass
                if item.closed:
                    self._tx.eof = True  # the command closed its stdin: nothing more is wanted
                self._credit.set()
            return
        if isinstance(item, StreamData):
            rx = self._rx.setdefault(item.stream, Receiver())
            try:
                rx.on_data(item.offset, len(item.data), item.eof)
            except ProtocolError as exc:
                item = ClientError(ClientCode.PROTOCOL, f"stream {item.stream}: {exc.message}")
        if isinstance(item, ClientError):
            self._failed = item
            self._id_known.set()  # a `cancel` waiting for the id learns there is nothing to cancel
        elif self.run_id is None:
            self.run_id = item.run_id  # type: ignore[attr-defined]
            self._id_known.set()
            if self._stdin is not None and self._pump is None:
                self._pump = asyncio.get_running_loop().create_task(self._send_stdin())
        if isinstance(item, RunEnd):
            self.end = item
            self._stop_pump()
        elif isinstance(item, ClientError):
            self._stop_pump()
        self._events.put_nowait(item)  # type: ignore[arg-type]

    def _stop_pump(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    async def _send_stdin(self) -> None:
        """The run's stdin, within the credit the Hand grants; then its end. Owned by this handle
        (cancelled when the run ends: a command that never reads stdin never blocks its result)."""
        assert self.run_id is not None and self._stdin is not None
        try:
            async for data in _chunks(self._stdin):
                while data:
                    while self._tx.credit() == 0 and not self._tx.eof:
                        self._credit.clear()
                        await self._credit.wait()
                    if self._tx.eof:
                        return
                    n = min(len(data), self._tx.credit(), limits.STREAM_CHUNK_MAX)
                    offset = self._tx.take(n)
                    await self._client._stream(
                        StreamData(run_id=self.run_id, stream="stdin", offset=offset, data=data[:n]), self.req_id
                    )
                    data = data[n:]
            if not self._tx.eof:
                await self._client._stream(
                    StreamData(run_id=self.run_id, stream="stdin", offset=self._tx.close(), eof=True), self.req_id
                )
        except ClientError:
            return  # the connection is gone: the run's own end says so

    async def _consumed(self, item: StreamData) -> None:
        rx = self._rx.get(item.stream)
        if rx is None or self.run_id is None or not item.data:
            return
        rx.consume(len(item.data))
        offset = rx.ack_due()
        if offset is not None and self.end is None:
            try:
                await self._client._stream(
                    StreamAck(run_id=self.run_id, stream=item.stream, offset=offset), self.req_id
                )
            except ClientError:
                pass

    @property
    def stdin_sent(self) -> int:
        """Bytes of stdin sent so far (what a resumed copy counts: nothing acknowledged is resent)."""
        return self._tx.offset

    async def events(self) -> AsyncIterator[RunEvent]:
        """The run's events in order: state changes, output (`StreamData` for a streamed run:
        every byte, in order, `eof` closing each stream), and last its `RunEnd`."""
        while True:
            item = await self._events.get()
            if isinstance(item, ClientError):
                raise item
            yield item
            if isinstance(item, StreamData):
                await self._consumed(item)
            if isinstance(item, RunEnd):
                return

    async def wait(self, on_event: Callable[[RunEvent], None] | None = None) -> RunEnd:
        async for ev in self.events():
            if on_event is not None:
                on_event(ev)
            if isinstance(ev, RunEnd):
                return ev
        raise ClientError(ErrorCode.INTERNAL_ERROR, "event stream ended without run_end")  # pragma: no cover

    async def cancel(self) -> CancelRunResult:
        await self._id_known.wait()
        if self.run_id is None:
            assert self._failed is not None
            raise self._failed
        return await self._client.cancel(self.run_id)


class MindClient:
    def __init__(self, ws: ClientConnection, session: core.ClientSession) -> None:
        self._ws = ws
        self._session = session
        self.label = session.label
        self._waiters: dict[str, asyncio.Future[Message]] = {}
        self._runs: dict[str, RunHandle] = {}
        self._reader: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()

    # --- connecting ---

    @classmethod
    async def connect(
        cls,
        url: str,
        credential: Credential,
        *,
        open_timeout: float = 10.0,
        ca: str | os.PathLike[str] | None = None,
        pin: str | None = None,
    ) -> MindClient:
        """Connect and authenticate. `wss://` URLs are verified (system trust or `ca`), and the
        certificate must match `pin` if given, before the credential is used at all."""
        session = core.ClientSession(credential, os.urandom(limits.NONCE_BYTES))
        parse_url(url)  # refused as the fast path refuses it, before websockets reads it
        ssl_ctx = tls_context(url, None if ca is None else os.fspath(ca), pin)
        try:
            ws = await connect(
                url,
                compression=None,
                max_size=limits.MAX_FRAME_BYTES,
                open_timeout=open_timeout,
                ping_interval=20,
                ping_timeout=20,
                close_timeout=2,
                ssl=ssl_ctx,
            )
        except ssl.SSLCertVerificationError as exc:
            raise verification_failed(url, exc) from None
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ValueError) as exc:  # ValueError: a bad port
            raise unreachable(url, exc) from None
        try:
            check_pin(ws.transport.get_extra_info("ssl_object"), pin)
            await cls._handshake(ws, session)
        except BaseException:
            await ws.close()
            raise
        self = cls(ws, session)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    @staticmethod
    async def _handshake(ws: ClientConnection, session: core.ClientSession) -> None:
        """Feed the session until it is open (or raise why not), within the handshake deadline."""
        try:
            async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
                while True:
                    try:
                        for frame in session.data_to_send():
                            await ws.send(frame)
                    except ConnectionClosed:
                        pass  # refused before it read ours (busy, rate limited): its reason is queued
                    try:
                        events = session.receive_data(await ws.recv())
                    except ConnectionClosed as exc:
                        events = session.connection_lost(ClientError(ClientCode.CLOSED, str(exc)))
                    for ev in events:
                        if isinstance(ev, core.Closed):
                            raise ev.error
                        if isinstance(ev, core.Opened):
                            return
        except TimeoutError:
            session.handshake_timed_out()
            assert session.error is not None
            raise session.error from None

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):  # closing anyway
                pass
        await self._ws.close()

    async def __aenter__(self) -> MindClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ---

    async def _stream(self, msg: Message, id_: str) -> None:
        """A stream frame of the run under envelope `id_` (no answer comes for it)."""
        self._session.send(msg, id_)
        await self._flush()

    async def _flush(self) -> None:
        """Write what the session queued, in its order (the lock keeps two writers from reordering
        frames the session numbered)."""
        async with self._send_lock:
            for frame in self._session.data_to_send():
                try:
                    await self._ws.send(frame)
                except ConnectionClosed:
                    raise ClientError(ClientCode.CLOSED, "connection to the Mind closed") from None

    async def _read(self) -> None:
        try:
            async for data in self._ws:
                events = self._session.receive_data(data)
                self._dispatch(events)
                if self._session.error is not None:
                    for ev in events:
                        if isinstance(ev, core.Closed) and ev.close_code is not None:
                            await self._ws.close(ev.close_code, ev.close_reason)
                    return
        except ConnectionClosed:
            pass
        finally:
            self._dispatch(self._session.connection_lost())

    def _dispatch(self, events: list[core.Event]) -> None:
        for ev in events:
            if isinstance(ev, core.Reply):
                fut = self._waiters.pop(ev.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.msg)
            elif isinstance(ev, core.Failed):
                fut = self._waiters.pop(ev.id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(ev.error)
                run = self._runs.pop(ev.id, None)
                if run is not None:
                    run._feed(ev.error)
            elif isinstance(ev, (core.RunEvent, core.RunEnded)):
                run = self._runs.get(ev.id) if isinstance(ev, core.RunEvent) else self._runs.pop(ev.id, None)
                if run is not None:
                    run._feed(ev.msg)

    async def _ask(self, msg: Message, kind: type[R]) -> R:
        """A request whose one reply must be a `kind` (an `error` reply raises `ClientError`)."""
        id_ = self._session.request(msg, kind.TYPE)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiters[id_] = fut
        try:
            await self._flush()
            reply = await fut
        finally:
            if self._waiters.pop(id_, None) is not None:  # given up on (cancelled) or not sent
                self._session.forget(id_)
        assert isinstance(reply, kind)  # the session checked its type
        return reply

    # --- API ---

    async def start(
        self,
        hand: str,
        tool: str,
        args: dict[str, Any],
        timeout: float = limits.RUN_TIMEOUT_DEFAULT_S,
        grace: float | None = None,
        watch: bool = True,
        *,
        stdin: Stdin | None = None,
        stream: bool | None = None,
        output_limit: int = limits.OUTPUT_LIMIT_DEFAULT,
        fleet: str | None = None,
    ) -> RunHandle:
        """Send the run; events (and its end) arrive on the returned handle. With `watch=False` the
        handle sees only `admitted`, the output and the end (fewer frames: faster calls).

        `stdin` (bytes, a binary file, or an async iterator of bytes; no size limit) becomes the
        command's standard input, ended when it is exhausted. `stream` (default: for `exec` and
        `shell`) sends the output as flow-controlled `StreamData` events, every byte in order,
        instead of droppable progress; iterate `events()` to read it."""
        if stream is None:
            stream = tool in ("exec", "shell")
        if stdin is not None and not stream:
            raise ClientError(ClientCode.INVALID_REQUEST, "stdin= needs a streamed run (stream=True)")
        req = Exec(
            hand=hand,
            tool=tool,
            args=args,
            timeout_ms=max(1, int(timeout * 1000)),
            grace_ms=None if grace is None else int(grace * 1000),
            streams=Streams(stdin=stdin is not None, output_limit=output_limit) if stream else None,
            watch=watch,
            fleet=fleet,
        )
        id_ = self._session.start_run(req)
        handle = RunHandle(self, id_, stdin)
        self._runs[id_] = handle
        try:
            await self._flush()
        except ClientError:
            self._runs.pop(id_, None)
            self._session.forget(id_)
            raise
        return handle

    async def exec(
        self,
        hand: str,
        tool: str,
        args: dict[str, Any],
        timeout: float = limits.RUN_TIMEOUT_DEFAULT_S,
        grace: float | None = None,
        on_event: Callable[[RunEvent], None] | None = None,
        watch: bool = False,
        *,
        stdin: Stdin | None = None,
        stream: bool | None = None,
    ) -> RunEnd:
        """Run and wait for the end. Output reaches `on_event` (as `StreamData`, every byte, when
        streamed); the end carries bounded tails, byte counts and the sha256 of what was sent.
        `timeout` (seconds, default 3600 as `mind exec`, at most 24 h) is the run's deadline on the
        Hand: past it the tree is killed and the run ends `timed_out`."""
        handle = await self.start(hand, tool, args, timeout, grace, watch=watch, stdin=stdin, stream=stream)
        return await handle.wait(on_event)

    async def call(self, hand: str, tool: str, args: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        """Run a tool and return its value; anything but `succeeded` raises `RunFailed`. The
        default `timeout` is `mind call`'s, 60 s (a tool call, not a long command)."""
        end = await self.exec(hand, tool, args or {}, timeout)
        if end.state is not RunState.SUCCEEDED:
            raise RunFailed(end)
        return end.value

    async def cancel(self, run_id: str) -> CancelRunResult:
        return await self._ask(CancelRun(run_id=run_id), CancelRunResult)

    # --- files (mind/client/files.py: streamed, verified, atomic, resumable) ---

    async def upload(self, hand: str, local: str | os.PathLike[str], remote: str, **kw: Any) -> files.CopyResult:
        """Copy a local file to `remote` (relative to the Hand's root); see `files.upload`."""
        return await files.upload(self, hand, local, remote, **kw)

    async def download(self, hand: str, remote: str, local: str | os.PathLike[str], **kw: Any) -> files.CopyResult:
        """Copy `remote` on the Hand to a local file; see `files.download`."""
        return await files.download(self, hand, remote, local, **kw)

    async def upload_bytes(
        self, hand: str, data: bytes | AsyncIterable[bytes], remote: str, **kw: Any
    ) -> files.CopyResult:
        return await files.upload_bytes(self, hand, data, remote, **kw)

    def download_iter(self, hand: str, remote: str, **kw: Any) -> AsyncIterator[bytes]:
        """The verified bytes of `remote`, chunk by chunk; see `files.download_iter`."""
        return files.download_iter(self, hand, remote, **kw)

    async def hands(self) -> list[HandInfo]:
        """Every Hand the Mind knows, by name, fetched page by page (each reply is bounded)."""
        out: list[HandInfo] = []
        after: str | None = None
        while True:
            reply = await self._ask(ListHands(after=after), HandsList)
            out += reply.hands
            if reply.next_after is None or reply.next_after == after:
                return out
            after = reply.next_after

    async def select_hands(self, selector: str) -> list[SelectedHand]:
        """The Hands a fleet selector names (DESIGN §12), as the Mind resolves it: over its own
        names and labels, within this client's scope, with who is connected now."""
        out: list[SelectedHand] = []
        after: str | None = None
        while True:
            reply = await self._ask(SelectHands(selector=selector, after=after), HandsSelected)
            out += reply.hands
            if reply.next_after is None or reply.next_after == after:
                return out
            after = reply.next_after

    async def which_connected(self, names: list[str]) -> set[str]:
        """Which of `names` are connected now (and in this client's scope): one lookup per name on
        the Mind, asked in pages of 1,000, for any number of names (issue 23)."""
        out: set[str] = set()
        for i in range(0, len(names), 1000):
            reply = await self._ask(WhichConnected(names=names[i : i + 1000]), ConnectedNames)
            out.update(reply.names)
        return out

    async def open_fleet(self) -> str:
        """A fleet id minted by the Mind for this client: only its runs can be members."""
        return (await self._ask(FleetOpen(), FleetOpened)).fleet

    def exec_many(self, selector: str, tool: str, args: dict[str, Any], **options: Any) -> FleetRun:
        """One tool call on every Hand `selector` names, with rate control and an error budget
        (mind/client/fleet.py: the options, the events and the aggregate). Iterate the returned
        `FleetRun` for per-Hand events; the last one carries the aggregate."""
        from mind.client.fleet import FleetRun

        return FleetRun(self, selector, tool, args, **options)

    async def get_run(self, run_id: str) -> RunInfo:
        return await self._ask(GetRun(run_id=run_id), RunInfo)

    async def list_runs(
        self,
        hand: str | None = None,
        state: RunState | None = None,
        since: float | None = None,
        limit: int = 100,
        fleet: str | None = None,
    ) -> list[RunInfo]:
        """The newest `limit` runs of the history (any number), fetched page by page: the Mind
        bounds each reply in count and bytes and says where the next page starts."""
        out: list[RunInfo] = []
        after: str | None = None
        while len(out) < limit:
            want = min(limit - len(out), PAGE_LIMIT_MAX)
            reply = await self._ask(
                ListRuns(hand=hand, state=state, since=since, limit=want, after=after, fleet=fleet), RunList
            )
            out += reply.runs[:want]
            if reply.next_after is None or reply.next_after == after:  # (a cursor that does not move ends it)
                break
            after = reply.next_after
        return out

    async def status(self) -> StatusReply:
        return await self._ask(GetStatus(), StatusReply)

    # --- background tasks ---

    async def task_start(
        self,
        hand: str,
        tool: str,
        args: dict[str, Any],
        max_runtime: float = 24 * 3600.0,
        task_id: str | None = None,
    ) -> TaskStartResult:
        """Start a durable task. `outcome` says `accepted` (the Hand committed it), `duplicate`,
        `rejected` (with a code; nothing stored) or `unknown` (no answer came)."""
        ms = max(1, int(max_runtime * 1000))
        req = TaskStart(hand=hand, tool=tool, args=args, max_runtime_ms=ms, task_id=task_id)
        return await self._ask(req, TaskStartResult)

    async def task_get(self, task_id: str) -> TaskView:
        return await self._ask(TaskGet(task_id=task_id), TaskView)

    async def task_logs(
        self, task_id: str, offset: int = 0, limit: int = 64 << 10, stream: Literal["stdout", "stderr"] | None = None
    ) -> TaskLogPage:
        """One page of a task's log: the combined log (both streams in arrival order) or, with
        `stream`, that stream's own file, `offset` counting its bytes (`ClientError` code
        `no_stream_log` for a task logged before the Hand kept them apart)."""
        return await self._ask(TaskLogs(task_id=task_id, offset=offset, limit=limit, stream=stream), TaskLogPage)

    async def task_cancel(self, task_id: str) -> TaskCancelReply:
        return await self._ask(TaskCancelRequest(task_id=task_id), TaskCancelReply)

    async def task_list(
        self, hand: str | None = None, state: TaskState | None = None, limit: int = 1000
    ) -> list[TaskView]:
        """The newest `limit` tasks (any number), fetched page by page (each reply is bounded)."""
        out: list[TaskView] = []
        after: str | None = None
        while len(out) < limit:
            want = min(limit - len(out), PAGE_LIMIT_MAX)
            reply = await self._ask(TaskList(hand=hand, state=state, limit=want, after=after), TaskListResult)
            out += reply.tasks[:want]
            if reply.next_after is None or reply.next_after == after:  # (a cursor that does not move ends it)
                break
            after = reply.next_after
        return out


__all__ = ["MindClient", "RunHandle", "ClientError", "RunFailed", "load_credential", "ErrorCode"]


async def _chunks(stdin: Stdin) -> AsyncIterator[bytes]:
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
