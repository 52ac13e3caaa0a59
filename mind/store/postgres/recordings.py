"""Recordings on the shared database (DESIGN §19): any node lists and plays any recording.

The rows are those of the embedded engine (`mind.store.recordings`); blocks are encoded, linked
and signed off the loop (`asyncio.to_thread`: hashing and compressing a flush of a fast run is
milliseconds of CPU), then written in one transaction per flush.
"""

from __future__ import annotations

import asyncio

import asyncpg

from mind.core.recording import Stored
from mind.store.postgres.pool import Db
from mind.store.recordings import (
    BLOCK_COLS,
    LISTING_COLS,
    PAGE_BYTES,
    Batch,
    Chain,
    Listing,
    block_row,
    listing_filter,
    listing_of,
    listing_row,
    stored_of,
    update_row,
)

WRITE_TIMEOUT_S = 30.0
"""A flush can carry tens of MiB of a fast run's output: more than a statement's usual bound."""


class PgRecordings:
    def __init__(self, db: Db, key: bytes) -> None:
        self._db = db
        self.chain = Chain(key)

    async def write(self, batch: Batch) -> None:
        heads: dict[str, bytes | None] = {}
        for b in batch.blocks:  # a run picked up from another node follows that node's last head
            if b.seq > 0 and b.run_id not in heads and not self.chain.knows(b.run_id, b.seq - 1):
                heads[b.run_id] = await self._head(b.run_id, b.seq - 1)
        stored = await asyncio.to_thread(
            self.chain.store, batch.blocks, lambda run_id, seq: heads.get(run_id), batch.pack
        )

        async def run(con: asyncpg.Connection) -> None:
            async with con.transaction():
                await con.executemany(
                    f"INSERT INTO recordings ({LISTING_COLS}) VALUES ({','.join(f'${i}' for i in range(1, 15))}) "
                    "ON CONFLICT (run_id) DO NOTHING",
                    [listing_row(x) for x in batch.begun],
                )
                await con.executemany(
                    f"INSERT INTO recording_blocks ({BLOCK_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) "
                    "ON CONFLICT (run_id, seq) DO NOTHING",  # another writer's number (`Recorder.release`)
                    [_pg_block(s) for s in stored],
                )
                await con.executemany(
                    "UPDATE recordings SET ended = $1, state = $2, exit_code = $3, bytes = $4, blocks = $5, "
                    "gaps = $6 WHERE run_id = $7",
                    [update_row(x) for x in batch.updated],
                )

        try:
            await self._db.run(run, timeout=WRITE_TIMEOUT_S)
        except BaseException:
            for b in batch.blocks:
                self.chain.forget(b.run_id)
            raise

    async def _head(self, run_id: str, seq: int) -> bytes | None:
        row = await self._db.run(
            lambda con: con.fetchval("SELECT head FROM recording_blocks WHERE run_id = $1 AND seq = $2", run_id, seq)
        )
        return bytes(row) if row is not None else None

    async def listing(self, run_id: str) -> Listing | None:
        row = await self._db.run(
            lambda con: con.fetchrow(f"SELECT {LISTING_COLS} FROM recordings WHERE run_id = $1", run_id)
        )
        return listing_of(row) if row is not None else None

    async def find(
        self,
        hand: str | None = None,
        client: str | None = None,
        since: float | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[Listing]:
        where, params = listing_filter(hand, client, since, before, "$")
        params.append(limit)
        sql = f"SELECT {LISTING_COLS} FROM recordings {where} ORDER BY started DESC, run_id DESC LIMIT ${len(params)}"
        rows = await self._db.run(lambda con: con.fetch(sql, *params))
        return [listing_of(r) for r in rows]

    async def blocks(self, run_id: str, after: int = -1, max_bytes: int = PAGE_BYTES) -> list[Stored]:
        # a page by count first (blocks are at most a flush each), then cut by bytes
        rows = await self._db.run(
            lambda con: con.fetch(
                f"SELECT {BLOCK_COLS} FROM recording_blocks WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT 256",
                run_id,
                after,
            )
        )
        out: list[Stored] = []
        size = 0
        for r in rows:
            out.append(stored_of(r))
            size += len(r[3])
            if size >= max_bytes:
                break
        return out

    async def last_seq(self, run_id: str) -> int:
        n = await self._db.run(
            lambda con: con.fetchval("SELECT max(seq) FROM recording_blocks WHERE run_id = $1", run_id)
        )
        return -1 if n is None else int(n)

    async def prune(self, before: float) -> int:
        async def run(con: asyncpg.Connection) -> int:
            async with con.transaction():
                ids = [r[0] for r in await con.fetch("SELECT run_id FROM recordings WHERE started < $1", before)]
                await con.execute("DELETE FROM recording_blocks WHERE run_id = ANY($1::text[])", ids)
                await con.execute("DELETE FROM recordings WHERE run_id = ANY($1::text[])", ids)
                return len(ids)

        return await self._db.run(run, timeout=WRITE_TIMEOUT_S)

    async def close(self) -> None:
        return None


def _pg_block(s: Stored) -> tuple[object, ...]:
    row = block_row(s)
    return (*row[:4], bool(row[4]), *row[5:])
