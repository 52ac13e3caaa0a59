"""The `limits` figure (issue 39, DESIGN §20): what a cgroup per run costs and what it buys.

One Mind and two Hands on this machine: `cg` (a cgroup per run, the default where the Hand may) and
`pg` (`hand run --cgroups off`: the process-group kill). Three figures, each against the other Hand
in the same run:
- `exec -- true` p50 through the client library, interleaved round by round (target: +<= 1 ms);
- survivors after trials of four escapes cancelled through the client (setsid, a double fork, a
  daemon, a fork bomb bounded by `limits.pids`): every process of the trial carries a tag in its
  command line, counted in /proc the moment the run's end arrives (target 0; the `pg` Hand shows
  what escapes without a cgroup, the fork bomb excepted: unbounded there);
- the time from the client's cancel to that end (the end is reported only once the cgroup is
  empty), p50 and p99.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from benchlib.core import Ctx, Row, med, ms, pct, spread, verdict
from benchlib.figures import client, figure, flat, procs_with, run, sequential_calls, until_procs, wait_running
from hand.system.cgroups import instance_of
from protocol.states import RunState

PYTHON = shutil.which("python3") or sys.executable
DAEMON = (
    "import os, sys\n"
    "if os.fork(): sys.exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): sys.exit(0)\n"
    "os.chdir('/')\n"
    "os.closerange(0, 256)\n"
    "os.execvp('sleep', ['sleep', sys.argv[1]])\n"
)
"""A daemon as service scripts make one: double fork, its own session, `/`, no descriptors; then
`sleep TAG`, so the trial knows it is there once two `sleep TAG` run."""
BOMB = (
    "import os, time\n"
    "while True:  # {tag}\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError:\n"
    "        time.sleep(0.01)\n"
)
"""Every process forks as fast as it can for ever: only `limits.pids` bounds it."""
ESCAPES: dict[str, tuple[str, int]] = {
    "setsid": ("setsid sleep {tag} & sleep {tag}", 2),
    "double fork": ("(sleep {tag} &); sleep {tag}", 2),
    "daemon": (f'{PYTHON} -c "{DAEMON}" {{tag}}; sleep {{tag}}', 2),
    "fork bomb": (f'{PYTHON} -c "{BOMB}"', 8),
}
"""A command per escape (`{tag}` is a number unique to the trial, in every process's command line)
and how many processes show it has started: `sleep TAG` processes, or for the fork bomb any
process carrying the tag."""
BOMB_PIDS = 64


def sleeps(tag: str) -> int:
    """Live `sleep TAG` processes."""
    want = b"sleep\0" + tag.encode() + b"\0"
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() != want:
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X"):
            count += 1
    return count


async def until_started(tag: str, want: int, by_sleeps: bool, timeout: float = 10.0) -> None:
    if not by_sleeps:
        return await until_procs(tag, want, timeout)
    deadline = time.monotonic() + timeout
    while sleeps(tag) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the escape for {tag} did not start")
        await asyncio.sleep(0.002)


LEAK_RUNS = 10_000


async def many_runs(cl, hand: str, n: int, inflight: int = 4) -> None:
    """`n` runs of `true` on `hand`, `inflight` at a time, each checked."""
    async with await client(cl) as mc:

        async def worker(k: int) -> None:
            for _ in range(k):
                end = await mc.exec(hand, "exec", {"argv": ["true"]})
                if end.state is not RunState.SUCCEEDED:
                    raise RuntimeError(f"true ended {end.state.value}: {end.error or end.reason}")

        each, extra = divmod(n, inflight)
        await asyncio.gather(*(worker(each + (1 if i < extra else 0)) for i in range(inflight)))


def kill_tagged(tag: str) -> None:
    """SIGKILL every process whose command line holds `tag` (what escaped the reference Hand)."""
    needle = tag.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            continue


async def trials(cl, hand: str, kinds: list[str], n: int) -> tuple[dict[str, int], list[float]]:
    """`n` trials of each escape in `kinds` on `hand`: start, wait for the escape, cancel, wait for
    the end; survivors counted at once. Returns survivors per kind and the cancel -> end times."""
    survivors = dict.fromkeys(kinds, 0)
    times: list[float] = []
    async with await client(cl) as mc:
        for i in range(n):
            for kind in kinds:
                command, started = ESCAPES[kind]
                tag = f"100.{os.getpid()}{i:05d}{kinds.index(kind)}{len(hand)}"
                limits = {"pids": BOMB_PIDS} if kind == "fork bomb" else {}
                args = {"command": command.format(tag=tag), **({"limits": limits} if limits else {})}
                h = await mc.start(hand, "shell", args, timeout=300, grace=0.5)
                await wait_running(h, 10)
                await until_started(tag, started, kind != "fork bomb")
                t0 = time.perf_counter()
                await h.cancel()
                end = await h.wait()
                times.append((time.perf_counter() - t0) * 1000)
                survivors[kind] += procs_with(tag)
                if end.state is not RunState.CANCELLED:
                    raise RuntimeError(f"{kind}: the cancelled run ended {end.state.value}")
                kill_tagged(tag)  # the reference Hand's escapees: not left running
    return survivors, times


@figure("limits", "a cgroup per run: exec p50 with and without, escapes surviving a cancel, cancel -> end")
def fig_limits(ctx: Ctx) -> list[Row]:
    cl = ctx.cluster("limits")
    cl.start_mind()
    cl.start_hand("cg")
    cl.start_hand("pg", "--cgroups", "off")
    cl.wait_connected("cg")
    cl.wait_connected("pg")
    info = {h["name"]: h for h in cl.hands_json()}
    if info["cg"].get("cgroups") in (None, "none"):
        ctx.note("limits", "this machine gives the Hand no cgroups: nothing to measure")
        return [Row("limits", "exec -- true p50 with a cgroup per run", "n/a", verdict="n/a")]
    n = 100 if ctx.quick else 300
    cg_r, pg_r = [], []
    for _ in range(ctx.rounds):
        cg_r.append(run(sequential_calls(cl, "cg", "exec", {"argv": ["true"]}, n=n, warm=10), 180))
        pg_r.append(run(sequential_calls(cl, "pg", "exec", {"argv": ["true"]}, n=n, warm=10), 180))
    cg, pg = flat(cg_r), flat(pg_r)
    c50, p50 = med(cg), med(pg)
    per_kind = 5 if ctx.quick else 250
    kinds = list(ESCAPES)
    cg_left, cancel_ms = run(trials(cl, "cg", kinds, per_kind), 3600)
    pg_left, _ = run(trials(cl, "pg", kinds[:3], max(2, per_kind // 10)), 600)
    ctx.note(
        "limits",
        f"hybrid/v2 host: {info['cg'].get('cgroups')}, limits {info['cg'].get('limits')}; exec through the "
        f"client library, {n} calls a round each; escapes {', '.join(kinds)} ({per_kind} trials each, "
        f"the fork bomb under limits.pids={BOMB_PIDS}), survivors per kind with a cgroup {cg_left}, "
        f"without (--cgroups off, {max(2, per_kind // 10)} trials each, no bomb) {pg_left}",
    )
    total = sum(cg_left.values())
    trials_n = per_kind * len(kinds)
    instance = instance_of(cl.hands["cg"].state_dir)
    runs_n = (n + 10) * ctx.rounds + trials_n  # on the cgroup Hand
    if not ctx.quick and runs_n < LEAK_RUNS:  # the "10,000 runs in a row"
        run(many_runs(cl, "cg", LEAK_RUNS - runs_n), 600)
        runs_n = LEAK_RUNS
    dirs = [p for p in Path("/sys/fs/cgroup").rglob(f"{instance}/*") if p.is_dir()]
    return [
        Row(
            "limits",
            "exec -- true p50 ms, a cgroup per run",
            ms(c50),
            ms(pct(cg, 99)),
            spread([med(r) for r in cg_r], ms),
            f"{ms(p50)} without (--cgroups off)",
            f"+{ms(c50 - p50)} ms",
            "+<= 1 ms",
            verdict(c50 - p50 <= 1.0),
        ),
        Row(
            "limits",
            f"processes surviving a cancel, {trials_n:,} trials" + (" (quick)" if ctx.quick else ""),
            str(total),
            "",
            "",
            f"{sum(pg_left.values())} without a cgroup ({max(2, per_kind // 10) * 3} trials)",
            "",
            "0",
            verdict(total == 0),
        ),
        Row(
            "limits",
            f"cgroup directories left after {runs_n:,} runs",
            str(len(dirs)),
            "",
            "",
            "",
            "",
            "0",
            verdict(not dirs),
        ),
        Row(
            "limits",
            "cancel -> end (nothing left) p50 ms",
            ms(med(cancel_ms)),
            ms(pct(cancel_ms, 99)),
            "",
            "",
            "",
            "info",
            "info",
        ),
    ]
