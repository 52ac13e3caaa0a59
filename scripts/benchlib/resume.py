"""The continuity figures (issue 22): how long a run's output stops when a leg is cut and healed, or
the Mind restarts; whether bytes survive many cuts; what unattended runs cost in memory.

- `resume`: a `mind exec` of a command printing its own clock every 5 ms, the Hand behind one fault
  proxy and the CLI behind another. Each sample cuts one leg (a reset with the link back at once, or
  a blackhole healed after 2 s) and measures from the heal to the arrival of the first line produced
  after the cut (a line produced after the cut cannot arrive before the leg is back). The restart
  rows stop the Mind (SIGTERM, then kill -9), start it again on the same port, and measure from the
  moment it listens to that first line. Targets: p50 <= 100 ms per leg on loopback, <= 2 s after a
  restart. No reference: nothing else resumes a run (ssh over TCP rides out a blackhole by waiting,
  and dies at a reset or an sshd restart).
- `cuts`: `seq` streamed through `mind exec` (~1 GiB full, 64 MiB quick) while random cuts land on
  either leg (a reset, or one time in ten a 50-300 ms blackhole), one after another as soon as the bytes flow again:
  the received sha256 against `seq` run locally (0 lost, 0 duplicated) and the time against the same
  stream uncut, in the same run.
- `unattended`: RSS of the Mind and the Hand before and after 1,000 runs (100 quick) that each wrote
  64 KiB nobody read and were then left by their client: what continuity holds for them, bounded by
  the runs' windows (the Hand keeps at most a window per stream; the Mind holds no bytes).

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import hashlib
import random
import signal
import subprocess
import threading
import time
from typing import Any

from benchlib.core import Ctx, Row, med, mib, ms, pct, rss_mib, secs, verdict
from benchlib.figures import figure, run

WINDOW_S = 120
TICKER = (
    "import time,sys\nwhile True:\n    sys.stdout.write('%.6f\\n' % time.time()); sys.stdout.flush(); time.sleep(0.005)"
)
RESUME_TARGET_S = 0.100
BLACKHOLE_SHARE = 0.1
"""Of the `cuts` figure's cuts, the share that are blackholes: the proxy discards what it gets, so
each one is found only by a keepalive (about 1.5 s at the cluster's 1 s ping interval) where a
reset costs ~60 ms; 1,000 cuts at half each would take half an hour."""
RESTART_TARGET_S = 2.0


class _Lines:
    """A `mind exec` whose stdout is the remote clock, one line per 5 ms: every line's arrival time
    and production time, read on a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        self.seen: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for raw in self.p.stdout:
            now = time.time()
            try:
                made = float(raw)
            except ValueError:
                continue
            with self._lock:
                self.seen.append((now, made))

    def first_after(self, t: float, timeout: float) -> float | None:
        """Arrival time of the first line produced after `t`, waiting up to `timeout`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                later = [a for a, m in self.seen[-4000:] if m > t]
            if later:
                return min(later)
            if self.p.poll() is not None:
                return None
            time.sleep(0.002)
        return None

    def stop(self) -> str:
        self.p.send_signal(signal.SIGINT)
        try:
            _, err = self.p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            _, err = self.p.communicate()
        return err.decode(errors="replace")[-400:]


def _cluster(ctx: Ctx, name: str):
    cl = ctx.cluster(name)
    cl.resume_window = WINDOW_S
    cl.start_mind()
    cl.start_hand("box", proxy=True)
    cl.wait_connected("box")
    front = cl.start_proxy()  # the client's leg
    env = dict(cl.env, MINDHAND_URL=front.url)
    return cl, front, env


def _exec(cl, argv: list[str]) -> list[str]:
    from mind.testing.cluster import program

    return [*program("mind"), "exec", "box", "--", *argv]


def _sample(lines: _Lines, cut, heal, hold: float) -> float | None:
    t_cut = time.time()
    cut()
    if hold:
        time.sleep(hold)
    heal()
    t_heal = time.time()
    arrived = lines.first_after(t_cut, 30.0)
    return None if arrived is None else max(0.0, arrived - t_heal)


@figure("resume", "time from a healed link (or a restarted Mind) to the run's output flowing again")
def fig_resume(ctx: Ctx) -> list[Row]:
    n = 5 if ctx.quick else 30
    restarts = 2 if ctx.quick else 5
    cl, front, env = _cluster(ctx, "resume")
    hand_leg = cl.proxy
    assert hand_leg is not None
    kinds: dict[str, tuple[Any, Any, Any, float]] = {
        "hand leg reset": (hand_leg, lambda p: p.cut("rst"), lambda p: None, 0.0),
        "client leg reset": (front, lambda p: p.cut("rst"), lambda p: None, 0.0),
        "hand leg blackhole 2 s": (hand_leg, lambda p: p.blackhole(), lambda p: p.clear(), 2.0),
        "client leg blackhole 2 s": (front, lambda p: p.blackhole(), lambda p: p.clear(), 2.0),
    }
    got: dict[str, list[float]] = {k: [] for k in kinds}
    failed: dict[str, int] = {k: 0 for k in kinds}
    restart: dict[str, list[float]] = {"SIGTERM": [], "kill -9": []}
    lines = _Lines(_exec(cl, ["python3", "-u", "-c", TICKER]), env)
    try:
        if lines.first_after(0, 30) is None:
            raise RuntimeError(f"the ticker never printed: {lines.stop()}")
        for _ in range(n):
            for kind, (proxy, cut, heal, hold) in kinds.items():
                s = _sample(lines, lambda p=proxy, c=cut: c(p), lambda p=proxy, h=heal: h(p), hold)
                if s is None:
                    failed[kind] += 1
                    break
                got[kind].append(s)
                time.sleep(0.2)
        for how, sig in (("SIGTERM", signal.SIGTERM), ("kill -9", signal.SIGKILL)):
            for _ in range(restarts):
                assert cl.mind is not None
                t_cut = time.time()
                cl.mind.signal(sig)
                cl.mind.p.wait(timeout=20)
                cl.start_mind(port=cl.port)
                listening = time.time()
                arrived = lines.first_after(t_cut, 30.0)
                if arrived is None:
                    failed.setdefault(how, 0)
                    failed[how] = failed.get(how, 0) + 1
                    break
                restart[how].append(max(0.0, arrived - listening))
                time.sleep(0.5)
    finally:
        tail = lines.stop()
        cl.stop_all()
    rows: list[Row] = []
    for kind, xs in got.items():
        ok = bool(xs) and not failed[kind] and med(xs) <= RESUME_TARGET_S
        rows.append(
            Row(
                "resume",
                f"{kind}: heal -> output (ms)",
                ms(med(xs) * 1000) if xs else "-",
                ms(pct(xs, 99) * 1000) if xs else "-",
                f"{len(xs)} samples" + (f", {failed[kind]} never resumed" if failed[kind] else ""),
                "",
                "",
                f"p50 <= {RESUME_TARGET_S * 1000:.0f} ms",
                verdict(ok),
            )
        )
    for how, xs in restart.items():
        ok = bool(xs) and not failed.get(how) and max(xs) <= RESTART_TARGET_S
        rows.append(
            Row(
                "resume",
                f"mind {how} + restart: listening -> output (s; p99 col: worst)",
                secs(med(xs)) if xs else "-",
                secs(max(xs)) if xs else "-",
                f"{len(xs)} restarts" + (f", {failed.get(how)} never resumed" if failed.get(how) else ""),
                "",
                "",
                f"<= {RESTART_TARGET_S:g} s",
                verdict(ok),
            )
        )
    if any(failed.values()):
        ctx.note("resume", f"a run did not resume; its CLI's last words: {tail}")
    return rows


def _seq_bytes(n: int) -> tuple[int, str]:
    """Size and sha256 of `seq 1 n`'s output, by running it here."""
    h = hashlib.sha256()
    size = 0
    with subprocess.Popen(["seq", "1", str(n)], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        while chunk := p.stdout.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _stream(cl, env: dict[str, str], n: int, cutter=None) -> tuple[float, int, str, int, str]:
    """`mind exec box -- seq 1 n`, hashed as it arrives: (seconds, bytes, sha256, exit code, stderr
    tail). `cutter(progress)` runs on a thread while the stream flows; `progress()` is bytes so far."""
    p = subprocess.Popen(_exec(cl, ["seq", "1", str(n)]), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    h = hashlib.sha256()
    got = [0]
    stop = threading.Event()
    t = threading.Thread(target=cutter, args=(lambda: got[0], stop), daemon=True) if cutter else None
    start = time.monotonic()
    if t:
        t.start()
    assert p.stdout is not None
    while chunk := p.stdout.read(1 << 20):
        h.update(chunk)
        got[0] += len(chunk)
    p.wait(timeout=600)
    took = time.monotonic() - start
    stop.set()
    if t:
        t.join(timeout=60)
    assert p.stderr is not None
    return took, got[0], h.hexdigest(), p.returncode, p.stderr.read().decode(errors="replace")[-400:]


@figure("cuts", "random resets and blackholes on either leg during one long stream: bytes lost/duplicated, cost")
def fig_cuts(ctx: Ctx) -> list[Row]:
    want_cuts = 20 if ctx.quick else 1000
    n = 7_000_000 if ctx.quick else 113_000_000  # ~64 MiB / ~1 GiB of seq output
    size, digest = _seq_bytes(n)
    cl, front, env = _cluster(ctx, "cuts")
    rng = random.Random(22)
    cuts = {"reset": 0, "blackhole": 0}
    uncut: list[float] = []
    cut_times: list[float] = []
    results: list[tuple[int, str, int, str]] = []

    def cutter(progress, stop: threading.Event) -> None:
        legs = [cl.proxy, front]
        # the first cut once the stream flows: a cut before the run reached the Hand is a refused
        # start (`hand_offline`: the Hand was away when it came), not a cut during the stream
        deadline = time.monotonic() + 60
        while not stop.is_set() and progress() == 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        while not stop.is_set() and sum(cuts.values()) < want_cuts:
            before = progress()
            proxy = rng.choice(legs)
            if rng.random() >= BLACKHOLE_SHARE:
                proxy.cut("rst")
                cuts["reset"] += 1
            else:
                proxy.blackhole()
                time.sleep(rng.uniform(0.05, 0.3))
                proxy.clear()
                cuts["blackhole"] += 1
            # the next cut once bytes flow again (bounded: a stuck stream ends the figure below)
            deadline = time.monotonic() + 60
            while not stop.is_set() and progress() == before and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))

    try:
        for _ in range(1):
            took, got, sha, rc, err = _stream(cl, env, n)
            uncut.append(took)
            results.append((got, sha, rc, err))
            took, got, sha, rc, err = _stream(cl, env, n, cutter)
            cut_times.append(took)
            results.append((got, sha, rc, err))
    finally:
        cl.stop_all()
    bad = [r for r in results if (r[0], r[1], r[2]) != (size, digest, 0)]
    rate = lambda t: size / t / (1 << 20)
    done = sum(cuts.values())
    rows = [
        Row(
            "cuts",
            f"{mib(size / (1 << 20))} MiB through {done} cuts ({cuts['reset']} resets, {cuts['blackhole']} blackholes): sha256 equal",
            "yes" if not bad else "NO",
            "",
            "",
            f"seq 1 {n} here",
            "",
            "0 lost, 0 duplicated",
            verdict(not bad and done >= want_cuts),
        ),
        Row(
            "cuts",
            "throughput with the cuts / uncut",
            f"{rate(med(cut_times)):.1f} MiB/s",
            "",
            "",
            f"{rate(med(uncut)):.1f} MiB/s uncut",
            f"{med(uncut) / med(cut_times):.2f}x",
            "reported",
            "n/a",
        ),
    ]
    if bad:
        ctx.note("cuts", f"stream results (bytes, sha, exit, stderr): {[(b[0], b[1][:12], b[2], b[3]) for b in bad]}")
    if done < want_cuts:
        ctx.note("cuts", f"only {done} of {want_cuts} cuts landed before the stream ended")
    return rows


@figure("unattended", "Mind and Hand RSS with many runs left unattended (each wrote 64 KiB nobody read)")
def fig_unattended(ctx: Ctx) -> list[Row]:
    n = 100 if ctx.quick else 1000
    cl = ctx.cluster("unattended")
    cl.resume_window = 600
    try:
        cl.start_mind()
        cl.start_hand("box")
        cl.wait_connected("box")
        assert cl.mind is not None
        hand = cl.hands["box"]
        time.sleep(1.0)
        mind0, hand0 = rss_mib(cl.mind.pid), rss_mib(hand.pid)
        started = run(_leave_runs(cl, n), 600)
        time.sleep(2.0)  # the output reaches the Hand's streams; the client is gone
        mind1, hand1 = rss_mib(cl.mind.pid), rss_mib(hand.pid)
        runs = cl.cli("runs", "--unattended", "--json", "--limit", str(n + 10))
        unattended = runs.stdout.count(b'"run_id"') if runs.returncode == 0 else -1
    finally:
        cl.stop_all()
    per_mind = (mind1 - mind0) * 1024 / max(1, started)
    per_hand = (hand1 - hand0) * 1024 / max(1, started)
    # the Hand keeps what nobody acknowledged (64 KiB a run here, never more than the window) plus
    # the run's bookkeeping (its process's pipes, tasks, buffers); the Mind keeps a record and its
    # relays' counters, never bytes: 16 KiB a run is its budget
    return [
        Row(
            "unattended",
            f"Mind RSS with {started} unattended runs",
            f"{mind1:.0f} MiB",
            "",
            f"{per_mind:.1f} KiB a run",
            f"{mind0:.0f} MiB before",
            "",
            "<= 16 KiB a run",
            verdict(started == n and per_mind <= 16),
        ),
        Row(
            "unattended",
            f"Hand RSS with {started} unattended runs",
            f"{hand1:.0f} MiB",
            "",
            f"{per_hand:.1f} KiB a run",
            f"{hand0:.0f} MiB before",
            "",
            "<= the window (1 MiB) a run",
            verdict(started == n and per_hand <= 1024),
        ),
        Row(
            "unattended",
            "listed by mind runs --unattended",
            str(unattended),
            "",
            "",
            "",
            "",
            f"{n}",
            verdict(unattended == n),
        ),
    ]


PER_CLIENT = 50
"""Streamed runs started by one client identity: under its budget of stream windows in flight
(`mind.core.budgets`: 128 windows, two a run here), so the figure needs several identities."""


async def _leave_runs(cl, n: int) -> int:
    """`n` streamed runs that each print 64 KiB and sleep; each client reads nothing and leaves."""
    started = 0
    for k in range(0, n, PER_CLIENT):
        mc = await cl.client(f"leaver{k // PER_CLIENT}")
        try:
            for _ in range(min(PER_CLIENT, n - k)):
                argv = ["sh", "-c", "head -c 65536 /dev/zero; sleep 900"]
                await mc.start("box", "exec", {"argv": argv}, timeout=1800)
                started += 1
        finally:
            await mc.close()
    return started
