"""The task manager driven directly: real SQLite files, real processes, `send` and `push` collecting
what would go out (each message also round-trips through the real envelope codec)."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import pytest
from hand_support import pid_alive, read_pid, stop_manager, until

from hand.aio.tasks import TaskManager
from hand.core.policy import Policy
from hand.core.tasks import TaskLimits
from hand.system.process import start_time
from hand.system.taskdb import read_rows
from protocol.codes import CancelReason, ErrorCode, KillStage, RejectCode, TaskCancelStatus
from protocol.envelope import Channel, decode
from protocol.messages import (
    Accepted,
    Background,
    Error,
    Rejected,
    Result,
    Rpc,
    TaskCancel,
    TaskInfo,
    TaskInventory,
    TaskLogs,
    TaskStartValue,
    TaskStatus,
    TaskUpdate,
)
from protocol.states import RunState, TaskState

PAGE = 64 << 10


class Hand:
    """One Hand's task manager plus everything it sent."""

    def __init__(
        self,
        tmp: Path,
        limits: TaskLimits = TaskLimits(),
        policy: Policy = Policy(),
        grace: float = 0.5,
        clock=time.time,
    ) -> None:
        self.state = tmp / "state"
        self.root = tmp / "root"
        self.root.mkdir(exist_ok=True)
        self.channel = Channel()
        self.sent: list = []
        self.updates: list[TaskInfo] = []
        self.jobs: list[asyncio.Task] = []
        self.on_send = None
        self.m = TaskManager(
            state_dir=self.state,
            root=self.root,
            spawn=self._spawn,
            policy=policy,
            limits=limits,
            kill_grace=grace,
            clock=clock,
        )
        self.m.attach(self._push)

    def _wire(self, msg):
        return decode(self.channel.stamp(msg)).msg  # what the Mind would decode

    def _spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self.jobs.append(task)
        return task

    def _send(self, msg) -> None:
        if self.on_send is not None:
            self.on_send(msg)
        self.sent.append(self._wire(msg))

    def _push(self, msg) -> None:
        assert isinstance(msg, TaskUpdate)
        self.updates.append(self._wire(msg).task)

    async def start(
        self,
        task_id: str,
        command: str | None = None,
        *,
        tool: str = "shell",
        args: dict | None = None,
        max_runtime_ms: int = 60_000,
        timeout_ms: int = 10_000,
    ) -> list:
        args = args if args is not None else {"command": command}
        before = len(self.sent)
        await self.m.on_start(
            Rpc(
                run_id=task_id,
                tool=tool,
                args=args,
                timeout_ms=timeout_ms,
                background=Background(max_runtime_ms=max_runtime_ms),
            ),
            self._send,
        )
        await self.m.settle()  # on_start hands the start to the group commit; this waits for its answer
        return self.sent[before:]

    async def info(self, task_id: str):
        return self._wire(await self.m.status(TaskStatus(task_id=task_id)))

    async def until_state(self, task_id: str, *states: TaskState, timeout: float = 15.0) -> TaskInfo:
        info: list = []

        async def reached():
            info[:] = [await self.info(task_id)]
            if not (isinstance(info[0], TaskInfo) and info[0].state in states):
                return False
            # ... and pushed: the push follows the commit (a status read may see the row first)
            return info[0].state is TaskState.QUEUED or any(
                u.task_id == task_id and u.version >= info[0].version for u in self.updates
            )

        deadline = time.monotonic() + timeout
        while not await reached():
            assert time.monotonic() < deadline, f"{task_id} never reached {states}: {info}"
            await asyncio.sleep(0.01)
        return info[0]

    async def read_log(self, task_id: str, limit: int = PAGE) -> bytes:
        data, offset = b"", 0
        while True:
            page = self._wire(await self.m.logs(TaskLogs(task_id=task_id, offset=offset, limit=limit)))
            assert page.next_offset == offset + len(page.data)
            data += page.data
            offset = page.next_offset
            if page.eof:
                return data
            if not page.data:
                await asyncio.sleep(0.01)

    async def cancel(self, task_id: str, reason: CancelReason = CancelReason.USER_REQUESTED):
        return self._wire(await self.m.cancel(TaskCancel(task_id=task_id, reason=reason)))

    def rows(self):
        return {r.task_id: r for r in read_rows(self.state) or []}

    async def close(self) -> None:
        await stop_manager(self.m, self.jobs)


@pytest.fixture
async def make(tmp_path):
    hands: list[Hand] = []

    async def factory(**kw) -> Hand:
        h = Hand(tmp_path, **kw)
        await h.m.open()
        hands.append(h)
        return h

    yield factory
    for h in hands:
        await h.close()


def started(msgs: list) -> TaskStartValue:
    assert [type(m) for m in msgs] == [Accepted, Result], msgs
    assert msgs[1].state is RunState.SUCCEEDED
    return TaskStartValue.model_validate(msgs[1].value)


@pytest.mark.slow
async def test_start_commits_before_accepted_then_runs_to_success(make, tmp_path):
    h = await make()
    seen_at_accept = []
    h.on_send = lambda msg: seen_at_accept.append(h.rows().get("t1")) if isinstance(msg, Accepted) else None
    gate = h.root / "gate"
    value = started(await h.start("t1", f"while [ ! -e {gate} ]; do sleep 0.01; done; echo hello"))
    [row] = seen_at_accept
    assert row is not None and row.state is TaskState.QUEUED and row.version == 1  # durable before `accepted`
    assert value.duplicate is False and value.task.state is TaskState.QUEUED and value.task.version == 1
    await h.until_state("t1", TaskState.RUNNING)
    row = h.rows()["t1"]
    assert row.pid and row.pid_start_time == start_time(row.pid)  # names this very process
    gate.touch()
    info = await h.until_state("t1", TaskState.SUCCEEDED)
    assert info.exit_code == 0 and info.log_bytes == 6 and info.started_at and info.finished_at
    assert [(u.state, u.version) for u in h.updates] == [(TaskState.RUNNING, 2), (TaskState.SUCCEEDED, 3)]
    assert await h.read_log("t1") == b"hello\n"
    row = h.rows()["t1"]
    assert row.version == 3 and row.log_bytes == 6
    # Private files; digests only, never the raw arguments.
    assert stat.S_IMODE(os.stat(h.state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(h.state / "logs").st_mode) == 0o700
    for name in ("tasks.db", "tasks.db-wal", "tasks.db-shm", "logs/t1.log"):
        if (h.state / name).exists() or name == "tasks.db":
            assert stat.S_IMODE(os.stat(h.state / name).st_mode) == 0o600, name
    for name in ("tasks.db", "tasks.db-wal"):
        if (h.state / name).exists():
            assert b"echo hello" not in (h.state / name).read_bytes()


@pytest.mark.slow
async def test_logs_read_back_byte_exact_by_pages_while_and_after_running(make):
    h = await make()
    started(await h.start("big", "head -c 3000000 /dev/urandom | base64 | tee out.txt"))
    data = await h.read_log("big")  # starts reading while the task still writes
    expected = (h.root / "out.txt").read_bytes()
    assert len(expected) > 3_000_000 and data == expected
    info = await h.info("big")
    assert info.state is TaskState.SUCCEEDED and info.log_bytes == len(expected) and not info.truncated
    page = h._wire(await h.m.logs(TaskLogs(task_id="big", offset=len(expected) + 10)))
    assert page.data == b"" and page.eof and page.next_offset == len(expected) + 10
    page = h._wire(await h.m.logs(TaskLogs(task_id="big", offset=100, limit=7)))
    assert page.data == expected[100:107] and not page.eof
    err = await h.m.logs(TaskLogs(task_id="nope"))
    assert isinstance(err, Error) and err.code is ErrorCode.UNKNOWN_TASK


@pytest.mark.slow
async def test_a_bounded_log_keeps_the_head_and_says_truncated(make):
    h = await make(limits=TaskLimits(log_max=1000))
    started(await h.start("t", "seq 1 100000"))
    info = await h.until_state("t", TaskState.SUCCEEDED)
    assert info.truncated and info.log_bytes == 1000
    expected = "".join(f"{i}\n" for i in range(1, 100001)).encode()[:1000]
    assert await h.read_log("t") == expected
    assert (h.state / "logs" / "t.log").stat().st_size == 1000


@pytest.mark.slow
async def test_a_duplicate_start_returns_the_task_and_runs_nothing(make):
    h = await make()
    cmd = "echo ran >> side.txt; echo done"
    first = started(await h.start("t", cmd))
    again = started(await h.start("t", cmd))  # while queued or running
    assert again.duplicate and again.task.task_id == "t" and again.task.binding_digest == first.task.binding_digest
    await h.until_state("t", TaskState.SUCCEEDED)
    late = started(await h.start("t", cmd))
    assert late.duplicate and late.task.state is TaskState.SUCCEEDED
    for other in ({"command": "echo other"}, None):
        msgs = await h.start("t", args=other or {"command": cmd}, max_runtime_ms=60_000 if other else 1234)
        assert [type(m) for m in msgs] == [Rejected] and msgs[0].code is RejectCode.CONFLICTING_DUPLICATE
    assert (h.root / "side.txt").read_text() == "ran\n"  # exactly once
    assert len(h.rows()) == 1 and h.rows()["t"].version == 3


@pytest.mark.slow
async def test_over_quota_is_refused_and_nothing_is_stored_until_retention_frees_room(make):
    now = [time.time()]
    h = await make(limits=TaskLimits(max_retained=2, retention_s=3600), clock=lambda: now[0])
    for tid in ("a", "b"):
        started(await h.start(tid, "true"))
        await h.until_state(tid, TaskState.SUCCEEDED)
    msgs = await h.start("c", "echo ran > c.txt")
    assert [type(m) for m in msgs] == [Rejected] and msgs[0].code is RejectCode.QUOTA_EXCEEDED
    assert set(h.rows()) == {"a", "b"} and not (h.state / "logs" / "c.log").exists()
    assert isinstance(await h.m.status(TaskStatus(task_id="c")), Error) and not (h.root / "c.txt").exists()
    assert (h.state / "logs" / "a.log").exists()
    now[0] += 3601  # the finished tasks are past retention: the next start purges them first
    started(await h.start("c", "echo ran > c.txt"))
    assert set(h.rows()) == {"c"} and not (h.state / "logs" / "a.log").exists()
    await h.until_state("c", TaskState.SUCCEEDED)


@pytest.mark.slow
async def test_max_running_makes_the_next_task_wait_queued(make):
    h = await make(limits=TaskLimits(max_running=1))
    gate = h.root / "gate"
    started(await h.start("first", f"while [ ! -e {gate} ]; do sleep 0.01; done"))
    started(await h.start("second", "echo second"))
    await h.until_state("first", TaskState.RUNNING)
    assert (await h.info("second")).state is TaskState.QUEUED
    gate.touch()
    first = await h.until_state("first", TaskState.SUCCEEDED)
    second = await h.until_state("second", TaskState.SUCCEEDED)
    assert second.started_at >= first.finished_at and await h.read_log("second") == b"second\n"


@pytest.mark.slow
async def test_max_runtime_times_out_and_kills_the_tree(make, tmp_path):
    h = await make()
    pidfile = tmp_path / "child.pid"
    started(await h.start("t", f"sleep 100 & echo $! > {pidfile}; wait", max_runtime_ms=500))
    child = await until(lambda: read_pid(pidfile), what="the task to start")
    info = await h.until_state("t", TaskState.TIMED_OUT)
    assert "max runtime of 500 ms" in info.reason and info.stage is KillStage.TERM
    assert not pid_alive(child)


@pytest.mark.slow
async def test_the_start_runs_timeout_does_not_limit_the_task(make):
    h = await make()
    started(await h.start("t", "sleep 0.4; echo finished", timeout_ms=50, max_runtime_ms=30_000))
    info = await h.until_state("t", TaskState.SUCCEEDED, TaskState.FAILED, TaskState.TIMED_OUT)
    assert info.state is TaskState.SUCCEEDED and await h.read_log("t") == b"finished\n"


@pytest.mark.slow
async def test_cancel_queued_running_terminal_and_unknown(make, tmp_path):
    h = await make(limits=TaskLimits(max_running=1))
    pidfile = tmp_path / "stubborn.pid"
    script = f"(trap '' TERM; exec sleep 100) & echo $! > {pidfile}; wait"
    started(await h.start("running", script))
    started(await h.start("queued", "echo ran > queued.txt"))
    stubborn = await until(lambda: read_pid(pidfile), what="the task to start")
    await h.until_state("running", TaskState.RUNNING)  # committed (the pid file can come first)

    res = await h.cancel("queued")
    assert res.status is TaskCancelStatus.CANCEL_REQUESTED and res.task.state is TaskState.CANCELLED
    assert res.task.reason == "user_requested" and res.task.started_at is None

    res = await h.cancel("running")
    assert res.status is TaskCancelStatus.CANCEL_REQUESTED and res.task.state is TaskState.RUNNING
    info = await h.until_state("running", TaskState.CANCELLED)
    assert info.stage is KillStage.KILL and info.reason == "user_requested"
    assert not pid_alive(stubborn)  # it ignored SIGTERM, SIGKILL got it

    res = await h.cancel("running")
    assert res.status is TaskCancelStatus.ALREADY_DONE and res.task.state is TaskState.CANCELLED
    res = await h.cancel("nope")
    assert res.status is TaskCancelStatus.UNKNOWN_TASK and res.task is None
    assert not (h.root / "queued.txt").exists()  # the queued task never ran
    assert [u.state for u in h.updates if u.task_id == "queued"] == [TaskState.CANCELLED]


async def test_rejections_store_nothing(make):
    h = await make(policy=Policy(deny=frozenset({"exec"})))
    cases = [
        ("read_file", {"path": "x"}, RejectCode.INVALID_REQUEST),
        ("exec", {"argv": ["true"]}, RejectCode.DENIED_BY_POLICY),
        ("shell", {"command": "true", "cwd": "../.."}, RejectCode.PATH_OUTSIDE_ROOT),
        ("shell", {"command": "true", "bogus": 1}, RejectCode.INVALID_REQUEST),
    ]
    for i, (tool, args, code) in enumerate(cases):
        msgs = await h.start(f"r{i}", tool=tool, args=args)
        assert [type(m) for m in msgs] == [Rejected] and msgs[0].code is code, (tool, args)
    assert h.rows() == {}


@pytest.mark.slow
async def test_a_program_that_cannot_start_fails_through_running(make):
    h = await make()
    started(await h.start("t", tool="exec", args={"argv": ["/nonexistent/program-xyz"]}))
    info = await h.until_state("t", TaskState.FAILED)
    assert "cannot start" in info.error and info.version == 3
    assert [u.state for u in h.updates] == [TaskState.RUNNING, TaskState.FAILED]


@pytest.mark.slow
async def test_failed_exit_and_inventory_pages(make):
    h = await make()
    for i in range(5):
        started(await h.start(f"t{i}", f"exit {i}"))
    for i in range(5):
        info = await h.until_state(f"t{i}", *(s for s in TaskState if s not in (TaskState.QUEUED, TaskState.RUNNING)))
        assert info.state is (TaskState.SUCCEEDED if i == 0 else TaskState.FAILED)
        assert info.exit_code == i and (i == 0 or info.reason == f"exit status {i}")
    ids, after = [], None
    while True:
        page = h._wire(await h.m.inventory(TaskInventory(after=after, limit=2)))
        ids += [t.task_id for t in page.tasks]
        after = page.next_after
        if after is None:
            break
    assert ids == [f"t{i}" for i in range(5)]


@pytest.mark.slow
async def test_shutdown_cancels_running_and_queued_tasks(make, tmp_path):
    h = await make(limits=TaskLimits(max_running=1))
    pidfile = tmp_path / "child.pid"
    started(await h.start("running", f"sleep 100 & echo $! > {pidfile}; wait"))
    started(await h.start("queued", "echo ran > queued.txt"))
    child = await until(lambda: read_pid(pidfile), what="the task to start")
    await h.until_state("running", TaskState.RUNNING)
    await asyncio.wait_for(h.m.shutdown(), 5)
    rows = h.rows()
    assert {r.state for r in rows.values()} == {TaskState.CANCELLED}
    assert {r.reason for r in rows.values()} == {"shutdown"}
    assert rows["queued"].started_at is None and not (h.root / "queued.txt").exists()
    assert not pid_alive(child)
    msgs = await h.start("late", "true")
    assert [type(m) for m in msgs] == [Rejected] and msgs[0].code is RejectCode.SHUTTING_DOWN
