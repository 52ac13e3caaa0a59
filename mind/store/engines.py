"""Which engine a Mind (or an admin command) uses: SQLite in its home unless a database is named.

`database` (`mind serve --database`, `$MINDHAND_DATABASE`, `database` in mind.toml) is a
`postgresql://` URL; with none, the home's SQLite files exactly as before (DESIGN §16).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mind import home as paths

if TYPE_CHECKING:
    from mind.store.api import Credentials, Stores

T = TypeVar("T")


def node_name(home: Path) -> str:
    """This node's name in the shared database (its life record): kept in HOME/node.id, made once."""
    path = paths.node_file(home)
    try:
        name = path.read_text().strip()
        if name:
            return name
    except FileNotFoundError:
        pass
    name = "node-" + secrets.token_hex(6)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths.write_private(path, name + "\n")
    return name


async def open_stores(home: Path, database: str | None, node: str | None = None) -> Stores:
    """The three stores of one engine. PostgreSQL: connected and migrated, or `StoreUnavailable` /
    `SchemaTooNew` with the sentence to show. `node`: this node's name in the shared database
    (`--node-name`, else host name and port); none: the one kept in HOME/node.id."""
    if not database:
        from mind.store.sqlite import SqliteStores

        return SqliteStores(paths.db_path(home), paths.endings_path(home))
    try:
        from mind.store.postgres import connect
    except ImportError as exc:  # asyncpg is an extra: say how to get it, not a traceback
        from mind.store.api import StoreUnavailable

        raise StoreUnavailable(
            f"a database is set but its driver is missing ({exc.name or exc}): pip install 'mindhand[postgres]'"
        ) from None
    return await connect(database, node or node_name(home))


class BlockingCredentials:
    """The credential store for the synchronous admin commands (`mind hand add`, ...) on PostgreSQL:
    each call runs to completion on a private event loop. Same methods as `mind.store.credentials.Store`."""

    def __init__(self, home: Path, database: str) -> None:
        self._runner = asyncio.Runner()
        try:
            self._stores = self._runner.run(open_stores(home, database))
        except BaseException:
            self._runner.close()
            raise
        self._creds: Credentials = self._stores.credentials

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._creds, name)
        return lambda *args: self._run(method(*args))

    def close(self) -> None:
        try:
            self._run(self._stores.close())
        finally:
            self._runner.close()
