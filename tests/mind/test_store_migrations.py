"""The shared database's migrations (`mind/store/postgres/schema.py`): `NNNN_*.sql` files of the
package, installed with it, numbered without a gap, and never edited once shipped: a database an
older Mind migrated to any version is brought to the same schema as a new one, and one at this
version is taken as it is (DESIGN §16)."""

from __future__ import annotations

import fnmatch
import hashlib
import tomllib
import uuid
from importlib import resources
from pathlib import Path

import pytest

from mind.store.engines import open_stores
from mind.store.postgres import schema

ROOT = Path(__file__).resolve().parents[2]

SHIPPED = {
    1: "67dc4a8afc121d11d035394b96ee8a8da615cddeab1c39ed76f2f3b7b8bc8e2e",
    2: "3e6a8ed69fa2e55a92703f3bfa75ba2200e74663242456c7f7f30df6f731b83b",
    3: "2894b7b366b8c705201a4becec070f280c7d012537e4bb760c93c21cce96973d",
    4: "16b5d58f36fb1605ff8f2c9e66d4a846172fc71a597cbc6305ff4912850cdcce",
}
"""SHA-256 of each migration's SQL as it shipped (first as Python strings of the engine's one
module, byte for byte the files' text now). A database records only the versions it ran, so a
changed migration would leave databases of one version with two schemas: add a file, never edit one."""


def test_the_migrations_are_numbered_files_of_the_package_and_shipped_ones_never_change() -> None:
    names = schema.migration_files()
    assert [int(n[:4]) for n in names] == list(range(1, len(names) + 1))
    assert schema.SCHEMA_VERSION == len(names) == len(schema.MIGRATIONS) >= len(SHIPPED)
    for version, digest in SHIPPED.items():
        assert hashlib.sha256(schema.MIGRATIONS[version - 1].encode()).hexdigest() == digest, (
            f"migration {version} ({names[version - 1]}) changed since it shipped: add a new one instead"
        )


def test_the_migrations_are_installed_with_the_package() -> None:
    """Read through importlib.resources (as an installed Mind reads them), and declared as package
    data, so a wheel carries them."""
    files = {f.name for f in resources.files("mind.store.postgres").iterdir()}
    names = schema.migration_files()
    assert set(names) <= files
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data.get("mind.store.postgres", [])
    assert all(any(fnmatch.fnmatch(n, p) for p in patterns) for n in names)


CATALOG = """
SELECT 'column', table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' '
    || coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = 'public'
UNION ALL SELECT 'index', indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL SELECT 'function', p.proname || '(' || pg_get_function_arguments(p.oid) || ') ' || p.prosrc
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
ORDER BY 1, 2
"""


@pytest.mark.slow
async def test_a_database_an_older_mind_left_at_any_version_gets_the_same_schema(postgres, tmp_path) -> None:
    """Versions 1..k applied and recorded as an older Mind did (the same SQL: see above), then this
    Mind starts: it applies k+1.. only, records each once, and the schema is a fresh database's."""
    import asyncpg

    async def catalog(dsn: str) -> tuple[list[tuple[str, str]], list[int]]:
        con = await asyncpg.connect(dsn)
        try:
            rows = [(r[0], r[1]) for r in await con.fetch(CATALOG)]
            versions = [r[0] for r in await con.fetch("SELECT version FROM schema_version ORDER BY version")]
            return rows, versions
        finally:
            await con.close()

    run = uuid.uuid4().hex[:8]
    fresh = postgres.createdb(f"t_fresh_{run}")
    s = await open_stores(tmp_path / "fresh", fresh)
    await s.close()
    want, versions = await catalog(fresh)
    assert versions == list(range(1, schema.SCHEMA_VERSION + 1))
    assert any(kind == "function" for kind, _ in want) and len(want) > 40

    for k in range(schema.SCHEMA_VERSION + 1):
        dsn = postgres.createdb(f"t_older_{k}_{run}")
        con = await asyncpg.connect(dsn)
        try:
            async with con.transaction():
                await con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                for version in range(1, k + 1):
                    await con.execute(schema.MIGRATIONS[version - 1])
                    await con.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
        finally:
            await con.close()
        s = await open_stores(tmp_path / f"older-{k}", dsn)
        try:
            await s.credentials.add("hand", "box")  # and it works
        finally:
            await s.close()
        got, versions = await catalog(dsn)
        assert versions == list(range(1, schema.SCHEMA_VERSION + 1)), k
        assert got == want, k
