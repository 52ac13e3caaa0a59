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
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from mind.client import session as core
from mind.client.credentials import load_credential
from mind.client.endpoint import check_pin, parse_url, tls_context, unreachable, verification_failed
from mind.errors import ClientError
from protocol import limits
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.messages import (
    CancelRun,
    CancelRunResult,
    Exec,
    GetRun,
    GetStatus,
    HandInfo,
    HandsList,
    ListHands,
    ListRuns,
    Message,
    RunEnd,
    RunInfo,
    RunList,
    RunOutput,
    RunUpdate,
    StatusReply,
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
)
from protocol.states import RunState, TaskState


class RunFailed(ClientError):
    def __init__(self, end: RunEnd) -> None:
        why = end.error or end.reason or end.state.value
        super().__init__(end.state.value, f"run {end.run_id} on {end.hand} ended {end.state.value}: {why}")
        self.end = end


RunEvent = RunUpdate | RunOutput | RunEnd
R = TypeVar("R", bound=Message)


class RunHandle:
    """One run in flight: iterate its events, await its end, or request a cancel."""

    def __init__(self, client: MindClient, req_id: str) -> None:
        self._client = client
        self.req_id = req_id
        self.run_id: str | None = None
        self._events: asyncio.Queue[RunEvent | ClientError] = asyncio.Queue()
        self._id_known = asyncio.Event()
        self._failed: ClientError | None = None
        self.end: RunEnd | None = None

    def _feed(self, item: RunEvent | ClientError) -> None:
        if isinstance(item, ClientError):
            self._failed = item
            self._id_known.set()  # a `cancel` waiting for the id learns there is nothing to cancel
        elif self.run_id is None:
            self.run_id = item.run_id
            self._id_known.set()
        if isinstance(item, RunEnd):
            self.end = item
        self._events.put_nowait(item)

    async def events(self) -> AsyncIterator[RunEvent]:
        while True:
            item = await self._events.get()
            if isinstance(item, ClientError):
                raise item
            yield item
            if isinstance(item, RunEnd):
                return

    async def wait(self, on_event: Callable[[RunEvent], None] | None = None) -> RunEnd:
        async for ev in self.events():
            if on_event is not None:
                on_event(ev)
            if isinstance(ev, RunEnd):
                return ev
        raise ClientError("internal_error", "event stream ended without run_end")  # pragma: no cover

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
                        events = session.connection_lost(ClientError("closed", str(exc)))
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

    async def _flush(self) -> None:
        """Write what the session queued, in its order (the lock keeps two writers from reordering
        frames the session numbered)."""
        async with self._send_lock:
            for frame in self._session.data_to_send():
                try:
                    await self._ws.send(frame)
                except ConnectionClosed:
                    raise ClientError("closed", "connection to the Mind closed") from None

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
        timeout: float = 60.0,
        grace: float | None = None,
        watch: bool = True,
    ) -> RunHandle:
        """Send the run; events (and its end) arrive on the returned handle. With `watch=False` the
        handle sees only `admitted`, the output and the end (fewer frames: faster calls)."""
        req = Exec(
            hand=hand,
            tool=tool,
            args=args,
            timeout_ms=max(1, int(timeout * 1000)),
            grace_ms=None if grace is None else int(grace * 1000),
            watch=watch,
        )
        id_ = self._session.start_run(req)
        handle = RunHandle(self, id_)
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
        timeout: float = 60.0,
        grace: float | None = None,
        on_event: Callable[[RunEvent], None] | None = None,
        watch: bool = False,
    ) -> RunEnd:
        handle = await self.start(hand, tool, args, timeout, grace, watch=watch)
        return await handle.wait(on_event)

    async def call(self, hand: str, tool: str, args: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        """Run a tool and return its value; anything but `succeeded` raises `RunFailed`."""
        end = await self.exec(hand, tool, args or {}, timeout)
        if end.state is not RunState.SUCCEEDED:
            raise RunFailed(end)
        return end.value

    async def cancel(self, run_id: str) -> CancelRunResult:
        return await self._ask(CancelRun(run_id=run_id), CancelRunResult)

    async def hands(self) -> list[HandInfo]:
        return (await self._ask(ListHands(), HandsList)).hands

    async def get_run(self, run_id: str) -> RunInfo:
        return await self._ask(GetRun(run_id=run_id), RunInfo)

    async def list_runs(
        self, hand: str | None = None, state: RunState | None = None, since: float | None = None, limit: int = 100
    ) -> list[RunInfo]:
        return (await self._ask(ListRuns(hand=hand, state=state, since=since, limit=limit), RunList)).runs

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

    async def task_logs(self, task_id: str, offset: int = 0, limit: int = 64 << 10) -> TaskLogPage:
        return await self._ask(TaskLogs(task_id=task_id, offset=offset, limit=limit), TaskLogPage)

    async def task_cancel(self, task_id: str) -> TaskCancelReply:
        return await self._ask(TaskCancelRequest(task_id=task_id), TaskCancelReply)

    async def task_list(
        self, hand: str | None = None, state: TaskState | None = None, limit: int = 1000
    ) -> list[TaskView]:
        return (await self._ask(TaskList(hand=hand, state=state, limit=limit), TaskListResult)).tasks


__all__ = ["MindClient", "RunHandle", "ClientError", "RunFailed", "load_credential", "ErrorCode"]
