"""The figures of `scripts/bench`. Each takes the run's `Ctx` and returns its table rows.

Every figure measures ours and its reference in the same run, interleaved round by round, and
reports the median (and p99 where there is a distribution) over all samples, plus the spread of the
per-round figure over the rounds. Processes are real (`mind serve`, `hand run` via
`mind/testing/cluster.py`), on loopback, and every one is stopped by PID.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchlib.core import PY, Ctx, Row, med, mib, ms, num, pct, ratio, rss_mib, secs, spread, verdict
from benchlib.relay import RelayClient
from mind.client.aio import MindClient, RunHandle, load_credential
from protocol.messages import RunEnd, RunUpdate
from protocol.states import RunState

RELAY_PY = str(Path(__file__).with_name("relay.py"))
HANDSIM_PY = str(Path(__file__).with_name("handsim.py"))
INFLIGHT = 64
READ = ("read_file", {"path": "small.txt"})

FIGURES: dict[str, Callable[[Ctx], list[Row]]] = {}
ABOUT: dict[str, str] = {}
USES_BASIC: set[str] = set()


def figure(name: str, about: str, basic: bool = False):
    def register(fn: Callable[[Ctx], list[Row]]) -> Callable[[Ctx], list[Row]]:
        FIGURES[name] = fn
        ABOUT[name] = about
        if basic:
            USES_BASIC.add(name)
        return fn

    return register


def release_unused(ctx: Ctx, remaining: list[str]) -> None:
    """Stop the shared Mind+Hand once no remaining figure uses it (it would ping in the background)."""
    if "basic" in ctx.shared and not USES_BASIC.intersection(remaining):
        ctx.shared.pop("basic").stop_all()


def run(coro: Awaitable[Any], timeout: float) -> Any:
    """asyncio.run with a bound."""

    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def flat(rounds: list[list[float]]) -> list[float]:
    return [x for r in rounds for x in r]


# --- shared resources ----------------------------------------------------------------------


def relay_url(ctx: Ctx) -> str:
    """The relay and its answering peer, each in its own process, started once per run."""
    if "relay" not in ctx.shared:
        d = ctx.dir("relay")
        relay = ctx.child("relay", [PY, RELAY_PY, "relay"], stdin=True, log=d / "relay.log")
        url = f"ws://127.0.0.1:{relay.read_json(30)['port']}"
        peer = ctx.child("relay-peer", [PY, RELAY_PY, "peer", url], stdin=True, log=d / "peer.log")
        peer.read_json(30)
        ctx.shared["relay"] = url
    return ctx.shared["relay"]


def hop_url(ctx: Ctx) -> str:
    """One more raw hop in front of the relay (`relay.py hop`), started once per run."""
    if "hop" not in ctx.shared:
        up = relay_url(ctx)
        hop = ctx.child("relay-hop", [PY, RELAY_PY, "hop", up], stdin=True, log=ctx.dir("relay-hop") / "hop.log")
        ctx.shared["hop"] = f"ws://127.0.0.1:{hop.read_json(30)['port']}"
    return ctx.shared["hop"]


async def relay_hop(direct: str, hopped: str, n: int, warm: int = 50) -> tuple[list[float], list[float]]:
    """(ms through the relay, ms through the hop and the relay), the same call alternating."""
    a, b = await RelayClient.connect(direct), await RelayClient.connect(hopped)
    try:
        await a.sequential(warm)
        await b.sequential(warm)
        own: list[float] = []
        other: list[float] = []
        for _ in range(n):
            own += await a.sequential(1)
            other += await b.sequential(1)
        return own, other
    finally:
        await a.close()
        await b.close()


async def relay_sequential(url: str, n: int, warm: int = 50) -> list[float]:
    c = await RelayClient.connect(url)
    try:
        await c.sequential(warm)
        return await c.sequential(n)
    finally:
        await c.close()


async def relay_pipelined(url: str, seconds: float) -> float:
    c = await RelayClient.connect(url)
    try:
        await c.sequential(50)
        done, elapsed = await c.pipelined(INFLIGHT, seconds)
        return done / elapsed
    finally:
        await c.close()


def relay_p50(ctx: Ctx) -> float:
    """The relay's sequential p50 of this run (measured now if the latency figure did not run)."""
    if not ctx.shared.get("relay_samples"):
        ctx.shared["relay_samples"] = run(relay_sequential(relay_url(ctx), 300), 60)
    return med(ctx.shared["relay_samples"])


def basic(ctx: Ctx):
    """One Mind and one Hand `bench` (a 100-byte small.txt in its root), shared by the figures that
    need nothing special."""
    if "basic" not in ctx.shared:
        cl = ctx.cluster("basic")
        cl.start_mind()
        cl.start_hand("bench")
        cl.wait_connected("bench")
        (cl.tmp / "root-bench" / "small.txt").write_bytes(b"x" * 100)
        ctx.shared["basic"] = cl
    return ctx.shared["basic"]


async def client(cl) -> MindClient:
    return await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred"))


async def sequential_calls(cl, hand: str, tool: str, args: dict, n: int, warm: int) -> list[float]:
    async with await client(cl) as mc:
        for _ in range(warm):
            await mc.exec(hand, tool, args)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            end = await mc.exec(hand, tool, args)
            out.append((time.perf_counter() - t0) * 1000)
            if end.state is not RunState.SUCCEEDED:
                raise RuntimeError(f"{tool} ended {end.state.value}: {end.error or end.reason}")
        return out


async def pipelined_calls(cl, hand: str, seconds: float) -> tuple[float, list[float]]:
    """INFLIGHT callers on one client, each calling read_file in a loop: (calls/s, latencies ms)."""
    async with await client(cl) as mc:
        await asyncio.gather(*(mc.exec(hand, *READ) for _ in range(INFLIGHT)))
        lat: list[float] = []
        t0 = time.perf_counter()
        end_at = t0 + seconds

        async def worker() -> None:
            while time.perf_counter() < end_at:
                t = time.perf_counter()
                end = await mc.exec(hand, *READ)
                lat.append((time.perf_counter() - t) * 1000)
                if end.state is not RunState.SUCCEEDED:
                    raise RuntimeError(f"read_file ended {end.state.value}")

        await asyncio.gather(*(worker() for _ in range(INFLIGHT)))
        return len(lat) / (time.perf_counter() - t0), lat


async def wait_running(h: RunHandle, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        async for ev in h.events():
            if isinstance(ev, RunUpdate) and ev.state is RunState.RUNNING:
                return
            if isinstance(ev, RunEnd):
                raise RuntimeError(f"run ended {ev.state.value} before it was running")


def timed(argv: list[str], env: dict[str, str] | None = None, timeout: float = 30) -> float:
    """Wall time of one process, in ms; it must exit 0."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    dt = (time.perf_counter() - t0) * 1000
    if r.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}")
    return dt


def mind_metrics(cl) -> dict[str, float]:
    """The Mind's own /metrics (Prometheus text) as {series: value}; empty if it serves none."""
    url = cl.url.replace("ws://", "http://", 1).replace("wss://", "https://", 1) + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
    except (OSError, ValueError):
        return {}
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def sshd(ctx: Ctx):
    """Our own sshd (benchlib.sshd), or the reason there is none (a string). Not in quick mode: the
    references cost more than the figures there (scp of the file, rsync of 5,000 files over ssh), and
    CI's quick run must take the same time on a machine where an earlier full run installed sshd
    (it outgrew the suite's 600 s bound there)."""
    if "sshd" not in ctx.shared and ctx.quick:
        ctx.shared["sshd"] = "quick mode: the ssh, scp and rsync references are measured in full mode"
    if "sshd" not in ctx.shared:
        from benchlib.sshd import OwnSshd, SshUnavailable, ensure_installed

        try:
            ensure_installed(ctx.install_ssh and not ctx.quick, quick=ctx.quick)
            s = OwnSshd(ctx.dir("sshd"))
            ctx.on_close(s.stop)
            s.start()
            ctx.shared["sshd"] = s
            ctx.note(
                "ssh",
                f"our own {s.version()} on 127.0.0.1:{s.port} (temp ed25519 host key, root by temp key "
                "only, -f /dev/null); SHLVL=1 is sent so the remote bash skips root's ~/.bashrc (ssh's "
                "cost, not this machine's dotfiles)",
            )
        except (SshUnavailable, OSError, subprocess.SubprocessError) as exc:
            ctx.shared["sshd"] = str(exc) or type(exc).__name__
    return ctx.shared["sshd"]


# --- 1. latency ----------------------------------------------------------------------------


@figure("latency", "remote no-op call (read_file of 100 B) via the Python client, sequential", basic=True)
def fig_latency(ctx: Ctx) -> list[Row]:
    cl, url = basic(ctx), relay_url(ctx)
    n = 300 if ctx.quick else 1000
    ours_r: list[list[float]] = []
    ref_r: list[list[float]] = []
    for _ in range(ctx.rounds):
        ours_r.append(run(sequential_calls(cl, "bench", *READ, n=n, warm=50), 120))
        ref_r.append(run(relay_sequential(url, n), 120))
    ours, ref = flat(ours_r), flat(ref_r)
    ctx.shared["relay_samples"] = ref
    o50, o99, r50, r99 = med(ours), pct(ours, 99), med(ref), pct(ref, 99)
    ctx.note(
        "latency",
        f"{len(ours)} calls per side ({n} a round after 50 warm-up); reference = raw websockets "
        f"relay client->relay->peer->relay->client with msgpack, 3 processes",
    )
    return [
        Row(
            "latency",
            "read_file p50 ms",
            ms(o50),
            ms(o99),
            spread([med(r) for r in ours_r], ms),
            f"{ms(r50)} (relay p50)",
            ratio(o50, r50),
            "<= 1.5x relay",
            verdict(o50 <= 1.5 * r50),
        ),
        Row(
            "latency",
            "read_file p99 ms",
            ms(o99),
            "",
            spread([pct(r, 99) for r in ours_r], ms),
            f"{ms(r99)} (relay p99)",
            ratio(o99, r99),
            "<= 2.0x relay",
            verdict(o99 <= 2.0 * r99),
        ),
    ]


# --- 2. pipelined --------------------------------------------------------------------------


@figure("pipelined", f"read_file with {INFLIGHT} in flight through one Mind, calls/s", basic=True)
def fig_pipelined(ctx: Ctx) -> list[Row]:
    cl, url = basic(ctx), relay_url(ctx)
    seconds = 1.0 if ctx.quick else 3.0
    ours_r, ref_r, lat = [], [], []
    for _ in range(ctx.rounds):
        rate, lats = run(pipelined_calls(cl, "bench", seconds), 120)
        ours_r.append(rate)
        lat += lats
        ref_r.append(run(relay_pipelined(url, seconds), 120))
    o, r = med(ours_r), med(ref_r)
    ctx.note(
        "pipelined",
        f"{INFLIGHT} callers on one client connection, {seconds:.0f} s a round; per-call latency "
        f"under that load p50 {ms(med(lat))} ms, p99 {ms(pct(lat, 99))} ms",
    )
    return [
        Row(
            "pipelined",
            f"read_file calls/s ({INFLIGHT} in flight)",
            num(o),
            "",
            spread(ours_r, num),
            f"{num(r)} msgs/s (relay)",
            ratio(o, r),
            ">= 0.5x relay",
            verdict(o >= 0.5 * r),
        )
    ]


# --- 3. exec -------------------------------------------------------------------------------


async def local_spawns(n: int) -> list[float]:
    out = []
    for _ in range(n + 5):
        t0 = time.perf_counter()
        p = await asyncio.create_subprocess_exec("true")
        await p.wait()
        out.append((time.perf_counter() - t0) * 1000)
    return out[5:]


@figure("exec", "`exec -- true` via the Python client, sequential p50", basic=True)
def fig_exec(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    n = 100 if ctx.quick else 300
    ours_r, local_r, ssh_r = [], [], []
    s = sshd(ctx)
    n_ssh = 10 if ctx.quick else 50
    if not isinstance(s, str):
        try:
            timed(s.argv("true", mux=True), env=s.env)  # the master connection
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            s = f"ssh with ControlMaster failed: {exc}"
    for _ in range(ctx.rounds):
        ours_r.append(run(sequential_calls(cl, "bench", "exec", {"argv": ["true"]}, n=n, warm=10), 180))
        local_r.append(run(local_spawns(n), 120))
        if not isinstance(s, str):
            try:
                ssh_r.append([timed(s.argv("true", mux=True), env=s.env) for _ in range(n_ssh)])
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                s = f"ssh with ControlMaster failed: {exc}"
    ours, local = flat(ours_r), flat(local_r)
    o50, l50, rel = med(ours), med(local), relay_p50(ctx)
    budget = l50 + rel + 0.5
    rows = [
        Row(
            "exec",
            "exec -- true p50 ms",
            ms(o50),
            ms(pct(ours, 99)),
            spread([med(r) for r in ours_r], ms),
            f"{ms(budget)} = spawn {ms(l50)} + relay {ms(rel)} + 0.5",
            ratio(o50, budget),
            "<= local spawn + relay p50 + 0.5 ms",
            verdict(o50 <= budget),
        )
    ]
    if isinstance(s, str):
        rows.append(
            Row(
                "exec",
                "vs ssh ControlMaster p50",
                ms(o50),
                "",
                "",
                "n/a (no sshd: see notes)",
                "",
                ">= 3x faster",
                "n/a",
            )
        )
        ctx.note("exec", f"ssh reference n/a: {s}")
    else:
        s50 = med(flat(ssh_r))
        rows.append(
            Row(
                "exec",
                "vs ssh ControlMaster p50",
                ms(o50),
                "",
                spread([med(r) for r in ssh_r], ms),
                f"{ms(s50)} (ssh -o ControlMaster=auto ... true)",
                ratio(o50, s50),
                ">= 3x faster (<= 0.33x)",
                verdict(o50 * 3 <= s50),
            )
        )
    ctx.note(
        "exec",
        f"local spawn = asyncio.create_subprocess_exec('true') + wait, p50 {ms(l50)} ms, p99 {ms(pct(local, 99))} ms",
    )
    return rows


# --- 4. cli --------------------------------------------------------------------------------


@figure("cli", "`mind exec --hand h -- true`: the whole CLI process, wall time", basic=True)
def fig_cli(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    n = 5 if ctx.quick else 15
    mind = [str(Path(PY).parent / "mind"), "exec", "--hand", "bench", "--", "true"]
    s = sshd(ctx)
    fresh = None if isinstance(s, str) else s.argv("true", kex="curve25519-sha256")
    bare = [PY, "-c", "pass"]
    imports = [PY, "-c", "import websockets, msgpack, pydantic, structlog"]
    # Bytecode cached, as in any install (pip byte-compiles): with PYTHONDONTWRITEBYTECODE set (as in
    # some dev shells) every run would recompile our modules from source. The cache goes to this
    # run's directory, never into the repo; the uncached figure is shown as context when it applies.
    env = {k: v for k, v in cl.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(ctx.dir("cli-pycache"))
    uncached = "PYTHONDONTWRITEBYTECODE" in cl.env
    for warm in (mind, bare, imports):
        timed(warm, env=env)
    ours_r, ssh_r, bare_r, imp_r, unc_r = [], [], [], [], []
    for _ in range(ctx.rounds):
        ours_r.append([timed(mind, env=env) for _ in range(n)])
        if fresh is not None:
            try:
                ssh_r.append([timed(fresh, env=s.env) for _ in range(n)])
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                fresh, s = None, f"fresh ssh failed: {exc}"
        bare_r.append([timed(bare, env=env) for _ in range(n)])
        imp_r.append([timed(imports, env=env) for _ in range(n)])
        if uncached:
            unc_r.append([timed(mind, env=cl.env) for _ in range(n)])
    ours = flat(ours_r)
    o = med(ours)
    rows = []
    if fresh is None:
        rows.append(
            Row(
                "cli",
                "mind exec -- true wall ms",
                ms(o),
                ms(max(ours)),
                spread([med(r) for r in ours_r], ms),
                "n/a (no sshd: see notes)",
                "",
                "< fresh ssh",
                "n/a",
            )
        )
        ctx.note("cli", f"ssh reference n/a: {s}")
    else:
        r = med(flat(ssh_r))
        rows.append(
            Row(
                "cli",
                "mind exec -- true wall ms",
                ms(o),
                ms(max(ours)),
                spread([med(x) for x in ours_r], ms),
                f"{ms(r)} (fresh ssh, curve25519)",
                ratio(o, r),
                "< fresh ssh",
                verdict(o < r),
            )
        )
    b, i = med(flat(bare_r)), med(flat(imp_r))
    rows.append(
        Row(
            "cli",
            "context: python -c pass ms",
            ms(b),
            "",
            spread([med(x) for x in bare_r], ms),
            "",
            ratio(o, b),
            "",
            "info",
        )
    )
    rows.append(
        Row(
            "cli",
            "context: python -c 'import deps' ms",
            ms(i),
            "",
            spread([med(x) for x in imp_r], ms),
            "",
            ratio(o, i),
            "",
            "info",
        )
    )
    if uncached:
        u = med(flat(unc_r))
        rows.append(
            Row(
                "cli",
                "context: mind exec, bytecode not cached ms",
                ms(u),
                ms(max(flat(unc_r))),
                spread([med(x) for x in unc_r], ms),
                "",
                ratio(o, u),
                "",
                "info",
            )
        )
        ctx.note(
            "cli",
            "PYTHONDONTWRITEBYTECODE is set here: the 'bytecode not cached' row is mind exec as this "
            "environment runs it (our modules compiled from source on every run)",
        )
    ctx.note(
        "cli",
        f"{n} runs a round per command; p99 column = slowest run; python runs with bytecode cached "
        f"(PYTHONPYCACHEPREFIX in the bench directory); deps = websockets, msgpack, pydantic, structlog "
        f"(what `mind exec` imported before its fast path; it now imports msgpack only); ratio of "
        f"context rows = mind exec / it",
    )
    return rows


# --- 5. cancel -----------------------------------------------------------------------------


def procs_with(tag: str) -> int:
    """Live (non-zombie) processes whose command line contains `tag`."""
    needle = tag.encode()
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X"):
            count += 1
    return count


async def until_procs(tag: str, want: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while procs_with(tag) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the tree for {tag} did not start")
        await asyncio.sleep(0.002)


def tree(tag: str) -> str:
    return f"sleep {tag} & sleep {tag} & wait"


async def ours_cancels(cl, n: int) -> tuple[list[float], int]:
    out, leftovers = [], 0
    async with await client(cl) as mc:
        for i in range(n):
            tag = f"100.{os.getpid()}{i:05d}"
            h = await mc.start("bench", "shell", {"command": tree(tag)}, timeout=300)
            await wait_running(h, 10)
            await until_procs(tag, 2)
            t0 = time.perf_counter()
            await h.cancel()
            end = await h.wait()
            out.append((time.perf_counter() - t0) * 1000)
            if end.state is not RunState.CANCELLED:
                raise RuntimeError(f"cancelled run ended {end.state.value}")
            leftovers += procs_with(tag)
    return out, leftovers


async def local_cancels(n: int) -> list[float]:
    from hand.system.process import group_alive  # the product's own "is the group gone" check (read-only use)

    out = []
    for i in range(n):
        tag = f"100.{os.getpid()}9{i:05d}"
        p = await asyncio.create_subprocess_exec("sh", "-c", tree(tag), start_new_session=True)
        await until_procs(tag, 2)
        t0 = time.perf_counter()
        os.killpg(p.pid, signal.SIGTERM)
        await p.wait()
        deadline = time.monotonic() + 10
        while group_alive(p.pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tree for {tag} outlived SIGTERM to its group")
            await asyncio.sleep(0.0005)
        out.append((time.perf_counter() - t0) * 1000)
    return out


@figure("cancel", "client cancel -> whole tree reaped -> terminal state at the client", basic=True)
def fig_cancel(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    n = 15 if ctx.quick else 50
    ours_r, ref_r, left = [], [], 0
    for _ in range(ctx.rounds):
        o, lo = run(ours_cancels(cl, n), 300)
        ours_r.append(o)
        left += lo
        ref_r.append(run(local_cancels(n), 120))
    ours, ref = flat(ours_r), flat(ref_r)
    o50, o99, r50, r99 = med(ours), pct(ours, 99), med(ref), pct(ref, 99)
    ctx.note(
        "cancel",
        f"tree = sh -c '{tree('T')}' (obeys SIGTERM); timed from the client's cancel to run_end "
        f"(cancelled) at the client; processes of the tree left alive afterwards: {left}; "
        f"reference = os.killpg(SIGTERM) + waitpid + the group seen empty, locally",
    )
    return [
        Row(
            "cancel",
            "cancel -> cancelled p50 ms",
            ms(o50),
            ms(o99),
            spread([med(r) for r in ours_r], ms),
            f"{ms(r50)} (local killpg + reap)",
            ratio(o50, r50),
            "<= 5 ms",
            verdict(o50 <= 5.0),
        ),
        Row(
            "cancel",
            "cancel -> cancelled p99 ms",
            ms(o99),
            "",
            spread([pct(r, 99) for r in ours_r], ms),
            f"{ms(r99)} (local p99)",
            ratio(o99, r99),
            "<= 20 ms",
            verdict(o99 <= 20.0),
        ),
    ]


# --- 6. lost -------------------------------------------------------------------------------


def lost_once(ctx: Ctx, ping: float, phase: float) -> float:
    """A Hand behind a fault proxy runs `sleep`; blackhole the path at `phase` (0..1) of the
    connection's keepalive cycle (the Hand's pings go out every `ping` s from the connection's
    start, and the Mind hears them); seconds until the client sees `lost`."""
    from mind.testing.faultproxy import FaultProxy

    cl = ctx.cluster(f"lost-{ping:g}")
    proxy = None
    try:
        # without continuity: the keepalive's detection ends the run (with a window it marks the
        # Hand away instead and the run waits: the `resume` figure)
        cl.start_mind("--ping-interval", f"{ping:g}", "--resume-window", "0")
        proxy = FaultProxy.start(cl.port)
        cl.start_hand("far", "--ping-interval", f"{ping:g}", url=proxy.url)
        cl.wait_connected("far")

        async def go() -> float:
            async with await client(cl) as mc:
                h = await mc.start("far", "exec", {"argv": ["sleep", "300"]}, timeout=600)
                await wait_running(h, 10)
                since = next(x.since for x in await mc.hands() if x.name == "far")  # welcomed (wall clock)
                into = (time.time() - since) % ping
                await asyncio.sleep((phase * ping - into) % ping)
                proxy.send("blackhole")
                t0 = time.perf_counter()
                end = await h.wait()
                dt = time.perf_counter() - t0
                if end.state is not RunState.LOST:
                    raise RuntimeError(f"blackholed run ended {end.state.value}, not lost")
                return dt

        return run(go(), 4 * ping + 30)
    finally:
        cl.stop_all()
        if proxy is not None:
            proxy.stop()


@figure("lost", "lost detection of a blackholed Hand (no FIN/RST), by keepalive")
def fig_lost(ctx: Ctx) -> list[Row]:
    rows = []
    for ping in (1.0,) if ctx.quick else (1.0, 10.0):
        xs = [lost_once(ctx, ping, (k + 0.5) / ctx.rounds) for k in range(ctx.rounds)]
        o = med(xs)
        rows.append(
            Row(
                "lost",
                f"blackhole -> lost s (ping {ping:g} s, --resume-window 0)",
                secs(o),
                secs(max(xs)),
                spread(xs, secs),
                f"ping interval {ping:g} s",
                f"{o / ping:.2f} intervals",
                f"<= 2 intervals ({2 * ping:g} s)",
                verdict(max(xs) <= 2 * ping),
            )
        )
    ctx.note(
        "lost",
        "Mind and Hand both --ping-interval P (the Hand pings every P; the Mind listens, pings a peer silent 1.1 P "
        "and cuts one silent 1.75 P, swept every 0.1 P: mind/core/liveness.py), the Mind with --resume-window 0 "
        "(with a window the same detection marks the Hand away and the run waits for it: see `resume`); a fresh Mind+Hand+fault proxy each "
        "round; timed from the proxy's blackhole (both ways) to run_end(lost) at a client connected "
        "directly to the Mind; round k of n blackholes at phase (k+0.5)/n of the ping cycle (from the "
        "Hand's welcome time), so the rounds span the cycle; p99 column = worst round, verdict on the worst"
        + ("; quick mode: 1 s only" if ctx.quick else ""),
    )
    return rows


# --- 7. hands ------------------------------------------------------------------------------


def _sims(ctx: Ctx, cl_url: str, args: list[list[str]], d: Path) -> tuple[list, float, dict]:
    sims = [
        ctx.child(f"handsim{k}", [PY, HANDSIM_PY, "--url", cl_url, *a], stdin=True, log=d / f"handsim{k}.log")
        for k, a in enumerate(args)
    ]
    for s in sims:
        s.read_json(30)
    t0 = time.perf_counter()
    for s in sims:
        s.tell("go")
    reports = [s.read_json(90) for s in sims]
    dt = time.perf_counter() - t0
    total: dict = {k: sum(r[k] for r in reports) for k in ("connected", "busy", "errors")}
    total["by_url"] = {}
    for r in reports:
        for url, c in r.get("by_url", {}).items():
            total["by_url"][url] = total["by_url"].get(url, 0) + c
    return sims, dt, total


@figure("hands", "N simulated Hands connect + handshake; Mind RSS idle; no-op call to a random Hand")
def fig_hands(ctx: Ctx) -> list[Row]:
    from mind.store.credentials import Store

    n = ctx.hands or (100 if ctx.quick else 1000)
    nprocs = 1 if n <= 200 else 2
    conc = 60 // nprocs  # handshakes in progress at once per simulator, as a restarting fleet behind a NAT
    idle = 1.0 if ctx.quick else 2.0
    connect_target = max(2.0, 2.0 * n / 1000)  # issue 23: 1,000 Hands in <= 2 s, 10,000 in <= 20 s
    calls = 100 if ctx.quick else 300
    tpl = ctx.dir("hands-template")
    store = Store(tpl / "mind.db")
    names = [f"sim{i:04d}" for i in range(n)]
    tokens = [store.add("hand", name).token() for name in names]
    store.close()
    cred_files = []
    for k in range(nprocs):
        f = tpl / f"creds{k}.txt"
        f.write_text("\n".join(tokens[k::nprocs]) + "\n")
        os.chmod(f, 0o600)
        cred_files.append(f)
    t_r, rss_r, rss0_r, call_r, ref_t_r, ref_rss_r, ref_rss0_r = [], [], [], [], [], [], []
    busy = failed = log_lines = refused_lines = 0
    for _ in range(ctx.rounds):
        cl = ctx.cluster("hands")
        cl.home.mkdir(parents=True, mode=0o700)
        shutil.copy(tpl / "mind.db", cl.home / "mind.db")
        sims = []
        try:
            cl.start_mind("--ping-interval", "10")
            time.sleep(0.5)
            rss0_r.append(rss_mib(cl.mind.pid))
            sims, dt, tot = _sims(
                ctx, cl.url, [["--creds", str(f), "--concurrency", str(conc)] for f in cred_files], cl.tmp
            )
            if tot["connected"] != n:
                raise RuntimeError(f"only {tot['connected']} of {n} simulated hands connected")

            async def check_and_call(cl) -> list[float]:
                async with await client(cl) as mc:
                    live = sum(1 for h in await mc.hands() if h.connected)
                    if live != n:
                        raise RuntimeError(f"the Mind lists {live} of {n} hands connected")
                    await asyncio.sleep(idle)
                    rss_r.append(rss_mib(cl.mind.pid))
                    for name in random.sample(names, min(20, n)):
                        await mc.exec(name, *READ)
                    out = []
                    for _ in range(calls):
                        name = random.choice(names)
                        t0 = time.perf_counter()
                        end = await mc.exec(name, *READ)
                        out.append((time.perf_counter() - t0) * 1000)
                        if end.state is not RunState.SUCCEEDED:
                            raise RuntimeError(f"call to {name} ended {end.state.value}")
                    return out

            call_r.append(run(check_and_call(cl), 120))
            t_r.append(dt)
            busy += tot["busy"]
            failed += tot["errors"]
            logged = cl.mind.output()
            log_lines += logged.count("\n")
            refused_lines += logged.count("handshake_refused")
        finally:
            for s in sims:
                s.stop()
            cl.stop_all()
        # reference: a bare websockets server holding n idle connections
        d = ctx.dir("bare")
        bare = ctx.child("bare", [PY, RELAY_PY, "bare"], stdin=True, log=d / "bare.log")
        raws = []
        try:
            url = f"ws://127.0.0.1:{bare.read_json(30)['port']}"
            time.sleep(0.5)
            ref_rss0_r.append(rss_mib(bare.pid))
            per = [n // nprocs + (1 if k < n % nprocs else 0) for k in range(nprocs)]
            raws, dt, tot = _sims(ctx, url, [["--raw", "--count", str(c), "--concurrency", str(conc)] for c in per], d)
            if tot["connected"] != n:
                raise RuntimeError(f"only {tot['connected']} of {n} raw connections to the bare server")
            time.sleep(idle)
            ref_rss_r.append(rss_mib(bare.pid))
            ref_t_r.append(dt)
        finally:
            for s in raws:
                s.stop()
            bare.stop()
    calls_all = flat(call_r)
    t, rss, c50, rel = med(t_r), med(rss_r), med(calls_all), relay_p50(ctx)
    ref_t, ref_rss = med(ref_t_r), med(ref_rss_r)
    label = f"{n:,} hands" + (" (quick)" if ctx.quick else "")
    ctx.note(
        "hands",
        f"{nprocs} simulator process(es) (benchlib/handsim.py), at most {conc} handshakes in progress "
        f"each, real ClientHandshake + answers; Mind --ping-interval 10 (the default); timed from 'go' "
        f"to every simulated Hand welcomed; busy refusals {busy}, other failed attempts {failed} (all rounds); "
        f"the Mind's log: {log_lines:,} lines, {refused_lines:,} of them handshake_refused (all rounds)",
    )
    ctx.note(
        "hands",
        f"RSS before any Hand: Mind {mib(med(rss0_r))} MiB, bare server {mib(med(ref_rss0_r))} MiB; "
        f"RSS read {idle:g} s after the last connection; calls: {calls} a round to random Hands",
    )
    return [
        Row(
            "hands",
            f"{label}: all connected s",
            secs(t),
            "",
            spread(t_r, secs),
            f"{secs(ref_t)} (raw ws connects, bare server)",
            ratio(t, ref_t),
            f"<= {connect_target:g} s",
            verdict(t <= connect_target),
        ),
        Row(
            "hands",
            f"{label}: handshakes refused busy / failed",
            f"{busy} / {failed}",
            "",
            f"{ctx.rounds} round(s)",
            "",
            "",
            "0 / 0 (one address, prompt handshakes)",
            verdict(busy == 0 and failed == 0),
        ),
        Row(
            "hands",
            f"{label}: Mind RSS idle MiB",
            mib(rss),
            "",
            spread(rss_r, mib),
            f"{mib(ref_rss)} (bare websockets server)",
            ratio(rss, ref_rss),
            "<= 150 MiB",
            verdict(rss <= 150),
        ),
        Row(
            "hands",
            f"{label}: read_file p50 ms, random hand",
            ms(c50),
            ms(pct(calls_all, 99)),
            spread([med(r) for r in call_r], ms),
            f"{ms(rel)} (relay p50)",
            ratio(c50, rel),
            "<= 2.0x relay",
            verdict(c50 <= 2.0 * rel),
        ),
    ]


# --- 8. starts -----------------------------------------------------------------------------


async def task_starts(cl, hand: str, seconds: float) -> tuple[float, list[float], dict[str, int]]:
    outcomes: dict[str, int] = {}
    lat: list[float] = []
    async with await client(cl) as mc:
        for _ in range(10):
            await mc.task_start(hand, "exec", {"argv": ["true"]}, max_runtime=60)
        t0 = time.perf_counter()
        end_at = t0 + seconds

        async def worker() -> None:
            while time.perf_counter() < end_at:
                t = time.perf_counter()
                r = await mc.task_start(hand, "exec", {"argv": ["true"]}, max_runtime=60)
                lat.append((time.perf_counter() - t) * 1000)
                outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1

        await asyncio.gather(*(worker() for _ in range(INFLIGHT)))
        elapsed = time.perf_counter() - t0
    return outcomes.get("accepted", 0) / elapsed, lat, outcomes


@figure("starts", "background task starts/s through one Mind to one Hand (durable before accepted)")
def fig_starts(ctx: Ctx) -> list[Row]:
    cl = ctx.cluster("starts")
    seconds = 1.5 if ctx.quick else 4.0
    try:
        cl.start_mind()
        cl.start_hand("tasks", "--max-retained-tasks", "1000000")
        cl.wait_connected("tasks")
        rates, lat, outcomes = [], [], {}
        for _ in range(ctx.rounds):
            rate, lats, o = run(task_starts(cl, "tasks", seconds), 180)
            rates.append(rate)
            lat += lats
            for k, v in o.items():
                outcomes[k] = outcomes.get(k, 0) + v
    finally:
        cl.stop_all()
    r = med(rates)
    ctx.note(
        "starts",
        f"MindClient.task_start('exec', argv=['true']) x {INFLIGHT} in flight, {seconds:g} s a round, "
        f"Hand --max-running-tasks 4 (default: the rest queue), --max-retained-tasks 1000000; "
        f"outcomes {outcomes}; reply latency p50 {ms(med(lat))} ms, p99 {ms(pct(lat, 99))} ms",
    )
    return [
        Row(
            "starts",
            f"task starts/s accepted ({INFLIGHT} in flight)",
            num(r),
            "",
            spread(rates, num),
            "none",
            "",
            ">= 500/s",
            verdict(r >= 500),
        )
    ]


# --- 9. reconcile --------------------------------------------------------------------------


@figure("reconcile", "reconciliation of 10,000 retained tasks after reconnect; Mind responsiveness meanwhile")
def fig_reconcile(ctx: Ctx) -> list[Row]:
    from benchlib.reconcile import measure, seed

    n = 10_000
    adopt_r, again_r, worst_r, busy, quiet, lag_r = [], [], [], [], [], []
    for _ in range(ctx.rounds):
        cl = ctx.cluster("reconcile")
        try:
            cl.start_mind()
            cl.add_hand("bench")
            seed(cl.tmp / "state-bench", n)
            first, b1, q1 = measure(cl, 1, partial(cl.start_hand, "bench"))
            cl.hands["bench"].stop()
            second, b2, q2 = measure(cl, 2, partial(cl.start_hand, "bench"))
            lag = mind_metrics(cl).get("mindhand_event_loop_lag_max_seconds")
            if lag is not None:
                lag_r.append(lag * 1000)
        finally:
            cl.stop_all()
        for line in (first, second):
            if line["hand_tasks"] != n:
                raise RuntimeError(f"reconciled {line['hand_tasks']} tasks, not {n}")
        adopt_r.append(float(first["duration_ms"]))
        again_r.append(float(second["duration_ms"]))
        worst_r.append(max(b1 + b2))
        busy += b1 + b2
        quiet += q1 + q2
    a, g, w = med(adopt_r), med(again_r), med(worst_r)
    ctx.note(
        "reconcile",
        f"{n:,} finished tasks seeded in the Hand's database; duration = the Mind's reconcile_done "
        f"duration_ms (first pass adopts them all, second finds them unchanged); RTT = a client "
        f"asking hands() every 5 ms from just before the Hand starts until reconcile_done, "
        f"{len(busy)} probes: p50 {ms(med(busy))} ms, p99 {ms(pct(busy, 99))} ms; ours = the worst of a round "
        f"(median over rounds); idle probes {len(quiet)}: p50 {ms(med(quiet))} ms; loop-lag max = the Mind's "
        f"mindhand_event_loop_lag_max_seconds after both passes (since its start; sampled by its "
        f"250 ms ticker, so a stall that ends between two ticks is not seen)",
    )
    return [
        Row(
            "reconcile",
            f"{n:,} tasks, first pass (adopt) ms",
            ms(a),
            "",
            spread(adopt_r, ms),
            "none",
            "",
            "<= 1000 ms",
            verdict(a <= 1000),
        ),
        Row(
            "reconcile",
            f"{n:,} tasks, after reconnect (unchanged) ms",
            ms(g),
            "",
            spread(again_r, ms),
            "none",
            "",
            "<= 1000 ms",
            verdict(g <= 1000),
        ),
        Row(
            "reconcile",
            "worst client RTT meanwhile ms",
            ms(w),
            "",
            spread(worst_r, ms),
            f"{ms(max(quiet))} (worst RTT, idle Mind)",
            ratio(w, max(quiet)),
            "<= 50 ms",
            verdict(w <= 50),
        ),
        Row(
            "reconcile",
            "Mind's own loop-lag max (/metrics) ms",
            ms(med(lag_r)) if lag_r else "n/a",
            "",
            spread(lag_r, ms),
            "",
            "",
            "cross-check of the row above",
            "info",
        ),
    ]


# --- 10. memory ----------------------------------------------------------------------------


@figure("memory", "Mind RSS after many finished foreground runs (retention bounded by retain_finished)")
def fig_memory(ctx: Ctx) -> list[Row]:
    marks = [1000, 5000] if ctx.quick else [1000, 10_000, 20_000, 50_000, 100_000]
    cl = ctx.cluster("memory")
    curve: list[tuple[int, float]] = []
    try:
        cl.start_mind()
        cl.start_hand("mem")
        cl.wait_connected("mem")
        (cl.tmp / "root-mem" / "small.txt").write_bytes(b"x" * 100)
        time.sleep(0.3)
        curve.append((0, rss_mib(cl.mind.pid)))

        async def go() -> float:
            done = 0
            t0 = time.perf_counter()
            async with await client(cl) as mc:
                for mark in marks:
                    todo = mark - done

                    async def worker(k: int) -> None:
                        for _ in range(k):
                            end = await mc.exec("mem", *READ)
                            if end.state is not RunState.SUCCEEDED:
                                raise RuntimeError(f"read_file ended {end.state.value}")

                    share = [todo // INFLIGHT + (1 if i < todo % INFLIGHT else 0) for i in range(INFLIGHT)]
                    await asyncio.gather(*(worker(k) for k in share))
                    done = mark
                    curve.append((mark, rss_mib(cl.mind.pid)))
            return done / (time.perf_counter() - t0)

        rate = run(go(), 1800)
        time.sleep(1.0)
        settled = rss_mib(cl.mind.pid)
    finally:
        cl.stop_all()
    at = dict(curve)
    first, last = at[marks[0]], at[marks[-1]]
    ctx.note(
        "memory",
        "RSS curve (runs: MiB) "
        + ", ".join(f"{k:,}: {mib(v)}" for k, v in curve)
        + f"; {mib(settled)} MiB 1 s after the last; {num(rate)} runs/s ({INFLIGHT} in flight); one round",
    )
    if ctx.quick:
        return [
            Row(
                "memory",
                f"Mind RSS MiB after {marks[-1]:,} runs (quick)",
                mib(last),
                "",
                "",
                f"{mib(first)} after {marks[0]:,}",
                ratio(last, first),
                "plateau past retain_finished=10,000 (full mode)",
                "info",
            )
        ]
    base = at[20_000]
    return [
        Row(
            "memory",
            f"Mind RSS MiB after {marks[-1]:,} runs",
            mib(last),
            "",
            "",
            f"{mib(first)} after {marks[0]:,}",
            ratio(last, first),
            f"plateau: <= RSS@20k ({mib(base)}) +10%",
            verdict(last <= base * 1.10),
        )
    ]


# --- 11. payloads --------------------------------------------------------------------------

PAYLOAD_BYTES = 4 << 20
PAYLOAD_INFLIGHT = 4


def _rss_after_runs(ctx: Ctx, name: str, tool: str, args: dict, n: int) -> tuple[float, float, float, float]:
    """A fresh Mind and Hand; `n` runs of `tool` (PAYLOAD_INFLIGHT at a time, each checked). Returns
    the Mind's VmRSS (MiB) idle before, right after the last run, and settled 1 s later, and runs/s."""
    cl = ctx.cluster(name)
    try:
        cl.start_mind()
        cl.start_hand("mem")
        cl.wait_connected("mem")
        (cl.tmp / "root-mem" / "payload.bin").write_bytes(os.urandom(PAYLOAD_BYTES))
        time.sleep(0.5)
        idle = rss_mib(cl.mind.pid)

        async def go() -> float:
            async with await client(cl) as mc:

                async def worker(k: int) -> None:
                    for _ in range(k):
                        end = await mc.exec("mem", tool, args)
                        if end.state is not RunState.SUCCEEDED:
                            raise RuntimeError(f"{tool} ended {end.state.value}: {end.error or end.reason}")
                        if tool == "read_file" and len(end.value["data"]) != PAYLOAD_BYTES:
                            raise RuntimeError("read_file returned a short value")

                t0 = time.perf_counter()
                each, extra = divmod(n, PAYLOAD_INFLIGHT)
                share = [each + (1 if i < extra else 0) for i in range(PAYLOAD_INFLIGHT)]
                await asyncio.gather(*(worker(k) for k in share))
                return n / (time.perf_counter() - t0)

        rate = run(go(), 3600)
        right_after = rss_mib(cl.mind.pid)
        time.sleep(1.0)
        return idle, right_after, rss_mib(cl.mind.pid), rate
    finally:
        cl.stop_all()


@figure("payloads", "Mind RSS after N runs of 4 MiB read_file vs N runs of `true` (metadata kept, not payloads)")
def fig_payloads(ctx: Ctx) -> list[Row]:
    n = 100 if ctx.quick else 10_000
    read = ("read_file", {"path": "payload.bin", "limit": PAYLOAD_BYTES})
    true = ("exec", {"argv": ["true"]})
    r_idle, r_now, r_rss, r_rate = _rss_after_runs(ctx, "payloads-read", *read, n)
    t_idle, t_now, t_rss, t_rate = _rss_after_runs(ctx, "payloads-true", *true, n)
    ctx.note(
        "payloads",
        f"a fresh Mind+Hand per side, {n:,} runs each ({PAYLOAD_INFLIGHT} in flight, one client), one round; "
        f"RSS = the Mind's VmRSS 1 s after the last run (idle before: read_file {mib(r_idle)}, true "
        f"{mib(t_idle)} MiB; right after the last run: read_file {mib(r_now)}, true {mib(t_now)} MiB); "
        f"read_file {num(r_rate)} runs/s ({num(r_rate * PAYLOAD_BYTES / 2**20)} MiB/s of values), "
        f"true {num(t_rate)} runs/s; --retain-runs 10,000 (the default) holds every run of the full mode",
    )
    return [
        Row(
            "payloads",
            f"Mind RSS MiB after {n:,} read_file of 4 MiB" + (" (quick)" if ctx.quick else ""),
            mib(r_rss),
            "",
            "",
            f"{mib(t_rss)} after {n:,} exec true",
            ratio(r_rss, t_rss),
            "<= 1.20x",
            verdict(r_rss <= 1.20 * t_rss),
        )
    ]
