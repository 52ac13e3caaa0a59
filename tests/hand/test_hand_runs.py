"""The run table driven directly: the Hand's own code, with `send` collecting what would go out."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

import pytest
import structlog
from hand_support import pid_alive, read_pid, until

from hand.aio.runs import RunTable
from hand.core.policy import Policy
from hand.system import tools as hand_tools
from protocol import limits
from protocol.codes import CancelReason, CancelStatus, KillStage, RejectCode
from protocol.digest import args_digest
from protocol.envelope import Channel
from protocol.messages import Accepted, Cancel, CancelResult, Progress, Rejected, Result, Rpc, Started
from protocol.states import RunState


class Hand:
    def __init__(self, root: Path, policy: Policy = Policy(), grace: float = 0.5) -> None:
        self.root = root
        self.sent: list = []
        self.tasks: list[asyncio.Task] = []
        self.channel = Channel()  # every message must also encode as a real frame
        self.table = RunTable(root=root, policy=policy, send=self._send, spawn=self._spawn, kill_grace=grace)
        self._n = 0

    def _send(self, msg) -> None:
        self.channel.stamp(msg)
        self.sent.append(msg)

    def _spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def rpc(self, tool: str, args: dict, timeout_ms: int = 20_000, run_id: str | None = None) -> str:
        if run_id is None:
            self._n += 1
            run_id = f"run{self._n}"
        self.table.on_rpc(Rpc(run_id=run_id, tool=tool, args=args, timeout_ms=timeout_ms))
        return run_id

    def of(self, run_id: str) -> list:
        return [m for m in self.sent if getattr(m, "run_id", None) == run_id]

    def result(self, run_id: str) -> Result | None:
        found = [m for m in self.of(run_id) if isinstance(m, Result)]
        assert len(found) <= 1, "more than one result for a run"
        return found[0] if found else None

    async def wait(self, run_id: str, timeout: float = 15.0) -> Result:
        return await until(lambda: self.result(run_id), timeout, f"the result of {run_id}")

    async def close(self) -> None:
        for t in self.tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def hand(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    h = Hand(root)
    yield h
    await h.close()


@pytest.mark.slow
async def test_accepted_started_progress_result_in_order(hand):
    rid = hand.rpc("shell", {"command": "echo hello; echo oops >&2"})
    assert [type(m) for m in hand.of(rid)] == [Accepted]  # accepted synchronously
    result = await hand.wait(rid)
    msgs = hand.of(rid)
    kinds = [type(m) for m in msgs]
    assert kinds[:2] == [Accepted, Started] and kinds[-1] is Result
    assert set(kinds[2:-1]) <= {Progress}
    progress = {(m.stream, m.data) for m in msgs if isinstance(m, Progress)}
    assert progress == {("stdout", b"hello\n"), ("stderr", b"oops\n")}
    assert result.state is RunState.SUCCEEDED and result.exit_code == 0
    assert result.stdout.data == b"hello\n" and result.stderr.data == b"oops\n"
    assert result.progress_dropped == 0 and not result.truncated


@pytest.mark.slow
async def test_failed_exit_and_exec_with_env_stdin_cwd(hand):
    (hand.root / "sub").mkdir()
    rid = hand.rpc(
        "exec",
        {"argv": ["sh", "-c", "pwd; echo $FOO; cat; exit 4"], "env": {"FOO": "bar"}, "stdin": b"in", "cwd": "sub"},
    )
    result = await hand.wait(rid)
    assert result.state is RunState.FAILED and result.exit_code == 4 and result.reason == "exit status 4"
    assert result.stdout.data == f"{os.path.realpath(hand.root)}/sub\nbar\nin".encode()


@pytest.mark.slow
async def test_a_program_that_cannot_start_fails_cleanly(hand):
    rid = hand.rpc("exec", {"argv": ["/nonexistent/program-xyz"]})
    result = await hand.wait(rid)
    assert result.state is RunState.FAILED and "cannot start" in result.error
    assert [type(m) for m in hand.of(rid)] == [Accepted, Started, Result]


@pytest.mark.slow
async def test_duplicate_run_id_is_rejected_and_the_first_runs_once(hand):
    rid = hand.rpc("shell", {"command": "echo once"})
    hand.rpc("shell", {"command": "echo twice"}, run_id=rid)
    rejected = [m for m in hand.of(rid) if isinstance(m, Rejected)]
    assert len(rejected) == 1 and rejected[0].code is RejectCode.DUPLICATE_RUN
    result = await hand.wait(rid)
    assert result.stdout.data == b"once\n"
    hand.rpc("shell", {"command": "echo again"}, run_id=rid)  # after the result: still a duplicate
    assert [m.code for m in hand.of(rid) if isinstance(m, Rejected)] == [RejectCode.DUPLICATE_RUN] * 2
    assert hand.result(rid).stdout.data == b"once\n"


async def test_denied_tool_is_rejected_and_nothing_runs(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    h = Hand(root, Policy(deny=frozenset({"write_file"})))
    rid = h.rpc("write_file", {"path": "x.txt", "data": b"no"})
    assert [type(m) for m in h.of(rid)] == [Rejected]
    assert h.of(rid)[0].code is RejectCode.DENIED_BY_POLICY
    assert not (root / "x.txt").exists() and not h.tasks
    h2 = Hand(root, Policy(allow=frozenset({"read_file"})))
    rid = h2.rpc("shell", {"command": f"touch {root}/y"})
    assert h2.of(rid)[0].code is RejectCode.DENIED_BY_POLICY and not h2.tasks
    assert not (root / "y").exists()


async def test_unknown_tool_and_bad_arguments_are_rejected_before_accepted(hand):
    rid = hand.rpc("format_disk", {})
    assert hand.of(rid)[0].code is RejectCode.UNKNOWN_TOOL
    for args in (
        {"argv": []},
        {"argv": ["true"], "bogus": 1},
        {"argv": "true"},
        {"argv": ["true"], "env": {"A=B": "x"}},
    ):
        rid = hand.rpc("exec", args)
        [msg] = hand.of(rid)
        assert isinstance(msg, Rejected) and msg.code is RejectCode.INVALID_REQUEST, args
    rid = hand.rpc("read_file", {"path": "a", "limit": limits.READ_FILE_MAX + 1})
    assert hand.of(rid)[0].code is RejectCode.INVALID_REQUEST
    rid = hand.rpc("write_file", {"path": "a", "data": "secret-value", "mode": "truncate"})
    [msg] = hand.of(rid)
    assert msg.code is RejectCode.INVALID_REQUEST and "secret-value" not in msg.message
    assert not hand.tasks


async def test_path_escapes_are_rejected(hand, tmp_path):
    (tmp_path / "outside.txt").write_text("x")
    (hand.root / "out").symlink_to(tmp_path)
    cases = [
        ("read_file", {"path": "../outside.txt"}),
        ("read_file", {"path": str(tmp_path / "outside.txt")}),
        ("read_file", {"path": "out/outside.txt"}),
        ("write_file", {"path": "out/new.txt", "data": b"x"}),
        ("list_dir", {"path": "out"}),
        ("shell", {"command": "pwd", "cwd": "out"}),
    ]
    for tool, args in cases:
        rid = hand.rpc(tool, args)
        [msg] = hand.of(rid)
        assert isinstance(msg, Rejected) and msg.code is RejectCode.PATH_OUTSIDE_ROOT, (tool, args)
        assert str(hand.root) not in msg.message and str(tmp_path) not in msg.message
    assert not (tmp_path / "new.txt").exists() and not hand.tasks


@pytest.mark.slow
async def test_progress_past_the_caps_is_dropped_and_the_run_goes_on(hand):
    rid = hand.rpc("shell", {"command": "head -c 5000000 /dev/zero; echo tail-end"})
    result = await hand.wait(rid)
    progress = [m for m in hand.of(rid) if isinstance(m, Progress)]
    assert sum(len(m.data) for m in progress) <= limits.PROGRESS_BYTES_MAX
    assert 0 < len(progress) <= limits.PROGRESS_EVENTS_MAX
    assert all(len(m.data) <= limits.PROGRESS_CHUNK_MAX for m in progress)
    offsets = [m.offset for m in progress]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert result.progress_dropped > 0
    assert result.state is RunState.SUCCEEDED and result.exit_code == 0
    assert result.stdout.total == 5_000_009 and result.truncated
    assert result.stdout.data.endswith(b"tail-end\n")
    assert hand.sent.index(result) == len(hand.sent) - 1  # nothing after the result


@pytest.mark.slow
async def test_cancel_requested_then_cancelled_then_already_done(hand, tmp_path):
    pidfile = tmp_path / "child.pid"
    rid = hand.rpc("shell", {"command": f"sleep 100 & echo $! > {pidfile}; wait"})
    child = await until(lambda: read_pid(pidfile), what="the command to start")
    hand.table.on_cancel(Cancel(run_id=rid, reason=CancelReason.USER_REQUESTED))
    [answer] = [m for m in hand.of(rid) if isinstance(m, CancelResult)]
    assert answer.status is CancelStatus.CANCEL_REQUESTED
    result = await hand.wait(rid)
    assert result.state is RunState.CANCELLED and result.stage is KillStage.TERM
    assert result.reason == CancelReason.USER_REQUESTED.value
    assert not pid_alive(child)
    kinds = [type(m) for m in hand.of(rid)]
    assert kinds.index(CancelResult) < kinds.index(Result)
    hand.table.on_cancel(Cancel(run_id=rid, reason=CancelReason.USER_REQUESTED))
    assert hand.of(rid)[-1] == CancelResult(run_id=rid, status=CancelStatus.ALREADY_DONE)
    hand.table.on_cancel(Cancel(run_id="never-seen", reason=CancelReason.USER_REQUESTED))
    assert hand.sent[-1] == CancelResult(run_id="never-seen", status=CancelStatus.UNKNOWN_RUN)


async def test_a_cancel_right_behind_the_rpc_finds_the_run_and_nothing_starts(hand, tmp_path):
    marker = tmp_path / "ran"
    rid = hand.rpc("shell", {"command": f"touch {marker}"})
    hand.table.on_cancel(Cancel(run_id=rid, reason=CancelReason.CLIENT_DISCONNECTED))  # no await between
    result = await hand.wait(rid)
    assert result.state is RunState.CANCELLED
    assert [type(m) for m in hand.of(rid)] == [Accepted, CancelResult, Result]
    assert not marker.exists()


@pytest.mark.slow
async def test_deadline_on_the_hands_clock_kills_the_tree(hand, tmp_path):
    pidfile = tmp_path / "child.pid"
    rid = hand.rpc("shell", {"command": f"sleep 100 & echo $! > {pidfile}; wait"}, timeout_ms=300)
    result = await hand.wait(rid)
    assert result.state is RunState.TIMED_OUT and result.stage is KillStage.TERM
    assert result.reason == CancelReason.DEADLINE_EXCEEDED.value
    assert not pid_alive(read_pid(pidfile))


@pytest.mark.slow
async def test_sigterm_ignoring_tree_ends_at_the_kill_stage(hand, tmp_path):
    pidfile = tmp_path / "gc.pid"
    rid = hand.rpc("shell", {"command": f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 100' & wait"})
    grandchild = await until(lambda: read_pid(pidfile), what="the grandchild")
    hand.table.on_cancel(Cancel(run_id=rid, reason=CancelReason.USER_REQUESTED))
    result = await hand.wait(rid)
    assert result.state is RunState.CANCELLED and result.stage is KillStage.KILL
    assert not pid_alive(grandchild)


@pytest.mark.slow
async def test_on_cancel_signals_the_tree_before_it_returns(hand, tmp_path):
    # The command blocks SIGTERM, so the signal stays pending where /proc shows it: on_cancel has
    # sent it by the time it returns (no loop turn, frame or log line first), and the tree still
    # ends by SIGKILL after the grace.
    pidfile = tmp_path / "py.pid"
    code = (
        "import os,signal,time; signal.pthread_sigmask(signal.SIG_BLOCK,{signal.SIGTERM}); "
        f"open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(100)"
    )
    rid = hand.rpc("shell", {"command": f'exec {sys.executable} -c "{code}"'})
    pid = await until(lambda: read_pid(pidfile), what="the command to block SIGTERM")
    hand.table.on_cancel(Cancel(run_id=rid, reason=CancelReason.USER_REQUESTED))
    with open(f"/proc/{pid}/status") as f:
        pending = {k: int(v, 16) for k, v in (line.split(":", 1) for line in f) if k in ("ShdPnd", "SigPnd")}
    assert (pending["ShdPnd"] | pending["SigPnd"]) & (1 << (signal.SIGTERM - 1))
    result = await hand.wait(rid)
    assert result.state is RunState.CANCELLED and result.stage is KillStage.KILL
    assert not pid_alive(pid)


@pytest.mark.slow
async def test_cancel_all_for_a_lost_connection(hand, tmp_path):
    pids = [tmp_path / f"p{i}" for i in range(3)]
    rids = [hand.rpc("shell", {"command": f"sleep 100 & echo $! > {p}; wait"}) for p in pids]
    children = [await until(lambda p=p: read_pid(p), what="a command") for p in pids]
    hand.table.cancel_all(CancelReason.CONNECTION_LOST)
    assert await hand.table.wait_idle(5)
    for rid in rids:
        r = hand.result(rid)
        assert r.state is RunState.CANCELLED and r.reason == CancelReason.CONNECTION_LOST.value
    assert not any(pid_alive(c) for c in children)
    rid = hand.rpc("shell", {"command": "true"})  # a closing table takes nothing new
    assert hand.of(rid)[0].code is RejectCode.SHUTTING_DOWN


async def test_read_file(hand):
    (hand.root / "f.bin").write_bytes(b"0123456789")
    r = await hand.wait(hand.rpc("read_file", {"path": "f.bin"}))
    assert r.state is RunState.SUCCEEDED
    assert r.value == {"data": b"0123456789", "size": 10, "offset": 0, "eof": True}
    r = await hand.wait(hand.rpc("read_file", {"path": str(hand.root / "f.bin"), "offset": 3, "limit": 4}))
    assert r.value == {"data": b"3456", "size": 10, "offset": 3, "eof": False}
    r = await hand.wait(hand.rpc("read_file", {"path": "f.bin", "offset": 50}))
    assert r.value == {"data": b"", "size": 10, "offset": 50, "eof": True}


async def test_read_file_refuses_directories_special_files_and_missing_files(hand):
    (hand.root / "d").mkdir()
    os.mkfifo(hand.root / "fifo")
    for path, words in (("d", "directory"), ("fifo", "FIFO"), ("missing", "No such file")):
        r = await hand.wait(hand.rpc("read_file", {"path": path}))
        assert r.state is RunState.FAILED and words in r.error, r.error
        assert str(hand.root) not in r.error and repr(path) in r.error


async def test_write_file_modes(hand):
    target = hand.root / "out.txt"
    r = await hand.wait(hand.rpc("write_file", {"path": "out.txt", "data": "héllo"}))
    assert r.state is RunState.SUCCEEDED and r.value == {"bytes_written": 6}
    assert target.read_text() == "héllo"
    os.chmod(target, 0o640)
    r = await hand.wait(hand.rpc("write_file", {"path": "out.txt", "data": b"new"}))
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in hand.root.iterdir()] == ["out.txt"]  # no temp file left behind
    await hand.wait(hand.rpc("write_file", {"path": "out.txt", "data": b"+more", "mode": "append"}))
    assert target.read_bytes() == b"new+more"
    r = await hand.wait(hand.rpc("write_file", {"path": "out.txt", "data": b"x", "mode": "create"}))
    assert r.state is RunState.FAILED and "already exists" in r.error
    r = await hand.wait(hand.rpc("write_file", {"path": "a/b/c.txt", "data": b"x"}))
    assert r.state is RunState.FAILED and "make_dirs" in r.error
    r = await hand.wait(
        hand.rpc("write_file", {"path": "a/b/c.txt", "data": b"deep", "make_dirs": True, "mode": "create"})
    )
    assert r.state is RunState.SUCCEEDED and (hand.root / "a/b/c.txt").read_bytes() == b"deep"
    r = await hand.wait(hand.rpc("write_file", {"path": "a", "data": b"x"}))
    assert r.state is RunState.FAILED and "directory" in r.error


async def test_list_dir(hand):
    (hand.root / "b.txt").write_bytes(b"12345")
    (hand.root / "a-dir").mkdir()
    (hand.root / "c-link").symlink_to("b.txt")
    os.mkfifo(hand.root / "d-fifo")
    r = await hand.wait(hand.rpc("list_dir", {}))
    assert r.state is RunState.SUCCEEDED and r.value["truncated"] is False
    entries = r.value["entries"]
    assert [(e["name"], e["type"]) for e in entries] == [
        ("a-dir", "dir"),
        ("b.txt", "file"),
        ("c-link", "symlink"),
        ("d-fifo", "fifo"),  # one vocabulary with list_tree (issue 21, item 5)
    ]
    assert entries[1]["size"] == 5
    r = await hand.wait(hand.rpc("list_dir", {"path": "b.txt"}))
    assert r.state is RunState.FAILED and "not a directory" in r.error


async def test_list_dir_is_capped(hand, monkeypatch):
    monkeypatch.setattr(limits, "LIST_DIR_MAX_ENTRIES", 3)
    for name in "edcba":
        (hand.root / name).touch()
    r = await hand.wait(hand.rpc("list_dir", {"path": "."}))
    assert [e["name"] for e in r.value["entries"]] == ["a", "b", "c"] and r.value["truncated"] is True


async def test_an_exception_in_one_run_fails_that_run_only(hand, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError(f"exploded near {hand.root}/x and /etc/passwd")

    monkeypatch.setattr(hand_tools, "list_dir", boom)
    r = await hand.wait(hand.rpc("list_dir", {}))
    assert r.state is RunState.FAILED and "exploded" in r.error
    assert str(hand.root) not in r.error and "/etc/passwd" not in r.error
    monkeypatch.undo()
    r = await hand.wait(hand.rpc("list_dir", {}))
    assert r.state is RunState.SUCCEEDED


@pytest.mark.slow
async def test_logs_carry_an_args_digest_never_the_args(hand):
    args = {"command": "echo top-secret-token"}
    with structlog.testing.capture_logs() as logs:
        rid = hand.rpc("shell", args)
        await hand.wait(rid)
    assert "top-secret-token" not in repr(logs)
    accepted = [e for e in logs if e["event"] == "run_accepted"]
    terminal = [e for e in logs if e["event"] == "run_terminal"]
    assert accepted and terminal
    assert accepted[0]["args_digest"] == terminal[0]["args_digest"] == args_digest("shell", args)
    assert terminal[0]["state"] == "succeeded" and terminal[0]["exit_code"] == 0
