"""A cgroup per run (DESIGN §20): a kill nothing escapes, limits that mean what they say, and what
the run used.

A process group is not a run: `setsid`, a double fork or a daemon leaves it, and `cancelled` would
be a lie while what the run started goes on. A cgroup follows every descendant whatever it does
(short of a privileged process that moves itself out: a root run can, a `--run-as` one cannot).

**Where.** Each run gets a directory `<base>/run-<id>` (a task `task-<id>`) in every hierarchy the
Hand uses, where `<base>` is `mindhand.<instance>` under the Hand's own cgroup (or under
`hand run --cgroup-root PATH`, a delegated subtree) and `<instance>` is derived from the Hand's state
directory: stable across restarts, so a Hand that starts after a crash finds what its previous life
left (`leftovers`), and distinct between Hands on one machine, so one never touches another's runs.
The Hand itself stays in its own cgroup: the one it kills is never its own.

**Layouts** (`detect`), as machines have them today:
- `v2`: the unified hierarchy with its controllers. Kill: `cgroup.kill`. Limits: `memory.max`,
  `pids.max`, `cpu.max`, when the base can enable them for its children (a cgroup that holds
  processes cannot: give a delegated `--cgroup-root`). Usage: `cpu.stat`, `memory.peak`,
  `memory.events`, `pids.peak`.
- `hybrid`: v1 controllers (`memory`, `pids`, `cpu`, `freezer`) beside a v2 tree mounted without
  controllers but with `cgroup.kill` (our development and CI machines). Kill and membership in the
  v2 tree, limits and usage in the v1 controllers (`memory.limit_in_bytes`, `pids.max`,
  `cpu.cfs_quota_us`; `memory.max_usage_in_bytes`, `memory.oom_control`, `pids.peak`).
- `v1`: no v2 tree at all; the kill is freeze, SIGKILL every member, thaw (the v1 freezer).
- `none`: no privilege (or `--cgroups off`): runs keep the process-group kill, and say so.

**Joining before exec.** The child writes `0` to each run directory's `cgroup.procs` between fork
and exec (a `preexec_fn`), through descriptors the parent opened beforehand (so the child does no
path lookup, and a `--run-as` child that already dropped root still may: the kernel checks the
opener's credentials). The child is in its cgroup before the first instruction of the command:
no window in which a fork escapes.

**Gone.** A run is over when its cgroup has no process left (`cgroup.procs` empty: an exited
process leaves it at exit, so a zombie awaiting its reaper does not count). The kill ends with a
wait for that, bounded by `REAP_BOUND_S` (a process stuck in the kernel).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from protocol.errors import MindhandError
from protocol.messages import Usage

Layout = Literal["v2", "hybrid", "v1", "none"]
Limit = Literal["memory", "pids", "cpus"]
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
CPU_PERIOD_US = 100_000
REAP_BOUND_S = 5.0
"""How long a killed cgroup may take to empty before the run's end is reported anyway (a process
stuck in uninterruptible sleep); the directory is then left for the next sweep."""
FIRST_POLL_S = 0.0005
POLL_S = 0.01
PREFIX = "mindhand."


class CgroupError(MindhandError, OSError):
    """A run's cgroup could not be set up; the message is safe to send."""


@dataclass(frozen=True)
class CgroupLimits:
    memory: int | None = None
    """Bytes of memory the run's processes may use together (not address space)."""
    pids: int | None = None
    """Processes and threads at once."""
    cpus: float | None = None
    """CPU share: 0.5 is half of one CPU."""

    def wanted(self) -> list[Limit]:
        out: list[Limit] = []
        if self.memory is not None:
            out.append("memory")
        if self.pids is not None:
            out.append("pids")
        if self.cpus is not None:
            out.append("cpus")
        return out


@dataclass(frozen=True)
class CgroupHost:
    """What this Hand found at start, and where its runs' cgroups go."""

    layout: Layout
    unified: Path | None = None
    """The base directory in the v2 tree (kill, membership, CPU usage; limits in `v2`)."""
    v1: dict[str, Path] = field(default_factory=dict)
    """Controller -> base directory in that v1 hierarchy."""
    v2_controllers: frozenset[str] = frozenset()
    """Controllers the v2 base enables for its children (`v2` only)."""
    limits: tuple[Limit, ...] = ()
    why: str = ""
    """Why the layout is `none`, or what is missing."""
    v2_kill: bool = False
    """The v2 tree's cgroups have `cgroup.kill` (else the kill is the v1 freezer's)."""

    @property
    def enabled(self) -> bool:
        return self.layout != "none"

    @property
    def kill_mode(self) -> str:
        if self.layout == "none":
            return "process group"
        return "cgroup.kill" if self.v2_kill else "freezer"

    def describe(self) -> str:
        """One line for `hand run`'s start."""
        if not self.enabled:
            return (
                f"cgroups: none ({self.why}); kill: process group (descendants that leave it may survive); limits: none"
            )
        where = []
        if self.unified is not None:
            where.append(f"v2 {self.unified}")
        where += [f"v1 {name}" for name in sorted(self.v1)]
        limits = ", ".join(self.limits) or "none"
        return f"cgroups: {self.layout} ({'; '.join(where)}); kill: {self.kill_mode}; limits: {limits}"

    def _dirs(self, name: str, want: CgroupLimits | None = None) -> dict[str, Path]:
        """Where run `name`'s cgroup is, in every hierarchy; with `want`, where it is made. A v1
        `cpu` hierarchy only for a run with a CPU share: without a quota of its own nothing of the
        run is throttled there, and joining it cost every run ~0.25 ms (the shim's write of
        `cgroup.procs`, measured: unified 80 us, memory 170, pids 90, cpu 240). Its `throttled_s`
        is then not counted (None), as on a host without the hierarchy."""
        dirs: dict[str, Path] = {}
        if self.unified is not None:
            dirs["unified"] = self.unified / name
        for ctrl, base in self.v1.items():
            if ctrl == "cpu" and want is not None and want.cpus is None:
                continue
            dirs[ctrl] = base / name
        return dirs

    def refusal(self, want: CgroupLimits) -> str | None:
        """Why a run asking `want` cannot have it here (None: it can)."""
        missing = [name for name in want.wanted() if name not in self.limits]
        if not missing:
            return None
        names = ", ".join(f"limits.{m}" for m in missing)
        why = self.why or "its cgroups have no controller for it"
        return f"{names} cannot be enforced on this hand (cgroups: {self.layout}; {why})"

    def create(self, name: str, want: CgroupLimits | None = None) -> RunCgroup:
        """Make the run's cgroup with its limits set, before the child starts. Raises CgroupError
        (nothing left behind) when it cannot be made or a limit cannot be written."""
        want = want or CgroupLimits()
        why = self.refusal(want)
        if why is not None:
            raise CgroupError(why)
        cg = RunCgroup(name, self._dirs(name, want), self)
        made: list[Path] = []
        try:
            for path in cg.dirs.values():
                try:
                    path.parent.mkdir()
                except FileExistsError:
                    pass
                else:
                    if self.layout == "v2" and path.parent == self.unified:
                        _enable_v2(path.parent)  # a new base: its children get the controllers
                try:
                    path.mkdir()
                except FileExistsError:  # a previous life's, swept late: empty it and reuse it
                    pass
                made.append(path)
            cg.set_limits(want)
        except OSError as exc:
            for path in made:
                _rmdir(path)
            raise CgroupError(f"cannot set up the run's cgroup: {exc.strerror or exc}") from None
        return cg

    def leftovers(self) -> list[str]:
        """Run cgroups a previous life of this Hand left (found by name)."""
        names: set[str] = set()
        for base in ([self.unified] if self.unified is not None else []) + list(self.v1.values()):
            try:
                names.update(p.name for p in base.iterdir() if p.is_dir())
            except OSError:
                continue
        return sorted(names)

    async def sweep(self) -> list[str]:
        """Kill what the previous life's runs left and remove their cgroups; the names swept."""
        swept = []
        for name in self.leftovers():
            cg = RunCgroup(name, {k: v for k, v in self._dirs(name).items() if v.is_dir()}, self)
            await cg.close()
            swept.append(name)
        return swept

    def release(self) -> None:
        """At a clean stop: remove the (empty) base directories."""
        for base in ([self.unified] if self.unified is not None else []) + list(self.v1.values()):
            _rmdir(base)


NO_CGROUPS = CgroupHost("none", why="not detected")


class RunCgroup:
    """One run's cgroup: join it (in the child), signal and kill it, wait until it is empty, read
    what it used, remove it."""

    def __init__(self, name: str, dirs: dict[str, Path], host: CgroupHost) -> None:
        self.name = name
        self.dirs = dirs
        self.host = host
        self.usage: Usage | None = None
        """Read by `close`: what the run used, as of its end."""
        self.left: int = 0
        """Processes still there when `close` gave up waiting (0: it emptied)."""
        self._fds: list[int] = []

    @property
    def _member_dir(self) -> Path:
        return self.dirs.get("unified") or self.dirs.get("freezer") or next(iter(self.dirs.values()))

    # --- setup ---

    def set_limits(self, want: CgroupLimits) -> None:
        v2 = self.dirs.get("unified") if self.host.layout == "v2" else None
        if want.memory is not None:
            if v2 is not None:
                _write(v2 / "memory.max", want.memory)
                _write_optional(v2 / "memory.swap.max", 0)
            else:
                mem = self.dirs["memory"]
                _write(mem / "memory.limit_in_bytes", want.memory)
                _write_optional(mem / "memory.memsw.limit_in_bytes", want.memory)
        if want.pids is not None:
            _write((v2 or self.dirs["pids"]) / "pids.max", want.pids)
        if want.cpus is not None:
            quota = max(1000, int(want.cpus * CPU_PERIOD_US))
            if v2 is not None:
                _write(v2 / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                cpu = self.dirs["cpu"]
                _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
                _write(cpu / "cpu.cfs_quota_us", quota)

    def open_join(self) -> tuple[int, ...]:
        """Descriptors on every `cgroup.procs` of the run, for the child to write `0` to (see
        `join`); closed by `closed_join` once the child has started."""
        try:
            for path in self.dirs.values():
                self._fds.append(os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError as exc:
            self.closed_join()
            raise CgroupError(f"cannot open the run's cgroup: {exc.strerror or exc}") from None
        return tuple(self._fds)

    def closed_join(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    # --- membership and the kill ---

    def procs(self) -> list[int]:
        """The pids in the cgroup now ([] when empty or gone)."""
        try:
            data = _read(self._member_dir / "cgroup.procs")
        except OSError:
            return []
        return [int(x) for x in data.split()]

    def signal(self, sig: int) -> int:
        """Send `sig` to every process in the cgroup; how many there were."""
        pids = self.procs()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return len(pids)

    def kill(self) -> None:
        """SIGKILL everything in it, including what forks meanwhile."""
        unified = self.dirs.get("unified")
        if unified is not None and self.host.v2_kill:
            try:
                _write(unified / "cgroup.kill", 1)
                return
            except OSError:
                pass
        freezer = self.dirs.get("freezer")
        if freezer is None:
            self.signal(signal.SIGKILL)
            return
        _freeze_kill(freezer)

    async def wait_empty(self, timeout: float) -> bool:
        """Until no process is left (True) or `timeout` seconds pass (False)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        delay = FIRST_POLL_S
        while self.procs():
            if loop.time() >= until:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_S)
        return True

    async def empty(self, grace: float, *, termed: bool = False) -> int:
        """Make sure nothing of the run is left: SIGTERM (unless `termed`) and `grace` seconds to go,
        then the kill, then the wait for empty. How many processes were there at the start."""
        there = len(self.procs())
        if not there:
            return 0
        if not termed:
            self.signal(signal.SIGTERM)
            self.signal(signal.SIGCONT)
            if grace > 0 and await self.wait_empty(grace):
                return there
        self.kill()
        if not await self.wait_empty(REAP_BOUND_S):
            self.left = len(self.procs())
        return there

    def cpu_seconds(self) -> float | None:
        """CPU (user + system) of everything the run ran, exited processes included: exact and
        escape-proof, unlike a /proc scan of the process group (`hand.system.cputime`)."""
        unified = self.dirs.get("unified")
        if unified is None:
            return None
        usec = _keyed(unified / "cpu.stat").get("usage_usec")
        return usec / 1e6 if usec is not None else None

    # --- the end ---

    def read_usage(self) -> Usage:
        d = self.dirs
        v2 = d.get("unified") if self.host.layout == "v2" else None
        user = system = throttled = None
        unified = d.get("unified")
        if unified is not None:
            stat = _keyed(unified / "cpu.stat")
            if "user_usec" in stat:
                user, system = stat["user_usec"] / 1e6, stat.get("system_usec", 0) / 1e6
            if v2 is not None and "throttled_usec" in stat:
                throttled = stat["throttled_usec"] / 1e6
        if "cpu" in d:
            stat = _keyed(d["cpu"] / "cpu.stat")
            if "throttled_time" in stat:
                throttled = stat["throttled_time"] / 1e9
        peak = oom = pids = None
        if v2 is not None:
            peak = _int(v2 / "memory.peak")
            oom = _keyed(v2 / "memory.events").get("oom_kill")
            pids = _int(v2 / "pids.peak")
        if "memory" in d:
            peak = _int(d["memory"] / "memory.max_usage_in_bytes")
            oom = _keyed(d["memory"] / "memory.oom_control").get("oom_kill")
        if "pids" in d:
            pids = _int(d["pids"] / "pids.peak")
        return Usage(
            cpu_user_s=user, cpu_system_s=system, memory_peak=peak, pids_peak=pids, oom_kills=oom, throttled_s=throttled
        )

    async def close(self, grace: float = 0.0, *, remove_soon: bool = False) -> Usage:
        """After the run: kill anything left, read the usage, remove the directories. Never raises
        for a directory that cannot be removed (the next sweep does it). `remove_soon`: remove them
        in the loop's next turn instead, after the caller has sent the run's end (a foreground run's
        latency: the removal is ~0.1 ms of `rmdir`s)."""
        self.closed_join()
        await self.empty(grace, termed=grace <= 0)
        self.usage = self.read_usage()
        if remove_soon:
            asyncio.get_running_loop().call_soon(self.remove)
        else:
            self.remove()
        return self.usage

    def remove(self, retry: bool = True) -> None:
        """Remove the directories; one that is still busy (the last exit still being accounted) is
        tried once more 10 ms later, then left to the next start's sweep."""
        busy = [path for path in self.dirs.values() if not _rmdir(path)]
        if busy and retry:
            asyncio.get_running_loop().call_later(0.01, self.remove, False)


# --- detection -------------------------------------------------------------------------------------


def instance_of(state_dir: Path | str) -> str:
    """A Hand's cgroup name: the same for every life of the Hand on this state directory."""
    real = os.path.realpath(state_dir)
    return PREFIX + hashlib.sha256(real.encode()).hexdigest()[:16]


def detect(
    instance: str,
    *,
    root: str | None = None,
    mounts: str = "/proc/self/mounts",
    own: str = "/proc/self/cgroup",
) -> CgroupHost:
    """Find the hierarchies, this process's place in them, and what a run's cgroup can do here.
    Creates the base directories (the check that we may). Never raises: what cannot be had is
    `none`, with the reason."""
    try:
        table = Path(mounts).read_text()
        places = Path(own).read_text()
    except OSError as exc:
        return CgroupHost("none", why=f"cannot read {mounts}: {exc.strerror or exc}")
    v2_mount, v1_mounts = _mount_points(table.splitlines())
    v2_place, v1_places = _places(places.splitlines())
    unified: Path | None = None
    can_kill_v2 = False
    notes: list[str] = []
    if v2_mount is not None:
        base = _base(v2_mount, root if root is not None else v2_place, instance)
        why, can_kill_v2 = _probe(base)
        if why is None:
            unified = base
        else:
            notes.append(f"v2 tree: {why}")
    v1: dict[str, Path] = {}
    for ctrl in V1_CONTROLLERS:
        mount = v1_mounts.get(ctrl)
        if mount is None:
            continue
        base = _base(mount, root if root is not None else v1_places.get(ctrl, "/"), instance)
        made = _make(base)
        if made is None:
            v1[ctrl] = base
        else:
            notes.append(f"v1 {ctrl}: {made}")
    if not can_kill_v2 and "freezer" not in v1:
        for base in ([unified] if unified is not None else []) + list(v1.values()):
            _rmdir(base)
        why = "; ".join(notes) or "no cgroup.kill and no v1 freezer"
        return CgroupHost("none", why=why)
    controllers: frozenset[str] = frozenset()
    if unified is not None and not v1:
        controllers = _probe_v2(unified)
        layout: Layout = "v2"
        limits = [
            name for name, ctrl in (("memory", "memory"), ("pids", "pids"), ("cpus", "cpu")) if ctrl in controllers
        ]
        if len(limits) < 3:
            notes.append("the v2 base cannot enable memory, pids and cpu for its children")
    else:
        layout = "hybrid" if unified is not None else "v1"
        if not can_kill_v2:
            unified = None  # membership and kill by the freezer
        limits = [name for name, ctrl in (("memory", "memory"), ("pids", "pids"), ("cpus", "cpu")) if ctrl in v1]
        if unified is not None and "freezer" in v1:  # cgroup.kill does what the freezer would
            _rmdir(v1.pop("freezer"))
    return CgroupHost(layout, unified, v1, controllers, tuple(limits), "; ".join(notes), can_kill_v2)  # type: ignore[arg-type]


def _mount_points(lines: Iterable[str]) -> tuple[Path | None, dict[str, Path]]:
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        fstype, where, options = parts[2], parts[1], parts[3].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(where)
        elif fstype == "cgroup":
            for ctrl in V1_CONTROLLERS:
                if ctrl in options and ctrl not in v1:
                    v1[ctrl] = Path(where)
    return v2, v1


def _places(lines: Iterable[str]) -> tuple[str, dict[str, str]]:
    v2 = "/"
    v1: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for ctrl in parts[1].split(","):
            v1[ctrl] = parts[2]
    return v2, v1


def _base(mount: Path, place: str, instance: str) -> Path:
    return mount / place.strip("/") / instance if place.strip("/") else mount / instance


def _make(base: Path) -> str | None:
    """Check we may make `base` and children in it; None when all is well, else why not. Leaves
    nothing behind that was not there: a base appears with its first run (`create`), and a Hand
    whose configuration is only checked leaves no directory in the cgroup tree."""
    return _probe(base)[0]


def _probe(base: Path) -> tuple[str | None, bool]:
    """`_make`, and whether a child cgroup there has `cgroup.kill` (v2, Linux >= 5.14; the root
    cgroup itself never has one, so only a child can tell)."""
    made = False
    kill = False
    try:
        try:
            base.mkdir()
            made = True
        except FileExistsError:
            pass
        probe = base / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        kill = (probe / "cgroup.kill").exists()
        probe.rmdir()
    except OSError as exc:
        return exc.strerror or str(exc), False
    finally:
        if made and _has_no_children(base):
            _rmdir(base)
    return None, kill


def _has_no_children(path: Path) -> bool:
    try:
        return not any(p.is_dir() for p in path.iterdir())
    except OSError:
        return False


def _probe_v2(base: Path) -> frozenset[str]:
    """What `_enable_v2` would get for a base (made for the check, removed again if new)."""
    made = False
    try:
        base.mkdir()
        made = True
    except FileExistsError:
        pass
    except OSError:
        return frozenset()
    try:
        return _enable_v2(base)
    finally:
        if made and _has_no_children(base):
            _rmdir(base)


def _enable_v2(base: Path) -> frozenset[str]:
    """Enable memory, pids and cpu for the runs under `base` (every ancestor up to the mount must
    have them too); what it got."""
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()
    want = [c for c in ("memory", "pids", "cpu") if c in available]
    if want:
        try:
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in want))
        except OSError:
            return frozenset()
    try:
        return frozenset((base / "cgroup.subtree_control").read_text().split())
    except OSError:
        return frozenset()


# --- files -------------------------------------------------------------------------------------------


def _write(path: Path, value: object) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _write_optional(path: Path, value: object) -> None:
    """A file some kernels lack (no swap accounting): skipped when it does not exist."""
    try:
        _write(path, value)
    except FileNotFoundError:
        pass


def _read(path: Path) -> bytes:
    """A small control file in one `read` (no buffered file object: these are read on every run)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 65536)
        if len(data) < 4096:  # kernfs answers a small file in one read
            return data
        parts = [data]
        while chunk := os.read(fd, 65536):  # a long cgroup.procs (a fork bomb's thousands of pids)
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _int(path: Path) -> int | None:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.events, memory.oom_control)."""
    out: dict[str, int] = {}
    try:
        text = _read(path)
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(b" ")
        try:
            out[key.decode()] = int(value)
        except ValueError:
            continue
    return out


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        return exc.errno == errno.ENOENT
    return True


def _freeze_kill(freezer: Path) -> None:
    """The v1 kill: freeze (nothing can fork meanwhile), SIGKILL every member, thaw (a frozen
    process dies only once thawed)."""
    try:
        _write(freezer / "freezer.state", "FROZEN")
        until = time.monotonic() + 0.2
        while time.monotonic() < until:
            if (freezer / "freezer.state").read_text().strip() == "FROZEN":
                break
            time.sleep(0.001)
    except OSError:
        pass
    try:
        pids = [int(x) for x in (freezer / "cgroup.procs").read_bytes().split()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        _write(freezer / "freezer.state", "THAWED")
    except OSError:
        pass


SHELL = "/bin/sh"
_SHIM = 'unset PWD; for f do [ "$f" = + ] && break; echo 0 >"$f" || exit 125; shift; done; shift; exec "$@"'


def shim_argv(cg: RunCgroup, argv: list[str]) -> list[str]:
    """The argv that starts `argv` inside `cg` without a Python function in the forked child.

    Why: a `preexec_fn` makes `subprocess` fork the whole Hand instead of `vfork`ing it, which cost
    about 2 ms per run (measured: `true` 0.6 ms with vfork, 2.4 ms with a preexec function). A
    `/bin/sh` that writes `0` to each `cgroup.procs` and then `exec`s the command costs about
    0.7 ms, and the command still starts inside its cgroup: the shell forks nothing before it.
    For a run whose child cannot write those files itself (`--run-as`: a user, not root) the
    preexec function with descriptors opened by the Hand stays (`join`). The command keeps its
    argv[0], its environment (`PWD` is not added) and its PATH search; `check_program` makes a
    command that does not exist fail as it would without the shell."""
    return [SHELL, "-c", _SHIM, "sh", *(str(d / "cgroup.procs") for d in cg.dirs.values()), "+", *argv]


def shim_fits(argv: list[str], env: dict[str, str] | None) -> bool:
    """Can `shim_argv` start this command exactly as `subprocess` would? Not an argv[0] the shell's
    `exec` would read as an option, and not a `PWD` the shell would overwrite."""
    return bool(argv) and not argv[0].startswith("-") and (env is None or "PWD" not in env) and os.path.exists(SHELL)


def check_program(program: str, cwd: str | os.PathLike[str] | None, env: dict[str, str] | None) -> None:
    """Raise what `subprocess` raises for a command that cannot be executed (FileNotFoundError,
    PermissionError, with `filename` the program as given), before the shell is started."""
    if "/" in program:
        candidates = [os.path.join(cwd, program) if cwd is not None else program]
    else:
        candidates = [os.path.join(d or ".", program) for d in os.get_exec_path(env)]
    denied = False
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        denied = denied or os.path.exists(path)
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code), program)


def join(fds: tuple[int, ...], write: object = os.write) -> None:
    """Runs in the forked child before `exec`: enter the run's cgroups."""
    for fd in fds:
        write(fd, b"0")  # type: ignore[operator]
