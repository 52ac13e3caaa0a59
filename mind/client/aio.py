"""The Python client: connect to the Mind, run tools on Hands, stream their events.

```python
async with await MindClient.connect(url, credential) as mc:
    end = await mc.exec("laptop", "exec", {"argv": ["uname", "-a"]}, timeout=30)
    print(end.state, end.exit_code, end.stdout.data)
```
Requests are pipelined on one connection: each gets its own envelope id, and a reader task (owned by
the client, cancelled by `close`) routes every reply to the request that asked for it.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any, AsyncIterator, Callable, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from mind.client.credentials import load_credential
from mind.errors import ClientError
from protocol import limits
from protocol.auth import ClientHandshake, Credential
from protocol.codes import ErrorCode
from protocol.envelope import Channel
from protocol.errors import ProtocolError
from protocol.ids import new_id
from protocol.messages import (
    CancelRun,
    CancelRunResult,
    Challenge,
    Error,
    Exec,
    GetRun,
    GetStatus,
    HandInfo,
    ListRuns,
    RunList,
    StatusReply,
    HandsList,
    ListHands,
    Message,
    RunEnd,
    RunInfo,
    RunOutput,
    RunUpdate,
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
    Welcome,
)
from protocol.states import TaskState
from protocol.states import RunState
from protocol.io.tls import TLSConfigError, check_pin, client_context


class RunFailed(ClientError):
    def __init__(self, end: RunEnd) -> None:
        why = end.error or end.reason or end.state.value
        super().__init__(end.state.value, f"run {end.run_id} on {end.hand} ended {end.state.value}: {why}")
        self.end = end


RunEvent = RunUpdate | RunOutput | RunEnd
R = TypeVar("R", bound=Message)


class RunHandle:
    """One run in flight: iterate its events, await its end, or request a cancel."""

    def __init__(self, client: "MindClient", req_id: str) -> None:
        self._client = client
        self.req_id = req_id
        self.run_id: str | None = None
        self._events: asyncio.Queue[RunEvent | ClientError] = asyncio.Queue()
        self._id_known = asyncio.Event()
        self.end: RunEnd | None = None

    def _feed(self, item: RunEvent | ClientError) -> None:
        if isinstance(item, (RunUpdate, RunOutput, RunEnd)) and self.run_id is None:
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
        assert self.run_id is not None
        return await self._client.cancel(self.run_id)


class MindClient:
    def __init__(self, ws: ClientConnection, channel: Channel, label: str) -> None:
        self._ws = ws
        self._channel = channel
        self.label = label
        self._waiters: dict[str, asyncio.Future[Message]] = {}
        self._runs: dict[str, RunHandle] = {}
        self._reader: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._closed: ClientError | None = None

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
    ) -> "MindClient":
        """Connect and authenticate. `wss://` URLs are verified (system trust or `ca`), and the
        certificate must match `pin` if given, before the credential is used at all."""
        if credential.role != "client":
            raise ClientError("auth_failed", f"a {credential.role} credential cannot be used by a client")
        try:
            ssl_ctx = client_context(url, ca, pin)
        except TLSConfigError as exc:
            raise ClientError("config", str(exc)) from None
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
            raise ClientError(
                "tls", f"the Mind at {url} failed certificate verification: {exc.verify_message}"
            ) from None
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ValueError) as exc:  # ValueError: a bad port
            raise ClientError("unreachable", f"cannot reach the Mind at {url}: {exc}") from None
        try:
            check_pin(ws.transport.get_extra_info("ssl_object"), pin)
        except TLSConfigError as exc:
            await ws.close()
            raise ClientError("tls", str(exc)) from None
        channel = Channel()
        hs = ClientHandshake(credential, os.urandom(limits.NONCE_BYTES))
        try:
            async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
                try:
                    await ws.send(channel.stamp(hs.hello()))
                except ConnectionClosed:
                    pass  # refused before it read our hello (busy, rate limited): its reason is queued
                msg = channel.receive(await ws.recv()).msg
                _raise_if_error(msg)
                if not isinstance(msg, Challenge):
                    raise ClientError("protocol", f"expected challenge, got {msg.TYPE}")
                await ws.send(channel.stamp(hs.on_challenge(msg)))
                msg = channel.receive(await ws.recv()).msg
                _raise_if_error(msg)
                if not isinstance(msg, Welcome):
                    raise ClientError("protocol", f"expected welcome, got {msg.TYPE}")
                channel.gen = hs.on_welcome(msg)
        except ProtocolError as exc:
            await ws.close()
            raise ClientError(exc.code.value, exc.message) from None
        except TimeoutError:
            await ws.close()
            raise ClientError("handshake_timeout", "the Mind did not complete the handshake in time") from None
        except ConnectionClosed as exc:
            raise ClientError("closed", f"the Mind closed the connection during the handshake ({exc})") from None
        except ClientError:
            await ws.close()
            raise
        self = cls(ws, channel, credential.label)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
                pass
        await self._ws.close()

    async def __aenter__(self) -> "MindClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ---

    async def _send(self, msg: Message, id_: str) -> None:
        if self._closed is not None:
            raise self._closed
        async with self._send_lock:
            try:
                await self._ws.send(self._channel.stamp(msg, id_))
            except ConnectionClosed:
                raise ClientError("closed", "connection to the Mind closed") from None

    async def _read(self) -> None:
        err = ClientError("closed", "connection to the Mind closed")
        try:
            async for data in self._ws:
                env = self._channel.receive(data)
                msg = env.msg
                if env.id is None:
                    if isinstance(msg, Error):
                        err = ClientError(msg.code.value, msg.message)
                    continue
                run = self._runs.get(env.id)
                if run is not None:
                    if isinstance(msg, Error):
                        run._feed(ClientError(msg.code.value, msg.message))
                        self._runs.pop(env.id, None)
                    elif isinstance(msg, (RunUpdate, RunOutput, RunEnd)):
                        run._feed(msg)
                        if isinstance(msg, RunEnd):
                            self._runs.pop(env.id, None)
                    continue
                fut = self._waiters.pop(env.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except ProtocolError as exc:
            err = ClientError(exc.code.value, f"the Mind sent a bad frame: {exc.message}")
        except ConnectionClosed:
            pass
        finally:
            self._closed = err
            for fut in self._waiters.values():
                if not fut.done():
                    fut.set_exception(err)
            for run in self._runs.values():
                run._feed(err)
            self._waiters.clear()
            self._runs.clear()

    async def _request(self, msg: Message) -> Message:
        id_ = new_id("q")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiters[id_] = fut
        await self._send(msg, id_)
        reply = await fut
        _raise_if_error(reply)
        return reply

    async def _ask(self, msg: Message, kind: type[R]) -> R:
        """A request whose one reply must be a `kind` (an `error` reply raises `ClientError`)."""
        reply = await self._request(msg)
        if not isinstance(reply, kind):
            raise ClientError("protocol", f"expected {kind.TYPE} in reply to {msg.TYPE}, got {reply.TYPE}")
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
        id_ = new_id("x")
        handle = RunHandle(self, id_)
        self._runs[id_] = handle
        try:
            await self._send(req, id_)
        except ClientError:
            self._runs.pop(id_, None)
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


def _raise_if_error(msg: Message) -> None:
    if isinstance(msg, Error):
        raise ClientError(msg.code.value, msg.message)


__all__ = ["MindClient", "RunHandle", "ClientError", "RunFailed", "load_credential", "ErrorCode"]
