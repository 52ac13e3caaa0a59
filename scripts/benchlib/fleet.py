"""The fleet figures (issue 16): one `exec` on 1,000 simulated Hands at 100 % concurrency, and a
label selection over 10,000 registered Hands.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from benchlib.core import Ctx, Row, med, mib, ms, rss_mib, secs, spread, verdict
from benchlib.figures import _sims, client, figure, run


def _store_with(ctx: Ctx, name: str, n: int, labelled: int) -> tuple[Path, list[str]]:
    """A template database of `n` Hands, the first `labelled` of them `role=web`; their tokens."""
    from mind.store.credentials import Store

    tpl = ctx.dir(name)
    store = Store(tpl / "mind.db")
    tokens = [
        store.add("hand", f"sim{i:05d}", labels={"role": "web"} if i < labelled else {"role": "db"}).token()
        for i in range(n)
    ]
    store.close()
    return tpl, tokens


class _RssPeak:
    """The Mind's RSS sampled every 20 ms on a thread, while a fleet runs: its peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        return self.peak


@figure("fleet", "exec `true` on N simulated Hands at --max-concurrency 100%; label selection over 10,000 Hands")
def fig_fleet(ctx: Ctx) -> list[Row]:
    n = 200 if ctx.quick else 1000
    nprocs = 1 if n <= 200 else 2
    conc = 60 // nprocs
    tpl, tokens = _store_with(ctx, "fleet-template", n, n)
    cred_files = []
    for k in range(nprocs):
        f = tpl / f"creds{k}.txt"
        f.write_text("\n".join(tokens[k::nprocs]) + "\n")
        os.chmod(f, 0o600)
        cred_files.append(f)
    wall_r: list[float] = []
    rss_r: list[float] = []
    rss_idle_r: list[float] = []
    for _ in range(ctx.rounds):
        cl = ctx.cluster("fleet")
        cl.home.mkdir(parents=True, mode=0o700)
        shutil.copy(tpl / "mind.db", cl.home / "mind.db")
        sims: list = []
        try:
            cl.start_mind("--ping-interval", "10")
            sims, _, tot = _sims(
                ctx, cl.url, [["--creds", str(f), "--concurrency", str(conc)] for f in cred_files], cl.tmp
            )
            if tot["connected"] != n:
                raise RuntimeError(f"only {tot['connected']} of {n} simulated hands connected")
            time.sleep(0.5)
            rss_idle_r.append(rss_mib(cl.mind.pid))

            async def go(cl=cl) -> tuple[float, float]:
                async with await client(cl) as mc:
                    peak = _RssPeak(cl.mind.pid)
                    t0 = time.perf_counter()
                    fleet = mc.exec_many(
                        "sim*", "exec", {"argv": ["true"]}, max_concurrency="100%", stream=False, timeout=60
                    )
                    agg = await fleet.wait()
                    dt = time.perf_counter() - t0
                    top = peak.stop()
                    if agg.counts != {"succeeded": n}:
                        raise RuntimeError(f"fleet ended {agg.counts}")
                    return dt, top

            dt, top = run(go(), 120)
            wall_r.append(dt)
            rss_r.append(top)
        finally:
            for s in sims:
                s.stop()
            cl.stop_all()

    # selection by label over 10,000 registered Hands (none connected: the table is what is read)
    total = 10_000
    tpl2, _ = _store_with(ctx, "select-template", total, total // 10)
    sel_r: list[float] = []
    cl = ctx.cluster("select")
    cl.home.mkdir(parents=True, mode=0o700)
    shutil.copy(tpl2 / "mind.db", cl.home / "mind.db")
    try:
        cl.start_mind()

        async def select() -> list[float]:
            async with await client(cl) as mc:
                out = []
                for _ in range(3 if ctx.quick else 10):
                    t0 = time.perf_counter()
                    got = await mc.select_hands("role=web")
                    out.append((time.perf_counter() - t0) * 1000)
                    if len(got) != total // 10:
                        raise RuntimeError(f"role=web selected {len(got)} of {total // 10}")
                return out

        sel_r = run(select(), 60)
    finally:
        cl.stop_all()
    label = f"{n:,} hands" + (" (quick)" if ctx.quick else "")
    ctx.note(
        "fleet",
        f"{nprocs} simulator process(es) (benchlib/handsim.py answer accepted+started+result at once); "
        f"mc.exec_many on one connection, timed from the call to the aggregate; Mind RSS idle with the "
        f"Hands connected {mib(med(rss_idle_r))} MiB, peak sampled every 20 ms during the run",
    )
    ctx.note(
        "fleet", f"selection: select_hands('role=web') over {total:,} registered Hands, 1,000 match, one round trip"
    )
    t, rss, s50 = med(wall_r), med(rss_r), med(sel_r)
    return [
        Row(
            "fleet",
            f"{label}: exec true, all results s",
            secs(t),
            "",
            spread(wall_r, secs),
            "",
            "",
            "<= 3 s",
            verdict(t <= 3.0),
        ),
        Row(
            "fleet",
            f"{label}: Mind RSS peak during the run MiB",
            mib(rss),
            "",
            spread(rss_r, mib),
            "",
            "",
            "reported",
            "n/a",
        ),
        Row(
            "fleet",
            f"label selection over {total:,} hands ms",
            ms(s50),
            ms(max(sel_r)),
            "",
            "",
            "",
            "<= 100 ms",
            verdict(s50 <= 100),
        ),
    ]
