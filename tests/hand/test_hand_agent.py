"""The agent's connection loop against a scripted Mind endpoint on loopback (`scripted_mind`), with
real sockets and real processes: foreground runs, refusals, bad frames, shutdown, and background
tasks that outlive a dropped connection.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from hand_support import pid_alive, read_pid, until
from scripted_mind import ScriptedMind
from websockets.asyncio.server import serve

from hand.aio.agent import Agent, AgentConfig
from hand.core.backoff import Backoff
from hand.system.taskdb import read_rows
from protocol import limits
from protocol.auth import Credential
from protocol.codes import CancelReason, ErrorCode
from protocol.messages import (
    Accepted,
    Background,
    Challenge,
    Error,
    Message,
    Progress,
    Result,
    Rpc,
    Started,
    TaskInfo,
    TaskLogPage,
    TaskLogs,
    TaskStartValue,
    TaskStatus,
    TaskUpdate,
)
from protocol.states import RunState, TaskState


@pytest.fixture
async def world(tmp_path):
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    mind = ScriptedMind(cred)
    root = tmp_path / "root"
    root.mkdir()
    async with serve(mind.handler, "127.0.0.1", 0, compression=None, max_size=limits.MAX_FRAME_BYTES) as server:
        port = server.sockets[0].getsockname()[1]
        mind.url = f"ws://127.0.0.1:{port}"
        cfg = AgentConfig(
            url=mind.url, credential=cred, root=root, ping_interval=1.0, kill_grace=0.5, state_dir=tmp_path / "state"
        )
        agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
        task = asyncio.create_task(agent.run())
        try:
            yield mind, agent, task, tmp_path
        finally:
            agent.request_stop()
            assert await asyncio.wait_for(task, 10) == 0


@pytest.mark.slow
async def test_handshake_and_a_run_round_trip(world):
    mind, agent, _, _ = world
    conn = await mind.next_conn()
    assert conn.hello.role == "hand" and conn.hello.label == "h1" and conn.hello.claims.hostname
    await until(lambda: agent.gen == conn.gen, what="the agent to be welcomed")
    await conn.send(Rpc(run_id="r1", tool="shell", args={"command": "echo hi"}, timeout_ms=10_000))
    msgs = await conn.until_result("r1")
    assert [type(m) for m in msgs] == [Accepted, Started, Progress, Result]
    assert msgs[-1].state is RunState.SUCCEEDED and msgs[-1].stdout.data == b"hi\n"


@pytest.mark.slow
async def test_a_dropped_connection_cancels_its_runs_and_the_hand_reconnects(world):
    mind, agent, _, tmp = world
    conn = await mind.next_conn()
    pidfile = tmp / "child.pid"
    await conn.send(
        Rpc(run_id="r1", tool="shell", args={"command": f"sleep 100 & echo $! > {pidfile}; wait"}, timeout_ms=60_000)
    )
    child = await until(lambda: read_pid(pidfile), what="the command to start")
    conn.ws.transport.abort()  # the Mind vanishes without a close frame
    await until(lambda: not pid_alive(child), timeout=10, what="the command to be killed")
    conn2 = await mind.next_conn()
    assert conn2.gen == conn.gen + 1
    # Nothing from the old connection is resent: the new one stays silent until asked.
    with pytest.raises(TimeoutError):
        await conn2.recv(timeout=0.3)
    await conn2.send(Rpc(run_id="r1", tool="shell", args={"command": "true"}, timeout_ms=10_000))
    env = await conn2.recv()
    assert env.msg.code.value == "duplicate_run"  # never run the same run id twice


async def test_refusals_to_try_later_and_a_forged_welcome_never_stop_the_hand(world):
    mind, agent, _, _ = world
    first = await mind.next_conn()
    mind.script = ["refuse", "forge", "refuse"]
    await first.ws.close()
    conn = await mind.next_conn()
    assert mind.handshakes == 5 and conn.gen == 3
    [err] = mind.hand_errors
    assert err.code is ErrorCode.AUTH_FAILED  # the Hand told the forger why, then left


async def test_a_refused_credential_ends_the_agent_with_2_once_said(tmp_path, capfd):
    """`auth_failed` from the Mind cannot heal by retrying (issue 14): said once, exit 2."""
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    mind = ScriptedMind(cred)
    mind.script = ["deny"]
    async with serve(mind.handler, "127.0.0.1", 0, compression=None) as server:
        mind.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        cfg = AgentConfig(url=mind.url, credential=cred, root=tmp_path, ping_interval=1.0)
        agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
        assert await asyncio.wait_for(agent.run(), 10) == 2
    assert mind.handshakes == 1
    err = capfd.readouterr().err
    assert err.count("not retrying") == 1 and "refused this Hand's credential (auth_failed" in err


@pytest.mark.parametrize(
    "frame, code",
    [
        (b"\xc1", ErrorCode.MALFORMED_FRAME),
        ("text frame", ErrorCode.MALFORMED_FRAME),
        (Challenge(mind_id="m", handshake_id="h", nonce=b"n" * 32, expires_in_ms=10), ErrorCode.UNEXPECTED_MESSAGE),
        ("wrong-gen", ErrorCode.GEN_MISMATCH),
        pytest.param("repeat-seq", ErrorCode.SEQ_VIOLATION, marks=pytest.mark.slow),  # runs `true` first
    ],
)
async def test_a_bad_frame_gets_an_error_frame_and_a_close(world, frame, code):
    mind, agent, _, _ = world
    conn = await mind.next_conn()
    if frame == "wrong-gen":
        conn.channel.gen = conn.gen + 7
        data = conn.channel.stamp(Rpc(run_id="r", tool="shell", args={"command": "true"}, timeout_ms=1000))
        conn.channel.gen = conn.gen
    elif frame == "repeat-seq":
        data = conn.channel.stamp(Rpc(run_id="r", tool="shell", args={"command": "true"}, timeout_ms=1000))
        await conn.ws.send(data)
        assert isinstance((await conn.recv()).msg, Accepted)  # then the very same frame again
    elif isinstance(frame, Message):
        data = conn.channel.stamp(frame)
    else:
        data = frame
    await conn.ws.send(data)
    while True:
        env = await conn.recv()
        if isinstance(env.msg, Error):
            break
    assert env.msg.code is code and env.id is None
    await conn.closed_by_hand()
    assert (await mind.next_conn()).gen == conn.gen + 1


async def test_an_error_frame_from_the_mind_makes_the_hand_reconnect(world):
    mind, _, _, _ = world
    conn = await mind.next_conn()
    await conn.send(Error(code=ErrorCode.REPLACED, message="go away"))
    await conn.closed_by_hand()
    assert (await mind.next_conn()).gen == conn.gen + 1


@pytest.mark.slow
async def test_shutdown_cancels_runs_reports_them_and_exits_zero(world):
    mind, agent, task, tmp = world
    conn = await mind.next_conn()
    pidfile = tmp / "child.pid"
    await conn.send(
        Rpc(run_id="r1", tool="shell", args={"command": f"sleep 100 & echo $! > {pidfile}; wait"}, timeout_ms=60_000)
    )
    child = await until(lambda: read_pid(pidfile), what="the command to start")
    agent.request_stop()
    msgs = await conn.until_result("r1")
    result = msgs[-1]
    assert result.state is RunState.CANCELLED and result.reason == CancelReason.SHUTDOWN.value
    assert await asyncio.wait_for(task, 10) == 0
    assert not pid_alive(child)
    await conn.closed_by_hand()


async def test_stop_while_the_mind_is_unreachable(tmp_path):
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    cfg = AgentConfig(url="ws://127.0.0.1:9", credential=cred, root=tmp_path)
    agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
    task = asyncio.create_task(agent.run())
    await until(lambda: agent._backoff.attempt >= 3, what="a few failed attempts")
    agent.request_stop()
    assert await asyncio.wait_for(task, 5) == 0


async def test_a_mind_that_never_answers_the_hello_times_the_handshake_out(world, monkeypatch):
    mind, _, _, _ = world
    first = await mind.next_conn()
    monkeypatch.setattr(limits, "HANDSHAKE_TIMEOUT_S", 0.3)
    mind.script = ["silent"]
    await first.ws.close()
    conn = await mind.next_conn()
    assert conn.gen == 2
    [err] = mind.hand_errors
    assert err.code is ErrorCode.HANDSHAKE_TIMEOUT


@pytest.mark.slow
async def test_a_task_outlives_a_dropped_connection_and_is_read_back_on_the_next(world):
    mind, agent, _, tmp = world
    conn = await mind.next_conn()
    gate = tmp / "gate"
    command = f"while [ ! -e {gate} ]; do sleep 0.01; done; seq 1 30000"
    await conn.send(
        Rpc(
            run_id="t1",
            tool="shell",
            args={"command": command},
            timeout_ms=5_000,
            background=Background(max_runtime_ms=60_000),
        )
    )
    # On the ordered stream, a status right behind the start sees the committed row.
    await conn.send(TaskStatus(task_id="t1"), id="q1")
    accepted = await conn.until(lambda e: isinstance(e.msg, Accepted))
    result = await conn.until(lambda e: isinstance(e.msg, Result))
    assert accepted.msg.run_id == result.msg.run_id == "t1" and result.msg.state is RunState.SUCCEEDED
    assert TaskStartValue.model_validate(result.msg.value).task.state is TaskState.QUEUED
    status = await conn.until(lambda e: e.id == "q1")
    assert isinstance(status.msg, TaskInfo) and status.msg.task_id == "t1"
    await conn.until(lambda e: isinstance(e.msg, TaskUpdate) and e.msg.task.state is TaskState.RUNNING)

    mind.script = ["hold"]  # the Hand stays offline until released
    conn.ws.transport.abort()
    await until(lambda: mind.handshakes >= 2, what="the Hand to try again")
    gate.touch()
    state = tmp / "state"
    await until(
        lambda: [r for r in read_rows(state) or [] if r.state is TaskState.SUCCEEDED],
        timeout=15,
        what="the task to finish while the Hand is offline",
    )
    mind.release.set()
    conn2 = await mind.next_conn()
    assert conn2.gen == conn.gen + 1
    await conn2.send(TaskStatus(task_id="t1"), id="q2")
    env = await conn2.until(lambda e: e.id == "q2")
    assert isinstance(env.msg, TaskInfo) and env.msg.state is TaskState.SUCCEEDED and env.msg.exit_code == 0
    expected = "".join(f"{i}\n" for i in range(1, 30001)).encode()
    assert env.msg.log_bytes == len(expected)
    got, offset, n = b"", 0, 0
    while True:
        n += 1
        await conn2.send(TaskLogs(task_id="t1", offset=offset), id=f"l{n}")
        page = (await conn2.until(lambda e, want=f"l{n}": e.id == want)).msg
        assert isinstance(page, TaskLogPage)
        got += page.data
        offset = page.next_offset
        if page.eof:
            break
    assert got == expected
    await conn2.send(TaskStatus(task_id="nope"), id="q3")
    env = await conn2.until(lambda e: e.id == "q3")
    assert isinstance(env.msg, Error) and env.msg.code is ErrorCode.UNKNOWN_TASK


@pytest.mark.slow
async def test_shutdown_ends_running_tasks_cancelled_and_says_so_before_closing(world):
    mind, agent, task, tmp = world
    conn = await mind.next_conn()
    pidfile = tmp / "bg.pid"
    await conn.send(
        Rpc(
            run_id="t1",
            tool="shell",
            args={"command": f"sleep 100 & echo $! > {pidfile}; wait"},
            timeout_ms=5_000,
            background=Background(max_runtime_ms=60_000),
        )
    )
    child = await until(lambda: read_pid(pidfile), what="the task to start")
    agent.request_stop()
    env = await conn.until(lambda e: isinstance(e.msg, TaskUpdate) and e.msg.task.state is TaskState.CANCELLED)
    assert env.msg.task.reason == "shutdown"
    assert await asyncio.wait_for(task, 10) == 0
    assert not pid_alive(child)
    [row] = read_rows(tmp / "state")
    assert row.state is TaskState.CANCELLED and row.reason == "shutdown"


@pytest.mark.slow
async def test_pidfd_child_watcher_reaps_without_a_thread_per_child():
    """Python 3.11's default watcher starts a thread per child; the Hand swaps in pidfds."""
    import sys
    import threading

    from hand.aio.agent import use_pidfd_child_watcher

    if sys.version_info >= (3, 12):
        assert use_pidfd_child_watcher() is False  # 3.12 already uses pidfds by itself
        return
    policy = asyncio.get_event_loop_policy()
    before = policy.get_child_watcher()
    try:
        assert use_pidfd_child_watcher() is True
        assert isinstance(policy.get_child_watcher(), asyncio.PidfdChildWatcher)
        threads = threading.active_count()
        procs = [await asyncio.create_subprocess_exec("sh", "-c", f"sleep 0.2; exit {i}") for i in range(5)]
        assert threading.active_count() == threads  # no watcher thread per running child
        assert [await p.wait() for p in procs] == [0, 1, 2, 3, 4]
    finally:
        policy.set_child_watcher(before)
