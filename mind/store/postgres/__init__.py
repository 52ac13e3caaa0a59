"""The PostgreSQL engine of `mind.store.api`: one database shared by any number of Mind nodes.

Driver: asyncpg (MagicStack, maintained since 2016): asyncio-native, so a statement never holds a
thread; the binary protocol (secrets and msgpack blobs go as bytes, no quoting); its own pool; and
LISTEN/NOTIFY for the rare events (a claim, a revocation). Every statement runs under a timeout
(`pool`): a database that went away or hangs costs a request a clear `StoreUnavailable` within
seconds, never the event loop.

The snapshot and ending operations are the scripts of `mind.store.scripts`, written once for both
engines, over this engine's ports (`snapshots`, `endings`): inside one transaction with the rows
locked (`SELECT ... FOR UPDATE`) and every write about a Hand fenced by this node's claim (`fence`),
so two nodes applying a report and a reconciliation of the same Hand still apply them in version
order. The rows are encoded as the SQLite engine encodes them (`mind.store.rows`).

The package: `engine` (connect, the stores), `pool` (the pool and the one bounded call), `fence`
(the claims a write carries), `schema` (the migrations, `NNNN_*.sql` files of this package), and one
module per store: `credentials`, `snapshots`, `endings`, `history`, `nodes`.
"""

from mind.store.postgres.engine import PostgresStores, connect
from mind.store.postgres.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "PostgresStores", "connect"]
