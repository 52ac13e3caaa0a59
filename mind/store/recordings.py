"""Recordings as the Mind keeps them (DESIGN §19): a listing row per recorded run and its blocks,
each block linked into the run's hash chain and signed as it is written (`mind.core.recording`).

With the embedded default they live in `recordings.db` in the Mind's home: a file of their own
with a writer thread of its own, so a recording's bulk never queues behind the snapshot batches
of mind.db, nor its commits behind the endings the loop writes. With `--database postgresql://`
they live in that database (`mind.store.postgres.recordings`), so any node lists and plays any
recording. Both engines share `Chain` (the heads each run's next block follows) and the rows'
shape (`Listing`), and answer the same calls (`Recordings`).

The key that signs the heads is never in a database: `load_key` reads it from the Mind's home
(`recording.key`, 0600, made on first use) or from `--record-key FILE`, the same file given to
every node of a shared database.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from mind.core.recording import ZERO_HEAD, Block, Stored, store_block
from protocol.errors import MindhandError
from protocol.io.files import private_file, write_private

T = TypeVar("T")
KEY_NAME = "recording.key"
KEY_BYTES = 32
PAGE_BYTES = 4 << 20
"""Stored bytes of blocks one read returns at most (a page of `mind play`)."""


class RecordingKeyError(MindhandError):
    """The recording key cannot be read or is not a key (the message says which file and why)."""


def load_key(home: Path, named: str | None = None) -> bytes:
    """The key that signs recordings: `named` (`--record-key`), else HOME/recording.key, made
    (32 random bytes, 0600) the first time. A named file must exist, be private and hold a key."""
    path = Path(named).expanduser() if named else home / KEY_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if named:
            raise RecordingKeyError(f"--record-key {path}: no such file") from None
        data = secrets.token_bytes(KEY_BYTES)
        write_private(path, data)
        return data
    except OSError as exc:
        raise RecordingKeyError(f"recording key {path}: {exc.strerror or exc}") from None
    if os.stat(path).st_mode & 0o077:
        raise RecordingKeyError(f"recording key {path} is readable by others: chmod 600 it")
    if len(data) < 16:
        raise RecordingKeyError(f"recording key {path} holds {len(data)} bytes: at least 16 are needed")
    return data


@dataclass
class Listing:
    """A recording's row in `mind recordings`: what it is of, and how it ended (unset while it goes
    on, or when its node stopped before the end). Not trusted by `verify`: it is compared with the
    signed `start` and `end` events."""

    run_id: str
    hand: str
    client: str
    tool: str
    kind: str
    """`terminal`, `streams`, `copy` or `forward`."""
    command: dict[str, Any]
    started: float
    node: str = ""
    ended: float | None = None
    state: str | None = None
    exit_code: int | None = None
    bytes: int = 0
    """Stream bytes recorded."""
    blocks: int = 0
    gaps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "hand": self.hand,
            "client": self.client,
            "tool": self.tool,
            "kind": self.kind,
            "command": self.command,
            "started": self.started,
            "node": self.node,
            "ended": self.ended,
            "state": self.state,
            "exit_code": self.exit_code,
            "bytes": self.bytes,
            "blocks": self.blocks,
            "gaps": self.gaps,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Listing:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class Batch:
    """One flush of the recorder: recordings begun, blocks sealed, listings updated (counts, ends)."""

    begun: list[Listing] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    updated: list[Listing] = field(default_factory=list)
    pack: bool = True
    """Compress what compresses; off while the writer is behind (zlib's 150 MB/s on one core is
    slower than a fast run's relay: stored raw, the run is recorded whole instead of with gaps)."""

    def __bool__(self) -> bool:
        return bool(self.begun or self.blocks or self.updated)


class Chain:
    """The head each recording's next block follows, for the runs this writer has written to. A
    head is used only for the block right after it: a run that went to another node and came back,
    or one picked up from another node's recording, reads its last head from the store first."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._heads: dict[str, tuple[int, bytes]] = {}

    def store(
        self, blocks: list[Block], last_head: Callable[[str, int], bytes | None], pack: bool = True
    ) -> list[Stored]:
        out = []
        for b in blocks:
            seq, prev = self._heads.get(b.run_id, (-1, ZERO_HEAD))
            if seq != b.seq - 1:
                prev = ZERO_HEAD if b.seq == 0 else (last_head(b.run_id, b.seq - 1) or ZERO_HEAD)
            s = store_block(b, prev, self.key, pack)
            self._heads[b.run_id] = (b.seq, s.head)
            if b.last:
                self._heads.pop(b.run_id, None)
            out.append(s)
        return out

    def forget(self, run_id: str) -> None:
        self._heads.pop(run_id, None)

    def knows(self, run_id: str, seq: int) -> bool:
        """The head of block `seq` of `run_id` is known here."""
        return self._heads.get(run_id, (-1, b""))[0] == seq


class Recordings(Protocol):
    """What the daemon asks of a recordings store, either engine."""

    async def write(self, batch: Batch) -> None: ...
    async def listing(self, run_id: str) -> Listing | None: ...
    async def find(
        self,
        hand: str | None = None,
        client: str | None = None,
        since: float | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[Listing]: ...
    async def blocks(self, run_id: str, after: int = -1, max_bytes: int = PAGE_BYTES) -> list[Stored]: ...
    async def last_seq(self, run_id: str) -> int: ...
    async def prune(self, before: float) -> int: ...
    async def close(self) -> None: ...


SCHEMA = """
CREATE TABLE IF NOT EXISTS recordings (
    run_id TEXT PRIMARY KEY,
    hand TEXT NOT NULL,
    client TEXT NOT NULL,
    tool TEXT NOT NULL,
    kind TEXT NOT NULL,
    command TEXT NOT NULL,
    started REAL NOT NULL,
    node TEXT NOT NULL DEFAULT '',
    ended REAL,
    state TEXT,
    exit_code INTEGER,
    bytes INTEGER NOT NULL DEFAULT 0,
    blocks INTEGER NOT NULL DEFAULT 0,
    gaps INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS recordings_started ON recordings(started);
CREATE TABLE IF NOT EXISTS recording_blocks (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    t INTEGER NOT NULL,
    data BLOB NOT NULL,
    compressed INTEGER NOT NULL,
    head BLOB NOT NULL,
    mac BLOB NOT NULL,
    raw_len INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""
LISTING_COLS = "run_id, hand, client, tool, kind, command, started, node, ended, state, exit_code, bytes, blocks, gaps"
BLOCK_COLS = "run_id, seq, t, data, compressed, head, mac, raw_len"


def listing_row(x: Listing) -> tuple[Any, ...]:
    return (
        x.run_id,
        x.hand,
        x.client,
        x.tool,
        x.kind,
        json.dumps(x.command, sort_keys=True),
        x.started,
        x.node,
        x.ended,
        x.state,
        x.exit_code,
        x.bytes,
        x.blocks,
        x.gaps,
    )


def listing_of(row: Any) -> Listing:
    try:
        command = json.loads(row[5])
    except (TypeError, ValueError):
        command = {}
    return Listing(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        command,
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
    )


def block_row(s: Stored) -> tuple[Any, ...]:
    return (s.run_id, s.seq, s.t, s.data, int(s.compressed), s.head, s.mac, s.raw_len)


def stored_of(row: Any) -> Stored:
    return Stored(row[0], row[1], row[2], bytes(row[3]), bool(row[4]), bytes(row[5]), bytes(row[6]), row[7])


UPDATE_LISTING = (
    "UPDATE recordings SET ended = ?, state = ?, exit_code = ?, bytes = ?, blocks = ?, gaps = ? WHERE run_id = ?"
)


def update_row(x: Listing) -> tuple[Any, ...]:
    return (x.ended, x.state, x.exit_code, x.bytes, x.blocks, x.gaps, x.run_id)


class RecordingFile:
    """`recordings.db`, synchronous: called on its own thread by `SqliteRecordings`."""

    def __init__(self, path: Path, key: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, timeout=5, check_same_thread=False)
        # A rollback journal, not WAL: a flush is megabytes of new pages, which WAL writes twice
        # (the log, then the checkpoint past its 4 MiB), at 215 MiB/s against 496 measured; one
        # writer and its readers share this thread, so WAL's concurrent readers buy nothing here.
        self._db.execute("PRAGMA journal_mode=TRUNCATE")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self.chain = Chain(key)

    def close(self) -> None:
        self._db.close()

    def _last_head(self, run_id: str, seq: int) -> bytes | None:
        row = self._db.execute(
            "SELECT head FROM recording_blocks WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()
        return bytes(row[0]) if row is not None else None

    def write(self, batch: Batch) -> None:
        """One transaction for the whole flush; on an error nothing of it is written (and the caller
        marks the lost bytes as a gap)."""
        stored = self.chain.store(batch.blocks, self._last_head, batch.pack)
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    f"INSERT OR IGNORE INTO recordings ({LISTING_COLS}) VALUES ({','.join('?' * 14)})",
                    [listing_row(x) for x in batch.begun],
                )
                self._db.executemany(
                    f"INSERT INTO recording_blocks ({BLOCK_COLS}) VALUES (?,?,?,?,?,?,?,?)",
                    [block_row(s) for s in stored],
                )
                self._db.executemany(UPDATE_LISTING, [update_row(x) for x in batch.updated])
        except BaseException:
            for b in batch.blocks:  # the chain moves on only with what was written
                self.chain.forget(b.run_id)
            raise

    def listing(self, run_id: str) -> Listing | None:
        row = self._db.execute(f"SELECT {LISTING_COLS} FROM recordings WHERE run_id = ?", (run_id,)).fetchone()
        return listing_of(row) if row is not None else None

    def find(
        self,
        hand: str | None = None,
        client: str | None = None,
        since: float | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[Listing]:
        where, params = listing_filter(hand, client, since, before, "?")
        sql = f"SELECT {LISTING_COLS} FROM recordings {where} ORDER BY started DESC, run_id DESC LIMIT ?"
        return [listing_of(r) for r in self._db.execute(sql, (*params, limit)).fetchall()]

    def blocks(self, run_id: str, after: int = -1, max_bytes: int = PAGE_BYTES) -> list[Stored]:
        out: list[Stored] = []
        size = 0
        cur = self._db.execute(
            f"SELECT {BLOCK_COLS} FROM recording_blocks WHERE run_id = ? AND seq > ? ORDER BY seq", (run_id, after)
        )
        for row in cur:
            out.append(stored_of(row))
            size += len(row[3])
            if size >= max_bytes:
                break
        cur.close()
        return out

    def last_seq(self, run_id: str) -> int:
        row = self._db.execute("SELECT max(seq) FROM recording_blocks WHERE run_id = ?", (run_id,)).fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    def prune(self, before: float) -> int:
        with self._db:
            self._db.execute("BEGIN")
            ids = [r[0] for r in self._db.execute("SELECT run_id FROM recordings WHERE started < ?", (before,))]
            self._db.executemany("DELETE FROM recording_blocks WHERE run_id = ?", [(i,) for i in ids])
            self._db.executemany("DELETE FROM recordings WHERE run_id = ?", [(i,) for i in ids])
        return len(ids)


def listing_filter(
    hand: str | None, client: str | None, since: float | None, before: tuple[float, str] | None, mark: str
) -> tuple[str, list[Any]]:
    """The WHERE of a listing, with `mark` as the engine's placeholder (`?`, or `$` numbered)."""
    conds: list[str] = []
    params: list[Any] = []

    def p(value: Any) -> str:
        params.append(value)
        return "?" if mark == "?" else f"${len(params)}"

    if hand is not None:
        conds.append(f"hand = {p(hand)}")
    if client is not None:
        conds.append(f"client = {p(client)}")
    if since is not None:
        conds.append(f"started >= {p(since)}")
    if before is not None:
        conds.append(f"(started < {p(before[0])} OR (started = {p(before[0])} AND run_id < {p(before[1])}))")
    return ("WHERE " + " AND ".join(conds)) if conds else "", params


class SqliteRecordings:
    """The embedded engine's recordings: `RecordingFile` on a thread of its own."""

    def __init__(self, path: Path, key: bytes) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mind-rec")
        self.file = RecordingFile(path, key)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args))

    async def write(self, batch: Batch) -> None:
        await self._call(self.file.write, batch)

    async def listing(self, run_id: str) -> Listing | None:
        return await self._call(self.file.listing, run_id)

    async def find(
        self,
        hand: str | None = None,
        client: str | None = None,
        since: float | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[Listing]:
        return await self._call(self.file.find, hand, client, since, limit, before)

    async def blocks(self, run_id: str, after: int = -1, max_bytes: int = PAGE_BYTES) -> list[Stored]:
        return await self._call(self.file.blocks, run_id, after, max_bytes)

    async def last_seq(self, run_id: str) -> int:
        return await self._call(self.file.last_seq, run_id)

    async def prune(self, before: float) -> int:
        return await self._call(self.file.prune, before)

    async def close(self) -> None:
        await self._call(self.file.close)
        self._pool.shutdown(wait=True)
