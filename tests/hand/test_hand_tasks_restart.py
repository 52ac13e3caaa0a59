"""A Hand that crashes (a real `hand run`, killed -9) and comes back: its unfinished tasks become
`lost`, nothing re-runs, the log stays readable, and the crashed run's orphaned process group is
killed. `hand tasks` reads the same database, with the Hand running and without it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hand_support import pid_alive, read_pid, until
from scripted_mind import ScriptedMind
from websockets.asyncio.server import serve

from hand.aio.tasks import TaskManager
from hand.core.rows import TaskRow
from hand.core.tasks import LOST_REASON
from hand.system.taskdb import TaskStore, read_rows
from protocol import limits
from protocol.auth import Credential
from protocol.messages import Background, Result, Rpc, TaskLogs, TaskUpdate
from protocol.states import TaskState

BIN = Path(sys.executable).parent


def hand_tasks(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    return subprocess.run([str(BIN / "hand"), "tasks", *args], capture_output=True, text=True, env=env, timeout=30)


class Restarted:
    """A new task manager on a crashed Hand's state dir (what `hand run` does before connecting)."""

    def __init__(self, state: Path, root: Path) -> None:
        self.jobs: list[asyncio.Task] = []
        self.m = TaskManager(state_dir=state, root=root, kill_grace=0.5, spawn=self._spawn)

    def _spawn(self, coro):
        self.jobs.append(asyncio.get_running_loop().create_task(coro))
        return self.jobs[-1]

    async def __aenter__(self) -> TaskManager:
        await self.m.open()
        return self.m

    async def __aexit__(self, *exc) -> None:
        await self.m.shutdown()
        for job in self.jobs:
            job.cancel()
        await asyncio.gather(*self.jobs, return_exceptions=True)


@pytest.mark.slow
async def test_a_crashed_hand_leaves_lost_tasks_and_no_orphans(tmp_path):
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    cred_file = tmp_path / "hand.cred"
    cred_file.write_text(cred.token() + "\n")
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    mind = ScriptedMind(cred)
    child = None
    async with serve(mind.handler, "127.0.0.1", 0, compression=None, max_size=limits.MAX_FRAME_BYTES) as server:
        port = server.sockets[0].getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
        with open(tmp_path / "hand.log", "wb") as log:
            hand = subprocess.Popen(
                [
                    str(BIN / "hand"),
                    "run",
                    "--mind",
                    f"ws://127.0.0.1:{port}",
                    "--credential",
                    str(cred_file),
                    "--root",
                    str(root),
                    "--state-dir",
                    str(state),
                    "--kill-grace",
                    "0.5",
                    "--log-format",
                    "json",
                    "--ping-interval",
                    "1",
                    "--max-backoff",
                    "0.5",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            conn = await mind.next_conn(timeout=30)
            command = "echo ran >> side.txt; echo started; sleep 100 & echo $! > child.pid; wait"
            await conn.send(
                Rpc(
                    run_id="t1",
                    tool="shell",
                    args={"command": command},
                    timeout_ms=5_000,
                    background=Background(max_runtime_ms=3_600_000),
                )
            )
            await conn.until(lambda e: isinstance(e.msg, Result))
            await conn.until(lambda e: isinstance(e.msg, TaskUpdate) and e.msg.task.state is TaskState.RUNNING)
            child = await until(lambda: read_pid(root / "child.pid"), what="the task's child")

            r = await asyncio.to_thread(hand_tasks, "--state-dir", str(state), "--json")  # next to a live Hand
            assert r.returncode == 0, r.stderr
            [listed] = json.loads(r.stdout)
            assert listed["task_id"] == "t1" and listed["state"] == "running" and listed["tool"] == "shell"
            assert command not in r.stdout  # digests only

            os.kill(hand.pid, signal.SIGKILL)  # a crash: the task's group is left to fend for itself
            await asyncio.to_thread(hand.wait, 10)
            assert pid_alive(child)
        finally:
            if hand.poll() is None:
                os.killpg(hand.pid, signal.SIGKILL)
                hand.wait()

    try:
        async with Restarted(state, root) as m:
            [row] = read_rows(state)
            assert row.state is TaskState.LOST and row.version == 3
            assert row.reason == f"{LOST_REASON}; its leftover processes were killed"
            assert not pid_alive(child)
            assert (root / "side.txt").read_text() == "ran\n"  # nothing re-ran
            page = await m.logs(TaskLogs(task_id="t1"))
            assert page.data == b"started\n" and page.eof and page.state is TaskState.LOST
            assert row.log_bytes == len(b"started\n")
    finally:
        if child is not None and pid_alive(child):
            os.kill(child, signal.SIGKILL)

    r = hand_tasks("--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    header, line = r.stdout.splitlines()
    assert header.split()[:3] == ["TASK", "STATE", "TOOL"] and "LOG BYTES" in header and "REASON" in header
    assert line.split()[:3] == ["t1", "lost", "shell"] and "hand restarted before completion" in line
    r = hand_tasks("--state-dir", str(state), "--state", "lost", "--json")
    [listed] = json.loads(r.stdout)
    for key in (
        "task_id",
        "state",
        "tool",
        "created_at",
        "started_at",
        "finished_at",
        "exit_code",
        "log_bytes",
        "truncated",
        "reason",
    ):
        assert key in listed
    assert listed["state"] == "lost" and listed["log_bytes"] == 8 and listed["finished_at"] >= listed["started_at"]
    assert json.loads(hand_tasks("--state-dir", str(state), "--state", "running", "--json").stdout) == []


@pytest.mark.slow
async def test_restart_without_leftovers_marks_rows_lost_and_kills_nothing_else(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    store = TaskStore(state)
    now = time.time()
    common = dict(
        tool="shell", args_digest="0" * 64, binding_digest="1" * 64, version=1, max_runtime_ms=1000, created_at=now
    )
    store.insert(TaskRow(task_id="q", state=TaskState.QUEUED, **common))
    store.insert(TaskRow(task_id="r", state=TaskState.RUNNING, **common))
    # A live process of ours whose start time does not match the row: a reused pid, left alone.
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        store.update("r", pid=bystander.pid, pid_start_time=1)
        store.insert(TaskRow(task_id="done", state=TaskState.QUEUED, **common))
        store.update("done", state=TaskState.CANCELLED, finished_at=now)
        store.close()
        async with Restarted(state, root):
            rows = {r.task_id: r for r in read_rows(state)}
            assert rows["q"].state is TaskState.LOST and rows["q"].reason == LOST_REASON and rows["q"].version == 2
            assert rows["r"].state is TaskState.LOST and rows["r"].reason == LOST_REASON and rows["r"].version == 3
            assert rows["done"].state is TaskState.CANCELLED and rows["done"].version == 2  # terminal: untouched
            assert pid_alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.slow
def test_hand_tasks_without_a_database_or_a_state_dir(tmp_path):
    r = hand_tasks("--state-dir", str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == "no tasks"
    r = hand_tasks("--state-dir", str(tmp_path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []
    r = hand_tasks("--state-dir", str(tmp_path / "missing"))
    assert r.returncode == 2 and "does not exist" in r.stderr and r.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--task-retention", "soon", "--task-retention"),
        ("--task-log-max", "12X", "--task-log-max"),
        ("--max-running-tasks", "0", "--max-running-tasks"),
    ],
)
def test_bad_task_flags_exit_2(tmp_path, flag, value, expected):
    cred = tmp_path / "hand.cred"
    cred.write_text(f"mh1:hand:h1:{'ab' * 32}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    r = subprocess.run(
        [
            str(BIN / "hand"),
            "run",
            "--mind",
            "ws://127.0.0.1:9",
            "--credential",
            str(cred),
            "--root",
            str(tmp_path),
            "--state-dir",
            str(tmp_path / "state"),
            flag,
            value,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert r.returncode == 2 and r.stderr.startswith("hand: ") and expected in r.stderr, r.stderr


def test_durations_and_sizes():
    from hand.cli import parse_duration, parse_size

    assert [parse_duration(t) for t in ("90s", "30m", "2h", "7d", "15")] == [90, 1800, 7200, 604800, 15]
    assert [parse_size(t) for t in ("65536", "512K", "64M", "1G", "2k")] == [65536, 512 << 10, 64 << 20, 1 << 30, 2048]
    for bad in ("", "7w", "-1s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError):
        parse_size("1.5M")
