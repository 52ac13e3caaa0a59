"""CPU time of a whole process tree, spent as a budget (DESIGN §6, seed 000: reserve before spending).

A run's `cpu_seconds` limit is a budget for the tree, not for each process: two processes burning
in parallel spend it twice as fast as one. The kernel has no such limit (RLIMIT_CPU is per process;
a cgroup would do it but needs privileges and setup the Hand cannot assume), so the Hand measures:
every `CPU_POLL_S` it sums, over every process of the run's process group or session still in
/proc (zombies included), utime + stime (its own CPU) + cutime + cstime (the CPU of the children it
has reaped), and reserves the increase on the run's budget. A reservation that does not fit ends
the run (`RunControl.exhaust`: the fact first, then the cancel broadcast that kills the tree).

The sum is a lower bound and not monotonic: a member that is reaped by its parent moves from its
own line to the parent's cutime, but one reaped by someone outside the tree (an orphan adopted by
init), or that left the session with `setsid`, is no longer seen. So the meter charges a high-water
mark: what was seen once is spent for good, and only increases are reserved. The overshoot is at
most one poll interval of the tree's CPU (plus RLIMIT_CPU as a per-process backstop, see
`hand.system.sandbox.rlimit_plan`).

`parse_stat`, `tree_ticks` and `CpuMeter` are pure and unit-tested; `read_tree_seconds` reads
/proc (in a thread); `watch_cpu` is the small asyncio loop around them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hand.core.cpu import CPU_SECONDS as CPU_SECONDS
from hand.system.cgroups import RunCgroup  # the budget kind, named where it is metered

CPU_POLL_S = 0.2
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    session: int
    own_ticks: int
    """utime + stime: fields 14 and 15 of /proc/PID/stat."""
    children_ticks: int
    """cutime + cstime: fields 16 and 17, the CPU of children this process has waited for."""


def parse_stat(data: bytes) -> ProcStat | None:
    """One /proc/PID/stat line, or None if it is not one. The command name (field 2) may hold
    spaces and parentheses, so fields are counted from the LAST ')'."""
    try:
        pid = int(data[: data.index(b"(")])
        fields = data[data.rindex(b")") + 2 :].split()
        return ProcStat(
            pid=pid,
            state=fields[0].decode("ascii", "replace"),
            pgrp=int(fields[2]),
            session=int(fields[3]),
            own_ticks=int(fields[11]) + int(fields[12]),
            children_ticks=int(fields[13]) + int(fields[14]),
        )
    except (ValueError, IndexError):
        return None


def tree_ticks(stats: Iterable[ProcStat], leader: int) -> int:
    """CPU ticks of the tree whose group and session leader is `leader` (the run's child, started
    with `start_new_session`): members that left the group but not the session still count."""
    return sum(s.own_ticks + s.children_ticks for s in stats if s.pgrp == leader or s.session == leader)


def read_tree_seconds(leader: int, proc: str = "/proc") -> float:
    """Blocking: scan `proc` and return the tree's CPU seconds (0.0 where /proc does not exist)."""
    stats: list[ProcStat] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return 0.0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                parsed = parse_stat(f.read())
        except OSError:  # gone meanwhile
            continue
        if parsed is not None:
            stats.append(parsed)
    return tree_ticks(stats, leader) / CLK_TCK


class CpuMeter:
    """High-water mark of a non-monotonic lower bound: returns only what was not charged yet."""

    def __init__(self) -> None:
        self.seen = 0.0

    def advance(self, total: float) -> float:
        if total <= self.seen:
            return 0.0
        delta, self.seen = total - self.seen, total
        return delta


def tree_reader(cgroup: RunCgroup | None) -> Callable[[int], float]:
    """How a run's CPU is read: its cgroup's count where it has one (exact: what left the group
    and what exited count too), else a scan of /proc by its group and session."""
    if cgroup is None:
        return read_tree_seconds

    def read(leader: int) -> float:
        seconds = cgroup.cpu_seconds()
        return seconds if seconds is not None else read_tree_seconds(leader)

    return read


async def watch_cpu(
    leader: Callable[[], int | None],
    charge: Callable[[float], bool],
    interval: float = CPU_POLL_S,
    read: Callable[[int], float] = read_tree_seconds,
) -> None:
    """Every `interval`, charge the tree's new CPU seconds; stop when `charge` returns False (the
    budget is spent, or the run already ended). Runs until then or until cancelled; `leader()` is
    None until the child has started."""
    meter = CpuMeter()
    while True:
        await asyncio.sleep(interval)
        pid = leader()
        if pid is None:
            continue
        delta = meter.advance(await asyncio.to_thread(read, pid))
        if delta > 0 and not charge(delta):
            return


async def stop_watching(watcher: asyncio.Task[None]) -> BaseException | None:
    """Cancel `watcher` and wait for it to end (never swallowing a cancellation of the caller);
    return the exception it failed with, if any, so its owner sees it."""
    watcher.cancel()
    await asyncio.wait({watcher})
    return None if watcher.cancelled() else watcher.exception()
