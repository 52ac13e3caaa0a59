"""The Hand's sandbox (issue 5 item 5): a scrubbed environment, resource limits with a tree-wide CPU
budget (`budget_exhausted`), `--run-as`, and file tools that refuse special files.

Real processes throughout; every wait is bounded and polls a condition."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hand_support import pid_alive, read_pid
from test_hand_runs import Hand
from test_hand_tasks import Hand as TaskHand

from hand import cli
from hand.core.cpu import kernel_cpu_kill
from hand.core.tasks import TaskLimits
from hand.system.cgroups import NO_CGROUPS, detect, instance_of
from hand.system.cputime import CpuMeter, parse_stat, read_tree_seconds, tree_ticks
from hand.system.sandbox import (
    DEFAULT_ALLOW,
    RUN_AS_PATH,
    OverCap,
    ResourceLimits,
    RunAs,
    Sandbox,
    effective_limits,
    lookup_user,
    parse_env_allow,
    rlimit_plan,
)
from protocol.codes import KillStage, RejectCode
from protocol.messages import Rejected
from protocol.states import TASK_TERMINAL, RunState, TaskState

PY = sys.executable
BURN = "while :; do :; done"


def make_hand(root: Path, sandbox: Sandbox = Sandbox()) -> Hand:
    h = Hand(root)
    h.table._sandbox = sandbox
    return h


@pytest.fixture
async def boxed(tmp_path):
    """A run table factory: `await boxed(sandbox)`; every table is closed at the end."""
    hands: list[Hand] = []
    root = tmp_path / "root"
    root.mkdir()

    def factory(sandbox: Sandbox = Sandbox()) -> Hand:
        h = make_hand(root, sandbox)
        hands.append(h)
        return h

    yield factory
    for h in hands:
        await h.close()


def env_of(result) -> dict[str, str]:
    return dict(line.split("=", 1) for line in result.stdout.data.decode().splitlines() if "=" in line)


def rejected(hand: Hand, run_id: str) -> Rejected:
    msgs = hand.of(run_id)
    assert len(msgs) == 1 and isinstance(msgs[0], Rejected), msgs
    return msgs[0]


# --- environment: pure rules ----------------------------------------------------------------------


def test_parse_env_allow_names_prefixes_and_errors():
    a = parse_env_allow(["CI_*, GITHUB_TOKEN", "FOO", ""])
    assert a.names == {"GITHUB_TOKEN", "FOO"} and a.prefixes == ("CI_",)
    assert a.allows("CI_JOB") and a.allows("FOO") and not a.allows("FOOBAR") and not a.allows("GITHUB")
    assert parse_env_allow(["*"]).allows("ANYTHING")
    for bad in ("A*B", "*X", "A=B", "A B"):
        with pytest.raises(ValueError, match="not an environment name"):
            parse_env_allow([bad])


def test_the_hands_own_environment_is_read_as_it_is_now(monkeypatch):
    # The filtered environment is kept between runs, and made again once the Hand's changed: a
    # name added, a value changed, a name removed; what a caller does to its copy stays there.
    sandbox = Sandbox(secrets=("s3cret",))
    monkeypatch.setenv("LANG", "C.UTF-8")
    assert sandbox.child_env(None)["LANG"] == "C.UTF-8"
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    monkeypatch.setenv("LC_ALL", "C")
    env = sandbox.child_env(None)
    assert env["LANG"] == "fr_FR.UTF-8" and env["LC_ALL"] == "C"
    env["LANG"] = "mine"
    assert sandbox.child_env(None)["LANG"] == "fr_FR.UTF-8"
    monkeypatch.setenv("LANG", "has s3cret in it")
    monkeypatch.delenv("LC_ALL")
    env = sandbox.child_env(None)
    assert "LANG" not in env and "LC_ALL" not in env


def test_child_env_allowlist_secrets_run_as_and_per_run_env():
    parent = {
        "PATH": "/bin",
        "HOME": "/root",
        "LC_ALL": "C",
        "LC_TIME": "C",
        "TERM": "xterm",
        "SECRET_TOKEN": "s3",
        "AWS_KEY": "k",
        "MINDHAND_CREDENTIAL": "/x.cred",
        "MINDHAND_URL": "ws://m",
        "HIDDEN_COPY": "prefix-deadbeef-suffix",
        "CI_JOB": "7",
    }
    base = Sandbox(secrets=("deadbeef",))
    assert base.child_env(None, parent) == {
        "PATH": "/bin",
        "HOME": "/root",
        "LC_ALL": "C",
        "LC_TIME": "C",
        "TERM": "xterm",
    }
    assert base.child_env({"SECRET_TOKEN": "mine", "MINDHAND_X": "caller's"}, parent)["SECRET_TOKEN"] == "mine"
    ci = Sandbox(env_allow=DEFAULT_ALLOW.extended(parse_env_allow(["CI_*"]))).child_env(None, parent)
    assert ci["CI_JOB"] == "7" and "SECRET_TOKEN" not in ci
    for everything in (
        Sandbox(env_allow=parse_env_allow(["*"]), secrets=("deadbeef",)),
        Sandbox(env_inherit=True, secrets=("deadbeef",)),
    ):
        env = everything.child_env(None, parent)
        assert env["SECRET_TOKEN"] == "s3" and env["AWS_KEY"] == "k"
        assert not any(k.startswith("MINDHAND_") for k in env) and "HIDDEN_COPY" not in env
    who = RunAs(name="bob", uid=1234, gid=1234, groups=(1234,), home="/home/bob")
    env = Sandbox(run_as=who).child_env({"HOME": "/override"}, parent)
    assert env["USER"] == env["LOGNAME"] == "bob" and env["HOME"] == "/override"  # the run's env on top
    # a run-as child gets a standard PATH, not the Hand's (root's); a run that sets PATH keeps its own
    assert env["PATH"] == RUN_AS_PATH == "/usr/local/bin:/usr/bin:/bin"
    inherit = Sandbox(run_as=who, env_inherit=True).child_env(None, {"PATH": "/root/bin:/bin"})
    assert inherit["PATH"] == RUN_AS_PATH
    assert Sandbox(run_as=who).child_env({"PATH": "/opt/x/bin"}, parent)["PATH"] == "/opt/x/bin"


# --- environment: real children ---------------------------------------------------------------------


@pytest.mark.slow
async def test_a_child_sees_only_the_allowlist_plus_its_env(boxed, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("MINDHAND_CREDENTIAL", "/somewhere/hand.cred")
    monkeypatch.setenv("CI_BUILD", "42")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("HOME", "/home/of-the-hand")
    hand = boxed()
    r = await hand.wait(hand.rpc("exec", {"argv": ["env"], "env": {"MY_VAR": "mine"}}))
    env = env_of(r)
    assert r.state is RunState.SUCCEEDED
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == os.environ["HOME"] and env["LC_TIME"] == "C"
    assert env["MY_VAR"] == "mine"
    assert "SECRET_TOKEN" not in env and "CI_BUILD" not in env
    assert not any(k.startswith("MINDHAND_") for k in env)

    allowed = boxed(Sandbox(env_allow=DEFAULT_ALLOW.extended(parse_env_allow(["SECRET_TOKEN", "CI_*"]))))
    env = env_of(await allowed.wait(allowed.rpc("shell", {"command": "env"})))
    assert env["SECRET_TOKEN"] == "hunter2" and env["CI_BUILD"] == "42"
    assert not any(k.startswith("MINDHAND_") for k in env)

    everything = boxed(Sandbox(env_allow=parse_env_allow(["*"])))
    env = env_of(await everything.wait(everything.rpc("shell", {"command": "env"})))
    assert env["SECRET_TOKEN"] == "hunter2" and not any(k.startswith("MINDHAND_") for k in env)


@pytest.mark.slow
async def test_background_tasks_get_the_scrubbed_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("MINDHAND_HOME", "/somewhere")
    h = TaskHand(tmp_path)
    h.m._sandbox = Sandbox()
    await h.m.open()
    try:
        await h.start("t-env", args={"command": "env", "env": {"MARK": "per-run"}})
        info = await h.until_state("t-env", TaskState.SUCCEEDED)
        log = (await h.read_log("t-env")).decode()
        assert info.state is TaskState.SUCCEEDED and "MARK=per-run" in log and "PATH=" in log
        assert "hunter2" not in log and "MINDHAND_" not in log
    finally:
        await h.close()


# --- the CLI flags ------------------------------------------------------------------------------------


def _args(tmp_path: Path, *extra: str):
    cred = tmp_path / "hand.cred"
    cred.write_text("mh1:hand:h1:" + "ab" * 32 + "\n")
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return cli._parser().parse_args(
        [
            "run",
            "--mind",
            "ws://127.0.0.1:9",
            "--credential",
            str(cred),
            "--root",
            str(root),
            "--state-dir",
            str(tmp_path / "state"),
            *extra,
        ]
    )


def _config(tmp_path: Path, *extra: str):
    """What `hand run` builds from these flags (no environment, no file)."""
    return cli.build_config(cli.settings_source(_args(tmp_path, *extra), env={}).load())


def test_hand_run_flags_build_the_sandbox(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    # scrubbed, no caps, no user by default; a cgroup per run where this machine gives them
    assert dataclasses.replace(cfg.sandbox, cgroups=NO_CGROUPS) == Sandbox()
    assert cfg.sandbox.cgroups.layout == detect(instance_of(tmp_path / "state")).layout
    assert _config(tmp_path, "--cgroups", "off").sandbox.cgroups.layout == "none"
    cfg = _config(
        tmp_path,
        "--env-allow",
        "SECRET_TOKEN,CI_*",
        "--env-allow",
        "OTHER",
        "--max-cpu-seconds",
        "30",
        "--max-address-space",
        "1G",
        "--max-open-files",
        "256",
        "--max-processes",
        "64",
        *(["--max-memory", "512M", "--max-pids", "100", "--max-cpus", "1.5"] if cfg.sandbox.cgroups.enabled else []),
    )
    box = cfg.sandbox
    assert box.env_allow.allows("SECRET_TOKEN") and box.env_allow.allows("CI_X") and box.env_allow.allows("OTHER")
    assert box.env_allow.allows("LC_ALL") and not box.env_allow.allows("AWS_KEY") and not box.env_inherit
    cgroup_caps = dict(memory=512 << 20, pids=100, cpus=1.5) if box.cgroups.enabled else {}
    assert box.caps == ResourceLimits(
        cpu_seconds=30, address_space=1 << 30, open_files=256, processes=64, **cgroup_caps
    )
    assert _config(tmp_path, "--env-inherit").sandbox.env_inherit
    for bad, words in (
        (["--env-allow", "A*B"], "--env-allow"),
        (["--max-cpu-seconds", "0"], "--max-cpu-seconds"),
        (["--max-address-space", "lots"], "--max-address-space"),
        (["--max-cpus", "0"], "--max-cpus"),
        (["--cgroups", "maybe"], "--cgroups"),
        (["--cgroup-root", "relative/path"], "--cgroup-root"),
        (["--cgroups", "off", "--max-memory", "1G"], "--max-memory"),
        (["--run-as", f"no-such-user-{uuid.uuid4().hex[:8]}"], "unknown user"),
    ):
        with pytest.raises(cli.ConfigError, match=words):
            _config(tmp_path, *bad)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(cli.ConfigError, match="--run-as: needs the hand to run as root"):
        _config(tmp_path, "--run-as", "root")


@pytest.mark.slow
def test_hand_run_with_bad_sandbox_flags_exits_2(tmp_path):
    args = _args(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    for bad, words in (
        (["--run-as", f"no-such-user-{uuid.uuid4().hex[:8]}"], "unknown user"),
        (["--env-allow", "*FOO"], "--env-allow"),
    ):
        r = subprocess.run(
            [
                PY,
                "-m",
                "hand",
                "run",
                "--mind",
                ",".join(args.mind),
                "--credential",
                args.credential,
                "--root",
                args.root,
                "--state-dir",
                args.state_dir,
                *bad,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert r.returncode == 2 and r.stderr.startswith("hand: ") and words in r.stderr, r.stderr


@pytest.mark.slow
async def test_env_and_cpu_budget_through_a_real_hand_and_mind(tmp_path):
    """`hand run --env-allow ... --max-cpu-seconds ...` between a real Mind and its CLI."""
    from mind.testing.cluster import Cluster

    cl = Cluster(tmp_path)
    cl.env.update(SECRET_TOKEN="hunter2", CI_BUILD="42")
    try:
        await asyncio.to_thread(cl.start_mind)
        cl.start_hand("box", "--env-allow", "CI_*", "--max-cpu-seconds", "5")
        await asyncio.to_thread(cl.wait_connected, "box")
        r = await asyncio.to_thread(cl.cli, "exec", "--hand", "box", "--env", "MINE=1", "--", "env")
        env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines() if "=" in line)
        assert r.returncode == 0 and env["CI_BUILD"] == "42" and env["MINE"] == "1" and "PATH" in env
        assert "SECRET_TOKEN" not in env and not any(k.startswith("MINDHAND_") for k in env)
        call = '{"command": "%s", "limits": {"cpu_seconds": %d}}'
        r = await asyncio.to_thread(cl.cli, "call", "--hand", "box", "shell", "--args", call % (BURN, 1))
        assert r.returncode == 123, (r.returncode, r.stdout, r.stderr)  # budget exhausted
        r = await asyncio.to_thread(cl.cli, "call", "--hand", "box", "shell", "--args", call % ("true", 6))
        assert r.returncode == 125 and b"cap of 5 s" in r.stderr, (r.returncode, r.stderr)
    finally:
        await asyncio.to_thread(cl.stop_all)


# --- resource limits: pure rules ----------------------------------------------------------------------


def test_effective_limits_caps_and_defaults():
    caps = ResourceLimits(cpu_seconds=10, open_files=64)
    assert effective_limits(None, ResourceLimits()) is None
    assert effective_limits(ResourceLimits(), ResourceLimits()) is None
    assert effective_limits(ResourceLimits(cpu_seconds=3), caps) == ResourceLimits(cpu_seconds=3, open_files=64)
    assert effective_limits(None, caps) == caps  # a cap cannot be dodged by asking for nothing
    with pytest.raises(
        OverCap, match=r"limits.cpu_seconds of 11 s is over this hand's cap of 10 s \(--max-cpu-seconds\)"
    ):
        effective_limits(ResourceLimits(cpu_seconds=11), caps)


def test_rlimit_plan_only_tightens():
    plan = dict(rlimit_plan(ResourceLimits(cpu_seconds=2, address_space=1 << 30, open_files=1 << 29, processes=9)))
    assert plan[resource.RLIMIT_CPU] == (3, 4)  # a per-process backstop above the tree budget
    assert plan[resource.RLIMIT_AS] == (1 << 30, 1 << 30)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert plan[resource.RLIMIT_NOFILE][1] <= hard and plan[resource.RLIMIT_NOFILE][0] <= soft
    assert plan[resource.RLIMIT_NPROC] == (9, 9) or resource.getrlimit(resource.RLIMIT_NPROC)[1] < 9
    assert rlimit_plan(None) == ()


def test_proc_stat_parsing_tree_sum_and_high_water_meter():
    line = b"4242 (we ird) name)) R 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 7 3 20 0 1 0 999 1000 10\n"
    st = parse_stat(line)
    assert st is not None and (st.pid, st.state, st.pgrp, st.session) == (4242, "R", 4242, 4242)
    assert (st.own_ticks, st.children_ticks) == (200, 10)
    assert parse_stat(b"garbage") is None and parse_stat(b"1 (x) R 1") is None
    member = parse_stat(b"4300 (sh) S 4242 4300 4242 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0 1 1 1")  # own group, same session
    stranger = parse_stat(b"99 (init) S 0 99 99 0 -1 0 0 0 0 0 900 900 0 0 20 0 1 0 1 1 1")
    assert tree_ticks([st, member, stranger], 4242) == 220
    meter = CpuMeter()
    assert meter.advance(1.0) == 1.0 and meter.advance(0.7) == 0.0 and meter.advance(1.5) == 0.5
    assert read_tree_seconds(os.getpid()) >= 0.0 and read_tree_seconds(1, proc="/no/such/proc") == 0.0


def test_kernel_cpu_kill_is_only_the_kernels_own_limit():
    assert kernel_cpu_kill(False, signal.SIGXCPU, 2, 0.0)
    assert kernel_cpu_kill(False, signal.SIGKILL, 2, 2.5)
    assert not kernel_cpu_kill(False, signal.SIGKILL, 5, 0.3)  # an OOM kill or someone's kill -9
    assert not kernel_cpu_kill(True, signal.SIGXCPU, 2, 3.0)  # our own kill
    assert not kernel_cpu_kill(False, signal.SIGXCPU, None, 3.0) and not kernel_cpu_kill(False, None, 2, 3.0)


# --- resource limits: real processes -------------------------------------------------------------------


@pytest.mark.slow
async def test_cpu_budget_ends_the_run_budget_exhausted_and_kills_the_tree(boxed, tmp_path):
    hand = boxed()
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    rid = hand.rpc("shell", {"command": f"echo $$ > {pidfile}; {BURN}", "limits": {"cpu_seconds": 1}})
    r = await hand.wait(rid, timeout=20)
    assert r.state is RunState.BUDGET_EXHAUSTED, r
    assert r.reason == "cpu budget of 1 s exhausted" and r.stage in (KillStage.TERM, KillStage.KILL)
    assert time.monotonic() - started < 15
    pid = read_pid(pidfile)
    assert pid is not None and not pid_alive(pid)


@pytest.mark.slow
async def test_cpu_budget_counts_the_whole_tree(boxed, tmp_path):
    hand = boxed()
    pids = [tmp_path / "p1", tmp_path / "p2"]
    cmd = (
        f"sh -c 'echo $$ > {pids[0]}; exec sh -c \"{BURN}\"' & "
        f"sh -c 'echo $$ > {pids[1]}; exec sh -c \"{BURN}\"' & wait"
    )
    r = await hand.wait(hand.rpc("shell", {"command": cmd, "limits": {"cpu_seconds": 2}}), timeout=30)
    assert r.state is RunState.BUDGET_EXHAUSTED and "cpu budget of 2 s" in r.reason, r
    for p in pids:
        pid = read_pid(p)
        assert pid is not None and not pid_alive(pid)


@pytest.mark.slow
async def test_the_kernels_cpu_limit_is_a_backstop_that_also_means_budget_exhausted(boxed, monkeypatch):
    async def blind(*_args, **_kwargs):  # a Hand too starved to poll: only RLIMIT_CPU is left
        await asyncio.Event().wait()

    monkeypatch.setattr("hand.aio.activerun.watch_cpu", blind)  # where a run meters its CPU
    hand = boxed()
    r = await hand.wait(hand.rpc("exec", {"argv": ["sh", "-c", BURN], "limits": {"cpu_seconds": 1}}), timeout=20)
    assert r.state is RunState.BUDGET_EXHAUSTED and r.signal == signal.SIGXCPU, r
    assert r.reason.startswith("cpu budget of 1 s exhausted") and "kernel" in r.reason


@pytest.mark.slow
async def test_a_fast_command_under_a_cpu_budget_succeeds(boxed):
    hand = boxed()
    r = await hand.wait(hand.rpc("exec", {"argv": ["echo", "quick"], "limits": {"cpu_seconds": 5}}))
    assert r.state is RunState.SUCCEEDED and r.stdout.data == b"quick\n"


@pytest.mark.slow
async def test_open_files_limit_makes_opening_64_files_fail(boxed):
    hand = boxed()
    code = "fs = [open('/dev/null') for _ in range(64)]; print('opened', len(fs))"
    r = await hand.wait(hand.rpc("exec", {"argv": [PY, "-c", code], "limits": {"open_files": 16}}))
    assert r.state is RunState.FAILED and r.exit_code == 1 and b"Too many open files" in r.stderr.data, r
    r = await hand.wait(hand.rpc("exec", {"argv": [PY, "-c", code]}))
    assert r.state is RunState.SUCCEEDED and r.stdout.data == b"opened 64\n"


@pytest.mark.slow
async def test_address_space_limit_makes_a_big_allocation_fail(boxed):
    hand = boxed()
    r = await hand.wait(
        hand.rpc("exec", {"argv": [PY, "-c", "x = bytearray(512 << 20)"], "limits": {"address_space": 64 << 20}})
    )
    assert r.state is RunState.FAILED and r.exit_code == 1 and b"MemoryError" in r.stderr.data, r


async def test_limits_over_a_cap_or_malformed_are_rejected_before_anything_runs(boxed, tmp_path):
    marker = tmp_path / "ran"
    hand = boxed(Sandbox(caps=ResourceLimits(cpu_seconds=5, address_space=1 << 30, open_files=128, processes=50)))
    over = {"cpu_seconds": 6, "address_space": (1 << 30) + 1, "open_files": 129, "processes": 51}
    for name, value in over.items():
        rid = hand.rpc("shell", {"command": f"touch {marker}", "limits": {name: value}})
        rej = rejected(hand, rid)
        assert rej.code is RejectCode.INVALID_REQUEST and f"limits.{name} of {value}" in rej.message
        assert "cap of" in rej.message, rej.message
    for bad in (
        {"cpu_seconds": 0},
        {"cpu_seconds": -1},
        {"cpu_seconds": True},
        {"cpu_seconds": "1"},
        {"cpu_seconds": 1.5},
        {"open_files": 0},
        {"nice": 5},
        "lots",
    ):
        rid = hand.rpc("exec", {"argv": ["touch", str(marker)], "limits": bad})
        rej = rejected(hand, rid)
        assert rej.code is RejectCode.INVALID_REQUEST and "limits" in rej.message, rej.message
    rej = rejected(hand, hand.rpc("read_file", {"path": "x", "limits": {"cpu_seconds": 1}}))
    assert rej.code is RejectCode.INVALID_REQUEST
    assert not marker.exists()


@pytest.mark.slow
async def test_a_cap_applies_to_a_run_that_asks_for_nothing(boxed, tmp_path):
    hand = boxed(Sandbox(caps=ResourceLimits(cpu_seconds=1)))
    r = await hand.wait(hand.rpc("shell", {"command": BURN}), timeout=20)
    assert r.state is RunState.BUDGET_EXHAUSTED and r.reason == "cpu budget of 1 s exhausted"


@pytest.mark.slow
async def test_a_background_task_over_its_cpu_budget_fails_and_its_tree_is_gone(tmp_path):
    h = TaskHand(tmp_path, limits=TaskLimits())
    await h.m.open()
    pidfile = tmp_path / "task.pid"
    try:
        await h.start("t-burn", args={"command": f"echo $$ > {pidfile}; {BURN}", "limits": {"cpu_seconds": 1}})
        info = await h.until_state("t-burn", *TASK_TERMINAL, timeout=20)
        assert info.state is TaskState.FAILED and info.reason == "cpu budget of 1 s exhausted", info
        assert info.stage in (KillStage.TERM, KillStage.KILL)
        pid = read_pid(pidfile)
        assert pid is not None and not pid_alive(pid)
    finally:
        await h.close()


# --- run as another user ----------------------------------------------------------------------------


@pytest.fixture
def throwaway_user():
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs root and useradd/userdel")
    name = f"mindhand-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True, timeout=30)
    try:
        yield lookup_user(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.mark.slow
async def test_run_as_runs_children_as_that_user(boxed, throwaway_user, tmp_path):
    who = throwaway_user
    hand = boxed(Sandbox(run_as=who))
    r = await hand.wait(hand.rpc("shell", {"command": 'id -u; id -g; id -G; echo "$USER $LOGNAME $HOME"'}))
    assert r.state is RunState.SUCCEEDED, r
    uid, gid, groups, names = r.stdout.data.decode().splitlines()
    assert int(uid) == who.uid != 0 and int(gid) == who.gid
    assert {int(g) for g in groups.split()} == set(who.groups) and "0" not in groups.split()  # root's groups dropped
    assert names == f"{who.name} {who.name} {who.home}"
    # RLIMIT_NPROC counts the user's processes: with a dedicated user it bounds the tree.
    r = await hand.wait(hand.rpc("shell", {"command": "sleep 0.1 & wait; echo ok", "limits": {"processes": 2}}))
    assert r.state is RunState.SUCCEEDED and r.stdout.data == b"ok\n", r
    r = await hand.wait(
        hand.rpc("shell", {"command": "sleep 5 & sleep 5 & sleep 5 & sleep 5 & wait", "limits": {"processes": 2}}),
        timeout=20,
    )
    assert r.state is RunState.FAILED and b"fork" in r.stderr.data, r
    # The Hand's own files stay the Hand's: a background task's log is owned by the Hand.
    (tmp_path / "tasks").mkdir()
    h = TaskHand(tmp_path / "tasks")
    h.m._sandbox = Sandbox(run_as=who)
    await h.m.open()
    try:
        await h.start("t-as", "id -u")
        await h.until_state("t-as", TaskState.SUCCEEDED)
        assert (await h.read_log("t-as")).strip() == str(who.uid).encode()
        assert h.m.store.log_path("t-as").stat().st_uid == os.geteuid()
    finally:
        await h.close()


# --- special files ---------------------------------------------------------------------------------


async def test_fifos_are_refused_promptly_by_every_file_tool(boxed):
    hand = boxed()
    os.mkfifo(hand.root / "fifo")
    async with asyncio.timeout(10):  # a blocking open would hang here
        r = await hand.wait(hand.rpc("read_file", {"path": "fifo"}))
        assert r.state is RunState.FAILED and "FIFO" in r.error
        for mode in ("overwrite", "append", "create"):
            r = await hand.wait(hand.rpc("write_file", {"path": "fifo", "data": b"x", "mode": mode}))
            assert r.state is RunState.FAILED and ("FIFO" in r.error or "exists" in r.error), (mode, r.error)
        r = await hand.wait(hand.rpc("list_dir", {"path": "fifo"}))
        assert r.state is RunState.FAILED and "FIFO" in r.error
    assert (hand.root / "fifo").is_fifo()


async def test_sockets_and_devices_are_refused(boxed):
    hand = boxed()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(hand.root / "sock"))
        for tool, args in (("read_file", {"path": "sock"}), ("write_file", {"path": "sock", "data": b"x"})):
            r = await hand.wait(hand.rpc(tool, args))
            assert r.state is RunState.FAILED and "socket" in r.error, r.error
    finally:
        sock.close()
    # /dev/null through a symlink inside the root: refused by the path check.
    (hand.root / "null").symlink_to("/dev/null")
    for tool, args in (
        ("read_file", {"path": "null"}),
        ("write_file", {"path": "null", "data": b"x"}),
        ("list_dir", {"path": "null"}),
    ):
        rej = rejected(hand, hand.rpc(tool, args))
        assert rej.code is RejectCode.PATH_OUTSIDE_ROOT
    # A device node inside the root: refused by the special-file check.
    try:
        os.mknod(hand.root / "zero", 0o666 | 0o020000, os.makedev(1, 5))  # S_IFCHR, /dev/zero
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here")
    async with asyncio.timeout(10):
        r = await hand.wait(hand.rpc("read_file", {"path": "zero"}))
        assert r.state is RunState.FAILED and "device" in r.error
        r = await hand.wait(hand.rpc("write_file", {"path": "zero", "data": b"x"}))
        assert r.state is RunState.FAILED and "device" in r.error


async def test_write_file_onto_a_symlink_is_refused_and_its_target_is_untouched(boxed):
    hand = boxed()
    (hand.root / "target.txt").write_bytes(b"original")
    (hand.root / "link").symlink_to("target.txt")
    (hand.root / "dangling").symlink_to("nowhere.txt")
    for path in ("link", "dangling"):
        for mode in ("overwrite", "append", "create"):
            r = await hand.wait(hand.rpc("write_file", {"path": path, "data": b"new", "mode": mode}))
            assert r.state is RunState.FAILED and ("symlink" in r.error or "exists" in r.error), (path, mode, r.error)
    assert (hand.root / "target.txt").read_bytes() == b"original"
    assert (hand.root / "link").is_symlink() and not (hand.root / "nowhere.txt").exists()
    # Directories through symlinks are still followed (inside the root): only the last component counts.
    (hand.root / "real-dir").mkdir()
    (hand.root / "dir-link").symlink_to("real-dir")
    r = await hand.wait(hand.rpc("write_file", {"path": "dir-link/f.txt", "data": b"ok"}))
    assert r.state is RunState.SUCCEEDED and (hand.root / "real-dir" / "f.txt").read_bytes() == b"ok"
    r = await hand.wait(hand.rpc("read_file", {"path": "link"}))  # reading through a link is fine
    assert r.state is RunState.SUCCEEDED and r.value["data"] == b"original"


async def test_read_file_of_a_directory_is_refused(boxed):
    hand = boxed()
    (hand.root / "d").mkdir()
    r = await hand.wait(hand.rpc("read_file", {"path": "d"}))
    assert r.state is RunState.FAILED and "directory" in r.error and "list_dir" in r.error


@pytest.fixture
def run_as_user(as_root):
    """A user of its own for `--run-as` (root needed: `as_root` fails, never skips, without it)."""
    name = f"mindhand-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True, timeout=30)
    try:
        yield lookup_user(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.mark.slow
async def test_a_run_as_child_of_a_hand_with_roots_path_gets_127_for_a_missing_command(
    boxed, run_as_user, tmp_path, monkeypatch
):
    """Issue 24 item 4: a Hand started from a root shell has a PATH with directories only root may
    search (here a 0700 dir first, like /root/.local/bin). Passed on, `execvp` met EACCES there and a
    missing command ended 126 "Permission denied" instead of the documented 127."""
    private = tmp_path / "rootonly"
    (private / "bin").mkdir(parents=True)
    os.chmod(private, 0o700)
    monkeypatch.setenv("PATH", f"{private / 'bin'}:/usr/bin:/bin")
    hand = boxed(Sandbox(run_as=run_as_user))
    r = await hand.wait(hand.rpc("exec", {"argv": ["no-such-command-mindhand"]}))
    assert r.state is RunState.FAILED and r.exit_code == 127, r
    assert "No such file or directory" in r.error and "Permission denied" not in r.error, r
    r = await hand.wait(hand.rpc("shell", {"command": 'echo "$PATH"; id -u'}))
    assert r.stdout.data.decode().split() == [RUN_AS_PATH, str(run_as_user.uid)], r
    r = await hand.wait(hand.rpc("exec", {"argv": ["sh", "-c", 'echo "$PATH"'], "env": {"PATH": "/bin"}}))
    assert r.stdout.data == b"/bin\n", r  # the run's own PATH wins
    r = await hand.wait(hand.rpc("exec", {"argv": ["true"]}))  # found on the standard PATH
    assert r.state is RunState.SUCCEEDED, r
