"""The data plane's figures (issue 12): stream throughput both ways against ssh, the Mind's memory
under a slow reader, and a terminal's keystroke echo against the raw relay's round trip.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import os
import pty
import select
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchlib.core import PY, Ctx, Row, med, ms, ratio, rss_mib, spread, throughput_row, verdict
from benchlib.figures import basic, figure, flat, relay_p50, sshd
from protocol import limits

MIND = str(Path(PY).parent / "mind")
ROOT = Path(__file__).resolve().parents[2]


def _data_file(ctx: Ctx, size: int) -> Path:
    """A file of `size` random bytes in the bench Hand's root (made once per run)."""
    root = basic(ctx).tmp / "root-bench"
    path = root / f"stream-{size}.bin"
    if not path.exists():
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    return path


def _shell_time(cmd: str, env: dict[str, str], timeout: float = 600) -> float:
    """Wall seconds of one `bash -c CMD` (it must exit 0)."""
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env=env, capture_output=True, timeout=timeout)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[:60]}... exited {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}")
    return dt


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mind_exec(argv: list[str], env: dict[str, str], stdin: Path | None, timeout: float = 600) -> tuple[float, float]:
    """Wall seconds and CPU seconds of one `mind exec` (our direct child, its stdout to /dev/null,
    stdin from a file or /dev/null); it must exit 0. The CPU comes from wait4's rusage, so it is the
    CLI's own, not a shell's or a `cat`'s."""
    with open(stdin or os.devnull, "rb") as src, open(os.devnull, "wb") as sink:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=src, stdout=sink, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                raise RuntimeError(f"mind exec did not end within {timeout:.0f} s")
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read() if p.stderr is not None else b""
    if p.returncode != 0:
        raise RuntimeError(f"mind exec exited {p.returncode}: {err.decode(errors='replace')[-300:]}")
    return dt, usage.ru_utime + usage.ru_stime


def tls_cluster(ctx: Ctx):
    """A Mind serving `wss://` (a certificate from scripts/mkcerts) and a Hand `bench` pinning it:
    the fair comparison with ssh, which always encrypts. The local CLI pins the Mind's own
    certificate by itself."""
    if "tls" not in ctx.shared:
        certs = ctx.dir("certs")
        out = subprocess.run(
            [str(ROOT / "scripts" / "mkcerts"), str(certs)], capture_output=True, text=True, check=True
        ).stdout
        pin = next(ln.split()[-1] for ln in out.splitlines() if ln.startswith("pin:"))
        cl = ctx.cluster("tls")
        cl.start_mind("--tls-cert", str(certs / "mind.crt"), "--tls-key", str(certs / "mind.key"))
        cl.start_hand("bench", "--pin", pin)
        cl.wait_connected("bench")
        ctx.shared["tls"] = cl
    return ctx.shared["tls"]


@figure("streams", "stdout and stdin throughput of `mind exec` against ssh, plain and wss://, 1 GiB (quick: 64 MiB)")
def fig_streams(ctx: Ctx) -> list[Row]:
    rows = _streams(ctx, basic(ctx), "")
    rows += _streams(ctx, tls_cluster(ctx), " wss://")
    ctx.note(
        "streams",
        "CPU ns/byte: /proc/PID/stat utime+stime of the Mind and the Hand before and after each run "
        "(the Hand's own, not its child's), the CLI's from wait4; the Hand's child (cat, sha256sum) not counted",
    )
    return rows


def _streams(ctx: Ctx, cl: Any, variant: str) -> list[Row]:
    size = (64 << 20) if ctx.quick else (1 << 30)
    path = _data_file(ctx, size)
    env = dict(cl.env)
    q = shlex.quote
    mind_out = [MIND, "exec", "--hand", "bench", "--", "cat", str(path)]
    mind_in = [MIND, "exec", "--hand", "bench", "--", "sha256sum"]
    s = sshd(ctx)
    ssh = None if isinstance(s, str) else s
    ssh_out = ssh_in = None
    if ssh is not None:
        argv = " ".join(q(a) for a in ssh.argv("cat", str(path)))
        ssh_out = f"{argv} > /dev/null"
        ssh_in = f"cat {q(str(path))} | {' '.join(q(a) for a in ssh.argv('sha256sum'))} > /dev/null"
    assert cl.mind is not None
    pids = {"Hand": cl.hands["bench"].pid, "Mind": cl.mind.pid}
    rows: list[Row] = []
    for label, ours_argv, stdin, ref_cmd in (
        ("stdout", mind_out, None, ssh_out),
        ("stdin", mind_in, path, ssh_in),
    ):
        ours_r: list[float] = []
        ref_r: list[float] = []
        ns: dict[str, list[float]] = {"Hand": [], "Mind": [], "CLI": []}
        for _ in range(ctx.rounds):
            before = {k: cpu_s(pid) for k, pid in pids.items()}
            wall, cli_cpu = mind_exec(ours_argv, env, stdin)
            for k, pid in pids.items():
                ns[k].append((cpu_s(pid) - before[k]) * 1e9 / size)
            ns["CLI"].append(cli_cpu * 1e9 / size)
            ours_r.append(size / wall / 2**20)
            if ref_cmd is not None and ssh is not None:
                ref_r.append(size / _shell_time(ref_cmd, ssh.env) / 2**20)
        what = f"{label}{variant} MiB/s, {size >> 20} MiB through mind exec"
        rows.append(throughput_row("streams", what, ours_r, ref_r, "ssh localhost, same file", ">= ssh"))
        per = {k: med(v) for k, v in ns.items()}
        total = sum(per.values())
        rows.append(
            Row(
                "streams",
                f"{label}{variant} CPU ns/byte: Hand / Mind / CLI (sum)",
                f"{per['Hand']:.1f} / {per['Mind']:.1f} / {per['CLI']:.1f} ({total:.1f})",
                "",
                "",
                "",
                "",
                "Mind <= 1.0; sum <= 4.5",
                verdict(per["Mind"] <= 1.0 and total <= 4.5),
            )
        )
    if ssh is None and not variant:
        ctx.note("streams", f"ssh reference n/a: {s}")
    return rows


@figure("slowreader", "Mind RSS while a 1 GiB stream goes to a client reading 1 MB/s")
def fig_slow_reader(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    path = _data_file(ctx, (64 << 20) if ctx.quick else (1 << 30))
    seconds = 3.0 if ctx.quick else 10.0
    assert cl.mind is not None
    idle = rss_mib(cl.mind.pid)
    p = subprocess.Popen(
        [MIND, "exec", "--hand", "bench", "--", "cat", path.name],
        env=cl.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    peak = idle
    read = 0
    try:
        assert p.stdout is not None
        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < seconds:
            want = int(now * 1_000_000) - read  # 1 MB/s
            if want > 0:
                read += len(p.stdout.read(want))
            peak = max(peak, rss_mib(cl.mind.pid))
            time.sleep(0.05)
    finally:
        p.kill()
        p.wait()
    ctx.note(
        "slowreader",
        f"the client read {read / 1e6:.1f} MB in {seconds:.0f} s; the remote cat blocks on its pipe once the "
        f"window ({limits.STREAM_WINDOW >> 20} MiB per stream) is in flight; Mind idle RSS {idle:.1f} MiB, sampled every 50 ms",
    )
    return [
        Row(
            "slowreader",
            f"Mind RSS growth MiB over {seconds:.0f} s of a 1 MB/s reader",
            f"{peak - idle:.1f}",
            "",
            "",
            f"{idle:.1f} MiB idle",
            "",
            "<= +16 MiB",
            verdict(peak - idle <= 16),
        )
    ]


def echo_times(env: dict[str, str], n: int) -> list[float]:
    """Keystroke -> echo round trips (ms) of `mind exec -t -- cat` on a real pty."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execve(MIND, [MIND, "exec", "-t", "--hand", "bench", "--", "cat"], env)
        finally:
            os._exit(127)
    out: list[float] = []
    try:
        buf = b""
        deadline = time.monotonic() + 20
        os.write(fd, b"ready\r")
        while b"ready" not in buf.split(b"\n", 1)[-1] and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                buf += os.read(fd, 4096)
        time.sleep(0.2)
        while select.select([fd], [], [], 0.1)[0]:
            os.read(fd, 4096)
        for i in range(n):
            key = b"abcdefghij"[i % 10 : i % 10 + 1]
            t0 = time.perf_counter()
            os.write(fd, key)
            got = b""
            while key not in got:
                if not select.select([fd], [], [], 5)[0]:
                    raise RuntimeError("no echo within 5 s")
                got += os.read(fd, 4096)
            out.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.005)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    return out


@figure("echo", "terminal keystroke echo of `mind exec -t -- cat` against the raw relay round trip")
def fig_echo(ctx: Ctx) -> list[Row]:
    cl = basic(ctx)
    n = 50 if ctx.quick else 200
    env = {**cl.env, "TERM": "xterm"}
    rounds = [echo_times(env, n) for _ in range(ctx.rounds)]
    o = med(flat(rounds))
    relay = relay_p50(ctx)
    return [
        Row(
            "echo",
            "pty keystroke echo p50 ms",
            ms(o),
            ms(sorted(flat(rounds))[int(0.99 * (len(flat(rounds)) - 1))]),
            spread([med(r) for r in rounds], ms),
            f"{ms(relay)} (relay RTT)",
            ratio(o, relay),
            "<= relay + 2 ms",
            verdict(o <= relay + 2.0),
        )
    ]
