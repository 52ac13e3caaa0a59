"""The `mind cp` figures (issue 15): 1 GiB up and down against `scp` to localhost in the same run,
the Mind's RSS growth during the copy, and a resume after a `cut rst` at 50 %.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from benchlib.core import PY, Ctx, Row, rss_mib, throughput_row, verdict
from benchlib.figures import basic, figure, sshd

MIND = str(Path(PY).parent / "mind")
WINDOW = 1 << 20


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
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... exited {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}")
    return dt, r.stdout


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


@figure("cp", "`mind cp` 1 GiB up and down against scp (quick: 64 MiB); Mind RSS; resume after a cut at 50 %")
def fig_cp(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    size = (64 << 20) if ctx.quick else (1 << 30)
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
    for i in range(ctx.rounds):
        with _Peak(cl.mind.pid) as peak:
            dt, _ = _timed([MIND, "cp", str(src), f"bench:cp-{i}.bin"], env)
        up_r.append(size / dt / 2**20)
        growth.append(peak.growth)
        with _Peak(cl.mind.pid) as peak:
            dt, _ = _timed([MIND, "cp", f"bench:cp-{i}.bin", str(work / f"down-{i}.bin")], env)
        down_r.append(size / dt / 2**20)
        growth.append(peak.growth)
        (work / f"down-{i}.bin").unlink()
        (root / f"cp-{i}.bin").unlink()
        if ssh is not None:
            dt, _ = _timed(_scp_argv(ssh, str(src), f"root@127.0.0.1:{work / 'scp-up.bin'}"), ssh.env)
            scp_up.append(size / dt / 2**20)
            dt, _ = _timed(_scp_argv(ssh, f"root@127.0.0.1:{src}", str(work / "scp-down.bin")), ssh.env)
            scp_down.append(size / dt / 2**20)
            (work / "scp-up.bin").unlink()
            (work / "scp-down.bin").unlink()
    for label, ours, ref in (("up", up_r, scp_up), ("down", down_r, scp_down)):
        what = f"{label} MiB/s, {size >> 20} MiB through mind cp"
        rows.append(throughput_row("cp", what, ours, ref, "scp localhost", ">= scp"))
    g = max(growth)
    rows.append(
        Row(
            "cp", "Mind RSS growth MiB during a copy (peak)", f"{g:.1f}", "", "", "", "", "<= +16 MiB", verdict(g <= 16)
        )
    )
    rows.append(_resume(ctx, src, size))
    if ssh is None:
        ctx.note("cp", f"scp reference n/a: {s}")
    ctx.note("cp", "copies include hashing the source (sha256 before the upload, verified at both ends) and the fsyncs")
    return rows


def _resume(ctx: Ctx, src: Path, size: int) -> Row:
    """Upload through a fault proxy, `cut rst` once half the file has passed, and count what was
    sent after the resume (mind cp --json: `sent`, `resumed_from`)."""
    cl = ctx.cluster("cpresume")
    cl.start_mind()
    cl.start_hand("cut", proxy=True)
    cl.wait_connected("cut")
    proxy = cl.proxy
    assert proxy is not None
    p = subprocess.Popen(
        [MIND, "cp", "--json", str(src), "cut:resumed.bin"],
        env=cl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    cut_at = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None:
        moved = max((c["down_bytes"] for c in proxy.status()["connections"]), default=0)
        if moved >= size // 2:
            proxy.send("cut rst")
            cut_at = moved
            break
        time.sleep(0.005)
    out, err = p.communicate(timeout=900)
    if p.returncode != 0 or not cut_at:
        raise RuntimeError(
            f"the resumed copy exited {p.returncode} (cut at {cut_at}): {err.decode(errors='replace')[-300:]}"
        )
    res = json.loads(out.decode().splitlines()[-1])
    after = size - res["resumed_from"][0] if res["resumed_from"] else size
    bound = size - size // 2 + WINDOW
    ctx.note(
        "cp",
        f"resume: cut after {cut_at / 2**20:.1f} MiB through the proxy; resumed from {res['resumed_from']}, "
        f"{res['attempts']} attempts, {res['sent'] / 2**20:.1f} MiB sent in all for {size >> 20} MiB",
    )
    return Row(
        "cp",
        "bytes sent after a resume at 50 %, % of the file",
        f"{100 * after / size:.1f}",
        "",
        "",
        f"{(res['sent'] - size) / 2**20:.2f} MiB sent twice",
        "",
        "<= 50 % + 1 window",
        verdict(after <= bound),
    )


TREE_FILES = 5000
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


def _tree_row(metric: str, ours: list[float], ref: list[float], ref_name: str) -> Row:
    from benchlib.core import med, ratio, secs, spread

    o = med(ours)
    fmt = spread(ours, secs)
    if not ref:
        return Row("cptree", metric, secs(o), "", fmt, "n/a (no rsync: see notes)", "", "<= 2x rsync", "n/a")
    r = med(ref)
    return Row(
        "cptree", metric, secs(o), "", fmt, f"{secs(r)} ({ref_name})", ratio(o, r), "<= 2x rsync", verdict(o <= 2 * r)
    )


@figure("cptree", "`mind cp -r -p` of 5,000 small files (10 MB) up, down, and again unchanged, against rsync -a")
def fig_cptree(ctx: Ctx) -> list[Row]:
    import shutil

    cl = basic(ctx)
    work = ctx.dir("cptree")
    src = _small_tree(work / "src")
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
        if got != TREE_FILES:
            raise RuntimeError(f"the tree came down with {got} files, not {TREE_FILES}")
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
        _tree_row(f"s, {TREE_FILES} files up", up, r_up, name),
        _tree_row(f"s, {TREE_FILES} files down", down, r_down, name),
        _tree_row("s, the same tree up again (unchanged)", up_again, r_again, name),
        _tree_row("s, the same tree down again (unchanged)", down_again, r_down_again, name),
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
