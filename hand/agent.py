"""The Hand's connection loop: dial out to the Mind, authenticate, serve runs, reconnect forever.

Rules (DESIGN §4, §8, §9):
- Nothing is acted on before `welcome`: the handshake is its own phase, bounded in time. A Mind
  that refuses us (an `error` frame, authenticated or not) makes us log and reconnect with backoff,
  never stop for good: only a local configuration error stops a Hand, and that is caught by the CLI
  before this loop starts.
- Keepalive both ways (`ping_interval`/`ping_timeout`): a dead peer is noticed within about two
  intervals, and the connection's runs are then cancelled (`connection_lost`): nobody can receive
  their results, and the Mind has already marked them `lost`.
- Never resend an RPC or a result of an earlier connection: each connection has its own channel
  (seq, gen), run table and task group, and what was queued for a dead connection dies with it.
- One writer path per connection (`_Wire.send` stamps and queues in one synchronous step), so seq
  order == wire order whatever task sends.
- A frame we cannot decode, or a message a Mind may not send, gets an `error` frame and a close.
- SIGTERM/SIGINT (`request_stop`): runs are cancelled with `shutdown`, their results are sent while
  the connection is still up (bounded by the kill grace + 1 s), then the socket is closed.
"""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import socket
import sys
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.uri import parse_uri

from hand.backoff import Backoff
from hand.policy import Policy
from hand.process import DEFAULT_GRACE_S
from hand.runs import RecentRuns, RunTable
from hand.sanitize import Sanitizer
from protocol import limits, logs
from protocol.auth import ClientHandshake, Credential
from protocol.codes import CancelReason, ErrorCode
from protocol.envelope import Channel, Envelope
from protocol.errors import ProtocolError
from protocol.messages import Cancel, Challenge, Error, HandClaims, Message, Rpc, Welcome

T = TypeVar("T")
M = TypeVar("M", bound=Message)

OPEN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class AgentConfig:
    url: str
    credential: Credential
    root: Path
    policy: Policy = field(default_factory=Policy)
    state_dir: Path | None = None
    """Reserved for background tasks (their database and logs); unused by foreground runs."""
    max_backoff: float = 30.0
    ping_interval: float = 10.0
    kill_grace: float = DEFAULT_GRACE_S


class MindRefused(Exception):
    """The Mind sent an `error` frame."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class _Stopped(Exception):
    """A stop was requested while connecting or handshaking."""


def claims() -> HandClaims:
    try:
        from importlib.metadata import version

        ours = version("mindhand")
    except Exception:  # noqa: BLE001 - running from a tree that is not installed
        ours = "unknown"
    return HandClaims(
        hostname=socket.gethostname()[:255] or "unknown",
        platform=platform.system() or sys.platform,
        machine=platform.machine() or "unknown",
        python=platform.python_version(),
        version=ours,
    )


class _Wire:
    """The one writer path of a connection."""

    def __init__(self, ws: ClientConnection, channel: Channel, log: Any) -> None:
        self.ws = ws
        self.channel = channel
        self._log = log
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.open = True
        self.writer: asyncio.Task[None] | None = None

    def send(self, msg: Message, id: str | None = None) -> None:
        """Stamp (seq order) and queue (wire order) in one step. Raises `ProtocolError` if the
        frame cannot be encoded (too large): the seq is not consumed then."""
        if not self.open:
            return
        self._queue.put_nowait(self.channel.stamp(msg, id=id))

    async def write_loop(self) -> None:
        while True:
            data = await self._queue.get()
            if data is None:
                return
            try:
                await self.ws.send(data)
            except ConnectionClosed:
                self.open = False
                return

    async def finish(self, timeout: float) -> None:
        """Flush what is queued (bounded), then accept nothing more."""
        self.open = False
        self._queue.put_nowait(None)
        if self.writer is None:
            return
        done, _ = await asyncio.wait({self.writer}, timeout=timeout)
        if not done:
            self.writer.cancel()


class Agent:
    def __init__(self, config: AgentConfig, *, backoff: Backoff | None = None) -> None:
        self.cfg = config
        cred = config.credential
        self._log = logs.get("hand").bind(hand=cred.label)
        self._stop = asyncio.Event()
        self._backoff = backoff or Backoff(cap=config.max_backoff)
        self._recent = RecentRuns()
        self._sanitize = Sanitizer(config.root, secrets=[cred.secret.hex()])
        self._claims = claims()
        self._uri = parse_uri(config.url)
        self.gen: int | None = None
        """The generation of the live connection (None between connections), for tests and logs."""

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        uri = self._uri
        while not self._stop.is_set():
            lived: float | None = None
            try:
                lived = await self._session(loop)
            except _Stopped:
                break
            except MindRefused as exc:
                self._log.warning("mind_refused", code=exc.code.value, reason=exc.message[:300])
            except ProtocolError as exc:
                self._log.warning("handshake_failed", code=exc.code.value, reason=exc.message)
            except TimeoutError:
                self._log.warning("connect_timeout", host=uri.host, port=uri.port)
            except (OSError, InvalidHandshake, ConnectionClosed) as exc:
                self._log.warning("connect_failed", host=uri.host, port=uri.port, error=_short(exc))
            except Exception:  # noqa: BLE001 - never let one bad connection end the agent
                self._log.exception("connection_crashed")
            self.gen = None
            if self._stop.is_set():
                break
            self._backoff.connection_ended(lived)
            delay = self._backoff.next_delay()
            self._log.info("reconnect_wait", delay=round(delay, 3), attempt=self._backoff.attempt)
            with suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
        self._log.info("hand_stopped")
        return 0

    async def _unless_stopped(self, aw: Awaitable[T]) -> T:
        """Await `aw`, abandoning it (cancelled) if a stop is requested first."""
        work = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not work.done():
                work.cancel()
                with suppress(BaseException):
                    await work
        if work.cancelled():
            raise _Stopped()
        return work.result()

    async def _session(self, loop: asyncio.AbstractEventLoop) -> float | None:
        """One connection from dial to close. Returns how long it lived after `welcome`."""
        p = self.cfg.ping_interval
        ws = await self._unless_stopped(
            connect(
                self.cfg.url,
                compression=None,
                max_size=limits.MAX_FRAME_BYTES,
                ping_interval=p,
                ping_timeout=p,
                open_timeout=OPEN_TIMEOUT_S,
                close_timeout=CLOSE_TIMEOUT_S,
            )
        )
        self._log.info("connected", host=self._uri.host, port=self._uri.port, tls=self._uri.secure)
        channel = Channel()
        try:
            try:
                try:
                    welcome = await self._unless_stopped(self._handshake(ws, channel))
                except TimeoutError:
                    raise ProtocolError(ErrorCode.HANDSHAKE_TIMEOUT, "the handshake took too long") from None
            except ProtocolError as exc:
                with suppress(Exception):
                    await ws.send(channel.stamp(Error(code=exc.code, message=exc.message)))
                raise
            welcomed = loop.time()
            await self._serve(ws, channel, welcome)
            return loop.time() - welcomed
        finally:
            with suppress(Exception):
                await ws.close()

    async def _handshake(self, ws: ClientConnection, channel: Channel) -> Welcome:
        """hello -> challenge -> proof -> welcome, bounded by HANDSHAKE_TIMEOUT_S. Returns the
        verified welcome; the channel then carries its generation."""
        hs = ClientHandshake(self.cfg.credential, os.urandom(limits.NONCE_BYTES), claims=self._claims)
        async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
            await ws.send(channel.stamp(hs.hello()))
            challenge = await _expect(ws, channel, Challenge)
            await ws.send(channel.stamp(hs.on_challenge(challenge.msg)))
            env = await _expect(ws, channel, Welcome)
        gen = hs.on_welcome(env.msg)
        if env.gen is not None and env.gen != gen:
            raise ProtocolError(ErrorCode.GEN_MISMATCH, f"welcome for generation {gen} framed as {env.gen}")
        channel.gen = gen  # every later frame, both ways, carries it
        return env.msg

    async def _serve(self, ws: ClientConnection, channel: Channel, welcome: Welcome) -> None:
        log = self._log.bind(gen=welcome.gen)
        self.gen = welcome.gen
        log.info("welcome", mind_ping_interval_s=welcome.ping_interval_s)
        wire = _Wire(ws, channel, log)
        reason = CancelReason.CONNECTION_LOST
        why = "?"
        async with asyncio.TaskGroup() as tg:
            table = RunTable(
                root=self.cfg.root,
                policy=self.cfg.policy,
                send=wire.send,
                spawn=tg.create_task,
                sanitize=self._sanitize,
                recent=self._recent,
                kill_grace=self.cfg.kill_grace,
                log=log,
            )
            wire.writer = tg.create_task(wire.write_loop())
            reader = tg.create_task(self._read_loop(wire, table, log))
            stopper = tg.create_task(self._stop.wait())
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if reader.done():
                why = reader.result()
            else:
                reason, why = CancelReason.SHUTDOWN, "shutdown"
            table.cancel_all(reason)
            if reason is CancelReason.SHUTDOWN:  # the results can still go out
                await table.wait_idle(self.cfg.kill_grace + 1)
            reader.cancel()
            await wire.finish(CLOSE_TIMEOUT_S)
            with suppress(Exception):
                await ws.close()
            await table.wait_idle(self.cfg.kill_grace + 1)
        log.info("connection_lost" if reason is CancelReason.CONNECTION_LOST else "connection_closed", reason=why)

    async def _read_loop(self, wire: _Wire, table: RunTable, log: Any) -> str:
        """Read and dispatch until the connection ends; return why it ended."""
        try:
            while True:
                data = await wire.ws.recv()
                try:
                    env = wire.channel.receive(data)
                    msg = env.msg
                    if isinstance(msg, Rpc):
                        table.on_rpc(msg)
                    elif isinstance(msg, Cancel):
                        table.on_cancel(msg)
                    elif isinstance(msg, Error):
                        log.warning("mind_error", code=msg.code.value, reason=msg.message[:300])
                        return f"mind sent error {msg.code.value}"
                    else:
                        raise ProtocolError(
                            ErrorCode.UNEXPECTED_MESSAGE, f"a mind may not send {msg.TYPE} to a hand"
                        )
                except ProtocolError as exc:
                    log.warning("protocol_error", code=exc.code.value, reason=exc.message)
                    wire.send(Error(code=exc.code, message=exc.message))
                    return f"protocol error {exc.code.value}"
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            return f"closed by peer ({code})" if code is not None else "connection dropped"
        except Exception:  # noqa: BLE001 - a dispatch bug ends this connection, not the agent
            log.exception("reader_crashed")
            return "internal error"


async def _expect(ws: ClientConnection, channel: Channel, kind: type[M]) -> Envelope[M]:
    env = channel.receive(await ws.recv())
    if isinstance(env.msg, Error):
        raise MindRefused(env.msg.code, env.msg.message)
    if not isinstance(env.msg, kind):
        raise ProtocolError(
            ErrorCode.UNEXPECTED_MESSAGE, f"expected {kind.TYPE} during the handshake, got {env.msg.TYPE}"
        )
    return env  # type: ignore[return-value]


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


async def run_agent(config: AgentConfig, *, handle_signals: bool = True) -> int:
    """Run the Hand until SIGTERM/SIGINT (graceful: runs cancelled with `shutdown`). Returns 0.

    Embedders and tests that want to stop it themselves use `Agent(config)`, `await agent.run()`
    and `agent.request_stop()`.
    """
    agent = Agent(config)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, agent.request_stop)
    try:
        return await agent.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def validate_url(url: str) -> None:
    """Raise ValueError for a URL the agent could never connect to (a configuration error)."""
    try:
        parse_uri(url)
    except InvalidURI as exc:
        raise ValueError(f"--mind must be a ws:// or wss:// URL ({exc})") from None
