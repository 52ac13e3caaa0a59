"""`mind exec` / `mind call` end to end: real Mind, real Hand, real processes, what a user sees."""

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from mind.testing.cluster import pid_alive, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind and Hand, and the `mind` CLI


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("exec")) as cl:
        yield cl


@pytest.fixture
def root(c) -> Path:
    return c.tmp / "root-box"


def test_exit_codes_propagate(c):
    assert c.cli("exec", "--hand", "box", "--", "true").returncode == 0
    r = c.cli("exec", "--hand", "box", "--", "sh", "-c", "exit 3")
    assert r.returncode == 3 and r.stderr == b""


def test_stdout_and_stderr_are_separate(c):
    r = c.cli("exec", "--hand", "box", "--", "sh", "-c", "echo out; echo err >&2; echo out2")
    assert r.returncode == 0
    assert r.stdout == b"out\nout2\n"
    assert r.stderr == b"err\n"


def test_shell_mode_and_cwd_inside_root(c, root):
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "a").write_text("1")
    (root / "sub" / "b").write_text("2")
    r = c.cli("exec", "--hand", "box", "--cwd", "sub", "--shell", "ls | wc -l")
    assert r.returncode == 0 and r.stdout.strip() == b"2"


def test_binary_output_is_byte_exact(c):
    r = c.cli("exec", "--hand", "box", "--", "sh", "-c", r"printf '\000\001\377abc'")
    assert r.returncode == 0 and r.stdout == b"\x00\x01\xffabc"


def test_five_megabytes_of_output_arrive_whole(c):
    """Output is a stream, not progress: every byte arrives, in order, and nothing is dropped
    (before streams, the stdout file held the first ~1 MiB spliced onto the 64 KiB tail)."""
    cmd = "head -c 5000000 /dev/zero | tr '\\000' a; echo; echo END"
    r = c.cli("exec", "--hand", "box", "--json", "--shell", cmd, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["state"] == "succeeded" and out["exit_code"] == 0
    assert out["progress_dropped"] == 0
    assert out["delivered"]["stdout"]["bytes"] == 5_000_000 + 5
    want = hashlib.sha256(b"a" * 5_000_000 + b"\nEND\n").hexdigest()
    assert out["delivered"]["stdout"]["sha256"] == want and out["delivered"]["stdout"]["complete"]
    assert out["stdout"].endswith("a\nEND\n")  # the bounded tail is still there
    r = c.cli("exec", "--hand", "box", "--shell", cmd, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"a" * 5_000_000 + b"\nEND\n" and r.stderr == b""


def test_json_summary_has_the_documented_keys(c):
    r = c.cli("exec", "--hand", "box", "--json", "--", "uname", "-s")
    out = json.loads(r.stdout)
    for key in ("run_id", "hand", "state", "exit_code", "signal", "progress_dropped", "truncated", "duration_ms"):
        assert key in out
    assert out["hand"] == "box" and out["stdout"].strip() == os.uname().sysname


def test_events_are_ndjson_ending_with_end(c):
    r = c.cli("exec", "--hand", "box", "--events", "--", "echo", "hi")
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    states = [ln["state"] for ln in lines if ln["event"] == "state"]
    assert states[:2] == ["admitted", "sent"] and "running" in states
    assert any(ln["event"] == "output" and ln["data"] == "hi\n" for ln in lines)
    assert lines[-1]["event"] == "end" and lines[-1]["state"] == "succeeded"


def test_timeout_kills_the_tree_and_exits_124(c, root):
    pidfile = root / "timeout.pid"
    r = c.cli(
        "exec",
        "--hand",
        "box",
        "--timeout",
        "1",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        f"echo $$ > {pidfile.name}; sleep 60; echo never",
    )
    assert r.returncode == 124
    assert b"never" not in r.stdout and b"timed_out" in r.stderr
    pid = int(pidfile.read_text())
    wait_until(lambda: not pid_alive(pid), 5, "the timed-out process to be gone")


GRANDCHILD = """
echo $$ > parent.pid
( trap '' TERM; exec sh -c 'echo $$ > gc.pid; exec sleep 300' ) &
wait
"""


def test_ctrl_c_cancels_the_whole_tree_including_a_term_ignoring_grandchild(c, root):
    for f in ("parent.pid", "gc.pid"):
        (root / f).unlink(missing_ok=True)
    (root / "gc.sh").write_text(GRANDCHILD)
    p = c.cli_popen("exec", "--hand", "box", "--grace", "1", "--", "sh", "gc.sh")
    try:
        wait_until(
            lambda: (root / "gc.pid").exists() and (root / "gc.pid").read_text().strip(), 15, "grandchild to start"
        )
        parent, gc = int((root / "parent.pid").read_text()), int((root / "gc.pid").read_text())
        assert pid_alive(parent) and pid_alive(gc)
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert b"cancel requested" in err
    assert b"SIGKILL" in err  # the grandchild ignored SIGTERM, so the kill stage ended it
    wait_until(lambda: not pid_alive(parent) and not pid_alive(gc), 5, "no process left behind")


def test_exit_zero_with_a_background_child_holding_stdout_does_not_hang(c, root):
    t0 = time.monotonic()
    r = c.cli("exec", "--hand", "box", "--", "sh", "-c", "sleep 100 & echo $! > bg.pid; echo done", timeout=30)
    assert r.returncode == 0 and r.stdout == b"done\n"
    assert time.monotonic() - t0 < 20
    pid = int((root / "bg.pid").read_text())
    wait_until(lambda: not pid_alive(pid), 10, "the leftover background child to be gone")


def test_command_not_found_is_a_failure_not_a_hang(c):
    r = c.cli("exec", "--hand", "box", "--", "definitely-not-a-command-xyz")
    assert r.returncode not in (0, 124, 255)


def test_call_file_tools(c, root):
    r = c.cli("call", "--hand", "box", "write_file", "path=notes/a.txt", "data=hello world", "make_dirs=true")
    assert r.returncode == 0, r.stderr
    assert (root / "notes" / "a.txt").read_text() == "hello world"
    r = c.cli("call", "--hand", "box", "read_file", "path=notes/a.txt")
    assert r.returncode == 0 and json.loads(r.stdout)["data"] == {"$bytes": "aGVsbG8gd29ybGQ="}  # one shape for bytes
    r = c.cli("call", "--hand", "box", "read_file", "path=notes/a.txt", "--raw")
    assert r.stdout == b"hello world"
    r = c.cli("call", "--hand", "box", "list_dir", "--args", '{"path": "notes"}')
    assert [e["name"] for e in json.loads(r.stdout)["entries"]] == ["a.txt"]


@pytest.mark.parametrize(
    "args",
    [
        ["read_file", "path=../outside.txt"],
        ["read_file", "path=/etc/passwd"],
        ["read_file", "path=link-out/passwd"],
        ["write_file", "path=../../evil.txt", "data=x"],
        ["list_dir", "path=.."],
    ],
)
def test_path_escapes_are_refused(c, root, args):
    link = root / "link-out"
    if not link.is_symlink():
        link.symlink_to("/etc")
    r = c.cli("call", "--hand", "box", *args)
    assert r.returncode == 125, r.stdout
    assert b"path_outside_root" in r.stderr
    assert str(root).encode() not in r.stderr + r.stdout  # the Hand's absolute root never leaks
    assert not (root.parent / "evil.txt").exists()


def test_cwd_escape_is_refused(c):
    r = c.cli("exec", "--hand", "box", "--cwd", "../..", "--", "pwd")
    assert r.returncode == 125 and b"path_outside_root" in r.stderr


def test_unknown_tool_and_offline_and_unknown_hand_are_125(c):
    r = c.cli("call", "--hand", "box", "no_such_tool")
    assert r.returncode == 125 and b"unknown_tool" in r.stderr
    c.add_hand("sleeper")
    r = c.cli("exec", "--hand", "sleeper", "--", "true")
    assert r.returncode == 125 and b"hand_offline" in r.stderr
    r = c.cli("exec", "--hand", "ghost", "--", "true")
    assert r.returncode == 125 and b"unknown_hand" in r.stderr


def test_bad_cli_usage_is_2(c):
    assert c.cli("exec", "--hand", "box").returncode == 2
    assert c.cli("exec", "--hand", "box", "--timeout", "-1", "--", "true").returncode == 2
    assert c.cli("call", "--hand", "box", "read_file", "novalue").returncode == 2


def test_run_get_reports_the_end(c):
    r = c.cli("exec", "--hand", "box", "--json", "--", "true")
    run_id = json.loads(r.stdout)["run_id"]
    r = c.cli("run", "get", run_id, "--json")
    info = json.loads(r.stdout)
    assert info["state"] == "succeeded" and info["hand"] == "box" and len(info["args_digest"]) == 64


def test_hands_table_and_json(c):
    r = c.cli("hands")
    assert r.returncode == 0 and b"box" in r.stdout and b"CONNECTED" in r.stdout
    info = c.hand_info("box")
    assert info["connected"] is True and info["generation"] >= 1 and info["claims"]["hostname"]


def test_mind_unreachable_is_125(c, tmp_path):
    r = c.cli("exec", "--mind", "ws://127.0.0.1:1", "--hand", "box", "--", "true")
    assert r.returncode == 125 and b"cannot reach" in r.stderr


def test_policy_denies_before_anything_runs(tmp_path):
    with running(tmp_path, "locked", "--deny-tools", "write_file,exec") as cl:
        root = tmp_path / "root-locked"
        r = cl.cli("call", "--hand", "locked", "write_file", "path=x.txt", "data=hi")
        assert r.returncode == 125 and b"denied_by_policy" in r.stderr
        assert not (root / "x.txt").exists()
        r = cl.cli("exec", "--hand", "locked", "--", "touch", "marker")
        assert r.returncode == 125 and b"denied_by_policy" in r.stderr
        assert not (root / "marker").exists()
        # allowed tools still work
        assert cl.cli("exec", "--hand", "locked", "--shell", "true").returncode == 0


def test_status_and_runs_history(c):
    c.cli("exec", "--hand", "box", "--", "sh", "-c", "exit 5")
    r = c.cli("runs", "--hand", "box", "--limit", "5", "--json")
    runs = json.loads(r.stdout)
    assert r.returncode == 0 and 1 <= len(runs) <= 5 and runs[0]["state"] == "failed"
    assert runs[0]["created_at"] >= runs[-1]["created_at"]  # newest first
    r = c.cli("runs", "--state", "failed", "--since", "1h")
    assert r.returncode == 0 and b"failed" in r.stdout and b"RUN" in r.stdout
    r = c.cli("status")
    assert r.returncode == 0 and b"HANDS (1 of" in r.stdout and b"RECENT FAILURES" in r.stdout
    st = json.loads(c.cli("status", "--json").stdout)
    assert st["hands"][0]["name"] == "box" and st["recent_failures"][0]["state"] == "failed"
    assert c.cli("runs", "--since", "soon").returncode == 2


def test_one_ctrl_c_delivered_twice_cancels_and_a_later_second_one_detaches(c, root):
    """SIGINT to the process group (`timeout -s INT`, a terminal's Ctrl-C through a wrapper) can
    reach `mind exec` twice in a moment: it was read as "Ctrl-C again", and the run was detached
    and left running. Two in a moment, before the cancel was answered, are one wish: the run is
    cancelled (130). A second one after the first was answered still detaches (121)."""
    (root / "twice.pid").unlink(missing_ok=True)
    p = c.cli_popen("exec", "--hand", "box", "--", "sh", "-c", "echo $$ > twice.pid; exec sleep 30")
    try:
        wait_until(lambda: (root / "twice.pid").exists() and (root / "twice.pid").read_text().strip(), 15, "start")
        os.kill(p.pid, signal.SIGINT)
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and b"detached" not in err, (p.returncode, err)
    wait_until(lambda: not pid_alive(int((root / "twice.pid").read_text())), 5, "the run's process gone")

    # a command that outlives its cancel (TERM ignored, a long grace): the first Ctrl-C is answered
    # at once (cancel requested), and a second one later is a wish of its own: detach
    (root / "stays.pid").unlink(missing_ok=True)
    script = "trap '' TERM; echo $$ > stays.pid; sleep 20"
    p = c.cli_popen("exec", "--hand", "box", "--grace", "15", "--", "sh", "-c", script)
    try:
        wait_until(lambda: (root / "stays.pid").exists() and (root / "stays.pid").read_text().strip(), 15, "start")
        os.kill(p.pid, signal.SIGINT)
        time.sleep(1.5)
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert b"detached from run" in err, (p.returncode, err)
