"""`mind forward -L` at its edges (issue 37, DESIGN §18, §15, §16), with real processes: a Mind (or two
Mind nodes on the suite's PostgreSQL), a Hand, the `mind` CLI listening, a real TCP echo server on
the Hand's side, real sockets here.

What a user relies on:
- **Policy and scope, at start.** A Hand that denies the tool `forward` (`hand run --deny-tools
  forward`), or a client credential scoped without it (`mind client add NAME --tools exec`), makes
  `mind forward -L` exit 125 before it listens, the reason on stderr (`denied_by_scope` for the
  scope), nothing on stdout, the port not listened on.
- **Past the resume window, a reset, never a hang.** An open connection whose Hand leg is cut (the
  Hand's link blackholed, its reconnects refused) for longer than the Mind's `--resume-window` is
  reset here (the local socket reads EOF or ECONNRESET, not before the window passed); `mind
  forward` keeps running and its listener keeps accepting; once the leg is back a new connection
  echoes exactly.
- **Many Minds.** The client on node A, the Hand held by node B: a connection is routed through B
  and echoes 1 MiB exactly both ways. The node holding the Hand is killed (-9) with a connection
  open: the Hand reconnects to the survivor (the client's own node), which adopts the connection's
  run, and the SAME connection goes on (a line sent after the kill comes back, then the half-close;
  the run ends `succeeded` on the survivor). It survives too when the killed node was the client's
  own as well (`mind forward --mind A --mind B`, A holding the Hand): the client goes round its URLs
  and re-attaches on B, which adopted the run. (A client given only the killed node's URL has
  nowhere to go: not tested, nothing promises it.)
- **A peer that never reads stalls only its own connection.** One connection pushes 8 MiB into the
  echo server and never reads the echo (so its window fills and the far side stops); another
  connection through the same forward meanwhile does 64 KiB round trips promptly and exactly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from test_forward import MIB, Forward, _Echo, _exchange, _free_port, _line, _Server
from test_many_minds import _events, _start_pair, holder, node

from mind.testing.cluster import Cluster, running, wait_until

pytestmark = pytest.mark.slow  # real Minds, a real Hand, the `mind` CLI, PostgreSQL


class Through(Forward):
    """`mind forward HAND [EXTRA...] --json -L SPEC...` run from `c`'s home: its forwards as announced."""

    def __init__(self, c: Cluster, hand: str, *specs: str, extra: tuple[str, ...] = ()) -> None:
        args = ["forward", *extra, hand, "--json"]
        for spec in specs:
            args += ["-L", spec]
        self.p = c.cli_popen(*args)
        try:
            self.forwards = [json.loads(_line(self.p.stdout, 30)) for _ in specs]
        except AssertionError:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
            raise AssertionError(f"mind forward did not start: {err.decode(errors='replace')}") from None
        self.stderr_lines = [_line(self.p.stderr, 10).decode() for _ in specs]

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            _, err = self.p.communicate(timeout=30)
        except Exception:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
        return self.p.returncode, err.decode(errors="replace")


class _CountingServer(_Server):
    """The echo server, counting the connections it accepted (what reached the destination)."""

    accepted = 0

    def verify_request(self, request, client_address) -> bool:  # type: ignore[no-untyped-def]
        self.accepted += 1
        return True

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        """A connection reset by the Hand (its run cancelled, reset, lost) is an expected ending."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)


@pytest.fixture
def echo() -> Iterator[_CountingServer]:
    server = _CountingServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _port(server: _CountingServer) -> int:
    return int(server.server_address[1])


def _recv_exactly(s: socket.socket, n: int, timeout: float) -> bytes:
    """`n` bytes from `s` within `timeout` seconds (an EOF or the deadline fails, saying how far)."""
    got = bytearray()
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"only {len(got)} of {n} bytes within {timeout}s")
        s.settimeout(left)
        try:
            data = s.recv(n - len(got))
        except TimeoutError:
            continue
        if not data:
            raise AssertionError(f"EOF after {len(got)} of {n} bytes")
        got += data
    return bytes(got)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


# --- 1. policy and scope: refused at start ------------------------------------------------------------


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Mind, Hand `box` (every tool), Hand `locked` (`--deny-tools forward`)."""
    with running(tmp_path_factory.mktemp("fwd-edges")) as cl:
        cl.start_hand("locked", "--deny-tools", "forward")
        cl.wait_connected("locked")
        yield cl


def test_a_hand_that_denies_forward_refuses_it_at_start(c: Cluster, echo: _CountingServer) -> None:
    port = _free_port()
    started = time.monotonic()
    r = c.cli("forward", "locked", "-L", f"{port}:127.0.0.1:{_port(echo)}", timeout=60)
    took = time.monotonic() - started
    assert r.returncode == 125, r.stderr
    err = r.stderr.decode()
    assert err.startswith(f"mind: cannot forward to locked:127.0.0.1:{_port(echo)}: "), err
    print(err, end="")
    assert "denied_by_policy" in err, err
    assert "forwarding" not in err and r.stdout == b""
    assert _refused(port) and echo.accepted == 0  # nothing listened here, nothing reached the destination
    assert took < 30
    # the same destination through the Hand that allows it: the refusal was the Hand's policy
    fw = Through(c, "box", f"0:127.0.0.1:{_port(echo)}")
    try:
        assert _exchange(fw.address(), b"allowed\n") == b"allowed\n"
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_a_credential_scoped_without_forward_is_refused_at_start(c: Cluster, echo: _CountingServer) -> None:
    cred = c.client_credential("execonly", "--tools", "exec")
    ok = c.cli("exec", "--credential", str(cred), "box", "--", "echo", "in scope")
    assert ok.returncode == 0 and ok.stdout == b"in scope\n", ok.stderr  # the credential itself works
    port = _free_port()
    r = c.cli("forward", "--credential", str(cred), "box", "-L", f"{port}:127.0.0.1:{_port(echo)}", timeout=60)
    assert r.returncode == 125, r.stderr
    err = r.stderr.decode()
    print(err, end="")
    assert "denied_by_scope" in err, err
    assert err.startswith("mind: ") and err.count("\n") == 1, err  # one line, the reason
    assert "forwarding" not in err and r.stdout == b""
    assert _refused(port) and echo.accepted == 0


# --- 4. a peer that never reads stalls only itself ------------------------------------------------------


class _Pusher:
    """A connection that sends up to `total` bytes and never reads: `sent` is how far it got."""

    def __init__(self, address: tuple[str, int], total: int) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.total = total
        self.sent = 0
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._push, daemon=True)
        self.thread.start()

    def _push(self) -> None:
        data = memoryview(os.urandom(self.total))
        self.sock.settimeout(0.2)
        try:
            while self.sent < self.total and not self.stop.is_set():
                try:
                    self.sent += self.sock.send(data[self.sent : self.sent + (256 << 10)])
                except TimeoutError:
                    continue
        except OSError as exc:
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close()


PUSH_CAP = 64 * MIB
"""The most the connection that never reads tries to send: far more than every window and socket
buffer on the way hold (about 22 MiB on loopback here), so it is held back well before."""


def test_a_connection_that_never_reads_does_not_stall_another(c: Cluster, echo: _CountingServer) -> None:
    """Connection 1 pushes into the echo server and never reads the echo: 8 MiB go in, and it goes
    on pushing until it is held back (every window and buffer on the way full: back-pressure
    reaches the sender, nothing grows without bound). Connection 2, beside it through the same
    forward, does 16 round trips of 64 KiB within 10 s, exact, and its half-close comes back."""
    fw = Through(c, "box", f"0:127.0.0.1:{_port(echo)}")
    pusher: _Pusher | None = None
    try:
        pusher = _Pusher(fw.address(), PUSH_CAP)
        wait_until(lambda: pusher.sent >= 8 * MIB or pusher.errors, 60, "8 MiB of the pusher to go in")

        def held() -> bool:  # what it sent stops growing
            before = pusher.sent
            time.sleep(1.5)
            return pusher.sent == before

        wait_until(held, 90, "the pusher to be held back", interval=0)
        print(f"the connection that never reads got {pusher.sent / MIB:.2f} MiB in, then was held back")
        assert pusher.sent < PUSH_CAP  # back-pressure, not a buffer that grows without bound
        assert pusher.thread.is_alive() and not pusher.errors, pusher.errors

        started = time.monotonic()
        with socket.create_connection(fw.address(), timeout=30) as s:
            for _ in range(16):
                chunk = os.urandom(64 << 10)
                s.sendall(chunk)
                assert _recv_exactly(s, len(chunk), 10) == chunk
            s.shutdown(socket.SHUT_WR)
            assert _recv_exactly_eof(s, 10)
        took = time.monotonic() - started
        print(f"16 round trips of 64 KiB beside it in {took:.2f} s")
        assert took < 10
        assert pusher.thread.is_alive() and not pusher.errors  # still held, never reset
    finally:
        if pusher is not None:
            pusher.close()
        code, err = fw.stop()
    assert code == 0, err


def _run_get(c: Cluster, run_id: str) -> dict | None:
    r = c.cli("run", "get", run_id, "--json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def _recv_exactly_eof(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    return s.recv(1) == b""


# --- 2. past the resume window: a reset, the listener stays ---------------------------------------------

WINDOW_S = 3


@pytest.fixture
def short(tmp_path) -> Iterator[Cluster]:
    """A Mind with a 3 s resume window; Hand `box` dialing it through a fault proxy."""
    with running(tmp_path, "box", via_proxy=True, mind_args=("--resume-window", str(WINDOW_S))) as cl:
        yield cl


def test_past_the_resume_window_an_open_connection_is_reset_and_the_forward_goes_on(
    short: Cluster, echo: _CountingServer
) -> None:
    c = short
    proxy = c.proxy
    assert proxy is not None
    gen = c.wait_connected("box")["generation"]
    fw = Through(c, "box", f"0:127.0.0.1:{_port(echo)}")
    try:
        s = socket.create_connection(fw.address(), timeout=30)
        try:
            s.sendall(b"before the cut\n")
            assert _recv_exactly(s, 15, 15) == b"before the cut\n"
            proxy.blackhole()  # the Hand's leg silent, both ways
            proxy.refuse()  # and its reconnects refused: the cut lasts until we say
            cut = time.monotonic()
            s.sendall(b"into the cut\n")  # taken here, never delivered
            s.settimeout(60)
            try:
                got = s.recv(4096)
            except ConnectionResetError:
                got = b""
            reset_after = time.monotonic() - cut
            assert got == b"", got
            print(f"the open connection was reset {reset_after:.2f} s after the cut (window {WINDOW_S} s)")
            assert WINDOW_S * 0.9 <= reset_after < 45  # not before the window passed; never a hang
        finally:
            s.close()
        assert fw.p.poll() is None, fw.p.stderr  # `mind forward` goes on
        line = _line(fw.p.stderr, 15).decode()
        print(f"mind forward said: {line!r}")
        assert line.startswith("box: "), line  # why, in one line
        try:  # the listener still accepts (that one is reset: the Hand is away)
            socket.create_connection(fw.address(), timeout=10).close()
        except ConnectionResetError:
            pass  # accepted, and reset before this process saw its connect complete (a loaded machine)
        proxy.reset()  # the leg is back
        c.wait_connected("box", min_gen=gen + 1, timeout=30)
        payload = os.urandom(MIB)
        assert _exchange(fw.address(), payload) == payload
        assert fw.p.poll() is None
    finally:
        code, err = fw.stop()
    assert code == 0, err


# --- 3. many Minds: the client on one node, the Hand on another -----------------------------------------


@pytest.fixture
def nodes(tmp_path, pg_database):
    a, b = node(tmp_path, "a", pg_database), node(tmp_path, "b", pg_database)
    try:
        yield a, b
    finally:
        b.stop_all()
        a.stop_all()


def test_a_forward_through_the_other_node_survives_a_kill_9_of_the_hands_node(
    nodes: tuple[Cluster, Cluster], echo: _CountingServer
) -> None:
    a, b = nodes
    _start_pair(a, b)
    a.add_hand("box")
    a.start_hand("box", url=f"{a.url},{b.url}")
    first = wait_until(lambda: holder(a, b), 30, "box connected to a node")
    other = b if first is a else a
    gen = first._connected_by_log("box", 1)
    assert gen is not None
    fw = Through(other, "box", f"0:127.0.0.1:{_port(echo)}", extra=("--mind", other.url))
    try:
        payload = os.urandom(MIB)
        started = time.monotonic()
        assert _exchange(fw.address(), payload) == payload
        print(f"1 MiB each way through the other node in {time.monotonic() - started:.2f} s")
        admitted = [e for e in _events(first, "run_admitted") if e.get("tool") == "forward"]
        assert admitted and not [e for e in _events(other, "run_admitted") if e.get("tool") == "forward"]

        with socket.create_connection(fw.address(), timeout=30) as s:
            s.sendall(b"before the kill\n")
            assert _recv_exactly(s, 16, 15) == b"before the kill\n"
            assert first.mind is not None
            first.mind.kill9()
            killed = time.monotonic()
            other.wait_connected("box", min_gen=gen + 1, timeout=30)
            (adopted,) = wait_until(
                lambda: _events(other, "run_adopted"), 30, "the survivor to adopt the connection's run"
            )
            s.sendall(b"after the kill\n")
            assert _recv_exactly(s, 15, 30) == b"after the kill\n"
            print(f"the same connection answered {time.monotonic() - killed:.2f} s after the kill")
            s.shutdown(socket.SHUT_WR)
            assert _recv_exactly_eof(s, 30)  # and its end is carried too
        assert fw.p.poll() is None
        assert _exchange(fw.address(), payload) == payload  # and new connections go through the survivor
        # the connection's run, adopted by the survivor, ended there succeeded, every byte back counted
        run = wait_until(
            lambda: (r := _run_get(other, adopted["run_id"])) and r["state"] != "running" and r, 30, "the run's end"
        )
        assert run["tool"] == "forward" and run["state"] == "succeeded", run
        stdout = next(s for s in run["end"]["collected"] if s["stream"] == "stdout")
        assert stdout["offset"] == len(b"before the kill\nafter the kill\n"), run
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_a_forward_whose_own_node_holds_the_hand_and_is_killed_goes_round_to_the_other(
    nodes: tuple[Cluster, Cluster], echo: _CountingServer
) -> None:
    """The client (`mind forward --mind A --mind B`) on node A, which holds the Hand too; A is killed
    (-9) with a connection open: the Hand moves to B, which adopts the run; the client goes round its
    URLs (§15, §16) and re-attaches there; the SAME connection goes on."""
    a, b = nodes
    _start_pair(a, b)
    a.add_hand("box")
    a.start_hand("box", url=f"{a.url},{b.url}")
    first = wait_until(lambda: holder(a, b), 30, "box connected to a node")
    other = b if first is a else a
    gen = first._connected_by_log("box", 1)
    assert gen is not None
    to_other = first.start_proxy(target=other.port)
    to_other.refuse()  # so the client starts on the holder, whichever URL it tries first
    fw = Through(first, "box", f"0:127.0.0.1:{_port(echo)}", extra=("--mind", first.url, "--mind", to_other.url))
    try:
        to_other.accept()
        with socket.create_connection(fw.address(), timeout=30) as s:
            s.sendall(b"before the kill\n")
            assert _recv_exactly(s, 16, 15) == b"before the kill\n"
            assert first.mind is not None
            first.mind.kill9()
            killed = time.monotonic()
            other.wait_connected("box", min_gen=gen + 1, timeout=30)
            wait_until(lambda: _events(other, "run_adopted"), 30, "the survivor to adopt the connection's run")
            s.sendall(b"after the kill\n")
            assert _recv_exactly(s, 15, 45) == b"after the kill\n"
            print(f"the same connection answered {time.monotonic() - killed:.2f} s after its node's kill")
            s.shutdown(socket.SHUT_WR)
            assert _recv_exactly_eof(s, 30)
        assert fw.p.poll() is None
        payload = os.urandom(MIB)
        assert _exchange(fw.address(), payload) == payload
    finally:
        code, err = fw.stop()
    assert code == 0, err
