"""Issue 26: `mind mcp`, driven by the official MCP SDK's own client (a real peer, not ours) over stdio
and streamable HTTP, against a real Mind (with a resume window) and real Hands.

What an agent relies on: the tools are listed; `exec` answers the exit code and stdout and stderr
apart; a run longer than `wait_s` comes back still running with its id (not an error, not killed)
and `run_get` / `read_output` then get its real end; `cancel` kills the tree; a cancel from the
client is a mindhand cancel; a closed HTTP response stream leaves the run going; a scoped credential
sees only its Hands; a bearer missing or wrong is 401; bad input is a tool error naming the code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import select
import signal
import socket
import ssl
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from mind.testing.cluster import Cluster, pid_alive, program, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind, Hands, and `mind mcp` as a subprocess

WINDOW = ("--resume-window", "30")
CALL_TIMEOUT_S = 30.0


@pytest.fixture
def cl(tmp_path: Path) -> Iterator[Cluster]:
    with running(tmp_path, "box", mind_args=WINDOW) as c:
        yield c


def stdio_params(cl: Cluster, credential: Path | None = None) -> StdioServerParameters:
    argv = [*program("mind"), "mcp"]
    if credential is not None:
        argv += ["--credential", str(credential)]
    return StdioServerParameters(command=argv[0], args=argv[1:], env=dict(cl.env))


def stdio(cl: Cluster, credential: Path | None = None) -> Client:
    return Client(stdio_params(cl, credential), read_timeout_seconds=CALL_TIMEOUT_S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def listening(cl: Cluster, *extra: str, scheme: str = "http") -> Iterator[str]:
    """`mind mcp --listen` as a subprocess (stopped by PID); yields its URL."""
    port = free_port()
    p = subprocess.Popen(
        [*program("mind"), "mcp", "--listen", f"127.0.0.1:{port}", *extra],
        env=cl.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(up, timeout=20, what="mind mcp --listen to listen")
        yield f"{scheme}://127.0.0.1:{port}/mcp"
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def http(cl: Cluster) -> Iterator[str]:
    with listening(cl) as url:
        yield url


@asynccontextmanager
async def http_client(url: str, token: str, verify: Any = True) -> AsyncIterator[Client]:
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=auth, timeout=60, verify=verify) as hc:
        async with Client(streamable_http_client(url, http_client=hc), read_timeout_seconds=CALL_TIMEOUT_S) as c:
            yield c


def token(path: Path) -> str:
    return next(ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


def body(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(res.content[0].text)
    return out


async def until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """`wait_until` without blocking the loop: the SDK's client writes to `mind mcp` from a task of it
    (a blocked loop would hold back the very notification the test waits on the effect of)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(0.05)


async def wait_gone(pid_file: Path, timeout: float = 15.0) -> None:
    pid = int(pid_file.read_text().strip())
    await until(lambda: not pid_alive(pid), timeout, f"process {pid} to be gone")


async def test_stdio_tools_exec_and_bad_input(cl: Cluster) -> None:
    assert cl.cli("exec", "box", "--", "echo", "from the cli").returncode == 0  # a run this server never followed
    async with stdio(cl) as c:
        (other,) = body(await c.call_tool("runs", {"hand": "box"}))["runs"]
        page = body(await c.call_tool("read_output", {"run": other["run"]}))  # from the Mind's record of its end
        assert (page["data"], page["offset"], page["eof"]) == ("from the cli\n", 0, True)
        out = body(await c.call_tool("run_get", {"run": other["run"]}))
        assert (out["state"], out["stdout"]) == ("succeeded", "from the cli\n")

        names = {t.name for t in (await c.list_tools()).tools}
        assert {"hands", "exec", "read_file", "write_file", "list_dir", "task_start", "task_get"} <= names
        assert {"task_logs", "task_cancel", "runs", "run_get", "read_output", "cancel", "write_stdin"} <= names

        hands = body(await c.call_tool("hands", {}))["hands"]
        assert [(h["name"], h["online"]) for h in hands] == [("box", True)]

        res = await c.call_tool("exec", {"hand": "box", "command": "echo out; echo err >&2; exit 3"})
        out = body(res)
        assert res.is_error and out["state"] == "failed" and out["exit_code"] == 3
        assert (out["stdout"], out["stderr"]) == ("out\n", "err\n")

        res = await c.call_tool("exec", {"hand": "box", "argv": ["printf", "%s", "hi"]})
        assert not res.is_error and body(res)["stdout"] == "hi" and body(res)["exit_code"] == 0
        assert res.structured_content is not None and res.structured_content["state"] == "succeeded"

        res = await c.call_tool("exec", {"hand": "nope", "argv": ["true"]})
        assert res.is_error and body(res)["code"] == "unknown_hand"
        res = await c.call_tool("exec", {"hand": "box", "argv": ["true"], "wait_s": 3600})  # malformed: a tool error
        assert res.is_error and "wait_s" in res.content[0].text

        res = await c.call_tool("write_file", {"hand": "box", "path": "notes.txt", "content": "remember\n"})
        assert not res.is_error and body(res)["bytes_written"] == 9
        assert (cl.hands["box"].root / "notes.txt").read_bytes() == b"remember\n"
        res = await c.call_tool("read_file", {"hand": "box", "path": "notes.txt"})
        assert body(res)["content"] == "remember\n" and body(res)["eof"] is True
        res = await c.call_tool("list_dir", {"hand": "box"})
        assert "notes.txt" in [e["name"] for e in body(res)["entries"]]

        res = await c.call_tool("read_file", {"hand": "box", "path": "../../etc/passwd"})
        assert res.is_error and body(res)["state"] == "rejected" and body(res)["code"]
        res = await c.call_tool("exec", {"hand": "box", "argv": ["true"], "command": "true"})
        assert res.is_error and body(res)["code"] == "invalid_request"


async def test_stdio_read_file_says_its_encoding_and_refuses_unknown_arguments(cl: Cluster) -> None:
    """`read_file` answers a binary file as base64 byte for byte (by default: `auto`, as `download`)
    and says so; a text file paged by bytes never has a character cut. An argument the tool does
    not take (`limit`, the Hand tool's name for `max_bytes`) is refused naming the valid ones, not
    dropped with the call run without it; every tool's schema says so (`additionalProperties`)."""
    root = cl.hands["box"].root
    blob = bytes(range(256)) * 4 + b"\xff\xfe"
    (root / "blob.bin").write_bytes(blob)
    text = "naïve café, 10 €\n"
    (root / "utf8.txt").write_text(text)
    async with stdio(cl) as c:
        res = await c.call_tool("read_file", {"hand": "box", "path": "blob.bin"})
        out = body(res)
        assert not res.is_error and (out["encoding"], out["size"], out["eof"]) == ("base64", len(blob), True)
        assert base64.b64decode(out["content"]) == blob and out["next_offset"] == len(blob)

        got, offset, pages = b"", 0, 0
        while True:  # 3 bytes at a time: pages end before a character they would cut
            args = {"hand": "box", "path": "utf8.txt", "offset": offset, "max_bytes": 3}
            page = body(await c.call_tool("read_file", args))
            pages += 1
            assert page["encoding"] == "utf-8" and page["next_offset"] > offset, page
            got += page["content"].encode()
            offset = page["next_offset"]
            if page["eof"]:
                break
        assert got.decode() == text

        res = await c.call_tool("read_file", {"hand": "box", "path": "utf8.txt", "limit": 4})
        assert res.is_error and body(res)["code"] == "invalid_request" and "content" not in body(res)
        assert body(res)["error"] == (
            "read_file takes no argument 'limit' (did you mean max_bytes?); its arguments: hand, path, offset, "
            "max_bytes, encoding"
        )
        schemas = {t.name: t.input_schema for t in (await c.list_tools()).tools}
        assert all(schema.get("additionalProperties") is False for schema in schemas.values()), schemas
        res = await c.call_tool("exec", {"hand": "box", "cmd": "true"})  # nothing runs
        assert res.is_error and "did you mean command?" in body(res)["error"]
        runs = body(await c.call_tool("runs", {"hand": "box", "limit": 200}))["runs"]
        assert [r["tool"] for r in runs] == ["read_file"] * (1 + pages)  # the refused calls ran nothing


async def test_stdio_long_output_is_bounded_with_a_paging_marker(cl: Cluster) -> None:
    async with stdio(cl) as c:
        res = await c.call_tool("exec", {"hand": "box", "command": "seq 1 20000"})
        out = body(res)
        expected = "".join(f"{i}\n" for i in range(1, 20001)).encode()
        assert out["state"] == "succeeded" and out["stdout_bytes"] == len(expected)
        assert "read_output(" in out["stdout"] and len(out["stdout"]) < 10_000
        assert out["stdout"].startswith("1\n2\n") and out["stdout"].endswith("19999\n20000\n")
        marker = out["stdout"][out["stdout"].index("offset=") + 7 :]
        offset = int(marker[: marker.index(")")])
        got = expected[:offset]
        while True:
            page = body(await c.call_tool("read_output", {"run": out["run"], "offset": len(got), "max_bytes": 50_000}))
            got += page["data"].encode()
            if page["eof"]:
                break
        assert got == expected


async def test_stdio_run_longer_than_wait_is_still_running_then_its_end(cl: Cluster) -> None:
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    # A client that times a call out at 2.5 s (as most do at 60 s) and a run of 3 s: every call
    # answers within its timeout, and the run's real end still comes.
    async with Client(stdio_params(cl), read_timeout_seconds=2.5) as c:
        args = {"hand": "box", "command": "echo started; sleep 3; echo done; exit 4", "wait_s": 1}
        res = await c.call_tool("exec", args, progress_callback=on_progress)
        out = body(res)
        assert not res.is_error and out["still_running"] is True and out["state"] == "running"
        run = out["run"]
        assert any(run in m for m in progress), progress
        for _ in range(20):
            res = await c.call_tool("run_get", {"run": run, "wait_s": 1})
            out = body(res)
            if not out.get("still_running"):
                break
        assert (out["state"], out["exit_code"], out["stdout"]) == ("failed", 4, "started\ndone\n")
        page = body(await c.call_tool("read_output", {"run": run, "offset": 8}))
        assert page["data"] == "done\n" and page["eof"] is True


async def test_stdio_cancel_tool_kills_the_tree(cl: Cluster) -> None:
    pid_file = cl.hands["box"].root / "c.pid"
    async with stdio(cl) as c:
        res = await c.call_tool("exec", {"hand": "box", "command": "echo $$ > c.pid; sleep 60", "wait_s": 1})
        run = body(res)["run"]
        await until(pid_file.exists, 10, "the command to start")
        res = await c.call_tool("cancel", {"run": run})
        assert body(res)["state"] == "cancelled"
        await wait_gone(pid_file)


async def test_stdio_client_cancel_is_a_mindhand_cancel(cl: Cluster) -> None:
    pid_file = cl.hands["box"].root / "p.pid"
    async with stdio(cl) as c:
        with anyio.move_on_after(3):  # the SDK sends notifications/cancelled for the abandoned call
            await c.call_tool("exec", {"hand": "box", "command": "echo $$ > p.pid; sleep 60", "wait_s": 30})
        await wait_gone(pid_file)
        runs = body(await c.call_tool("runs", {"hand": "box", "limit": 1}))["runs"]
        assert runs[0]["state"] in ("cancel_requested", "cancelled")
        await until(lambda: cl_run_state(cl, runs[0]["run"]) == "cancelled", 10, "the run to end cancelled")


def cl_run_state(cl: Cluster, run: str) -> str:
    r = cl.cli("run", "get", run, "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    state: str = json.loads(r.stdout)["state"]
    return state


async def test_stdio_scoped_credential_sees_only_its_hands(cl: Cluster) -> None:
    cl.start_hand("other")
    cl.wait_connected("other")
    scoped = cl.client_credential("agent", "--hands", "box")
    async with stdio(cl, scoped) as c:
        assert [h["name"] for h in body(await c.call_tool("hands", {}))["hands"]] == ["box"]
        res = await c.call_tool("exec", {"hand": "other", "argv": ["true"]})
        assert res.is_error and body(res)["code"]


async def test_tools_list_shows_what_the_credentials_scope_may_call(cl: Cluster, http: str) -> None:
    """A credential scoped to two tools was offered all 16, thirteen of which every call would be
    refused: the Mind's welcome now says its tool patterns and `tools/list` offers what they allow
    (stdio and HTTP alike); a full credential still sees every tool."""
    scoped = cl.client_credential("reader", "--tools", "read_file,list_dir")
    async with stdio(cl, scoped) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == ["hands", "list_dir", "read_file"]
        (cl.tmp / "root-box" / "seen.txt").write_text("seen")
        res = await c.call_tool("read_file", {"hand": "box", "path": "seen.txt"})
        assert not res.is_error and body(res)["content"] == "seen"
    async with http_client(http, token(scoped)) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == ["hands", "list_dir", "read_file"]
    runner = cl.client_credential("runner", "--tools", "ex*")  # a glob: exec and every run tool
    async with stdio(cl, runner) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"exec", "run_get", "read_output", "cancel", "task_start"} <= names and "read_file" not in names
    async with stdio(cl) as c:
        assert len((await c.list_tools()).tools) == 16


async def test_http_bearer_scope_and_401(cl: Cluster, http: str) -> None:
    cl.start_hand("other")
    cl.wait_connected("other")
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}
    async with httpx2.AsyncClient(timeout=30) as hc:
        assert (await hc.post(http, json=ping)).status_code == 401
        wrong = f"mh1:client:tester:{secrets.token_hex(32)}"
        assert (await hc.post(http, json=ping, headers={"Authorization": f"Bearer {wrong}"})).status_code == 401
        hand_cred = token(cl.tmp / "box.cred")
        assert (await hc.post(http, json=ping, headers={"Authorization": f"Bearer {hand_cred}"})).status_code == 401
    admin = token(cl.client_credential("admin2"))
    async with http_client(http, admin) as c:
        assert sorted(h["name"] for h in body(await c.call_tool("hands", {}))["hands"]) == ["box", "other"]
        res = await c.call_tool("exec", {"hand": "box", "argv": ["sh", "-c", "echo via http; exit 7"]})
        assert (body(res)["exit_code"], body(res)["stdout"]) == (7, "via http\n")
    scoped = token(cl.client_credential("agent", "--hands", "box"))
    async with http_client(http, scoped) as c:
        assert [h["name"] for h in body(await c.call_tool("hands", {}))["hands"]] == ["box"]


async def test_http_closed_stream_leaves_the_run_going(cl: Cluster, http: str) -> None:
    admin = token(cl.client_credential("admin2"))
    root = cl.hands["box"].root
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with http_client(http, admin) as c:
        with anyio.move_on_after(2):  # the client gives up: its response stream closes
            args = {"hand": "box", "command": "echo $$ > h.pid; sleep 3; echo finished"}
            await c.call_tool("exec", args, progress_callback=on_progress)
    wait_until((root / "h.pid").exists, timeout=10, what="the command to start")
    pid = int((root / "h.pid").read_text())
    assert pid_alive(pid)  # not killed by the closed stream
    async with http_client(http, admin) as c:
        runs = body(await c.call_tool("runs", {"hand": "box", "limit": 1}))["runs"]
        assert progress and progress[0].startswith(f"run {runs[0]['run']} on box")  # the id came first
        res = await c.call_tool("run_get", {"run": runs[0]["run"], "wait_s": 20})
        out = body(res)
        assert (out["state"], out["exit_code"]) == ("succeeded", 0) and out["stdout"].endswith("finished\n")


def test_mcp_without_the_extra_says_how_to_install(cl: Cluster, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    # the SDK hidden from this one process, as on a machine where the extra was not installed
    (shadow / "sitecustomize.py").write_text(
        "import sys\nclass _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mcp' or name.startswith('mcp.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    env = dict(cl.env, PYTHONPATH=str(shadow) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([*program("mind"), "mcp"], env=env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr.decode().strip() == "mind: mind mcp needs the MCP SDK, an optional extra: pip install 'mindhand[mcp]'"
    )


def restart_mind(cl: Cluster) -> None:
    """SIGTERM the Mind, then start it again on the same port (blocking: run it in a thread)."""
    assert cl.mind is not None
    port = cl.port
    cl.mind.signal(signal.SIGTERM)
    cl.mind.p.wait(timeout=20)
    time.sleep(0.5)
    cl.start_mind(*WINDOW, port=port)


async def test_stdio_a_restart_of_the_mind_mid_call_the_call_gets_the_real_end(cl: Cluster) -> None:
    ticker = "i=1; while [ $i -le 24 ]; do echo line $i; i=$((i+1)); sleep 0.25; done; exit 3"
    expected = "".join(f"line {i}\n" for i in range(1, 25))
    got: dict[str, Any] = {}
    async with stdio(cl) as c:

        async def call() -> None:
            # wait_s under the client's own timeout (CALL_TIMEOUT_S): a call still going then comes
            # back still running with its run id, and the outcome is fetched by id, as an agent would
            got["res"] = await c.call_tool("exec", {"hand": "box", "command": ticker, "wait_s": 20})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.sleep(1.5)
            await anyio.to_thread.run_sync(restart_mind, cl)
        out = body(got["res"])
        for _ in range(3):
            if not out.get("still_running"):
                break
            out = body(await c.call_tool("run_get", {"run": out["run"], "wait_s": 20}))
    assert (out["state"], out.get("exit_code"), out.get("stdout")) == ("failed", 3, expected), out


async def test_stdio_write_stdin_to_an_interactive_command(cl: Cluster) -> None:
    async with stdio(cl) as c:
        args = {"hand": "box", "command": "read a; echo got $a; cat", "stdin_open": True, "wait_s": 0.5}
        out = body(await c.call_tool("exec", args))
        assert out["still_running"] is True
        res = await c.call_tool("write_stdin", {"run": out["run"], "data": "hello\n"})
        assert not res.is_error and body(res)["bytes"] == 6
        await c.call_tool("write_stdin", {"run": out["run"], "data": "more", "eof": True})
        end = body(await c.call_tool("run_get", {"run": out["run"], "wait_s": 20}))
        assert (end["state"], end["stdout"]) == ("succeeded", "got hello\nmore")
        res = await c.call_tool("write_stdin", {"run": out["run"], "data": "late"})
        assert res.is_error and body(res)["code"] == "stdin_closed"


async def test_stdio_a_silent_run_still_sends_progress(cl: Cluster) -> None:
    """At least one notification every 20 s (PROGRESS_EVERY_S, 15) while a call waits on a silent run:
    clients that reset their timer on progress keep waiting."""
    seen: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(time.monotonic())

    async with stdio(cl) as c:
        started = time.monotonic()
        res = await c.call_tool(
            "exec", {"hand": "box", "command": "sleep 17; echo awake", "wait_s": 25}, 40, progress_callback=on_progress
        )
        assert body(res)["stdout"] == "awake\n"
    gaps = [b - a for a, b in zip([started, *seen], [*seen, time.monotonic()], strict=True)]
    assert len(seen) >= 2 and max(gaps) < 20, gaps


async def test_stdio_a_run_outlives_the_server_and_the_next_one_gets_its_end(cl: Cluster) -> None:
    """The agent goes away mid-run (its `mind mcp` ends): the run is detached with --keep, not
    killed, and `run_get` from the next `mind mcp` of the same credential attaches to it."""
    async with stdio(cl) as c:
        out = body(await c.call_tool("exec", {"hand": "box", "command": "sleep 2; echo survived", "wait_s": 0.5}))
        assert out["still_running"] is True
    async with stdio(cl) as c:
        end = body(await c.call_tool("run_get", {"run": out["run"], "wait_s": 20}))
        assert (end["state"], end["stdout"]) == ("succeeded", "survived\n")
        res = await c.call_tool("run_get", {"run": "rnosuchrun00000000"})
        assert res.is_error and body(res)["code"] == "unknown_run"


async def test_stdio_sigterm_detaches_runs_still_going(cl: Cluster) -> None:
    """`mind mcp` stopped with SIGTERM mid-run: it detaches the run (kept --keep seconds) and exits 0;
    the run is not cancelled, and the next `mind mcp` gets its end (its output waited for a reader)."""
    p = subprocess.Popen(
        [*program("mind"), "mcp"],
        env=cl.env,
        bufsize=0,  # unbuffered: `select` then sees every line not yet read
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert p.stdin is not None and p.stdout is not None

        def rpc(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(
                json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode() + b"\n"
            )
            p.stdin.flush()
            while True:
                ready, _, _ = select.select([p.stdout], [], [], 15)
                assert ready, f"no answer to {method} within 15 s"
                msg: dict[str, Any] = json.loads(p.stdout.readline())
                if msg.get("id") == id_:
                    return msg

        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        assert "result" in rpc(1, "initialize", init)
        p.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        p.stdin.flush()
        args = {"hand": "box", "command": "sleep 2; echo kept", "wait_s": 0.2}
        out = json.loads(rpc(2, "tools/call", {"name": "exec", "arguments": args})["result"]["content"][0]["text"])
        assert out["still_running"] is True
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    info = json.loads(cl.cli("run", "get", out["run"], "--json").stdout)
    assert info["state"] == "running" and info["client_away_since"] is not None
    async with stdio(cl) as c:
        end = body(await c.call_tool("run_get", {"run": out["run"], "wait_s": 20}))
        assert (end["state"], end["stdout"]) == ("succeeded", "kept\n")


async def test_stdio_background_task_tools(cl: Cluster) -> None:
    async with stdio(cl) as c:
        args = {"hand": "box", "command": "echo building; echo built", "task_id": "build-7"}
        res = await c.call_tool("task_start", args)
        assert not res.is_error and body(res)["state"] == "accepted" and body(res)["task_id"] == "build-7"
        assert body(await c.call_tool("task_start", args))["state"] == "duplicate"  # the same id runs nothing twice
        deadline = time.monotonic() + 20
        while (view := body(await c.call_tool("task_get", {"task_id": "build-7"})))["state"] != "succeeded":
            assert time.monotonic() < deadline, view
            await anyio.sleep(0.2)
        assert view["exit_code"] == 0
        page = body(await c.call_tool("task_logs", {"task_id": "build-7"}))
        assert (page["data"], page["eof"]) == ("building\nbuilt\n", True)

        await c.call_tool("task_start", {"hand": "box", "argv": ["sleep", "60"], "task_id": "long-7"})
        res = await c.call_tool("task_cancel", {"task_id": "long-7"})
        assert not res.is_error and body(res)["cancel"] in ("cancel_requested", "already_done")
        res = await c.call_tool("task_get", {"task_id": "no-such-task"})
        assert res.is_error and body(res)["code"] == "unknown_task"
        res = await c.call_tool("task_start", {"hand": "nope", "argv": ["true"]})
        assert res.is_error and body(res)["code"]


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """A CA and a certificate for 127.0.0.1 (scripts/mkcerts)."""
    out = tmp_path / "certs"
    mkcerts = Path(__file__).resolve().parents[2] / "scripts" / "mkcerts"
    subprocess.run([str(mkcerts), str(out)], capture_output=True, check=True, timeout=60)
    return out


async def test_http_over_tls(cl: Cluster, certs: Path) -> None:
    tls = ("--tls-cert", str(certs / "mind.crt"), "--tls-key", str(certs / "mind.key"))
    admin = token(cl.client_credential("admin2"))
    with listening(cl, *tls, scheme="https") as url:
        async with http_client(url, admin, verify=ssl.create_default_context(cafile=str(certs / "ca.crt"))) as c:
            res = await c.call_tool("exec", {"hand": "box", "argv": ["echo", "over tls"]})
            assert body(res)["stdout"] == "over tls\n"


async def test_stdio_upload_and_download_small_files(cl: Cluster) -> None:
    """Whole files to and from a Hand, as `mind cp` copies them: the bytes, the digest, the mode;
    binary in base64; a bound past which the call is a tool error naming the way."""
    root = cl.hands["box"].root
    script = b"#!/bin/sh\necho tool ran\n"
    blob = bytes(range(256)) * 64  # 16 KiB, not UTF-8
    async with stdio(cl) as c:
        args = {"hand": "box", "path": "bin/tool.sh", "data": script.decode(), "mode": "755", "make_dirs": True}
        res = await c.call_tool("upload", args)
        out = body(res)
        assert not res.is_error, out
        assert (out["size"], out["sha256"], out["mode"]) == (len(script), hashlib.sha256(script).hexdigest(), "755")
        assert (root / "bin" / "tool.sh").read_bytes() == script
        assert stat.S_IMODE((root / "bin" / "tool.sh").stat().st_mode) == 0o755
        assert body(await c.call_tool("exec", {"hand": "box", "argv": ["./bin/tool.sh"]}))["stdout"] == "tool ran\n"

        # replaced whole; an existing file keeps its mode when none is given
        res = await c.call_tool("upload", {"hand": "box", "path": "bin/tool.sh", "data": "#!/bin/sh\nexit 0\n"})
        assert not res.is_error and body(res)["mode"] == "755"
        assert (root / "bin" / "tool.sh").read_bytes() == b"#!/bin/sh\nexit 0\n"

        data = base64.b64encode(blob).decode()
        res = await c.call_tool("upload", {"hand": "box", "path": "blob.bin", "data": data, "encoding": "base64"})
        assert not res.is_error and (root / "blob.bin").read_bytes() == blob
        out = body(await c.call_tool("download", {"hand": "box", "path": "blob.bin"}))
        assert (out["encoding"], out["size"], out["sha256"]) == ("base64", len(blob), hashlib.sha256(blob).hexdigest())
        assert base64.b64decode(out["content"]) == blob
        out = body(await c.call_tool("download", {"hand": "box", "path": "bin/tool.sh"}))
        assert (out["encoding"], out["content"], out["mode"]) == ("utf-8", "#!/bin/sh\nexit 0\n", "755")

        (root / "big.bin").write_bytes(b"\0" * ((4 << 20) + 1))
        res = await c.call_tool("download", {"hand": "box", "path": "big.bin"})
        assert res.is_error and body(res)["code"] == "too_large" and "read_file" in body(res)["error"]
        res = await c.call_tool("upload", {"hand": "box", "path": "big2.bin", "data": "x" * ((4 << 20) + 1)})
        assert res.is_error and body(res)["code"] == "too_large" and not (root / "big2.bin").exists()

        res = await c.call_tool("upload", {"hand": "box", "path": "x.bin", "data": "not base64!", "encoding": "base64"})
        assert res.is_error and body(res)["code"] == "invalid_request"
        res = await c.call_tool("upload", {"hand": "box", "path": "x.sh", "data": "x", "mode": "4755"})
        assert res.is_error and "mode" in res.content[0].text  # malformed: a tool error, nothing written
        res = await c.call_tool("upload", {"hand": "box", "path": "../escape.txt", "data": "x"})
        assert res.is_error and body(res)["state"] == "rejected" and body(res)["code"]
        assert not (root.parent / "escape.txt").exists()
        res = await c.call_tool("download", {"hand": "box", "path": "no/such/file"})
        assert res.is_error and body(res)["state"] in ("failed", "rejected") and "no/such/file" in body(res)["error"]
        res = await c.call_tool("download", {"hand": "nope", "path": "blob.bin"})
        assert res.is_error and body(res)["code"] == "unknown_hand"


async def test_stdio_exec_on_a_selector_one_result_per_hand(cl: Cluster) -> None:
    cl.start_hand("other")
    cl.wait_connected("other")
    (cl.hands["other"].root / "fail.flag").write_text("")
    async with stdio(cl) as c:
        args = {"selector": "box,other", "command": "echo hi; test -f fail.flag && exit 5; exit 0"}
        res = await c.call_tool("exec", args)
        out = body(res)
        assert res.is_error and out["state"] == "failed", out  # one Hand's run did not succeed
        assert (out["hands"], out["counts"]) == (2, {"succeeded": 1, "failed": 1})
        by = {r["hand"]: r for r in out["results"]}
        assert (by["box"]["state"], by["box"]["exit_code"], by["box"]["stdout"]) == ("succeeded", 0, "hi\n")
        assert (by["other"]["state"], by["other"]["exit_code"], by["other"]["stdout"]) == ("failed", 5, "hi\n")
        got = body(await c.call_tool("run_get", {"run": by["other"]["run"]}))  # each member is a run of its own
        assert (got["hand"], got["exit_code"]) == ("other", 5)

        res = await c.call_tool("exec", {"selector": "*", "argv": ["true"]})
        assert not res.is_error and body(res)["counts"] == {"succeeded": 2}

        # longer than wait_s: still running on both, not an error, not stopped; then each run's end
        args = {"selector": "box,other", "command": "sleep 2; echo late", "wait_s": 0.5}
        res = await c.call_tool("exec", args)
        out = body(res)
        assert not res.is_error and out["still_running"] is True and out["state"] == "running"
        members = body(await c.call_tool("runs", {"fleet": out["fleet"]}))["runs"]
        assert sorted((r["hand"], r["run"]) for r in members) == sorted((r["hand"], r["run"]) for r in out["results"])
        for row in out["results"]:
            end = body(await c.call_tool("run_get", {"run": row["run"], "wait_s": 20}))
            assert (end["state"], end["stdout"]) == ("succeeded", "late\n")

        res = await c.call_tool("exec", {"selector": "nothing*", "argv": ["true"]})
        assert res.is_error and body(res)["code"] == "empty_selection"
        res = await c.call_tool("exec", {"hand": "box", "selector": "box", "argv": ["true"]})
        assert res.is_error and body(res)["code"] == "invalid_request"
    scoped = cl.client_credential("agent", "--hands", "box")
    async with stdio(cl, scoped) as c:  # a selector sees only the credential's Hands
        out = body(await c.call_tool("exec", {"selector": "*", "argv": ["true"]}))
        assert [r["hand"] for r in out["results"]] == ["box"]


async def test_stdio_a_70s_run_through_a_client_with_a_60s_timeout_ends_with_its_real_outcome(cl: Cluster) -> None:
    """The issue's case, literally: the client times a call out at 60 s (as most do), the run takes
    70 s. `exec` answers within the client's timeout (wait_s 30) with the run still running, and
    `run_get` (waiting again, each call under 60 s) gets its real exit code and output."""
    command = "echo begun; sleep 70; echo finished; exit 9"
    async with Client(stdio_params(cl), read_timeout_seconds=60) as c:
        started = time.monotonic()
        res = await c.call_tool("exec", {"hand": "box", "command": command})  # wait_s: the default, 30
        out = body(res)
        assert not res.is_error and out["still_running"] is True and out["stdout"] == "begun\n"
        while out.get("still_running"):
            assert time.monotonic() - started < 120, out
            out = body(await c.call_tool("run_get", {"run": out["run"], "wait_s": 30}))
    assert (out["state"], out["exit_code"], out["stdout"]) == ("failed", 9, "begun\nfinished\n")


async def test_stdio_a_fleet_outlives_the_server_and_the_next_one_gets_each_end(cl: Cluster) -> None:
    """The agent goes away while a selector's runs are going: each is detached with --keep, not
    killed, and the next `mind mcp` takes each up by its run id."""
    cl.start_hand("other")
    cl.wait_connected("other")
    async with stdio(cl) as c:
        args = {"selector": "box,other", "command": "sleep 2; echo survived", "wait_s": 0.5}
        out = body(await c.call_tool("exec", args))
        assert out["still_running"] is True and len(out["results"]) == 2
    async with stdio(cl) as c:
        for row in out["results"]:
            end = body(await c.call_tool("run_get", {"run": row["run"], "wait_s": 20}))
            assert (end["hand"], end["state"], end["stdout"]) == (row["hand"], "succeeded", "survived\n")


async def test_http_a_sessions_cancel_notification_is_a_mindhand_cancel(cl: Cluster, http: str) -> None:
    """A client of a handshake-era revision (2025-06-18, an MCP session over HTTP) posts
    `notifications/cancelled` for its call: the run's tree is killed (a closed stream alone leaves
    the run going: test_http_closed_stream_leaves_the_run_going)."""
    root = cl.hands["box"].root
    auth = {"Authorization": f"Bearer {token(cl.client_credential('admin2'))}"}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=30, headers=auth | accept) as hc:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        r = await hc.post(http, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        assert r.status_code == 200, r.text
        session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        r = await hc.post(http, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        assert r.status_code == 202
        args = {"hand": "box", "command": "echo $$ > k.pid; sleep 60", "wait_s": 30}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "exec", "arguments": args}}

        async def calling() -> None:
            async with hc.stream("POST", http, json=call, headers=session) as resp:
                async for _ in resp.aiter_bytes():
                    pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(calling)
            await until((root / "k.pid").exists, 10, "the command to start")
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
            r = await hc.post(http, json=cancel, headers=session)
            assert r.status_code == 202
            await wait_gone(root / "k.pid")
            tg.cancel_scope.cancel()
