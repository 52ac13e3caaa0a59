"""The Python client: connect to the Mind, run tools on Hands, stream their events.

```python
async with await MindClient.connect(url, credential) as mc:
    end = await mc.exec("laptop", "exec", {"argv": ["uname", "-a"]}, timeout=30)
    print(end.state, end.exit_code, end.stdout.data)
```
Requests are pipelined on one connection: each gets its own envelope id, and a reader task (owned by
the client, cancelled by `close`) hands every frame to the session core (mind/client/session.py),
which checks it and routes each reply to the request it answers. A run's frames go to its
`RunHandle` (mind/client/run.py), which drives the stream endpoint of protocol/streams.py. This
module is the asyncio shell around those cores: the `websockets` connection, futures and queues;
the blocking fast path of `mind exec` (mind/client/blocking.py) is the other shell around the session.

Continuity (DESIGN §15): the client remembers how it connected. When its connection ends while
runs are live and the Mind's `welcome` announced a resume window, it reconnects (backoff with
jitter, mind/client/reconnect.py) within the window, authenticates afresh and re-attaches every live
run from where its streams stand; the runs' events go on in the same handles. A request in flight
at the cut fails with `closed` (its answer is lost), except the idempotent reads, which are asked
again on the new connection; a request made during the outage waits for it (within the window).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from mind.client import files
from mind.client import forward as tunnels
from mind.client import session as core
from mind.client.credentials import load_credential
from mind.client.dial import Dial, open_connection
from mind.client.reconnect import Backoff, retryable
from mind.client.run import RunEvent, RunFailed, RunHandle, Stdin, StillRunning
from mind.errors import ClientCode, ClientError
from protocol import frames, limits
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.envelope import decode as decode_envelope
from protocol.errors import ProtocolError
from protocol.ids import new_id
from protocol.io.batching import MAX_BATCH, write_frames
from protocol.messages import (
    PAGE_LIMIT_MAX,
    Attach,
    CancelRun,
    CancelRunResult,
    ConnectedNames,
    Detach,
    Detached,
    Exec,
    FleetOpen,
    FleetOpened,
    GetRecording,
    GetRun,
    GetStatus,
    HandInfo,
    HandsList,
    HandsSelected,
    ListHands,
    ListRecordings,
    ListRuns,
    Message,
    RecordingList,
    RecordingPage,
    RunEnd,
    RunInfo,
    RunList,
    SelectedHand,
    SelectHands,
    StatusReply,
    Streams,
    TaskCancelReply,
    TaskCancelRequest,
    TaskGet,
    TaskList,
    TaskListResult,
    TaskLogPage,
    TaskLogs,
    TaskRemoved,
    TaskRemoveRequest,
    TaskStart,
    TaskStartResult,
    TaskView,
    VerifyRecordings,
    VerifyResult,
    WhichConnected,
)
from protocol.states import RunState, TaskState

if TYPE_CHECKING:
    from mind.client.fleet import FleetRun

R = TypeVar("R", bound=Message)
CUT = frozenset({ClientCode.CLOSED, ErrorCode.SHUTDOWN})
"""How a request fails when its connection ends under it (`shutdown`: the Mind said it was stopping)."""


@dataclass(frozen=True)
class RunListing:
    """`mind runs`: the runs, and the Mind nodes that did not answer (their runs are not listed)."""

    runs: list[RunInfo]
    missing_nodes: list[str]


class MindClient:
    def __init__(
        self, ws: ClientConnection, session: core.ClientSession, dial: Dial | None = None, window: float = 0.0
    ) -> None:
        self._ws = ws
        self._session = session
        self.label = session.label
        self._dial = dial
        self.resume_window = window
        """Seconds the Mind keeps a run whose client went away (its `welcome` says; 0: none). A cut
        shorter than this is ridden out: the client reconnects and re-attaches its runs."""
        self._waiters: dict[str, asyncio.Future[Message]] = {}
        self._runs: dict[str, RunHandle] = {}
        """Envelope id -> the run whose events come under it (on the current connection)."""
        self._live: set[RunHandle] = set()
        """Runs this client follows, whichever connection they came on: what a reconnect re-attaches."""
        self._reader: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._closing = False
        self._cut_at: float | None = None
        """When the connection ended (monotonic): the window counts from there."""
        self._reconnect: asyncio.Task[None] | None = None
        self.reconnects = 0
        """Connections made again after a cut (0: this is the first)."""
        self._later: set[asyncio.Task[Any]] = set()  # flushes and delayed re-attachments this client owns
        self.group: str | None = None
        """A fleet id (`open_fleet`) every run this client starts is tagged with, unless it names its
        own: the many runs of one `mind cp` are listed by `mind runs` as one entry."""

    # --- connecting ---

    @property
    def tools(self) -> tuple[str, ...] | None:
        """The tool patterns this credential may call, as the Mind's `welcome` said (globs; None:
        a Mind that did not say). Informational: the Mind checks every request anyway."""
        return self._session.tools

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
        dial = Dial(url, credential, open_timeout, None if ca is None else os.fspath(ca), pin)
        ws, session, window = await open_connection(dial, open_timeout)
        self = cls(ws, session, dial, window)
        self._reader = asyncio.get_running_loop().create_task(self._read(ws, session))
        return self

    async def close(self) -> None:
        self._closing = True
        for task in (self._reconnect, *self._later):
            if task is not None:
                task.cancel()
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):  # closing anyway
                pass
        await self._ws.close()
        closed = ClientError(ClientCode.CLOSED, "the client was closed")
        for handle in list(self._live):
            handle.fail(closed)
        self._live.clear()

    async def __aenter__(self) -> MindClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """The connection is open now (False during an outage, while the client reconnects)."""
        return self._session.is_open

    @property
    def riding_out(self) -> bool:
        """Connected, or reconnecting after a cut: the live runs go on (a fleet keeps going)."""
        return self._session.is_open or (self._reconnect is not None and not self._reconnect.done())

    async def reconnect(self, within: float | None = None) -> None:
        """Make sure the connection is open: if it ended, connect again (backoff with jitter)
        until `within` seconds (default: the resume window) have passed since it ended, then
        re-attach every live run. `ClientError` if that fails: the last attempt's reason."""
        if self._session.is_open:
            return
        if self._closing:
            raise ClientError(ClientCode.CLOSED, "the client was closed")
        if self._dial is None:
            raise self._session.error or ClientError(ClientCode.CLOSED, "connection to the Mind closed")
        if self._reconnect is None or self._reconnect.done():
            if self._cut_at is None:
                self._cut_at = time.monotonic()
            bound = self.resume_window if within is None else within
            self._reconnect = asyncio.get_running_loop().create_task(self._redial(self._cut_at + bound))
        task = self._reconnect
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._closing:  # `close` stopped it, not our caller
                raise ClientError(ClientCode.CLOSED, "the client was closed") from None
            raise

    async def _redial(self, deadline: float) -> None:
        """Connect again before `deadline` (monotonic), or fail every live run: past the window
        nobody here can know how they end."""
        assert self._dial is not None
        backoff = Backoff(deadline)
        last: ClientError = self._session.error or ClientError(ClientCode.CLOSED, "connection to the Mind closed")
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.sleep(backoff.pause(time.monotonic()))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                ws, session, window = await open_connection(
                    self._dial, min(self._dial.open_timeout, max(remaining, 0.5))
                )
            except ClientError as exc:
                last = exc
                if not retryable(exc):
                    break
                continue
            self._ws, self._session, self.resume_window = ws, session, window
            self._cut_at = None
            self.reconnects += 1
            self._reader = asyncio.get_running_loop().create_task(self._read(ws, session))
            for handle in list(self._live):
                self._attach(handle)
            await self.flush_quietly()
            return
        self._cut_at = None  # a later `reconnect` counts afresh
        for handle in list(self._live):
            handle.fail(self._unknown_fate(handle, last))
        self._live.clear()
        raise last

    @staticmethod
    def _unknown_fate(handle: RunHandle, last: ClientError) -> ClientError:
        return ClientError(
            ClientCode.CLOSED,
            f"the connection to the Mind ended and could not be made again within the resume window "
            f"({last.message}): run {handle.run_id}'s fate is unknown here; `mind run get {handle.run_id}` "
            "tells once the Mind is reachable",
        )

    # --- plumbing ---

    def queue(self, msg: Message, id_: str) -> None:
        """Queue a frame of run `id_` on the connection, now, in order (`ClientError` if it is gone)."""
        self._session.send(msg, id_)

    def kick(self) -> None:
        """Write what is queued soon (from code that cannot await)."""
        task = asyncio.get_running_loop().create_task(self.flush_quietly())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def flush_quietly(self) -> None:
        """`_flush`, for frames whose loss a resume repairs (stream data, acknowledgements)."""
        try:
            await self._flush()
        except ClientError:
            pass

    async def _flush(self) -> None:
        """Write what the session queued, in its order (the lock keeps two writers from reordering
        frames the session numbered)."""
        async with self._send_lock:
            pending = self._session.frames_to_send()
            try:
                while pending:  # stream chunks as header and payload, framed and masked unjoined
                    await write_frames(self._ws, pending[:MAX_BATCH])
                    pending = pending[MAX_BATCH:]
            except ConnectionClosed:
                raise ClientError(ClientCode.CLOSED, "connection to the Mind closed") from None

    async def _read(self, ws: ClientConnection, session: core.ClientSession) -> None:
        """Every frame of one connection: checked by its session, replies to their requests, a
        run's frames to its handle. Owned by this client; ends with the connection."""
        error: ClientError | None = None
        try:
            async for data in ws:
                try:
                    env = session.chunk(data) if frames.is_frame(data) else decode_envelope(data)
                except ProtocolError:
                    events = session.receive_data(data)  # the session says what is wrong, and ends
                else:
                    events = [] if env is None or env.msg.TYPE == "stream_data" else session.receive_frame(env)
                    if env is not None and session.error is None and env.id is not None and env.id in self._runs:
                        handle = self._runs[env.id]
                        if handle.on_message(env.msg):  # its last frame under this id
                            self._runs.pop(env.id, None)
                            if not handle.live:
                                self._live.discard(handle)
                self._dispatch(events)
                if session.error is not None:
                    for ev in events:
                        if isinstance(ev, core.Closed) and ev.close_code is not None:
                            await ws.close(ev.close_code, ev.close_reason)
                    return
        except ConnectionClosed:
            pass
        finally:
            self._dispatch(session.connection_lost())
            error = session.error
            if session is self._session:
                self._cut(error or ClientError(ClientCode.CLOSED, "connection to the Mind closed"))

    def _cut(self, error: ClientError) -> None:
        """The connection ended. Runs whose id is known wait for a reconnect if the Mind keeps
        them (a window) and this client may dial again; any other run fails with `error`, as a
        request in flight does. A run whose start was cut before its answer fails too (nobody
        here knows whether it started), but the client reconnects for the runs that come next
        (a fleet goes on)."""
        starting = False
        for handle in self._runs.values():
            if handle.run_id is None:  # its `exec` may or may not have reached the Mind: nobody here knows
                starting = True
                handle.fail(error)
        self._runs.clear()
        self._live = {h for h in self._live if h.live}
        if self._closing or self.resume_window <= 0 or self._dial is None or not (self._live or starting):
            for handle in self._live:
                handle.fail(error)
            self._live.clear()
            return
        self._cut_at = time.monotonic()
        for handle in self._live:
            handle.on_cut()
        self._reconnect = asyncio.get_running_loop().create_task(self._redial(self._cut_at + self.resume_window))
        self._reconnect.add_done_callback(_retrieved)

    def _attach(self, handle: RunHandle) -> None:
        """Send `attach` for `handle` on the current connection, its events under a new id."""
        assert handle.run_id is not None
        id_ = new_id("a")
        handle.req_id = id_
        self._runs[id_] = handle
        try:
            self._session.send(Attach(run_id=handle.run_id, streams=handle.attach_request()), id_)
        except ClientError:
            self._runs.pop(id_, None)  # the connection is gone again: its cut re-attaches

    def attach_later(self, handle: RunHandle) -> None:
        """The Mind asked to wait (`resume_pending`: it has not heard from the run's Hand since it
        restarted): attach again shortly, within the window, unless the connection ends first."""
        deadline = time.monotonic() + max(self.resume_window, 1.0)

        async def again() -> None:
            backoff = Backoff(deadline)
            while deadline - time.monotonic() > 0:
                await asyncio.sleep(backoff.pause(time.monotonic()) + 0.1)
                if not handle.live:
                    return
                if self._session.is_open and not handle.attaching:
                    self._attach(handle)
                    await self.flush_quietly()
                    return
            handle.fail(ClientError(ErrorCode.RESUME_PENDING, f"run {handle.run_id} was not presented again in time"))

        task = asyncio.get_running_loop().create_task(again())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

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

    async def _ask(self, msg: Message, kind: type[R], *, read: bool = False) -> R:
        """A request whose one reply must be a `kind` (an `error` reply raises `ClientError`).
        During an outage it waits for the reconnect (within the window). `read`: it changes
        nothing, so one whose answer a cut lost is asked again on the new connection."""
        first_cut: float | None = None
        while True:
            if not self._session.is_open and self.resume_window > 0:
                await self.reconnect()
            id_ = self._session.request(msg, kind.TYPE)
            fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            self._waiters[id_] = fut
            try:
                await self._flush()
                reply = await fut
            except ClientError as exc:
                now = time.monotonic()
                first_cut = now if first_cut is None else first_cut
                if read and exc.code in CUT and not self._closing and now - first_cut < self.resume_window:
                    continue  # asked again on the new connection (a Mind that keeps dropping it: once per window)
                raise
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
        verify: bool = True,
        window: int = limits.STREAM_WINDOW,
    ) -> RunHandle:
        """Send the run; events (and its end) arrive on the returned handle. With `watch=False` the
        handle sees only the output and the end (fewer frames: faster calls). The run is named here
        (`handle.run_id` is set at once, where the Mind offers names: every Mind of this version).

        `stdin` (bytes, a binary file, or an async iterator of bytes; no size limit) becomes the
        command's standard input, ended when it is exhausted. `stream` (default: for `exec` and
        `shell`) sends the output as flow-controlled `StreamData` events, every byte in order,
        instead of droppable progress; iterate `events()` to read it. `verify` (default on): check
        the streamed bytes against the Hand's sha256 (`handle.delivery()`); a caller that checks
        its own digest (a copy) turns it off rather than hash every byte twice."""
        if stream is None:
            stream = tool in ("exec", "shell")
        if fleet is None:
            fleet = self.group
        if stdin is not None and not stream:
            raise ClientError(ClientCode.INVALID_REQUEST, "stdin= needs a streamed run (stream=True)")
        if not self._session.is_open and self.resume_window > 0:
            await self.reconnect()  # an outage: the run starts once the Mind is back (within the window)
        # Every run is named here (known at once: cancel, detach and a resume need no answer first).
        # A call is answered by its end alone; a streamed run hears its `stream_numbers` first.
        named = self._session.name_run()
        req = Exec(
            hand=hand,
            tool=tool,
            args=args,
            timeout_ms=max(1, int(timeout * 1000)),
            grace_ms=None if grace is None else int(grace * 1000),
            streams=Streams(stdin=stdin is not None, output_limit=output_limit, window=window) if stream else None,
            watch=watch,
            fleet=fleet,
            run_id=named,
        )
        id_ = new_id("x")
        self._session.send(req, id_)  # `ClientError` if the connection is gone
        handle = RunHandle(
            self, id_, stdin, window=window, streams=("stdout", "stderr") if stream else (), digest=verify, named=named
        )
        self._runs[id_] = handle
        self._live.add(handle)
        try:
            await self._flush()
        except ClientError:
            self._runs.pop(id_, None)
            self._live.discard(handle)
            raise
        return handle

    async def attach(self, run_id: str, *, window: int = limits.STREAM_WINDOW) -> RunHandle:
        """Take over run `run_id`, started by any client of this one's identity (only the run's
        owner may; the newest attachment wins and the previous one fails with `replaced`). The
        handle's output starts where the previous consumer's acknowledgements left it (nothing it
        handed over comes again, nothing after is missing), and it ends with the run's real end:
        the retained one if the run already ended. `window`: the run's stream window, if it was
        opened with another than the default. Raises `ClientError` (`unknown_run`, `not_allowed`,
        `denied_by_scope`) if the run cannot be attached."""
        if not self._session.is_open and self.resume_window > 0:
            await self.reconnect()
        handle = RunHandle(self, "", window=window, run_id=run_id)
        self._live.add(handle)
        self._attach(handle)
        if handle.req_id not in self._runs:
            self._live.discard(handle)
            raise self._session.error or ClientError(ClientCode.CLOSED, "connection to the Mind closed")
        try:
            await self._flush()
        except ClientError:
            self._runs.pop(handle.req_id, None)
            self._live.discard(handle)
            raise
        await handle.attached()
        return handle

    async def detach_run(self, handle: RunHandle, keep: float | None) -> float:
        """`handle.detach`: the Mind keeps the run unattended; this client stops following it."""
        assert handle.run_id is not None
        if keep is not None and keep <= 0:
            raise ClientError(ClientCode.INVALID_REQUEST, "keep= must be a positive number of seconds")
        reply = await self._ask(Detach(run_id=handle.run_id, keep_s=keep), Detached)
        self._runs.pop(handle.req_id, None)
        self._live.discard(handle)
        return reply.keep_s

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
        wait: float | None = None,
        keep: float | None = None,
    ) -> RunEnd:
        """Run and wait for the end. Output reaches `on_event` (as `StreamData`, every byte, when
        streamed); the end carries bounded tails, byte counts and the sha256 of what was sent.
        `timeout` (seconds, default 3600 as `mind exec`, at most 24 h) is the run's deadline on the
        Hand: past it the tree is killed and the run ends `timed_out`. `wait` (seconds) bounds the
        wait instead: past it the run is detached and goes on (kept for the Mind's resume window, or
        `keep` seconds) and `StillRunning` is raised, naming it for `attach`."""
        handle = await self.start(hand, tool, args, timeout, grace, watch=watch, stdin=stdin, stream=stream)
        return await handle.wait(on_event, timeout=wait, keep=keep)

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

    # --- tunnels (mind/client/forward.py: each accepted connection one `forward` run) ---

    def forward(
        self,
        hand: str,
        spec: str | tunnels.ForwardSpec | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        path: str | None = None,
        local_port: int = 0,
        bind: str = tunnels.DEFAULT_BIND,
        on_error: Callable[[str], None] | None = None,
        on_closed: Callable[[tunnels.ForwardConnection], None] | None = None,
    ) -> AbstractAsyncContextManager[tunnels.LocalForward]:
        """A local port forward through `hand`, as `ssh -L`: `spec` is `[BIND:]PORT:HOST:HOSTPORT`
        or `[BIND:]PORT:/PATH` (a Unix socket in the Hand's root), or give the fields (`host` and
        `port`, or `path`; `local_port` 0 picks a free one, `bind` defaults to 127.0.0.1). An async
        context manager: on entry the Hand is asked whether it allows the destination (`ForwardError`
        if not, before anything listens), then the forward listens; it yields the `LocalForward`
        (`.address`: the (host, port) bound). `on_error(line)`: a connection that failed. A bad
        spec raises `ValueError` at once."""
        fields = tunnels.make_spec(spec, host=host, port=port, path=path, local_port=local_port, bind=bind)
        return tunnels.open_forward(self, hand, fields, on_error=on_error, on_closed=on_closed)

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
        return await self._ask(GetRun(run_id=run_id), RunInfo, read=True)

    async def list_runs(
        self,
        hand: str | None = None,
        state: RunState | None = None,
        since: float | None = None,
        limit: int = 100,
        fleet: str | None = None,
        unattended: bool = False,
    ) -> list[RunInfo]:
        """The newest `limit` runs of the history (any number), fetched page by page: the Mind
        bounds each reply in count and bytes and says where the next page starts. `unattended`:
        only runs going on with a leg away (detached, client gone, or Hand away: DESIGN §15).
        With Mind nodes sharing a database, every live node's runs (`run_listing` also says which
        nodes did not answer)."""
        listing = await self.run_listing(hand, state, since, limit, fleet, unattended)
        return listing.runs

    async def run_listing(
        self,
        hand: str | None = None,
        state: RunState | None = None,
        since: float | None = None,
        limit: int = 100,
        fleet: str | None = None,
        unattended: bool = False,
    ) -> RunListing:
        """`list_runs`, and the Mind nodes whose runs are missing from it because they did not
        answer in time (DESIGN §16: the listing is partial; empty on one Mind)."""
        out: list[RunInfo] = []
        missing: list[str] = []
        after: str | None = None
        while len(out) < limit:
            want = min(limit - len(out), PAGE_LIMIT_MAX)
            reply = await self._ask(
                ListRuns(
                    hand=hand, state=state, since=since, limit=want, after=after, fleet=fleet, unattended=unattended
                ),
                RunList,
                read=True,
            )
            out += reply.runs[:want]
            missing += [n for n in reply.missing_nodes if n not in missing]
            if reply.next_after is None or reply.next_after == after:  # (a cursor that does not move ends it)
                break
            after = reply.next_after
        return RunListing(out, missing)

    async def status(self) -> StatusReply:
        return await self._ask(GetStatus(), StatusReply)

    # --- recordings (DESIGN §19) ---

    async def list_recordings(
        self,
        hand: str | None = None,
        client: str | None = None,
        since: float | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> RecordingList:
        """One page of the recordings this client may read, newest first."""
        msg = ListRecordings(hand=hand, client=client, since=since, limit=limit, after=after)
        return await self._ask(msg, RecordingList, read=True)

    async def get_recording(self, run_id: str, after: int = -1) -> RecordingPage:
        """The blocks of `run_id`'s recording after block `after`, as stored (decode with
        `mind.core.recording.unpack`); `more`: ask again at once."""
        return await self._ask(GetRecording(run_id=run_id, after=after), RecordingPage, read=True)

    async def verify_recordings(self, run_id: str | None = None) -> VerifyResult:
        """The Mind's check of one recording, or of every one this client may read."""
        return await self._ask(VerifyRecordings(run_id=run_id), VerifyResult, read=True)

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
        return await self._ask(TaskGet(task_id=task_id), TaskView, read=True)

    async def task_logs(
        self, task_id: str, offset: int = 0, limit: int = 64 << 10, stream: Literal["stdout", "stderr"] | None = None
    ) -> TaskLogPage:
        """One page of a task's log: the combined log (both streams in arrival order) or, with
        `stream`, that stream's own file, `offset` counting its bytes (`ClientError` code
        `no_stream_log` for a task logged before the Hand kept them apart)."""
        req = TaskLogs(task_id=task_id, offset=offset, limit=limit, stream=stream)
        return await self._ask(req, TaskLogPage, read=True)

    async def task_cancel(self, task_id: str) -> TaskCancelReply:
        return await self._ask(TaskCancelRequest(task_id=task_id), TaskCancelReply)

    async def task_remove(self, task_id: str) -> TaskRemoved:
        """Forget a finished task: its row and log on its Hand, then the Mind's snapshot, so it no
        longer counts against the Hand's retention quota. `ClientError` if it may not go: code
        `unknown_task`, `not_allowed` (it has not ended: cancel it first), `hand_offline` (its
        Hand must be connected: the row and the log live there)."""
        return await self._ask(TaskRemoveRequest(task_id=task_id), TaskRemoved)

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


__all__ = ["MindClient", "RunHandle", "ClientError", "RunFailed", "StillRunning", "load_credential", "ErrorCode"]


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A background reconnect's failure is told to the runs it fails (and to whoever awaits it):
    retrieving it here keeps asyncio from reporting it as never retrieved."""
    if not task.cancelled():
        task.exception()
