"""The fault proxy from Python: the same commands as methods, on the in-process engine
(`await start_proxy(...)`, for asyncio tests) or on a proxy process (`FaultProxy.start(...)`, for sync
tests and for a Hand that must keep its link while the test's own loop is busy or gone).

Both answer what the control line answers and raise `FaultProxyError` on an `error` reply.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mind.testing import reaper
from mind.testing.faultproxy.proxy import FaultProxyError, Proxy
from mind.testing.faultproxy.schedule import Step
from mind.testing.faultproxy.token import read_token
from mind.testing.faultproxy.token import send as send_command


def _opts(direction: str, conn: int | None, p: float | None, **kw: object) -> str:
    words = [direction]
    if conn is not None:
        words.append(str(conn))
    if p is not None:
        words.append(f"p={p:g}")
    words += [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items() if v is not None]
    return " ".join(words)


class Commands:
    """Every command as a method. `direction` is `up` (to the server), `down` or `both`; `conn` a
    connection id from `status()`; `p` the probability that the fault applies to a connection
    (decided from the proxy's seed).

    Which connections a command touches when `conn` is None:
    - an L4 fault (latency, blackhole, timeout, ...): every live connection and every later one (a
      path condition: a reconnect meets the same path) until `clear()` or `reset()`;
    - a frame rule (`frame`, `hold`): the live connections, or when none is live the next one to
      open, and no other (an event: "cut at the first `accepted`" cuts once and lets the Hand
      reconnect); `every=True` makes it apply to every later connection too, each counting its
      own `k` and `times`.
    """

    def send(self, command: str) -> str:  # pragma: no cover - provided by the concrete class
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        return json.loads(self.send("status")[3:])

    # L4 faults, in Toxiproxy's vocabulary
    def latency(
        self, ms: float, jitter: float = 0, direction: str = "both", conn: int | None = None, p: float | None = None
    ) -> str:
        return self.send(f"latency {ms:g} {_opts(direction, conn, p, jitter=float(jitter))}")

    def bandwidth(
        self, kib_per_s: float, direction: str = "both", conn: int | None = None, p: float | None = None
    ) -> str:
        return self.send(f"bandwidth {kib_per_s:g} {_opts(direction, conn, p)}")

    def slow_close(self, ms: float, direction: str = "both", conn: int | None = None, p: float | None = None) -> str:
        return self.send(f"slow_close {ms:g} {_opts(direction, conn, p)}")

    def timeout(self, ms: float, direction: str = "both", conn: int | None = None, p: float | None = None) -> str:
        """Stop the data (dropped, as Toxiproxy does) and close after `ms` (0: never)."""
        return self.send(f"timeout {ms:g} {_opts(direction, conn, p)}")

    def slicer(
        self,
        average: int,
        variation: int = 0,
        delay_us: float = 0,
        direction: str = "both",
        conn: int | None = None,
        p: float | None = None,
    ) -> str:
        return self.send(f"slicer {average} {_opts(direction, conn, p, variation=variation, delay_us=float(delay_us))}")

    def limit_data(self, nbytes: int, direction: str = "both", conn: int | None = None, p: float | None = None) -> str:
        return self.send(f"limit_data {nbytes} {_opts(direction, conn, p)}")

    def reset_peer(self, after_ms: float = 0, conn: int | None = None, p: float | None = None) -> str:
        return self.send(f"reset_peer {after_ms:g} {_opts('both', conn, p)}")

    def down(self) -> str:
        return self.send("down")

    def up(self) -> str:
        return self.send("up")

    # ours
    def blackhole(self, direction: str = "both", conn: int | None = None, p: float | None = None) -> str:
        return self.send(f"blackhole {_opts(direction, conn, p)}")

    def resume(self, direction: str = "both", conn: int | None = None) -> str:
        return self.send(f"resume {_opts(direction, conn, None)}")

    def cut(self, how: str = "fin", conn: int | None = None) -> str:
        return self.send(f"cut {how} {_opts('both', conn, None)}")

    def refuse(self) -> str:
        return self.send("refuse")

    def accept(self) -> str:
        return self.send("accept")

    def partition(self, ms: float = 0) -> str:
        """Cut every connection (RST) and refuse new ones; for `ms` only if given."""
        return self.send(f"partition {ms:g}")

    def clear(self, direction: str = "both", conn: int | None = None) -> str:
        """Every fault and frame rule of `direction` removed (on `conn`, or on every connection and
        from the defaults later connections would get); held frames are delivered."""
        return self.send(f"clear {_opts(direction, conn, None)}")

    def reset(self) -> str:
        """`clear()` of both directions everywhere, and new connections accepted again (after
        `refuse`, `down`, `partition`)."""
        return self.send("reset")

    def seed(self, seed: int) -> str:
        return self.send(f"seed {seed}")

    def target(self, port: int, host: str = "127.0.0.1") -> str:
        """Where new connections go (a proxy started with no target holds them until this)."""
        return self.send(f"target {host}:{port}")

    # frames
    def frame(
        self,
        action: str,
        type_: str,
        direction: str = "both",
        k: int = 1,
        times: int = 1,
        ms: float | None = None,
        after: bool = False,
        how: str = "rst",
        conn: int | None = None,
        p: float | None = None,
        every: bool = False,
    ) -> str:
        """`action` (hold, drop, duplicate, delay, cut) the `k`-th frame of `type_` in `direction`,
        and the next `times - 1` (0: every one from the k-th on), counted per connection.

        Connections touched: `conn` alone when given; else the live connections, or when none is
        live the next one to open, and no later one; with `every=True` also every later connection.
        `clear()` removes the rule (held frames are delivered); `reset()` removes every fault."""
        flags = (" after" if after else "") + (" fin" if how == "fin" else "") + (" every" if every else "")
        return self.send(f"frame {action} {type_} {_opts(direction, conn, p, k=k, times=times, ms=ms)}{flags}")

    def hold(
        self, type_: str, direction: str = "both", k: int = 1, conn: int | None = None, every: bool = False
    ) -> str:
        """Hold the k-th frame of `type_` and the data frames after it until `release()`; the
        connections it touches are `frame()`'s (the live ones, or else the next one)."""
        return self.frame("hold", type_, direction, k=k, conn=conn, every=every)

    def release(self, direction: str = "both", conn: int | None = None) -> str:
        return self.send(f"release {_opts(direction, conn, None)}")

    def held(self) -> int:
        return sum(c["up_held"] + c["down_held"] for c in self.status()["connections"])

    def frames_seen(self, type_: str, direction: str) -> int:
        return sum(c[f"{direction}_frames"].get(type_, 0) for c in self.status()["connections"])

    def play(self, steps: Iterable[Step]) -> None:
        """Send each step's command at its time (seconds from now), in order; blocking."""
        t0 = time.monotonic()
        for step in steps:
            if (wait := t0 + step.at - time.monotonic()) > 0:
                time.sleep(wait)
            self.send(step.command)


class InProcessProxy(Commands):
    """The engine in the caller's event loop: commands are plain calls (no socket)."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return self.proxy.url

    def send(self, command: str) -> str:
        reply = self.proxy.command(command)
        if not reply.startswith("ok"):
            raise FaultProxyError(f"fault proxy: {reply}")
        return reply

    async def close(self) -> None:
        await self.proxy.close()

    async def __aenter__(self) -> InProcessProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_proxy(target_port: int, *, host: str = "127.0.0.1", seed: int = 0) -> InProcessProxy:
    """A proxy to `host:target_port` on a free loopback port, in this event loop."""
    proxy = Proxy((host, target_port), seed=seed)
    await proxy.start()
    return InProcessProxy(proxy)


class FaultProxy(Commands):
    """The proxy as its own process (`python -m mind.testing.faultproxy`): `.url`, `.send(cmd)`,
    `.stop()`. Its own session, so `stop()` (or the test harness) kills it by PID whatever happens."""

    def __init__(self, proc: subprocess.Popen[bytes], listen: int, control: int, token: str | None = None) -> None:
        self.proc = proc
        self.port = listen
        self.url = f"ws://127.0.0.1:{listen}"
        self.control_port = control
        self.token = token
        """The control token (from the proxy's 0600 token file): only its owner can drive it."""
        self.token_file: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(
        cls, target_port: int | None, *, host: str = "127.0.0.1", seed: int = 0, timeout: float = 15.0
    ) -> FaultProxy:
        """Start the proxy to `host:target_port`; with None, it holds connections until `target()`."""
        argv = [sys.executable, "-P", "-m", "mind.testing.faultproxy", "--seed", str(seed)]  # -P: not the cwd
        if target_port is not None:
            argv += ["--target", f"{host}:{target_port}"]
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=reaper.child_preexec(),
        )
        reaper.track(proc)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), True)
        line = b""
        try:
            import selectors

            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                if sel.select(timeout):
                    line = proc.stdout.readline()
        finally:
            if not line:
                proc.kill()
                proc.wait(timeout=10)
        if not line:
            raise FaultProxyError("the fault proxy did not start")
        ports = json.loads(line)
        proxy = cls(proc, ports["listen"], ports["control"], read_token(Path(ports["token_file"])))
        proxy.token_file = ports["token_file"]
        return proxy

    def send(self, command: str) -> str:
        try:
            reply = send_command(("127.0.0.1", self.control_port), self.token, command)
        except OSError as exc:
            raise FaultProxyError(f"fault proxy unreachable on port {self.control_port}: {exc}") from None
        if not reply.startswith("ok"):
            raise FaultProxyError(f"fault proxy: {reply}")
        return reply

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait(timeout=10)
        reaper.forget(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.token_file is not None:
            Path(self.token_file).unlink(missing_ok=True)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
