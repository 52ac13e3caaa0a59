"""The PostgreSQL engine of `mind.store.api`: one database shared by any number of Mind nodes.

Driver: asyncpg (MagicStack, maintained since 2016): asyncio-native, so a statement never holds a
thread; the binary protocol (secrets and msgpack blobs go as bytes, no quoting); its own pool; and
LISTEN/NOTIFY for the later wave's rare events (a claim, a revocation). Every statement runs under
`STATEMENT_TIMEOUT_S`, both on the client (`command_timeout`, the pool acquire, one
`asyncio.timeout` per call) and on the server (`statement_timeout`): a database that went away or
hangs costs a request a clear `StoreUnavailable` within seconds, never the event loop.

The rules are the same pure functions the SQLite engine applies (`mind.core.snapshots`), run inside
one transaction with the rows locked (`SELECT ... FOR UPDATE`), so two nodes applying a report and
a reconciliation of the same Hand still apply them in version order.

Schema: versioned migrations (`MIGRATIONS`, the `schema_version` table), applied by the Mind at
start under an advisory lock (two nodes starting at once: one migrates, the other waits and finds
it done). A schema newer than this binary is refused (`SchemaTooNew`): a downgraded node must not
write rows whose meaning it does not know.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

import asyncpg
import msgpack

from mind.core.nodes import LEASE_LOST_MESSAGE
from mind.core.snapshots import Plan, Snapshot, apply_report, from_report, reconcile, within_quota
from mind.store.api import Calls, Fenced, NotLive, Results, SchemaTooNew, StoreUnavailable
from mind.store.coalesce import Coalescer
from mind.store.credentials import CredentialRow, StoreError, _labels_json
from mind.store.endings import MAX_ROWS, PRUNE_EVERY, TAIL_KEPT, Ending
from mind.store.snapshots import COLS, NON_TERMINAL, _row, _values
from protocol import limits
from protocol.auth import Credential
from protocol.messages import RunEnd, RunInfo, TaskInfo
from protocol.states import TaskState

T = TypeVar("T")

STATEMENT_TIMEOUT_S = 5.0
"""The longest any one call on the database may take, connection included."""
CONNECT_TIMEOUT_S = 5.0
POOL_MAX = 8
MIGRATION_LOCK = 0x6D696E6468  # "mindh": the advisory lock two starting nodes take in turn

MIGRATIONS: tuple[str, ...] = (
    # 1: the state of one SQLite Mind, shared; `hands` and `nodes` hold what ownership (a fencing
    # claim per Hand) and liveness (a heartbeat per node) need in the next wave of DESIGN §16.
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE credentials (
        role TEXT NOT NULL CHECK (role IN ('hand', 'client')),
        label TEXT NOT NULL,
        secret BYTEA NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        generation BIGINT NOT NULL DEFAULT 0,
        last_seen_at DOUBLE PRECISION,
        scope TEXT,
        labels TEXT,
        PRIMARY KEY (role, label)
    );
    CREATE TABLE task_snapshots (
        task_id TEXT PRIMARY KEY,
        hand TEXT NOT NULL,
        tool TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        binding_digest TEXT NOT NULL,
        state TEXT NOT NULL,
        stale INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        last_synced_at DOUBLE PRECISION,
        version BIGINT NOT NULL DEFAULT 0,
        info BYTEA,
        cancel_pending TEXT,
        start_pending INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '',
        owner TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX task_snapshots_hand ON task_snapshots (hand, state);
    CREATE INDEX task_snapshots_newest ON task_snapshots (created_at DESC, task_id);
    CREATE TABLE run_endings (
        run_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        ended_at DOUBLE PRECISION NOT NULL,
        cancel_reason TEXT,
        args_digest TEXT NOT NULL DEFAULT '',
        run_end BYTEA NOT NULL
    );
    CREATE INDEX run_endings_age ON run_endings (ended_at);
    CREATE TABLE run_history (
        run_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        hand TEXT NOT NULL,
        ended_at DOUBLE PRECISION NOT NULL,
        info BYTEA NOT NULL
    );
    CREATE INDEX run_history_age ON run_history (ended_at);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        running BOOLEAN NOT NULL,
        live_runs INTEGER NOT NULL,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE TABLE hands (
        label TEXT PRIMARY KEY,
        node TEXT,
        claim BIGINT NOT NULL DEFAULT 0,
        claimed_at TIMESTAMPTZ
    );
    """,
    # 2: an ending names its Hand, so the node that claims a Hand next learns what other nodes ended
    # of its runs before the Hand presents them (`PgNodes.endings_of`): first terminal wins, across nodes.
    """
    ALTER TABLE run_endings ADD COLUMN hand TEXT NOT NULL DEFAULT '';
    CREATE INDEX run_endings_hand ON run_endings (hand, ended_at);
    """,
    # 3: where other nodes reach a node (`--node-url`): a client asking one node for a Hand another
    # holds is served through that node over a node-to-node link (`mind.daemon.route`).
    """
    ALTER TABLE nodes ADD COLUMN url TEXT;
    """,
    # 4: a Hand's welcome in one round trip (`PgNodes.welcome`): the endings of its runs are read in
    # the claim's statement by this function, VOLATILE plpgsql so its query takes a fresh snapshot
    # after the claim holds the Hand's row (a plain CTE would read the statement's snapshot, taken
    # before the claim waited out an old holder's last ending write, and miss that ending).
    """
    CREATE FUNCTION mindhand_endings_after_claim(h TEXT, since DOUBLE PRECISION, claimed BIGINT)
    RETURNS SETOF run_endings LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RETURN QUERY SELECT * FROM run_endings r WHERE r.hand = h AND r.ended_at >= since ORDER BY r.ended_at;
    END
    $$;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

_GONE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,  # an administrator's shutdown, a statement timeout (QueryCanceled)
    asyncpg.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.ReadOnlySQLTransactionError,  # a standby, during a failover
)
"""What a database that went away, restarts, hangs or cannot take writes raises: a `StoreUnavailable`."""
RETRIES = 3
"""Tries of a call whose transaction the database rolled back (a deadlock between two nodes' writes
about one Hand, a serialization failure): the next try sees the other's commit."""


def redact(dsn: str) -> str:
    """The database URL as logs and errors show it: never its password."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or "@" not in rest:
        return dsn
    userinfo, _, hostpart = rest.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hostpart}" if ":" in userinfo else f"{scheme}://{user}@{hostpart}"


async def connect(dsn: str, node: str) -> PostgresStores:
    """Open the pool, migrate, and return the three stores. Raises `StoreUnavailable` (cannot reach
    the database) or `SchemaTooNew`; the caller (`mind serve`, the admin commands) says it and exits."""
    where = redact(dsn)
    try:
        pool = await asyncio.wait_for(
            asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=POOL_MAX,
                command_timeout=STATEMENT_TIMEOUT_S,
                timeout=CONNECT_TIMEOUT_S,
                reset=_keep_session,
                server_settings={
                    "statement_timeout": str(int(STATEMENT_TIMEOUT_S * 1000)),
                    "application_name": f"mindhand {node}"[:63],
                },
            ),
            CONNECT_TIMEOUT_S * 2,
        )
    except (*_GONE, asyncpg.PostgresError) as exc:
        raise StoreUnavailable(f"cannot reach the database {where}: {_why(exc)}") from None
    db = _Db(pool, where, dsn)
    try:
        await migrate(db)
    except BaseException:
        await db.close()
        raise
    return PostgresStores(db, node)


async def _keep_session(con: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does (roll back an open
    transaction, drop client-side listeners). Its default also sends `SELECT pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL;`, one more round trip on every release, about five per Hand
    welcomed (measured by the `nodes` benchmark), for session state the pool never has: its
    advisory lock is transaction-scoped (`pg_advisory_xact_lock`), no cursor outlives its
    transaction, the LISTEN is on a connection of its own, and settings are fixed at connect."""


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def migrate(db: _Db) -> int:
    """Bring the schema to `SCHEMA_VERSION`; the version found before. Refuses a newer one."""

    async def run(con: asyncpg.Connection) -> int:
        async with con.transaction():
            await con.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            await con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            found = await con.fetchval("SELECT max(version) FROM schema_version") or 0
            if found > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the database {db.where} has schema version {found}, newer than this Mind's "
                    f"{SCHEMA_VERSION}: run a Mind at least as new as the one that migrated it"
                )
            for version in range(found + 1, SCHEMA_VERSION + 1):
                await con.execute(MIGRATIONS[version - 1])
                await con.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
            return int(found)

    return await db.run(run, timeout=STATEMENT_TIMEOUT_S * 6)


class _Db:
    """The pool, and the one way to use it: a bounded call that says what went wrong."""

    def __init__(self, pool: asyncpg.Pool, where: str, dsn: str = "") -> None:
        self.pool = pool
        self.where = where
        self.dsn = dsn
        """For the one connection outside the pool: the LISTEN of `PgNodes.listen`."""

    async def run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], timeout: float = STATEMENT_TIMEOUT_S) -> T:
        try:
            async with asyncio.timeout(timeout):
                for attempt in range(RETRIES):
                    try:
                        async with self.pool.acquire() as con:
                            return await fn(con)
                    except asyncpg.TransactionRollbackError:
                        if attempt == RETRIES - 1:
                            raise
                raise AssertionError("unreachable")
        except _GONE as exc:
            raise StoreUnavailable(f"the database {self.where} is unavailable: {_why(exc)}") from None
        except asyncpg.TransactionRollbackError as exc:
            raise StoreUnavailable(f"the database {self.where} kept rolling this back: {_why(exc)}") from None

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.pool.close(), STATEMENT_TIMEOUT_S)
        except (*_GONE, asyncpg.PostgresError):
            self.pool.terminate()


_BUMP_EPOCH = (
    "INSERT INTO meta (key, value) VALUES ('cred_epoch', '1') "
    "ON CONFLICT (key) DO UPDATE SET value = (meta.value::bigint + 1)::text; "
    "SELECT pg_notify('mindhand_credentials', '')"
)
"""Every credential change bumps the epoch and tells every node at commit (NOTIFY): a revocation
closes its live connections on every node at once; the 0.5 s epoch poll is the fallback."""
CLAIMS_CHANNEL = "mindhand_claims"
CREDENTIALS_CHANNEL = "mindhand_credentials"


class Fence:
    """The claims this node holds Hands by (`mind.core.nodes`), shared by the stores that write
    about a Hand: `claims` is kept by the shell; `on_fenced` tells it a write found a newer claim."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.claims: dict[str, int] = {}
        self.on_fenced: Callable[[str, int], None] | None = None
        self.active = False
        """Set by a serving node (`mind.daemon.nodes`); the admin commands and the store suite
        write unfenced, as one Mind does."""

    def claim(self, hand: str) -> int:
        """The claim a write about `hand` carries (-1, matching nothing, for a Hand not held here)."""
        return self.claims.get(hand, -1)

    async def check(self, con: asyncpg.Connection, hand: str) -> None:
        """Inside a transaction: the Hand is still ours, and stays so until it commits (the row is
        locked FOR SHARE: a claim by another node waits for this transaction). Raises `Fenced`."""
        if not self.active:
            return
        claim = self.claim(hand)
        held = await con.fetchval(
            "SELECT 1 FROM hands WHERE label = $1 AND node = $2 AND claim = $3 FOR SHARE", hand, self.node, claim
        )
        if held is None:
            self.fenced(hand, claim)

    def fenced(self, hand: str, claim: int) -> None:
        if self.on_fenced is not None:
            self.on_fenced(hand, claim)
        raise Fenced(hand, claim)


class PgCredentials:
    def __init__(self, db: _Db) -> None:
        self._db = db
        self._secrets: Coalescer[tuple[str, str], bytes | None] = Coalescer(self._secrets_of)

    async def mind_id(self) -> str:
        async def run(con: asyncpg.Connection) -> str:
            new = "mind-" + secrets.token_hex(6)
            await con.execute("INSERT INTO meta (key, value) VALUES ('mind_id', $1) ON CONFLICT DO NOTHING", new)
            return str(await con.fetchval("SELECT value FROM meta WHERE key = 'mind_id'"))

        return await self._db.run(run)

    async def seal_key(self) -> bytes:
        """One key for every node of the database: a run one node sent, another adopts."""

        async def run(con: asyncpg.Connection) -> bytes:
            new = secrets.token_hex(32)
            await con.execute("INSERT INTO meta (key, value) VALUES ('seal_key', $1) ON CONFLICT DO NOTHING", new)
            return bytes.fromhex(str(await con.fetchval("SELECT value FROM meta WHERE key = 'seal_key'")))

        return await self._db.run(run)

    async def epoch(self) -> int:
        value = await self._db.run(lambda con: con.fetchval("SELECT value FROM meta WHERE key = 'cred_epoch'"))
        return int(value) if value is not None else 0

    async def add(
        self, role: str, label: str, scope: str | None = None, labels: dict[str, str] | None = None
    ) -> Credential:
        if not limits.LABEL_RE.match(label):
            raise StoreError(f"invalid name {label!r}: use 1-64 of A-Z a-z 0-9 . _ - , starting with a letter or digit")
        secret = secrets.token_bytes(limits.SECRET_BYTES)

        async def run(con: asyncpg.Connection) -> None:
            async with con.transaction():
                inserted = await con.fetchval(
                    "INSERT INTO credentials (role, label, secret, created_at, scope, labels) "
                    "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING 1",
                    role,
                    label,
                    secret,
                    time.time(),
                    scope,
                    _labels_json(labels),
                )
                if inserted is None:
                    # Re-adding a revoked name keeps its generation counter: generations never go back.
                    done = await con.fetchval(
                        "UPDATE credentials SET secret = $1, created_at = $2, revoked_at = NULL, scope = $3, "
                        "labels = $4 WHERE role = $5 AND label = $6 AND revoked_at IS NOT NULL RETURNING 1",
                        secret,
                        time.time(),
                        scope,
                        _labels_json(labels),
                        role,
                        label,
                    )
                    if done is None:
                        raise StoreError(f"{role} {label!r} already exists")
                await con.execute(_BUMP_EPOCH)

        await self._db.run(run)
        return Credential(role=role, label=label, secret=secret)

    async def rotate(self, role: str, label: str) -> Credential | None:
        secret = secrets.token_bytes(limits.SECRET_BYTES)

        async def run(con: asyncpg.Connection) -> bool:
            async with con.transaction():
                done = await con.fetchval(
                    "UPDATE credentials SET secret = $1 WHERE role = $2 AND label = $3 AND revoked_at IS NULL "
                    "RETURNING 1",
                    secret,
                    role,
                    label,
                )
                if done is None:
                    return False
                await con.execute(_BUMP_EPOCH)
                return True

        return Credential(role=role, label=label, secret=secret) if await self._db.run(run) else None

    async def scope(self, role: str, label: str) -> str | None:
        return await self._db.run(
            lambda con: con.fetchval("SELECT scope FROM credentials WHERE role = $1 AND label = $2", role, label)
        )

    async def set_labels(self, role: str, label: str, set_: dict[str, str], remove: list[str]) -> dict[str, str] | None:
        async def run(con: asyncpg.Connection) -> dict[str, str] | None:
            async with con.transaction():
                row = await con.fetchrow(
                    "SELECT labels FROM credentials WHERE role = $1 AND label = $2 AND revoked_at IS NULL FOR UPDATE",
                    role,
                    label,
                )
                if row is None:
                    return None
                now: dict[str, str] = json.loads(row[0]) if row[0] else {}
                for k in remove:
                    now.pop(k, None)
                now.update(set_)
                if len(now) > limits.HAND_LABELS_MAX:
                    raise StoreError(f"{role} {label!r} would have {len(now)} labels; at most {limits.HAND_LABELS_MAX}")
                await con.execute(
                    "UPDATE credentials SET labels = $1 WHERE role = $2 AND label = $3", _labels_json(now), role, label
                )
                return dict(sorted(now.items()))

        return await self._db.run(run)

    async def revoke(self, role: str, label: str) -> bool:
        async def run(con: asyncpg.Connection) -> bool:
            async with con.transaction():
                done = await con.fetchval(
                    "UPDATE credentials SET revoked_at = $1 WHERE role = $2 AND label = $3 AND revoked_at IS NULL "
                    "RETURNING 1",
                    time.time(),
                    role,
                    label,
                )
                if done is None:
                    return False
                await con.execute(_BUMP_EPOCH)
                return True

        return await self._db.run(run)

    async def secret(self, role: str, label: str) -> bytes | None:
        """The live secret of a credential; the lookups of concurrent handshakes share a statement."""
        return await self._secrets((role, label))

    async def _secrets_of(self, keys: list[tuple[str, str]]) -> list[bytes | None]:
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT c.role, c.label, c.secret FROM credentials c "
                "JOIN unnest($1::text[], $2::text[]) AS k(role, label) ON c.role = k.role AND c.label = k.label "
                "WHERE c.label = ANY($2::text[]) AND c.revoked_at IS NULL",  # the index, whatever the statistics
                [k[0] for k in keys],
                [k[1] for k in keys],
            )
        )
        found = {(r[0], r[1]): bytes(r[2]) for r in rows}
        return [found.get(k) for k in keys]

    async def next_generation(self, role: str, label: str) -> int:
        """One statement: the row's lock orders two nodes welcoming the same Hand at once."""
        gen = await self._db.run(
            lambda con: con.fetchval(
                "UPDATE credentials SET generation = generation + 1, last_seen_at = $1 "
                "WHERE role = $2 AND label = $3 RETURNING generation",
                time.time(),
                role,
                label,
            )
        )
        if gen is None:
            raise StoreError(f"{role} {label!r} vanished during the handshake")
        return int(gen)

    async def touch(self, role: str, label: str) -> None:
        await self._db.run(
            lambda con: con.execute(
                "UPDATE credentials SET last_seen_at = $1 WHERE role = $2 AND label = $3", time.time(), role, label
            )
        )

    async def list(self, role: str) -> list[CredentialRow]:
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT role, label, created_at, revoked_at, generation, last_seen_at, scope, labels FROM credentials "
                'WHERE role = $1 ORDER BY label COLLATE "C"',
                role,
            )
        )
        return [CredentialRow(*r) for r in rows]

    async def close(self) -> None:
        pass


_PUT = (
    f"INSERT INTO task_snapshots ({COLS}) VALUES ({', '.join(f'${i}' for i in range(1, 16))}) "
    "ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{c.strip()} = EXCLUDED.{c.strip()}" for c in COLS.split(",")[1:])
)
_NON_TERMINAL = list(NON_TERMINAL)


class PgSnapshots:
    def __init__(self, db: _Db, fence: Fence | None = None) -> None:
        self._db = db
        self._fence = fence
        self._empty: Coalescer[tuple[str, int, bool], tuple[bool, bool]] = Coalescer(self._empty_of)

    @staticmethod
    async def _get(con: asyncpg.Connection, task_id: str, lock: bool = False) -> Snapshot | None:
        r = await con.fetchrow(
            f"SELECT {COLS} FROM task_snapshots WHERE task_id = $1" + (" FOR UPDATE" if lock else ""), task_id
        )
        return _row(tuple(r)) if r is not None else None

    @staticmethod
    async def _put_many(con: asyncpg.Connection, snaps: list[Snapshot]) -> None:
        if snaps:
            await con.executemany(_PUT, [_values(s) for s in snaps])

    async def _tx(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        async def run(con: asyncpg.Connection) -> T:
            async with con.transaction():
                return await fn(con)

        return await self._db.run(run)

    async def get(self, task_id: str) -> Snapshot | None:
        return await self._db.run(lambda con: self._get(con, task_id))

    async def insert_new(self, snap: Snapshot) -> Snapshot | None:
        async def run(con: asyncpg.Connection) -> Snapshot | None:
            done = await con.fetchval(
                _PUT.split(" ON CONFLICT")[0] + " ON CONFLICT DO NOTHING RETURNING 1", *_values(snap)
            )
            return None if done is not None else await self._get(con, snap.task_id)

        return await self._tx(run)

    async def delete(self, task_id: str) -> None:
        await self._db.run(lambda con: con.execute("DELETE FROM task_snapshots WHERE task_id = $1", task_id))

    async def remove(self, task_id: str, hand: str) -> Snapshot | None:
        """Delete the snapshot of a task its Hand has just removed (`mind task rm`), and return it;
        None (nothing deleted) unless it is still `hand`'s and no start of its id is in flight: a
        start that came in meanwhile owns the id now. A write about the Hand: fenced by this
        node's claim, as a report is."""

        async def run(con: asyncpg.Connection) -> Snapshot | None:
            if self._fence is not None:
                await self._fence.check(con, hand)
            r = await con.fetchrow(
                f"DELETE FROM task_snapshots WHERE task_id = $1 AND hand = $2 AND start_pending = 0 RETURNING {COLS}",
                task_id,
                hand,
            )
            return _row(tuple(r)) if r is not None else None

        return await self._tx(run)

    async def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        async def run(con: asyncpg.Connection) -> tuple[Snapshot | None, str]:
            if self._fence is not None:
                await self._fence.check(con, hand)
            snap = await self._get(con, info.task_id, lock=True)
            if snap is None:
                if not adopt:
                    return None, "unknown"
                new = from_report(hand, info, now)
                await self._put_many(con, [new])
                return new, "adopted"
            if snap.hand != hand:
                return snap, "foreign"
            updated = apply_report(snap, info, now)
            if updated is None:
                return snap, "unchanged"
            await self._put_many(con, [updated])
            return updated, "updated"

        return await self._tx(run)

    async def retry_start(self, snap: Snapshot) -> Snapshot | None:
        async def run(con: asyncpg.Connection) -> Snapshot | None:
            current = await self._get(con, snap.task_id, lock=True)
            if current is None or current.version > 0 or current.start_pending:
                return None
            await self._put_many(con, [snap])
            return snap

        return await self._tx(run)

    async def finish_start(self, task_id: str) -> Snapshot | None:
        async def run(con: asyncpg.Connection) -> Snapshot | None:
            snap = await self._get(con, task_id, lock=True)
            if snap is None:
                return None
            if snap.start_pending:
                snap = replace(snap, start_pending=False)
                await self._put_many(con, [snap])
            return snap

        return await self._tx(run)

    async def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        async def run(con: asyncpg.Connection) -> Snapshot | None:
            snap = await self._get(con, task_id, lock=True)
            if snap is None or snap.terminal:
                return snap
            snap = replace(snap, cancel_pending=reason)
            await self._put_many(con, [snap])
            return snap

        return await self._tx(run)

    async def clear_cancel_pending(self, task_id: str) -> None:
        await self._db.run(
            lambda con: con.execute("UPDATE task_snapshots SET cancel_pending = NULL WHERE task_id = $1", task_id)
        )

    async def mark_hand_stale(self, hand: str) -> int:
        status = await self._db.run(
            lambda con: con.execute(
                "UPDATE task_snapshots SET stale = 1 WHERE hand = $1 AND stale = 0 AND state = ANY($2::text[])",
                hand,
                _NON_TERMINAL,
            )
        )
        return _count(status)

    async def mark_all_stale(self) -> int:
        """A node starts: nothing it is told about an unfinished task can be trusted as current. On a
        shared database this marks other nodes' Hands' snapshots stale too: stale means "may be out
        of date", which is never wrong; their next report or reconciliation freshens them."""

        async def run(con: asyncpg.Connection) -> int:
            status = await con.execute(
                "UPDATE task_snapshots SET stale = 1 WHERE stale = 0 AND state = ANY($1::text[])", _NON_TERMINAL
            )
            await con.execute("UPDATE task_snapshots SET start_pending = 0 WHERE start_pending = 1")
            return _count(status)

        return await self._tx(run)

    async def list(
        self,
        hand: str | None = None,
        state: TaskState | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[Snapshot]:
        where: list[str] = []
        params: list[Any] = []

        def p(value: Any) -> str:
            params.append(value)
            return f"${len(params)}"

        if after is not None:
            t = p(after[0])
            where.append(f'(created_at < {t} OR (created_at = {t} AND task_id COLLATE "C" > {p(after[1])}))')
        if hand is not None:
            where.append(f"hand = {p(hand)}")
        if state is not None:
            where.append(f"state = {p(state.value)}")
        sql = f"SELECT {COLS} FROM task_snapshots"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f' ORDER BY created_at DESC, task_id COLLATE "C" LIMIT {p(limit)}'
        rows = await self._db.run(lambda con: con.fetch(sql, *params))
        return [_row(tuple(r)) for r in rows]

    async def counts_by_state(self) -> dict[str, int]:
        rows = await self._db.run(lambda con: con.fetch("SELECT state, COUNT(*) FROM task_snapshots GROUP BY state"))
        return {r[0]: int(r[1]) for r in rows}

    async def counts_visible(self, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]:
        groups = await self._db.run(
            lambda con: con.fetch(
                "SELECT hand, owner, state, stale, COUNT(*) FROM task_snapshots GROUP BY hand, owner, state, stale"
            )
        )
        counts: dict[str, int] = {}
        stale = 0
        for hand, owner, state, is_stale, n in groups:
            if visible(hand, owner):
                counts[state] = counts.get(state, 0) + n
                stale += n if is_stale else 0
        return counts, stale

    async def count_stale(self) -> int:
        return int(await self._db.run(lambda con: con.fetchval("SELECT COUNT(*) FROM task_snapshots WHERE stale = 1")))

    async def reconcile(
        self,
        hand: str,
        hand_rows: dict[str, TaskInfo],
        now: float,
        synced_since: float | None = None,
        quota: int | None = None,
    ) -> Plan:
        """As `SnapshotStore.reconcile`, in one transaction with the Hand's rows locked. A Hand
        with no tasks (the common welcome) first tries `_reconcile_empty`: one statement."""
        if not hand_rows:
            plan = await self._reconcile_empty(hand, now, synced_since)
            if plan is not None:
                return plan

        async def run(con: asyncpg.Connection) -> Plan:
            if self._fence is not None:
                await self._fence.check(con, hand)
            rows = hand_rows
            mine = [
                _row(tuple(r))
                for r in await con.fetch(f"SELECT {COLS} FROM task_snapshots WHERE hand = $1 FOR UPDATE", hand)
            ]
            settled = [s for s in mine if not s.start_pending]
            held_elsewhere: dict[str, str] = {s.task_id: hand for s in mine if s.start_pending}
            mine_ids = {s.task_id for s in mine}
            unknown_ids = [tid for tid in rows if tid not in mine_ids]
            if unknown_ids:
                for r in await con.fetch(
                    "SELECT task_id, hand FROM task_snapshots WHERE task_id = ANY($1::text[])", unknown_ids
                ):
                    held_elsewhere[r[0]] = r[1]
            rows, over = within_quota(rows, unknown_ids, held_elsewhere, len(mine), quota)
            plan = reconcile(hand, settled, rows, held_elsewhere, now, synced_since)
            plan.over_quota = over
            await self._put_many(con, plan.writes)
            if plan.never_stored:
                await con.execute("DELETE FROM task_snapshots WHERE task_id = ANY($1::text[])", list(plan.never_stored))
            return plan

        return await self._tx(run)

    async def _empty_of(self, items: Sequence[tuple[str, int, bool]]) -> Sequence[tuple[bool, bool]]:
        """For each (hand, claim, fenced): (still held by that claim, or unfenced; any row of the
        Hand's), the concurrent welcomes' checks in one statement (`Coalescer`)."""
        node = self._fence.node if self._fence is not None else ""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT NOT k.fenced OR h.label IS NOT NULL, t.hand IS NOT NULL "
                "FROM unnest($1::text[], $2::bigint[], $3::bool[]) WITH ORDINALITY AS k(hand, claim, fenced, i) "
                "LEFT JOIN (SELECT label, claim FROM hands WHERE label = ANY($1::text[]) AND node = $4 FOR SHARE) h "
                "ON h.label = k.hand AND h.claim = k.claim "
                "LEFT JOIN (SELECT DISTINCT hand FROM task_snapshots WHERE hand = ANY($1::text[])) t ON t.hand = k.hand "
                "ORDER BY k.i",
                [i[0] for i in items],
                [i[1] for i in items],
                [i[2] for i in items],
                node,
            )
        )
        return [(bool(r[0]), bool(r[1])) for r in rows]

    async def _reconcile_empty(self, hand: str, now: float, synced_since: float | None) -> Plan | None:
        """A Hand that reported no tasks, where the Mind holds none for it either: nothing to
        write, so one statement answers (the fence checked as `Fence.check` does, its row locked
        FOR SHARE for that statement) instead of a transaction of four round trips. None (the
        full transaction follows) when the Mind holds any row for the Hand."""
        fence = self._fence
        fenced = fence is not None and fence.active
        claim = fence.claim(hand) if fence is not None else -1
        held, any_rows = await self._empty((hand, claim, fenced))
        if not held:
            assert fence is not None
            fence.fenced(hand, claim)  # raises Fenced
        if any_rows:
            return None
        plan = reconcile(hand, [], {}, {}, now, synced_since)
        return None if plan.writes or plan.never_stored else plan

    async def batch(self, calls: Calls) -> Results:
        out: Results = []
        for name, args, hand in calls:
            try:
                try:
                    out.append((True, await getattr(self, name)(*args)))
                finally:
                    if hand is not None:
                        await self.mark_hand_stale(hand)
            except Exception as exc:  # this call's waiter hears it; the batch goes on
                out.append((False, exc))
        return out

    async def close(self) -> None:
        pass


async def _require_live(con: asyncpg.Connection, node: str, lease: float) -> None:
    """Why a claim matched no row, when it is the lease: `NotLive` if `node`'s heartbeat is older
    than `lease` on the database's clock."""
    live = await con.fetchval(
        "SELECT 1 FROM nodes WHERE name = $1 AND heartbeat_at > clock_timestamp() - make_interval(secs => $2)",
        node,
        lease,
    )
    if live is None:
        raise NotLive(LEASE_LOST_MESSAGE)


def _count(status: str) -> int:
    """Rows an UPDATE/DELETE changed, from its command tag (`UPDATE 3`)."""
    return int(status.rsplit(" ", 1)[-1])


def _ending_blob(ending: Ending) -> bytes:
    """The run's end as stored: its output tails trimmed to what a re-attaching client is shown."""
    end = ending.end
    short = {
        name: tail.model_copy(update={"data": tail.data[-TAIL_KEPT:]})
        for name in ("stdout", "stderr")
        if len((tail := getattr(end, name)).data) > TAIL_KEPT
    }
    if short:
        end = end.model_copy(update=short)
    return msgpack.packb(end.model_dump(mode="python"), use_bin_type=True)


def _endings(rows: list[Any]) -> list[Ending]:
    out: list[Ending] = []
    for run_id, owner, ended_at, reason, digest, blob in rows:
        try:
            end = RunEnd.model_validate(msgpack.unpackb(blob, raw=False))
        except Exception:  # written by a newer Mind: not this one's to interpret
            continue
        if end.run_id == run_id:
            out.append(Ending(end, owner, ended_at, reason, digest))
    return out


class PgEndings:
    """The endings, shared: a run one node ended is ended for every node its Hand may reach next.
    The life record (`begin_life`/`end_life`) is this node's own row of `nodes`."""

    put_many_now: Callable[[list[Ending]], None] | None = None

    def __init__(self, db: _Db, node: str, fence: Fence | None = None) -> None:
        self._db = db
        self._node = node
        self._fence = fence
        self._writes = 0
        self._window = 0.0

    async def put(self, ending: Ending) -> None:
        await self.put_many([ending])

    async def put_many(self, endings: list[Ending]) -> None:
        """Every ending of one turn of the Mind's loop in one transaction (one connection). Each is
        conditional on this node's claim of the run's Hand: a node that lost the Hand writes nothing
        about it. The others are written all the same; then `Fenced` names the first refused. The
        claim's row is locked FOR SHARE until commit: a claim by another node waits for these
        endings and then reads them (`_WELCOME`); one that committed first refuses them."""
        if not endings:
            return
        fenced = self._fence is not None and self._fence.active
        rows = [
            (
                e.end.run_id,
                e.owner,
                e.ended_at,
                e.cancel_reason,
                e.args_digest,
                _ending_blob(e),
                fenced,
                e.end.hand,
                self._node,
                self._fence.claim(e.end.hand) if self._fence is not None and fenced else 0,
            )
            for e in endings
        ]

        async def run(con: asyncpg.Connection) -> list[tuple[str, int]]:
            refused: list[tuple[str, int]] = []
            async with con.transaction():
                for row in rows:
                    written = await con.fetchval(
                        "INSERT INTO run_endings (run_id, owner, ended_at, cancel_reason, args_digest, run_end, hand) "
                        "SELECT $1, $2, $3, $4, $5, $6, $8 WHERE NOT $7 OR EXISTS "
                        "(SELECT 1 FROM hands WHERE label = $8 AND node = $9 AND claim = $10 FOR SHARE) "
                        "ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, "
                        "ended_at = EXCLUDED.ended_at, cancel_reason = EXCLUDED.cancel_reason, "
                        "args_digest = EXCLUDED.args_digest, run_end = EXCLUDED.run_end RETURNING 1",
                        *row,
                    )
                    if written is None:
                        refused.append((row[7], row[9]))
            return refused

        refused = await self._db.run(run)
        before, self._writes = self._writes, self._writes + len(endings)
        if self._writes // PRUNE_EVERY != before // PRUNE_EVERY:
            await self.prune(self._window, endings[-1].ended_at)
        if refused and self._fence is not None:
            for hand, claim in refused[1:]:
                if self._fence.on_fenced is not None:
                    self._fence.on_fenced(hand, claim)
            self._fence.fenced(*refused[0])  # raises Fenced

    async def prune(self, window: float, now: float) -> None:
        horizon = now - limits.RUN_TIMEOUT_MAX_MS / 1000 - window

        async def run(con: asyncpg.Connection) -> None:
            await con.execute("DELETE FROM run_endings WHERE ended_at < $1", horizon)
            await con.execute(
                "DELETE FROM run_endings WHERE run_id NOT IN "
                "(SELECT run_id FROM run_endings ORDER BY ended_at DESC LIMIT $1)",
                MAX_ROWS,
            )

        await self._db.run(run)

    async def load(self, window: float, now: float | None = None) -> list[Ending]:
        now = time.time() if now is None else now
        self._window = window
        await self.prune(window, now)
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT run_id, owner, ended_at, cancel_reason, args_digest, run_end FROM run_endings ORDER BY ended_at"
            ),
            timeout=STATEMENT_TIMEOUT_S * 6,
        )
        return _endings(rows)

    async def begin_life(self) -> bool:
        async def run(con: asyncpg.Connection) -> bool:
            async with con.transaction():
                row = await con.fetchrow("SELECT running, live_runs FROM nodes WHERE name = $1 FOR UPDATE", self._node)
                await con.execute(
                    "INSERT INTO nodes (name, running, live_runs) VALUES ($1, true, 0) ON CONFLICT (name) DO UPDATE "
                    "SET running = true, live_runs = 0, started_at = now(), heartbeat_at = now()",
                    self._node,
                )
                return row is not None and (bool(row[0]) or row[1] > 0)

        return await self._db.run(run)

    async def end_life(self, live_runs: int) -> None:
        await self._db.run(
            lambda con: con.execute(
                "UPDATE nodes SET running = false, live_runs = $2, heartbeat_at = now() WHERE name = $1",
                self._node,
                live_runs,
            )
        )

    async def close(self) -> None:
        pass


HISTORY_KEEP_S = 7 * 24 * 3600.0
"""Finished runs' metadata kept in the shared database (`mind run get` through any node)."""


class PgHistory:
    """Finished runs' metadata (`RunInfo`: states, times, exit codes, digests, output tails; never a
    value), shared so `mind run get` answers through any node, and kept past one node's memory."""

    def __init__(self, db: _Db, fence: Fence | None = None) -> None:
        self._db = db
        self._fence = fence
        self._writes = 0

    async def put_many(self, runs: list[tuple[str, RunInfo]]) -> None:
        """`(owner, info)` of runs that ended, in one statement (one round trip per batch)."""
        rows = [
            (
                info.run_id,
                owner,
                info.hand,
                info.ended_at or 0.0,
                msgpack.packb(info.model_dump(mode="python"), use_bin_type=True),
                self._fence.node if self._fence is not None else "",
                self._fence.claim(info.hand) if self._fence is not None else 0,
                self._fence is not None and self._fence.active,
            )
            for owner, info in runs
        ]

        async def run(con: asyncpg.Connection) -> None:
            await con.executemany(
                # a run of a Hand another node claimed since is that node's to record: skipped
                "INSERT INTO run_history (run_id, owner, hand, ended_at, info) SELECT $1, $2, $3, $4, $5 "
                "WHERE NOT $8 OR EXISTS (SELECT 1 FROM hands WHERE label = $3 AND node = $6 AND claim = $7) "
                "ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, hand = EXCLUDED.hand, "
                "ended_at = EXCLUDED.ended_at, info = EXCLUDED.info",
                rows,
            )
            self._writes += len(rows)
            if self._writes >= PRUNE_EVERY:
                self._writes = 0
                await con.execute("DELETE FROM run_history WHERE ended_at < $1", time.time() - HISTORY_KEEP_S)

        await self._db.run(run)

    async def get(self, run_id: str) -> tuple[str, RunInfo] | None:
        """`(owner, info)` of a finished run, None if the database holds no such run (or it does not decode)."""
        row = await self._db.run(
            lambda con: con.fetchrow("SELECT owner, info FROM run_history WHERE run_id = $1", run_id)
        )
        if row is None:
            return None
        try:
            return row[0], RunInfo.model_validate(msgpack.unpackb(row[1], raw=False))
        except Exception:
            return None


_CLAIM = """
WITH live AS (
    SELECT 1 FROM nodes WHERE name = $2 AND heartbeat_at > clock_timestamp() - make_interval(secs => $3)
), gen AS (
    UPDATE credentials SET generation = generation + 1, last_seen_at = $4
    WHERE role = 'hand' AND label = $1 AND EXISTS (SELECT 1 FROM live) RETURNING generation
), claimed AS (
    INSERT INTO hands (label, node, claim, claimed_at) SELECT $1, $2, generation, now() FROM gen
    ON CONFLICT (label) DO UPDATE SET node = EXCLUDED.node, claim = EXCLUDED.claim, claimed_at = EXCLUDED.claimed_at
    RETURNING claim
)
SELECT claim, pg_notify('mindhand_claims', $1 || ' ' || claim::text || ' ' || $2) FROM claimed
"""
"""A Hand's welcome, in one statement: its generation bumped (the claim: a fencing token), this
node named its holder, every node told at commit; refused (no row) unless this node's lease is
live on the database's clock. A concurrent claim by another node waits on the row, so two nodes
get different claims and the later one wins."""

_WELCOME = """
WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::float8[]) AS r(label, secret, since)
), live AS (
    SELECT 1 FROM nodes WHERE name = $4 AND heartbeat_at > clock_timestamp() - make_interval(secs => $5)
), locked AS (
    SELECT c.label FROM credentials c JOIN req ON c.label = req.label AND c.secret = req.secret
    WHERE c.role = 'hand' AND c.label = ANY($1::text[]) AND c.revoked_at IS NULL AND EXISTS (SELECT 1 FROM live)
    ORDER BY c.label FOR UPDATE OF c
), gen AS (
    UPDATE credentials c SET generation = c.generation + 1, last_seen_at = $6
    FROM locked l WHERE c.role = 'hand' AND c.label = l.label
    RETURNING c.label, c.generation
), claimed AS (
    INSERT INTO hands (label, node, claim, claimed_at) SELECT label, $4, generation, now() FROM gen
    ON CONFLICT (label) DO UPDATE SET node = EXCLUDED.node, claim = EXCLUDED.claim, claimed_at = EXCLUDED.claimed_at
    RETURNING label, claim
)
SELECT c.label, c.claim, pg_notify('mindhand_claims', c.label || ' ' || c.claim::text || ' ' || $4),
    e.run_id, e.owner, e.ended_at, e.cancel_reason, e.args_digest, e.run_end
FROM claimed c JOIN req ON req.label = c.label
LEFT JOIN LATERAL mindhand_endings_after_claim(c.label, req.since, c.claim) e ON true
"""
"""The welcomes of many Hands after their proofs, in one statement (`_CLAIM` for each, with the
proof's re-read of the secret and the read of the Hand's endings folded in): one round trip where
three were per Hand, and one per batch of concurrent welcomes (`Coalescer`). A Hand is claimed
only while its credential still has the secret its proof was checked against: the rows are locked
FOR UPDATE with that condition, so a revocation or rotation that commits first (even while this
statement waits on the row) wins: no row for that Hand. `label = ANY($1)` is the index condition
whatever the statistics say: a plan made while the table looked empty (its credentials just added,
not yet analysed) joined every credential against the batch, 40 ms a statement in a storm of 10,000
(measured). The rows are locked in label order, so two
nodes claiming overlapping batches queue rather than deadlock. The endings come from
`mindhand_endings_after_claim` (migration 4), joined laterally on the claim so they are read after
the Hand's row is held, with a snapshot of their own (VOLATILE): an old holder's ending committed
while the claim waited is seen. pg_notify repeats per ending row; the same payload within one
transaction is delivered once."""


class PgNodes:
    """This node's heartbeat, its claims, and what it hears of the others' (DESIGN §16)."""

    def __init__(self, db: _Db, fence: Fence) -> None:
        self._db = db
        self.name = fence.node
        self.fence = fence
        self.listening = False
        """The LISTEN connection is up: NOTIFYs arrive; when down the shell polls (0.5 s)."""
        self._lease_con: asyncpg.Connection | None = None
        self._welcomes: Coalescer[tuple[str, bytes, float, float], tuple[int, list[Ending]] | None] = Coalescer(
            self._welcomes_of, distinct=lambda item: item[0]
        )

    async def heartbeat(self, timeout: float = STATEMENT_TIMEOUT_S) -> None:
        """Renew this node's row on the database's clock: one statement per node, whatever its Hands.

        On a connection of its own, outside the pool (as the LISTEN is): the lease says "this
        node runs and reaches its database", which a pool full of a connect storm's statements
        must not falsify. Measured before (10,000 Hands arriving on two nodes of a loaded 2-core
        machine): renewals queued behind the welcomes past half the lease, the node lost its
        lease, closed its Hands, and they stormed the other node, which lost its lease in turn."""
        try:
            async with asyncio.timeout(timeout):
                con = self._lease_con
                if con is None or con.is_closed():
                    self._lease_con = None
                    con = await asyncpg.connect(
                        self._db.dsn,
                        timeout=timeout,
                        server_settings={
                            "statement_timeout": str(int(timeout * 1000)),
                            "application_name": f"mindhand {self.name} lease"[:63],
                        },
                    )
                    self._lease_con = con
                done = await con.fetchval(
                    "UPDATE nodes SET heartbeat_at = clock_timestamp(), running = true WHERE name = $1 RETURNING 1",
                    self.name,
                )
                if done is None:  # the row was removed (by an operator): made again
                    await con.execute(
                        "INSERT INTO nodes (name, running, live_runs) VALUES ($1, true, 0) "
                        "ON CONFLICT (name) DO UPDATE SET heartbeat_at = clock_timestamp(), running = true",
                        self.name,
                    )
        except (*_GONE, asyncpg.PostgresError) as exc:
            self.close_lease()  # a statement cut mid-way leaves the connection unusable: a new one next
            raise StoreUnavailable(f"the database {self._db.where} is unavailable: {_why(exc)}") from None

    def close_lease(self) -> None:
        con, self._lease_con = self._lease_con, None
        if con is not None:
            con.terminate()

    async def claim(self, hand: str, lease: float) -> int:
        """Claim `hand` for this node (`_CLAIM`); its claim, also its connection's generation.
        Raises `NotLive` when this node's lease is not live in the database."""

        async def run(con: asyncpg.Connection) -> int | None:
            row = await con.fetchrow(_CLAIM, hand, self.name, lease, time.time())
            if row is not None:
                return int(row[0])
            await _require_live(con, self.name, lease)
            return None

        claim = await self._db.run(run)
        if claim is None:
            raise StoreError(f"hand {hand!r} vanished during the handshake")
        self.fence.claims[hand] = claim
        return claim

    async def welcome(self, hand: str, lease: float, secret: bytes, since: float) -> tuple[int, list[Ending]] | None:
        """A Hand's welcome after its proof, in one statement (`_WELCOME`): the claim, refused
        unless the credential still has `secret` (None: revoked, rotated or removed since the
        hello: the proof fails) and this node's lease is live (`NotLive`); with the endings of the
        Hand's runs written since `since` (wall clock) by any node, read after the claim holds.
        Concurrent welcomes share the statement; two of one Hand never do."""
        got = await self._welcomes((hand, secret, since, lease))
        if got is None:
            return None
        claim, endings = got
        self.fence.claims[hand] = claim
        return claim, endings

    async def _welcomes_of(self, items: list[tuple[str, bytes, float, float]]) -> list[tuple[int, list[Ending]] | None]:
        lease = min(i[3] for i in items)

        async def run(con: asyncpg.Connection) -> list[Any]:
            rows = await con.fetch(
                _WELCOME,
                [i[0] for i in items],
                [i[1] for i in items],
                [i[2] for i in items],
                self.name,
                lease,
                time.time(),
            )
            if not rows:
                await _require_live(con, self.name, lease)
            return list(rows)

        by_hand: dict[str, tuple[int, list[Any]]] = {}
        for r in await self._db.run(run):
            claim, endings = by_hand.setdefault(r[0], (int(r[1]), []))
            if r[3] is not None:
                endings.append(tuple(r[3:]))
        out: list[tuple[int, list[Ending]] | None] = []
        for hand, *_ in items:
            got = by_hand.get(hand)
            out.append(None if got is None else (got[0], _endings(got[1])))
        return out

    async def listen(self, on_claim: Callable[[str, int, str], None], on_credentials: Callable[[], None]) -> None:
        """Hold one connection outside the pool that LISTENs for claims and credential changes,
        until cancelled; when it drops, `listening` is False (the shell polls) and it is opened
        again after a pause."""

        def claim_heard(_con: object, _pid: int, _channel: str, payload: str) -> None:
            try:
                hand, claim, node = payload.split(" ", 2)
                on_claim(hand, int(claim), node)
            except ValueError:  # a payload this Mind did not write: ignored
                pass

        while True:
            con: asyncpg.Connection | None = None
            try:
                con = c = await asyncio.wait_for(
                    asyncpg.connect(
                        self._db.dsn,
                        timeout=CONNECT_TIMEOUT_S,
                        server_settings={"application_name": f"mindhand {self.name} listen"[:63]},
                    ),
                    CONNECT_TIMEOUT_S,
                )
                dropped = asyncio.Event()
                c.add_termination_listener(lambda _c, d=dropped: d.set())
                await c.add_listener(CLAIMS_CHANNEL, claim_heard)
                await c.add_listener(CREDENTIALS_CHANNEL, lambda *_a: on_credentials())
                self.listening = True
                on_credentials()  # a change made while it was down is looked at now
                while not dropped.is_set() and not c.is_closed():
                    # a server that vanished without a FIN is noticed within a few seconds
                    try:
                        async with asyncio.timeout(STATEMENT_TIMEOUT_S):
                            await c.execute("SELECT 1")
                    except (*_GONE, asyncpg.PostgresError):
                        break
                    try:
                        await asyncio.wait_for(dropped.wait(), 2.0)
                    except TimeoutError:
                        pass
            except (*_GONE, asyncpg.PostgresError):
                pass
            finally:
                self.listening = False
                if con is not None:
                    con.terminate()
            await asyncio.sleep(1.0)

    async def release(self, hand: str, claim: int) -> None:
        """This node's connection at `claim` ended: the Hand is held by no node (unless another
        node claimed it since: conditional, like every write about it)."""
        await self._db.run(
            lambda con: con.execute(
                "UPDATE hands SET node = NULL WHERE label = $1 AND node = $2 AND claim = $3", hand, self.name, claim
            )
        )

    async def endings_of(self, hand: str, since: float) -> list[Ending]:
        """The endings of `hand`'s runs written since `since` (wall clock), by any node."""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT run_id, owner, ended_at, cancel_reason, args_digest, run_end FROM run_endings "
                "WHERE hand = $1 AND ended_at >= $2 ORDER BY ended_at",
                hand,
                since,
            )
        )
        return _endings(rows)

    async def holders(self) -> dict[str, tuple[str, int, float]]:
        """Every Hand held by a node that has not stopped: label -> (node, claim, seconds since that
        node's heartbeat; a killed node's grow until they pass the lease)."""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT h.label, h.node, h.claim, extract(epoch FROM clock_timestamp() - n.heartbeat_at)::float8 "
                "FROM hands h JOIN nodes n ON n.name = h.node AND n.running"
            )
        )
        return {r[0]: (r[1], int(r[2]), float(r[3])) for r in rows}

    async def advertise(self, url: str) -> None:
        """Say where other nodes reach this one (its `nodes` row)."""
        await self._db.run(lambda con: con.execute("UPDATE nodes SET url = $2 WHERE name = $1", self.name, url))

    async def route(self, hand: str, lease: float) -> str | None:
        """The URL of the other node that holds `hand` now (its heartbeat younger than `lease` on
        the database's clock), or None: held by no live node, by this one, or by a node that
        advertised no URL."""
        return cast(
            "str | None",
            await self._db.run(
                lambda con: con.fetchval(
                    "SELECT n.url FROM hands h JOIN nodes n ON n.name = h.node AND n.running "
                    "WHERE h.label = $1 AND h.node <> $2 AND n.url IS NOT NULL "
                    "AND n.heartbeat_at > clock_timestamp() - make_interval(secs => $3)",
                    hand,
                    self.name,
                    lease,
                )
            ),
        )

    async def held_elsewhere(self, hands: list[str], lease: float) -> set[str]:
        """Which of `hands` another live node (with a URL) holds now: one statement (as `route`)."""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT h.label FROM hands h JOIN nodes n ON n.name = h.node AND n.running "
                "WHERE h.label = ANY($1::text[]) AND h.node <> $2 AND n.url IS NOT NULL "
                "AND n.heartbeat_at > clock_timestamp() - make_interval(secs => $3)",
                hands,
                self.name,
                lease,
            )
        )
        return {r[0] for r in rows}

    async def peers(self, lease: float) -> list[tuple[str, str]]:
        """The other live nodes (as `route`, whatever Hands they hold), (name, URL) by name: where
        to ask for a run this node neither holds nor relayed, and for their runs (DESIGN §16)."""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT name, url FROM nodes WHERE running AND name <> $1 AND url IS NOT NULL "
                'AND heartbeat_at > clock_timestamp() - make_interval(secs => $2) ORDER BY name COLLATE "C"',
                self.name,
                lease,
            )
        )
        return [(r[0], r[1]) for r in rows]

    async def nodes(self) -> list[tuple[str, bool, float]]:
        """Every node: (name, running, seconds since its heartbeat on the database's clock)."""
        rows = await self._db.run(
            lambda con: con.fetch(
                "SELECT name, running, extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 FROM nodes "
                'ORDER BY name COLLATE "C"'
            )
        )
        return [(r[0], bool(r[1]), float(r[2])) for r in rows]


class PostgresStores:
    engine = "postgresql"

    def __init__(self, db: _Db, node: str) -> None:
        self._db = db
        self.node = node
        fence = Fence(node)
        self.credentials = PgCredentials(db)
        self.snapshots = PgSnapshots(db, fence)
        self.endings = PgEndings(db, node, fence)
        self.history: PgHistory | None = PgHistory(db, fence)
        self.nodes: PgNodes | None = PgNodes(db, fence)

    async def close(self) -> None:
        if self.nodes is not None:
            self.nodes.close_lease()
            await self.nodes._welcomes.aclose()
        await self.credentials._secrets.aclose()
        await self.snapshots._empty.aclose()
        await self._db.close()
