"""The Hand's task database: `tasks.db` (SQLite, WAL) in the state dir, the authority on every
background task (DESIGN §3, §7).

Rules this module keeps:
- A row is durable before anyone hears of it: every write is a committed transaction with
  `synchronous=FULL`, so the `accepted` that follows an insert survives a power cut. The starts
  admitted together share one transaction (`insert_many`: one fsync for the batch, all or none).
- `version` starts at 1 and grows by one on EVERY change of the row: the Mind applies a report
  only if it is newer than what it holds, so pushes, replies and inventory pages can arrive in any
  order. A state change goes through `protocol.states.advance`: a terminal row never changes again.
- Raw arguments never enter the database: only `args_digest` and `binding_digest`.
- Private: the state dir is 0700, the database and its -wal/-shm files 0600.

The API is synchronous (one connection behind a lock); the asyncio side calls it through
`asyncio.to_thread`. `hand tasks` reads the same file with `read_rows`, while the Hand runs or not.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hand.core.rows import Change, Insert, TaskRow, Write
from protocol.codes import KillStage
from protocol.errors import MindhandError
from protocol.io.files import private_dir, private_file
from protocol.states import TASK_TERMINAL, TASK_TRANSITIONS, TaskState, advance

DB_NAME = "tasks.db"
LOGS_DIR = "logs"
STREAMS = ("stdout", "stderr")
"""The streams whose bytes also go to a file of their own, beside the combined log."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id        TEXT PRIMARY KEY,
    tool           TEXT NOT NULL,
    args_digest    TEXT NOT NULL,
    binding_digest TEXT NOT NULL,
    state          TEXT NOT NULL,
    version        INTEGER NOT NULL,
    max_runtime_ms INTEGER NOT NULL,
    created_at     REAL NOT NULL,
    started_at     REAL,
    finished_at    REAL,
    exit_code      INTEGER,
    signal         INTEGER,
    stage          TEXT,
    reason         TEXT NOT NULL DEFAULT '',
    error          TEXT,
    log_bytes      INTEGER NOT NULL DEFAULT 0,
    truncated      INTEGER NOT NULL DEFAULT 0,
    pid            INTEGER,
    pid_start_time INTEGER,
    usage          TEXT
);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, finished_at);
"""


_ADDED = (("usage", "TEXT"),)
"""Columns added since the first schema: a database made by an older Hand gets them at open."""


def _add_columns(db: sqlite3.Connection) -> None:
    have = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
    for name, kind in _ADDED:
        if name not in have:
            db.execute(f"ALTER TABLE tasks ADD COLUMN {name} {kind}")


class TaskStoreError(MindhandError):
    """The database cannot be opened or used (a local problem: permissions, a corrupt file)."""


def _raise(result: Any) -> Any:
    if isinstance(result, BaseException):
        raise result
    return result


_FIELDS = tuple(f.name for f in dataclasses.fields(TaskRow))
_IN_CHUNK = 500
"""Ids per `IN (...)` query: well under SQLite's limit on bound parameters."""
_COLUMNS = ", ".join(_FIELDS)


def _to_row(values: tuple[Any, ...]) -> TaskRow:
    d = dict(zip(_FIELDS, values, strict=True))
    d["state"] = TaskState(d["state"])
    d["stage"] = KillStage(d["stage"]) if d["stage"] is not None else None
    d["truncated"] = bool(d["truncated"])
    return TaskRow(**d)


def _to_values(row: TaskRow) -> tuple[Any, ...]:
    d = {f: getattr(row, f) for f in _FIELDS}  # flat fields: no deep copy (`asdict`) per write
    d["state"] = row.state.value
    d["stage"] = row.stage.value if row.stage is not None else None
    d["truncated"] = int(row.truncated)
    return tuple(d[f] for f in _FIELDS)


class TaskStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / DB_NAME
        self.logs_dir = self.state_dir / LOGS_DIR
        self._lock = threading.Lock()
        try:
            private_dir(self.state_dir)
            private_dir(self.logs_dir)
            private_file(self.path)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise TaskStoreError(f"{self.path}: cannot switch to WAL journaling (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            _add_columns(self._db)
            for suffix in ("-wal", "-shm"):
                extra = Path(f"{self.path}{suffix}")
                if extra.exists():
                    os.chmod(extra, 0o600)
        except (OSError, sqlite3.Error) as exc:
            raise TaskStoreError(f"cannot open the task database {self.path}: {exc}") from None

    def log_path(self, task_id: str) -> Path:
        """The combined log: both streams in arrival order (what `log_bytes` counts)."""
        return self.logs_dir / f"{task_id}.log"

    def stream_log_path(self, task_id: str, stream: str) -> Path:
        """One stream's own log (`stdout` / `stderr`). Never another task's file: an id cannot end
        in `.log` and `.stdout` at once, so `{id}.stdout` is no `{id2}.log` (ids may hold dots)."""
        return self.logs_dir / f"{task_id}.{stream}"

    def log_paths(self, task_id: str) -> list[Path]:
        """Every file of a task's log, for whoever removes it (purge, `task rm`)."""
        return [self.log_path(task_id), *(self.stream_log_path(task_id, s) for s in STREAMS)]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- reads ----------------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskRow | None:
        with self._lock:
            cur = self._db.execute(f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,))
            found = cur.fetchone()
        return _to_row(found) if found is not None else None

    def get_many(self, task_ids: Iterable[str]) -> dict[str, TaskRow]:
        """The rows stored under any of `task_ids`, by id (absent ids are missing from the result)."""
        ids = list(dict.fromkeys(task_ids))
        found: dict[str, TaskRow] = {}
        with self._lock:
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i : i + _IN_CHUNK]
                cur = self._db.execute(
                    f"SELECT {_COLUMNS} FROM tasks WHERE task_id IN ({', '.join('?' * len(chunk))})", chunk
                )
                for values in cur.fetchall():
                    row = _to_row(values)
                    found[row.task_id] = row
        return found

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0])

    def page(self, after: str | None, limit: int) -> list[TaskRow]:
        """Up to `limit` rows with task_id > `after`, ordered by task_id."""
        with self._lock:
            cur = self._db.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE task_id > ? ORDER BY task_id LIMIT ?", (after or "", limit)
            )
            return [_to_row(r) for r in cur.fetchall()]

    def unfinished(self) -> list[TaskRow]:
        with self._lock:
            cur = self._db.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE state IN (?, ?) ORDER BY created_at, task_id",
                (TaskState.QUEUED.value, TaskState.RUNNING.value),
            )
            return [_to_row(r) for r in cur.fetchall()]

    # --- writes (each one a committed transaction) ----------------------------------------------

    def insert(self, row: TaskRow) -> None:
        """Insert a new row and commit. Raises `sqlite3.IntegrityError` if the id exists."""
        self.insert_many([row])

    def insert_many(self, rows: Sequence[TaskRow]) -> None:
        """Insert new rows in one transaction and commit, all or none. Raises
        `sqlite3.IntegrityError` if any id exists."""
        if rows:
            _raise(self.write_many([Insert(tuple(rows))])[0])

    def update(self, task_id: str, **changes: Any) -> TaskRow:
        """Apply `changes`, bump `version`, commit, and return the new row. A change of `state` must
        be a legal transition (`IllegalTransition` otherwise, and nothing is written)."""
        return _raise(self.write_many([Change(task_id, changes)])[0])

    def write_many(self, writes: Sequence[Write]) -> list[Any]:
        """Apply `writes` in order in ONE transaction and commit it: one fsync for all (the group
        commit). Each write is undone alone if it fails (a savepoint: an id that exists, an unknown
        id, an illegal transition) and its result is then the exception; the others stand. Results:
        None for an `Insert`, the new row for a `Change`. If the commit itself fails nothing is
        stored and the error is raised: no write of the batch may be reported as done."""
        results: list[Any] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for write in writes:
                    self._db.execute("SAVEPOINT one")
                    try:
                        if isinstance(write, Insert):
                            self._insert(write.rows)
                            results.append(None)
                        else:
                            results.append(self._change(write.task_id, write.changes))
                    except Exception as exc:  # this write's own result
                        self._db.execute("ROLLBACK TO one")
                        results.append(exc)
                    self._db.execute("RELEASE one")
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return results

    def _insert(self, rows: Sequence[TaskRow]) -> None:
        self._db.executemany(
            f"INSERT INTO tasks ({_COLUMNS}) VALUES ({', '.join('?' * len(_FIELDS))})",
            [_to_values(row) for row in rows],
        )

    def _change(self, task_id: str, changes: Mapping[str, Any]) -> TaskRow:
        if "version" in changes or "task_id" in changes:
            raise ValueError("version and task_id are not changed by the caller")
        cur = self._db.execute(f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,))
        found = cur.fetchone()
        if found is None:
            raise KeyError(task_id)
        row = _to_row(found)
        if "state" in changes and changes["state"] != row.state:
            advance(TASK_TRANSITIONS, row.state, changes["state"])
        new = dataclasses.replace(row, **changes, version=row.version + 1)
        sets = ", ".join(f"{f} = ?" for f in _FIELDS[1:])
        self._db.execute(
            f"UPDATE tasks SET {sets} WHERE task_id = ? AND version = ?",
            (*_to_values(new)[1:], task_id, row.version),
        )
        return new

    def purge(self, finished_before: float) -> list[str]:
        """Delete terminal rows that finished before `finished_before`, then their log files.
        Returns the ids deleted. Rows go first: a log without a row is garbage, a row whose log
        vanished would be a lie."""
        terminal = tuple(s.value for s in TASK_TERMINAL)
        marks = ", ".join("?" * len(terminal))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                ids = [
                    r[0]
                    for r in self._db.execute(
                        f"SELECT task_id FROM tasks WHERE state IN ({marks}) AND finished_at < ?",
                        (*terminal, finished_before),
                    ).fetchall()
                ]
                self._db.executemany("DELETE FROM tasks WHERE task_id = ?", [(i,) for i in ids])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        for task_id in ids:
            for path in self.log_paths(task_id):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        return ids

    def remove(self, task_id: str) -> TaskRow | None:
        """Delete one finished task's row, then its log files (`mind task rm`); the row as it was,
        or None when no finished row has this id (nothing is deleted: a running task keeps its row
        and its log). The row goes first, as in `purge`: a log without a row is garbage, a row
        whose log vanished would be a lie."""
        terminal = tuple(s.value for s in TASK_TERMINAL)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                found = self._db.execute(
                    f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ? AND state IN ({', '.join('?' * len(terminal))})",
                    (task_id, *terminal),
                ).fetchone()
                if found is not None:
                    self._db.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
                self._db.execute("COMMIT")
            except BaseException:  # nothing is removed: neither the row nor (below) its log
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        if found is None:
            return None
        for path in self.log_paths(task_id):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return _to_row(found)


def read_rows(state_dir: Path, state: TaskState | None = None) -> list[TaskRow] | None:
    """Every row (or those in `state`), ordered by created_at, read without changing anything: for
    `hand tasks`, which may run next to a live Hand. None if there is no database yet."""
    path = Path(state_dir) / DB_NAME
    if not path.is_file():
        return None
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10.0)
        try:
            sql = f"SELECT {_COLUMNS} FROM tasks"
            params: tuple[Any, ...] = ()
            if state is not None:
                sql += " WHERE state = ?"
                params = (state.value,)
            rows = db.execute(sql + " ORDER BY created_at, task_id", params).fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        if "no such table" in str(exc):
            return []
        raise TaskStoreError(f"cannot read the task database {path}: {exc}") from None
    return [_to_row(r) for r in rows]
