"""`TaskService._db`: snapshot-store calls batched into one database-thread hop (`Snapshots.batch`,
here the SQLite engine's), with the meaning of one `Mind.db` call each (in order, each its own transaction, each caller woken with ITS result),
and an offline Hand's snapshots never left looking fresh by a report that reached the database
after the disconnect marked them stale."""

from __future__ import annotations

import asyncio

import pytest

from mind.core.snapshots import Snapshot
from mind.daemon.taskservice import TaskService
from mind.store.api import Calls, Results
from mind.store.sqlite import SqliteSnapshots
from protocol.messages import TaskInfo
from protocol.states import TaskState

D = "0" * 64


class CountedSnapshots(SqliteSnapshots):
    """The SQLite engine's snapshots, counting the thread hops of `batch` and holding them at a gate."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.hops = 0
        self.gate: asyncio.Event | None = None

    async def batch(self, calls: Calls) -> Results:
        self.hops += 1
        if self.gate is not None:
            await self.gate.wait()
        return await super().batch(calls)


class FakeMind:
    """What `TaskService._db` uses of the Mind: an owner for tasks, the connected Hands and the
    snapshot store."""

    def __init__(self, snapshots: CountedSnapshots) -> None:
        self.snapshots = snapshots
        self.hands: dict[str, object] = {"h": object()}
        self.tasks: list[asyncio.Task] = []

    def spawn(self, coro) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))


@pytest.fixture
async def mind(tmp_path):
    m = FakeMind(CountedSnapshots(tmp_path / "mind.db"))
    yield m
    await m.snapshots.close()


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
    mind.snapshots.gate = asyncio.Event()
    first = asyncio.create_task(svc._db(mind.snapshots.insert_new, snap("a")))
    await asyncio.sleep(0)
    later = [asyncio.create_task(svc._db(mind.snapshots.insert_new, snap(t))) for t in ("b", "c")]
    again = asyncio.create_task(svc._db(mind.snapshots.insert_new, snap("b")))  # exists by then
    broken = asyncio.create_task(svc._db(mind.snapshots.report, "h", None, 5.0))  # fails alone
    mind.snapshots.gate.set()
    assert await first is None and [await t for t in later] == [None, None]
    assert (await again).task_id == "b"
    with pytest.raises(AttributeError):
        await broken
    assert mind.snapshots.hops == 2  # "a" alone, then the four calls made meanwhile
    assert sorted(s.task_id for s in mind.snapshots.sync.list("h", None, 10)) == ["a", "b", "c"]


async def test_a_report_reaching_the_database_after_the_hand_went_offline_leaves_it_stale(mind):
    svc = TaskService(mind)  # type: ignore[arg-type]
    mind.snapshots.sync.insert_new(snap("on"))
    mind.snapshots.sync.insert_new(snap("off"))
    new, _ = await svc._db(mind.snapshots.report, "h", info("on"), 5.0, hand="h")
    assert new is not None and not mind.snapshots.sync.get("on").stale  # connected: the report makes it fresh
    del mind.hands["h"]  # the disconnect (its own mark_hand_stale already ran, or will run later)
    await svc._db(mind.snapshots.report, "h", info("off"), 6.0, hand="h")
    after = mind.snapshots.sync.get("off")
    assert after.state is TaskState.RUNNING and after.version == 2 and after.stale
    assert mind.snapshots.sync.get("on").stale  # and the rest of that Hand's snapshots too
