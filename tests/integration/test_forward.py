"""`mind forward -L` for real (issue 37, DESIGN §18): a real Mind and Hand, a real TCP echo server on
loopback (the Hand's side of the tunnel), the `mind` CLI listening, real sockets on this side. Each
accepted connection is one `forward` run: bytes exact both ways, half-close carried, a refused
destination port resets that connection and says one line while the forward goes on, many connections
at once, a destination the Hand does not allow refused at start (125), SIGTERM and Ctrl-C exit 0."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mind.testing.cluster import Cluster, running

pytestmark = pytest.mark.slow  # a real Mind, a real Hand, the `mind` CLI

MIB = 1 << 20


class _Echo(socketserver.BaseRequestHandler):
    """Everything back until the client's EOF, then EOF back (the half-close seen from the far end)."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        while data := sock.recv(256 << 10):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # socketserver's 5 overflows under 20 connections on a loaded machine: resets


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("fwd")) as cl:
        yield cl


@pytest.fixture(scope="module")
def echo() -> Iterator[int]:
    server = _Server(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _line(stream: Any, timeout: float) -> bytes:
    """One line of a child's pipe, within `timeout` (the child flushes it)."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no line within {timeout}s (so far {buf!r})")
        byte = os.read(fd, 1)
        if not byte:
            raise AssertionError(f"the pipe ended (so far {buf!r})")
        buf += byte
    return buf


class Forward:
    """`mind forward box -L ... --json` running: its forwards as it announced them."""

    FLAG = "-L"

    def __init__(self, c: Cluster, *specs: str) -> None:
        args = ["forward", "box", "--json"]
        for spec in specs:
            args += [self.FLAG, spec]
        self.p = c.cli_popen(*args)
        try:
            self.forwards = [json.loads(_line(self.p.stdout, 30)) for _ in specs]
        except AssertionError:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
            raise AssertionError(f"mind forward did not start: {err.decode(errors='replace')}") from None
        self.stderr_lines = [_line(self.p.stderr, 10).decode() for _ in specs]

    def address(self, i: int = 0) -> tuple[str, int]:
        host, _, port = self.forwards[i]["listen"].rpartition(":")
        return host, int(port)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        self.p.send_signal(sig)
        _, err = self.p.communicate(timeout=30)
        return self.p.returncode, err.decode(errors="replace")


def _exchange(address: tuple[str, int], payload: bytes, timeout: float = 60) -> bytes:
    """Send `payload` (from a thread), half-close, read the answer to its EOF."""
    with socket.create_connection(address, timeout=timeout) as s:
        failed: list[OSError] = []

        def send() -> None:
            try:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
            except OSError as exc:  # raised to the caller below, as if this thread were its own
                failed.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        chunks = []
        try:
            while data := s.recv(1 << 20):
                chunks.append(data)
        finally:
            sender.join(timeout)
        if failed:
            raise failed[0]
        return b"".join(chunks)


def test_a_connection_echoes_through_the_hand_with_half_close(c: Cluster, echo: int) -> None:
    fw = Forward(c, f"0:127.0.0.1:{echo}")
    try:
        [info] = fw.forwards
        host, port = fw.address()
        assert info == {"listen": f"127.0.0.1:{port}", "to": f"127.0.0.1:{echo}", "hand": "box", "direction": "local"}
        assert fw.stderr_lines == [f"forwarding 127.0.0.1:{port} -> box:127.0.0.1:{echo}\n"]
        assert _exchange((host, port), b"hello through a hand\n") == b"hello through a hand\n"
        # half-close: our EOF reaches the echo server, its answer still comes back, then its EOF
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(b"ping")
            s.shutdown(socket.SHUT_WR)
            got = b""
            while data := s.recv(4096):
                got += data
            assert got == b"ping"
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_ten_mib_each_way_exact(c: Cluster, echo: int) -> None:
    fw = Forward(c, f"0:127.0.0.1:{echo}")
    try:
        payload = os.urandom(10 * MIB)
        started = time.monotonic()
        got = _exchange(fw.address(), payload, timeout=120)
        print(f"10 MiB each way in {time.monotonic() - started:.2f} s")
        assert len(got) == len(payload) and got == payload
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_twenty_connections_at_once(c: Cluster, echo: int) -> None:
    fw = Forward(c, f"0:127.0.0.1:{echo}")
    try:
        payloads = [os.urandom(64 << 10) + bytes([i]) for i in range(20)]
        with ThreadPoolExecutor(20) as pool:
            got = list(pool.map(lambda p: _exchange(fw.address(), p), payloads))
        assert got == payloads
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_a_refused_port_resets_that_connection_says_why_and_the_forward_goes_on(c: Cluster, echo: int) -> None:
    closed = _free_port()
    fw = Forward(c, f"0:127.0.0.1:{echo}", f"0:127.0.0.1:{closed}")
    try:
        assert fw.forwards[1]["to"] == f"127.0.0.1:{closed}"
        started = time.monotonic()
        try:
            with socket.create_connection(fw.address(1), timeout=30) as s:
                try:
                    assert s.recv(1) == b""
                except ConnectionResetError:
                    pass  # reset at once: the far side refused
        except (ConnectionResetError, BrokenPipeError):
            # The refusal's close and reset came before connect() returned to this process (CI,
            # under load, saw EPIPE): the same refusal. A refused connect would still fail here.
            pass
        assert time.monotonic() - started < 15
        assert _line(fw.p.stderr, 15).decode() == f"box: 127.0.0.1:{closed} refused the connection\n"
        assert _exchange(fw.address(0), b"still up") == b"still up"
        # the refused one's listener is still up too: it accepts, and resets (the far side refuses)
        # at once; the reset may even beat our connect() back (EPIPE), but never a refused connect
        try:
            assert _exchange(fw.address(1), b"") == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert _line(fw.p.stderr, 15).decode() == f"box: 127.0.0.1:{closed} refused the connection\n"
    finally:
        code, err = fw.stop(signal.SIGINT)
    assert code == 0, err


def test_a_destination_the_hand_does_not_allow_is_refused_at_start(c: Cluster) -> None:
    r = c.cli("forward", "box", "-L", "0:192.0.2.10:80", timeout=60)
    assert r.returncode == 125, r.stderr
    assert b"192.0.2.10:80 is not a destination this hand allows" in r.stderr
    assert b"forwarding" not in r.stderr and r.stdout == b""


def test_a_port_in_use_exits_2(c: Cluster, echo: int) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = c.cli("forward", "box", "-L", f"{port}:127.0.0.1:{echo}", timeout=60)
    assert r.returncode == 2
    assert r.stderr.decode() == f"mind: forward: cannot listen on 127.0.0.1:{port}: address in use\n"


def test_a_unix_socket_in_the_hands_root(c: Cluster) -> None:
    path = c.tmp / "root-box" / "echo.sock"
    server = _UnixServer(str(path), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fw = Forward(c, "0:./echo.sock")
        try:
            assert fw.forwards[0]["to"] == "./echo.sock"
            assert _exchange(fw.address(), b"over a unix socket") == b"over a unix socket"
        finally:
            code, err = fw.stop()
        assert code == 0, err
    finally:
        server.shutdown()
        server.server_close()
        Path(path).unlink(missing_ok=True)


def test_a_bad_spec_exits_2(c: Cluster) -> None:
    r = c.cli("forward", "box", "-L", "70000:db:5432", timeout=60)
    assert r.returncode == 2
    assert b"PORT 70000 is above 65535" in r.stderr


def test_sigterm_with_a_connection_open_cancels_its_run_and_exits_0(c: Cluster, echo: int) -> None:
    fw = Forward(c, f"0:127.0.0.1:{echo}")
    with socket.create_connection(fw.address(), timeout=30) as s:
        s.sendall(b"open")
        assert s.recv(16) == b"open"
        started = time.monotonic()
        code, err = fw.stop()
        assert code == 0, err
        assert time.monotonic() - started < 15
        try:
            assert s.recv(16) == b""
        except ConnectionResetError:
            pass  # its run was cancelled: the connection is reset
    runs = json.loads(c.cli("runs", "--json").stdout)
    assert runs[0]["tool"] == "forward" and runs[0]["state"] == "cancelled", runs[0]


class Reverse(Forward):
    """`mind forward box -R ... --json` running: the Hand listens, connections come back here."""

    FLAG = "-R"


def test_a_remote_forward_carries_the_hands_connections_here(c: Cluster, echo: int) -> None:
    """`-R`: the Hand listens on its loopback; a connection made there reaches our echo server, both
    ways exact, half-close carried; several at once."""
    fw = Reverse(c, f"0:127.0.0.1:{echo}")
    try:
        [info] = fw.forwards
        host, port = fw.address()
        assert info == {"listen": f"127.0.0.1:{port}", "to": f"127.0.0.1:{echo}", "hand": "box", "direction": "remote"}
        assert fw.stderr_lines == [f"forwarding box:127.0.0.1:{port} -> 127.0.0.1:{echo}\n"]
        assert _exchange((host, port), b"from the hand's side\n") == b"from the hand's side\n"
        payload = os.urandom(4 * MIB)
        assert _exchange((host, port), payload) == payload
        with ThreadPoolExecutor(10) as pool:
            outs = list(pool.map(lambda i: _exchange((host, port), bytes([i]) * 100_000), range(10)))
        assert outs == [bytes([i]) * 100_000 for i in range(10)]
    finally:
        code, err = fw.stop()
    assert code == 0, err
    runs = json.loads(c.cli("runs", "--json").stdout)
    assert any(r["tool"] == "forward" and r["state"] == "cancelled" for r in runs)  # the listener, stopped


def test_a_remote_forward_whose_destination_here_refuses_resets_at_once(c: Cluster) -> None:
    closed = _free_port()
    fw = Reverse(c, f"0:127.0.0.1:{closed}")
    try:
        started = time.monotonic()
        with socket.create_connection(fw.address(), timeout=30) as s:
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        assert time.monotonic() - started < 15  # never a hang
        line = _line(fw.p.stderr, 15).decode()
        assert line.startswith(f"box: 127.0.0.1:{closed} (here) could not be reached"), line
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_a_remote_forward_off_the_hands_loopback_is_refused(c: Cluster, echo: int) -> None:
    r = c.cli("forward", "box", "-R", f"0.0.0.0:0:127.0.0.1:{echo}", timeout=60)
    assert r.returncode == 125, r.stderr
    assert b"only on its loopback" in r.stderr and r.stdout == b""
