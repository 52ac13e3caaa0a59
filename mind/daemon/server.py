"""The Mind daemon's asyncio shell: the server that owns everything, and the action performer.

Thin on purpose: read frame -> decode -> feed the registry (or handshake) -> perform the returned
actions. Every rule lives in `mind/core/`; the rooms of this shell are named for what they hold:
`door` (accept to welcome), `connections` (welcome to close, the reader), `dispatch` (each frame),
`views` (the answers that only read), `taskservice` (background tasks), `http` (`/healthz`,
`/metrics`). This module builds them, owns the tasks (one TaskGroup for the server, one per
connection, `Peer.spawn`), the database threads, the ticker and the performer of registry actions.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import resource
import signal
import socket
import sqlite3
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog
from websockets.asyncio.server import ServerConnection, serve

from mind import home as paths
from mind.core.admission import Denial, denial_message
from mind.core.recording import Mode
from mind.core.registry import Action, Log, PersistEnding, RunRegistry, SendToClient, SendToHand, StartEnded
from mind.core.runs import FrameToClient, FrameToHand
from mind.daemon import http
from mind.daemon.connections import Connections
from mind.daemon.dispatch import Dispatch
from mind.daemon.door import OPEN_TIMEOUT_S, Door
from mind.daemon.grouped import HeldActions, ResultAcks
from mind.daemon.host import MindConfig
from mind.daemon.metrics import MindMetrics
from mind.daemon.nodes import NodeShell
from mind.daemon.peer import CLOSE_REVOKED, Peer, close_quietly
from mind.daemon.recorder import Recorder
from mind.daemon.recorder import Settings as RecordSettings
from mind.daemon.route import Router
from mind.daemon.taskservice import TaskService
from mind.daemon.views import Views
from mind.store.api import (
    Credentials,
    Endings,
    Fenced,
    History,
    Nodes,
    SchemaTooNew,
    Snapshots,
    Stores,
    StoreUnavailable,
)
from mind.store.endings import Ending
from mind.store.engines import open_stores
from mind.store.recordings import RecordingKeyError, Recordings, load_key
from protocol import limits
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, ErrorCode
from protocol.errors import MindhandError
from protocol.ids import new_id
from protocol.io import heap
from protocol.io.loop import probe_lag
from protocol.io.tls import fingerprint, server_context
from protocol.messages import Error, Message, ResultAck, RunInfo, build_all

__all__ = [
    "CannotOpen",
    "Mind",
    "MindConfig",
    "close_timeout",
    "ensure_admin",
    "raise_open_files_limit",
]

log = structlog.get_logger(component="mind")
T = TypeVar("T")
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


def close_timeout(ping_interval: float) -> float:
    """Waiting for a closing handshake from a peer that is going away may be waiting for the dead:
    keep it short (measured: a fixed 2 s made lost detection miss its 2-interval bound)."""
    return max(0.2, min(2.0, 0.2 * ping_interval))


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


class CannotOpen(MindhandError):
    """The Mind's state could not be opened: the sentence for the operator and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


HISTORY_FLUSH_S = 0.2
HISTORY_QUEUE_MAX = 100_000
EXIT_STATE = 1
"""`mind serve` could not open its home or reach its database."""
EXIT_SCHEMA_TOO_NEW = 3
"""The shared database was migrated by a newer Mind: this one refuses to write to it."""


async def ensure_admin(store: Credentials, home: Path, shared: bool = False) -> None:
    """First start: make the local admin client credential the CLI finds by itself (0600).

    `shared` (a database many nodes use): the admin credential is one row, made by the first node
    that finds none; every other node writes that same secret to its own home, so `admin.cred`
    works against any node and two nodes starting at once never revoke each other's (the insert
    that loses the race reads the winner's row)."""
    cred_file = paths.admin_cred_file(home)
    if not shared:
        if cred_file.exists() and await store.secret("client", "admin") is not None:
            return
        await store.revoke("client", "admin")
        cred = await store.add("client", "admin")
        paths.write_private(
            cred_file, "# mindhand admin client credential (full scope); keep private\n" + cred.token() + "\n"
        )
        return
    from mind.store.credentials import StoreError

    secret = await store.secret("client", "admin")
    if secret is None:
        try:
            secret = (await store.add("client", "admin")).secret
        except StoreError:  # another node made it first: use theirs
            secret = await store.secret("client", "admin")
    if secret is None:
        raise StoreUnavailable("the admin credential vanished while this node started; start it again")
    _write_admin(cred_file, secret)


async def refresh_admin(store: Credentials, home: Path) -> None:
    """A shared database's credentials changed: if the admin credential was rotated (through any
    node), this node's `admin.cred` follows, so the local CLI keeps working. A revoked one is left
    revoked (it is made again only at a node's next start, as on one Mind)."""
    secret = await store.secret("client", "admin")
    if secret is not None:
        _write_admin(paths.admin_cred_file(home), secret)


def _write_admin(cred_file: Path, secret: bytes) -> None:
    from protocol.auth import Credential

    token = Credential(role="client", label="admin", secret=secret).token()
    text = "# mindhand admin client credential (full scope, shared by every node); keep private\n" + token + "\n"
    try:
        if cred_file.read_text() == text:
            return
    except FileNotFoundError:
        pass
    paths.write_private(cred_file, text)


class Mind:
    def __init__(self, cfg: MindConfig) -> None:
        self.cfg = cfg
        self.stores: Stores | None = None
        """Opened by `open` (at the start of `run`): SQLite in the home, or the shared PostgreSQL."""
        self.store: Credentials
        self.snapshots: Snapshots
        self.endings: Endings
        """The endings this Mind decided by itself, written before anyone hears of them."""
        self.mind_id = ""
        self.registry = RunRegistry(
            retain_finished=cfg.retain_runs, resume_window=cfg.resume_window, keep_max=cfg.keep_max
        )
        self.history: History | None = None
        """Finished runs' metadata in the shared database (PostgreSQL); None: this Mind's memory only."""
        self._history_queue: list[tuple[str, RunInfo]] = []
        self.held = HeldActions(self._perform_one, self._commit_endings)
        """Actions waiting for their endings' commit, one transaction a turn of the loop (`grouped`)."""
        self.acks = ResultAcks()
        self.hands: dict[str, Peer] = {}
        self.clients: dict[str, Peer] = {}
        self.last_seen: dict[str, float] = {}
        self.url: str | None = None
        self._stop = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._accept_errors: list[float] = [-1e9, 0]
        """When the last accept error was logged, and how many since were not."""
        self.epoch = -1
        """The credential table's epoch the last sweep saw (`_check_credentials`)."""
        self._epoch_due = False
        """A NOTIFY said the credentials changed: the next tick sweeps, whatever the poll's pace."""
        self.nodes: NodeShell | None = None
        """On a shared database: this node's lease and claims (`mind.daemon.nodes`)."""
        self.router: Router | None = None
        """On a shared database, once it listens: its links to the other nodes (`mind.daemon.route`)."""
        self.denials: dict[str, int] = {}
        self.metrics = MindMetrics()
        self.started = time.time()
        self.large_frames = False
        """A large frame came in since the last tick: the ticker gives its freed memory back (`heap`)."""
        self.recordings: Recordings | None = None
        """The recordings store (DESIGN §19), opened with the stores; kept when `--record off` (the
        recordings made before are still listed and played)."""
        self.recorder: Recorder | None = None
        self.recording_key: bytes | None = None
        self.tasks = TaskService(self)
        self.views = Views(self)
        self.dispatch = Dispatch(self, self.tasks, self.views)
        self.door = Door(self)
        self.connections = Connections(self, self.dispatch, self.tasks)

    async def open(self) -> None:
        """Open the stores (migrating a shared database) and take back what the last life ended.
        Raises `CannotOpen` with the sentence `mind serve` prints."""
        where = "the database" if self.cfg.database else f"state in {self.cfg.home}"
        try:
            self.stores = stores = await open_stores(self.cfg.home, self.cfg.database, self._node_name())
            self.store, self.snapshots, self.endings = stores.credentials, stores.snapshots, stores.endings
            self.history = stores.history
            self._open_recordings(stores)
            self.mind_id = await self.store.mind_id()
            self._record_database()
            self.registry.seal_key = await self.store.seal_key()
            await self._restore_endings()
            if stores.nodes is not None:
                self.nodes = NodeShell(self, stores.nodes, self.cfg.node_lease, self.epoch_changed)
                await self.nodes.renew()  # live before the first Hand is claimed
                if self.cfg.resume_window > 0:
                    # A Hand that moves here from another node presents runs this node never
                    # admitted: adopted (unless a node ended them: `NodeShell.claim`), and a client
                    # attaching to one before its Hand arrives is told to wait, not that it is unknown.
                    self.registry.expect_presentations(float("inf"))
        except SchemaTooNew as exc:
            raise CannotOpen(str(exc), EXIT_SCHEMA_TOO_NEW) from None
        except RecordingKeyError as exc:
            raise CannotOpen(str(exc), EXIT_STATE) from None
        except StoreUnavailable as exc:
            raise CannotOpen(str(exc), EXIT_STATE) from None
        except (OSError, sqlite3.Error) as exc:
            raise CannotOpen(f"cannot open {where}: {exc}", EXIT_STATE) from None
        log.info("mind_store_opened", engine=stores.engine)

    def _open_recordings(self, stores: Stores) -> None:
        cfg = self.cfg
        key = self.recording_key = load_key(cfg.home, cfg.record_key)
        self.recordings = stores.open_recordings(key, cfg.record_dir)
        settings = RecordSettings(
            Mode(cfg.record), cfg.record_max_bytes, cfg.record_strict, cfg.record_retention, self._node_name() or ""
        )
        self.recorder = Recorder(settings, self.recordings, self._cancel_unrecorded, self.metrics.recording_gaps.inc)
        if cfg.record != "off":
            log.info("recording", mode=cfg.record, max_bytes=cfg.record_max_bytes, strict=cfg.record_strict)

    def _cancel_unrecorded(self, run_id: str, reason: CancelReason) -> None:
        """`--record-strict`: a run whose recording cannot be kept is cancelled."""
        self.perform(self.registry.on_cancel(run_id, reason, time.monotonic(), time.time())[1])

    def _record_database(self) -> None:
        """The database this home serves from, for the admin commands run on this home (`mind hand
        add` on a node's machine changes the shared database, never a new SQLite file beside it);
        a home back on SQLite forgets it."""
        recorded = paths.database_file(self.cfg.home)
        if self.cfg.database:
            paths.write_private(recorded, self.cfg.database + "\n")
        else:
            recorded.unlink(missing_ok=True)

    def _node_name(self) -> str | None:
        """`--node-name`, else the host name and port (the one kept in HOME/node.id when the
        port is chosen at start)."""
        if self.cfg.node_name:
            return self.cfg.node_name
        return f"{socket.gethostname()}:{self.cfg.port}" if self.cfg.port else None

    def epoch_changed(self) -> None:
        self._epoch_due = True

    async def _restore_endings(self) -> None:
        """A Mind that starts again knows what its earlier life ended by itself (a Hand presenting
        one of those runs is told to kill it), and, for a window, that a run it does not know may
        still be presented by its Hand (an attach to it is told to wait), if its earlier life may
        have left runs (it crashed, or stopped with runs resumable)."""
        now, wall = time.monotonic(), time.time()
        restored = await self.endings.load(self.cfg.resume_window, wall)
        for e in restored:
            try:
                reason = CancelReason(e.cancel_reason) if e.cancel_reason else None
            except ValueError:  # written by a newer Mind: the Hand is told the generic reason
                reason = None
            self.registry.restore(e.end, e.owner, reason, e.args_digest, e.ended_at, now)
        if await self.endings.begin_life() and self.cfg.resume_window > 0:
            self.registry.expect_presentations(now + self.cfg.resume_window)
        if restored:
            log.info("run_endings_restored", count=len(restored))

    # --- scopes ---

    def deny(self, peer: Peer, what: str, **fields: Any) -> str:
        """Count and log a request outside the client's scope; return the sentence for the client."""
        self.denials[what] = self.denials.get(what, 0) + 1
        self.metrics.denied.inc()
        log.warning(AuditEvent.DENIED_BY_SCOPE, client=peer.ident.label, what=what, **fields)
        return denial_message(peer.ident.label, Denial(what))

    async def db(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """A snapshot-store call (`mind.store.api.Snapshots`): on SQLite it runs on the one database
        thread (never blocks the loop, serialises writes); on PostgreSQL it is awaited on the loop."""
        return await fn(*args)

    async def creds(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """A credential-store call (`mind.store.api.Credentials`), off the event loop on SQLite."""
        return await fn(*args)

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
        if self.stores is None:
            await self.open()
        assert self.stores is not None
        try:
            await self._serve(on_ready, reload)
            # Recorded only after a clean stop: a Mind that failed on the way keeps its life
            # "running", so the next start waits for presentations, as after a crash.
            try:
                await self.endings.end_life(len(self.registry.active()))
            except (sqlite3.Error, StoreUnavailable) as exc:  # the next start waits for presentations it need not
                log.error("mind_life_not_recorded", error=str(exc))
        finally:
            if self.recordings is not None:
                await self.recordings.close()
            await self.stores.close()
            self.stores = None
        log.info("mind_stopped")

    async def _serve(self, on_ready: Callable[[str], None] | None, reload: Callable[[], dict[str, Any]] | None) -> None:
        await ensure_admin(self.store, self.cfg.home, shared=bool(self.cfg.database))
        staled = await self.db(self.snapshots.mark_all_stale)
        if staled:
            log.info("snapshots_marked_stale", count=staled, why="mind restart")
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_exception)
        # at most half the files for sockets not yet welcomed: the rest stay for Hands, clients, the db
        unwelcomed = self.door.unwelcomed
        unwelcomed.max_total = min(unwelcomed.max_total, max(16, raise_open_files_limit() // 2))
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
                process_request=partial(http.respond, self),
                create_connection=self.door.connection_class(),
                compression=None,
                max_size=limits.PREAUTH_MAX_FRAME_BYTES,  # raised per connection at welcome (`door`)
                open_timeout=OPEN_TIMEOUT_S,
                ping_interval=None,  # the Mind's own sweep pings only the silent (`mind.daemon.keepalive`)
                ping_timeout=None,
                close_timeout=close_timeout(self.cfg.ping_interval),
                backlog=1024,
                ssl=ssl_ctx,
            ) as server:
                port = next(iter(server.sockets)).getsockname()[1]
                host = self.cfg.host if ":" not in self.cfg.host else f"[{self.cfg.host}]"
                self.url = f"{'wss' if ssl_ctx else 'ws'}://{host}:{port}"
                paths.write_private(paths.url_file(self.cfg.home), self.url + "\n")
                log.info("mind_listening", url=self.url, mind_id=self.mind_id, pid=os.getpid())
                if self.nodes is not None:
                    await self._advertise(self.nodes.nodes)
                if on_ready:
                    on_ready(self.url)
                ticker = tg.create_task(self._ticker())
                history = tg.create_task(self._write_history()) if self.history is not None else None
                lag_probe = tg.create_task(self._lag_probe())
                recorder = tg.create_task(self.recorder.run()) if self.recorder is not None else None
                keepalive = tg.create_task(self.door.kept.run(lambda: self.cfg.ping_interval, self.spawn))
                node_tasks = (
                    [tg.create_task(t) for t in (self.nodes.heartbeats(), self.nodes.listen(), self.nodes.poll())]
                    if self.nodes is not None
                    else []
                )
                await self._stop.wait()
                if self.cfg.resume_window > 0:
                    # Runs go on: the Hands keep them for the window and present them to the Mind
                    # that starts next, the clients re-attach to it. An upgrade costs a pause.
                    log.info("mind_stopping", runs_resumable=len(self.registry.active()))
                else:
                    log.info("mind_stopping")
                    self.perform(self.registry.on_shutdown(time.monotonic(), time.time()))
                await self._flush_all(timeout=2.0)
                if recorder is not None and self.recorder is not None:
                    recorder.cancel()
                    await self.recorder.close()
                ticker.cancel()
                lag_probe.cancel()
                keepalive.cancel()
                for t in node_tasks:
                    t.cancel()
                if self.router is not None:
                    await self.router.close()
                if history is not None:
                    history.cancel()
                server.close(close_connections=True)
                await server.wait_closed()

    async def _advertise(self, nodes: Nodes) -> None:
        """Say where other nodes reach this one, and route to them (DESIGN §16). A database away
        now: logged; this node serves its own Hands, and the others cannot route to it until it
        restarts with the database back."""
        assert self.url is not None
        url = self.cfg.node_url or self.url
        try:
            await nodes.advertise(url)
        except StoreUnavailable as exc:
            log.error("node_url_not_advertised", url=url, error=str(exc))
        self.router = Router(
            nodes, self.store, self.clients, self.cfg.node_lease, self.cfg.resume_window > 0, self.spawn
        )

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
        try:
            async with asyncio.timeout(timeout):
                await self.held.drain()
        except TimeoutError:
            log.error("run_endings_not_drained")
        self.acks.release_all()
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
        store_away = False
        while True:
            await asyncio.sleep(self.cfg.tick_interval)
            now = time.monotonic()
            try:
                if self.nodes is not None:  # first: a node woken from a pause acts for nothing it lost
                    self.nodes.tick(now)
                self.perform(self.registry.on_tick(now, time.time()))
                # NOTIFY tells a node of a change at once; the poll is the fallback (5 s while it listens)
                poll = 5.0 if self.nodes is not None and self.nodes.nodes.listening else 0.5
                if self._epoch_due or now - last_epoch_check >= poll:
                    last_epoch_check, self._epoch_due = now, False
                    await self._check_credentials()
                if self.large_frames and now - last_trim >= heap.TRIM_INTERVAL_S:
                    self.large_frames, last_trim = False, now
                    heap.trim()
                if now - last_gauges >= 2.0:
                    last_gauges = now
                    self.metrics.runs_active.set(len(self.registry.active()))
                    self.metrics.runs_retained.set(len(self.registry))
                    self.metrics.snapshots_stale.set(await self.db(self.snapshots.count_stale))
            except StoreUnavailable as exc:  # once per outage, not a traceback every tick
                if not store_away:
                    store_away = True
                    log.error("store_unavailable", error=str(exc))
                continue
            except Exception:
                log.exception("tick_failed")
            if store_away:
                store_away = False
                log.info("store_available")

    async def _write_history(self) -> None:
        """Finished runs' metadata to the shared database, in batches (one round trip every
        `HISTORY_FLUSH_S` at most, whatever the rate of runs). A database away keeps the batch for
        the next try, up to `HISTORY_QUEUE_MAX` runs; past it the oldest are dropped and counted:
        the history of a run is worth less than the Mind's memory."""
        assert self.history is not None
        while True:
            await asyncio.sleep(HISTORY_FLUSH_S)
            if not self._history_queue:
                continue
            batch, self._history_queue = self._history_queue, []
            try:
                await self.history.put_many(batch)
            except Exception as exc:  # the database away (or a row it refused): kept for the next try, bounded
                self._history_queue = batch + self._history_queue
                over = len(self._history_queue) - HISTORY_QUEUE_MAX
                if over > 0:
                    del self._history_queue[:over]
                    log.warning("run_history_dropped", count=over, error=str(exc))

    async def _check_credentials(self) -> None:
        """Close, at once, every connection whose credential was revoked or rotated (by `mind hand
        revoke`, `mind client rotate`, ... which change the database this daemon shares)."""
        epoch = await self.creds(self.store.epoch)
        if epoch == self.epoch:
            return
        self.epoch = epoch
        if self.cfg.database:
            await refresh_admin(self.store, self.cfg.home)
        for peer in list(self.hands.values()) + list(self.clients.values()):
            current = await self.creds(self.store.secret, peer.ident.role, peer.ident.label)
            if current is None or hashlib.sha256(current).digest() != peer.secret_digest:
                why = "revoked" if current is None else "rotated"
                log.warning(
                    AuditEvent.CREDENTIAL_CLOSED, role=peer.ident.role, label=peer.ident.label, gen=peer.gen, why=why
                )
                peer.outbox.put(Error(code=ErrorCode.REVOKED, message=f"this credential was {why}"))
                peer.outbox.close()
                self.spawn(close_quietly(peer.ws, CLOSE_REVOKED, f"credential {why}"))

    # --- performing actions ---

    def perform(self, actions: list[Action]) -> None:
        """Perform the registry's actions in order. An ending (`PersistEnding`) is durable before the
        actions after it, which tell the client and the Hand (DESIGN §15): every ending that arrives
        in one turn of the loop is committed in one transaction, and every action after the first
        of them (whatever connection it is for) waits, in order, until it is (`grouped.HeldActions`;
        on SQLite the commit is on the loop, on PostgreSQL it is awaited: the loop never waits)."""
        if self.held.holding:  # endings are being committed: everything waits behind them, in order
            self.held.hold(actions)
            return
        for i, a in enumerate(actions):
            if isinstance(a, PersistEnding):
                self.held.hold(actions[i:])
                return
            self._perform_one(a)

    def _perform_one(self, a: Action) -> None:
        """One action that is not an ending (`perform` and `HeldActions` hand them over in order)."""
        if isinstance(a, SendToHand):
            peer = self.hands.get(a.hand)
            if peer is not None and peer.gen == a.gen:
                if isinstance(a.msg, ResultAck):
                    self.acks.hold(peer, a.msg)
                else:
                    self.acks.release(peer)
                    peer.outbox.put(a.msg)
        elif isinstance(a, SendToClient):
            peer = self.clients.get(a.client)
            if peer is not None:
                peer.outbox.put(a.msg, a.req_id, droppable=a.droppable)
        elif isinstance(a, FrameToClient):
            peer = self.clients.get(a.client)
            if peer is not None:
                peer.outbox.put_frame(a.number, a.offset, a.eof, a.payload)
            if self.recorder is not None and a.run_id in self.recorder.live:
                self.recorder.output(a.run_id, a.stream, a.payload)
        elif isinstance(a, FrameToHand):
            peer = self.hands.get(a.hand)
            if peer is not None and peer.gen == a.gen:
                self.acks.release(peer)
                peer.outbox.put_frame(a.number, a.offset, a.eof, a.payload)
            if self.recorder is not None and a.run_id in self.recorder.live:
                self.recorder.input(a.run_id, a.payload)
        elif isinstance(a, StartEnded):
            self.spawn(self.tasks.start_ended(a))
        elif isinstance(a, Log):
            getattr(log, LOG_LEVELS.get(a.event, "info"))(a.event, **a.fields)
            if self.recorder is not None and (a.fields.get("run_id") in self.recorder.live or a.event == "run_adopted"):
                self.recorder.on_log(a.event, a.fields, self.registry.get(a.fields["run_id"]))
            if a.event == AuditEvent.RUN_TERMINAL:
                f = a.fields
                if self.history is not None and (run := self.registry.get(f["run_id"])) is not None:
                    self._history_queue.append((run.owner, run.info()))
                self.metrics.runs.labels(f["state"]).inc()
                self.metrics.run_seconds.observe(f["duration_ms"] / 1000)
                if f["progress_dropped"]:
                    self.metrics.progress_dropped.inc(f["progress_dropped"])
            elif a.event in (AuditEvent.HAND_INPUT_WRONG_GENERATION, AuditEvent.HAND_INPUT_UNKNOWN_RUN):
                self.metrics.foreign.inc()

    def _commit_endings(self, batch: list[PersistEnding]) -> Awaitable[None] | None:
        """Write `batch` durably: at once on SQLite (on the loop, one transaction); on PostgreSQL the
        returned awaitable writes it (`HeldActions` holds what follows until it is done)."""
        wall = time.time()
        endings = [
            Ending(a.end, a.owner, wall, a.cancel_reason.value if a.cancel_reason else None, a.args_digest)
            for a in batch
        ]
        if not endings:
            return None
        if self.endings.put_many_now is not None:
            try:
                self.endings.put_many_now(endings)
            except sqlite3.Error as exc:  # the endings stand in memory; only a crash could now forget them
                log.error("run_ending_not_persisted", run_ids=[a.run_id for a in batch], error=str(exc))
            return None
        return self._put_endings(endings)

    async def _put_endings(self, endings: list[Ending]) -> None:
        try:
            await self.endings.put_many(endings)
        except Fenced as exc:  # another node holds that Hand now: its endings are that node's to record
            log.warning("run_ending_fenced", hand=exc.hand, claim=exc.claim)
        except (sqlite3.Error, StoreUnavailable) as exc:  # the endings stand in memory; only a crash could forget them
            log.error("run_ending_not_persisted", run_ids=[e.end.run_id for e in endings], error=str(exc))

    # --- connections ---

    async def _handler(self, ws: ServerConnection) -> None:
        """One connection: the door's handshake, then served until it ends."""
        peer = await self.door.welcome(ws)
        if peer is not None:
            await self.connections.serve(peer)
