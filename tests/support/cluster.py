"""Real `mind serve` and `hand run` processes on loopback for integration tests.

Every process runs in its own session so cleanup can kill it and anything it spawned by PID; every
wait polls a condition with a deadline (no sleeps that hope).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent


def wait_until(cond: Callable[[], object], timeout: float = 15.0, what: str = "condition", interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (PID 1 may not reap orphans in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def stop_group(p: subprocess.Popen, timeout: float) -> None:
    """SIGTERM and wait up to `timeout` (a clean stop), then SIGKILL whatever is left of the
    process's session/group (it was started with start_new_session), bounded."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._logf = open(log, "ab")
        self.p = subprocess.Popen(
            argv, env=env, stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.p.pid, sig)

    def kill9(self) -> None:
        """Kill the process only (not its group): a crash, children left to fend for themselves."""
        if self.alive():
            os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        stop_group(self.p, timeout)
        self._logf.close()
        return self.p.returncode

    def output(self) -> str:
        self._logf.flush()
        return self.log.read_text(errors="replace")


@contextmanager
def running(
    tmp: Path, hand: str | None = "box", *hand_args: str, via_proxy: bool = False, mind_args: tuple[str, ...] = ()
):
    """A Mind, and a Hand named `hand` connected to it (through a fault proxy if asked); all stopped
    and killed by PID on the way out."""
    cl = Cluster(tmp)
    proxy = None
    try:
        cl.start_mind(*mind_args)
        if via_proxy:
            from support.faultproxy import FaultProxy

            proxy = FaultProxy.start(cl.port)
            cl.proxy = proxy
        if hand is not None:
            cl.start_hand(hand, *hand_args, url=proxy.url if proxy else None)
            cl.wait_connected(hand)
        yield cl
    finally:
        cl.stop_all()
        if proxy is not None:
            proxy.stop()


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "mind-home"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
        self.env["MINDHAND_HOME"] = str(self.home)
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.procs: list[Proc] = []
        self.mind: Proc | None = None
        self.hands: dict[str, Proc] = {}
        self.port = 0

    # --- processes ---

    def start_mind(self, *extra: str, port: int | None = None) -> Proc:
        url_file = self.home / "mind.url"
        if url_file.exists():
            url_file.unlink()
        listen = f"127.0.0.1:{self.port if port is None else port}"
        self.mind_args = extra
        p = Proc(
            "mind",
            [str(BIN / "mind"), "serve", "--listen", listen, "--log-format", "json", "--ping-interval", "1", *extra],
            self.env,
            self.tmp / "mind.log",
        )
        self.procs.append(p)
        self.mind = p
        wait_until(lambda: url_file.exists() or not p.alive(), 20, "the Mind to listen")
        if not p.alive():
            raise AssertionError("mind exited at start:\n" + p.output())
        self.url = url_file.read_text().strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        return p

    def add_hand(self, name: str) -> Path:
        cred = self.tmp / f"{name}.cred"
        r = self.cli("hand", "add", name, "--out", str(cred))
        assert r.returncode == 0, r.stderr
        return cred

    def start_hand(
        self, name: str, *extra: str, root: Path | None = None, cred: Path | None = None, url: str | None = None
    ) -> Proc:
        cred = cred or (self.tmp / f"{name}.cred")
        if not cred.exists():
            self.add_hand(name)
        root = root or (self.tmp / f"root-{name}")
        root.mkdir(parents=True, exist_ok=True)
        argv = [
            str(BIN / "hand"),
            "run",
            "--mind",
            url or self.url,
            "--credential",
            str(cred),
            "--root",
            str(root),
            "--state-dir",
            str(self.tmp / f"state-{name}"),
            "--log-format",
            "json",
            "--ping-interval",
            "1",
            "--max-backoff",
            "1",
            *extra,
        ]
        p = Proc(f"hand-{name}", argv, self.env, self.tmp / f"hand-{name}.log")
        self.procs.append(p)
        self.hands[name] = p
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    # --- CLI ---

    def cli(self, *args: str, timeout: float = 60.0, input: bytes | None = None) -> subprocess.CompletedProcess:
        """`mind ARGS`, its stdin `input` (or /dev/null: `mind exec` forwards its stdin, as ssh does)."""
        stdin = subprocess.DEVNULL if input is None else None
        return subprocess.run(
            [str(BIN / "mind"), *args], env=self.env, capture_output=True, timeout=timeout, input=input, stdin=stdin
        )

    def cli_popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [str(BIN / "mind"), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def task(self, task_id: str) -> dict:
        r = self.cli("task", "get", task_id, "--json", timeout=30)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def task_snapshots(self, hand: str | None = None) -> dict[str, dict]:
        """What the Mind holds, without asking any Hand (`mind task list` reads snapshots only)."""
        args = ["task", "list", "--json"] + (["--hand", hand] if hand else [])
        r = self.cli(*args, timeout=30)
        assert r.returncode == 0, r.stderr
        return {t["task_id"]: t for t in json.loads(r.stdout)}

    def hand_tasks(self, name: str) -> dict[str, dict]:
        """The Hand's own database, read by `hand tasks` on its machine (no Mind involved)."""
        r = subprocess.run(
            [str(BIN / "hand"), "tasks", "--state-dir", str(self.tmp / f"state-{name}"), "--json"],
            env=self.env,
            capture_output=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        return {t["task_id"]: t for t in json.loads(r.stdout)}

    def hands_json(self) -> list[dict]:
        r = self.cli("hands", "--json", timeout=20)
        if r.returncode != 0:
            return []
        return json.loads(r.stdout)

    def hand_info(self, name: str) -> dict | None:
        for h in self.hands_json():
            if h["name"] == name:
                return h
        return None

    def wait_connected(self, name: str, min_gen: int = 1, timeout: float = 20.0) -> dict:
        def ok():
            h = self.hand_info(name)
            return h if h and h["connected"] and h["generation"] >= min_gen else None

        return wait_until(ok, timeout, f"hand {name} connected with generation >= {min_gen}", interval=0.1)
