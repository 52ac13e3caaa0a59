"""The `far` figure: a Hand 50 ms and 100 ms away (round trip), `mind cp` down and up and a
`mind exec` stdout stream, against scp and ssh over the same delay, in the same run.

The delay is the shipped fault proxy (`mind/testing/faultproxy`, its own process), `latency D` in
both directions, once in front of the Hand's link to the Mind and once, a second proxy of the same
kind, in front of our own sshd (benchlib.sshd): both sides cross the same kind of hop with the same
delay. The proxy terminates TCP on each side and holds every piece D before forwarding, with no
bound on what it holds, so TCP's own window never limits either side: what a round trip costs is
what each protocol waits for end to end (our stream window and its acknowledgements; ssh's channel
window and its adjustments). A fixed window W moves at most W per round trip; the issue's target,
3x scp, is for a window that grows with the bandwidth-delay product.

Every copy is checked (sha256 against the source, every streamed byte counted): a figure of a
broken copy is no figure. The references need sshd, which the suite measures in full mode only.

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib.core import Ctx, Row, med, ratio, spread, verdict
from benchlib.cp import MIND, _random_file, _scp_argv
from benchlib.figures import figure, sshd
from protocol import limits

DELAYS_MS = (25, 50)
"""One-way delays: round trips of 50 ms and 100 ms."""
TARGET = 3.0
"""Ours against the reference (MiB/s), the issue's target for a window that grows with the
bandwidth-delay product."""
HAND = "far"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _copied(path: Path, digest: str, what: str) -> None:
    """The copy at `path` is the source, whole; raise otherwise (and remove it either way)."""
    try:
        got = _sha256(path)
    except OSError as exc:
        raise RuntimeError(f"{what}: no copy at {path}: {exc}") from exc
    path.unlink()
    if got != digest:
        raise RuntimeError(f"{what}: the copy's sha256 {got[:16]}... is not the source's {digest[:16]}...")


def _timed(argv: list[str], env: dict[str, str], timeout: float = 900) -> float:
    """Wall seconds of one command, which must exit 0."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... exited {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}")
    return dt


def _streamed(argv: list[str], env: dict[str, str], size: int, timeout: float = 900) -> float:
    """Wall seconds of one command whose stdout must be exactly `size` bytes, read here and counted
    (the same reader for ours and ssh's), and which must exit 0."""
    with tempfile.TemporaryFile() as err:  # not a pipe: nobody reads it while the stream runs
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        assert p.stdout is not None
        fd, got = p.stdout.fileno(), 0
        deadline = time.monotonic() + timeout
        try:
            while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                if not (chunk := os.read(fd, 1 << 20)):
                    break
                got += len(chunk)
            else:
                raise RuntimeError(f"{' '.join(argv[:3])}... did not end within {timeout:.0f} s")
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
        dt = time.perf_counter() - t0
        err.seek(0)
        said = err.read().decode(errors="replace")[-300:]
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... exited {rc}: {said}")
    if got != size:
        raise RuntimeError(f"{' '.join(argv[:3])}... streamed {got} bytes, not {size}")
    return dt


class _Via:
    """Our sshd's client command lines, dialing its fault proxy instead (`-p PORT` swapped)."""

    def __init__(self, ssh: object, port: int) -> None:
        self.ssh = ssh
        self.port = port

    @property
    def env(self) -> dict[str, str]:
        return self.ssh.env  # type: ignore[attr-defined]

    def argv(self, *cmd: str) -> list[str]:
        out: list[str] = self.ssh.argv(*cmd)  # type: ignore[attr-defined]
        out[out.index("-p") + 1] = str(self.port)
        return out


def _row(what: str, ours: list[float], ref: list[float], tool: str) -> Row:
    """A MiB/s figure against `tool`'s of the same run through the same kind of proxy (none: n/a,
    see the notes)."""
    o = med(ours)
    fmt = spread(ours, lambda v: f"{v:.1f}")
    target = f">= {TARGET:g}x {tool}"
    ref_name = f"{tool}, same proxy"
    if not ref:
        return Row("far", what, f"{o:.1f}", "", fmt, "n/a (no sshd: see notes)", "", target, "n/a")
    r = med(ref)
    return Row("far", what, f"{o:.1f}", "", fmt, f"{r:.1f} ({ref_name})", ratio(o, r), target, verdict(o >= TARGET * r))


def _one_delay(ctx: Ctx, cl: object, ssh: _Via | None, src: Path, digest: str, work: Path) -> list[list[float]]:
    """MiB/s per round of: cp down, scp down, cp up, scp up, stdout, ssh stdout (the references
    empty without sshd), each measured right after the other."""
    size = src.stat().st_size
    root = cl.tmp / f"root-{HAND}"  # type: ignore[attr-defined]
    env = dict(cl.env)  # type: ignore[attr-defined]
    out: list[list[float]] = [[] for _ in range(6)]

    def rate(dt: float) -> float:
        return size / dt / 2**20

    for _ in range(ctx.rounds):
        out[0].append(rate(_timed([MIND, "cp", f"{HAND}:src.bin", str(work / "down.bin")], env)))
        _copied(work / "down.bin", digest, "mind cp down")
        if ssh is not None:
            out[1].append(
                rate(_timed(_scp_argv(ssh, f"root@127.0.0.1:{root / 'src.bin'}", str(work / "scp.bin")), ssh.env))
            )
            _copied(work / "scp.bin", digest, "scp down")
        out[2].append(rate(_timed([MIND, "cp", str(src), f"{HAND}:up.bin"], env)))
        _copied(root / "up.bin", digest, "mind cp up")
        if ssh is not None:
            out[3].append(rate(_timed(_scp_argv(ssh, str(src), f"root@127.0.0.1:{work / 'scp.bin'}"), ssh.env)))
            _copied(work / "scp.bin", digest, "scp up")
        out[4].append(rate(_streamed([MIND, "exec", "--hand", HAND, "--", "cat", str(root / "src.bin")], env, size)))
        if ssh is not None:
            out[5].append(rate(_streamed(ssh.argv("cat", str(root / "src.bin")), ssh.env, size)))
    return out


@figure(
    "far",
    "a Hand 50 and 100 ms away (fault proxy latency): `mind cp` down/up and stdout MiB/s against scp/ssh "
    "through the same proxy, 256 MiB (quick: 8 MiB, RTT 50 ms)",
)
def fig_far(ctx: Ctx) -> list[Row]:
    size = (8 << 20) if ctx.quick else (256 << 20)
    delays = DELAYS_MS[:1] if ctx.quick else DELAYS_MS
    work = ctx.dir("far")
    s = sshd(ctx)
    cl = ctx.cluster("far")
    rows: list[Row] = []
    try:
        cl.start_mind()
        cl.start_hand(HAND, proxy=True)
        cl.wait_connected(HAND)
        hand_proxy = cl.proxy
        assert hand_proxy is not None
        src = _random_file(work / "src.bin", size)
        os.link(src, cl.tmp / f"root-{HAND}" / "src.bin")
        digest = _sha256(src)
        ssh_proxy = None if isinstance(s, str) else cl.start_proxy(target=s.port)
        ssh = None if ssh_proxy is None else _Via(s, ssh_proxy.port)
        for d in delays:
            for proxy in (hand_proxy, ssh_proxy):
                if proxy is not None:
                    proxy.latency(d, direction="both")
            down, scp_down, up, scp_up, out, ssh_out = _one_delay(ctx, cl, ssh, src, digest, work)
            rtt = f"RTT {2 * d} ms"
            mb = f"{size >> 20} MiB"
            rows += [
                _row(f"{rtt}: cp down MiB/s, {mb}", down, scp_down, "scp"),
                _row(f"{rtt}: cp up MiB/s, {mb}", up, scp_up, "scp"),
                _row(f"{rtt}: exec stdout MiB/s, {mb}", out, ssh_out, "ssh"),
            ]
    finally:
        cl.stop_all()
    if isinstance(s, str):
        ctx.note("far", f"scp and ssh references n/a: {s}")
    window = limits.STREAM_WINDOW
    ceiling = ", ".join(f"{window / 2**20 / (2 * d / 1000):.0f} MiB/s at {2 * d} ms" for d in delays)
    ctx.note(
        "far",
        f"fault proxy `latency D both` (D = {', '.join(f'{d} ms' for d in delays)}) in front of the Hand's link "
        f"and (the references) a second one in front of our sshd; it acknowledges TCP itself and holds data unbounded, so "
        f"only end-to-end windows meet the round trip: a fixed {window >> 20} MiB stream window allows at most "
        f"{ceiling}; each command's time includes its setup (ssh's handshake crosses the delay too); every copy "
        f"checked by sha256, every streamed byte counted",
    )
    return rows
