"""The `record` figure (issue "Recording", DESIGN §19): what recording what the Mind relays costs.

Two Minds in the same run, each with a Hand `bench` on this machine: one `mind serve --record all
--record-max-bytes 1G` (every foreground run's streams and every terminal, keystrokes included; a
256 MiB run stays under the bound), one `--record off` (the reference), both with the default
keepalive. Round by round, alternating which side goes first, so noise on this machine hits both
alike:

1. stdout throughput of `mind exec --hand bench -- cat FILE` (the `streams` figure's measure, reused:
   wall time of the CLI, its stdout to /dev/null) for a 256 MiB file (quick: 16 MiB) of random
   bytes, which the recorder stores as they are (its 4 KiB probe does not compress), and one of log
   lines, which it compresses (zlib level 1): target >= 0.9x of the Mind that does not record. Both
   Minds settle (no CPU for a quarter second: the recorder has written everything) before the next
   run, so one side's writing never slows the other's run. Each recorded run must be kept whole
   (recorded bytes = the file's size, no gap): a recorder that fell behind would mark a gap
   instead of slowing the relay, and the throughput would then be bought with missing bytes (the
   row says what share was recorded, the notes the gaps' bytes by why). The Mind's CPU per byte
   relayed (/proc/PID/task: the loop's thread, and the others: the recording writer and the run
   history's), the cores kept busy and the time the loop waited for a CPU (schedstat) show where
   recording's cost goes.
2. keystroke echo of a terminal (`mind exec -t -- cat` on a real pty, the `echo` figure's measure,
   reused) recorded and not: target p50 +<= 0.2 ms.
3. Mind RSS while 100 terminal sessions (100 `mind exec -t` processes on ptys of their own, as
   four client identities, started ten at a time; each a Python loop on the Hand printing about
   3.6 KiB/s of coloured build-log lines) run at once for 10 s (quick: 20 sessions for 4 s), sampled every 0.25 s
   once every session has printed: the median, its growth over the Mind's
   RSS just before, and that growth per session. This phase runs first, on Minds that have not yet
   relayed the big runs (whose buffers would stay in the allocator's pools). Info.
4. bytes on disk per byte recorded, from `recordings.db` in the recording Mind's home (opened
   read-only once every measured run's recording has its end): the stored blocks (sum of
   length(data)) over the `bytes` the listing counts, for the random run, the text run and the
   terminal sessions, and the encoded size before compression; then the SQLite files
   (recordings.db and its -wal) over every byte recorded. The notes compare the stored format's
   zlib level 1 with levels 6 and 9, lzma and bz2 on the blocks of this run (ratio and MB/s of
   one core), which is what the choice of level 1 rests on.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import random
import sqlite3
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from benchlib.core import Ctx, Row, med, ms, pct, ratio, rss_mib, spread, verdict
from benchlib.figures import figure, flat
from benchlib.streams import MIND, cpu_s, echo_times, mind_exec
from mind.core.recording import decode

SESSIONS = 100
SESSIONS_QUICK = 20
"""Quick mode's sessions: enough to see per-session growth, without 200 CLIs starting on two cores
(the suite runs `--quick` beside everything else)."""
BATCH = 10
"""Sessions started at once (then the next ten once these print): 100 CLIs starting together
would hold both cores for seconds."""
USERS = 4
"""Client identities the sessions are spread over: one may hold 128 stream windows in the Mind
(`mind.core.budgets`), and a terminal run takes two (its pty and its stdin)."""
RANDOM_NAME = "rec-random.bin"
TEXT_NAME = "rec-text.log"
SESSION_PY = (
    "import os, sys, time, random\n"
    "stop, tag = sys.argv[1], sys.argv[2]\n"
    "r = random.Random(tag)\n"
    "w = sys.stdout.write\n"
    "t0 = time.monotonic()\n"
    "i = 0\n"
    "while not os.path.exists(stop) and time.monotonic() - t0 < 300:\n"
    "    for j in range(4):\n"
    "        w('\\x1b[1;32m%s\\x1b[0m [%s] step %d.%d compiling src/mod_%03d.c -> obj/mod_%03d.o"
    " \\x1b[2m(%d%%)\\x1b[0m\\n' % (time.strftime('%H:%M:%S'), tag, i, j, r.randrange(1000),"
    " r.randrange(1000), r.randrange(100)))\n"
    "    sys.stdout.flush()\n"
    "    i += 1\n"
    "    time.sleep(max(0.0, t0 + i * 0.1 - time.monotonic()))\n"
)
"""A terminal session's program on the Hand: four lines of about 90 bytes every 0.1 s (about
3.6 KiB/s) until the stop file appears."""


def _cluster(ctx: Ctx, name: str, *mind_args: str):
    """A Mind with these flags and a Hand `bench`, both with the default keepalive (10 s; the test
    cluster's 1 s would call a Hand silent while 100 CLIs start on two cores)."""
    cl = ctx.cluster(name)
    cl.start_mind(*mind_args, "--ping-interval", "10")
    cl.start_hand("bench", "--ping-interval", "10")
    cl.wait_connected("bench")
    return cl


def _random_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n


def _text_file(path: Path, size: int) -> None:
    """`size` bytes of service log lines: 4 MiB of distinct lines (timestamps, request ids,
    paths, statuses), repeated: zlib's 32 KiB window never sees the repetition."""
    r = random.Random(7)
    levels = ["INFO"] * 8 + ["WARN", "DEBUG"]
    services = ["api", "auth", "billing", "search", "worker-1", "worker-2"]
    methods = ["GET"] * 5 + ["POST", "PUT", "DELETE"]
    resources = ["items", "users", "orders", "sessions", "reports"]
    lines: list[str] = []
    total = 0
    t = 1_700_000_000.0
    while total < 4 << 20:
        t += r.expovariate(200)
        st = r.choice([200] * 12 + [201, 204, 304, 400, 404, 500])
        line = (
            f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t))}.{int(t % 1 * 1e6):06d}Z "
            f"{r.choice(levels):<5} [{r.choice(services)}] req={r.getrandbits(64):016x} "
            f"{r.choice(methods)} /api/v1/{r.choice(resources)}/{r.randrange(100_000)} status={st} "
            f"bytes={r.randrange(50, 90_000)} dur_ms={r.lognormvariate(2, 1):.1f}\n"
        )
        lines.append(line)
        total += len(line)
    chunk = "".join(lines).encode()
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n


def _threads_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread (the event loop) and of its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that just ended
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if int(tid) == pid:
            main = cpu
        else:
            other += cpu
    return main, other


def _queued_s(pid: int) -> float:
    """Seconds thread `pid` (a process's main thread) has waited on a run queue for a CPU
    (/proc/PID/task/PID/schedstat); 0 where the kernel keeps no schedstat."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _settle(pids: list[int], timeout: float = 30.0) -> None:
    """Until the processes use no CPU for a quarter second (the recorder has written its last
    block, the history its last rows): the next run starts on a quiet machine."""
    deadline = time.monotonic() + timeout
    last = sum(cpu_s(p) for p in pids)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = sum(cpu_s(p) for p in pids)
        if now - last < 0.015:
            return
        last = now


def _stdout(cl, name: str, size: int) -> dict[str, float]:
    """One `mind exec -- cat NAME`: MiB/s; the Mind's CPU ns/byte (loop thread, other threads)
    from before the run until it has settled after it; the cores the Mind, the Hand and the CLI
    kept busy while it ran; the share of the run's wall time the Mind's loop thread waited for a
    CPU (runnable, not running: what a busy writer thread costs the relay on few cores); and the
    seconds the Mind took to settle after the run's end (the recorder writing what it queued)."""
    assert cl.mind is not None
    mind, hand = cl.mind.pid, cl.hands["bench"].pid
    _settle([mind, hand])
    m0, o0 = _threads_cpu(mind)
    h0, q0 = cpu_s(hand), _queued_s(mind)
    wall, cli = mind_exec([MIND, "exec", "--hand", "bench", "--", "cat", name], cl.env, None)
    m1, o1 = _threads_cpu(mind)
    h1, q1 = cpu_s(hand), _queued_s(mind)
    t1 = time.monotonic()
    _settle([mind, hand])
    tail = time.monotonic() - t1 - 0.25  # the last quiet quarter second is not the writer's
    m2, o2 = _threads_cpu(mind)
    return {
        "mibs": size / wall / 2**20,
        "loop_ns": (m2 - m0) * 1e9 / size,
        "threads_ns": (o2 - o0) * 1e9 / size,
        "busy": ((m1 - m0) + (o1 - o0) + (h1 - h0) + cli) / wall,
        "tail_s": max(0.0, tail),
        "queued": (q1 - q0) / wall,
    }


def _printed(out: Path, procs: list[subprocess.Popen[bytes]], first: int, end: int, timeout: float = 60) -> None:
    """Until sessions first..end-1 have each printed (their output files are not empty)."""
    deadline = time.monotonic() + timeout
    while not all((out / f"{i}.out").stat().st_size > 0 for i in range(first, end)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"terminal sessions {first}..{end - 1} did not all print within {timeout:.0f} s")
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a terminal session's mind exec exited {dead[0]} at start (see its output in {out})")
        time.sleep(0.05)


def _sessions(cl, ctx: Ctx, seconds: float, tag: str, n: int) -> tuple[float, list[float], float]:
    """`n` terminal sessions printing at once; returns the Mind's RSS (MiB) just before, its
    samples while all print, and the seconds it took until every session had printed."""
    assert cl.mind is not None
    root = cl.tmp / "root-bench"
    stop = root / f"stop-{tag}"
    out = ctx.dir(f"sessions-{tag}")
    _settle([cl.mind.pid, cl.hands["bench"].pid])
    creds = [cl.client_credential(f"user{k}") for k in range(USERS)]
    idle = rss_mib(cl.mind.pid)
    procs: list[subprocess.Popen[bytes]] = []
    files = []
    masters: list[int] = []
    t0 = time.monotonic()
    try:
        for i in range(n):
            if i and i % BATCH == 0:
                _printed(out, procs, i - BATCH, i)
            f = open(out / f"{i}.out", "wb")
            files.append(f)
            master, tty = os.openpty()  # stdin a terminal (else -t runs without one), nobody typing
            masters.append(master)
            argv = [MIND, "exec", "-t", "--hand", "bench", "--", sys.executable, "-S", "-c", SESSION_PY]
            try:
                procs.append(
                    subprocess.Popen(
                        [*argv, str(stop), f"{tag}-{i}"],
                        env={**cl.env, "TERM": "xterm", "MINDHAND_CREDENTIAL": str(creds[i % len(creds)])},
                        stdin=tty,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            finally:
                os.close(tty)
        _printed(out, procs, 0, n)
        ramp = time.monotonic() - t0
        samples: list[float] = []
        end_at = time.monotonic() + seconds
        while time.monotonic() < end_at:
            samples.append(rss_mib(cl.mind.pid))
            time.sleep(0.25)
        stop.write_bytes(b"")
        for p in procs:
            code = p.wait(timeout=60)
            if code != 0:
                raise RuntimeError(f"a terminal session's mind exec exited {code}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for fd in masters:
            os.close(fd)
        for f in files:
            f.close()
        stop.unlink(missing_ok=True)
    return idle, samples, ramp


# --- what recordings.db holds ------------------------------------------------------------------


def _db(cl) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{cl.home / 'recordings.db'}?mode=ro", uri=True, timeout=10)


def _class(kind: str, command: dict[str, Any]) -> str:
    argv = [str(a) for a in command.get("argv", [])]
    if kind == "terminal":
        return "terminal" if "-c" in argv else "echo"
    if argv[-1:] == [RANDOM_NAME]:
        return "random"
    if argv[-1:] == [TEXT_NAME]:
        return "text"
    return "other"


def _recordings(cl) -> list[dict[str, Any]]:
    """Every recording with its stored sizes: class, state, bytes, gaps, blocks, compressed
    blocks, sum(length(data)), sum(raw_len)."""
    db = _db(cl)
    try:
        rows = db.execute(
            "SELECT r.run_id, r.kind, r.command, r.state, r.bytes, r.gaps, count(b.seq), "
            "coalesce(sum(b.compressed), 0), coalesce(sum(length(b.data)), 0), coalesce(sum(b.raw_len), 0) "
            "FROM recordings r LEFT JOIN recording_blocks b ON b.run_id = r.run_id GROUP BY r.run_id"
        ).fetchall()
    finally:
        db.close()
    out = []
    for run_id, kind, command, state, nbytes, gaps, blocks, packed, stored, raw in rows:
        try:
            cmd = json.loads(command)
        except ValueError:
            cmd = {}
        out.append(
            {
                "run_id": run_id,
                "class": _class(kind, cmd),
                "state": state,
                "bytes": nbytes,
                "gaps": gaps,
                "blocks": blocks,
                "compressed": packed,
                "stored": stored,
                "raw": raw,
            }
        )
    return out


def _ended(cl, classes: set[str], want: dict[str, int], timeout: float = 30.0) -> list[dict[str, Any]]:
    """The recordings, once `want[class]` recordings of each class in `classes` have their end."""
    deadline = time.monotonic() + timeout
    while True:
        recs = _recordings(cl)
        done = {c: sum(1 for r in recs if r["class"] == c and r["state"] is not None) for c in classes}
        if all(done[c] >= want[c] for c in classes):
            return recs
        if time.monotonic() > deadline:
            raise RuntimeError(f"recordings without their end after {timeout:.0f} s: have {done}, want {want}")
        time.sleep(0.25)


def _raw_blocks(cl, cls: str, recs: list[dict[str, Any]], limit: int) -> list[bytes]:
    """Up to `limit` bytes of the encoded blocks (before compression) of recordings of class `cls`."""
    ids = [r["run_id"] for r in recs if r["class"] == cls]
    out: list[bytes] = []
    total = 0
    db = _db(cl)
    try:
        for run_id in ids:
            for data, packed in db.execute(
                "SELECT data, compressed FROM recording_blocks WHERE run_id = ? ORDER BY seq", (run_id,)
            ):
                raw = zlib.decompress(data) if packed else bytes(data)
                out.append(raw)
                total += len(raw)
                if total >= limit:
                    return out
    finally:
        db.close()
    return out


def _gap_bytes(cl, run_ids: list[str]) -> dict[str, int]:
    """Bytes relayed but not recorded in these recordings, by why (their `g` events)."""
    out: dict[str, int] = {}
    db = _db(cl)
    try:
        for run_id in run_ids:
            for data, packed in db.execute(
                "SELECT data, compressed FROM recording_blocks WHERE run_id = ? ORDER BY seq", (run_id,)
            ):
                for e in decode(zlib.decompress(data) if packed else bytes(data)):
                    if e[1] == "g":
                        out[e[4]] = out.get(e[4], 0) + e[3]
    finally:
        db.close()
    return out


CODECS = {
    "zlib-1 (stored)": lambda b: zlib.compress(b, 1),
    "zlib-6": lambda b: zlib.compress(b, 6),
    "zlib-9": lambda b: zlib.compress(b, 9),
    "lzma-0": lambda b: lzma.compress(b, preset=0),
    "bz2-1": lambda b: bz2.compress(b, 1),
}


def _codecs(blocks: list[bytes]) -> str:
    """Each codec on these blocks, one at a time as the writer compresses: ratio, MB/s."""
    size = sum(len(b) for b in blocks)
    parts = []
    for name, fn in CODECS.items():
        t0 = time.perf_counter()
        packed = sum(len(fn(b)) for b in blocks)
        dt = time.perf_counter() - t0
        parts.append(f"{name} {packed / size:.3f} at {size / dt / 1e6:.0f} MB/s")
    return ", ".join(parts)


def _per_byte(recs: list[dict[str, Any]], cls: str) -> tuple[float, float, int, int, int, int]:
    """(stored/recorded, encoded/recorded, recorded bytes, blocks, compressed blocks, gaps)."""
    mine = [r for r in recs if r["class"] == cls]
    recorded = sum(r["bytes"] for r in mine)
    stored = sum(r["stored"] for r in mine)
    raw = sum(r["raw"] for r in mine)
    if not recorded:
        raise RuntimeError(f"no {cls} bytes were recorded")
    return (
        stored / recorded,
        raw / recorded,
        recorded,
        sum(r["blocks"] for r in mine),
        sum(r["compressed"] for r in mine),
        sum(r["gaps"] for r in mine),
    )


# --- the figure ----------------------------------------------------------------------------------


@figure(
    "record",
    "recording (--record all) against none: stdout MiB/s, pty echo, RSS of 100 sessions (quick: 20), bytes on disk",
)
def fig_record(ctx: Ctx) -> list[Row]:
    size = (16 << 20) if ctx.quick else (256 << 20)
    seconds = 4.0 if ctx.quick else 10.0
    sessions = SESSIONS_QUICK if ctx.quick else SESSIONS
    n_echo = 50 if ctx.quick else 200
    rec = _cluster(ctx, "record-all", "--record", "all", "--record-max-bytes", "1G")
    off = _cluster(ctx, "record-off", "--record", "off")
    sides = {"all": rec, "off": off}

    def order(i: int) -> list[str]:
        return ["all", "off"] if i % 2 == 0 else ["off", "all"]

    # 3. terminal sessions first, on Minds that have not relayed the big runs yet
    idle: dict[str, list[float]] = {"all": [], "off": []}
    during: dict[str, list[list[float]]] = {"all": [], "off": []}
    ramps: list[float] = []
    for i in range(ctx.rounds):
        for side in order(i):
            before, samples, ramp = _sessions(sides[side], ctx, seconds, f"{side}{i}", sessions)
            idle[side].append(before)
            during[side].append(samples)
            ramps.append(ramp)

    # 2. keystroke echo
    echo: dict[str, list[list[float]]] = {"all": [], "off": []}
    for i in range(ctx.rounds):
        for side in order(i):
            cl = sides[side]
            _settle([p for c in (rec, off) for p in (c.mind.pid, c.hands["bench"].pid)])
            echo[side].append(echo_times({**cl.env, "TERM": "xterm"}, n_echo))

    # 1. stdout throughput
    for cl in (rec, off):
        root = cl.tmp / "root-bench"
        if cl is rec:
            _random_file(root / RANDOM_NAME, size)
            _text_file(root / TEXT_NAME, size)
        else:
            for name in (RANDOM_NAME, TEXT_NAME):
                os.link(rec.tmp / "root-bench" / name, root / name)
    rate: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[dict[str, float]]] = {}
    for i in range(ctx.rounds):
        for data in (RANDOM_NAME, TEXT_NAME):
            for side in order(i):
                got = _stdout(sides[side], data, size)
                rate.setdefault((side, data), []).append(got["mibs"])
                cpu.setdefault((side, data), []).append(got)

    # 4. what is on disk
    want = {"random": ctx.rounds, "text": ctx.rounds, "terminal": sessions * ctx.rounds}
    recs = _ended(rec, set(want), want)
    per = {c: _per_byte(recs, c) for c in ("random", "text", "terminal")}
    whole = [r for r in recs if r["class"] in ("random", "text") and r["state"] is not None]
    short = [r for r in whole if r["bytes"] != size or r["gaps"]]
    kept = sum(r["bytes"] for r in whole) / (size * len(whole)) if whole else 0.0
    lost = _gap_bytes(rec, [r["run_id"] for r in short])
    db_size = (rec.home / "recordings.db").stat().st_size
    wal = rec.home / "recordings.db-wal"
    wal_size = wal.stat().st_size if wal.exists() else 0
    recorded_all = sum(r["bytes"] for r in recs)
    stored_all = sum(r["stored"] for r in recs)
    codec_notes = {
        cls: _codecs(_raw_blocks(rec, cls, recs, 8 << 20 if cls == "text" else 2 << 20))
        for cls in ("text", "terminal", "random")
    }

    # --- rows ---
    rows: list[Row] = []
    for data, label in ((RANDOM_NAME, "random bytes"), (TEXT_NAME, "log text")):
        ours, ref = rate[("all", data)], rate[("off", data)]
        o, r = med(ours), med(ref)
        rows.append(
            Row(
                "record",
                f"stdout MiB/s, {size >> 20} MiB of {label}, --record all",
                f"{o:.0f}",
                "",
                spread(ours, lambda v: f"{v:.0f}"),
                f"{r:.0f} (--record off)",
                ratio(o, r),
                ">= 0.9x",
                verdict(o >= 0.9 * r),
            )
        )
    cpu_cell = {}
    for side in ("all", "off"):
        cells = []
        for data in (RANDOM_NAME, TEXT_NAME):
            got = cpu[(side, data)]
            cells.append(f"{med(c['loop_ns'] for c in got):.1f}+{med(c['threads_ns'] for c in got):.1f}")
            what = "random" if data == RANDOM_NAME else "text"
            ctx.note(
                "record",
                f"stdout {what}, --record {side}: Mind+Hand+CLI kept {med(c['busy'] for c in got):.2f} cores "
                f"busy (of {os.cpu_count()}), the Mind's loop waited for a CPU "
                f"{med(c['queued'] for c in got):.0%} of the run; the Mind settled {med(c['tail_s'] for c in got):.2f} s after the run's end",
            )
        cpu_cell[side] = " / ".join(cells)
    rows.append(
        Row(
            "record",
            "Mind CPU ns/byte (loop+threads), random / text",
            cpu_cell["all"],
            "",
            "",
            f"{cpu_cell['off']} (--record off)",
            "",
            "info",
            "info",
        )
    )
    rows.append(
        Row(
            "record",
            f"recorded runs kept whole ({len(whole)} runs of {size >> 20} MiB)",
            f"{len(whole) - len(short)} of {len(whole)}",
            "",
            "",
            f"{kept:.1%} of their bytes recorded",
            "",
            "every byte, no gap",
            verdict(not short and len(whole) == 2 * ctx.rounds),
        )
    )
    e_all, e_off = flat(echo["all"]), flat(echo["off"])
    a50, f50 = med(e_all), med(e_off)
    rows.append(
        Row(
            "record",
            "pty keystroke echo p50 ms, recorded",
            ms(a50),
            ms(pct(e_all, 99)),
            spread([med(x) for x in echo["all"]], ms),
            f"{ms(f50)} (--record off; p99 {ms(pct(e_off, 99))})",
            f"{a50 - f50:+.3f} ms",
            "+<= 0.2 ms",
            verdict(a50 - f50 <= 0.2),
        )
    )
    rss = {s: med(flat(during[s])) for s in sides}
    grow = {s: med([med(d) - b for d, b in zip(during[s], idle[s], strict=True)]) for s in sides}
    rows.append(
        Row(
            "record",
            f"Mind RSS MiB, {sessions} terminal sessions printing, recorded",
            f"{rss['all']:.1f}",
            f"{max(flat(during['all'])):.1f} (peak)",
            spread([med(d) for d in during["all"]], lambda v: f"{v:.1f}"),
            f"{rss['off']:.1f} (--record off)",
            ratio(rss["all"], rss["off"]),
            "info",
            "info",
        )
    )
    rows.append(
        Row(
            "record",
            "  growth over idle MiB (KiB per session), recorded",
            f"{grow['all']:.1f} ({grow['all'] * 1024 / sessions:.0f})",
            "",
            "",
            f"{grow['off']:.1f} ({grow['off'] * 1024 / sessions:.0f}) (--record off)",
            f"{(grow['all'] - grow['off']) * 1024 / sessions:+.0f} KiB/session",
            "info",
            "info",
        )
    )
    for cls, label in (
        ("random", f"random bytes ({size >> 20} MiB runs)"),
        ("text", f"log text ({size >> 20} MiB runs)"),
        ("terminal", f"{sessions} terminal sessions"),
    ):
        stored, raw, recorded, blocks, packed, gaps = per[cls]
        rows.append(
            Row(
                "record",
                f"stored bytes per recorded byte: {label}",
                f"{stored:.3f}",
                "",
                "",
                f"{raw:.3f} encoded, before zlib",
                "",
                "info",
                "info",
            )
        )
        ctx.note(
            "record",
            f"{cls}: {recorded / 2**20:.1f} MiB recorded in {blocks} blocks ({packed} compressed), {gaps} gaps",
        )
    rows.append(
        Row(
            "record",
            "SQLite bytes (recordings.db + -wal) per recorded byte",
            f"{(db_size + wal_size) / recorded_all:.3f}",
            "",
            "",
            f"{db_size / recorded_all:.3f} db alone; {stored_all / recorded_all:.3f} blocks' data",
            "",
            "info",
            "info",
        )
    )
    if lost:
        ctx.note(
            "record",
            "the recorder did not keep up with the stdout runs: gaps of "
            + ", ".join(f"{n / 2**20:.1f} MiB ({why})" for why, n in sorted(lost.items()))
            + " (`behind`: more than the recorder's BEHIND_BYTES were queued for the writer)",
        )
    ctx.note(
        "record",
        f"two Minds, each with a Hand `bench`: `--record all --record-max-bytes 1G` and `--record off`; "
        f"{ctx.rounds} round(s), alternating which goes first; stdout: `mind exec --hand bench -- cat FILE` to "
        f"/dev/null, both Minds settled (no CPU for 0.25 s) before and after each run; CPU from /proc/PID/task "
        f"(loop = the main thread; threads = the recording writer, the history writer and the rest)",
    )
    ctx.note(
        "record",
        f"echo: `mind exec -t -- cat`, {n_echo} keystrokes a round per side (--record all keeps keystrokes too); "
        f"sessions: {sessions} `mind exec -t` each running a Python loop printing ~3.6 KiB/s, "
        f"RSS every 0.25 s for {seconds:.0f} s once all printed (all printing after {med(ramps):.1f} s median); "
        f"idle RSS before: all {spread(idle['all'], lambda v: f'{v:.1f}')}, off {spread(idle['off'], lambda v: f'{v:.1f}')}",
    )
    ctx.note(
        "record",
        f"recordings.db {db_size / 2**20:.1f} MiB + wal {wal_size / 2**20:.1f} MiB for "
        f"{recorded_all / 2**20:.1f} MiB recorded in {len(recs)} recordings (blocks' data {stored_all / 2**20:.1f} MiB; "
        f"echo runs included, still open: the killed CLI's run waits for its resume window)",
    )
    for cls, text in codec_notes.items():
        ctx.note("record", f"codecs on the {cls} blocks (stored size per encoded byte, one core): {text}")
    return rows
