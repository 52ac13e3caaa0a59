"""The Hand's connection loop: dial out to the Mind, authenticate, serve runs, reconnect forever.

Rules (DESIGN §4, §8, §9):
- Nothing is acted on before `welcome`: the handshake is its own phase, bounded in time. What the
  network does (refused or dropped connections, timeouts, a busy or rate-limiting Mind) is retried
  with backoff forever. What retrying cannot heal is a configuration error (issue 14), reported once
  on stderr and in the log (`hand_config_error`) and the agent returns 2 (systemd's
  `Restart=on-failure` starts it again, with whatever was fixed): the Mind's certificate fails
  verification (CA file, hostname) or its pin, and the Mind refuses our credential (`auth_failed`:
  unknown or wrong secret, `revoked`). Local errors (files, flags) the CLI catches before this loop.
- Keepalive both ways (`ping_interval`/`ping_timeout`): a dead peer is noticed within about two
  intervals. With the Mind's resume window at 0 the connection's runs are then cancelled
  (`connection_lost`): nobody can receive their results, and the Mind has already marked them `lost`.
- Continuity (DESIGN §15): with a resume window above 0 (the last `welcome`'s), the foreground run
  table outlives the connection: its runs go on (their output held, as for a slow reader), and if no
  new `welcome` comes within the window they are cancelled (`connection_lost`, tree killed) and
  their results forgotten. After the next `welcome` the first frame is `runs_present` (live runs and
  results not acknowledged), then the kept results again, then normal traffic. The runs' tasks
  belong to an agent-level task group (`_connect_forever`), not to a connection's.
- Never resend an RPC of an earlier connection: each connection has its own channel (seq, gen) and
  task group, and what was queued for a dead connection dies with it (a run's kept bytes and result
  are the run's, and go out again only when the Mind asks or acknowledges).
- One writer path per connection (`_Wire.send` stamps and queues in one synchronous step), so seq
  order == wire order whatever task sends.
- A frame we cannot decode, or a message a Mind may not send, gets an `error` frame and a close.
- SIGTERM/SIGINT (`request_stop`): runs are cancelled with `shutdown`, their results are sent while
  the connection is still up (bounded by the kill grace + 1 s), then the socket is closed.
- Background tasks (`hand.aio.tasks`) belong to the agent, not to a connection: the task manager is
  opened (restart recovery) before the first dial, its executions live in an agent-level task group,
  and a dropped connection only detaches where `task_update`s go. Task messages (a background
  `rpc`, `task_status`, `task_logs`, `task_cancel`, `task_remove`, `task_inventory`) are handled IN
  ORDER by the reader (each awaited before the next frame is read), so a `task_status` that follows
  a start on the ordered stream sees its committed row. Replies carry the request's envelope id.
- A full state disk never ends the Hand: log and audit lines that cannot be written are counted and
  dropped (`protocol.io.logs`), and new starts are refused `disk_full` (`hand.core.runs.refusal`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import platform
import random
import signal
import socket
import ssl
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.uri import WebSocketURI, parse_uri

from hand.aio.health import ADDR_FILE, HealthServer
from hand.aio.metrics import HandMetrics
from hand.aio.runs import RecentRuns, RunTable, Spawn
from hand.aio.tasks import TaskManager
from hand.core.backoff import Backoff
from hand.core.http import shown_url
from hand.core.policy import LivePolicy, Policy
from hand.core.runs import STATE_ROOM_MIN
from hand.core.sanitize import Sanitizer
from hand.core.tasks import TaskLimits
from hand.system.cgroups import NO_CGROUPS, CgroupHost
from hand.system.disk import free_bytes
from hand.system.process import DEFAULT_GRACE_S
from hand.system.sandbox import Sandbox
from protocol import limits
from protocol.audit import AuditEvent
from protocol.auth import ClientHandshake, Credential
from protocol.codes import CancelReason, ErrorCode, RejectCode, TaskCancelStatus
from protocol.envelope import Channel, Envelope
from protocol.errors import MindhandError, ProtocolError
from protocol.io import logs
from protocol.io.batching import MAX_BATCH, BatchedWrites, Parts, TurnWriter, write_frames
from protocol.io.framereader import FrameReader
from protocol.io.loop import probe_lag
from protocol.io.tls import TLSConfigError, check_pin, client_context, verify_failure
from protocol.messages import (
    Cancel,
    Challenge,
    Error,
    HandClaims,
    Message,
    Rejected,
    Resize,
    ResultAck,
    Rpc,
    StreamAck,
    StreamData,
    StreamNumbers,
    StreamResume,
    TaskCancel,
    TaskCancelResult,
    TaskInventory,
    TaskInventoryPage,
    TaskLogs,
    TaskRemove,
    TaskStatus,
    Welcome,
    build_all,
)
from protocol.urls import Rotation, split_urls

T = TypeVar("T")
M = TypeVar("M", bound=Message)

OPEN_TIMEOUT_S = 10.0
REDIAL_AT_ONCE_AFTER_S = 1.0
HOLDING_BACKOFF_CAP_S = 1.0
"""While runs wait for the Mind (within the window), no pause between redials is longer than this:
a Mind back after a restart is reached within about a second, not after a 30 s backoff draw. The
draw stays random (full jitter), so many Hands cut by one restart still spread their knocks."""
CLOSE_TIMEOUT_S = 2.0


class BatchingConnection(BatchedWrites, FrameReader, ClientConnection):
    """The Hand's connection: frames queued together leave in one write (`protocol.io.batching`);
    binary frames are read by our own reader (`protocol.io.framereader`)."""


@dataclass(frozen=True)
class AgentConfig:
    url: str
    credential: Credential
    root: Path
    policy: Policy = field(default_factory=Policy)
    state_dir: Path | None = None
    """Where background tasks live (their database and logs). None: this Hand refuses background
    tasks (foreground runs need no state)."""
    tasks: TaskLimits = field(default_factory=TaskLimits)
    max_backoff: float = 30.0
    ping_interval: float = 10.0
    kill_grace: float = DEFAULT_GRACE_S
    sandbox: Sandbox = field(default_factory=Sandbox)
    """What every child sees and may use: environment, resource caps, user (`hand.system.sandbox`)."""
    ca: Path | None = None
    pin: str | None = None
    """How a wss:// Mind is verified (`protocol.tls`): checked before the credential is ever used."""
    metrics_listen: tuple[str, int] | None = None
    """(host, port) of the local `/healthz` and `/metrics` (`hand.aio.health`); None: not served."""


class MindRefused(MindhandError):
    """The Mind sent an `error` frame."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class PermanentError(MindhandError):
    """A configuration error no retry can heal (issue 14): the Hand says so once and exits 2."""


PERMANENT_REFUSALS = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.REVOKED})
"""What the Mind says to a credential it will never accept (`rate_limited`, `busy`: try later)."""
EXIT_CONFIG = 2


class _Stopped(MindhandError):
    """A stop was requested while connecting or handshaking."""


def claims(cgroups: CgroupHost = NO_CGROUPS) -> HandClaims:
    try:
        from importlib.metadata import version

        ours = version("mindhand")
    except Exception:  # running from a tree that is not installed
        ours = "unknown"
    return HandClaims(
        hostname=socket.gethostname()[:255] or "unknown",
        platform=platform.system() or sys.platform,
        machine=platform.machine() or "unknown",
        python=platform.python_version(),
        version=ours,
        cgroups=cgroups.layout,
        limits=list(cgroups.limits),
    )


class _Wire(TurnWriter):
    """The one writer path of a connection: frames are stamped when queued (seq order is queue
    order), written at the end of the turn or by the writer task (`TurnWriter`)."""

    def __init__(self, ws: ClientConnection, channel: Channel, log: Any) -> None:
        super().__init__(ws)
        self.ws = ws
        self.channel = channel
        self._log = log
        self._q: deque[bytes | Parts] = deque()
        self.open = True
        self._finishing = False
        self.writer: asyncio.Task[None] | None = None

    def send(self, msg: Message, id: str | None = None) -> None:
        """Stamp (seq order) and queue (wire order) in one step. Raises `ProtocolError` if the
        frame cannot be encoded (too large): the seq is not consumed then."""
        if not self.open:
            return
        if msg.TYPE == "stream_data":  # a data frame; none for a run whose streams died here
            if (parts := self.channel.stamp_parts(msg)) is not None:
                self._q.append(parts)  # framed and masked by `BatchedWrites`, unjoined
                self._kick()
            return
        self._q.append(self.channel.stamp(msg, id=id))
        self._kick()

    def _pending(self) -> bool:
        return bool(self._q)

    def _batch(self) -> list[bytes | Parts]:
        q = self._q
        return [q.popleft() for _ in range(min(len(q), MAX_BATCH))]

    def _stopping(self) -> bool:
        return self._finishing

    def _write_failed(self) -> None:
        self._log.exception("wire_write_failed")
        self.open = False

    async def write_loop(self) -> None:
        """Frames queued together (a quick tool's `accepted` and `result`) leave in one write."""
        while True:
            while self._q:
                try:
                    await write_frames(self.ws, self._batch())
                except ConnectionClosed:
                    self.open = False
                    return
            if self._finishing:
                return
            await self._park()

    async def finish(self, timeout: float) -> None:
        """Flush what is queued (bounded), then accept nothing more."""
        self.open = False
        self._finishing = True
        self._wake.set()
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
        # The credential never reaches a child, whatever the environment allowlist says.
        self._sandbox = dataclasses.replace(config.sandbox, secrets=config.sandbox.secrets + (cred.secret.hex(),))
        self._claims = claims(self._sandbox.cgroups)
        self._urls = Rotation(split_urls(config.url) or [config.url])
        """The Mind nodes this Hand may connect to (DESIGN §16): a random start, the next on a refusal."""
        self._dests = {u: (parse_uri(u), client_context(u, config.ca, config.pin)) for u in self._urls.urls}
        self.gen: int | None = None
        """The generation of the live connection (None between connections), for tests and logs."""
        self.tasks: TaskManager | None = None
        self._table: RunTable | None = None
        """The foreground runs; kept across a cut while the Mind's resume window lasts."""
        self._expiry: asyncio.TimerHandle | None = None
        """The end of the window after a cut: the kept runs are cancelled then."""
        self._spawn_run: Spawn | None = None
        self.policy = LivePolicy(config.policy)
        self.metrics = HandMetrics()
        self.metrics.build.info({"version": self._claims.version})
        self._state_free = partial(free_bytes, config.state_dir) if config.state_dir is not None else None
        """The bytes free on the state disk (where the audit file and the tasks live), asked at each
        admission and by `/healthz`; None: this Hand keeps no state dir."""

    def reload(self, reload: Callable[[], Policy | None]) -> None:
        """SIGHUP: never fatal (a bad file is the reload's to report); connections stay up."""
        try:
            policy = reload()
        except Exception:  # a reload must not stop the Hand
            self._log.exception("config_reload_crashed")
            return
        if policy is not None and policy != self.policy.current:
            self.policy.current = policy
            self._log.info(
                AuditEvent.POLICY_RELOADED,
                allow=sorted(policy.allow) if policy.allow is not None else "all",
                deny=sorted(policy.deny),
                pty=policy.pty,
            )

    async def run(self) -> int:
        """Bind `--metrics-listen` first, if asked: a port that cannot be bound is a local
        configuration error (exit 2 before any dial), like every other one. The health server and
        the lag probe are owned here, outside `_run`, so they answer through reconnects and through
        the whole shutdown, and are closed last."""
        if self.cfg.metrics_listen is None:
            return await self._run()
        host, port = self.cfg.metrics_listen
        health = HealthServer(
            host,
            port,
            health=self.health,
            metrics=self.metrics.render,
            log=self._log,
            addr_file=self.cfg.state_dir / ADDR_FILE if self.cfg.state_dir is not None else None,
        )
        try:
            await health.start()
        except OSError as exc:
            self._log.error("metrics_listen_failed", host=host, port=port, error=_short(exc))
            print(f"hand: cannot serve --metrics-listen {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(health.serve())
            probe = tg.create_task(self._lag_probe())
            try:
                return await self._run()
            finally:
                probe.cancel()
                serving.cancel()

    def health(self) -> dict[str, Any]:
        """The body of `/healthz`. Answered whenever the process can answer (liveness); whether a
        Mind is listening is `connected`, and `status` says it in one word: `ok`, `degraded` (connected, but
        tasks ended whose outcome could not be committed yet: see `tasks.uncommitted`; or the state disk
        is too full for a start, which is refused `disk_full`: `state_disk_full`),
        `disconnected` (alive, reconnecting) or `stopping`. The Mind's URL is shown without userinfo or query."""
        connected = self.gen is not None
        tasks = self.tasks.live() if self.tasks is not None else {"queued": 0, "running": 0, "uncommitted": 0}
        status = "stopping" if self._stop.is_set() else "ok" if connected else "disconnected"
        free = self._state_free() if self._state_free is not None else None
        disk_full = free is not None and free < STATE_ROOM_MIN
        if status == "ok" and (tasks.get("uncommitted") or disk_full):
            status = "degraded"  # outcomes the database has not taken, or starts refused `disk_full`
        return {
            "status": status,
            "version": self._claims.version,
            "hand": self.cfg.credential.label,
            "uptime_s": round(time.monotonic() - self.metrics.started, 3),
            "connected": connected,
            "mind": shown_url(self._urls.current),
            "generation": self.gen,
            "runs_running": self.metrics.runs_running(),
            "tasks": tasks,
            "state_disk_full": disk_full,
        }

    async def _lag_probe(self) -> None:
        await probe_lag(self.metrics.observe_lag)

    async def _run(self) -> int:
        """Open the task manager (restart recovery happens here, before any connection), then
        connect forever; on stop, shut the tasks down (`cancelled`, reason `shutdown`)."""
        cgroups = self._sandbox.cgroups
        self._log.info("cgroups", layout=cgroups.layout, kill=cgroups.kill_mode, limits=list(cgroups.limits))
        print(f"hand: {cgroups.describe()}", file=sys.stderr, flush=True)
        if cgroups.enabled:  # what a previous life's runs left (a crash): killed before anything is reported
            swept = await cgroups.sweep()
            if swept:
                self._log.warning("cgroups_swept", count=len(swept))
        try:
            return await self._run_tasks()
        finally:
            cgroups.release()

    async def _run_tasks(self) -> int:
        if self.cfg.state_dir is None:
            return await self._connect_forever()
        async with asyncio.TaskGroup() as owner:  # outlives every connection
            tasks = TaskManager(
                state_dir=self.cfg.state_dir,
                root=self.cfg.root,
                spawn=owner.create_task,
                policy=self.policy,  # a LivePolicy: a SIGHUP reload swaps what it holds
                limits=self.cfg.tasks,
                kill_grace=self.cfg.kill_grace,
                sanitize=self._sanitize,
                log=self._log,
                sandbox=self._sandbox,
                metrics=self.metrics,
            )
            await tasks.open()
            self.tasks = tasks
            self.metrics.watch_tasks(tasks.live)
            try:
                code = await self._connect_forever()
            finally:
                await tasks.shutdown()
        return code

    def request_stop(self) -> None:
        self._stop.set()

    async def _connect_forever(self) -> int:
        """Dial and serve until stopped. The foreground runs' tasks are owned here, not by one
        connection: with a resume window they outlive it. Whatever is still kept at the end (a
        stop during a cut) is cancelled with `shutdown` and waited for, bounded."""
        async with asyncio.TaskGroup() as runs:
            self._spawn_run = runs.create_task
            try:
                return await self._dial_forever()
            finally:
                await self._drop_kept()

    async def _drop_kept(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        table, self._table = self._table, None
        if table is not None:
            table.expire(CancelReason.SHUTDOWN)  # nobody is connected to receive the results
            await table.wait_idle(self.cfg.kill_grace + 1)

    async def _dial_forever(self) -> int:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            lived: float | None = None
            uri = self._uri
            try:
                lived = await self._session(loop)
            except _Stopped:
                break
            except PermanentError as exc:
                return self._give_up(str(exc))
            except MindRefused as exc:
                self.metrics.handshake_failures.labels(exc.code.value).inc()
                self._log.warning("mind_refused", code=exc.code.value, reason=exc.message[:300])
                if exc.code in PERMANENT_REFUSALS:
                    return self._give_up(
                        f"the Mind refused this Hand's credential ({exc.code.value}: {exc.message[:300]}): "
                        f"give the Hand a current credential (`mind hand add` or `mind hand rotate`)"
                    )
            except ProtocolError as exc:
                self.metrics.handshake_failures.labels(exc.code.value).inc()
                self._log.warning(AuditEvent.HANDSHAKE_FAILED, code=exc.code.value, reason=exc.message)
            except TimeoutError:
                self.metrics.connect_failures.inc()
                self._log.warning("connect_timeout", host=uri.host, port=uri.port)
            except ssl.SSLCertVerificationError as exc:
                self.metrics.connect_failures.inc()
                return self._give_up(verify_failure(exc, self.cfg.ca))
            except (OSError, InvalidHandshake, ConnectionClosed) as exc:
                self.metrics.connect_failures.inc()
                self._log.warning("connect_failed", host=uri.host, port=uri.port, error=_short(exc))
            except Exception:  # never let one bad connection end the agent
                self._log.exception("connection_crashed")
            self.gen = None
            self.metrics.session_ended()
            if self._stop.is_set():
                break
            if lived is not None:
                self._urls.worked()
            elif self._urls.failed():  # this node refused: another of this round is dialled at once
                self._log.info("mind_next_url", url=shown_url(self._urls.current))
                continue
            self._backoff.connection_ended(lived)
            delay = self._backoff.next_delay()
            if lived is not None and lived >= REDIAL_AT_ONCE_AFTER_S and self._expiry is not None:
                # Runs wait for us: the first redial after a connection that served is at once (a
                # blink costs its length, not a backoff draw); the next ones back off as usual, and
                # a connection that flaps gets this at most once a second.
                delay = 0.0
            elif self._expiry is not None:
                delay = min(delay, random.uniform(0, HOLDING_BACKOFF_CAP_S))
            self.metrics.backoff.set(delay)
            self._log.info("reconnect_wait", delay=round(delay, 3), attempt=self._backoff.attempt)
            with suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
        self._log.info("hand_stopped")
        return 0

    @property
    def _uri(self) -> WebSocketURI:
        return self._dests[self._urls.current][0]

    @property
    def _ssl(self) -> ssl.SSLContext | None:
        return self._dests[self._urls.current][1]

    def _give_up(self, why: str) -> int:
        """Once, where an operator looks (stderr is the journal under systemd, and the log)."""
        self._log.error("hand_config_error", url=shown_url(self._urls.current), reason=why)
        print(
            f"hand: cannot work with the Mind at {shown_url(self._urls.current)}: {why}; not retrying", file=sys.stderr
        )
        return EXIT_CONFIG

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
                self._urls.current,
                compression=None,
                max_size=limits.MAX_FRAME_BYTES,
                ping_interval=p,
                ping_timeout=0.75 * p,  # with the short close below: a dead Mind noticed within 2 intervals
                open_timeout=OPEN_TIMEOUT_S,
                close_timeout=max(0.2, min(CLOSE_TIMEOUT_S, 0.2 * p)),
                ssl=self._ssl,
                create_connection=BatchingConnection,
            )
        )
        self._log.info("connected", host=self._uri.host, port=self._uri.port, tls=self._uri.secure)
        channel = Channel()
        try:
            try:
                check_pin(ws.transport.get_extra_info("ssl_object"), self.cfg.pin)
            except TLSConfigError as exc:
                # A wrong URL, a Mind with a new certificate or an attacker on the path: no retry
                # changes what we trust, so say so once (issue 14), as for a failed CA verification.
                self.metrics.handshake_failures.labels(ErrorCode.AUTH_FAILED.value).inc()
                self._log.warning(AuditEvent.HANDSHAKE_FAILED, code=ErrorCode.AUTH_FAILED.value, reason=f"TLS: {exc}")
                raise PermanentError(f"TLS: {exc}") from None
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
        self.metrics.welcomed()
        log.info("welcome", mind_ping_interval_s=welcome.ping_interval_s, resume_window_s=welcome.resume_window_s)
        wire = _Wire(ws, channel, log)
        table = self._table_for(welcome, log)
        if welcome.resume_window_s > 0:
            wire.send(table.present())  # the first frame after welcome: what this Hand still holds
        table.rewire(wire.send)
        try:
            await self._serve_wire(ws, wire, table, log)
        finally:
            if self._table is table and self._expiry is None:  # left by an error: never unowned
                self._after_cut(table, log)

    async def _serve_wire(self, ws: ClientConnection, wire: _Wire, table: RunTable, log: Any) -> None:
        """Read and write this connection until it ends, then end or keep its runs."""
        reason = CancelReason.CONNECTION_LOST
        why = "?"
        kept = False
        async with asyncio.TaskGroup() as tg:
            wire.writer = tg.create_task(wire.write_loop())
            if self.tasks is not None:
                self.tasks.attach(wire.send)
            try:
                reader = tg.create_task(self._read_loop(wire, table, log))
                stopper = tg.create_task(self._stop.wait())
                await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if reader.done():
                    why = reader.result()
                else:
                    reason, why = CancelReason.SHUTDOWN, "shutdown"
                if reason is CancelReason.CONNECTION_LOST:
                    kept = self._after_cut(table, log)
                else:
                    self._table = None
                    table.cancel_all(reason)  # foreground runs only: tasks outlive the connection
                if reason is CancelReason.SHUTDOWN:  # the results and task updates can still go out
                    ending: list[Awaitable[object]] = [table.wait_idle(self.cfg.kill_grace + 1)]
                    if self.tasks is not None:
                        ending.append(self.tasks.shutdown())
                    await asyncio.gather(*ending)
                reader.cancel()
                await wire.finish(CLOSE_TIMEOUT_S)
                with suppress(Exception):
                    await ws.close()
                if not kept:
                    await table.wait_idle(self.cfg.kill_grace + 1)
            finally:
                if self.tasks is not None:
                    self.tasks.attach(None)
        event = "connection_lost" if reason is CancelReason.CONNECTION_LOST else "connection_closed"
        log.info(event, reason=why, runs_kept_s=table.window if kept else 0)

    def _after_cut(self, table: RunTable, log: Any) -> bool:
        """The connection is gone (not a shutdown). With a window the runs wait for the Mind (True);
        without one they are cancelled, `connection_lost`, as before continuity."""
        if table.window > 0:
            table.on_cut()
            self._expiry = asyncio.get_running_loop().call_later(table.window, self._expire, table, log)
            return True
        if self._table is table:
            self._table = None
        table.cancel_all(CancelReason.CONNECTION_LOST)
        return False

    def _table_for(self, welcome: Welcome, log: Any) -> RunTable:
        """The run table a new connection serves: the one kept from the cut (its window stopped),
        or a new one. A Mind that now keeps nothing (window 0) gets today's rule for the kept runs:
        cancelled, `connection_lost`."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        table = self._table
        if table is not None and welcome.resume_window_s <= 0:
            log.warning("runs_dropped", why="the mind keeps no runs across a cut (resume window 0)")
            self._table = None
            table.expire()
            table = None
        if table is None:
            assert self._spawn_run is not None  # set by `_connect_forever`, which calls us
            table = RunTable(
                root=self.cfg.root,
                policy=self.policy,  # a LivePolicy: a SIGHUP reload swaps what it holds
                send=None,
                spawn=self._spawn_run,
                sanitize=self._sanitize,
                recent=self._recent,
                kill_grace=self.cfg.kill_grace,
                log=log,
                sandbox=self._sandbox,
                metrics=self.metrics,
                state_free=self._state_free,
            )
            self._table = table
        table.window = welcome.resume_window_s
        return table

    def _expire(self, table: RunTable, log: Any) -> None:
        """The window after a cut passed without a `welcome`: the Mind has made the runs `lost`;
        kill their trees, forget their results."""
        if self._table is table:
            self._table = None
            self._expiry = None
        log.warning("runs_expired", window_s=table.window, runs=table.holding)
        table.expire()

    async def _read_loop(self, wire: _Wire, table: RunTable, log: Any) -> str:
        """Read and dispatch until the connection ends; return why it ended."""
        try:
            while True:
                data = await wire.ws.recv()
                env = None
                try:
                    env = wire.channel.receive_any(data)
                    if env is None:  # a data frame of a stream that has died (its run ended)
                        continue
                    msg = env.msg
                    if isinstance(msg, Rpc) and msg.background is not None:
                        await self._task_start(msg, wire)
                    elif isinstance(msg, Rpc):
                        table.on_rpc(msg)
                    elif isinstance(msg, (StreamData, StreamAck)):
                        table.on_stream(msg)
                    elif isinstance(msg, Resize):
                        table.on_resize(msg)
                    elif isinstance(msg, ResultAck):
                        table.on_result_ack(msg.run_id)
                    elif isinstance(msg, StreamNumbers):
                        pass  # the channel took them (`Channel.accept`): data frames name streams by them
                    elif isinstance(msg, StreamResume):
                        table.on_resume(msg)
                    elif isinstance(msg, (TaskStatus, TaskLogs, TaskCancel, TaskRemove, TaskInventory)):
                        wire.send(await self._task_answer(msg), id=env.id)
                    elif isinstance(msg, Cancel):
                        if self.tasks is not None and self.tasks.deciding():
                            # A cancel of a start still being decided is answered after the start
                            # is: `unknown_run` now would make the Mind call it lost (tests/sim).
                            await self.tasks.settle()
                        table.on_cancel(msg)
                    elif isinstance(msg, Error):
                        log.warning("mind_error", code=msg.code.value, reason=msg.message[:300])
                        return f"mind sent error {msg.code.value}"
                    else:
                        raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a mind may not send {msg.TYPE} to a hand")
                except ProtocolError as exc:
                    log.warning("protocol_error", code=exc.code.value, reason=exc.message)
                    wire.send(Error(code=exc.code, message=exc.message))
                    return f"protocol error {exc.code.value}"
                except Exception:
                    self._request_failed(wire, table, env, log)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            return f"closed by peer ({code})" if code is not None else "connection dropped"
        except Exception:  # the reader itself broke (not one request): this connection ends, not the agent
            log.exception("reader_crashed")
            return "internal error"

    def _request_failed(self, wire: _Wire, table: RunTable, env: Envelope[Message] | None, log: Any) -> None:
        """A bug while handling one frame ends that request only: the connection and its other runs
        go on (a dropped connection would end every run on it `lost`). A foreground `rpc` the run
        table had not taken yet is `rejected` with `internal_error`: nothing ran. A request with an
        envelope id gets an `error` for that id. A background start is left to the Mind's bound on
        its answer: whether its row was committed is not known here, and `unknown` is the truth."""
        msg = env.msg if env is not None else None
        run_id = getattr(msg, "run_id", None)
        log.exception(
            "request_failed", type=msg.TYPE if msg is not None else None, req=env.id if env else None, run_id=run_id
        )
        if env is None or msg is None:
            return  # the frame did not decode: nothing names what to answer
        try:
            if isinstance(msg, Rpc):
                if msg.background is None and not table.knows(msg.run_id):
                    wire.send(
                        Rejected(
                            run_id=msg.run_id,
                            code=RejectCode.INTERNAL_ERROR,
                            message="the hand failed while admitting this run (its log has the traceback); nothing ran",
                        )
                    )
            elif env.id is not None:
                wire.send(
                    Error(
                        code=ErrorCode.INTERNAL_ERROR,
                        message="the hand failed while serving this request (its log has the traceback)",
                    ),
                    id=env.id,
                )
        except Exception:
            log.exception("request_failure_unanswered", type=msg.TYPE)

    async def _task_start(self, rpc: Rpc, wire: _Wire) -> None:
        if self.tasks is None:
            wire.send(
                Rejected(
                    run_id=rpc.run_id,
                    code=RejectCode.INVALID_REQUEST,
                    message="this hand keeps no background tasks (it has no state dir)",
                )
            )
            return
        await self.tasks.on_start(rpc, wire.send)

    async def _task_answer(self, msg: Message) -> Message:
        if self.tasks is not None:
            try:
                return await self.tasks.answer(msg)
            except Exception as exc:  # one failed request, not the connection
                self._log.exception("task_request_failed", type=msg.TYPE)
                return Error(code=ErrorCode.INTERNAL_ERROR, message=self._sanitize(f"internal error: {exc}"))
        if isinstance(msg, TaskInventory):
            return TaskInventoryPage(tasks=[])
        if isinstance(msg, TaskCancel):
            return TaskCancelResult(task_id=msg.task_id, status=TaskCancelStatus.UNKNOWN_TASK)
        assert isinstance(msg, (TaskStatus, TaskLogs, TaskRemove))
        return Error(code=ErrorCode.UNKNOWN_TASK, message=f"this hand has no task {msg.task_id}")


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


async def run_agent(
    config: AgentConfig,
    *,
    handle_signals: bool = True,
    stop_requested: Callable[[], bool] | None = None,
    reload: Callable[[], Policy | None] | None = None,
) -> int:
    """Run the Hand until SIGTERM/SIGINT (graceful: runs cancelled with `shutdown`). Returns 0, or 2
    for a configuration error found on connecting that no retry heals (`PermanentError`).
    SIGHUP calls `reload` (the CLI re-reads its config file); a policy it returns applies to every
    request from then on, on this connection and the next ones, without dropping the connection.

    `stop_requested`: did a signal arrive before our handlers were installed (the CLI catches them
    from its first line on, so a Hand stopped while starting still stops gracefully)?

    Embedders and tests that want to stop it themselves use `Agent(config)`, `await agent.run()`
    and `agent.request_stop()`.
    """
    build_all()  # every validator built before the first connection, not on its first frame
    agent = Agent(config)
    loop = asyncio.get_running_loop()
    use_pidfd_child_watcher()
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, agent.request_stop)
    if handle_signals and reload is not None:
        signals += (signal.SIGHUP,)
        loop.add_signal_handler(signal.SIGHUP, lambda: agent.reload(reload))
    if stop_requested is not None and stop_requested():
        agent.request_stop()
    try:
        return await agent.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def use_pidfd_child_watcher() -> bool:
    """On Python 3.11, asyncio learns that a child exited from a thread it starts per child
        (`ThreadedChildWatcher`): a thread start and a join for every command. A pidfd does the same
        with the event loop's own epoll (measured: ~0.7 ms of CPU per spawned command here). 3.12 picks
        pidfds by itself (and deprecates this API), and without `pidfd_open` the default stays. Call it
    from the loop that spawns (the watcher belongs to that loop)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an old kernel, or a seccomp filter that refuses it
        return False
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())  # 3.11 attaches only in set_event_loop
    asyncio.get_event_loop_policy().set_child_watcher(watcher)
    return True


def validate_url(url: str) -> None:
    """Raise ValueError for a URL the agent could never connect to (a configuration error)."""
    try:
        parse_uri(url)
    except InvalidURI as exc:
        raise ValueError(f"--mind must be a ws:// or wss:// URL ({exc})") from None
