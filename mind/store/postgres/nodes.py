"""Ownership and liveness of the nodes sharing a database (DESIGN §16; `mind.core.nodes` decides,
`mind.daemon.nodes` is the shell): each node's lease (a heartbeat on the database's clock), each
Hand's claim (a fencing token, taken at its welcome in one statement), and LISTEN for the claims and
credential changes of the other nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import asyncpg

from mind.core.nodes import LEASE_LOST_MESSAGE
from mind.store.api import NotLive, StoreUnavailable
from mind.store.coalesce import Coalescer
from mind.store.credentials import StoreError
from mind.store.postgres.credentials import CREDENTIALS_CHANNEL
from mind.store.postgres.fence import Fence
from mind.store.postgres.pool import CONNECT_TIMEOUT_S, GONE, STATEMENT_TIMEOUT_S, Db, why
from mind.store.rows import Ending, endings_of

CLAIMS_CHANNEL = "mindhand_claims"


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

    def __init__(self, db: Db, fence: Fence) -> None:
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
        except (*GONE, asyncpg.PostgresError) as exc:
            self.close_lease()  # a statement cut mid-way leaves the connection unusable: a new one next
            raise StoreUnavailable(f"the database {self._db.where} is unavailable: {why(exc)}") from None

    def close_lease(self) -> None:
        con, self._lease_con = self._lease_con, None
        if con is not None:
            con.terminate()

    async def close(self) -> None:
        """The lease's connection closed, the welcomes in flight cancelled (their callers too)."""
        self.close_lease()
        await self._welcomes.aclose()

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
            out.append(None if got is None else (got[0], endings_of(got[1])))
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
                    except (*GONE, asyncpg.PostgresError):
                        break
                    try:
                        await asyncio.wait_for(dropped.wait(), 2.0)
                    except TimeoutError:
                        pass
            except (*GONE, asyncpg.PostgresError):
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
        return endings_of(rows)

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
