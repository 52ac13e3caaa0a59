"""Finished runs' metadata on the shared database (DESIGN §16): `mind run get` through any node."""

from __future__ import annotations

import time

import asyncpg

from mind.store.postgres.fence import Fence
from mind.store.postgres.pool import Db
from mind.store.rows import run_info_blob, run_info_of
from mind.store.scripts import PRUNE_EVERY
from protocol.messages import RunInfo

HISTORY_KEEP_S = 7 * 24 * 3600.0
"""Finished runs' metadata kept in the shared database (`mind run get` through any node)."""


class PgHistory:
    """Finished runs' metadata (`RunInfo`: states, times, exit codes, digests, output tails; never a
    value), shared so `mind run get` answers through any node, and kept past one node's memory."""

    def __init__(self, db: Db, fence: Fence | None = None) -> None:
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
                run_info_blob(info),
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
            return row[0], run_info_of(row[1])
        except Exception:
            return None
