"""`TaskService._db`: snapshot-store calls batched into one database-thread hop, with the meaning of
one `Mind.db` call each (in order, each its own transaction, each caller woken with ITS result),
and an offline Hand's snapshots never left looking fresh by a report that reached the database
after the disconnect marked them stale."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from mind.core.snapshots import Snapshot
from mind.daemon.taskservice import TaskService
from mind.store.snapshots import SnapshotStore
from protocol.messages import TaskInfo
from protocol.states import TaskState

D = "0" * 64


class FakeMind:
    """What `TaskService._db` uses of the Mind: one database thread, an owner for tasks, the
    connected Hands and the snapshot store."""

    def __init__(self, snapshots: SnapshotStore) -> None:
        self.snapshots = snapshots
        self.hands: dict[str, object] = {"h": object()}
        self.hops = 0
        self.tasks: list[asyncio.Task] = []
        self._thread = ThreadPoolExecutor(1)
        self.gate: asyncio.Event | None = None

    async def db(self, fn, *args):
        self.hops += 1
        if self.gate is not None:
            await self.gate.wait()
        return await asyncio.get_running_loop().run_in_executor(self._thread, partial(fn, *args))

    def spawn(self, coro) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))


@pytest.fixture
def mind(tmp_path):
    store = SnapshotStore(tmp_path / "mind.db")
    m = FakeMind(store)
    yield m
    m._thread.shutdown()
    store.close()


def snap(task_id: str) -> Snapshot:
    return Snapshot(
        task_id=task_id,
        hand="h",
        tool="exec",
        args_digest=D,
        binding_digest=D,
        state=TaskState.QUEUED,
        stale=True,
        created_at=1.0,
        start_pending=True,
    )


def info(task_id: str, version: int = 2) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tool="exec",
        state=TaskState.RUNNING,
        version=version,
        args_digest=D,
        binding_digest=D,
        max_runtime_ms=1000,
        created_at=1.0,
    )


async def test_calls_made_during_a_hop_share_the_next_one_in_order(mind):
    svc = TaskService(mind)  # type: ignore[arg-type]
    mind.gate = asyncio.Event()
    first = asyncio.create_task(svc._db(mind.snapshots.insert_new, snap("a")))
    await asyncio.sleep(0)
    later = [asyncio.create_task(svc._db(mind.snapshots.insert_new, snap(t))) for t in ("b", "c")]
    again = asyncio.create_task(svc._db(mind.snapshots.insert_new, snap("b")))  # exists by then
    broken = asyncio.create_task(svc._db(mind.snapshots.report, "h", None, 5.0))  # fails alone
    mind.gate.set()
    assert await first is None and [await t for t in later] == [None, None]
    assert (await again).task_id == "b"
    with pytest.raises(AttributeError):
        await broken
    assert mind.hops == 2  # "a" alone, then the four calls made meanwhile
    assert sorted(s.task_id for s in mind.snapshots.list("h", None, 10)) == ["a", "b", "c"]


async def test_a_report_reaching_the_database_after_the_hand_went_offline_leaves_it_stale(mind):
    svc = TaskService(mind)  # type: ignore[arg-type]
    mind.snapshots.insert_new(snap("on"))
    mind.snapshots.insert_new(snap("off"))
    new, _ = await svc._db(mind.snapshots.report, "h", info("on"), 5.0, hand="h")
    assert new is not None and not mind.snapshots.get("on").stale  # connected: the report makes it fresh
    del mind.hands["h"]  # the disconnect (its own mark_hand_stale already ran, or will run later)
    await svc._db(mind.snapshots.report, "h", info("off"), 6.0, hand="h")
    after = mind.snapshots.get("off")
    assert after.state is TaskState.RUNNING and after.version == 2 and after.stale
    assert mind.snapshots.get("on").stale  # and the rest of that Hand's snapshots too
