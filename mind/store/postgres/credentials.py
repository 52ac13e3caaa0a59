"""Credentials on the shared database: one row per credential for every node, its generation bumped
by one statement (two nodes welcoming one Hand get different generations), every change told to
every node at commit (NOTIFY on `CREDENTIALS_CHANNEL`)."""

from __future__ import annotations

import json
import secrets
import time

import asyncpg

from mind.store.coalesce import Coalescer
from mind.store.credential_rows import CredentialRow, labels_json
from mind.store.credentials import StoreError
from mind.store.postgres.pool import Db
from protocol import limits
from protocol.auth import Credential

CREDENTIALS_CHANNEL = "mindhand_credentials"
BUMP_EPOCH = (
    "INSERT INTO meta (key, value) VALUES ('cred_epoch', '1') "
    "ON CONFLICT (key) DO UPDATE SET value = (meta.value::bigint + 1)::text; "
    "SELECT pg_notify('mindhand_credentials', '')"
)
"""Every credential change bumps the epoch and tells every node at commit (NOTIFY): a revocation
closes its live connections on every node at once; the 0.5 s epoch poll is the fallback."""


class PgCredentials:
    def __init__(self, db: Db) -> None:
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
                    labels_json(labels),
                )
                if inserted is None:
                    # Re-adding a revoked name keeps its generation counter: generations never go back.
                    done = await con.fetchval(
                        "UPDATE credentials SET secret = $1, created_at = $2, revoked_at = NULL, scope = $3, "
                        "labels = $4 WHERE role = $5 AND label = $6 AND revoked_at IS NOT NULL RETURNING 1",
                        secret,
                        time.time(),
                        scope,
                        labels_json(labels),
                        role,
                        label,
                    )
                    if done is None:
                        raise StoreError(f"{role} {label!r} already exists")
                await con.execute(BUMP_EPOCH)

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
                await con.execute(BUMP_EPOCH)
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
                    "UPDATE credentials SET labels = $1 WHERE role = $2 AND label = $3", labels_json(now), role, label
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
                await con.execute(BUMP_EPOCH)
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
        """The lookups in flight are cancelled (their callers too)."""
        await self._secrets.aclose()
