"""The Many Minds figure (issue 27, item 6 "Scale"): Hands spread over two Mind nodes on one
PostgreSQL, and what a node's death costs.

- `nodes`: a PostgreSQL of the run's own (tests/support/postgres.py: initdb into a temp dir, a free
  loopback port, stopped by PID), two `mind serve --database` nodes on it, and N simulated Hands
  (benchlib/handsim.py; 10,000 full, 300 quick, `--hands N`) each given both URLs (a random
  start, the next on a refusal: protocol/urls.py). Measured: seconds from `go` to every Hand
  welcomed, how they split over the nodes, each node's RSS, and the CPU each process spent in the
  connect storm (the profile of where the time goes). A few real `hand` processes are given both
  URLs too, and runs (`mind exec` of a command waiting for a file) are started through the node
  holding them. Then that node is killed (-9): timed until every simulated Hand it held is welcomed
  by the other node and reconciled there (its `runs_present` sent, the node's `task_inventory`
  answered); then the runs are let finish and counted: a run is lost unless its client got its real
  exit code and its whole output.

- calls through the other node vs the Hand's own node (issue 27 item 4): with the simulated Hands
  connected, the first real Hand is called (`read_file` of 100 bytes, `exec -- true`; 200 of each
  quick, 1,000 full, after a warm-up) alternately by a client on its node and one on the other node
  (benchlib/route.py, the loop `scripts/bench-route` runs on an idle pair). The row is the p50 of
  `exec -- true`, the reference its p50 through the Hand's own node in the same run.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from benchlib.core import PY, Ctx, Row, mib, ratio, secs, verdict
from benchlib.figures import RELAY_PY, _sims, figure, hop_url, relay_hop, relay_url, run
from benchlib.route import SMALL, measure, p50, p99
from mind.testing.cluster import Cluster, program, wait_until

REAL_HANDS_QUICK, REAL_HANDS_FULL = 2, 4
RUNS_PER_HAND = 2
ROUTED_CALLS = {True: 200, False: 1000}
"""Calls of each kind through each node for the routed row, by quick mode."""
WINDOW_S = 60
"""`--resume-window` of the nodes: the runs ride out the move of their Hand and of their client."""
SIMS = 2
"""Simulator processes (each one asyncio loop, one core's worth at most)."""


def cpu_s(pid: int) -> float:
    """utime + stime of a live process, in seconds (/proc/PID/stat)."""
    user, system = cpu_split(pid)
    return user + system


def cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of a live process, in seconds: Python's work against the kernel's (socket
    syscalls, the loopback's receive path run in the sender's context)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def children_cpu_s(ppid: int) -> float:
    """CPU of the live children of `ppid` (PostgreSQL's backends are children of the postmaster)."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == ppid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def add_hands(home: Path, dsn: str, names: list[str]) -> list[str]:
    """Hand credentials through the store the admin commands use (`mind hand add`), many at once on
    one pool: a process per Hand would take minutes for 10,000. Returns their tokens."""
    from mind.store.engines import open_stores

    stores = await open_stores(home, dsn, "bench-setup")
    try:
        sem = asyncio.Semaphore(16)

        async def one(name: str) -> str:
            async with sem:
                return (await stores.credentials.add("hand", name)).token()

        return list(await asyncio.gather(*(one(n) for n in names)))
    finally:
        await stores.close()


async def commits(dsn: str) -> int:
    """Transactions committed in the benchmark's database so far (pg_stat_database)."""
    import asyncpg

    con = await asyncpg.connect(dsn, timeout=10)
    try:
        await con.execute("SELECT pg_stat_clear_snapshot()")
        return int(await con.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))
    finally:
        await con.close()


def node(ctx: Ctx, name: str, dsn: str) -> Cluster:
    cl = ctx.cluster(name)
    cl.env["MINDHAND_DATABASE"] = dsn
    cl.resume_window = WINDOW_S
    return cl


def holder(nodes: list[Cluster], hand: str) -> Cluster | None:
    for n in nodes:
        if n._connected_by_log(hand, 1) is not None:
            return n
    return None


def start_run(tmp: Path, via: Cluster, urls: list[str], hand: str, k: int, go: Path) -> subprocess.Popen[bytes]:
    """`mind exec --mind A --mind B HAND -- sh -c ...` started once it is served by the node holding
    the Hand: until routing exists, a client that starts on the other node is told the Hand is not
    connected there (that try ran nothing) and is started again (bounded)."""
    script = f"echo before-{k}; while [ ! -e {go} ]; do sleep 0.1; done; echo after-{k}; exit {10 + k}"
    mind_args = [a for u in urls for a in ("--mind", u)]
    for attempt in range(20):
        marker = tmp / f"started-{k}-{attempt}"
        p = via.cli_popen("exec", *mind_args, hand, "--", "sh", "-c", f"touch {marker}; {script}")
        wait_until(lambda m=marker, p=p: m.exists() or p.poll() is not None, 30, "the run to start or end")
        if marker.exists():
            return p
        _, err = p.communicate(timeout=10)
        if b"not connected" not in err:
            raise RuntimeError(f"run {k} on {hand} could not start: {err.decode(errors='replace')[-400:]}")
    raise RuntimeError(f"run {k}: the client never landed on {hand}'s node in 20 tries")


@figure("nodes", "N simulated Hands over 2 Mind nodes on PostgreSQL; kill -9 of one: Hands moved, runs lost")
def fig_nodes(ctx: Ctx) -> list[Row]:
    from support.postgres import remove, start_server  # tests/support: the suite's own PostgreSQL

    n = ctx.hands or (300 if ctx.quick else 10_000)
    n_real = REAL_HANDS_QUICK if ctx.quick else REAL_HANDS_FULL
    connect_target = max(2.0, 2.0 * n / 1000)  # issue 27: 10,000 Hands over 2 nodes in <= 20 s
    label = f"{n:,} hands" + (" (quick)" if ctx.quick else "")
    pg = start_server()
    ctx.on_close(lambda: remove(pg))
    dsn = pg.dsn
    setup = ctx.dir("nodes-setup")
    t0 = time.perf_counter()
    names = [f"sim{i:05d}" for i in range(n)]
    tokens = run(add_hands(setup, dsn, names), 600)
    t_add = time.perf_counter() - t0
    cred_files = []
    for k in range(SIMS):
        f = setup / f"creds{k}.txt"
        f.write_text("\n".join(tokens[k::SIMS]) + "\n")
        os.chmod(f, 0o600)
        cred_files.append(f)
    a, b = node(ctx, "node-a", dsn), node(ctx, "node-b", dsn)
    nodes = [a, b]
    # 10 s keepalive (the default; the Cluster's 1 s is for tests) and quiet logs: 10,000 Hands
    args = ("--ping-interval", "10", "--node-name")
    pa, pb = a._spawn_mind((*args, "a"), None), b._spawn_mind((*args, "b"), None)
    a._wait_listening(pa, 60)
    b._wait_listening(pb, 60)
    urls = [a.url, b.url]
    name_of = {a.url: "a", b.url: "b"}
    reals = [f"real{i}" for i in range(n_real)]
    for h in reals:
        a.add_hand(h)
        a.start_hand(h, "--ping-interval", "10", url=",".join(urls))
    for h in reals:
        wait_until(lambda h=h: holder(nodes, h), 60, f"{h} connected to a node")
    rss0 = {name_of[c.url]: rss_mib_of(c) for c in nodes}
    cpu0 = {name_of[c.url]: cpu_split(c.mind.pid) for c in nodes if c.mind}
    pg_cpu0 = children_cpu_s(pg.proc.pid) if pg.proc else 0.0
    xact0 = run(commits(dsn), 30)
    conc = 30
    sims, dt, tot = _sims(
        ctx,
        ",".join(urls),
        [["--creds", str(f), "--concurrency", str(conc), "--deadline", "120"] for f in cred_files],
        setup,
    )
    if tot["connected"] != n:
        raise RuntimeError(f"only {tot['connected']} of {n} simulated hands connected in 120 s")
    sim_cpu = sum(cpu_s(s.pid) for s in sims)
    cpu1 = {name_of[c.url]: cpu_split(c.mind.pid) for c in nodes if c.mind}
    spent = {x: (cpu1[x][0] - cpu0[x][0], cpu1[x][1] - cpu0[x][1]) for x in cpu1}
    pg_cpu1 = children_cpu_s(pg.proc.pid) if pg.proc else 0.0
    xact1 = run(commits(dsn), 30)
    time.sleep(1.0 if ctx.quick else 2.0)
    rss1 = {name_of[c.url]: rss_mib_of(c) for c in nodes}
    ctx.note(
        "nodes",
        f"connect storm {secs(dt)} s: CPU s (user + system) node a {spent['a'][0]:.1f} + {spent['a'][1]:.1f}, "
        f"node b {spent['b'][0]:.1f} + {spent['b'][1]:.1f} "
        f"({sum(map(sum, spent.values())) / n * 1000:.2f} ms per Hand welcomed), "
        f"PostgreSQL backends {pg_cpu1 - pg_cpu0:.1f}, simulators {sim_cpu:.1f} ({SIMS} processes); "
        f"{xact1 - xact0:,} database transactions ({(xact1 - xact0) / n:.1f} per Hand welcomed); "
        f"busy refusals {tot['busy']}, other failed attempts {tot['errors']}; "
        f"credentials added in {secs(t_add)} s (setup, not timed)",
    )
    ctx.note(
        "nodes",
        f"RSS before the simulated Hands: node a {mib(rss0['a'])} MiB, node b {mib(rss0['b'])} MiB "
        f"({n_real} real Hands connected); after: read {1 if ctx.quick else 2} s after the last welcome",
    )

    # Runs in flight on the node about to be killed: the node holding the first real Hand.
    victim = holder(nodes, reals[0])
    assert victim is not None
    survivor = b if victim is a else a

    # Calls through the other node vs the Hand's own node, the simulated Hands connected.
    (a.tmp / f"root-{reals[0]}" / "small.txt").write_bytes(SMALL)
    routed = run(measure(victim.url, survivor.url, a.home / "admin.cred", reals[0], ROUTED_CALLS[ctx.quick]), 600)
    for call, own, other in routed:
        ctx.note(
            "nodes",
            f"{call} on {reals[0]} (held by node {name_of[victim.url]}), {len(own)} calls each: p50 own node "
            f"{p50(own):.3f} ms, through node {name_of[survivor.url]} {p50(other):.3f} ms "
            f"({p50(other) - p50(own):+.3f}); p99 {p99(own):.3f} / {p99(other):.3f} ms",
        )
    r_own, r_other = routed[-1][1], routed[-1][2]
    extra = p50(r_other) - p50(r_own)
    # the floor under that: one more raw msgpack relay hop (no protocol, no state), same moment
    raw_own, raw_hop = run(relay_hop(relay_url(ctx), hop_url(ctx), ROUTED_CALLS[ctx.quick]), 600)
    raw_extra = p50(raw_hop) - p50(raw_own)
    ctx.note(
        "nodes",
        f"a raw msgpack relay's call, {len(raw_own)} each: p50 {p50(raw_own):.3f} ms direct, {p50(raw_hop):.3f} ms "
        f"through one more raw hop ({raw_extra:+.3f}): the cost of a second process on the way on this machine",
    )
    on_victim = [h for h in reals if holder(nodes, h) is victim]
    go = ctx.dir("nodes-go") / "go"
    runs_dir = go.parent
    procs = []
    k = 0
    for h in on_victim:
        for _ in range(RUNS_PER_HAND):
            procs.append((k, start_run(runs_dir, victim, urls, h, k, go)))
            k += 1
    for s in sims:
        s.tell(f"watch {victim.url}")
    assert victim.mind is not None
    victim.mind.kill9()
    moved = [s.read_json(150) for s in sims]
    watched = sum(m["watched"] for m in moved)
    got = sum(m["moved"] for m in moved)
    t_move = max(m["seconds"] for m in moved)
    move_target = max(2.0, 15.0 * watched / 5000)  # issue 27: 5,000 Hands moved in <= 15 s
    if got != watched:
        ctx.note("nodes", f"only {got} of {watched} Hands of the killed node moved within the simulators' deadline")
    go.touch()
    lost = 0
    for k, p in procs:
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate(timeout=10)
        if p.returncode != 10 + k or out != f"before-{k}\nafter-{k}\n".encode():
            lost += 1
            ctx.note("nodes", f"run {k} lost: exit {p.returncode}, stdout {out[-200:]!r}, {err[-300:]!r}")
    rss_after = rss_mib_of(survivor)
    listed = survivor_connected(survivor)
    ctx.note(
        "nodes",
        f"kill -9 of node {name_of[victim.url]} holding {watched:,} simulated Hands; after the move node "
        f"{name_of[survivor.url]} lists {listed:,} Hands connected and holds {mib(rss_after)} MiB; "
        f"{len(procs)} runs in flight on {len(on_victim)} real Hand(s) (`hand run`, --resume-window {WINDOW_S})",
    )
    for s in sims:
        s.stop()
    for c in nodes:
        c.stop_all()
    remove(pg)
    # reference, same run: the same simulators opening n plain WebSocket connections to a bare server
    d = ctx.dir("nodes-bare")
    bare = ctx.child("bare", [PY, RELAY_PY, "bare"], stdin=True, log=d / "bare.log")
    raws: list = []
    try:
        url = f"ws://127.0.0.1:{bare.read_json(30)['port']}"
        per = [n // SIMS + (1 if k < n % SIMS else 0) for k in range(SIMS)]
        raws, ref_dt, rtot = _sims(ctx, url, [["--raw", "--count", str(c), "--concurrency", str(conc)] for c in per], d)
        if rtot["connected"] != n:
            raise RuntimeError(f"only {rtot['connected']} of {n} raw connections to the bare server")
    finally:
        for s in raws:
            s.stop()
        bare.stop()
    by = tot.get("by_url") or {}
    first = {name_of[u]: c for u, c in by.items()}
    low = min(first.values()) if first else 0
    return [
        Row(
            "nodes",
            f"{label} over 2 nodes: all connected s",
            secs(dt),
            "",
            "1 round",
            f"{secs(ref_dt)} (raw ws connects, bare server)",
            ratio(dt, ref_dt),
            f"<= {connect_target:g} s",
            verdict(dt <= connect_target),
        ),
        Row(
            "nodes",
            f"{label}: split a / b (random start)",
            " / ".join(f"{first.get(x, 0):,}" for x in ("a", "b")),
            "",
            "",
            "",
            "",
            "each >= 40%",
            verdict(low >= 0.4 * n),
        ),
        Row(
            "nodes",
            f"{label}: RSS per node MiB, a / b",
            f"{mib(rss1['a'])} / {mib(rss1['b'])}",
            "",
            "",
            f"{mib(rss0['a'])} / {mib(rss0['b'])} (before the Hands)",
            "",
            "reported",
            "n/a",
        ),
        Row(
            "nodes",
            f"kill -9 of a node holding {watched:,}: all moved + reconciled s",
            secs(t_move),
            "",
            f"{got:,} of {watched:,} moved",
            "",
            "",
            f"<= {move_target:g} s",
            verdict(got == watched and t_move <= move_target),
        ),
        Row(
            "nodes",
            f"{routed[-1][0]} through the other node vs own node, p50 ms",
            f"{p50(r_other):.3f}",
            f"{p99(r_other):.3f}",
            f"{len(r_other)} calls, {extra:+.3f} ms",
            f"{p50(r_own):.3f} (own node)",
            ratio(p50(r_other), p50(r_own)),
            "<= +0.5 ms",
            verdict(extra <= 0.5),
        ),
        Row(
            "nodes",
            "a raw msgpack relay's call through one more raw hop, p50 ms",
            f"{p50(raw_hop):.3f}",
            f"{p99(raw_hop):.3f}",
            f"{len(raw_hop)} calls, {raw_extra:+.3f} ms",
            f"{p50(raw_own):.3f} (the relay alone)",
            ratio(p50(raw_hop), p50(raw_own)),
            "reported (the hop's floor)",
            "n/a",
        ),
        Row(
            "nodes",
            f"runs lost across a node kill ({len(procs)} in flight)",
            str(lost),
            "",
            "",
            "",
            "",
            "0",
            verdict(lost == 0),
        ),
    ]


def rss_mib_of(c: Cluster) -> float:
    from benchlib.core import rss_mib

    assert c.mind is not None
    return rss_mib(c.mind.pid)


def survivor_connected(c: Cluster) -> int:
    r = subprocess.run([*program("mind"), "hands", "--json"], env=c.env, capture_output=True, timeout=60)
    if r.returncode != 0:
        return -1
    return sum(1 for h in json.loads(r.stdout) if h.get("connected"))
