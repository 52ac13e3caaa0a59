"""The shared database's schema: versioned migrations, applied by the Mind at start (DESIGN §16).

Migration N is the file `NNNN_*.sql` of this package (installed with it, read with
`importlib.resources`); the `schema_version` table holds a row for each version applied. A Mind
migrates at start under an advisory lock (two nodes starting at once: one migrates, the other
waits and finds it done). A schema newer than this binary is refused (`SchemaTooNew`): a downgraded
node must not write rows whose meaning it does not know.

A migration, once shipped, is never edited (tests/mind/test_store_migrations.py holds each file to
the bytes it first shipped with); a change of schema is a new file with the next number:

1. `0001_shared_state.sql`: the state of one SQLite Mind, shared; `hands` and `nodes` hold what
   ownership (a fencing claim per Hand) and liveness (a heartbeat per node) need.
2. `0002_endings_name_their_hand.sql`: an ending names its Hand, so the node that claims a Hand
   next learns what other nodes ended of its runs before the Hand presents them
   (`PgNodes.endings_of`): first terminal wins, across nodes.
3. `0003_node_urls.sql`: where other nodes reach a node (`--node-url`): a client asking one node for
   a Hand another holds is served through that node over a node-to-node link (`mind.daemon.route`).
4. `0004_endings_after_claim.sql`: a Hand's welcome in one round trip (`PgNodes.welcome`): the
   endings of its runs are read in the claim's statement by this function, VOLATILE plpgsql so its
   query takes a fresh snapshot after the claim holds the Hand's row (a plain CTE would read the
   statement's snapshot, taken before the claim waited out an old holder's last ending write, and
   miss that ending).
"""

from __future__ import annotations

import re
from importlib import resources

import asyncpg

from mind.store.api import SchemaTooNew
from mind.store.postgres.pool import STATEMENT_TIMEOUT_S, Db

PACKAGE = "mind.store.postgres"
"""Where the migrations are: this package's own files."""
MIGRATION_LOCK = 0x6D696E6468  # "mindh": the advisory lock two starting nodes take in turn
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migration_files() -> list[str]:
    """The migrations' file names, in version order; numbered 1, 2, 3, ... with none missing."""
    names = sorted(f.name for f in resources.files(PACKAGE).iterdir() if f.name.endswith(".sql"))
    for version, name in enumerate(names, start=1):
        m = _NAME.match(name)
        if m is None or int(m.group(1)) != version:
            raise RuntimeError(f"migration {name!r} of {PACKAGE} is not numbered {version:04d}_*.sql")
    return names


def _load() -> tuple[str, ...]:
    package = resources.files(PACKAGE)
    return tuple(package.joinpath(name).read_text(encoding="utf-8") for name in migration_files())


MIGRATIONS: tuple[str, ...] = _load()
"""The SQL of each migration, version N at index N - 1, exactly as its file holds it."""
SCHEMA_VERSION = len(MIGRATIONS)


async def migrate(db: Db) -> int:
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
