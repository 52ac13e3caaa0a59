"""Operator labels live with the Hand's credential in the Mind's store (issue 16): a database from
before labels keeps working, and label edits are checked and bounded."""

from __future__ import annotations

import sqlite3

import pytest

from mind.store.credentials import Store, StoreError
from protocol import limits

OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE credentials (
    role TEXT NOT NULL CHECK (role IN ('hand', 'client')),
    label TEXT NOT NULL,
    secret BLOB NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL,
    generation INTEGER NOT NULL DEFAULT 0,
    last_seen_at REAL,
    scope TEXT,
    PRIMARY KEY (role, label)
);
INSERT INTO credentials(role, label, secret, created_at, generation) VALUES ('hand', 'old1', x'00', 1.0, 7);
"""


def test_a_database_from_before_labels_is_migrated_in_place(tmp_path):
    db = tmp_path / "mind.db"
    con = sqlite3.connect(db)
    con.executescript(OLD_SCHEMA)
    con.close()
    store = Store(db)
    try:
        (row,) = store.list("hand")
        assert row.label == "old1" and row.generation == 7 and row.label_map() == {}
        assert store.set_labels("hand", "old1", {"role": "web"}, []) == {"role": "web"}
        assert store.list("hand")[0].label_map() == {"role": "web"}
    finally:
        store.close()
    store = Store(db)  # and opening it again changes nothing
    try:
        assert store.list("hand")[0].label_map() == {"role": "web"}
    finally:
        store.close()


def test_labels_set_remove_and_bounds(tmp_path):
    store = Store(tmp_path / "mind.db")
    try:
        store.add("hand", "web1", labels={"role": "web"})
        assert store.set_labels("hand", "web1", {"dc": "eu1"}, []) == {"dc": "eu1", "role": "web"}
        assert store.set_labels("hand", "web1", {}, ["role", "absent"]) == {"dc": "eu1"}
        assert store.set_labels("hand", "nobody", {"a": "b"}, []) is None
        many = {f"k{i}": "v" for i in range(limits.HAND_LABELS_MAX + 1)}
        with pytest.raises(StoreError):
            store.set_labels("hand", "web1", many, [])
        assert store.list("hand")[0].label_map() == {"dc": "eu1"}  # a refused edit changes nothing
        store.revoke("hand", "web1")
        assert store.set_labels("hand", "web1", {"a": "b"}, []) is None
    finally:
        store.close()
