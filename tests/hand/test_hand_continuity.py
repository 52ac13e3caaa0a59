"""The Hand's side of continuity (DESIGN §15, issue 22): a run's streams resume exactly after a cut
(`RunStreams` driven directly), and the agent keeps its runs and their results across a dropped
connection while the Mind's resume window lasts (against the scripted Mind, real processes)."""

from __future__ import annotations

import asyncio
import os

import pytest
from hand_support import pid_alive, read_pid, until
from scripted_mind import Conn, ScriptedMind
from websockets.asyncio.server import serve

from hand.aio.agent import Agent, AgentConfig
from hand.aio.runs import RunTable
from hand.aio.streams import RunStreams
from hand.core.backoff import Backoff
from hand.core.policy import Policy
from protocol import limits
from protocol.auth import Credential
from protocol.codes import CancelReason
from protocol.messages import (
    Cancel,
    Result,
    ResultAck,
    Rpc,
    RunsPresent,
    Started,
    StreamAck,
    StreamData,
    StreamPosition,
    StreamResume,
    Streams,
)
from protocol.states import RunState

WINDOW = limits.STREAM_WINDOW_MIN


class Pipes:
    """What a process gives `RunStreams`: whether output is paused, the stdin written to it."""

    def __init__(self) -> None:
        self.paused: set[str] = set()
        self.stdin = b""
        self.stdin_closed = False

    def pause_output(self, stream: str) -> None:
        self.paused.add(stream)

    def resume_output(self, stream: str) -> None:
        self.paused.discard(stream)

    def close_output(self, stream: str) -> None: ...

    def write_stdin(self, data: bytes) -> None:
        self.stdin += data

    def close_stdin(self) -> None:
        self.stdin_closed = True


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict]] = []

    def warning(self, event: str, **fields: object) -> None:
        self.warnings.append((event, fields))


def streams(stdin: bool = False) -> tuple[RunStreams, list[StreamData | StreamAck], Pipes, Log]:
    sent: list[StreamData | StreamAck] = []
    log = Log()
    rs = RunStreams("r1", Streams(stdin=stdin, window=WINDOW), sent.append, log)  # type: ignore[arg-type]
    pipes = Pipes()
    rs.attach(pipes)
    return rs, sent, pipes, log


def stdout_bytes(sent: list) -> list[tuple[int, bytes, bool]]:
    return [(m.offset, m.data, m.eof) for m in sent if isinstance(m, StreamData) and m.stream == "stdout"]


def test_after_a_cut_output_is_held_then_resent_from_the_clients_offset_once():
    rs, sent, pipes, log = streams()
    data = bytes(range(256)) * 200  # 51,200 bytes: less than the window, several chunks
    rs.on_output("stdout", data[:30_000])
    before = stdout_bytes(sent)
    assert b"".join(d for _, d, _ in before) == data[:30_000]
    rs.on_ack(StreamAck(run_id="r1", stream="stdout", offset=8_000))
    # The cut: the client got (and the relay forwarded) 20,000 bytes; the rest went nowhere.
    rs.cut()
    sent.clear()
    rs.on_output("stdout", data[30_000:])
    rs.on_output_end("stdout")
    rs.on_output_end("stderr")
    assert sent == []  # held: nothing goes out before the Mind says where the client stands
    assert "stdout" in pipes.paused  # and the child waits, as for a slow reader
    assert rs.awaiting and not rs.flushed.is_set()
    pos = {p.stream: p for p in rs.positions()}
    assert pos["stdout"] == StreamPosition(stream="stdout", offset=30_000, consumed=8_000)
    assert pos["stderr"] == StreamPosition(stream="stderr", offset=0, consumed=0)
    assert rs.on_resume(StreamResume(run_id="r1", stream="stdout", offset=20_000, consumed=12_000))
    assert rs.on_resume(StreamResume(run_id="r1", stream="stderr", offset=0, consumed=0))
    resent = stdout_bytes(sent)
    assert resent[0][0] == 20_000  # exactly from the client's offset: nothing it has, nothing skipped
    body = b"".join(d for _, d, _ in resent)
    assert data[:20_000] + body == data
    assert resent[-1] == (len(data), b"", True)  # then the end, once
    assert [o for o, _, _ in resent] == sorted({o for o, _, _ in resent})  # no offset twice
    assert not rs.flushed.is_set()  # sent, not yet consumed: a cut now would still need these bytes
    rs.on_ack(StreamAck(run_id="r1", stream="stdout", offset=len(data)))
    assert rs.flushed.is_set() and not log.warnings


def test_a_resume_point_the_stream_cannot_have_reached_is_refused_with_a_log_and_the_stream_stays_held():
    rs, sent, _, log = streams()
    rs.on_output("stdout", b"x" * 1000)
    rs.on_ack(StreamAck(run_id="r1", stream="stdout", offset=400))
    rs.cut()
    sent.clear()
    assert not rs.on_resume(StreamResume(run_id="r1", stream="stdout", offset=2000, consumed=0))  # past what was sent
    assert not rs.on_resume(StreamResume(run_id="r1", stream="stdout", offset=300, consumed=300))  # below its ack
    assert not rs.on_resume(StreamResume(run_id="r1", stream="stdin", offset=0, consumed=0))  # not an output
    assert sent == [] and rs.awaiting
    assert [e for e, _ in log.warnings] == ["stream_resume_refused"] * 3
    assert rs.on_resume(StreamResume(run_id="r1", stream="stdout", offset=400, consumed=400))
    assert b"".join(d for _, d, _ in stdout_bytes(sent)) == b"x" * 600


def test_stdin_position_after_a_cut_and_the_clients_resend_is_written_once():
    rs, sent, pipes, _ = streams(stdin=True)
    rs.on_stdin(StreamData(run_id="r1", stream="stdin", offset=0, data=b"hello "))
    rs.on_stdin(StreamData(run_id="r1", stream="stdin", offset=6, data=b"world "))
    rs.on_stdin_consumed(6)  # the child took the first chunk only
    rs.cut()
    pos = {p.stream: p for p in rs.positions()}
    assert pos["stdin"] == StreamPosition(stream="stdin", offset=12, consumed=6)
    # The client resends from 12; a chunk it sent before it heard is a repeat, dropped.
    rs.on_stdin(StreamData(run_id="r1", stream="stdin", offset=6, data=b"world "))
    rs.on_stdin(StreamData(run_id="r1", stream="stdin", offset=12, data=b"again", eof=True))
    assert pipes.stdin == b"hello world again" and pipes.stdin_closed
    rs.on_stdin_consumed(17)
    acks = [m.offset for m in sent if isinstance(m, StreamAck) and m.stream == "stdin"]
    assert acks[-1] == 17


# --- the agent keeps its runs across a cut ---------------------------------------------------------


@pytest.fixture
async def world(tmp_path):
    cred = Credential(role="hand", label="h1", secret=os.urandom(limits.SECRET_BYTES))
    mind = ScriptedMind(cred)
    root = tmp_path / "root"
    root.mkdir()
    async with serve(mind.handler, "127.0.0.1", 0, compression=None, max_size=limits.MAX_FRAME_BYTES) as server:
        mind.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        cfg = AgentConfig(url=mind.url, credential=cred, root=root, ping_interval=1.0, kill_grace=0.5)
        agent = Agent(cfg, backoff=Backoff(base=0.01, cap=0.05))
        task = asyncio.create_task(agent.run())
        try:
            yield mind, agent, root
        finally:
            agent.request_stop()
            assert await asyncio.wait_for(task, 10) == 0


async def first(conn: Conn) -> RunsPresent:
    msg = (await conn.recv()).msg
    assert isinstance(msg, RunsPresent), msg  # the first frame after welcome
    return msg


@pytest.mark.slow
async def test_a_run_outlives_the_cut_and_its_result_is_kept_until_the_mind_acknowledges_it(world):
    mind, _, root = world
    mind.resume_window = 30.0
    conn = await mind.next_conn()
    assert (await first(conn)).runs == []
    await conn.send(
        Rpc(
            run_id="r1",
            tool="shell",
            args={"command": "echo $$ > r1.pid; sleep 1; exit 3"},
            timeout_ms=20_000,
            owner="alice",
        )
    )
    await conn.until(lambda env: isinstance(env.msg, Started))
    await conn.ws.close()
    conn = await mind.next_conn()
    live = (await first(conn)).runs
    assert [r.run_id for r in live] == ["r1"]
    assert live[0].started and not live[0].result_pending and live[0].owner == "alice" and live[0].tool == "shell"
    assert live[0].remaining_ms is not None and 15_000 < live[0].remaining_ms <= 20_000
    result = (await conn.until(lambda env: isinstance(env.msg, Result))).msg
    assert result.state is RunState.FAILED and result.exit_code == 3  # its real end, on the new connection
    await conn.ws.close()  # the result was not acknowledged: it is presented and sent again
    conn = await mind.next_conn()
    again = (await first(conn)).runs
    assert [(r.run_id, r.result_pending) for r in again] == [("r1", True)]
    assert (await conn.until(lambda env: isinstance(env.msg, Result))).msg == result
    await conn.send(ResultAck(run_id="r1"))
    await asyncio.sleep(0.2)
    await conn.ws.close()
    conn = await mind.next_conn()
    assert (await first(conn)).runs == []  # acknowledged: let go


@pytest.mark.slow
async def test_past_the_window_without_a_mind_the_run_is_killed_and_forgotten(world):
    mind, _, root = world
    mind.resume_window = 1.0
    conn = await mind.next_conn()
    await first(conn)
    # A streamed run that writes without end: its output is held (the pipe paused) when the window
    # ends, and the killed tree's run must still conclude (the agent's stop below waits for it).
    await conn.send(
        Rpc(
            run_id="r2",
            tool="shell",
            args={"command": "echo $$ > r2.pid; exec yes"},
            timeout_ms=90_000,
            streams=Streams(),
        )
    )
    pid = await until(lambda: read_pid(root / "r2.pid"), 10, "the command to start")
    mind.script = ["hold"]  # the next handshake waits: the Hand stays away past its window
    await conn.ws.close()
    await until(lambda: not pid_alive(pid), 8, "the Hand to kill the run at the window's end")
    mind.release.set()
    conn = await mind.next_conn()
    assert (await first(conn)).runs == []  # its result was forgotten with it


@pytest.mark.slow
async def test_a_cancel_for_a_presented_run_kills_it_and_window_0_sends_no_presentation(world):
    mind, _, root = world
    mind.resume_window = 30.0
    conn = await mind.next_conn()
    await first(conn)
    await conn.send(Rpc(run_id="r3", tool="shell", args={"command": "echo $$ > r3.pid; sleep 60"}, timeout_ms=90_000))
    pid = await until(lambda: read_pid(root / "r3.pid"), 10, "the command to start")
    mind.resume_window = 0.0  # the Mind comes back keeping nothing... after this one presentation
    await conn.ws.close()
    conn = await mind.next_conn()
    # window 0 now: no runs_present, and the kept run is cancelled (the old rule)
    await until(lambda: not pid_alive(pid), 8, "the kept run to be cancelled under window 0")
    await conn.send(Rpc(run_id="r5", tool="shell", args={"command": "echo $$ > r5.pid; sleep 60"}, timeout_ms=90_000))
    env = await conn.recv()
    assert not isinstance(env.msg, RunsPresent)  # window 0: no presentation, the rpc's answer comes first
    pid5 = await until(lambda: read_pid(root / "r5.pid"), 10, "the command to start")
    mind.resume_window = 30.0
    await conn.ws.close()  # window 0 on this connection: its run ends with it, as before issue 22
    await until(lambda: not pid_alive(pid5), 8, "the run of a window-0 connection to be cancelled")
    conn = await mind.next_conn()
    assert (await first(conn)).runs == []
    await conn.send(
        Rpc(
            run_id="r4",
            tool="shell",
            args={"command": "echo $$ > r4.pid; exec yes"},
            timeout_ms=90_000,
            streams=Streams(),
        )
    )
    pid4 = await until(lambda: read_pid(root / "r4.pid"), 10, "the command to start")
    await conn.ws.close()
    conn = await mind.next_conn()
    assert [r.run_id for r in (await first(conn)).runs] == ["r4"]
    await conn.send(Cancel(run_id="r4", reason=CancelReason.USER_REQUESTED))
    result = (await conn.until(lambda env: isinstance(env.msg, Result))).msg
    assert result.state is RunState.CANCELLED and not pid_alive(pid4)


# --- the run table: a streamed run's result follows its resumed bytes -------------------------------


class Table:
    def __init__(self, root) -> None:
        self.sent: list = []
        self.tasks: list[asyncio.Task] = []
        self.table = RunTable(root=root, policy=Policy(), send=self.sent.append, spawn=self._spawn, kill_grace=0.5)
        self.table.window = 30.0

    def _spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def frames(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        for m in self.sent:
            if isinstance(m, StreamData):
                out.append((m.stream, (m.offset, m.data, m.eof)))
            elif isinstance(m, Result):
                out.append(("result", m.exit_code))
        return out

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def resume_all(t: Table, run_id: str, stdout: int) -> None:
    t.table.on_resume(StreamResume(run_id=run_id, stream="stdout", offset=stdout, consumed=stdout))
    t.table.on_resume(StreamResume(run_id=run_id, stream="stderr", offset=0, consumed=0))


@pytest.mark.slow
async def test_a_streamed_run_that_ends_in_the_cut_sends_its_bytes_end_and_result_only_after_the_resume(tmp_path):
    t = Table(tmp_path)
    try:
        cmd = "echo $$ > s1.pid; sleep 0.3; echo hi; exit 5"
        t.table.on_rpc(Rpc(run_id="s1", tool="shell", args={"command": cmd}, timeout_ms=20_000, streams=Streams()))
        pid = await until(lambda: read_pid(tmp_path / "s1.pid"), 10, "the command to start")
        t.table.on_cut()
        await until(lambda: not pid_alive(pid), 10, "the command to end")
        await asyncio.sleep(0.2)
        t.sent.clear()
        t.table.rewire(t.sent.append)
        (run,) = t.table.present().runs
        assert run.run_id == "s1" and not run.result_pending  # it waits for its bytes to be taken
        assert t.frames() == []  # nothing before the Mind says where the client stands
        resume_all(t, "s1", 0)
        await asyncio.sleep(0.2)
        assert ("result", 5) not in t.frames()  # sent, not yet consumed: a cut now would need them again
        t.table.on_stream(StreamAck(run_id="s1", stream="stdout", offset=3))
        assert await until(lambda: t.frames()[-1:] == [("result", 5)], 5, "the result")
        frames = t.frames()
        assert [f for f in frames if f[0] == "stdout"] == [("stdout", (0, b"hi\n", False)), ("stdout", (3, b"", True))]
        assert [f for f in frames if f[0] == "stderr"] == [("stderr", (0, b"", True))]
        assert frames[-1] == ("result", 5) and len(frames) == 4  # the result last, once
        # Sent, not acknowledged: another cut presents it again, and it follows its streams again.
        t.table.on_cut()
        t.sent.clear()
        t.table.rewire(t.sent.append)
        (run,) = t.table.present().runs
        assert run.result_pending and {p.stream: p.offset for p in run.streams} == {"stdout": 3, "stderr": 0}
        assert t.frames() == []
        resume_all(t, "s1", 3)
        assert t.frames() == [("stdout", (3, b"", True)), ("stderr", (0, b"", True)), ("result", 5)]
        t.table.on_result_ack("s1")
        assert t.table.present().runs == []
    finally:
        await t.close()
