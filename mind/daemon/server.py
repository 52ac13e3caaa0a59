"""The Mind daemon's asyncio shell: WebSocket server, connection table, and the action performer.

Thin on purpose: read frame -> decode -> feed the registry (or handshake) -> perform the returned
actions. Every rule lives in `registry.py` and `handshake.py`; this file only moves bytes and owns
tasks (one TaskGroup for the server, one per connection).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import resource
import signal
import ssl
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import structlog
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from mind import home as paths
from mind.core.admission import (
    AuthFailures,
    Denial,
    args_problem,
    denial_message,
    touch_denial,
    use_denial,
)
from mind.core.budgets import CLIENT_REQUESTS_IN_FLIGHT, ClientRates, stream_budget_problem, stream_windows
from mind.core.fleetids import FleetOwners
from mind.core.handshake import AUTH_FAILED_MESSAGE, Identity, ServerHandshake
from mind.core.paging import page
from mind.core.registry import Action, Log, RunRegistry, SendToClient, SendToHand, StartEnded
from mind.core.scope import Scope
from mind.core.slots import HandshakeSlots
from mind.daemon import heap
from mind.daemon.metrics import MindMetrics
from mind.daemon.onerequest import OneRequest
from mind.daemon.outbox import BatchingConnection, Outbox
from mind.daemon.peer import INTERNAL_ERROR, Peer
from mind.daemon.taskservice import TaskService
from mind.store.credentials import Store
from mind.store.snapshots import SnapshotStore
from protocol import limits
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, ErrorCode, RejectCode
from protocol.envelope import Channel, Envelope, payload_size
from protocol.errors import ProtocolError
from protocol.ids import new_id
from protocol.io.loop import probe_lag
from protocol.io.tls import fingerprint, server_context
from protocol.messages import (
    Accepted,
    CancelResult,
    CancelRun,
    CancelRunResult,
    ConnectedNames,
    Error,
    Exec,
    FleetOpen,
    FleetOpened,
    GetRun,
    GetStatus,
    HandClaims,
    HandInfo,
    HandsList,
    HandsSelected,
    Hello,
    ListHands,
    ListRuns,
    Message,
    Progress,
    Proof,
    Rejected,
    Resize,
    Result,
    RunList,
    SelectedHand,
    SelectHands,
    Started,
    StatusReply,
    StreamAck,
    StreamData,
    TaskCancelRequest,
    TaskCancelResult,
    TaskGet,
    TaskInfo,
    TaskInventoryPage,
    TaskList,
    TaskLogPage,
    TaskLogs,
    TaskStart,
    TaskUpdate,
    WhichConnected,
    build_all,
)
from protocol.states import RUN_TERMINAL, RunState

log = structlog.get_logger(component="mind")
try:
    from importlib.metadata import version as _v

    VERSION = _v("mindhand")
except Exception:  # running from a source tree that is not installed
    VERSION = "unknown"
T = TypeVar("T")
REPLY_TYPES = (TaskInfo, TaskLogPage, TaskCancelResult, TaskInventoryPage)
LOG_LEVELS = {
    AuditEvent.HAND_INPUT_WRONG_GENERATION: "warning",
    AuditEvent.HAND_INPUT_UNKNOWN_RUN: "warning",
    "hand_input_illegal": "warning",
    # Every transition is logged, at debug: admission and the terminal (info, and audited) carry what
    # operators need; the steps between cost a tenth of the Mind's CPU per call at info.
    "run_state": "debug",
    # A client's bad stream frames are its own problem, and it can send thousands a second (issue 23).
    "stream_refused": "debug",
    "stream_unknown": "debug",
    "stream_wrong_direction": "debug",
}

STATUS_LIST_MAX = 50
STATUS_FAILURES = 10
STATUS_LIST_BYTES = 256 << 10
"""Each list of `status` is cut at these (count, bytes), so the reply stays one bounded frame."""
FAILURE_STATES = RUN_TERMINAL - {RunState.SUCCEEDED}

CLOSE_PROTOCOL = 1002
CLOSE_POLICY = 1008
CLOSE_REPLACED = 4001
CLOSE_REVOKED = 4003
CLOSE_TRY_LATER = 1013
CLOSE_INTERNAL = 1011
OPEN_TIMEOUT_S = 5.0
"""A connection that has not finished its HTTP upgrade by then is closed (issue 13, item 10)."""
MAX_PENDING_PER_ADDRESS = 1024
"""Silent handshakes (no `hello` yet) one address may hold; a newer one evicts the oldest (issue 23).
As large as the default table: a burst of peers behind one address all connect before any speaks
(300 at once from one process were cut at any smaller quota); a full table is what bounds them,
and it evicts the oldest silent handshake of the address holding the most, so a flood from one
address only ever evicts its own."""
HELLO_TIMEOUT_S = 3.0
"""A connection that has not sent its `hello` by then is closed: a peer speaks at once, only a
silent stranger waits, and it should not hold a slot for the whole proof deadline (issue 23)."""
LIMITED_DELAY_S = 1.0
"""A rate-limited address waits this long for its challenge: a legitimate peer still gets in, a
prober gets a handful of tries a second (issue 13, items 9 and 13)."""
LOOKUP_PAD_S = 0.005
"""The challenge leaves no sooner than this after the hello, whatever the credential lookup cost:
the answer's timing does not tell a known label from an unknown one (issue 13, item 13)."""


def keepalive_timeout(ping_interval: float) -> float:
    """How long a pong may take. A dead peer is noticed at worst one interval (until the next ping)
    plus this plus the close timeout: 0.75 + 0.2 keep that under two intervals."""
    return 0.75 * ping_interval


def close_timeout(ping_interval: float) -> float:
    """Waiting for a closing handshake from a peer that just failed its keepalive is waiting for the
    dead: keep it short (measured: a fixed 2 s made lost detection miss its 2-interval bound)."""
    return max(0.2, min(2.0, 0.2 * ping_interval))


def _typed(resp: Any, content_type: str) -> Any:
    del resp.headers["Content-Type"]  # websockets' Headers appends on assignment
    resp.headers["Content-Type"] = content_type
    return resp


@dataclass
class MindConfig:
    home: Path
    host: str = "127.0.0.1"
    port: int = 7470
    ping_interval: float = 10.0
    ping_timeout: float = 10.0
    tick_interval: float = 0.25
    retain_runs: int = 10_000
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_pending_handshakes: int = 1024
    auth_fail_limit: int = 10
    auth_fail_window: float = 60.0


class Unwelcomed:
    """Open connections not yet welcomed, per peer address (issue 13, item 10): counted from the TCP
    accept, before the HTTP upgrade, so sockets that never upgrade cannot use up the Mind's files.
    The same rule as pending handshakes (`PendingHandshakes`): one address holds at most
    `per_address` (a new socket over it is dropped at once), and a full table drops the oldest socket
    of the busiest address to make room; the rest end at the upgrade or handshake deadline."""

    def __init__(self, per_address: int = 1024, total: int = 1024) -> None:
        self._slots = HandshakeSlots(total, per_address)
        self._conns: dict[int, asyncio.Transport] = {}

    @property
    def max_total(self) -> int:
        return self._slots.total

    @max_total.setter
    def max_total(self, total: int) -> None:
        self._slots.total = total

    def admit(self, key: int, addr: str, transport: asyncio.Transport) -> bool:
        """Never refuses (issue 23): the oldest socket of a full address, or of a full table, goes."""
        for evicted in self._slots.admit(key, addr):
            old = self._conns.pop(evicted, None)
            if old is not None:
                old.abort()
        self._conns[key] = transport
        return True

    def spoke(self, key: int) -> None:
        """Its `hello` came: no longer counted against its address's quota of silent sockets, so
        peers behind one address that speak at once are never turned away for sharing it."""
        self._slots.spoke(key)

    def release(self, key: int) -> None:
        self._slots.done(key)
        self._conns.pop(key, None)


class CountedConnection(OneRequest, BatchingConnection):
    """A server connection that holds a slot in `Unwelcomed` from accept until welcome or close."""

    unwelcomed: Unwelcomed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        addr = str(peer[0]) if peer else "?"
        if not self.unwelcomed.admit(id(self), addr, cast(asyncio.Transport, transport)):
            cast(asyncio.Transport, transport).abort()

    def spoke(self) -> None:
        self.unwelcomed.spoke(id(self))

    def welcomed(self) -> None:
        self.unwelcomed.release(id(self))

    def connection_lost(self, exc: Exception | None) -> None:
        self.welcomed()
        super().connection_lost(exc)


def raise_open_files_limit(want: int = 65536) -> int:
    """One file per connection: the default soft limit (often 1,024) is lower than the Hands, clients
    and pending sockets the Mind is built for; raise it towards the hard limit (item 10). Returns
    the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open_files_limit_raised", soft=soft, now=target)
            return target
        except (ValueError, OSError):
            log.warning("open_files_limit_low", soft=soft, hard=hard)
    return want if soft == resource.RLIM_INFINITY else soft


def ensure_admin(store: Store, home: Path) -> None:
    """First start: make the local admin client credential the CLI finds by itself (0600)."""
    cred_file = paths.admin_cred_file(home)
    if cred_file.exists() and store.secret("client", "admin") is not None:
        return
    store.revoke("client", "admin")
    cred = store.add("client", "admin")
    paths.write_private(
        cred_file, "# mindhand admin client credential (full scope); keep private\n" + cred.token() + "\n"
    )


class Mind:
    def __init__(self, cfg: MindConfig) -> None:
        self.cfg = cfg
        self.store = Store(paths.db_path(cfg.home))
        self.snapshots = SnapshotStore(paths.db_path(cfg.home))
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mind-db")
        self._creds_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mind-creds")
        """The credential store's own thread: handshakes and `hands` must not queue behind a
        reconciliation's snapshot batches on the database thread (measured: a client's round trip
        went from ~40 ms to ~200 ms during a reconcile when both shared one thread)."""
        self.mind_id = self.store.mind_id()
        self.registry = RunRegistry(retain_finished=cfg.retain_runs)
        self.hands: dict[str, Peer] = {}
        self.clients: dict[str, Peer] = {}
        self.last_seen: dict[str, float] = {}
        self.url: str | None = None
        self._stop = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self.tasks = TaskService(self)
        self._pending = HandshakeSlots(cfg.max_pending_handshakes, MAX_PENDING_PER_ADDRESS)
        self._pending_ws: dict[int, tuple[str, Connection]] = {}
        """Each pending handshake's address and connection, to close the one `_pending` evicts."""
        self._evicted: set[int] = set()
        self._unwelcomed = Unwelcomed()
        self._accept_errors: list[float] = [-1e9, 0]
        """When the last accept error was logged, and how many since were not."""
        self._failures = AuthFailures()
        self._epoch = -1
        self.denials: dict[str, int] = {}
        self.rates = ClientRates()
        self.fleets = FleetOwners()
        self.metrics = MindMetrics()
        self.started = time.time()
        self._large_frames = False
        """A large frame came in since the last tick: the ticker gives its freed memory back (`heap`)."""

    # --- scopes ---

    def deny(self, peer: Peer, what: str, **fields: Any) -> str:
        """Count and log a request outside the client's scope; return the sentence for the client."""
        self.denials[what] = self.denials.get(what, 0) + 1
        self.metrics.denied.inc()
        log.warning(AuditEvent.DENIED_BY_SCOPE, client=peer.ident.label, what=what, **fields)
        return denial_message(peer.ident.label, Denial(what))

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call on the one database thread: never blocks the loop, and serialises writes."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, partial(fn, *args))

    async def creds(self, fn: Callable[..., T], *args: Any) -> T:
        """A call on the credential store (`mind.store.credentials`), off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._creds_thread, partial(fn, *args))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` on the server's task group, guarded: a failing coroutine there would otherwise
        stop `mind serve` (a TaskGroup cancels everything when one child raises). Logged with its
        traceback; the daemon goes on."""
        assert self._tg is not None
        self._tg.create_task(self._guarded(coro))

    @staticmethod
    async def _guarded(coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception:
            log.exception("background_failed", work=getattr(coro, "__qualname__", None))

    async def ask(self, peer: Peer, msg: Message, timeout: float = 10.0) -> Message:
        """Send a request to a Hand and wait for the reply with the same envelope id."""
        id_ = new_id("m")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        peer.pending[id_] = fut
        peer.outbox.put(msg, id_)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        finally:
            peer.pending.pop(id_, None)

    # --- lifecycle ---

    def stop(self) -> None:
        self._stop.set()

    def reload(self, reload: Callable[[], dict[str, Any]]) -> None:
        """SIGHUP: `reload` (the CLI re-reads its config file and applies the log level) returns the
        reloadable settings that changed; they apply to new connections. Live connections, runs and
        reconciliation passes are untouched. Never fatal."""
        try:
            changes = reload()
        except Exception:  # a reload must not stop the Mind
            log.exception("config_reload_crashed")
            return
        for name, value in changes.items():
            if name in ("max_pending_handshakes", "auth_fail_limit"):
                setattr(self.cfg, name, value)

    async def run(
        self, on_ready: Callable[[str], None] | None = None, reload: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        build_all()  # every validator built before the first connection, not on its first frame
        await self.creds(ensure_admin, self.store, self.cfg.home)
        staled = await self.db(self.snapshots.mark_all_stale)
        if staled:
            log.info("snapshots_marked_stale", count=staled, why="mind restart")
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_exception)
        # at most half the files for sockets not yet welcomed: the rest stay for Hands, clients, the db
        self._unwelcomed.max_total = min(self._unwelcomed.max_total, max(16, raise_open_files_limit() // 2))
        handlers: list[tuple[signal.Signals, Callable[[], None]]] = [
            (signal.SIGTERM, self.stop),
            (signal.SIGINT, self.stop),
        ]
        if reload is not None:
            handlers.append((signal.SIGHUP, lambda: self.reload(reload)))
        for sig, handler in handlers:
            try:
                loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError):
                pass
        ssl_ctx = None
        if self.cfg.tls_cert is not None and self.cfg.tls_key is not None:
            ssl_ctx = server_context(self.cfg.tls_cert, self.cfg.tls_key)
            der = ssl.PEM_cert_to_DER_cert(Path(self.cfg.tls_cert).read_text())  # noqa: ASYNC240 - before serving
            # The local CLI pins the daemon's own certificate by itself (like admin.cred).
            paths.write_private(paths.pin_file(self.cfg.home), fingerprint(der) + "\n")
        else:
            paths.pin_file(self.cfg.home).unlink(missing_ok=True)
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            async with serve(
                self._handler,
                self.cfg.host,
                self.cfg.port,
                process_request=self._http,
                create_connection=type("MindConnection", (CountedConnection,), {"unwelcomed": self._unwelcomed}),
                compression=None,
                max_size=limits.PREAUTH_MAX_FRAME_BYTES,  # raised per connection at welcome (`_handshake`)
                open_timeout=OPEN_TIMEOUT_S,
                ping_interval=self.cfg.ping_interval,
                ping_timeout=keepalive_timeout(self.cfg.ping_interval),
                close_timeout=close_timeout(self.cfg.ping_interval),
                backlog=1024,
                ssl=ssl_ctx,
            ) as server:
                port = next(iter(server.sockets)).getsockname()[1]
                host = self.cfg.host if ":" not in self.cfg.host else f"[{self.cfg.host}]"
                self.url = f"{'wss' if ssl_ctx else 'ws'}://{host}:{port}"
                paths.write_private(paths.url_file(self.cfg.home), self.url + "\n")
                log.info("mind_listening", url=self.url, mind_id=self.mind_id, pid=os.getpid())
                if on_ready:
                    on_ready(self.url)
                ticker = tg.create_task(self._ticker())
                lag_probe = tg.create_task(self._lag_probe())
                await self._stop.wait()
                log.info("mind_stopping")
                self.perform(self.registry.on_shutdown(time.monotonic(), time.time()))
                await self._flush_all(timeout=2.0)
                ticker.cancel()
                lag_probe.cancel()
                server.close(close_connections=True)
                await server.wait_closed()
        self.store.close()
        self.snapshots.close()
        self._db_thread.shutdown(wait=True)
        self._creds_thread.shutdown(wait=True)
        log.info("mind_stopped")

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Accept errors (out of files) come once per queued connection, thousands a second: log the
        first, then one summary at most every 10 s with how many were suppressed (item 10)."""
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._accept_errors[0] < 10.0:
            self._accept_errors[1] += 1
            return
        log.error("accept_failed", error=str(context.get("exception")), suppressed=self._accept_errors[1])
        self._accept_errors = [now, 0]

    async def _flush_all(self, timeout: float) -> None:
        peers = list(self.hands.values()) + list(self.clients.values())
        try:
            async with asyncio.timeout(timeout):
                for p in peers:
                    await p.outbox.drained.wait()
        except TimeoutError:
            pass

    async def _lag_probe(self) -> None:
        await probe_lag(self.metrics.observe_lag)

    async def _ticker(self) -> None:
        """Deadlines, credential changes and gauges. A failing tick is logged and the next one comes:
        the ticker is on the server's task group, where an exception would stop `mind serve`."""
        last_epoch_check = last_gauges = last_trim = 0.0
        while True:
            await asyncio.sleep(self.cfg.tick_interval)
            now = time.monotonic()
            try:
                self.perform(self.registry.on_tick(now, time.time()))
                if now - last_epoch_check >= 0.5:
                    last_epoch_check = now
                    await self._check_credentials()
                if self._large_frames and now - last_trim >= heap.TRIM_INTERVAL_S:
                    self._large_frames, last_trim = False, now
                    heap.trim()
                if now - last_gauges >= 2.0:
                    last_gauges = now
                    self.metrics.runs_active.set(len(self.registry.active()))
                    self.metrics.runs_retained.set(len(self.registry._runs))
                    self.metrics.snapshots_stale.set(await self.db(self.snapshots.count_stale))
            except Exception:
                log.exception("tick_failed")

    async def _check_credentials(self) -> None:
        """Close, at once, every connection whose credential was revoked or rotated (by `mind hand
        revoke`, `mind client rotate`, ... which change the database this daemon shares)."""
        epoch = await self.creds(self.store.epoch)
        if epoch == self._epoch:
            return
        self._epoch = epoch
        for peer in list(self.hands.values()) + list(self.clients.values()):
            current = await self.creds(self.store.secret, peer.ident.role, peer.ident.label)
            if current is None or hashlib.sha256(current).digest() != peer.secret_digest:
                why = "revoked" if current is None else "rotated"
                log.warning(
                    AuditEvent.CREDENTIAL_CLOSED, role=peer.ident.role, label=peer.ident.label, gen=peer.gen, why=why
                )
                peer.outbox.put(Error(code=ErrorCode.REVOKED, message=f"this credential was {why}"))
                peer.outbox.close()
                self.spawn(self._close_quietly(peer.ws, CLOSE_REVOKED, f"credential {why}"))

    # --- performing actions ---

    def perform(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, SendToHand):
                peer = self.hands.get(a.hand)
                if peer is not None and peer.gen == a.gen:
                    peer.outbox.put(a.msg)
            elif isinstance(a, SendToClient):
                peer = self.clients.get(a.client)
                if peer is not None:
                    peer.outbox.put(a.msg, a.req_id, droppable=a.droppable)
            elif isinstance(a, StartEnded):
                self.spawn(self.tasks.start_ended(a))
            elif isinstance(a, Log):
                getattr(log, LOG_LEVELS.get(a.event, "info"))(a.event, **a.fields)
                if a.event == AuditEvent.RUN_TERMINAL:
                    f = a.fields
                    self.metrics.runs.labels(f["state"]).inc()
                    self.metrics.run_seconds.observe(f["duration_ms"] / 1000)
                    if f["progress_dropped"]:
                        self.metrics.progress_dropped.inc(f["progress_dropped"])
                elif a.event in (AuditEvent.HAND_INPUT_WRONG_GENERATION, AuditEvent.HAND_INPUT_UNKNOWN_RUN):
                    self.metrics.foreign.inc()

    # --- connections ---

    def _rate_limited(self, addr: str, now: float) -> bool:
        return self._failures.limited(addr, now, self.cfg.auth_fail_limit, self.cfg.auth_fail_window)

    def _failed(self, addr: str, now: float) -> None:
        self._failures.failed(addr, now)

    async def _handler(self, ws: ServerConnection) -> None:
        channel = Channel()
        peer_addr = ws.remote_address[0] if ws.remote_address else "?"
        now = time.monotonic()
        # A limited address is slowed and its failures are answered `rate_limited`, but a correct
        # proof is still welcomed: strangers behind the same NAT cannot lock a peer out (item 9).
        limited = self._rate_limited(peer_addr, now)
        seen_epoch = self._epoch
        key = id(ws)
        self._pending.total = self.cfg.max_pending_handshakes  # (reloadable)
        for evicted in self._pending.admit(key, peer_addr):
            old = self._pending_ws.pop(evicted, None)
            if old is not None:  # the oldest silent one of its address, or of the table: not a failure
                log.warning(AuditEvent.HANDSHAKE_REFUSED, peer=old[0], why="evicted")
                self._evicted.add(evicted)
                self.spawn(self._close_quietly(old[1], CLOSE_TRY_LATER, "busy: evicted for a newer handshake"))
        self._pending_ws[key] = (peer_addr, ws)
        stage: list[str] = []  # "hello" once a challenge is owed: a close after it is an abandon (item 13)
        try:
            async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
                ident, gen, secret = await self._handshake(ws, channel, limited, stage)
        except TimeoutError:
            self.metrics.handshakes.labels("failed").inc()
            self._failed(peer_addr, now)
            log.info(AuditEvent.HANDSHAKE_FAILED, peer=peer_addr, code=ErrorCode.HANDSHAKE_TIMEOUT.value)
            await self._refuse(ws, channel, ProtocolError(ErrorCode.HANDSHAKE_TIMEOUT, "handshake took too long"))
            return
        except ProtocolError as exc:
            self.metrics.handshakes.labels("failed").inc()
            self._failed(peer_addr, now)
            if limited and exc.code is ErrorCode.AUTH_FAILED:
                log.warning(AuditEvent.HANDSHAKE_REFUSED, peer=peer_addr, why="rate_limited", code=exc.code.value)
                exc = ProtocolError(ErrorCode.RATE_LIMITED, "too many failed handshakes from this address; try later")
            else:
                log.info(AuditEvent.HANDSHAKE_FAILED, peer=peer_addr, code=exc.code.value, reason=exc.message)
            await self._refuse(ws, channel, exc)
            return
        except ConnectionClosed:
            if stage and key not in self._evicted:
                self.metrics.handshakes.labels("failed").inc()
                self._failed(peer_addr, now)
                log.info(AuditEvent.HANDSHAKE_FAILED, peer=peer_addr, code="abandoned")
            return
        except Exception:  # our failure, not the peer's: not counted against its address
            self.metrics.handshakes.labels("failed").inc()
            log.exception("handshake_crashed", peer=peer_addr)
            await self._refuse(
                ws, channel, ProtocolError(ErrorCode.INTERNAL_ERROR, "the mind failed during the handshake; try again")
            )
            return
        finally:
            self._pending.done(key)
            self._pending_ws.pop(key, None)
            self._evicted.discard(key)
        outbox = Outbox(ws, channel)
        peer = Peer(
            ident=ident, gen=gen, ws=ws, outbox=outbox, since=time.time(), secret_digest=hashlib.sha256(secret).digest()
        )
        if ident.role == "hand":
            outbox.on_refused = peer.fail_request
        outbox.on_overflow = ws.transport.abort  # a peer that does not read is closed, not buffered
        if ident.role == "client":
            # Full scope is what the credential was created with (no stored scope), never a name.
            peer.scope = Scope.from_json(await self.creds(self.store.scope, "client", ident.label))
        # The ticker sweeps the registered peers when the credentials change; this one registers
        # only when served (below, with no await before): a change it noticed since the handshake
        # began is checked here, until none slipped in (item 6).
        while self._epoch != seen_epoch:
            seen_epoch = self._epoch
            if await self.creds(self.store.secret, ident.role, ident.label) != secret:
                log.warning(AuditEvent.CREDENTIAL_CLOSED, role=ident.role, label=ident.label, gen=gen, why="revoked")
                await self._refuse(ws, channel, ProtocolError(ErrorCode.REVOKED, "this credential was revoked"))
                return
        log.info(AuditEvent.HANDSHAKE_OK, peer=peer_addr, role=ident.role, label=ident.label, gen=gen)
        self.metrics.handshakes.labels("ok").inc()
        try:
            async with asyncio.TaskGroup() as tg:
                peer.tg = tg
                writer = tg.create_task(outbox.run())
                try:
                    if ident.role == "hand":
                        await self._serve_hand(peer)
                    else:
                        await self._serve_client(peer)
                finally:
                    outbox.close()
                    try:
                        async with asyncio.timeout(2):
                            await asyncio.shield(writer)
                    except (TimeoutError, ConnectionClosed):
                        writer.cancel()
        except Exception:  # every request is guarded; this is the last resort, logged where we look
            log.exception("connection_failed", role=ident.role, label=ident.label, gen=gen, conn=peer.conn_id)
            await self._close_quietly(ws, CLOSE_INTERNAL, "internal error")

    def _http(self, connection: ServerConnection, request: Any) -> Any:
        """Plain HTTP on the same port: `GET /healthz` and `GET /metrics`; anything else goes on to
        the WebSocket handshake (which refuses a request that is not an upgrade)."""
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            body = json.dumps(
                {
                    "status": "ok",
                    "version": VERSION,
                    "mind_id": self.mind_id,
                    "uptime_s": round(time.time() - self.started, 3),
                    "hands_connected": len(self.hands),
                    "clients_connected": len(self.clients),
                    "runs_active": len(self.registry.active()),
                }
            )
            return _typed(connection.respond(200, body), "application/json")
        if path == "/metrics":
            return _typed(
                connection.respond(200, self.metrics.render().decode()), "text/plain; version=0.0.4; charset=utf-8"
            )
        return None

    async def _refuse(self, ws: Connection, channel: Channel, exc: ProtocolError) -> None:
        code = {
            ErrorCode.AUTH_FAILED: CLOSE_POLICY,
            ErrorCode.HANDSHAKE_TIMEOUT: CLOSE_POLICY,
            ErrorCode.RATE_LIMITED: CLOSE_TRY_LATER,
            ErrorCode.BUSY: CLOSE_TRY_LATER,
            ErrorCode.REVOKED: CLOSE_REVOKED,
            ErrorCode.INTERNAL_ERROR: CLOSE_INTERNAL,
        }.get(exc.code, CLOSE_PROTOCOL)
        try:
            await ws.send(channel.stamp(Error(code=exc.code, message=exc.message)))
            await ws.close(code, exc.code.value)
        except (ConnectionClosed, ProtocolError):
            pass

    async def _recv(self, ws: Connection, channel: Channel) -> Message:
        data = await ws.recv()
        return channel.receive(data).msg

    async def _handshake(
        self, ws: Connection, channel: Channel, limited: bool = False, stage: list[str] | None = None
    ) -> tuple[Identity, int, bytes]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                msg = await self._recv(ws, channel)
        except TimeoutError:
            raise ProtocolError(ErrorCode.HANDSHAKE_TIMEOUT, "no hello in time") from None
        if not isinstance(msg, Hello):
            raise ProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE, f"expected hello, got {msg.TYPE}: nothing is acted on before welcome"
            )
        if stage is not None:
            stage.append("hello")
        self._pending.spoke(id(ws))
        if isinstance(ws, CountedConnection):
            ws.spoke()
        started = loop.time()
        secret = await self.creds(self.store.secret, msg.role, msg.label)
        hs = ServerHandshake(self.mind_id, new_id("hs"), os.urandom(limits.NONCE_BYTES), loop.time())
        challenge = hs.on_hello(msg, secret, os.urandom(limits.SECRET_BYTES), loop.time())
        await asyncio.sleep(max(0.0, started + (LIMITED_DELAY_S if limited else LOOKUP_PAD_S) - loop.time()))
        await ws.send(channel.stamp(challenge))
        proof = await self._recv(ws, channel)
        if not isinstance(proof, Proof):
            raise ProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE, f"expected proof, got {proof.TYPE}: nothing is acted on before welcome"
            )
        ident = hs.on_proof(proof, loop.time())
        # Revoked or rotated while this handshake waited for its proof (item 6): the table decides
        # now, not when the hello came in. Same answer as any wrong secret.
        if await self.creds(self.store.secret, ident.role, ident.label) != secret:
            raise ProtocolError(ErrorCode.AUTH_FAILED, AUTH_FAILED_MESSAGE)
        gen = await self.creds(self.store.next_generation, ident.role, ident.label)
        channel.gen = gen
        # Past the proof the peer may send full-size frames: a Hand's results, a client's requests.
        ws.protocol.max_message_size = limits.MAX_FRAME_BYTES if ident.role == "hand" else limits.CLIENT_MAX_FRAME_BYTES
        if isinstance(ws, CountedConnection):
            ws.welcomed()
        await ws.send(channel.stamp(hs.welcome(gen, self.cfg.ping_interval)))
        assert secret is not None  # a verified proof implies a known secret
        return ident, gen, secret

    # --- hands ---

    async def _serve_hand(self, peer: Peer) -> None:
        label, gen = peer.ident.label, peer.gen
        hlog = log.bind(hand=label, gen=gen)
        old = self.hands.get(label)
        self.hands[label] = peer
        if old is not None:
            # The newer connection wins at once: the old one may be a dead socket nobody noticed yet.
            hlog.info("hand_replaced", old_gen=old.gen)
            self.last_seen[label] = time.time()
            self.perform(self.registry.on_hand_gone(label, old.gen, time.monotonic(), time.time()))
            old.outbox.close()
            self.spawn(self._close_quietly(old.ws, CLOSE_REPLACED, "replaced by a newer connection"))
        hlog.info("hand_connected", claims=peer.ident.claims.model_dump() if peer.ident.claims else None)
        self.metrics.hands_connected.set(len(self.hands))
        peer.spawn(self.tasks.reconcile(peer))
        try:
            await self._read_loop(peer, self._on_hand_message)
        finally:
            peer.fail_pending("hand disconnected")
            if self.hands.get(label) is peer:
                del self.hands[label]
                self.last_seen[label] = time.time()
                self.perform(self.registry.on_hand_gone(label, gen, time.monotonic(), time.time()))
                self.metrics.hands_connected.set(len(self.hands))
                staled = await self.db(self.snapshots.mark_hand_stale, label)
                hlog.info("hand_disconnected", snapshots_marked_stale=staled)
            else:
                hlog.info("hand_disconnected", replaced=True)

    async def _close_quietly(self, ws: Connection, code: int, reason: str) -> None:
        try:
            await ws.close(code, reason)
        except Exception:  # the socket may already be gone; nothing to do
            pass

    async def _read_loop(self, peer: Peer, on_message: Callable[[Peer, str | None, Message], None]) -> None:
        channel = peer.outbox._channel
        try:
            async for data in peer.ws:
                if len(data) >= heap.LARGE_FRAME:
                    self._large_frames = True
                env = None
                try:
                    env = channel.receive(data)
                    on_message(peer, env.id, env.msg)
                    if peer.rate is not None:
                        stream = isinstance(env.msg, (StreamData, StreamAck))
                        if (wait := peer.rate.take(len(data), time.monotonic(), stream)) > 0:
                            await asyncio.sleep(wait)  # over its rate: the client waits, its socket unread
                        await peer.wait_for_room(CLIENT_REQUESTS_IN_FLIGHT)
                except ProtocolError as exc:
                    log.warning(
                        "peer_protocol_error",
                        role=peer.ident.role,
                        label=peer.ident.label,
                        gen=peer.gen,
                        code=exc.code.value,
                        reason=exc.message,
                    )
                    peer.outbox.put(Error(code=exc.code, message=exc.message))
                    peer.outbox.close()
                    await peer.outbox.drained.wait()
                    await self._close_quietly(peer.ws, CLOSE_PROTOCOL, exc.code.value)
                    return
                except Exception:
                    self._message_failed(peer, env)
                del data, env  # hold no frame while waiting for the next: a 4 MiB result would stay alive
        except ConnectionClosed:
            return

    def _message_failed(self, peer: Peer, env: Envelope[Message] | None) -> None:
        """A bug while serving one frame ends that request only; the connection and the daemon go
        on. A client's request gets `internal_error`. A Hand's report on a run ends that run `lost`
        (the Mind could not take in how it went: nobody can know) and the Hand is told to stop it;
        a Hand can only end its own runs this way, on its own generation."""
        msg = env.msg if env is not None else None
        log.exception(
            "request_failed",
            role=peer.ident.role,
            label=peer.ident.label,
            gen=peer.gen,
            conn=peer.conn_id,
            type=msg.TYPE if msg is not None else None,
            req=env.id if env is not None else None,
        )
        if env is None or msg is None:
            return  # the frame did not decode: nothing names what to answer
        try:
            if peer.ident.role == "client":
                if env.id is not None:
                    peer.outbox.put(INTERNAL_ERROR, env.id)
                return
            run_id = getattr(msg, "run_id", None)
            if isinstance(run_id, str):
                now, wall = time.monotonic(), time.time()
                self.perform(self.registry.on_internal_failure(run_id, peer.ident.label, peer.gen, msg.TYPE, now, wall))
        except Exception:
            log.exception("request_failure_unanswered", role=peer.ident.role, label=peer.ident.label, gen=peer.gen)

    def _on_hand_message(self, peer: Peer, id_: str | None, msg: Message) -> None:
        label, gen = peer.ident.label, peer.gen
        now, wall = time.monotonic(), time.time()
        r = self.registry
        if isinstance(msg, Progress):
            acts = r.on_progress(msg, label, gen)
        elif isinstance(msg, (StreamData, StreamAck)):
            acts = r.on_hand_stream(msg, label, gen)
        elif isinstance(msg, Accepted):
            acts = r.on_accepted(msg.run_id, label, gen, now)
        elif isinstance(msg, Started):
            acts = r.on_started(msg.run_id, label, gen, now)
        elif isinstance(msg, Rejected):
            acts = r.on_rejected(msg.run_id, label, gen, msg.code, msg.message, now, wall)
        elif isinstance(msg, Result):
            acts = r.on_result(msg, label, gen, now, wall)
        elif isinstance(msg, CancelResult):
            acts = r.on_cancel_result(msg.run_id, label, gen, msg.status, now, wall)
        elif id_ is not None and id_ in peer.pending:
            fut = peer.pending.pop(id_)
            if not fut.done():
                fut.set_result(msg)
            return
        elif isinstance(msg, TaskUpdate):
            peer.spawn(self.tasks.on_update(peer, msg.task))
            return
        elif isinstance(msg, REPLY_TYPES) and id_ is not None:
            # A reply whose request already gave up (timeout): harmless, and not a protocol error.
            log.info("late_reply", hand=label, gen=gen, type=msg.TYPE)
            return
        elif isinstance(msg, Error):
            log.warning("hand_error", hand=label, gen=gen, code=msg.code.value, reason=msg.message)
            return
        else:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a hand may not send {msg.TYPE} here")
        self.perform(acts)

    # --- clients ---

    async def _serve_client(self, peer: Peer) -> None:
        self.clients[peer.conn_id] = peer
        peer.rate = self.rates.join(peer.ident.label, time.monotonic())
        self.metrics.clients_connected.set(len(self.clients))
        clog = log.bind(client=peer.ident.label, conn=peer.conn_id)
        clog.debug("client_connected")
        try:
            await self._read_loop(peer, self._on_client_message)
        finally:
            self.rates.leave(peer.ident.label)
            self.clients.pop(peer.conn_id, None)
            self.metrics.clients_connected.set(len(self.clients))
            self.perform(self.registry.on_client_gone(peer.conn_id, time.monotonic(), time.time()))
            clog.debug("client_disconnected")

    def _on_client_message(self, peer: Peer, id_: str | None, msg: Message) -> None:
        if isinstance(msg, (StreamData, StreamAck, Resize)):  # a run's bytes, not a request: no answer
            self.perform(self.registry.on_client_stream(msg, peer.conn_id))
            return
        if id_ is None:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"a {msg.TYPE} request needs an envelope id")
        if isinstance(msg, (Exec, TaskStart)) and (problem := args_problem(msg.args)) is not None:
            # before any digest, record or re-encode: their cost grows with the values (item 5)
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message=f"invalid {msg.TYPE}: {problem}"), id_)
            return
        now, wall = time.monotonic(), time.time()
        me, scope = peer.ident.label, peer.scope
        if isinstance(msg, Exec):
            refusal = None
            denial = use_denial(scope, msg.hand, msg.tool)
            if denial is not None:
                refusal = (RejectCode.DENIED_BY_SCOPE, self.deny(peer, denial.what, **denial.fields))
            elif msg.fleet is not None and self.fleets.problem(msg.fleet, me) is not None:
                refusal = (RejectCode.DENIED_BY_SCOPE, self.deny(peer, f"join fleet {msg.fleet}", fleet=msg.fleet))
                msg = msg.model_copy(update={"fleet": None})  # refused, and never listed as a member
            elif msg.streams is not None:
                want = stream_windows(msg.streams.stdin, msg.streams.pty is not None)
                held = sum(len(r.relays) for r in self.registry.active() if r.owner == me) * limits.STREAM_WINDOW
                if (problem := stream_budget_problem(held, want)) is not None:
                    refusal = (RejectCode.QUOTA_EXCEEDED, problem)
            live = self.hands.get(msg.hand)
            if live is None and refusal is None:
                # Offline or unknown: the credentials table says which, read on the database thread.
                peer.spawn(self._admit_offline(peer, id_, msg), reply_to=id_)
                return
            self._admit(peer, id_, msg, live, True, refusal)
        elif isinstance(msg, (CancelRun, GetRun)):
            run = self.registry.get(msg.run_id)
            if run is None:
                peer.outbox.put(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {msg.run_id}"), id_)
                return
            verb = "cancel" if isinstance(msg, CancelRun) else "read"
            denial = touch_denial(scope, me, run.hand, run.owner, f"{verb} run {msg.run_id}", run_id=msg.run_id)
            if denial is not None:
                why = self.deny(peer, denial.what, **denial.fields)
                peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
                return
            if isinstance(msg, GetRun):
                peer.outbox.put(run.info(), id_)
                return
            status, acts = self.registry.on_cancel(msg.run_id, CancelReason.USER_REQUESTED, now, wall)
            self.perform(acts)  # the Hand's `cancel` is queued (and written) before the acknowledgement
            peer.outbox.put(CancelRunResult(run_id=msg.run_id, status=status, state=run.state), id_)
        elif isinstance(msg, ListHands):
            peer.spawn(self._list_hands(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, ListRuns):
            self._list_runs(peer, id_, msg)
        elif isinstance(msg, SelectHands):
            peer.spawn(self._select_hands(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, WhichConnected):
            up = [n for n in dict.fromkeys(msg.names) if n in self.hands and scope.allows_hand(n)]
            peer.outbox.put(ConnectedNames(names=up), id_)
        elif isinstance(msg, FleetOpen):
            fleet = new_id("fleet-")
            self.fleets.opened(fleet, me)
            peer.outbox.put(FleetOpened(fleet=fleet), id_)
        elif isinstance(msg, GetStatus):
            peer.spawn(self._status(peer, id_), reply_to=id_)
        elif isinstance(msg, TaskStart):
            peer.spawn(self.tasks.start(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskGet):
            peer.spawn(self.tasks.get(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskLogs):
            peer.spawn(self.tasks.logs(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskCancelRequest):
            peer.spawn(self.tasks.cancel(peer, id_, msg), reply_to=id_)
        elif isinstance(msg, TaskList):
            peer.spawn(self.tasks.list(peer, id_, msg), reply_to=id_)
        else:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a client may not send {msg.TYPE}")

    def _admit(
        self, peer: Peer, id_: str, msg: Exec, live: Peer | None, known: bool, refusal: tuple[RejectCode, str] | None
    ) -> None:
        self.perform(
            self.registry.admit(
                new_id("r"),
                msg,
                peer.conn_id,
                id_,
                live.gen if live else None,
                known,
                time.monotonic(),
                time.time(),
                owner=peer.ident.label,
                refusal=refusal,
            )
        )

    async def _admit_offline(self, peer: Peer, id_: str, msg: Exec) -> None:
        """An exec for a Hand with no connection: `unknown_hand` or `hand_offline` by the store. If
        the Hand connected meanwhile, the run goes to it; if the client left, nothing is admitted."""
        known = await self.creds(self.store.secret, "hand", msg.hand) is not None
        if self.clients.get(peer.conn_id) is not peer:
            return
        live = self.hands.get(msg.hand)
        self._admit(peer, id_, msg, live, known or live is not None, None)

    def _list_runs(self, peer: Peer, id_: str, msg: ListRuns) -> None:
        """One page of run history, newest first, bounded in count and bytes (`mind.core.paging`);
        the cursor is the admission number of the last run sent, so pages never repeat a run."""
        if msg.after is not None and not (msg.after.isascii() and msg.after.isdigit()):
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message="after: not a cursor of run_list"), id_)
            return
        scope, me = peer.scope, peer.ident.label
        before = None if msg.after is None else int(msg.after)
        runs = (
            (r, r.info())
            for r in self.registry.history(msg.hand, msg.state, msg.since, before, msg.fleet)
            if scope.allows_hand(r.hand) and scope.may_touch(r.owner, me)
        )
        taken, more = page(runs, msg.limit, lambda item: payload_size(item[1]))
        cursor = str(taken[-1][0].seq) if more and taken else None
        peer.outbox.put(RunList(runs=[info for _, info in taken], next_after=cursor), id_)

    async def _select_hands(self, peer: Peer, id_: str, msg: SelectHands) -> None:
        """A fleet selector resolved here, over the credential table (names and the operator's
        labels, read afresh, so `mind hand label` applies at once) and the live connections; only
        Hands in the client's scope can match (DESIGN §12). A Hand's claims play no part."""
        from mind.core import selector

        try:
            sel = selector.parse(msg.selector)
        except selector.SelectorError as exc:
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message=str(exc)), id_)
            return
        after, scope = msg.after, peer.scope
        needs_labels = sel.needs_labels

        def candidates() -> list[tuple[str, int, dict[str, str]]]:
            """On the credential thread, off the loop: the rows read and matched (issue 23)."""
            out = []
            for row in self.store.list("hand"):
                if row.revoked_at is not None or (after is not None and row.label <= after):
                    continue
                if not scope.allows_hand(row.label):
                    continue
                labels = row.label_map() if needs_labels else {}
                if sel.matches(row.label, labels):
                    out.append((row.label, row.generation, labels or row.label_map()))
            return out

        found = await self.creds(candidates)

        def matching() -> Iterator[SelectedHand]:
            for name, generation, labels in found:
                live = self.hands.get(name)
                gen = live.gen if live else generation
                yield SelectedHand(name=name, connected=live is not None, generation=gen, labels=labels)

        hands = matching()
        taken, more = page(hands, msg.limit, payload_size)
        peer.outbox.put(HandsSelected(hands=taken, next_after=taken[-1].name if more and taken else None), id_)

    async def _list_hands(self, peer: Peer, id_: str, msg: ListHands) -> None:
        """One page of the Hands, by name (the cursor is the last name sent)."""
        after, scope = msg.after, peer.scope
        hands = (h for h in await self.hand_infos() if scope.allows_hand(h.name) and (after is None or h.name > after))
        taken, more = page(hands, msg.limit, payload_size)
        peer.outbox.put(HandsList(hands=taken, next_after=taken[-1].name if more and taken else None), id_)

    async def _status(self, peer: Peer, id_: str) -> None:
        """One screen, bounded whatever the fleet: the first Hands and the longest-running runs, with
        their totals; `mind hands` and `mind runs` page through the rest."""
        scope, me = peer.scope, peer.ident.label
        visible = lambda r: scope.allows_hand(r.hand) and scope.may_touch(r.owner, me)
        failed = (r.info() for r in self.registry.history() if r.state in FAILURE_STATES and visible(r))
        failures, _ = page(failed, STATUS_FAILURES, payload_size, STATUS_LIST_BYTES)
        active = [r for r in self.registry.active() if visible(r)]
        active_infos, _ = page((r.info() for r in active), STATUS_LIST_MAX, payload_size, STATUS_LIST_BYTES)
        all_hands = [h for h in await self.hand_infos() if scope.allows_hand(h.name)]
        first = sorted(all_hands, key=lambda h: not h.connected)  # (stable: by name within each)
        hands = sorted(page(first, STATUS_LIST_MAX, payload_size, STATUS_LIST_BYTES)[0], key=lambda h: h.name)
        if scope.read_others and scope.hands == ("*",):
            counts = await self.db(self.snapshots.counts_by_state)
            stale = await self.db(self.snapshots.count_stale)
        else:  # a scoped client counts only the tasks it could list (issue 13)
            counts, stale = await self.db(
                self.snapshots.counts_visible,
                lambda hand, owner: scope.allows_hand(hand) and scope.may_touch(owner, me),
            )
        peer.outbox.put(
            StatusReply(
                version=VERSION,
                mind_id=self.mind_id,
                uptime_s=round(time.time() - self.started, 3),
                hands=hands,
                active_runs=active_infos,
                recent_failures=failures,
                task_counts=counts,
                stale_snapshots=stale,
                retained_runs=len(self.registry._runs),
                hands_total=len(all_hands),
                hands_connected=sum(1 for h in all_hands if h.connected),
                active_runs_total=len(active),
            ),
            id_,
        )

    async def hand_infos(self) -> list[HandInfo]:
        out = []
        for row in await self.creds(self.store.list, "hand"):
            if row.revoked_at is not None and row.label not in self.hands:
                continue
            live = self.hands.get(row.label)
            claims: HandClaims | None = live.ident.claims if live else None
            out.append(
                HandInfo(
                    name=row.label,
                    connected=live is not None,
                    generation=live.gen if live else row.generation,
                    since=live.since if live else (self.last_seen.get(row.label) or row.last_seen_at),
                    claims=claims,
                    running=self.registry.running_on(row.label),
                    labels=row.label_map(),
                )
            )
        return out
