"""The SQLite engine of `mind.store.api`: today's files and classes, awaited.

`mind.db` (credentials and task snapshots) and `endings.db` in the Mind's home, exactly as before
many Minds existed (DESIGN §16: no database configured, nothing changes). The stores stay
synchronous (their snapshot and ending operations are the scripts of `mind.store.scripts`, each
run to its end on the calling thread); this module only gives each call its thread, as the daemon
did itself: credentials on their own thread (handshakes must not queue behind a reconciliation's
snapshot batches: a client's round trip went from ~40 ms to ~200 ms when both shared one),
snapshots on the database thread (one writer), endings on the loop (one small WAL insert, before
anyone hears).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from mind.core.snapshots import Plan, Snapshot
from mind.store import scripts
from mind.store.api import Calls, Results
from mind.store.credential_rows import CredentialRow
from mind.store.credentials import Store
from mind.store.endings import Ending, EndingStore
from mind.store.recordings import SqliteRecordings
from mind.store.scripts import run_now
from mind.store.snapshots import SnapshotStore
from protocol.auth import Credential
from protocol.messages import TaskInfo
from protocol.states import TaskState

T = TypeVar("T")


class _OnThread:
    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args))

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class SqliteCredentials(_OnThread):
    def __init__(self, path: Path) -> None:
        super().__init__("mind-creds")
        self.sync = Store(path)

    async def mind_id(self) -> str:
        return await self._call(self.sync.mind_id)

    async def seal_key(self) -> bytes:
        return await self._call(self.sync.seal_key)

    async def epoch(self) -> int:
        return await self._call(self.sync.epoch)

    async def add(
        self, role: str, label: str, scope: str | None = None, labels: dict[str, str] | None = None
    ) -> Credential:
        return await self._call(self.sync.add, role, label, scope, labels)

    async def rotate(self, role: str, label: str) -> Credential | None:
        return await self._call(self.sync.rotate, role, label)

    async def scope(self, role: str, label: str) -> str | None:
        return await self._call(self.sync.scope, role, label)

    async def set_labels(self, role: str, label: str, set_: dict[str, str], remove: list[str]) -> dict[str, str] | None:
        return await self._call(self.sync.set_labels, role, label, set_, remove)

    async def revoke(self, role: str, label: str) -> bool:
        return await self._call(self.sync.revoke, role, label)

    async def secret(self, role: str, label: str) -> bytes | None:
        return await self._call(self.sync.secret, role, label)

    async def next_generation(self, role: str, label: str) -> int:
        return await self._call(self.sync.next_generation, role, label)

    async def touch(self, role: str, label: str) -> None:
        await self._call(self.sync.touch, role, label)

    async def list(self, role: str) -> list[CredentialRow]:
        return await self._call(self.sync.list, role)

    async def close(self) -> None:
        self.sync.close()
        self._shutdown()


class SqliteSnapshots(_OnThread):
    def __init__(self, path: Path) -> None:
        super().__init__("mind-db")
        self.sync = SnapshotStore(path)

    async def get(self, task_id: str) -> Snapshot | None:
        return await self._call(self.sync.get, task_id)

    async def insert_new(self, snap: Snapshot) -> Snapshot | None:
        return await self._call(self.sync.insert_new, snap)

    async def delete(self, task_id: str) -> None:
        await self._call(self.sync.delete, task_id)

    async def remove(self, task_id: str, hand: str) -> Snapshot | None:
        return await self._call(self.sync.remove, task_id, hand)

    async def report(self, hand: str, info: TaskInfo, now: float, adopt: bool = True) -> tuple[Snapshot | None, str]:
        return await self._call(self.sync.report, hand, info, now, adopt)

    async def retry_start(self, snap: Snapshot) -> Snapshot | None:
        return await self._call(self.sync.retry_start, snap)

    async def finish_start(self, task_id: str) -> Snapshot | None:
        return await self._call(self.sync.finish_start, task_id)

    async def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None:
        return await self._call(self.sync.set_cancel_pending, task_id, reason)

    async def clear_cancel_pending(self, task_id: str) -> None:
        await self._call(self.sync.clear_cancel_pending, task_id)

    async def mark_hand_stale(self, hand: str) -> int:
        return await self._call(self.sync.mark_hand_stale, hand)

    async def mark_all_stale(self) -> int:
        return await self._call(self.sync.mark_all_stale)

    async def list(
        self,
        hand: str | None = None,
        state: TaskState | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[Snapshot]:
        return await self._call(self.sync.list, hand, state, limit, after)

    async def counts_by_state(self) -> dict[str, int]:
        return await self._call(self.sync.counts_by_state)

    async def counts_visible(self, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]:
        return await self._call(self.sync.counts_visible, visible)

    async def count_stale(self) -> int:
        return await self._call(self.sync.count_stale)

    async def reconcile(
        self,
        hand: str,
        hand_rows: dict[str, TaskInfo],
        now: float,
        synced_since: float | None = None,
        quota: int | None = None,
    ) -> Plan:
        return await self._call(self.sync.reconcile, hand, hand_rows, now, synced_since, quota)

    async def batch(self, calls: Calls) -> Results:
        """`scripts.batch` in one hop to the database thread, each call straight to the store there."""
        sync = self.sync

        async def call(name: str, args: tuple[Any, ...]) -> Any:
            return getattr(sync, name)(*args)

        return await self._call(lambda: run_now(scripts.batch(call, calls)))

    async def close(self) -> None:
        self.sync.close()
        self._shutdown()


class SqliteEndings:
    """On the loop, as before: `put_many_now` is the write `Mind.perform` makes before telling anyone."""

    def __init__(self, path: Path) -> None:
        self.sync = EndingStore(path)
        self.put_many_now: Callable[[list[Ending]], None] | None = self.sync.put_many

    async def put(self, ending: Ending) -> None:
        self.sync.put(ending)

    async def put_many(self, endings: list[Ending]) -> None:
        self.sync.put_many(endings)

    async def load(self, window: float, now: float | None = None) -> list[Ending]:
        return self.sync.load(window, now)

    async def begin_life(self) -> bool:
        return self.sync.begin_life()

    async def end_life(self, live_runs: int) -> None:
        self.sync.end_life(live_runs)

    async def close(self) -> None:
        self.sync.close()


class SqliteStores:
    engine = "sqlite"

    def __init__(self, db: Path, endings: Path) -> None:
        self._home = db.parent
        self.credentials = SqliteCredentials(db)
        self.snapshots = SqliteSnapshots(db)
        self.endings = SqliteEndings(endings)
        self.history = None
        """One SQLite Mind keeps its run history in memory (`mind serve --retain-runs`), as before."""
        self.nodes = None
        """One Mind, no claims: a Hand's credential generation fences its connections, as before."""

    def open_recordings(self, key: bytes, where: Path | None = None) -> SqliteRecordings:
        """`recordings.db` beside mind.db (or in `where`: `--record-dir`), its heads signed with
        `key` (DESIGN §19)."""
        return SqliteRecordings((where or self._home) / "recordings.db", key)

    async def close(self) -> None:
        await self.credentials.close()
        await self.snapshots.close()
        await self.endings.close()
