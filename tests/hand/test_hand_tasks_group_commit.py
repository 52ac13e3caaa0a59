"""Group commit of background task starts (`TaskManager.on_start` -> `GroupCommit`): the starts
that arrive while a commit is in progress are decided together and their rows committed in one
transaction, and every rule of one-at-a-time admission still holds:

- each start gets exactly one answer, and `accepted` only once ITS row is committed (durable: a
  fresh `TaskStore` on the same files finds it);
- duplicates, conflicts and the quota are decided in arrival order, each start seeing the rows
  admitted before it in the same batch;
- a failed write or a failed commit refuses every start of the batch: no `accepted`, no row, nothing
  queued, and the database is usable afterwards;
- a request read after a start (inventory, status) sees it, even before its batch was committed.

`on_start` is called several times without awaiting anything in between (as the connection's
reader does): every such start is in the same batch, deterministically.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from hand_support import stop_manager

from hand.aio.tasks import TaskManager
from hand.core.rows import Change, Insert, TaskRow
from hand.core.tasks import Admission, StartRequest, TaskLimits, admit_batch
from hand.system.taskdb import DB_NAME, TaskStore
from protocol.codes import RejectCode
from protocol.envelope import Channel, decode
from protocol.messages import (
    Accepted,
    Background,
    Rejected,
    Result,
    Rpc,
    TaskInfo,
    TaskInventory,
    TaskStartValue,
    TaskStatus,
)
from protocol.states import TaskState


class Hand:
    """A task manager whose tasks never run (`max_running=0`: starts are all this is about), every
    message it sends, and the Insert writes it committed."""

    def __init__(self, tmp: Path, max_retained: int = 1000) -> None:
        self.state = tmp / "state"
        (tmp / "root").mkdir(exist_ok=True)
        self.jobs: list[asyncio.Task] = []
        self.sent: list = []
        self.channel = Channel()
        self.on_accepted = None
        self.m = TaskManager(
            state_dir=self.state,
            root=tmp / "root",
            spawn=self._spawn,
            limits=TaskLimits(max_running=0, max_retained=max_retained),
        )
        self.insert_batches: list[int] = []

    def _spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self.jobs.append(task)
        return task

    def _send(self, msg) -> None:
        msg = decode(self.channel.stamp(msg)).msg  # what the Mind would decode
        if isinstance(msg, Accepted) and self.on_accepted is not None:
            self.on_accepted(msg)
        self.sent.append(msg)

    async def open(self) -> None:
        await self.m.open()
        write_many = self.m.store.write_many

        def counting(writes):
            self.insert_batches += [len(w.rows) for w in writes if isinstance(w, Insert)]
            return write_many(writes)

        self.m.store.write_many = counting  # type: ignore[method-assign]

    async def start(self, task_id: str, command: str = "true", max_runtime_ms: int = 60_000) -> None:
        """Hand one start over, as the reader does: returns before it is decided."""
        await self.m.on_start(
            Rpc(
                run_id=task_id,
                tool="shell",
                args={"command": command},
                timeout_ms=10_000,
                background=Background(max_runtime_ms=max_runtime_ms),
            ),
            self._send,
        )

    def answers(self, task_id: str) -> list:
        return [m for m in self.sent if m.run_id == task_id]

    async def close(self) -> None:
        await stop_manager(self.m, self.jobs)


@pytest.fixture
async def make(tmp_path):
    hands: list[Hand] = []

    async def factory(**kw) -> Hand:
        h = Hand(tmp_path, **kw)
        await h.open()
        hands.append(h)
        return h

    yield factory
    for h in hands:
        await h.close()


def fresh_rows(state: Path) -> dict[str, TaskRow]:
    """What a new process would find: a fresh `TaskStore` on the same files (committed rows only)."""
    store = TaskStore(state)
    try:
        return {r.task_id: r for r in store.page(None, 100_000)}
    finally:
        store.close()


def accepted_value(msgs: list) -> TaskStartValue:
    assert [type(m) for m in msgs] == [Accepted, Result], msgs
    return TaskStartValue.model_validate(msgs[1].value)


def rejected_code(msgs: list) -> RejectCode:
    assert [type(m) for m in msgs] == [Rejected], msgs
    return msgs[0].code


# --- the shell ---------------------------------------------------------------------------------


async def test_many_concurrent_starts_are_all_accepted_once_each_and_durable(make, tmp_path):
    h = await make()
    n = 200
    committed_at_accept: dict[str, bool] = {}
    # `accepted` only after ITS row is committed: a separate connection sees it at that moment.
    probe = sqlite3.connect(f"file:{tmp_path / 'state' / DB_NAME}?mode=ro", uri=True)
    h.on_accepted = lambda msg: committed_at_accept.setdefault(
        msg.run_id, probe.execute("SELECT COUNT(*) FROM tasks WHERE task_id = ?", (msg.run_id,)).fetchone()[0] == 1
    )
    ids = [f"t{i:04}" for i in range(n)]
    for task_id in ids:
        await h.start(task_id)
    await h.m.settle()
    probe.close()
    for task_id in ids:
        value = accepted_value(h.answers(task_id))
        assert value.duplicate is False and value.task.state is TaskState.QUEUED and value.task.version == 1
    assert committed_at_accept == {task_id: True for task_id in ids}
    assert h.insert_batches == [n]  # all taken in before the first commit: ONE transaction
    rows = fresh_rows(h.state)
    assert sorted(rows) == ids and all(r.state is TaskState.QUEUED and r.version == 1 for r in rows.values())


async def test_starts_arriving_during_a_commit_share_the_next_one(make):
    h = await make()
    write_many = h.m.store.write_many
    entered = asyncio.Event()
    loop = asyncio.get_running_loop()
    release = asyncio.Event()

    def stalled(writes):  # the first commit stalls on the disk until the test lets it go
        if not entered.is_set():
            loop.call_soon_threadsafe(entered.set)
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return write_many(writes)

    h.m.store.write_many = stalled  # type: ignore[method-assign]
    await h.start("first")
    await asyncio.wait_for(entered.wait(), 10)
    for i in range(10):
        await h.start(f"later{i}")
    assert all(h.answers(f"later{i}") == [] for i in range(10))  # nothing before their commit
    release.set()
    await h.m.settle()
    assert h.insert_batches == [1, 10]
    for task_id in ["first", *(f"later{i}" for i in range(10))]:
        accepted_value(h.answers(task_id))
    assert len(fresh_rows(h.state)) == 11


async def test_a_waiter_cancelled_mid_commit_strands_nothing(make):
    """The reader waits (`settle`, for a status read after a start) while the start's commit is in
    flight, and is cancelled (its connection dropped). The batch is decided in the owner's drainer,
    not in the reader: the committed row is still queued in memory and answered (found by tests/sim)."""
    h = await make()
    write_many = h.m.store.write_many
    entered = asyncio.Event()
    loop = asyncio.get_running_loop()
    release = asyncio.Event()

    def stalled(writes):
        loop.call_soon_threadsafe(entered.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return write_many(writes)

    h.m.store.write_many = stalled  # type: ignore[method-assign]

    async def read_start_then_status() -> None:  # as the reader does, with no await in between
        await h.start("t1")
        await h.m.settle()

    reader = asyncio.create_task(read_start_then_status())
    await asyncio.wait_for(entered.wait(), 10)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert h.m.deciding()  # the batch goes on without the reader
    release.set()
    await asyncio.wait_for(h.m.settle(), 10)
    accepted_value(h.answers("t1"))
    assert "t1" in h.m._queued  # committed and queued: it will run
    assert fresh_rows(h.state)["t1"].state is TaskState.QUEUED


async def test_duplicates_and_conflicts_within_one_batch_are_decided_as_if_sequential(make):
    h = await make()
    await h.start("a", "echo one")
    await h.start("a", "echo one")  # same binding: the duplicate of the row admitted just before
    await h.start("a", "echo two")  # another binding: a conflict with it
    await h.start("a", "echo one", max_runtime_ms=5_000)  # the max runtime is part of the binding too
    await h.start("b", "echo one")
    await h.m.settle()
    first = h.answers("a")[:2]
    assert accepted_value(first).duplicate is False
    rest = h.answers("a")[2:]
    assert [type(m) for m in rest] == [Accepted, Result, Rejected, Rejected]
    dup = TaskStartValue.model_validate(rest[1].value)
    assert dup.duplicate is True and dup.task.task_id == "a" and dup.task.version == 1
    assert rest[2].code is RejectCode.CONFLICTING_DUPLICATE and rest[3].code is RejectCode.CONFLICTING_DUPLICATE
    accepted_value(h.answers("b"))
    assert h.insert_batches == [2]  # one row for "a", one for "b", in one transaction
    rows = fresh_rows(h.state)
    assert sorted(rows) == ["a", "b"]


async def test_a_duplicate_of_a_row_committed_earlier_is_found_in_the_next_batch(make):
    h = await make()
    await h.start("a", "echo one")
    await h.m.settle()
    await h.start("a", "echo one")
    await h.start("a", "echo two")
    await h.m.settle()
    msgs = h.answers("a")
    assert [type(m) for m in msgs] == [Accepted, Result, Accepted, Result, Rejected]
    assert TaskStartValue.model_validate(msgs[3].value).duplicate is True
    assert msgs[4].code is RejectCode.CONFLICTING_DUPLICATE
    assert h.insert_batches == [1]  # the second batch stored nothing
    assert list(fresh_rows(h.state)) == ["a"]


async def test_the_quota_counts_the_rows_admitted_earlier_in_the_same_batch(make):
    h = await make(max_retained=4)
    await h.start("old")
    await h.m.settle()
    for i in range(5):
        await h.start(f"t{i}")
    await h.start("t0")  # a duplicate is not a new row: answered even at the quota
    await h.m.settle()
    assert accepted_value(h.answers("t0")[:2]).duplicate is False
    for i in (1, 2):
        accepted_value(h.answers(f"t{i}"))
    for i in (3, 4):
        assert rejected_code(h.answers(f"t{i}")) is RejectCode.QUOTA_EXCEEDED
        assert "already keeps 4 tasks (max 4)" in h.answers(f"t{i}")[0].message
    assert TaskStartValue.model_validate(h.answers("t0")[3].value).duplicate is True
    assert sorted(fresh_rows(h.state)) == ["old", "t0", "t1", "t2"]


async def test_a_failed_write_refuses_every_start_of_its_batch(make, tmp_path):
    h = await make()
    await h.start("before")
    await h.m.settle()
    # A real SQLite failure, from outside: every insert into `tasks` aborts.
    other = sqlite3.connect(tmp_path / "state" / DB_NAME, isolation_level=None)
    other.execute("CREATE TRIGGER refuse BEFORE INSERT ON tasks BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    for i in range(5):
        await h.start(f"t{i}")
    await h.start("before")  # even the duplicate of a committed row: its whole batch failed
    await h.m.settle()
    for i in range(5):
        assert rejected_code(h.answers(f"t{i}")) is RejectCode.INTERNAL_ERROR
        assert "could not store the start" in h.answers(f"t{i}")[0].message
    assert rejected_code(h.answers("before")[2:]) is RejectCode.INTERNAL_ERROR
    assert not any(isinstance(m, Accepted) for i in range(5) for m in h.answers(f"t{i}"))
    assert list(fresh_rows(h.state)) == ["before"]
    assert list(h.m._queued) == ["before"]  # nothing of the failed batch will run
    other.execute("DROP TRIGGER refuse")
    other.close()
    await h.start("after")  # the database is still usable
    await h.m.settle()
    accepted_value(h.answers("after"))
    assert sorted(fresh_rows(h.state)) == ["after", "before"]


async def test_a_failed_commit_refuses_every_start_of_its_batch(make, tmp_path):
    h = await make()
    # A real failure AT COMMIT: a deferred foreign key that the new rows violate is checked only
    # when the transaction commits; SQLite refuses the COMMIT and the transaction rolls back.
    other = sqlite3.connect(tmp_path / "state" / DB_NAME, isolation_level=None)
    other.executescript("""
        CREATE TABLE parent (id TEXT PRIMARY KEY);
        CREATE TABLE guard (task_id TEXT REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);
        CREATE TRIGGER guarded AFTER INSERT ON tasks BEGIN INSERT INTO guard VALUES (NEW.task_id); END;
    """)
    h.m.store._db.execute("PRAGMA foreign_keys = ON")  # a per-connection setting: the Hand's own
    for i in range(5):
        await h.start(f"t{i}")
    await h.m.settle()
    for i in range(5):
        assert rejected_code(h.answers(f"t{i}")) is RejectCode.INTERNAL_ERROR
    assert fresh_rows(h.state) == {} and h.m._queued == {}
    other.execute("DROP TRIGGER guarded")
    other.close()
    await h.start("after")
    await h.m.settle()
    accepted_value(h.answers("after"))
    assert list(fresh_rows(h.state)) == ["after"]


async def test_a_request_read_after_a_start_sees_it(make):
    h = await make()
    await h.start("t1")  # handed over, not yet decided
    assert h.answers("t1") == []
    page = await h.m.answer(TaskInventory())
    assert [t.task_id for t in page.tasks] == ["t1"]
    accepted_value(h.answers("t1"))
    await h.start("t2")
    info = await h.m.answer(TaskStatus(task_id="t2"))
    assert isinstance(info, TaskInfo) and info.state is TaskState.QUEUED


async def test_starts_taken_in_before_shutdown_are_refused_and_store_nothing(make):
    h = await make()
    for i in range(3):
        await h.start(f"t{i}")
    await h.m.shutdown()  # before the first batch was decided
    for i in range(3):
        assert rejected_code(h.answers(f"t{i}")) is RejectCode.SHUTTING_DOWN
    assert fresh_rows(h.state) == {}


# --- the store's group commit ------------------------------------------------------------------


def _row(task_id: str) -> TaskRow:
    return TaskRow(
        task_id=task_id,
        tool="shell",
        args_digest="a",
        binding_digest="b",
        state=TaskState.QUEUED,
        version=1,
        max_runtime_ms=1000,
        created_at=time.time(),
    )


def test_write_many_undoes_a_failed_write_alone(tmp_path):
    store = TaskStore(tmp_path)
    try:
        store.insert(_row("x"))
        results = store.write_many(
            [
                Insert((_row("y"), _row("x"))),  # "x" exists: the whole Insert is undone, "y" too
                Change("x", {"state": TaskState.RUNNING}),
                Change("x", {"state": TaskState.QUEUED}),  # running -> queued is illegal
                Change("nope", {"reason": "?"}),
                Insert((_row("z"),)),
            ]
        )
        assert isinstance(results[0], sqlite3.IntegrityError)
        assert results[1].state is TaskState.RUNNING and results[1].version == 2
        assert isinstance(results[2], Exception) and isinstance(results[3], KeyError)
        assert results[4] is None
    finally:
        store.close()
    rows = fresh_rows(tmp_path)
    assert sorted(rows) == ["x", "z"] and rows["x"].state is TaskState.RUNNING and rows["x"].version == 2


# --- the decision ------------------------------------------------------------------------------


def _req(task_id: str, binding: str = "b") -> StartRequest:
    return StartRequest(task_id=task_id, tool="shell", args_digest="a", binding_digest=binding, max_runtime_ms=1000)


def test_admit_batch_is_admit_applied_in_order():
    existing = {"old": _row("old")}
    verdicts = admit_batch(
        [_req("old"), _req("old", "other"), _req("n1"), _req("n1"), _req("n1", "x"), _req("n2"), _req("n3")],
        existing,
        retained=1,
        max_retained=3,
        now=5.0,
    )
    assert [v.admission for v in verdicts] == [
        Admission.DUPLICATE,
        Admission.CONFLICT,
        Admission.INSERT,
        Admission.DUPLICATE,
        Admission.CONFLICT,
        Admission.INSERT,
        Admission.OVER_QUOTA,
    ]
    assert verdicts[0].row is existing["old"]
    assert verdicts[2].row is not None and verdicts[2].row.created_at == 5.0 and verdicts[2].row.version == 1
    assert verdicts[3].row is verdicts[2].row  # the duplicate of the row admitted before it
    assert verdicts[1].row is None and verdicts[6].row is None and verdicts[6].retained == 3
