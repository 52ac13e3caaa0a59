"""Recordings for real (issue 38, DESIGN §19): a real Mind records what it relays between a real
Hand and real clients, and reads it back through the client library and the `mind` CLI.

Runs with `--record all` come back byte-exact (stdout, stderr and stdin, each its own digest); a
terminal session typed on a real pty is played back by `mind play`; who may read is held to its
rules (and a refusal says nothing of whether the recording exists); a row altered in the database,
a block removed and a block forged without the key are named by `verify`; the per-run bound marks
its gap and the run goes on; a full disk under the recordings (a real tmpfs) marks gaps and shows in
`mind status`, or with `--record-strict` ends the run; a Mind killed -9 mid-session and started
again goes on in the same recording."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mind.core.recording import events_of
from mind.errors import ClientError
from mind.store.recordings import BLOCK_COLS, stored_of
from mind.testing.cluster import BIN, Cluster, running, wait_until
from protocol.codes import ErrorCode
from protocol.messages import RecordingBlock
from protocol.states import RunState

pytestmark = pytest.mark.slow  # real Minds, Hands and CLIs

MIB = 1 << 20


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("rec"), mind_args=("--record", "all", "--record-max-bytes", "64M")) as cl:
        yield cl


def stored(b: RecordingBlock, run_id: str):
    from mind.core.recording import Stored

    return Stored(run_id, b.seq, b.t, b.data, b.compressed, b.head, b.mac, 0)


async def read_all(mc, run_id: str, until_end: bool = True, timeout: float = 20.0) -> tuple[dict, list]:
    """The whole recording of `run_id` as the Mind serves it, once it holds the run's end (the
    recorder flushes every half second: a read before the first flush finds nothing yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info, blocks = await _pages(mc, run_id)
        except ClientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        events = list(events_of(blocks))
        if not until_end or any(e[1] == "m" and e[2] == "end" for e in events):
            return info, events
        if time.monotonic() > deadline:
            raise AssertionError(f"the recording of {run_id} has no end after {timeout} s: {info}")
        await asyncio.sleep(0.2)


async def _pages(mc, run_id: str) -> tuple[dict, list]:
    blocks, after = [], -1
    while True:
        page = await mc.get_recording(run_id, after)
        blocks += [stored(b, run_id) for b in page.blocks]
        if page.blocks:
            after = page.blocks[-1].seq
        if not page.more:
            return page.info.model_dump(), blocks


async def admin(cl: Cluster):
    """The admin client (`admin.cred` in the Mind's home): the CLI's own credential."""
    from mind.client.aio import MindClient
    from mind.client.credentials import load_credential

    return await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred"))


async def newest(mc, tool: str, timeout: float = 10.0):
    """The newest recording of a `tool` run (or of a `kind`: `terminal`), once flushed."""
    deadline = time.monotonic() + timeout
    while True:
        items = [x for x in (await mc.list_recordings(limit=50)).items if tool in (x.tool, x.kind)]
        if items:
            return items[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no recording of a {tool} run after {timeout} s")
        await asyncio.sleep(0.2)


def stream(events: list, name: str) -> bytes:
    if name == "stdin":
        return b"".join(e[2] for e in events if e[1] == "i")
    return b"".join(e[3] for e in events if e[1] == "o" and e[2] == name)


async def test_a_recorded_run_comes_back_byte_exact_stream_by_stream(c: Cluster):
    out, err, inp = os.urandom(3 * MIB + 17), os.urandom(100_000), os.urandom(2 * MIB + 5)
    (c.hands["box"].root / "out.bin").write_bytes(out)
    (c.hands["box"].root / "err.bin").write_bytes(err)
    async with await c.client("alice") as mc:
        h = await mc.start(
            "box", "shell", {"command": "cat out.bin; cat err.bin >&2; sha256sum > /dev/null; exit 3"}, stdin=inp
        )
        end = await h.wait()
        assert end.state is RunState.FAILED and end.exit_code == 3
        info, events = await read_all(mc, h.run_id)
    assert hashlib.sha256(stream(events, "stdout")).digest() == hashlib.sha256(out).digest()
    assert stream(events, "stderr") == err
    assert stream(events, "stdin") == inp
    assert info["client"] == "alice" and info["hand"] == "box" and info["kind"] == "streams"
    assert info["state"] == "failed" and info["exit_code"] == 3 and info["bytes"] == len(out) + len(err) + len(inp)
    start = next(e[3] for e in events if e[1] == "m" and e[2] == "start")
    assert start["command"]["command"].startswith("cat out.bin") and start["client"] == "alice"
    times = [e[0] for e in events]
    assert times == sorted(times)  # one clock, in order
    async with await c.client("alice") as mc:
        check = (await mc.verify_recordings(h.run_id)).items[0]
    assert check.ok and check.complete and check.problem == ""


async def test_copies_are_recorded_by_name_size_and_digest_never_their_bytes(c: Cluster, tmp_path: Path):
    data = os.urandom(MIB + 3)
    src = tmp_path / "up.bin"
    src.write_bytes(data)
    r = c.cli("cp", str(src), "box:copied.bin")
    assert r.returncode == 0, r.stderr
    async with await admin(c) as mc:
        put = await newest(mc, "put_file")
        info, events = await read_all(mc, put.run_id)
    assert info["kind"] == "copy" and info["bytes"] == 0
    assert not [e for e in events if e[1] in ("o", "i")]
    start = next(e[3] for e in events if e[1] == "m" and e[2] == "start")
    end = next(e[3] for e in events if e[1] == "m" and e[2] == "end")
    assert start["command"].get("size") == len(data) or end["relayed"].get("stdin") == len(data)
    assert data[:64] not in json.dumps(events, default=repr).encode()


async def test_who_may_read_and_a_refusal_that_leaks_nothing(c: Cluster):
    async with await c.client("owner") as mc:
        end = await mc.exec("box", "exec", {"argv": ["echo", "secret-output"]})
        run_id = end.run_id
        info, _ = await read_all(mc, run_id)  # its owner reads it
    async with await c.client("stranger") as mc:
        for asked in (run_id, "r0000000000000000"):  # another's, and one that does not exist
            with pytest.raises(ClientError) as ei:
                await mc.get_recording(asked)
            assert ei.value.code == ErrorCode.DENIED_BY_SCOPE.value
            assert f"no recording of run {asked} that you may read" in str(ei.value)
        assert run_id not in [x.run_id for x in (await mc.list_recordings()).items]
        with pytest.raises(ClientError):
            await mc.verify_recordings(run_id)
    async with await c.client("auditor", "--recordings", "--hands", "box") as mc:
        _, events = await read_all(mc, run_id)
        assert stream(events, "stdout") == b"secret-output\n"
    async with await c.client("elsewhere", "--recordings", "--hands", "other-*") as mc:
        with pytest.raises(ClientError):
            await mc.get_recording(run_id)
    audit = [json.loads(line) for line in (c.home / "audit.jsonl").read_text().splitlines()]
    reads = [a for a in audit if a.get("event") == "recording_read" and a.get("run_id") == run_id]
    assert {(a["client"], a["allowed"]) for a in reads} >= {("owner", True), ("stranger", False), ("auditor", True)}


async def test_verify_names_what_a_database_writer_changed(c: Cluster):
    async with await admin(c) as mc:
        h = await mc.start("box", "shell", {"command": "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.6; done"})
        assert (await h.wait()).state is RunState.SUCCEEDED
        _, events = await read_all(mc, h.run_id)
        assert stream(events, "stdout") == b"".join(b"line %d\n" % i for i in range(1, 7))
    run_id = h.run_id
    db = sqlite3.connect(c.home / "recordings.db", timeout=10)
    rows = db.execute(f"SELECT {BLOCK_COLS} FROM recording_blocks WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
    assert len(rows) >= 4, len(rows)  # a block per flush: the run took ~3.6 s

    async def check():
        async with await admin(c) as mc:
            return (await mc.verify_recordings(run_id)).items[0]

    first = await check()
    assert first.ok and first.complete

    # 1. a byte of block 2's output changed (its stored bytes are raw: small, incompressible-probe text)
    b2 = stored_of(rows[2])
    altered = b2.data.replace(b"line", b"LINE") if not b2.compressed else b2.data[:-1] + bytes([b2.data[-1] ^ 1])
    db.execute("UPDATE recording_blocks SET data = ? WHERE run_id = ? AND seq = 2", (altered, run_id))
    db.commit()
    x = await check()
    assert not x.ok and x.at == 2 and "block 2" in x.problem
    played = await asyncio.to_thread(c.cli, "play", "--stream", "stdout", run_id)
    whole = b"".join(b"line %d\n" % i for i in range(1, 7))
    assert played.returncode == 1 and whole.startswith(played.stdout) and len(played.stdout) < len(whole)
    assert b"block 2" in played.stderr and b"shown up to there" in played.stderr, played.stderr
    db.execute("UPDATE recording_blocks SET data = ? WHERE run_id = ? AND seq = 2", (b2.data, run_id))
    db.commit()
    assert (await check()).ok

    # 2. block 1 removed
    db.execute("DELETE FROM recording_blocks WHERE run_id = ? AND seq = 1", (run_id,))
    db.commit()
    x = await check()
    assert not x.ok and x.at == 1 and "removed" in x.problem
    db.execute(f"INSERT INTO recording_blocks ({BLOCK_COLS}) VALUES (?,?,?,?,?,?,?,?)", rows[1])
    db.commit()
    assert (await check()).ok

    # 3. the listing's exit code changed
    db.execute("UPDATE recordings SET exit_code = 1 WHERE run_id = ?", (run_id,))
    db.commit()
    x = await check()
    assert not x.ok and "exit_code" in x.problem
    db.execute("UPDATE recordings SET exit_code = 0 WHERE run_id = ?", (run_id,))
    db.commit()

    # 4. the whole recording rewritten with a good chain by someone without the key
    from mind.core.recording import Block, store_block

    prev = bytes(32)
    forged = []
    for r in rows:
        s = stored_of(r)
        evs = list(events_of([s]))
        for e in evs:
            if e[1] == "o":
                e[3] = e[3].replace(b"line", b"fake")
        f = store_block(Block(run_id, s.seq, s.t, evs, 0), prev, os.urandom(32))
        prev = f.head
        forged.append(f)
    db.executemany(
        "UPDATE recording_blocks SET data = ?, compressed = ?, head = ?, mac = ? WHERE run_id = ? AND seq = ?",
        [(f.data, int(f.compressed), f.head, f.mac, run_id, f.seq) for f in forged],
    )
    db.commit()
    x = await check()
    assert not x.ok and x.at == 0 and "signature" in x.problem
    db.close()


async def test_past_its_bound_a_recording_marks_its_gap_and_the_run_goes_on(tmp_path: Path):
    with running(tmp_path, mind_args=("--record", "all", "--record-max-bytes", "100K")) as cl:
        data = os.urandom(MIB)
        (cl.hands["box"].root / "big.bin").write_bytes(data)
        r = cl.cli("exec", "box", "--", "cat", "big.bin")
        assert r.returncode == 0 and r.stdout == data  # the client got every byte
        async with await admin(cl) as mc:
            rec = await newest(mc, "exec")
            _, events = await read_all(mc, rec.run_id)
    kept = stream(events, "stdout")
    assert kept == data[: len(kept)] and len(kept) <= 100 * 1024
    gaps = [e for e in events if e[1] == "g"]
    assert sum(g[3] for g in gaps) == len(data) - len(kept) and {g[4] for g in gaps} == {"max_bytes"}


def _tmpfs(path: Path, size: str) -> None:
    for d in (path, path.parent / "c", path.parent / "s"):
        d.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)


@pytest.mark.alone  # mounts a tmpfs and fills it; beside other tests its status did not come in 30 s
async def test_a_full_disk_under_the_recordings_marks_gaps_and_says_so_and_runs_go_on(tmp_path: Path, as_root):
    where = tmp_path / "recs"
    _tmpfs(where, "1m")
    try:
        with running(tmp_path / "c", mind_args=("--record", "all", "--record-dir", str(where))) as cl:
            data = os.urandom(6 * MIB)
            (cl.hands["box"].root / "big.bin").write_bytes(data)
            r = cl.cli("exec", "box", "--", "cat", "big.bin")
            assert r.returncode == 0 and r.stdout == data  # every byte reached the client

            def failing() -> str | None:
                text = cl.cli("status").stdout.decode()
                return text if "FAILING" in text else None

            status = wait_until(failing, 30, "status FAILING")
            assert "No space left" in status or "full" in status, status
            failed = [e for e in cl.mind.events() if e.get("event") == "recording_store_failed"]
            assert len(failed) == 1 and failed[0]["error"], failed  # said once, with the store's words
        with running(
            tmp_path / "s", mind_args=("--record", "all", "--record-dir", str(where), "--record-strict")
        ) as cl:
            (cl.hands["box"].root / "big.bin").write_bytes(data)
            r = cl.cli("exec", "box", "--", "sh", "-c", "cat big.bin; sleep 30")
            assert r.returncode == 130, (r.returncode, r.stderr[-300:])
            async with await admin(cl) as mc:
                last = (await mc.list_runs(limit=1))[0]
            assert last.state is RunState.CANCELLED, last
            assert last.end is not None and "recording_failed" in last.end.reason, last.end
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(where)], check=False)


async def test_a_session_goes_on_in_the_same_recording_after_the_mind_is_killed(tmp_path: Path):
    cl = Cluster(tmp_path)
    cl.resume_window = 30
    try:
        cl.start_mind("--record", "all")
        cl.start_hand("box")
        cl.wait_connected("box")
        p = cl.cli_popen("exec", "box", "--", "sh", "-c", "for i in $(seq 1 16); do echo tick $i; sleep 0.25; done")
        wait_until(lambda: (c2 := cl.cli("runs", "--json")).returncode == 0 and b"running" in c2.stdout, 10, "running")
        await asyncio.sleep(1.0)
        cl.mind.kill9()
        await asyncio.sleep(0.5)
        cl.start_mind("--record", "all", port=cl.port)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-500:]
        assert out == b"".join(b"tick %d\n" % i for i in range(1, 17))
        async with await admin(cl) as mc:
            rec = await newest(mc, "exec")
            _, events = await read_all(mc, rec.run_id)
            check = (await mc.verify_recordings(rec.run_id)).items[0]
        names = [e[2] for e in events if e[1] == "m"]
        assert names[0] == "start" and "resumed" in names and names[-1] == "end", names
        kept = stream(events, "stdout")
        # what the killed node had not flushed (at most its last half second) is missing; the rest is there
        assert kept.endswith(b"tick 16\n") and kept.startswith(b"tick 1\n"), kept
        assert check.ok and check.complete, check
    finally:
        cl.stop_all()


# --- the CLI: `mind play`, `mind recordings export` and `verify` ---------------------------------


def test_play_prints_a_plain_runs_stream_byte_exact(c: Cluster):
    data = os.urandom(2 * MIB + 1)
    (c.hands["box"].root / "play.bin").write_bytes(data)
    r = c.cli("exec", "box", "--", "sh", "-c", "cat play.bin; echo done >&2")
    assert r.returncode == 0 and r.stdout == data
    run_id = asyncio.run(_newest_ended(c, "exec"))
    out = c.cli("play", "--stream", "stdout", run_id)
    assert out.returncode == 0, out.stderr
    assert hashlib.sha256(out.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
    err = c.cli("play", "--stream", "stderr", run_id)
    assert err.returncode == 0 and err.stdout == b"done\n"
    listed = c.cli("recordings", "--json")
    assert listed.returncode == 0
    rows = json.loads(listed.stdout)
    mine = [x for x in rows if x["run_id"] == run_id]
    assert mine and mine[0]["state"] == "succeeded" and mine[0]["hand"] == "box"
    ok = c.cli("recordings", "verify", run_id)
    assert ok.returncode == 0 and b"ok" in ok.stdout


def test_a_recording_asked_for_that_does_not_exist_is_refused_with_one_line(c: Cluster):
    r = c.cli("play", "r0123456789abcdef")
    assert r.returncode == 1 and r.stdout == b""
    assert b"no recording of run r0123456789abcdef" in r.stderr and r.stderr.count(b"\n") == 1


async def _newest_ended(cl: Cluster, tool: str) -> str:
    """The newest run (of `tool`) the Mind admitted, once its recording holds its end (the Mind's
    run list knows a run at once; its recording is flushed within half a second)."""
    async with await admin(cl) as mc:
        run = next(r for r in await mc.list_runs(limit=20) if r.tool == tool)
        await read_all(mc, run.run_id)
        return run.run_id


@pytest.mark.alone  # the replay's pauses are timed against the wall clock
def test_a_terminal_session_typed_on_a_pty_plays_back_as_it_was_seen(c: Cluster):
    """`mind shell` on a real pty, typed at, resized, paused; then `mind play` gives back what the
    terminal showed (the session's output as relayed), with its pause, and the asciicast export
    holds the sizes and the keystroke-free output."""
    from support.term import Term

    t = Term({**c.env, "TERM": "xterm-256color"}, [str(BIN / "mind"), "shell", "box"], rows=30, cols=100)
    try:
        t.type(b"stty size; echo one-$((20+22))\r")
        t.expect(b"one-42", 20)
        t.set_size(40, 120)
        time.sleep(1.2)  # a pause the playback keeps
        t.type(b"stty size; echo two-$((40+2))\r")
        t.expect(b"two-42", 20)
        t.type(b"exit\r")
        assert t.wait(30) == 0
        seen = t.out
    finally:
        t.close()
    assert b"30 100" in seen and b"40 120" in seen
    run_id = asyncio.run(_newest_ended(c, "exec"))

    async def recorded() -> list:
        async with await admin(c) as mc:
            return (await read_all(mc, run_id))[1]

    events = asyncio.run(recorded())
    shown = stream(events, "pty")
    assert b"one-42" in shown and b"two-42" in shown and shown in seen  # as relayed, every byte the CLI wrote
    assert [e[2:] for e in events if e[1] == "r"] == [[100, 30], [120, 40]]
    assert stream(events, "stdin").endswith(b"exit\r")  # `--record all` keeps keystrokes too

    t0 = time.monotonic()
    fast = c.cli("play", "--speed", "4", run_id)
    took_fast = time.monotonic() - t0
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout == shown
    t0 = time.monotonic()
    real = c.cli("play", run_id)
    took_real = time.monotonic() - t0
    assert real.returncode == 0 and real.stdout == shown
    assert took_real >= 1.0 > took_fast - 0.6, (took_real, took_fast)  # the pause kept, and shortened by 4

    cast = c.cli("recordings", "export", run_id, "--format", "asciicast")
    assert cast.returncode == 0, cast.stderr
    lines = [json.loads(x) for x in cast.stdout.decode().splitlines()]
    header, body = lines[0], lines[1:]
    assert header["version"] == 2 and (header["width"], header["height"]) == (100, 30)
    assert ["r", "120x40"] in [x[1:] for x in body]
    text = "".join(x[2] for x in body if x[1] == "o")
    assert text == shown.decode("utf-8", errors="replace")
    times = [x[0] for x in body]
    assert times == sorted(times) and max(b - a for a, b in zip(times, times[1:], strict=False)) >= 1.0


def test_the_default_records_terminals_only_and_never_their_keystrokes(tmp_path: Path):
    from support.term import Term

    with running(tmp_path) as cl:  # `mind serve` as shipped: --record pty
        r = cl.cli("exec", "box", "--", "echo", "plain")
        assert r.returncode == 0
        t = Term({**cl.env, "TERM": "xterm"}, [str(BIN / "mind"), "exec", "-t", "box", "--", "sh"], rows=24, cols=80)
        try:
            t.type(b"stty -echo; read secret; stty echo; echo got-${#secret}\r")
            time.sleep(0.5)
            t.type(b"hunter2\r")
            t.expect(b"got-7", 20)
            t.type(b"exit\r")
            assert t.wait(30) == 0
        finally:
            t.close()

        async def listed() -> tuple[list, list]:
            async with await admin(cl) as mc:
                rec = await newest(mc, "terminal")
                _, events = await read_all(mc, rec.run_id)
                return (await mc.list_recordings()).items, events

        items, events = asyncio.run(listed())
    assert [x.kind for x in items] == ["terminal"]  # the plain run was not recorded
    assert b"got-7" in stream(events, "pty")
    assert not [e for e in events if e[1] == "i"]
    assert b"hunter2" not in json.dumps(events, default=repr).encode()


def test_play_follow_watches_a_run_in_progress_to_its_end(c: Cluster):
    p = c.cli_popen("exec", "box", "--", "sh", "-c", "for i in 1 2 3 4 5; do echo live $i; sleep 0.5; done")
    try:
        run_id = wait_until(lambda: next((r["run_id"] for r in _runs(c) if r["state"] == "running"), None), 10, "run")
        follow = c.cli_popen("play", "--follow", run_id)
        out, err = follow.communicate(timeout=30)
        assert follow.returncode == 0, err
        assert out == b"".join(b"live %d\n" % i for i in range(1, 6))
    finally:
        p.communicate(timeout=30)


def _runs(c: Cluster) -> list[dict]:
    r = c.cli("runs", "--json")
    return json.loads(r.stdout) if r.returncode == 0 else []


async def test_an_agents_tool_calls_through_mind_mcp_are_recorded(c: Cluster):
    """`--record all` records the runs `mind mcp` makes for an agent (the official MCP SDK's client
    as the agent): its exec's streams byte-exact, its file calls by their arguments."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from mind.testing.cluster import program

    argv = [*program("mind"), "mcp"]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(c.env))
    async with Client(params, read_timeout_seconds=30.0) as agent:
        res = await agent.call_tool("exec", {"hand": "box", "command": "echo from the agent; echo oops >&2"})
        assert not res.is_error, res.content
        res = await agent.call_tool("write_file", {"hand": "box", "path": "agent.txt", "content": "by an agent\n"})
        assert not res.is_error
    async with await admin(c) as mc:
        runs = await mc.list_runs(limit=10)
        ex = next(r for r in runs if r.tool in ("exec", "shell"))
        wf = next(r for r in runs if r.tool == "write_file")
        _, events = await read_all(mc, ex.run_id)
        assert stream(events, "stdout") == b"from the agent\n" and stream(events, "stderr") == b"oops\n"
        _, wevents = await read_all(mc, wf.run_id)
    start = next(e[3] for e in wevents if e[1] == "m" and e[2] == "start")
    assert start["tool"] == "write_file" and start["command"].get("path") == "agent.txt"
    assert next(e[3] for e in wevents if e[1] == "m" and e[2] == "end")["state"] == "succeeded"
