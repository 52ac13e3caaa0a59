"""The PostgreSQL engine's pool, and the one bounded way every call of it takes a connection.

Every statement runs under `STATEMENT_TIMEOUT_S`, both on the client (`command_timeout`, the pool
acquire, one `asyncio.timeout` per call) and on the server (`statement_timeout`): a database that
went away or hangs costs a request a clear `StoreUnavailable` within seconds, never the event loop.
A transaction the database rolled back (a deadlock between two nodes' writes about one Hand, a
serialization failure) is tried again, `RETRIES` times in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from mind.store.api import StoreUnavailable

T = TypeVar("T")

STATEMENT_TIMEOUT_S = 5.0
"""The longest any one call on the database may take, connection included."""
CONNECT_TIMEOUT_S = 5.0
POOL_MAX = 8

GONE = (
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


def why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def open_db(dsn: str, node: str) -> Db:
    """Open the pool. Raises `StoreUnavailable` when the database cannot be reached."""
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
    except (*GONE, asyncpg.PostgresError) as exc:
        raise StoreUnavailable(f"cannot reach the database {where}: {why(exc)}") from None
    return Db(pool, where, dsn)


async def _keep_session(con: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does (roll back an open
    transaction, drop client-side listeners). Its default also sends `SELECT pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL;`, one more round trip on every release, about five per Hand
    welcomed (measured by the `nodes` benchmark), for session state the pool never has: its
    advisory lock is transaction-scoped (`pg_advisory_xact_lock`), no cursor outlives its
    transaction, the LISTEN is on a connection of its own, and settings are fixed at connect."""


class Db:
    """The pool, and the one way to use it: a bounded call that says what went wrong."""

    def __init__(self, pool: asyncpg.Pool, where: str, dsn: str = "") -> None:
        self.pool = pool
        self.where = where
        self.dsn = dsn
        """For the connections outside the pool: the LISTEN and the lease of `PgNodes`."""

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
        except GONE as exc:
            raise StoreUnavailable(f"the database {self.where} is unavailable: {why(exc)}") from None
        except asyncpg.TransactionRollbackError as exc:
            raise StoreUnavailable(f"the database {self.where} kept rolling this back: {why(exc)}") from None

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.pool.close(), STATEMENT_TIMEOUT_S)
        except (*GONE, asyncpg.PostgresError):
            self.pool.terminate()
