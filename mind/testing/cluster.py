"""Real `mind serve` and `hand run` processes on loopback, for integration tests (ours and yours).

A `Cluster` owns one temporary directory: the Mind's home, each Hand's root, state and credential,
and every log. Every process runs in its own session so cleanup can kill it, and anything it spawned,
by PID; every process and proxy it starts is also remembered module-wide and killed at interpreter
exit, so a test run that is interrupted (Ctrl-C) leaves nothing behind either. Every wait polls a
condition with a deadline (no sleeps that hope).

The processes are the programs a user runs (`mind`, `hand` next to this Python, else
`python -P -m mind|hand`): this module imports neither daemon, and nothing heavy at import time
(the client library is imported when a test asks for a client).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mind.testing import reaper

if TYPE_CHECKING:
    from mind.client.aio import MindClient
    from mind.testing.faultproxy import FaultProxy
    from protocol.auth import Credential

BIN = Path(sys.executable).parent
T = TypeVar("T")


def program(name: str) -> list[str]:
    """The argv that runs `mind` or `hand`: the console script next to this Python, if installed
    there, else the module (`-P`: the test's working directory is not put on the path)."""
    script = BIN / name
    return [str(script)] if script.exists() else [sys.executable, "-P", "-m", name]


def wait_until(
    cond: Callable[[], T | None], timeout: float = 15.0, what: str = "condition", interval: float = 0.05
) -> T:
    """Poll `cond` until it returns something true (returned), or fail after `timeout` seconds."""
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


track = reaper.track


def stop_group(p: subprocess.Popen[Any], timeout: float) -> None:
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
    reaper.forget(p)


class Proc:
    """One process of the cluster, its log in a file (stdout and stderr)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._logf = open(log, "ab")
        self.p = subprocess.Popen(
            argv,
            env=env,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=reaper.child_preexec(),
        )
        track(self.p)

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
        if not self._logf.closed:
            self._logf.flush()
        return self.log.read_text(errors="replace")

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """The JSON log lines so far (the harness starts both daemons with `--log-format json`),
        from byte offset `since` of the log."""
        if not self._logf.closed:
            self._logf.flush()
        with open(self.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        out = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out


class Mind(Proc):
    """The `mind serve` process: `url` and `port` once it listens."""

    url: str = ""
    port: int = 0
    log_start: int = 0
    """Where this process's lines begin in a log a restarted Mind shares with its predecessor."""


class Hand(Proc):
    """A `hand run` process: its name, root, state directory, credential, and its fault proxy
    (None when it dials the Mind directly)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        *,
        hand: str = "",
        root: Path | None = None,
        state_dir: Path | None = None,
        credential: Path | None = None,
        proxy: FaultProxy | None = None,
    ) -> None:
        super().__init__(name, argv, env, log)
        self.hand = hand
        self.root = root
        self.state_dir = state_dir
        self.credential = credential
        self.proxy = proxy


@contextmanager
def running(
    tmp: Path, hand: str | None = "box", *hand_args: str, via_proxy: bool = False, mind_args: tuple[str, ...] = ()
) -> Iterator[Cluster]:
    """A Mind, and a Hand named `hand` connected to it (through a fault proxy if asked: `cl.proxy`);
    all stopped and killed by PID on the way out."""
    cl = Cluster(tmp)
    try:
        cl.start_mind(*mind_args)
        if hand is not None:
            cl.start_hand(hand, *hand_args, proxy=via_proxy)
            cl.wait_connected(hand)
        yield cl
    finally:
        cl.stop_all()


class Cluster:
    """A Mind and its Hands in `tmp` (see the module docstring). Everything it starts, `stop_all`
    stops: processes by PID and group, fault proxies, in reverse order of start."""

    resume_window: float | None = None
    """`mind serve --resume-window` for every Mind started (a later flag in `mind_args` wins); None:
    the Mind's default (60 s). mindhand's own suite sets 0 for the tests of the rules without
    continuity, and each continuity test names its window."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = Path(tmp)
        self.home = self.tmp / "mind-home"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
        self.env["MINDHAND_HOME"] = str(self.home)
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.procs: list[Proc] = []
        self.mind: Mind | None = None
        self.hands: dict[str, Hand] = {}
        self.proxies: list[FaultProxy] = []
        self.proxy: FaultProxy | None = None
        """The proxy of the last Hand started with `proxy=True` (the one-Hand case)."""
        self.port = 0
        self.url = ""
        self.mind_args: tuple[str, ...] = ()

    # --- processes ---

    def start(self, *hands: str, proxy: bool = True, mind_args: tuple[str, ...] = ()) -> None:
        """The Mind and `hands` (each behind a fault proxy of its own, unless `proxy=False`),
        started together and returned once every Hand is connected.

        Each program spends most of its start importing Python, so they start at once: the Hands'
        credentials first (`mind hand add` needs no daemon), then the Mind, the proxies and the Hands
        in parallel, each Hand dialing its proxy, which holds the connection until the Mind listens
        and the proxy is told where it is. Measured: a Mind and one Hand in about 0.7 s instead of
        about 1 s one after the other."""
        if not proxy:
            self.start_mind(*mind_args)
            for name in hands:
                self.start_hand(name)
        else:
            for name in hands:
                if not (self.tmp / f"{name}.cred").exists():
                    self.add_hand(name)
            mind = self._spawn_mind(mind_args, None)
            for name in hands:
                self.start_hand(name, via=self.start_proxy(target=None))
            self._wait_listening(mind, 20.0)
            for name in hands:
                fp = self.hands[name].proxy
                assert fp is not None
                fp.target(self.port)
        for name in hands:
            self.wait_connected(name)

    def start_mind(self, *extra: str, port: int | None = None, timeout: float = 20.0) -> Mind:
        """`mind serve` on a free loopback port (or `port`, to restart on the same one); returns
        once it listens (it writes its URL file when the socket is bound)."""
        p = self._spawn_mind(extra, port)
        self._wait_listening(p, timeout)
        return p

    def _spawn_mind(self, extra: tuple[str, ...], port: int | None) -> Mind:
        url_file = self.home / "mind.url"
        if url_file.exists():
            url_file.unlink()
        listen = f"127.0.0.1:{self.port if port is None else port}"
        self.mind_args = extra
        pin = ("--resume-window", f"{self.resume_window:g}") if self.resume_window is not None else ()
        argv = [
            *program("mind"),
            "serve",
            "--listen",
            listen,
            "--log-format",
            "json",
            "--ping-interval",
            "1",
            *pin,
            *extra,
        ]
        log = self.tmp / "mind.log"
        start = log.stat().st_size if log.exists() else 0
        p = Mind("mind", argv, self.env, log)
        p.log_start = start
        self.procs.append(p)
        self.mind = p
        return p

    def _wait_listening(self, p: Mind, timeout: float) -> None:
        url_file = self.home / "mind.url"
        wait_until(lambda: url_file.exists() or not p.alive(), timeout, "the Mind to listen", interval=0.01)
        if not p.alive():
            raise AssertionError("mind exited at start:\n" + p.output())
        self.url = p.url = wait_until(lambda: url_file.read_text().strip(), 5, "the Mind's URL file", interval=0.01)
        self.port = p.port = int(self.url.rsplit(":", 1)[1])

    def add_hand(self, name: str) -> Path:
        """A credential for Hand `name` (`mind hand add`), written to `tmp/NAME.cred`."""
        cred = self.tmp / f"{name}.cred"
        r = self.cli("hand", "add", name, "--out", str(cred))
        assert r.returncode == 0, r.stderr
        return cred

    def start_proxy(self, seed: int = 0, target: int | None = -1) -> FaultProxy:
        """A fault proxy (its own process) in front of the Mind (or `target`; None: told later with
        `proxy.target(port)`); stopped by `stop_all`."""
        from mind.testing.faultproxy import FaultProxy

        proxy = FaultProxy.start(self.port if target == -1 else target, seed=seed)
        self.proxies.append(proxy)
        return proxy

    def start_hand(
        self,
        name: str,
        *extra: str,
        root: Path | None = None,
        cred: Path | None = None,
        url: str | None = None,
        proxy: bool = False,
        via: FaultProxy | None = None,
    ) -> Hand:
        """`hand run` for `name` (its credential created if needed), dialing the Mind directly, `url`,
        or, with `proxy=True`, a fault proxy of its own (`hand.proxy`; one per Hand, so one Hand of N
        can be partitioned), or through the proxy `via`. Does not wait: `wait_connected(name)` does."""
        cred = cred or (self.tmp / f"{name}.cred")
        if not cred.exists():
            self.add_hand(name)
        root = root or (self.tmp / f"root-{name}")
        root.mkdir(parents=True, exist_ok=True)
        fp = via or (self.start_proxy() if proxy else None)
        if fp is not None:
            self.proxy = fp
        state = self.tmp / f"state-{name}"
        argv = [
            *program("hand"),
            "run",
            "--mind",
            fp.url if fp is not None else (url or self.url),
            "--credential",
            str(cred),
            "--root",
            str(root),
            "--state-dir",
            str(state),
            "--log-format",
            "json",
            "--ping-interval",
            "1",
            "--max-backoff",
            "1",
            *extra,
        ]
        p = Hand(
            f"hand-{name}",
            argv,
            self.env,
            self.tmp / f"hand-{name}.log",
            hand=name,
            root=root,
            state_dir=state,
            credential=cred,
            proxy=fp,
        )
        self.procs.append(p)
        self.hands[name] = p
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        for proxy in reversed(self.proxies):
            proxy.stop()
        self.proxies.clear()

    # --- clients ---

    def client_credential(self, name: str = "tester", *flags: str) -> Path:
        """A client credential (`mind client add NAME FLAGS`, e.g. `--hands box --tools exec`), at
        `tmp/NAME.client.cred`; made once per name."""
        path = self.tmp / f"{name}.client.cred"
        if not path.exists():
            r = self.cli("client", "add", name, "--out", str(path), *flags)
            assert r.returncode == 0, r.stderr
        return path

    def credential(self, name: str = "tester", *flags: str) -> Credential:
        from mind.client.credentials import load_credential

        return load_credential(self.client_credential(name, *flags))

    async def client(self, name: str = "tester", *flags: str, url: str | None = None) -> MindClient:
        """A connected, authenticated `MindClient` as client `name` (to `url`, e.g. a proxy's, if
        given); the caller closes it (`async with await cl.client() as mc:`)."""
        import asyncio

        from mind.client.aio import MindClient

        cred = await asyncio.to_thread(self.credential, name, *flags)
        return await MindClient.connect(url or self.url, cred)

    # --- CLI ---

    def cli(self, *args: str, timeout: float = 60.0, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """`mind ARGS`, its stdin `input` (or /dev/null: `mind exec` forwards its stdin, as ssh does)."""
        stdin = subprocess.DEVNULL if input is None else None
        return subprocess.run(
            [*program("mind"), *args], env=self.env, capture_output=True, timeout=timeout, input=input, stdin=stdin
        )

    def cli_popen(self, *args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [*program("mind"), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=reaper.child_preexec(),
        )
        track(p)
        return p

    def task(self, task_id: str) -> dict[str, Any]:
        r = self.cli("task", "get", task_id, "--json", timeout=30)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def task_snapshots(self, hand: str | None = None) -> dict[str, dict[str, Any]]:
        """What the Mind holds, without asking any Hand (`mind task list` reads snapshots only)."""
        args = ["task", "list", "--json"] + (["--hand", hand] if hand else [])
        r = self.cli(*args, timeout=30)
        assert r.returncode == 0, r.stderr
        return {t["task_id"]: t for t in json.loads(r.stdout)}

    def hand_tasks(self, name: str) -> dict[str, dict[str, Any]]:
        """The Hand's own database, read by `hand tasks` on its machine (no Mind involved)."""
        r = subprocess.run(
            [*program("hand"), "tasks", "--state-dir", str(self.tmp / f"state-{name}"), "--json"],
            env=self.env,
            capture_output=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        return {t["task_id"]: t for t in json.loads(r.stdout)}

    def hands_json(self) -> list[dict[str, Any]]:
        r = self.cli("hands", "--json", timeout=20)
        if r.returncode != 0:
            return []
        return json.loads(r.stdout)

    def hand_info(self, name: str) -> dict[str, Any] | None:
        for h in self.hands_json():
            if h["name"] == name:
                return h
        return None

    def _connected_by_log(self, name: str, min_gen: int) -> int | None:
        """The generation of Hand `name`'s live connection, if the Mind's log says it is connected
        with one >= `min_gen` (it logs `hand_connected` once the Hand is registered, and
        `hand_disconnected` when it is gone). Reading a file costs microseconds where asking the
        Mind with the CLI costs a process start (~0.2 s): this is what makes startup about a second."""
        if self.mind is None:
            return None
        live: dict[int, bool] = {}
        for e in self.mind.events(getattr(self.mind, "log_start", 0)):  # a test may start its own Proc
            if e.get("hand") != name or not isinstance(e.get("gen"), int):
                continue
            if e.get("event") == "hand_connected":
                live[e["gen"]] = True
            elif e.get("event") == "hand_disconnected":
                live[e["gen"]] = False
        gens = [g for g, up in live.items() if up and g >= min_gen]
        return max(gens) if gens else None

    def wait_connected(self, name: str, min_gen: int = 1, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the Mind has Hand `name` connected with a generation >= `min_gen`; returns what
        `{"name", "connected", "generation"}` (as `mind hands --json` says them)."""
        tries = [0]

        def ok() -> dict[str, Any] | None:
            tries[0] += 1
            if (gen := self._connected_by_log(name, min_gen)) is not None:
                return {"name": name, "connected": True, "generation": gen}
            if tries[0] % 25:
                return None
            h = self.hand_info(name)  # every 25th poll asks the Mind itself (a Mind logging text)
            return h if h and h["connected"] and h["generation"] >= min_gen else None

        return wait_until(ok, timeout, f"hand {name} connected with generation >= {min_gen}", interval=0.02)
