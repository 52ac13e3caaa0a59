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
