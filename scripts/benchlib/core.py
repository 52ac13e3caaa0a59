"""Statistics, the result table, child processes and machine facts for the benchmark suite."""

from __future__ import annotations

import json
import os
import platform
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


# --- statistics ----------------------------------------------------------------------------


def pct(xs: Iterable[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def med(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    """`min-max` of per-round figures (one round: just the value)."""
    if not values:
        return ""
    if len(values) == 1:
        return f"{fmt(values[0])} (1 round)"
    return f"{fmt(min(values))}-{fmt(max(values))} ({len(values)} rounds)"


def ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def mib(x: float) -> str:
    return f"{x:.1f}"


def secs(x: float) -> str:
    return f"{x:.2f}"


def ratio(ours: float, ref: float) -> str:
    return f"{ours / ref:.2f}x" if ref > 0 else ""


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "MISS"


# --- the result table ----------------------------------------------------------------------


@dataclass
class Row:
    figure: str
    metric: str
    ours: str = ""
    p99: str = ""
    spread: str = ""
    ref: str = ""
    ratio: str = ""
    target: str = ""
    verdict: str = ""


COLUMNS = [
    ("figure", "figure"),
    ("metric", "metric"),
    ("ours", "ours (median)"),
    ("p99", "p99"),
    ("spread", "min-max over rounds"),
    ("ref", "reference (same run)"),
    ("ratio", "ratio"),
    ("target", "target"),
    ("verdict", "verdict"),
]


def format_table(rows: list[Row]) -> str:
    cells = [[h for _, h in COLUMNS]] + [[str(getattr(r, k)) for k, _ in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --- machine -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        nproc = str(len(os.sched_getaffinity(0)))
    import websockets

    return {
        "nproc": nproc,
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "websockets": websockets.__version__,
    }


def loadavg() -> str:
    """1, 5 and 15 minute load averages (anything else running skews every figure on 2 cores)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def rss_mib(pid: int) -> float:
    """VmRSS of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --- child processes -----------------------------------------------------------------------


class Child:
    """A helper process in its own session, talking JSON lines on stdout. Stopped (and its whole
    group killed) by PID; every read has a deadline."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        stdin: bool = False,
    ) -> None:
        self.name = name
        self._log = open(log, "ab") if log is not None else subprocess.DEVNULL
        self.p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.p.pid

    def read_json(self, timeout: float) -> dict[str, Any]:
        """The next JSON line from the child's stdout, within `timeout` seconds."""
        assert self.p.stdout is not None
        fd = self.p.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no line within {timeout}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"{self.name} exited (code {self.p.poll()}) before answering")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def tell(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()

    def stop(self, timeout: float = 5.0) -> None:
        from mind.testing.cluster import stop_group

        if self.p.poll() is None:
            try:
                if self.p.stdin is not None:
                    self.p.stdin.close()
            except OSError:
                pass
        stop_group(self.p, timeout)
        if self._log is not subprocess.DEVNULL:
            self._log.close()


# --- the run's context ---------------------------------------------------------------------


@dataclass
class Ctx:
    quick: bool
    rounds: int
    tmp: Path
    install_ssh: bool = False
    hands: int | None = None
    """Simulated Hands for the `hands` figure (`--hands N`), or its default."""
    notes: dict[str, list[str]] = field(default_factory=dict)
    _cleanups: list[Callable[[], None]] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    """Lazily started resources shared by figures (the relay, a cluster, sshd) and cached figures."""

    def note(self, figure: str, text: str) -> None:
        self.notes.setdefault(figure, []).append(text)

    def dir(self, name: str) -> Path:
        d = self.tmp / name
        n = 1
        while d.exists():
            n += 1
            d = self.tmp / f"{name}-{n}"
        d.mkdir(parents=True)
        return d

    def child(self, name: str, argv: list[str], **kw: Any) -> Child:
        c = Child(name, argv, **kw)
        self._cleanups.append(c.stop)
        return c

    def on_close(self, fn: Callable[[], None]) -> None:
        self._cleanups.append(fn)

    def cluster(self, name: str):
        """A `mind.testing` Cluster in its own directory, stopped (by PID) when the run ends or
        earlier by the figure."""
        from mind.testing.cluster import Cluster

        cl = Cluster(self.dir(name))
        self._cleanups.append(cl.stop_all)
        return cl

    def close(self) -> None:
        while self._cleanups:
            fn = self._cleanups.pop()
            try:
                fn()
            except Exception as exc:  # keep cleaning up the rest
                print(f"bench: cleanup failed: {exc}", file=sys.stderr)


def dump_json(path: Path, mach: dict[str, Any], rows: list[Row], notes: dict[str, list[str]], mode: str) -> None:
    path.write_text(
        json.dumps({"machine": mach, "mode": mode, "rows": [asdict(r) for r in rows], "notes": notes}, indent=2) + "\n"
    )


def throughput_row(figure: str, what: str, ours: list[float], ref: list[float], ref_name: str, target: str) -> Row:
    """A MiB/s figure against an ssh-family reference measured in the same run (`ref` empty: no
    sshd here, the row says so and has no verdict)."""
    o = med(ours)
    fmt = spread(ours, lambda v: f"{v:.0f}")
    if not ref:
        return Row(figure, what, f"{o:.0f}", "", fmt, "n/a (no sshd: see notes)", "", target, "n/a")
    r = med(ref)
    return Row(figure, what, f"{o:.0f}", "", fmt, f"{r:.0f} ({ref_name})", ratio(o, r), target, verdict(o >= r))
