"""The `mind cp` figures (issue 15): 1 GiB up and down against `scp` to localhost in the same run,
the Mind's RSS growth during the copy, a `mind cp --resume` after a copy killed at 50 %, and the
bytes a cut at 50 % costs a copy that rides it out within one command.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from benchlib.core import PY, Ctx, Row, med, ratio, rss_mib, spread, throughput_row, verdict
from benchlib.figures import basic, figure, sshd
from benchlib.streams import tls_cluster
from protocol import limits

MIND = str(Path(PY).parent / "mind")
WINDOW = limits.STREAM_WINDOW
"""What a resume may send twice: the bytes in flight, at most one stream window."""


def _random_file(path: Path, size: int) -> Path:
    if not path.exists():
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    return path


class _Peak:
    """Samples a process's RSS every 50 ms while a copy runs (the peak above the start)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = rss_mib(pid)
        self.peak = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> _Peak:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    @property
    def growth(self) -> float:
        return self.peak - self.start


def _timed(argv: list[str], env: dict[str, str], timeout: float = 900) -> tuple[float, bytes]:
    """`argv`'s wall time, started on a clean disk: what earlier commands (or the source's creation)
    left dirty is flushed first, untimed. Our copies end with a `syncfs`, which would otherwise pay
    for everyone's dirty pages (a tree's first upload took 3.0 s against 1.2 s for the next, because
    it flushed the 5,000 files the benchmark had just written); rsync and scp never sync."""
    os.sync()
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... exited {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}")
    return dt, r.stdout


def _cache(path: Path, cached: bool) -> None:
    """Put `path` in the page cache (read it through), or take it out (written back, then dropped),
    untimed. A download's speed depends on where its file's bytes are: an upload through `mind cp`
    leaves its file on the disk and out of the cache (`protocol/io/writeback.py`), a file just
    written by `_random_file` or read by an upload sits in it. Ours and scp's downloads read the same
    file from the same state, each state measured on its own (until 2026-12-07 ours read the file its
    upload had just left uncached, scp its cached source: ours met the disk, scp the cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if cached:
            buf = bytearray(4 << 20)
            while os.readv(fd, [buf]):
                pass
        else:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _scp_argv(ssh: object, src: str, dst: str) -> list[str]:
    """scp with the options of our own sshd's ssh command line (`-p PORT` becomes `-P PORT`)."""
    argv = ssh.argv()[:-1]  # type: ignore[attr-defined]  # without the destination host
    out = ["scp", "-q", "-O"]  # the classic scp protocol: our sshd has no sftp subsystem
    i = 1
    while i < len(argv):
        if argv[i] == "-p":
            out += ["-P", argv[i + 1]]
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return [*out, src, dst]


@figure(
    "cp",
    "`mind cp` 1 GiB up and down against scp (quick: 32 MiB); Mind RSS; --resume after a kill at 50 %; a cut within one copy",
)
def fig_cp(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    size = (32 << 20) if ctx.quick else (1 << 30)
    work = ctx.dir("cp")
    src = _random_file(work / "src.bin", size)
    root = cl.tmp / "root-bench"
    env = dict(cl.env)
    assert cl.mind is not None
    s = sshd(ctx)
    ssh = None if isinstance(s, str) else s
    rows: list[Row] = []
    up_r: list[float] = []
    down_r: list[float] = []
    scp_up: list[float] = []
    scp_down: list[float] = []
    growth: list[float] = []
    tls = tls_cluster(ctx)
    tls_env, tls_root = dict(tls.env), tls.tmp / "root-bench"
    tls_up: list[float] = []
    tls_down: list[float] = []
    cold_r: list[float] = []
    scp_cold: list[float] = []
    for i in range(ctx.rounds):
        # over wss:// in turns with plain, so both meet the same machine (issue 40 item 3: within 1.5x)
        dt, _ = _timed([MIND, "cp", str(src), f"bench:cp-{i}.bin"], tls_env)
        tls_up.append(size / dt / 2**20)
        _cache(tls_root / f"cp-{i}.bin", cached=True)
        dt, _ = _timed([MIND, "cp", f"bench:cp-{i}.bin", str(work / f"tls-down-{i}.bin")], tls_env)
        tls_down.append(size / dt / 2**20)
        (work / f"tls-down-{i}.bin").unlink()
        (tls_root / f"cp-{i}.bin").unlink()
        _cache(src, cached=True)
        with _Peak(cl.mind.pid) as peak:
            dt, _ = _timed([MIND, "cp", str(src), f"bench:cp-{i}.bin"], env)
        up_r.append(size / dt / 2**20)
        growth.append(peak.growth)
        there = root / f"cp-{i}.bin"  # the file both downloads read, ours and scp's, in the same state
        for cached, into, scp_into in ((True, down_r, scp_down), (False, cold_r, scp_cold)):
            _cache(there, cached)
            with _Peak(cl.mind.pid) as peak:
                dt, _ = _timed([MIND, "cp", f"bench:cp-{i}.bin", str(work / f"down-{i}.bin")], env)
            into.append(size / dt / 2**20)
            growth.append(peak.growth)
            (work / f"down-{i}.bin").unlink()
            if ssh is not None:
                _cache(there, cached)
                dt, _ = _timed(_scp_argv(ssh, f"root@127.0.0.1:{there}", str(work / "scp-down.bin")), ssh.env)
                scp_into.append(size / dt / 2**20)
                (work / "scp-down.bin").unlink()
        there.unlink()
        if ssh is not None:
            _cache(src, cached=True)
            dt, _ = _timed(_scp_argv(ssh, str(src), f"root@127.0.0.1:{work / 'scp-up.bin'}"), ssh.env)
            scp_up.append(size / dt / 2**20)
            (work / "scp-up.bin").unlink()
    for label, ours, ref in (
        ("up", up_r, scp_up),
        ("down (the file in the page cache)", down_r, scp_down),
        ("down (the file on the disk only)", cold_r, scp_cold),
    ):
        what = f"{label} MiB/s, {size >> 20} MiB through mind cp"
        rows.append(throughput_row("cp", what, ours, ref, "scp localhost, the same file", ">= scp"))
    for label, ours, plain in (("up", tls_up, up_r), ("down", tls_down, down_r)):
        o, p = med(ours), med(plain)
        rows.append(
            Row(
                "cp",
                f"{label} MiB/s over wss://, {size >> 20} MiB through mind cp",
                f"{o:.0f}",
                "",
                spread(ours, lambda v: f"{v:.0f}"),
                f"{p:.0f} (ours, plain ws://)",
                ratio(o, p),
                ">= 0.67x plain (within 1.5x)",
                verdict(o * 1.5 >= p),
            )
        )
    g = max(growth)
    rows.append(
        Row(
            "cp", "Mind RSS growth MiB during a copy (peak)", f"{g:.1f}", "", "", "", "", "<= +16 MiB", verdict(g <= 16)
        )
    )
    rows += _resume(ctx, src, size)
    if ssh is None:
        ctx.note("cp", f"scp reference n/a: {s}")
    ctx.note(
        "cp",
        "copies include the sha256 at both ends (an upload hashed as it is sent, checked by the Hand) and the fsyncs",
    )
    return rows


RESUME_WINDOW_S = 10.0
"""The Mind's resume window in the resume figure: long enough for the Hand to come back after a cut
(it redials within a second here), short enough that the run a killed `mind cp` left is given up
soon (the default, 60 s, would make `--resume` wait that long for it: the Hand takes one `put_file`
of a file at a time)."""


def _down_bytes(proxy: object) -> dict[int, int]:
    """Bytes each live connection of the proxy has delivered to the Hand (Mind -> Hand: an
    upload's direction), by connection id."""
    return {c["id"]: c["down_bytes"] for c in proxy.status()["connections"]}  # type: ignore[attr-defined]


def _moved(before: dict[int, int], now: dict[int, int]) -> int:
    """Bytes delivered since `before`, over the connections live now (one opened since counts whole)."""
    return sum(n - before.get(cid, 0) for cid, n in now.items())


def _cp_json(cl: object, *args: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run(
        [MIND, "cp", "--json", *args],
        env=cl.env,  # type: ignore[attr-defined]
        capture_output=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(
            f"mind cp {' '.join(args)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}"
        )
    return json.loads(r.stdout.decode().splitlines()[-1]), dt


def _resume(ctx: Ctx, src: Path, size: int) -> list[Row]:
    """Two different things, each counted at the Hand's link (a fault proxy between the Hand and
    the Mind), never inferred from what a command reports about itself:
    - a `mind cp` KILLED (SIGKILL) once half the file passed, then `mind cp --resume`: the bytes the
      resumed command sends (the Hand kept its part file: about half the file);
    - the Hand's link cut once half the file passed while the one command goes on (continuity
      rides the cut out): the bytes sent twice, against the same copy with no cut."""
    cl = ctx.cluster("cpresume")
    cl.resume_window = RESUME_WINDOW_S
    cl.start_mind()
    cl.start_hand("cut", proxy=True)
    cl.wait_connected("cut")
    proxy = cl.proxy
    assert proxy is not None
    base = _down_bytes(proxy)
    _cp_json(cl, str(src), "cut:plain.bin")  # the reference: what an uncut copy moves beyond the file
    framing = _moved(base, _down_bytes(proxy)) - size
    return [_killed_then_resumed(ctx, cl, proxy, src, size, framing), _cut_within(ctx, cl, proxy, src, size, framing)]


def _killed_then_resumed(ctx: Ctx, cl: object, proxy: object, src: Path, size: int, framing: int) -> Row:
    import signal

    from protocol.copy import is_part_name

    root = cl.tmp / "root-cut"  # type: ignore[attr-defined]
    proxy.send(f"throttle {max(size, 64 << 20)} down")  # type: ignore[attr-defined]  # half in ~0.5 s: a kill near 50 %
    base = _down_bytes(proxy)
    p = subprocess.Popen(
        [MIND, "cp", str(src), "cut:killed.bin"],
        env=cl.env,  # type: ignore[attr-defined]
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    killed_at = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None:
        moved = _moved(base, _down_bytes(proxy))
        if moved >= size // 2:
            os.killpg(p.pid, signal.SIGKILL)
            killed_at = moved
            break
        time.sleep(0.002)
    p.wait(timeout=60)
    proxy.send("clear")  # type: ignore[attr-defined]
    if not killed_at:
        raise RuntimeError(f"the copy ended before it could be killed at 50 % (exit {p.returncode})")
    parts = [n for n in os.listdir(root) if is_part_name(n)]
    if len(parts) != 1:
        raise RuntimeError(f"the killed copy left {len(parts)} part files, not one")
    _settled(proxy)  # what the killed command had in flight still reaches the Hand: not the resume's
    before = _down_bytes(proxy)
    res, dt = _cp_json(cl, "--resume", str(src), "cut:killed.bin")
    through = _moved(before, _down_bytes(proxy))
    held = res["resumed_from"][0] if res["resumed_from"] else 0
    if os.path.getsize(root / "killed.bin") != size or [n for n in os.listdir(root) if is_part_name(n)]:
        raise RuntimeError("the resumed copy did not leave the whole file, alone")
    ctx.note(
        "cp",
        f"killed: `mind cp` SIGKILLed after {killed_at / 2**20:.1f} MiB had reached the Hand; the part file kept "
        f"{held / 2**20:.1f} MiB; `mind cp --resume` then sent {through / 2**20:.1f} MiB through the Hand's link "
        f"({res['sent'] / 2**20:.1f} MiB by its own count, resumed_from {res['resumed_from']}) in {dt:.1f} s "
        f"(it starts once the run the killed command left is given up, at the end of the Mind's resume window: "
        f"{RESUME_WINDOW_S:g} s here, 60 s by default)",
    )
    bound = size - size // 2 + WINDOW + framing
    return Row(
        "cp",
        "bytes through the Hand's link for `mind cp --resume` after a kill at 50 %, % of the file",
        f"{100 * through / size:.1f}",
        "",
        "",
        f"whole file: 100 % (kept {100 * held / size:.1f} %)",
        "",
        "<= 50 % + 1 window",
        verdict(through <= bound),
    )


def _settled(proxy: object, quiet: float = 0.3, timeout: float = 30.0) -> None:
    """Until the Hand's link carries no more than pings for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last = _down_bytes(proxy)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = _down_bytes(proxy)
        if _moved(last, now) < 64 << 10:
            return
        last = now


def _cut_within(ctx: Ctx, cl: object, proxy: object, src: Path, size: int, framing: int) -> Row:
    """The link closed by the proxy itself after exactly half the file (`limit_data` on that one
    connection: its count is exact, where a `cut` ordered from here lands a few MiB late), the same
    command going on over the Hand's next connection."""
    live = _down_bytes(proxy)
    if len(live) != 1:
        raise RuntimeError(f"the Hand has {len(live)} connections through the proxy, not one")
    [(conn, at)] = live.items()
    proxy.send(f"limit_data {at + size // 2} down {conn}")  # type: ignore[attr-defined]
    base = {conn: at}
    done: dict[str, object] = {}

    def copy() -> None:
        try:
            done["res"], done["dt"] = _cp_json(cl, str(src), "cut:within.bin")
        except Exception as exc:  # said below
            done["error"] = exc

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    seen: dict[int, int] = dict(base)
    while t.is_alive():  # a closed connection leaves the status: keep the last count of each
        seen.update(_down_bytes(proxy))
        time.sleep(0.01)
    t.join()
    seen.update(_down_bytes(proxy))
    if "error" in done:
        raise RuntimeError(str(done["error"]))
    seen[conn] = at + size // 2  # exact: the proxy closed it there
    through = _moved(base, seen)
    twice = through - size - framing
    res = done["res"]
    ctx.note(
        "cp",
        f"cut within one command: the Hand's link closed after {size // 2 / 2**20:.1f} MiB; the command went on "
        f"(attempts {res['attempts']}, resumed_from {res['resumed_from']}, {len(seen)} connections); "
        f"{through / 2**20:.2f} MiB through the Hand's link for {size / 2**20:.0f} MiB, "
        f"{framing / 2**10:.0f} KiB of it framing (an uncut copy's)",
    )
    return Row(
        "cp",
        "bytes sent twice across a cut at 50 % within one command (continuity), MiB",
        f"{twice / 2**20:.2f}",
        "",
        "",
        "",
        "",
        "<= 1 window (2 MiB)",
        verdict(twice <= WINDOW),
    )


TREE_FILES = 5000
TREE_FILES_QUICK = 1000
"""Quick mode's tree (the same 10 MiB in fewer files): the suite runs `--quick` beside everything else."""
TREE_BYTES = 10 << 20


def _small_tree(top: Path, files: int = TREE_FILES, total: int = TREE_BYTES) -> Path:
    """`files` small files of random bytes (`total` in all, sizes 0.5x-1.5x the mean) in 50 directories."""
    if top.exists():
        return top
    rng = __import__("random").Random(25)
    mean = total // files
    for i in range(files):
        d = top / f"d{i % 50:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(os.urandom(rng.randint(mean // 2, mean * 3 // 2)))
    return top


def _rsync_argv(ssh: object | None, src: str, dst: str) -> list[str]:
    """rsync -a over our own sshd (as the issue measured it), or local when there is none."""
    if ssh is None:
        return ["rsync", "-a", src, dst]
    shell = " ".join(ssh.argv()[:-1])  # type: ignore[attr-defined]
    return ["rsync", "-a", "-e", shell, src, f"root@127.0.0.1:{dst}"]


def _tree_row(metric: str, ours: list[float], ref: list[float], ref_name: str, bound: float = 1.0) -> Row:
    """Ours against rsync's time in the same run; `bound`: the ratio the target allows (issue 40
    item 6: a tree at or under rsync's time, an unchanged one within 1.2x)."""
    from benchlib.core import med, ratio, secs, spread

    o = med(ours)
    fmt = spread(ours, secs)
    target = f"<= {bound:g}x rsync"
    if not ref:
        return Row("cptree", metric, secs(o), "", fmt, "n/a (no rsync: see notes)", "", target, "n/a")
    r = med(ref)
    return Row(
        "cptree", metric, secs(o), "", fmt, f"{secs(r)} ({ref_name})", ratio(o, r), target, verdict(o <= bound * r)
    )


@figure(
    "cptree",
    "`mind cp -r -p` of 5,000 small files (10 MB; quick: 1,000) up, down, and again unchanged, against rsync -a",
)
def fig_cptree(ctx: Ctx) -> list[Row]:
    import shutil

    files = TREE_FILES_QUICK if ctx.quick else TREE_FILES
    cl = basic(ctx)
    work = ctx.dir("cptree")
    src = _small_tree(work / "src", files)
    root = cl.tmp / "root-bench"
    env = dict(cl.env)
    s = sshd(ctx)
    ssh = None if isinstance(s, str) else s
    have_rsync = shutil.which("rsync") is not None
    up, down, up_again, down_again = [], [], [], []
    r_up, r_down, r_again, r_down_again, tar_up = [], [], [], [], []
    for i in range(ctx.rounds):
        # into a directory both times (scp's rule: `src` lands as `DIR/src`), so "again" is the same tree
        up_cmd = [MIND, "cp", "-r", "-p", str(src), f"bench:tree-{i}/"]
        dt, _ = _timed(up_cmd, env)
        up.append(dt)
        dt, out = _timed(up_cmd, env)
        up_again.append(dt)
        (work / f"down-{i}").mkdir()
        down_cmd = [MIND, "cp", "-r", "-p", f"bench:tree-{i}/src", str(work / f"down-{i}")]
        dt, _ = _timed(down_cmd, env)
        down.append(dt)
        dt, _ = _timed(down_cmd, env)
        down_again.append(dt)
        got = sum(len(fs) for _, _, fs in os.walk(work / f"down-{i}"))
        if got != files:
            raise RuntimeError(f"the tree came down with {got} files, not {files}")
        shutil.rmtree(work / f"down-{i}")
        shutil.rmtree(root / f"tree-{i}")
        t0 = time.perf_counter()
        tar = subprocess.Popen(["tar", "c", "-C", str(work), "src"], stdout=subprocess.PIPE)
        r = subprocess.run(
            [MIND, "exec", "--hand", "bench", "--", "sh", "-c", f"mkdir -p tar-{i} && tar x -C tar-{i}"],
            env=env,
            stdin=tar.stdout,
            capture_output=True,
            timeout=600,
        )
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait(60)
        if r.returncode == 0:
            tar_up.append(time.perf_counter() - t0)
        shutil.rmtree(root / f"tar-{i}", ignore_errors=True)
        if have_rsync:
            dst = work / f"rsync-{i}"
            dt, _ = _timed(_rsync_argv(ssh, f"{src}/", str(dst)), ssh.env if ssh else env)
            r_up.append(dt)
            dt, _ = _timed(_rsync_argv(ssh, f"{src}/", str(dst)), ssh.env if ssh else env)
            r_again.append(dt)
            shutil.rmtree(dst)
            down_argv = ["rsync", "-a", f"{src}/", str(work / f"rsync-down-{i}")]
            if ssh is not None:
                shell = " ".join(ssh.argv()[:-1])
                down_argv = ["rsync", "-a", "-e", shell, f"root@127.0.0.1:{src}/", str(work / f"rsync-down-{i}")]
            dt, _ = _timed(down_argv, ssh.env if ssh else env)
            r_down.append(dt)
            dt, _ = _timed(down_argv, ssh.env if ssh else env)
            r_down_again.append(dt)
            shutil.rmtree(work / f"rsync-down-{i}")
    name = "rsync -a over ssh" if ssh else "rsync -a, local"
    rows = [
        _tree_row(f"s, {files} files up", up, r_up, name),
        _tree_row(f"s, {files} files down", down, r_down, name),
        _tree_row("s, the same tree up again (unchanged)", up_again, r_again, name, bound=1.2),
        _tree_row("s, the same tree down again (unchanged)", down_again, r_down_again, name, bound=1.2),
    ]
    if tar_up:
        from benchlib.core import med, secs

        rows.append(
            Row("cptree", "s, tar c | mind exec bench -- tar x (reference)", secs(med(tar_up)), "", "", "", "", "", "")
        )
    if not have_rsync:
        ctx.note("cptree", "rsync is not installed here: no reference (full mode with --install-ssh installs it)")
    if ssh is None:
        ctx.note("cptree", f"rsync ran locally, without ssh ({s}); the issue's reference was over ssh")
    ctx.note(
        "cptree",
        f"load average {open('/proc/loadavg').read().split()[0]} after the figure (2 cores: others' work shows here)",
    )
    ctx.note("cptree", "every mind cp verifies a sha256 per file at its receiver and ends with one syncfs")
    return rows
