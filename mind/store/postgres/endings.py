"""The endings on the shared database: a run one node ended is ended for every node its Hand may
reach next (DESIGN §15, §16). The scripts are `mind.store.scripts.EndingBook`'s, written once; this
module is their PostgreSQL port, with each ending's write fenced by this node's claim of its Hand.
The life record (`begin_life`/`end_life`) is this node's own row of `nodes`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg

from mind.store.postgres.fence import Fence
from mind.store.postgres.pool import STATEMENT_TIMEOUT_S, Db
from mind.store.rows import ENDING_COLS, Ending, ending_row
from mind.store.scripts import EndingBook

_WRITE = (
    f"INSERT INTO run_endings ({ENDING_COLS}, hand) "
    "SELECT $1, $2, $3, $4, $5, $6, $8 WHERE NOT $7 OR EXISTS "
    "(SELECT 1 FROM hands WHERE label = $8 AND node = $9 AND claim = $10 FOR SHARE) "
    "ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, "
    "ended_at = EXCLUDED.ended_at, cancel_reason = EXCLUDED.cancel_reason, "
    "args_digest = EXCLUDED.args_digest, run_end = EXCLUDED.run_end RETURNING 1"
)
"""One ending, written only while this node holds its Hand by the claim it carries (when fenced):
the claim's row is locked FOR SHARE until commit, so a claim by another node waits for the ending
and then reads it (`mind.store.postgres.nodes`); one that committed first refuses it."""


class PgEndingRows:
    """The port of `mind.store.scripts.EndingRows`: each call one bounded call of the pool."""

    def __init__(self, db: Db, node: str, fence: Fence | None) -> None:
        self._db = db
        self._node = node
        self._fence = fence

    async def write(self, endings: list[Ending]) -> list[tuple[str, int]]:
        """Every ending in one transaction (one connection), each conditional on this node's claim
        of the run's Hand; the others are written all the same."""
        fence = self._fence
        fenced = fence is not None and fence.active
        rows = [
            (
                *ending_row(e),
                fenced,
                e.end.hand,
                self._node,
                fence.claim(e.end.hand) if fence is not None and fenced else 0,
            )
            for e in endings
        ]

        async def run(con: asyncpg.Connection) -> list[tuple[str, int]]:
            refused: list[tuple[str, int]] = []
            async with con.transaction():
                for row in rows:
                    if await con.fetchval(_WRITE, *row) is None:
                        refused.append((row[7], row[9]))
            return refused

        return await self._db.run(run)

    async def prune(self, horizon: float, keep: int) -> None:
        async def run(con: asyncpg.Connection) -> None:
            await con.execute("DELETE FROM run_endings WHERE ended_at < $1", horizon)
            await con.execute(
                "DELETE FROM run_endings WHERE run_id NOT IN "
                "(SELECT run_id FROM run_endings ORDER BY ended_at DESC LIMIT $1)",
                keep,
            )

        await self._db.run(run)

    async def read(self) -> list[Any]:
        return await self._db.run(
            lambda con: con.fetch(f"SELECT {ENDING_COLS} FROM run_endings ORDER BY ended_at"),
            timeout=STATEMENT_TIMEOUT_S * 6,
        )

    async def start_life(self) -> tuple[bool, int] | None:
        async def run(con: asyncpg.Connection) -> tuple[bool, int] | None:
            async with con.transaction():
                row = await con.fetchrow("SELECT running, live_runs FROM nodes WHERE name = $1 FOR UPDATE", self._node)
                await con.execute(
                    "INSERT INTO nodes (name, running, live_runs) VALUES ($1, true, 0) ON CONFLICT (name) DO UPDATE "
                    "SET running = true, live_runs = 0, started_at = now(), heartbeat_at = now()",
                    self._node,
                )
                return None if row is None else (bool(row[0]), int(row[1]))

        return await self._db.run(run)

    async def end_life(self, live_runs: int) -> None:
        await self._db.run(
            lambda con: con.execute(
                "UPDATE nodes SET running = false, live_runs = $2, heartbeat_at = now() WHERE name = $1",
                self._node,
                live_runs,
            )
        )


class PgEndings:
    """The PostgreSQL engine's endings: `EndingBook`'s scripts, and `Fenced` for a refused write."""

    put_many_now: Callable[[list[Ending]], None] | None = None

    def __init__(self, db: Db, node: str, fence: Fence | None = None) -> None:
        self._fence = fence
        self._book = EndingBook(PgEndingRows(db, node, fence))

    async def put(self, ending: Ending) -> None:
        await self.put_many([ending])

    async def put_many(self, endings: list[Ending]) -> None:
        """Every ending of one turn of the Mind's loop in one transaction (one connection). Each is
        conditional on this node's claim of the run's Hand: a node that lost the Hand writes nothing
        about it. The others are written all the same; then `Fenced` names the first refused."""
        refused = await self._book.put_many(endings)
        if refused and self._fence is not None:
            for hand, claim in refused[1:]:
                if self._fence.on_fenced is not None:
                    self._fence.on_fenced(hand, claim)
            self._fence.fenced(*refused[0])  # raises Fenced

    async def prune(self, window: float, now: float) -> None:
        await self._book.prune(window, now)

    async def load(self, window: float, now: float | None = None) -> list[Ending]:
        return await self._book.load(window, now)

    async def begin_life(self) -> bool:
        return await self._book.begin_life()

    async def end_life(self, live_runs: int) -> None:
        await self._book.end_life(live_runs)

    async def close(self) -> None:
        pass
