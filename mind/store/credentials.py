"""The Mind's SQLite store: credentials and per-label generations.

Generations must be monotonic per label and survive a Mind restart, because they are what makes a
result from an old connection recognisably old (DESIGN §8). `next_generation` increments inside one
transaction and returns the new value only after it is committed.

Synchronous on purpose: the asyncio shell calls it through `asyncio.to_thread`, the CLI directly.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path

from mind.store.credential_rows import CredentialRow, labels_json
from protocol import limits
from protocol.auth import Credential
from protocol.errors import MindhandError
from protocol.io.files import private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS credentials (
    role TEXT NOT NULL CHECK (role IN ('hand', 'client')),
    label TEXT NOT NULL,
    secret BLOB NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL,
    generation INTEGER NOT NULL DEFAULT 0,
    last_seen_at REAL,
    scope TEXT,
    labels TEXT,
    PRIMARY KEY (role, label)
);
"""


class StoreError(MindhandError):
    pass


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private_file(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(credentials)")}
        if "scope" not in cols:  # a database from before scopes existed
            self._db.execute("ALTER TABLE credentials ADD COLUMN scope TEXT")
        if "labels" not in cols:  # a database from before fleet labels existed (issue 16)
            self._db.execute("ALTER TABLE credentials ADD COLUMN labels TEXT")
        for suffix in ("-wal", "-shm"):
            side = Path(str(path) + suffix)
            if side.exists():
                os.chmod(side, 0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def mind_id(self) -> str:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='mind_id'").fetchone()
            if row:
                return row[0]
            mid = "mind-" + secrets.token_hex(6)
            self._db.execute("INSERT INTO meta(key, value) VALUES ('mind_id', ?)", (mid,))
            return mid

    def seal_key(self) -> bytes:
        """The key this Mind seals its `rpc`s with (`mind.core.seal`), made once, kept for every life."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='seal_key'").fetchone()
            if row:
                return bytes.fromhex(row[0])
            key = secrets.token_hex(32)
            self._db.execute("INSERT INTO meta(key, value) VALUES ('seal_key', ?)", (key,))
            return bytes.fromhex(key)

    def _bump_epoch(self) -> None:
        """Any change to credentials: the daemon watches this to close connections of revoked or
        rotated credentials at once."""
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES ('cred_epoch', '1') "
            "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )

    def epoch(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='cred_epoch'").fetchone()
        return int(row[0]) if row else 0

    def add(self, role: str, label: str, scope: str | None = None, labels: dict[str, str] | None = None) -> Credential:
        if not limits.LABEL_RE.match(label):
            raise StoreError(f"invalid name {label!r}: use 1-64 of A-Z a-z 0-9 . _ - , starting with a letter or digit")
        secret = secrets.token_bytes(limits.SECRET_BYTES)
        with self._lock:
            row = self._db.execute(
                "SELECT revoked_at FROM credentials WHERE role=? AND label=?", (role, label)
            ).fetchone()
            if row is not None and row[0] is None:
                raise StoreError(f"{role} {label!r} already exists")
            if row is not None:
                # Re-adding a revoked name keeps its generation counter: generations never go back.
                self._db.execute(
                    "UPDATE credentials SET secret=?, created_at=?, revoked_at=NULL, scope=?, labels=? "
                    "WHERE role=? AND label=?",
                    (secret, time.time(), scope, labels_json(labels), role, label),
                )
            else:
                self._db.execute(
                    "INSERT INTO credentials(role, label, secret, created_at, scope, labels) VALUES (?, ?, ?, ?, ?, ?)",
                    (role, label, secret, time.time(), scope, labels_json(labels)),
                )
            self._bump_epoch()
        return Credential(role=role, label=label, secret=secret)

    def rotate(self, role: str, label: str) -> Credential | None:
        """A new secret for an active credential; the old one stops working at once."""
        secret = secrets.token_bytes(limits.SECRET_BYTES)
        with self._lock:
            cur = self._db.execute(
                "UPDATE credentials SET secret=? WHERE role=? AND label=? AND revoked_at IS NULL", (secret, role, label)
            )
            if cur.rowcount != 1:
                return None
            self._bump_epoch()
        return Credential(role=role, label=label, secret=secret)

    def scope(self, role: str, label: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT scope FROM credentials WHERE role=? AND label=?", (role, label)).fetchone()
        return row[0] if row else None

    def set_labels(self, role: str, label: str, set_: dict[str, str], remove: list[str]) -> dict[str, str] | None:
        """Change an active credential's labels (set `set_`, drop the keys in `remove`); the new
        labels, or None if there is no such active credential. The daemon reads labels from this
        table at every selection, so a change applies to the next fleet run without a restart."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT labels FROM credentials WHERE role=? AND label=? AND revoked_at IS NULL", (role, label)
                ).fetchone()
                if row is None:
                    self._db.execute("ROLLBACK")
                    return None
                now = json.loads(row[0]) if row[0] else {}
                for k in remove:
                    now.pop(k, None)
                now.update(set_)
                if len(now) > limits.HAND_LABELS_MAX:
                    self._db.execute("ROLLBACK")
                    raise StoreError(f"{role} {label!r} would have {len(now)} labels; at most {limits.HAND_LABELS_MAX}")
                self._db.execute(
                    "UPDATE credentials SET labels=? WHERE role=? AND label=?", (labels_json(now), role, label)
                )
                self._db.execute("COMMIT")
            except StoreError:
                raise
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return dict(sorted(now.items()))

    def revoke(self, role: str, label: str) -> bool:
        with self._lock:
            cur = self._db.execute(
                "UPDATE credentials SET revoked_at=? WHERE role=? AND label=? AND revoked_at IS NULL",
                (time.time(), role, label),
            )
            if cur.rowcount == 1:
                self._bump_epoch()
            return cur.rowcount == 1

    def secret(self, role: str, label: str) -> bytes | None:
        """The live secret, or None for an unknown or revoked credential."""
        with self._lock:
            row = self._db.execute(
                "SELECT secret FROM credentials WHERE role=? AND label=? AND revoked_at IS NULL",
                (role, label),
            ).fetchone()
        return bytes(row[0]) if row else None

    def next_generation(self, role: str, label: str) -> int:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "UPDATE credentials SET generation = generation + 1, last_seen_at=? WHERE role=? AND label=?",
                    (time.time(), role, label),
                )
                row = self._db.execute(
                    "SELECT generation FROM credentials WHERE role=? AND label=?", (role, label)
                ).fetchone()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if row is None:
            raise StoreError(f"{role} {label!r} vanished during the handshake")
        return int(row[0])

    def touch(self, role: str, label: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE credentials SET last_seen_at=? WHERE role=? AND label=?", (time.time(), role, label)
            )

    def list(self, role: str) -> list[CredentialRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT role, label, created_at, revoked_at, generation, last_seen_at, scope, labels FROM credentials "
                "WHERE role=? ORDER BY label",
                (role,),
            ).fetchall()
        return [CredentialRow(*r) for r in rows]
