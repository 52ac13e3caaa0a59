"""`task list` in pages: the snapshot table's keyset order (newest first, then by id) and the
Mind's pages over it, bounded in count and bytes, complete and without repeats even when some
tasks are not the client's to see or arrive between two pages (DESIGN §11)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import pytest

from mind.core.handshake import Identity
from mind.core.scope import FULL, Scope
from mind.core.snapshots import Snapshot
from mind.daemon.taskservice import TaskService
from mind.store.snapshots import SnapshotStore
from protocol.codes import ErrorCode
from protocol.messages import Error, Message, TaskList, TaskListResult
from protocol.states import TaskState

D = "0" * 64


class FakeMind:
    """What `TaskService.list` uses of the Mind: the snapshot store on one database thread."""

    def __init__(self, snapshots: SnapshotStore) -> None:
        self.snapshots = snapshots
        self.hands: dict[str, object] = {}
        self._thread = ThreadPoolExecutor(1)

    async def db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, partial(fn, *args))


@dataclass
class Outbox:
    sent: list[tuple[Message, str | None]] = field(default_factory=list)

    def put(self, msg: Message, id: str | None = None, droppable: bool = False) -> None:
        self.sent.append((msg, id))


@dataclass
class FakePeer:
    scope: Scope = FULL
    ident: Identity = field(default_factory=lambda: Identity("client", "me", None))
    outbox: Outbox = field(default_factory=Outbox)


@pytest.fixture
def mind(tmp_path):
    store = SnapshotStore(tmp_path / "mind.db")
    m = FakeMind(store)
    yield m
    m._thread.shutdown()
    store.close()


def add(store: SnapshotStore, task_id: str, created_at: float, owner: str = "me", hand: str = "h") -> None:
    store.insert_new(
        Snapshot(
            task_id=task_id,
            hand=hand,
            tool="exec",
            args_digest=D,
            binding_digest=D,
            state=TaskState.SUCCEEDED,
            stale=False,
            created_at=created_at,
            owner=owner,
            reason="r" * 3000,  # a few KiB a view, so the byte bound shows in small listings
        )
    )


async def listing(svc: TaskService, peer: FakePeer, limit: int, between=None) -> list[list[str]]:
    pages, after = [], None
    while True:
        await svc.list(peer, "q", TaskList(limit=limit, after=after))  # type: ignore[arg-type]
        reply, _ = peer.outbox.sent.pop()
        assert isinstance(reply, TaskListResult)
        pages.append([v.task_id for v in reply.tasks])
        if reply.next_after is None:
            return pages
        after = reply.next_after
        if between is not None:
            between()


def test_the_table_lists_newest_first_then_by_id_from_any_point(mind):
    s = mind.snapshots
    for tid, t in [("b", 2.0), ("a", 2.0), ("c", 2.0), ("old", 1.0), ("new", 3.0)]:
        add(s, tid, t)
    assert [x.task_id for x in s.list()] == ["new", "a", "b", "c", "old"]
    assert [x.task_id for x in s.list(after=(2.0, "a"))] == ["b", "c", "old"]  # ties on time: by id
    assert [x.task_id for x in s.list(after=(2.0, "bb"), limit=1)] == ["c"]  # a point that is no task
    assert [x.task_id for x in s.list(after=(1.0, "old"))] == []


async def test_pages_are_complete_without_repeats_and_newer_tasks_wait_for_the_next_listing(mind):
    s = mind.snapshots
    for i in range(23):
        add(s, f"t{i:02d}", 100.0 + i // 2)  # pairs share a creation time
    svc = TaskService(mind)  # type: ignore[arg-type]
    n = iter(range(1000))
    pages = await listing(svc, FakePeer(), 10, between=lambda: add(s, f"z{next(n)}", 500.0))
    listed = sum(pages, [])
    assert [len(p) for p in pages] == [10, 10, 3]
    assert sorted(listed) == [f"t{i:02d}" for i in range(23)] and len(set(listed)) == 23


async def test_tasks_the_client_may_not_see_never_end_the_listing_early(mind):
    s = mind.snapshots
    for i in range(12):
        add(s, f"t{i:02d}", float(i), owner="me" if i % 4 == 0 else "someone-else")
    svc = TaskService(mind)  # type: ignore[arg-type]
    pages = await listing(svc, FakePeer(scope=Scope()), 2)  # own tasks only
    assert sum(pages, []) == ["t08", "t04", "t00"]
    assert [] in pages  # a page may be empty and still name the next one


async def test_a_page_is_cut_by_bytes_and_a_bad_cursor_is_an_error(mind):
    s = mind.snapshots
    for i in range(500):
        add(s, f"t{i:03d}", float(i))
    svc = TaskService(mind)  # type: ignore[arg-type]
    pages = await listing(svc, FakePeer(), 1000)
    assert len(pages) > 1 and all(len(p) < 500 for p in pages) and len(sum(pages, [])) == 500
    peer = FakePeer()
    await svc.list(peer, "q", TaskList(after="not-a-cursor"))  # type: ignore[arg-type]
    [(err, id_)] = peer.outbox.sent
    assert isinstance(err, Error) and err.code is ErrorCode.INVALID_PAYLOAD and id_ == "q"
