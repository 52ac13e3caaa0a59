"""10,000 connections opened at once through `mind forward -L` (issue 37 item 7, DESIGN §18): a
client's forwarded connections are bounded by its stream budget in the Mind (`quota_exceeded` for
the excess), and nobody else is slowed.

Real processes: a Mind and a Hand (`running`), a real TCP echo server on the Hand's side, `mind
forward box -L 0:127.0.0.1:ECHO --json` as client `flooder` (its own credential). The test opens
10,000 non-blocking TCP connections to the forward's listener at once (one thread, epoll), each
sending 16 bytes of its own and keeping the connection open without closing it, while client
`victim` (another credential, the library) runs `exec echo ok` on the same Hand in a loop, timing
each call.

What a user relies on:
- **The bound holds.** Every connection ends in one of two ways: its 16 bytes come back exactly
  (it was carried: a `forward` run admitted), or it is closed/reset without a byte (its run was
  refused). At most the budget's worth are carried at once (256 MiB / (2 x 512 KiB) = 256), and
  every other connection's failure is `quota_exceeded` (stderr names it; no connection failed for
  another reason).
- **Refused promptly, never hung.** Every one of the 10,000 sockets is echoed or closed within
  `SETTLE_S` of the flood's start.
- **The forward survives.** `mind forward` stays up throughout and its link to the Mind is never
  cut (one handshake, no `peer_*` cut in the Mind's log, at the Mind's default keepalive: see
  `MIND_ARGS`); once the carried connections half-close, each gets its EOF back (its run ends
  cleanly), and a new connection then echoes 1 MiB exactly. The Mind stays up (`mind status`).
- **Nobody else slowed.** The victim's calls all succeed during the flood, their median stays
  within a generous bound of the median before it (a real stall is seconds; a loaded 2-core box
  adds tens of milliseconds), and no single call takes `STALL_S`. Measured here: median 5-8 ms
  before, 7-15 ms during; the slowest single call during 0.23-0.44 s, p90 0.13-0.2 s (the Mind's
  reader hands the loop back every 32 of the flooder's starts, `YIELD_EVERY`; before it did, one
  read's worth of starts was one turn of ~0.1 s, a call crossed several, and the slowest took
  1.0-2.7 s).

Every socket and process is closed or killed (by PID) on the way out, pass or fail.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_forward import MIB, Forward, _Echo, _exchange, _line, _Server

from mind.client.forward import WINDOW
from mind.core.budgets import STREAM_BUDGET_BYTES
from mind.testing.cluster import Cluster, running
from protocol.messages import StreamData
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind, a real Hand, the `mind` CLI, 10,000 sockets

N = 10_000
BUDGET_CONNECTIONS = STREAM_BUDGET_BYTES // (2 * WINDOW)
"""What one client's stream budget carries at once: a connection holds a window each way (256)."""
SETTLE_S = 60.0
"""Every connection echoed or closed within this of the flood's start (a hang never is)."""
LATENCY_FACTOR = 10.0
LATENCY_ABS_S = 0.5
"""The victim's median during the flood: at most LATENCY_FACTOR times its median before, and at
most LATENCY_ABS_S (a stall of the Mind is seconds; CPU contention on 2 cores tens of ms)."""
LATENCY_FLOOR_S = 0.05
"""A median before the flood of a few ms times the factor would be noise-sized: the factor's bound
is taken from at least this."""
MIND_ARGS = ("--ping-interval", "10")
"""The Mind's keepalive at its default (10 s), not the harness's 1 s (the Hand's too: `HAND_ARGS`): a busy peer's pong may take
0.75 of an interval to be read (`mind.core.liveness`), and the flooder's pong waits behind its
10,000 starts, which the Mind admits or refuses at ~2,000 a second on this machine. At 1 s the Mind
cuts the forward's link (`peer_behind`) a few seconds into the flood and, with the suite's resume
window of 0, every carried connection is reset ("connection to the Mind closed")."""
HAND_ARGS = ("--ping-interval", "10")
"""The Hand's keepalive at its default (10 s) for the same reason: at the harness's 1 s the Hand
gives up on the Mind's pong (0.75 s) while the Mind's loop is held by the flood (CI saw it once: all
255 carried runs `lost: hand connection lost before a result`, their budget freed, 308 carried)."""
STALL_S = 10.0
"""No single call of the victim's during the flood takes this long: a hang, or a stall of the Mind's
loop for the whole flood. 0.23-0.44 s is measured for the slowest call (see above): the Mind's
fairness under the flood, reported rather than made a bound here (a bound near it would be a
timing assertion on a shared machine)."""


def _payload(i: int) -> bytes:
    return b"conn-%06d-ok.\n" % i  # 16 bytes, its own per connection


PAYLOAD_LEN = len(_payload(0))


class _QuietServer(_Server):
    """The echo server, with room for the budget's connections arriving at once, and quiet about
    connections reset when their runs end."""

    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)


class _FloodForward(Forward):
    """`mind forward --credential CRED box --json -L SPEC`, its stderr drained on a thread from the
    start (a refusal is a line on stderr: thousands of them must not fill the pipe and block it)."""

    def __init__(self, c: Cluster, cred: str, spec: str) -> None:
        self.p = c.cli_popen("forward", "--credential", cred, "box", "--json", "-L", spec)
        try:
            self.forwards = [json.loads(_line(self.p.stdout, 30))]
            self.stderr_lines = [_line(self.p.stderr, 10).decode()]
        except AssertionError:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
            raise AssertionError(f"mind forward did not start: {err.decode(errors='replace')}") from None
        self.err: list[str] = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.err.append(line.decode(errors="replace"))

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()
            self.p.wait(timeout=10)
        self._drain.join(10)
        return self.p.returncode, "".join(self.err)


class _Flood:
    """N non-blocking connections to `address`, opened at once from one thread (epoll): each sends
    its payload once connected, then waits for its echo (kept open) or for its close/reset. Each
    connection's `outcome` and when it was decided (seconds since the flood began)."""

    def __init__(self, address: tuple[str, int], n: int) -> None:
        self.address = address
        self.n = n
        self.socks: list[socket.socket | None] = [None] * n
        self.outcome: list[str | None] = [None] * n
        self.at: list[float] = [0.0] * n
        self.got = [b""] * n
        self.opened_in = 0.0
        self.started = 0.0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def _decide(self, sel: selectors.BaseSelector, i: int, outcome: str) -> None:
        s = self.socks[i]
        assert s is not None
        self.outcome[i] = outcome
        self.at[i] = time.monotonic() - self.started
        sel.unregister(s)
        if outcome != "echoed":
            s.close()
            self.socks[i] = None

    def _run(self) -> None:
        sel = selectors.EpollSelector()
        try:
            for i in range(self.n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                self.socks[i] = s
                err = s.connect_ex(self.address)
                sel.register(s, selectors.EVENT_WRITE, i)
                if err not in (0, errno.EINPROGRESS):
                    self._decide(sel, i, f"connect failed: {errno.errorcode.get(err, err)}")
            self.opened_in = time.monotonic() - self.started
            undecided = sum(1 for o in self.outcome if o is None)
            deadline = self.started + SETTLE_S
            while undecided and not self._stop.is_set() and time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    i = key.data
                    conn = key.fileobj
                    assert isinstance(conn, socket.socket)
                    outcome = self._event(sel, i, conn)
                    if outcome is not None:
                        self._decide(sel, i, outcome)
                        undecided -= 1
        except BaseException as exc:  # reported by the test, never lost in a thread
            self.error = exc
        finally:
            sel.close()
            self.done.set()

    def _event(self, sel: selectors.BaseSelector, i: int, s: socket.socket) -> str | None:
        """What this event decided about connection `i` (None: not yet)."""
        if sel.get_key(s).events & selectors.EVENT_WRITE:  # connected, or failed to
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err in (errno.ECONNRESET, errno.EPIPE):
                return "closed"  # accepted, and reset before we wrote: refused
            if err:
                return f"connect failed: {errno.errorcode.get(err, err)}"
            try:
                s.send(_payload(i))  # 16 bytes into an empty buffer: all of them
            except (ConnectionResetError, BrokenPipeError):
                return "closed"
            sel.modify(s, selectors.EVENT_READ, i)
            return None
        try:
            data = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            return "closed" if not self.got[i] else f"closed after {len(self.got[i])} bytes"
        self.got[i] += data
        if len(self.got[i]) < PAYLOAD_LEN:
            return None
        return "echoed" if self.got[i] == _payload(i) else f"wrong echo {self.got[i]!r}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def close(self) -> None:
        self.stop()
        for i, s in enumerate(self.socks):
            if s is not None:
                s.close()
                self.socks[i] = None


def _half_close_all(socks: list[socket.socket], timeout: float) -> tuple[int, list[str]]:
    """Half-close each (still open) carried connection and wait for its EOF back (its run ended
    cleanly): how many got it within `timeout`, and what the others got instead."""
    sel = selectors.EpollSelector()
    other: list[str] = []
    try:
        for s in socks:
            s.setblocking(False)
            s.shutdown(socket.SHUT_WR)
            sel.register(s, selectors.EVENT_READ)
        eofs = 0
        deadline = time.monotonic() + timeout
        while len(sel.get_map()) and time.monotonic() < deadline:
            for key, _ in sel.select(0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    data = conn.recv(4096)
                except ConnectionResetError:
                    data = None
                sel.unregister(conn)
                if data == b"":
                    eofs += 1
                else:
                    other.append("reset" if data is None else f"more bytes {data!r}")
        other += ["no EOF"] * len(sel.get_map())
        return eofs, other
    finally:
        sel.close()


def _raise_nofile(need: int) -> None:
    """Room for the flood's sockets here and, inherited, in `mind forward` (it accepts them)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        assert hard == resource.RLIM_INFINITY or hard >= need, f"ulimit -n: hard limit {hard} < {need}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def _echo_ok(mc: Any) -> tuple[float, str | None]:
    """`exec echo ok` on box through the library: its latency, and what was wrong (None: nothing)."""
    out = bytearray()

    def on_event(ev: Any) -> None:
        if isinstance(ev, StreamData) and ev.stream == "stdout":
            out.extend(ev.data)

    started = time.perf_counter()
    try:
        end = await asyncio.wait_for(
            mc.exec("box", "exec", {"argv": ["echo", "ok"]}, timeout=60, on_event=on_event), 60
        )
    except Exception as exc:
        return time.perf_counter() - started, repr(exc)
    took = time.perf_counter() - started
    if end.state is not RunState.SUCCEEDED or end.exit_code != 0 or bytes(out) != b"ok\n":
        return took, f"{end.state.value} exit {end.exit_code} {end.error or end.reason} stdout {bytes(out)!r}"
    return took, None


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@pytest.mark.alone  # "slows nobody" is judged against the victim's own median: other tests' load would be noise
async def test_ten_thousand_connections_at_once_are_bounded_refused_promptly_and_slow_nobody(tmp_path: Path) -> None:
    _raise_nofile(N + 2000)  # each process: the flood here, its accepted sockets in `mind forward`
    echo = _QuietServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    try:
        with running(tmp_path, "box", *HAND_ARGS, mind_args=MIND_ARGS) as cl:
            fw: _FloodForward | None = None
            flood: _Flood | None = None
            mc = None
            try:
                flooder = str(cl.client_credential("flooder"))
                cl.client_credential("victim")
                fw = _FloodForward(cl, flooder, f"0:127.0.0.1:{echo.server_address[1]}")
                address = fw.address()
                assert _exchange(address, b"warm\n") == b"warm\n"  # the forward carries before the flood
                mc = await cl.client("victim")

                # the victim's calls before the flood
                for _ in range(3):
                    await _echo_ok(mc)
                before = [await _echo_ok(mc) for _ in range(40)]
                assert all(why is None for _, why in before), before

                # the flood, and the victim's calls while it lasts
                flood = _Flood(address, N)
                flood.start()
                during: list[tuple[float, str | None]] = []
                forward_died_at: float | None = None
                offsets: list[float] = []  # when each of the victim's calls began, since the flood began
                while not flood.done.is_set():
                    offsets.append(time.monotonic() - flood.started)
                    during.append(await _echo_ok(mc))
                    if forward_died_at is None and fw.p.poll() is not None:
                        forward_died_at = time.monotonic() - flood.started
                settled_in = time.monotonic() - flood.started
                assert flood.error is None, f"the flood's thread failed: {flood.error!r}"
                assert forward_died_at is None and fw.p.poll() is None, (
                    f"mind forward exited ({fw.p.returncode}) during the flood:\n{''.join(fw.err)[-3000:]}"
                )

                outcomes: dict[str, int] = {}
                for o in flood.outcome:
                    key = o if o is not None else "undecided"
                    outcomes[key] = outcomes.get(key, 0) + 1
                carried = [i for i, o in enumerate(flood.outcome) if o == "echoed"]
                refused = [i for i, o in enumerate(flood.outcome) if o == "closed"]
                t_carried = [flood.at[i] for i in carried]
                t_refused = [flood.at[i] for i in refused]
                b_before = [t for t, _ in before]
                b_during = [t for t, _ in during]
                p50_before, p50_during = statistics.median(b_before), statistics.median(b_during or [float("nan")])
                err_lines = [ln for ln in fw.err if ln.strip()]
                assert cl.mind is not None
                events = cl.mind.events(cl.mind.log_start)
                links = [e for e in events if e.get("event") == "handshake_ok" and e.get("label") == "flooder"]
                cuts = [e for e in events if str(e.get("event", "")).startswith(("peer_", "outbox_"))]
                quota_lines = [ln for ln in err_lines if "quota_exceeded" in ln]
                # How the flooder's runs ended, as the Mind logged them: a carried run that ended during
                # the flood frees its share of the budget (CI once saw 496 carried against 256).
                ended: dict[str, int] = {}
                for e in events:
                    if e.get("event") == "run_terminal" and e.get("tool") == "forward":
                        key = f"{e.get('state')}: {str(e.get('reason'))[:60]}"
                        ended[key] = ended.get(key, 0) + 1
                hand_links = [
                    f"{e.get('event')}: {e.get('error', '')}"
                    for e in cl.hands["box"].events()
                    if e.get("event") in ("connected", "connect_failed", "handshake_failed", "connection_crashed")
                ]
                print(
                    f"\n{N} connects issued in {flood.opened_in:.2f}s; all decided in {settled_in:.1f}s: {outcomes}"
                    f"\ncarried (echoed) {len(carried)} (budget {BUDGET_CONNECTIONS}), decided at "
                    f"p50 {_pct(t_carried, 0.5):.2f}s max {max(t_carried, default=0):.2f}s"
                    f"\nrefused (closed, no byte) {len(refused)}, decided at p50 {_pct(t_refused, 0.5):.2f}s "
                    f"p99 {_pct(t_refused, 0.99):.2f}s max {max(t_refused, default=0):.2f}s"
                    f"\nforward stderr: {len(err_lines)} lines, {len(quota_lines)} naming quota_exceeded; "
                    f"first: {quota_lines[0].strip() if quota_lines else None!r}"
                    f"\nvictim: {len(before)} calls before, p50 {p50_before * 1000:.1f}ms max {max(b_before) * 1000:.1f}ms; "
                    f"{len(during)} during, p50 {p50_during * 1000:.1f}ms p90 {_pct(b_during, 0.9) * 1000:.1f}ms "
                    f"max {max(b_during, default=0) * 1000:.1f}ms; slowest (s, began at s): "
                    f"{[(round(t, 2), round(at, 2)) for t, at in sorted(zip(b_during, offsets, strict=True))[-3:]]}"
                    f"\nflooder's links to the Mind: {len(links)}; peers cut: {cuts}"
                    f"\nforward runs ended by then, as the Mind logged them: {ended}"
                    f"\nthe Hand's links to the Mind: {hand_links}"
                )

                # every connection echoed exactly or closed without a byte, within SETTLE_S: none hung
                assert outcomes.get("undecided", 0) == 0, f"not echoed nor closed within {SETTLE_S}s: {outcomes}"
                assert len(carried) + len(refused) == N, outcomes
                # the forward's own link to the Mind held: never cut, never redialled
                assert len(links) == 1 and not cuts, (links, cuts)
                # and the Hand's held too: one connection, never redialled (a cut loses every carried run)
                assert len(hand_links) == 1, hand_links
                # at most the budget's worth carried at once (every carried one is still open: checked
                # below, each half-closed gets its EOF back), and the budget used, not wasted
                assert BUDGET_CONNECTIONS - 4 <= len(carried) <= BUDGET_CONNECTIONS, outcomes
                # the refused ones were refused by the budget, said on stderr: once, then counted (a
                # burst of the same line is `(and N more like it)`, not 9,744 lines)
                assert quota_lines, f"stderr does not name quota_exceeded: {err_lines[:5]}"
                assert len(err_lines) < 200, f"{len(err_lines)} lines on stderr for one burst of refusals"
                assert any("more like it" in ln for ln in err_lines), err_lines[:5]
                others = [ln for ln in err_lines if ln.startswith("box:") and "quota_exceeded" not in ln]
                assert not others, f"connections failed for another reason than the budget: {others[:5]}"

                # nobody else slowed: every call succeeded, the median within bounds, no stall
                assert len(during) >= 5, f"the victim made only {len(during)} calls during the flood"
                failed = [why for _, why in during if why is not None]
                assert not failed, f"{len(failed)} of the victim's calls failed during the flood: {failed[:3]}"
                bound = min(LATENCY_ABS_S, LATENCY_FACTOR * max(p50_before, LATENCY_FLOOR_S))
                assert p50_during <= bound, (
                    f"the victim's median went {p50_before * 1000:.0f} -> {p50_during * 1000:.0f} ms (bound {bound * 1000:.0f})"
                )
                assert max(b_during) < STALL_S, f"a call of the victim's took {max(b_during):.1f}s during the flood"

                # the carried connections end cleanly: half-closed, each gets its EOF back (its run ended)
                socks = [s for i in carried if (s := flood.socks[i]) is not None]
                eofs, other = _half_close_all(socks, 30)
                assert eofs == len(carried) and not other, (eofs, other[:5])
                flood.close()

                # the forward still serves: a new connection, 1 MiB each way exactly (the budget frees as
                # the carried runs' ends reach the Mind: a refusal meanwhile is retried, bounded)
                assert fw.p.poll() is None, "".join(fw.err)[-3000:]
                payload = os.urandom(MIB)
                deadline = time.monotonic() + 30
                tries = 0
                while True:
                    tries += 1
                    try:
                        got = await asyncio.to_thread(_exchange, address, payload, 60)
                    except (ConnectionResetError, BrokenPipeError):
                        got = b""
                    if got == payload or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                assert len(got) == len(payload) and got == payload, (
                    f"after the flood: {len(got)} bytes in {tries} tries"
                )
                print(f"after the flood: 1 MiB echoed exactly ({tries} tries)")

                # the Mind is up, the victim still served
                status = await asyncio.to_thread(cl.cli, "status", timeout=60)
                assert status.returncode == 0, status.stderr
                assert (await _echo_ok(mc))[1] is None
                await mc.close()
                mc = None
                code, err = fw.stop()
                fw = None
                assert code == 0, err[-3000:]
            finally:
                if flood is not None:
                    flood.close()
                if mc is not None:
                    await mc.close()
                if fw is not None and fw.p.poll() is None:
                    fw.p.kill()
                    fw.p.wait(10)
    finally:
        echo.shutdown()
        echo.server_close()
