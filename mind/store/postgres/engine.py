"""The PostgreSQL engine's front door: `connect` (the pool, the schema brought up to date) and its
five stores, sharing the pool and this node's claims (`Fence`)."""

from __future__ import annotations

from pathlib import Path

from mind.store.postgres.credentials import PgCredentials
from mind.store.postgres.endings import PgEndings
from mind.store.postgres.fence import Fence
from mind.store.postgres.history import PgHistory
from mind.store.postgres.nodes import PgNodes
from mind.store.postgres.pool import Db, open_db
from mind.store.postgres.recordings import PgRecordings
from mind.store.postgres.schema import migrate
from mind.store.postgres.snapshots import PgSnapshots


async def connect(dsn: str, node: str) -> PostgresStores:
    """Open the pool, migrate, and return the stores. Raises `StoreUnavailable` (cannot reach the
    database) or `SchemaTooNew`; the caller (`mind serve`, the admin commands) says it and exits."""
    db = await open_db(dsn, node)
    try:
        await migrate(db)
    except BaseException:
        await db.close()
        raise
    return PostgresStores(db, node)


class PostgresStores:
    engine = "postgresql"

    def __init__(self, db: Db, node: str) -> None:
        self._db = db
        self.node = node
        fence = Fence(node)
        self.credentials = PgCredentials(db)
        self.snapshots = PgSnapshots(db, fence)
        self.endings = PgEndings(db, node, fence)
        self.history: PgHistory | None = PgHistory(db, fence)
        self.nodes: PgNodes | None = PgNodes(db, fence)

    def open_recordings(self, key: bytes, where: Path | None = None) -> PgRecordings:
        """The recordings in this database, their heads signed with `key` (never stored here);
        `where` (`--record-dir`) is the embedded engine's."""
        return PgRecordings(self._db, key)

    async def close(self) -> None:
        if self.nodes is not None:
            await self.nodes.close()
        await self.credentials.close()
        await self.snapshots.close()
        await self.endings.close()
        await self._db.close()
