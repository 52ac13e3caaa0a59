"""Real processes in real cgroups (`hand.system.cgroups`): what a run starts cannot escape the kill
(`setsid`, a double fork, `nohup`, a daemon), the limits hold (a fork bomb, an allocation past the
memory limit, a busy loop under a CPU share), the usage figures are the run's, nothing is left
under /sys/fs/cgroup, and what a crashed life left is found and swept, never another Hand's.

Needs root and cgroups (skipped otherwise). Every test has its own instance (from its tmp_path), so
tests never see each other's cgroups; the `hosts` fixture sweeps and releases every host a test made
and checks the base directories are gone; the `procs` fixture kills and reaps, by PID, every process
a test started (and any escapee still in one of the test's cgroups)."""

from __future__ import annotations

import functools
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hand_support import pid_alive, until

from hand.system.cgroups import (
    NO_CGROUPS,
    CgroupError,
    CgroupHost,
    CgroupLimits,
    RunCgroup,
    detect,
    instance_of,
    join,
)

MiB = 1 << 20
CGROUP_FS = Path("/sys/fs/cgroup")
WAIT_S = 10.0
"""Bound of every wait for a process to appear, exit or die (a loaded CI machine, never reached)."""


def _probe() -> CgroupHost:
    """What this machine offers, found once for the skip (its base directories removed at once)."""
    host = detect(instance_of(f"/nonexistent/mindhand-cgroup-test-probe-{os.getpid()}"))
    host.release()
    return host


PROBE = _probe()
pytestmark = pytest.mark.skipif(
    PROBE.layout == "none",
    reason=f"cgroups: none on this machine (not root, or no cgroup.kill nor v1 freezer): {PROBE.why}",
)


# --- helpers ---------------------------------------------------------------------------------------


def bases(host: CgroupHost) -> list[Path]:
    return ([host.unified] if host.unified is not None else []) + list(host.v1.values())


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def ignores(pid: int, sig: int) -> bool:
    return bool(int(status_field(pid, "SigIgn"), 16) & (1 << (sig - 1)))


def cgroup_places(pid: int, text: str | None = None) -> dict[str, str]:
    """/proc/PID/cgroup (or its `text`) as hierarchy -> path: "unified" for the v2 tree, else each
    v1 controller."""
    out: dict[str, str] = {}
    if text is None:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    for line in text.splitlines():
        hier, ctrls, path = line.split(":", 2)
        if hier == "0" and ctrls == "":
            out["unified"] = path
        for ctrl in ctrls.split(","):
            if ctrl:
                out[ctrl] = path
    return out


def in_run(pid: int, cg: RunCgroup, text: str | None = None) -> bool:
    """Whether `pid` is in every directory of the run (by /proc/PID/cgroup, or its `text`)."""
    try:
        places = cgroup_places(pid, text)
    except OSError:
        return False
    return all(key in places and str(path).endswith(places[key]) for key, path in cg.dirs.items())


def none_alive(pids: list[int]) -> bool:
    return not any(pid_alive(pid) for pid in pids)


def read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def keyed(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = int(value)
    return out


async def exited(p: subprocess.Popen[Any], what: str = "the main process to exit") -> int:
    await until(lambda: p.poll() is not None, WAIT_S, what)
    assert p.returncode is not None
    return p.returncode


class Procs:
    """Starts children in a run's cgroup the way the Hand does, and kills and reaps them at the end."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[Any]] = []
        self.runs: list[RunCgroup] = []

    def spawn(self, cg: RunCgroup, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        self.runs.append(cg)
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        fds = cg.open_join()
        try:
            p = subprocess.Popen(argv, preexec_fn=functools.partial(join, fds), start_new_session=True, **kw)
        finally:
            cg.closed_join()
        self.popens.append(p)
        return p

    def sh(self, cg: RunCgroup, script: str, **kw: Any) -> subprocess.Popen[Any]:
        return self.spawn(cg, ["/bin/sh", "-c", script], **kw)

    def cleanup(self) -> None:
        # whatever a failed test left in its runs' cgroups: by PID, and only if still in the run
        for cg in self.runs:
            for pid in cg.procs():
                if in_run(pid, cg):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=WAIT_S)


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.cleanup()


@pytest.fixture
async def hosts(procs: Procs) -> AsyncIterator[Callable[..., CgroupHost]]:
    """`hosts(state_dir, **detect_options)`: detect() for that Hand's instance; at the end every
    host made is swept and released, and its base directories must be gone. Torn down after
    `procs`."""
    made: list[CgroupHost] = []

    def make(state_dir: Path, **kw: Any) -> CgroupHost:
        host = detect(instance_of(state_dir), **kw)
        made.append(host)
        return host

    try:
        yield make
    finally:
        for host in made:
            await host.sweep()
            host.release()
    for host in made:
        assert [b for b in bases(host) if b.exists()] == []


@pytest.fixture
def host(hosts: Callable[..., CgroupHost], tmp_path: Path) -> CgroupHost:
    return hosts(tmp_path)


# --- detection -------------------------------------------------------------------------------------


def _hybrid_mounts() -> bool:
    table = Path("/proc/self/mounts").read_text().split("\n")
    fields = [line.split() for line in table if len(line.split()) >= 4]
    v2 = any(f[2] == "cgroup2" for f in fields)
    v1 = {c for f in fields if f[2] == "cgroup" for c in f[3].split(",")}
    return v2 and {"memory", "pids", "cpu", "freezer"} <= v1


def test_detect_finds_the_hybrid_layout(host: CgroupHost, tmp_path: Path) -> None:
    if not _hybrid_mounts():
        pytest.skip("this machine has no hybrid layout (v1 memory/pids/cpu/freezer beside a v2 tree)")
    instance = instance_of(tmp_path)
    assert host.layout == "hybrid" and host.enabled
    assert set(host.limits) == {"memory", "pids", "cpus"}
    assert host.refusal(CgroupLimits(memory=64 * MiB, pids=10, cpus=0.5)) is None
    # kill and membership in the v2 tree; the v1 freezer is not used where cgroup.kill does the kill
    assert host.unified is not None and host.unified.is_relative_to(CGROUP_FS / "unified")
    assert host.kill_mode == "cgroup.kill"
    assert set(host.v1) == {"memory", "pids", "cpu"}
    assert all(base.name == instance for base in bases(host))
    # a Hand only checked leaves nothing in the cgroup tree; the bases come with the first run
    assert [base for base in [*bases(host), CGROUP_FS / "freezer" / instance] if base.exists()] == []
    cg = host.create("run-1", CgroupLimits(cpus=0.5))
    assert all(base.is_dir() for base in bases(host))
    assert cg.dirs == {"unified": host.unified / "run-1", **{c: b / "run-1" for c, b in host.v1.items()}}
    # a run with no CPU share is not put in the v1 cpu hierarchy: nothing of its own throttles it
    plain = host.create("run-2")
    assert plain.dirs == {
        "unified": host.unified / "run-2",
        "memory": host.v1["memory"] / "run-2",
        "pids": host.v1["pids"] / "run-2",
    }
    assert not (host.v1["cpu"] / "run-2").exists()
    plain.remove(retry=False)
    line = host.describe()
    assert line.startswith(f"cgroups: hybrid (v2 {host.unified}; v1 cpu; v1 memory; v1 pids)")
    assert line.endswith("kill: cgroup.kill; limits: memory, pids, cpus")


@pytest.mark.slow
async def test_detect_on_a_machine_with_only_the_v2_tree(
    hosts: Callable[..., CgroupHost], procs: Procs, tmp_path: Path
) -> None:
    """The same v2 tree seen as a pure-v2 machine would see it (no v1 mounts): kill and membership
    by cgroup.kill; no limits, since this tree has no controllers to enable."""
    if not (CGROUP_FS / "unified" / "cgroup.procs").exists():
        pytest.skip("no v2 tree at /sys/fs/cgroup/unified")
    mounts, own = tmp_path / "mounts", tmp_path / "cgroup"
    mounts.write_text(f"cgroup2 {CGROUP_FS / 'unified'} cgroup2 rw,relatime 0 0\n")
    own.write_text("0::/\n")
    host = hosts(tmp_path, mounts=str(mounts), own=str(own))
    assert host.layout == "v2" and "cannot enable" in host.why
    assert host.kill_mode == "cgroup.kill" and host.v1 == {} and host.limits == ()
    assert host.refusal(CgroupLimits(memory=MiB)) is not None
    cg = host.create("run-v2")
    assert set(cg.dirs) == {"unified"}
    p = procs.sh(cg, "trap '' TERM; setsid sleep 300 & exec sleep 300")
    await until(lambda: len(ps := cg.procs()) == 2 and all(comm(pid) == "sleep" for pid in ps), WAIT_S, "sleeps")
    pids = cg.procs()
    usage = await cg.close(grace=0.1)
    assert cg.procs() == [] and await exited(p) == -signal.SIGKILL
    await until(lambda: none_alive(pids), WAIT_S, "the sleeps gone from /proc")
    assert usage.cpu_user_s is not None and usage.cpu_system_s is not None
    assert (usage.memory_peak, usage.pids_peak, usage.oom_kills) == (None, None, None)  # no controllers
    assert not cg.dirs["unified"].exists()


async def test_detect_with_a_root_puts_the_bases_in_that_subtree(tmp_path: Path) -> None:
    """`--cgroup-root PATH` (a delegated subtree): the bases go under PATH in every hierarchy."""
    delegated = f"mindhand-test-root-{os.getpid()}"
    mounts = [CGROUP_FS / "unified", *(CGROUP_FS / c for c in ("memory", "pids", "cpu", "freezer"))]
    made = []
    try:
        for mount in mounts:
            if mount.is_dir():
                (mount / delegated).mkdir()
                made.append(mount / delegated)
        host = detect(instance_of(tmp_path), root=f"/{delegated}/")
        try:
            assert host.enabled and bases(host)
            assert all(base.parent.name == delegated for base in bases(host))
            cg = host.create("run-rooted")
            assert all(path.is_dir() and path.parent.parent.name == delegated for path in cg.dirs.values())
            await cg.close()
            assert not any(path.exists() for path in cg.dirs.values())
        finally:
            await host.sweep()
            host.release()
        assert not any(base.exists() for base in bases(host))
    finally:
        for path in made:
            path.rmdir()


def test_no_cgroups_refuses_limits_by_name() -> None:
    why = NO_CGROUPS.refusal(CgroupLimits(memory=64 * MiB))
    assert why is not None and "limits.memory" in why and "cgroups: none" in why
    why = NO_CGROUPS.refusal(CgroupLimits(memory=64 * MiB, pids=10, cpus=0.5))
    assert why is not None and "limits.memory, limits.pids, limits.cpus" in why
    assert NO_CGROUPS.refusal(CgroupLimits()) is None
    with pytest.raises(CgroupError, match=r"limits\.pids"):
        NO_CGROUPS.create("run-x", CgroupLimits(pids=10))
    assert "kill: process group" in NO_CGROUPS.describe() and NO_CGROUPS.kill_mode == "process group"


def test_a_limit_the_kernel_rejects_raises_and_leaves_no_run_dir(host: CgroupHost) -> None:
    with pytest.raises(CgroupError, match="cannot set up the run's cgroup"):
        host.create("run-bad", CgroupLimits(memory=-5))
    assert [b / "run-bad" for b in bases(host) if (b / "run-bad").exists()] == []
    assert host.leftovers() == []


# --- the kill: nothing escapes ----------------------------------------------------------------------

DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.chdir("/")
os.closerange(0, 1024)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""

ESCAPES = {
    "setsid": "setsid sleep 300 &",
    "double-fork": "(sleep 300 &)",
    "nohup": "nohup sleep 300 >/dev/null 2>&1 &",
    "daemon": f"{sys.executable} -c '{DAEMON}' \"$READY\"",
}


@pytest.mark.slow
@pytest.mark.parametrize("escape", list(ESCAPES))
async def test_an_escapee_outlives_its_shell_but_not_the_kill(
    host: CgroupHost, procs: Procs, tmp_path: Path, escape: str
) -> None:
    cg = host.create("run-escape")
    ready = tmp_path / "daemon.pid"
    # SIGTERM ignored (inherited through exec): only the kill can end what is left
    p = procs.sh(cg, f"trap '' TERM; {ESCAPES[escape]}", env={**os.environ, "READY": str(ready)})
    assert await exited(p) == 0
    if escape == "daemon":
        await until(ready.exists, WAIT_S, "the daemon to be ready")
        daemon = int(ready.read_text())
        await until(lambda: cg.procs() == [daemon], WAIT_S, "only the daemon in the cgroup")
    else:
        await until(lambda: (ps := cg.procs()) and all(comm(pid) == "sleep" for pid in ps), WAIT_S, "the sleep")
    pids = cg.procs()  # collected before the kill
    assert len(pids) == 1 and p.pid not in pids
    (pid,) = pids
    assert pid_alive(pid) and in_run(pid, cg) and ignores(pid, signal.SIGTERM)
    if escape in ("setsid", "daemon"):
        assert os.getsid(pid) != p.pid  # out of the run's session: a process-group kill misses it
    assert await cg.empty(0.2) == 1
    assert cg.procs() == [] and cg.left == 0
    # the cgroup is empty once every member has begun its exit; /proc follows within moments
    await until(lambda: none_alive(pids), WAIT_S, "the escapee gone from /proc")
    await cg.close()
    assert not any(path.exists() for path in cg.dirs.values())


@pytest.mark.slow
async def test_every_escape_at_once_and_close_removes_every_dir(host: CgroupHost, procs: Procs, tmp_path: Path) -> None:
    cg = host.create("run-all", CgroupLimits(memory=256 * MiB, pids=64, cpus=1.0))
    assert set(cg.dirs) == {"unified", *host.v1}
    assert all(path.is_dir() and path.name == "run-all" for path in cg.dirs.values())
    ready = tmp_path / "daemon.pid"
    p = procs.sh(cg, "trap '' TERM\n" + "\n".join(ESCAPES.values()), env={**os.environ, "READY": str(ready)})
    assert await exited(p) == 0
    await until(ready.exists, WAIT_S, "the daemon to be ready")
    daemon = int(ready.read_text())

    def settled() -> bool:
        ps = cg.procs()
        return len(ps) == 4 and daemon in ps and sum(comm(pid) == "sleep" for pid in ps) == 3

    await until(settled, WAIT_S, "three sleeps and the daemon in the cgroup")
    pids = cg.procs()
    assert all(pid_alive(pid) and in_run(pid, cg) for pid in pids)
    usage = await cg.close()  # kills what is left, reads the usage, removes the directories
    assert cg.procs() == [] and cg.left == 0 and cg.usage == usage
    assert [path for path in cg.dirs.values() if path.exists()] == []
    await until(lambda: none_alive(pids), WAIT_S, "every escapee gone from /proc")
    assert usage.pids_peak is not None and usage.pids_peak >= 5  # the shell and its four
    assert host.leftovers() == []


# --- limits and usage --------------------------------------------------------------------------------

BOMB = """
import os, sys, time
deadline, want, key = float(sys.argv[1]), sys.argv[2], sys.argv[3]
# never fork outside the run's cgroup: the limit is what bounds the bomb
for line in open("/proc/self/cgroup"):
    hier, ctrls, path = line.strip().split(":", 2)
    if (key in ctrls.split(",") if key else hier == "0") and path.endswith(want):
        break
else:
    sys.exit(3)
while time.monotonic() < deadline:  # and every process of it ends by itself at the deadline
    try:
        os.fork()  # parent and child alike fork on
    except OSError:
        pass  # EAGAIN at pids.max: try again, as fast as it can
os._exit(0)
"""


@pytest.mark.slow
async def test_a_fork_bomb_is_bounded_by_pids_and_emptied(host: CgroupHost, procs: Procs) -> None:
    cg = host.create("run-bomb", CgroupLimits(pids=20, cpus=1.0))
    pids_dir = cg.dirs.get("pids") or cg.dirs["unified"]
    key = "pids" if "pids" in cg.dirs else ""
    deadline = time.monotonic() + 15.0
    want = f"/{pids_dir.parent.name}/run-bomb"  # .../<instance>/run-bomb
    procs.spawn(cg, [sys.executable, "-c", BOMB, str(deadline), want, key])
    await until(lambda: read_int(pids_dir / "pids.current") >= 20, WAIT_S, "the bomb to reach pids.max")
    await until(lambda: keyed(pids_dir / "pids.events").get("max", 0) >= 1, WAIT_S, "a refused fork")
    assert read_int(pids_dir / "pids.current") <= 20
    members = cg.procs()
    assert 1 < len(members) <= 20 and all(in_run(pid, cg) for pid in members)
    assert await cg.empty(0.2) >= 1
    assert cg.procs() == [] and cg.left == 0
    await until(lambda: none_alive(members), WAIT_S, "the bomb gone from /proc")
    usage = await cg.close()
    assert usage.pids_peak is not None and 2 <= usage.pids_peak <= 20
    assert not any(path.exists() for path in cg.dirs.values())


ALLOCATE = "import sys; x = b'x' * (200 << 20); sys.exit(0)"


@pytest.mark.slow
async def test_past_the_memory_limit_the_run_is_oom_killed(host: CgroupHost, procs: Procs) -> None:
    limit = 32 * MiB
    cg = host.create("run-oom", CgroupLimits(memory=limit))
    p = procs.spawn(cg, [sys.executable, "-c", ALLOCATE])
    assert await exited(p, "the allocation to end") == -signal.SIGKILL
    usage = await cg.close()
    assert usage.oom_kills is not None and usage.oom_kills >= 1
    assert usage.memory_peak is not None and limit * 3 // 4 <= usage.memory_peak <= limit
    assert not any(path.exists() for path in cg.dirs.values())


BUSY = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.slow
async def test_a_cpu_share_throttles_a_busy_loop(host: CgroupHost, procs: Procs) -> None:
    cg = host.create("run-cpu", CgroupLimits(cpus=0.2))
    p = procs.spawn(cg, [sys.executable, "-c", BUSY])
    assert await exited(p, "the busy loop to end") == 0
    seconds = cg.cpu_seconds()  # what the run used so far, read while it is still there
    usage = await cg.close()
    assert usage.throttled_s is not None and usage.throttled_s > 0
    assert usage.cpu_user_s is not None and usage.cpu_system_s is not None
    # a second of wall time at a fifth of a CPU: about 0.2 s of CPU, far from the whole second
    assert 0 < usage.cpu_user_s + usage.cpu_system_s < 0.6
    assert seconds is not None and abs(seconds - (usage.cpu_user_s + usage.cpu_system_s)) < 0.01


@pytest.mark.slow
async def test_the_usage_of_a_short_run(host: CgroupHost, procs: Procs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cg = host.create("run-short")
    p = procs.sh(cg, f"echo hi > {out}; cat /proc/self/cgroup >> {out}")
    assert await exited(p) == 0
    hi, _, places = out.read_text().partition("\n")
    assert hi == "hi" and in_run(0, cg, places)  # the cat was in the run's cgroup, in every hierarchy
    usage = await cg.close()
    assert usage.cpu_user_s is not None and usage.cpu_user_s >= 0
    assert usage.cpu_system_s is not None and usage.cpu_system_s >= 0
    assert usage.pids_peak is not None and usage.pids_peak >= 2  # the shell and its cat
    assert usage.oom_kills == 0
    assert usage.memory_peak is not None and usage.memory_peak > 0
    assert usage.throttled_s in (None, 0.0)
    assert not any(path.exists() for path in cg.dirs.values())


# --- after a crash, and between Hands ----------------------------------------------------------------


@pytest.mark.slow
async def test_a_restart_finds_and_sweeps_what_the_crash_left(
    hosts: Callable[..., CgroupHost], procs: Procs, tmp_path: Path
) -> None:
    before = hosts(tmp_path)
    cg = before.create("run-crash", CgroupLimits(memory=128 * MiB))
    p = procs.sh(cg, "trap '' TERM; setsid sleep 300 & exec sleep 300")
    await until(lambda: len(ps := cg.procs()) == 2 and all(comm(pid) == "sleep" for pid in ps), WAIT_S, "two sleeps")
    pids = cg.procs()
    assert p.pid in pids
    # the Hand dies here: no close(). Its next life, on the same state directory:
    after = hosts(tmp_path)
    assert bases(after) == bases(before)
    assert after.leftovers() == ["run-crash"]
    assert all(pid_alive(pid) for pid in pids)
    assert await after.sweep() == ["run-crash"]
    assert cg.procs() == []
    await until(lambda: none_alive(pids), WAIT_S, "the crashed run's processes gone from /proc")
    assert await exited(p) == -signal.SIGKILL
    assert [path for path in cg.dirs.values() if path.exists()] == []
    assert after.leftovers() == []


@pytest.mark.slow
async def test_a_sweep_never_touches_another_hands_runs(
    hosts: Callable[..., CgroupHost], procs: Procs, tmp_path: Path
) -> None:
    a, b = hosts(tmp_path / "a"), hosts(tmp_path / "b")
    assert set(bases(a)).isdisjoint(bases(b))
    run_a = a.create("run-1")
    run_b = b.create("run-1")  # the same run name on another Hand
    pa = procs.spawn(run_a, ["sleep", "300"])
    pb = procs.spawn(run_b, ["sleep", "300"])
    await until(lambda: run_a.procs() == [pa.pid] and run_b.procs() == [pb.pid], WAIT_S, "both sleeps")
    a_again = hosts(tmp_path / "a")  # A restarts and sweeps
    assert a_again.leftovers() == ["run-1"]
    assert await a_again.sweep() == ["run-1"]
    assert await exited(pa) == -signal.SIGKILL
    assert pb.poll() is None and pid_alive(pb.pid)
    assert run_b.procs() == [pb.pid] and all(path.is_dir() for path in run_b.dirs.values())
    assert b.leftovers() == ["run-1"]
    await run_b.close()
    assert await exited(pb) == -signal.SIGKILL


# --- the v1 freezer kill -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_v1_freezer_kill_ends_a_tree_with_an_escapee(procs: Procs, tmp_path: Path) -> None:
    mount = CGROUP_FS / "freezer"
    if not (mount / "freezer.state").exists() and not (mount / "cgroup.procs").exists():
        pytest.skip("no v1 freezer hierarchy on this machine")
    base = mount / instance_of(tmp_path)
    base.mkdir()
    host = CgroupHost("v1", None, {"freezer": base}, limits=())
    try:
        assert host.kill_mode == "freezer"
        cg = host.create("run-frozen")
        assert set(cg.dirs) == {"freezer"}
        p = procs.sh(cg, "trap '' TERM; setsid sleep 300 & (sleep 300 &); exec sleep 300")

        def three_sleeps() -> bool:
            ps = cg.procs()
            return len(ps) == 3 and all(comm(pid) == "sleep" for pid in ps)

        await until(three_sleeps, WAIT_S, "three sleeps in the freezer cgroup")
        pids = cg.procs()
        assert p.pid in pids and all(ignores(pid, signal.SIGTERM) for pid in pids)
        cg.kill()
        assert await cg.wait_empty(WAIT_S)
        assert (base / "run-frozen" / "freezer.state").read_text().strip() == "THAWED"
        await until(lambda: none_alive(pids), WAIT_S, "the frozen tree gone from /proc")
        assert await exited(p) == -signal.SIGKILL
        await cg.close()
        assert not (base / "run-frozen").exists()
        host.release()
        assert not base.exists()
    finally:
        if base.exists():
            await host.sweep()
            host.release()
    assert not base.exists()


# --- a run as another user -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_child_that_dropped_root_still_joins(host: CgroupHost, procs: Procs) -> None:
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    cg = host.create("run-as", CgroupLimits(pids=10))
    # subprocess switches the user before the preexec_fn: the join writes as nobody, through
    # descriptors root opened
    p = procs.spawn(cg, ["sleep", "300"], user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/")
    await until(lambda: comm(p.pid) == "sleep", WAIT_S, "the sleep to exec")
    assert status_field(p.pid, "Uid").split()[0] == str(user.pw_uid)
    assert cg.procs() == [p.pid]
    places = cgroup_places(p.pid)
    if host.unified is not None:
        assert places["unified"].endswith(f"/{host.unified.name}/run-as")
    assert in_run(p.pid, cg)
    await cg.close()
    assert await exited(p) == -signal.SIGKILL
    assert not any(path.exists() for path in cg.dirs.values())
