"""A cgroup per run, end to end (DESIGN §20): a real Mind, a real Hand on this machine's cgroups,
the `mind` CLI. What a user relies on: after a run is reported ended, nothing it started still runs
(whatever it did to escape), a memory or process bound holds and says so, and what a run used is
in its end; a Hand killed with -9 kills its previous life's leftovers when it starts again.

This machine and CI are a hybrid host (v1 controllers beside a v2 tree with `cgroup.kill`); on a
host where the Hand may not make cgroups these tests are skipped, and the Hand's own fallback is
tested by `test_without_cgroups_a_setsid_child_escapes_and_the_end_says_so`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from hand.system.cgroups import detect, instance_of
from mind.testing.cluster import pid_alive, running, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        detect(instance_of("/tmp/mindhand-cgroup-probe")).layout == "none",
        reason="this machine gives no cgroups to a Hand (not root, or no cgroup.kill or freezer)",
    ),
]

PYTHON = shutil.which("python3") or "/usr/bin/python3"
ESCAPES = f"""
setsid sleep 300 & echo $! >> pids
(sleep 301 & echo $! >> pids)
nohup sleep 302 >/dev/null 2>&1 & echo $! >> pids
{PYTHON} -c '
import os, sys, time
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): sys.exit(0)
os.chdir("/")
with open(sys.argv[1], "a") as f: f.write(f"{{os.getpid()}}\\n")
os.closerange(0, 256)
time.sleep(303)
' "$PWD/pids"
while [ "$(wc -l < pids)" -lt 4 ]; do sleep 0.01; done
echo ready
"""
"""Four ways out of a process group, each writing its pid: `setsid`, a double fork, `nohup` and a
daemon (double fork, setsid, chdir /, every descriptor closed)."""


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("bounded")) as cl:
        yield cl


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def _fresh(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "pids").write_text("")
    return d


def test_the_hand_says_what_it_found(c):
    info = next(h for h in c.hands_json() if h["name"] == "box")
    assert info["cgroups"] in ("v2", "hybrid", "v1")
    assert set(info["limits"]) <= {"memory", "pids", "cpus"}
    assert "cgroups: " in c.hands["box"].output()


def test_a_timeout_leaves_nothing_of_the_run_alive(c):
    """`--timeout` kills the run; the end comes only when every escapee is gone too."""
    d = _fresh(c.hands["box"].root, "timeout")
    r = c.cli(
        "exec", "--hand", "box", "--cwd", "timeout", "--timeout", "2s", "--grace", "1s", "--json",
        "--shell", ESCAPES + "sleep 300",
    )  # fmt: skip
    end = json.loads(r.stdout)
    assert r.returncode == 124 and end["state"] == "timed_out", r.stderr
    pids = _pids(d / "pids")
    assert len(pids) == 4
    assert [p for p in pids if pid_alive(p)] == []  # at once: the end is reported after the kill
    assert end["kill"] == "cgroup"
    assert end["usage"]["pids_peak"] >= 6


def test_a_cancel_leaves_nothing_of_the_run_alive(c):
    """Ctrl-C on `mind exec` cancels the run; the end it prints comes once every escapee is gone."""
    d = _fresh(c.hands["box"].root, "cancel")
    p = c.cli_popen(
        "exec", "--hand", "box", "--cwd", "cancel", "--grace", "1s", "--json", "--shell", ESCAPES + "sleep 300"
    )
    try:
        wait_until(lambda: len(_pids(d / "pids")) == 4, 20, "the escapees to start")
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    end = json.loads(out)
    assert p.returncode == 130 and end["state"] == "cancelled", err
    assert [pid for pid in _pids(d / "pids") if pid_alive(pid)] == []
    assert end["kill"] == "cgroup"


def test_a_run_that_exits_takes_its_escapees_with_it(c):
    """A foreground run ends when its command ends; what it left running (`nohup x &`, a daemon)
    is killed with it, not left behind."""
    d = _fresh(c.hands["box"].root, "exits")
    r = c.cli("exec", "--hand", "box", "--cwd", "exits", "--json", "--shell", ESCAPES)
    end = json.loads(r.stdout)
    assert r.returncode == 0 and end["state"] == "succeeded", r.stderr
    assert end["stdout"] == "ready\n"
    assert [p for p in _pids(d / "pids") if pid_alive(p)] == []


def test_memory_is_bounded_and_an_oom_says_so(c):
    r = c.cli(
        "exec", "--hand", "box", "--memory", "64M", "--json", "--",
        PYTHON, "-c", "x = bytearray(400 << 20); print('survived')",
    )  # fmt: skip
    end = json.loads(r.stdout)
    assert r.returncode == 137, r.stderr
    assert end["state"] == "failed" and end["reason"] == "out_of_memory"
    assert "64 MiB" in end["error"]
    assert end["usage"]["oom_kills"] >= 1 and end["usage"]["memory_peak"] <= 64 << 20
    assert "survived" not in end["stdout"]
    r = c.cli("exec", "--hand", "box", "--memory", "64M", "--", PYTHON, "-c", "x = bytearray(400 << 20)")
    assert r.returncode == 137 and b"out of memory" in r.stderr and b"64 MiB" in r.stderr


def test_memory_under_the_bound_is_fine(c):
    r = c.cli(
        "exec", "--hand", "box", "--memory", "256M", "--json", "--",
        PYTHON, "-c", "x = bytearray(64 << 20); print(len(x))",
    )  # fmt: skip
    end = json.loads(r.stdout)
    assert r.returncode == 0 and end["stdout"] == f"{64 << 20}\n"
    assert end["usage"]["oom_kills"] == 0 and end["usage"]["memory_peak"] >= 64 << 20


def test_a_fork_bomb_is_bounded_by_pids(c):
    r = c.cli(
        "exec", "--hand", "box", "--pids", "30", "--timeout", "3s", "--grace", "1s", "--json",
        "--shell", "b() { b | b & }; b; sleep 5",
    )  # fmt: skip
    end = json.loads(r.stdout)
    assert end["state"] in ("timed_out", "failed", "succeeded"), end
    assert end["usage"]["pids_peak"] <= 30
    assert end["kill"] == "cgroup"


def test_cpus_hold_a_busy_loop_back(c):
    r = c.cli(
        "exec", "--hand", "box", "--cpus", "0.2", "--json", "--",
        PYTHON, "-c", "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass",
    )  # fmt: skip
    end = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    used = end["usage"]["cpu_user_s"] + end["usage"]["cpu_system_s"]
    assert used < 0.9 and end["usage"]["throttled_s"] > 0


def test_a_cpu_budget_counts_what_left_the_group(c):
    """The CPU budget is read from the cgroup: a `setsid` child burning CPU is charged to the run."""
    r = c.cli(
        "exec", "--hand", "box", "--cpu-seconds", "1", "--timeout", "30s", "--json",
        "--shell", f"setsid {PYTHON} -c 'while True: pass' & sleep 60",
    )  # fmt: skip
    end = json.loads(r.stdout)
    assert r.returncode == 123 and end["state"] == "budget_exhausted", (r.returncode, end)


def test_a_task_is_bounded_too_and_its_row_says_what_it_used(c):
    d = _fresh(c.hands["box"].root, "task")
    r = c.cli("task", "start", "--hand", "box", "--id", "bounded1", "--cwd", "task", "--shell", ESCAPES + "sleep 300")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: len(_pids(d / "pids")) == 4, 20, "the escapees to start")
    assert c.cli("task", "cancel", "bounded1").returncode == 0
    wait_until(lambda: c.task("bounded1")["state"] == "cancelled", 20, "the task to end cancelled")
    assert [p for p in _pids(d / "pids") if pid_alive(p)] == []
    assert c.task("bounded1")["usage"]["pids_peak"] >= 6
    r = c.cli(
        "task",
        "start",
        "--hand",
        "box",
        "--id",
        "bounded2",
        "--memory",
        "32M",
        "--",
        PYTHON,
        "-c",
        "x = bytearray(300 << 20)",
    )
    assert r.returncode == 0, r.stderr
    wait_until(lambda: c.task("bounded2")["state"] == "failed", 20, "the task to fail")
    t = c.task("bounded2")
    assert t["reason"] == "out_of_memory" and t["usage"]["oom_kills"] >= 1


def test_no_cgroup_is_left_behind(c):
    for _ in range(20):
        assert c.cli("exec", "--hand", "box", "--", "true").returncode == 0
    instance = instance_of(c.hands["box"].state_dir)
    left = _run_cgroups(instance)
    assert left == []


def _run_cgroups(instance: str) -> list[str]:
    """The run cgroups left under a Hand's instance, in every hierarchy. `os.walk` skips a directory
    that goes while it looks (`Path.rglob` raised: the suite's other Hands make and remove theirs)."""
    return [
        os.path.join(top, d)
        for top, dirs, _ in os.walk("/sys/fs/cgroup")
        if os.path.basename(top) == instance
        for d in dirs
    ]


def test_a_hand_killed_with_9_kills_its_leftovers_when_it_starts_again(tmp_path):
    with running(tmp_path) as c:
        d = _fresh(c.hands["box"].root, "crash")
        r = c.cli(
            "task", "start", "--hand", "box", "--id", "crashy", "--cwd", "crash", "--shell", ESCAPES + "sleep 300"
        )
        assert r.returncode == 0, r.stderr
        wait_until(lambda: len(_pids(d / "pids")) == 4, 20, "the escapees to start")
        gen = c.hand_info("box")["generation"]
        c.hands["box"].kill9()
        time.sleep(0.2)
        pids = _pids(d / "pids")
        assert all(pid_alive(p) for p in pids)  # nobody killed them: the Hand is gone
        c.start_hand("box")
        c.wait_connected("box", min_gen=gen + 1)
        assert [p for p in pids if pid_alive(p)] == []  # killed before the Hand came back
        wait_until(lambda: c.hand_tasks("box")["crashy"]["state"] == "lost", 20, "the task to be lost")
        instance = instance_of(c.hands["box"].state_dir)
        assert _run_cgroups(instance) == []


def test_without_cgroups_a_setsid_child_escapes_and_the_end_says_so(tmp_path):
    """`hand run --cgroups off`: the process-group kill is what it was, the end says so, and a
    cgroup limit is refused rather than ignored."""
    with running(tmp_path, "box", "--cgroups", "off") as c:
        d = _fresh(c.hands["box"].root, "off")
        r = c.cli(
            "exec", "--hand", "box", "--cwd", "off", "--timeout", "1s", "--grace", "1s", "--json",
            "--shell", "setsid sleep 300 & echo $! >> pids; sleep 300",
        )  # fmt: skip
        end = json.loads(r.stdout)
        assert end["state"] == "timed_out" and end["kill"] == "process_group"
        (pid,) = _pids(d / "pids")
        try:
            assert pid_alive(pid)  # the escape this issue is about: only a cgroup stops it
        finally:
            os.kill(pid, signal.SIGKILL)
        r = c.cli("exec", "--hand", "box", "--memory", "64M", "--", "true")
        assert r.returncode == 125 and b"limits.memory" in r.stderr and b"cgroups: none" in r.stderr
        info = next(h for h in c.hands_json() if h["name"] == "box")
        assert info["cgroups"] == "none" and info["limits"] == []
