"""A tunnel rides out what a run rides out (issue 37 item 3, DESIGN §18 and §15): a cut of the Hand's
leg, a cut of the client's leg, a kill -9 and restart of the Mind, each shorter than the resume
window, while a connection is open and bytes are in flight both ways: the connection stalls and
goes on, and not a byte is lost, duplicated or reordered. Real processes: the Mind, a Hand behind a
fault proxy, `mind forward` dialling the Mind through a second proxy, a TCP echo server."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from test_forward import Forward, _Echo, _Server

from mind.testing.cluster import Cluster, running

pytestmark = pytest.mark.slow

WINDOW_S = 30


@pytest.fixture
def echo() -> Iterator[int]:
    server = _Server(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def c(tmp_path) -> Iterator[Cluster]:
    with running(tmp_path, "box", via_proxy=True, mind_args=("--resume-window", str(WINDOW_S))) as cl:
        yield cl


class Paced:
    """One connection through the tunnel: `total` bytes sent in chunks with a pause between them
    (so a fault lands mid-transfer), read back on another thread; `result()` is what came back."""

    def __init__(self, address: tuple[str, int], total: int, chunk: int = 64 << 10, pause: float = 0.004) -> None:
        self.payload = os.urandom(total)
        self.sock = socket.create_connection(address, timeout=WINDOW_S * 2)
        self.got = bytearray()
        self.errors: list[BaseException] = []
        self._reader = threading.Thread(target=self._read)
        self._writer = threading.Thread(target=self._write, args=(chunk, pause))
        self._reader.start()
        self._writer.start()

    def _write(self, chunk: int, pause: float) -> None:
        try:
            for i in range(0, len(self.payload), chunk):
                self.sock.sendall(self.payload[i : i + chunk])
                time.sleep(pause)
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.errors.append(exc)

    def _read(self) -> None:
        try:
            while data := self.sock.recv(1 << 20):
                self.got += data
        except OSError as exc:
            self.errors.append(exc)

    def result(self, timeout: float = WINDOW_S * 2) -> bytes:
        self._writer.join(timeout)
        self._reader.join(timeout)
        self.sock.close()
        assert not self._reader.is_alive(), f"the echo did not end ({len(self.got)} of {len(self.payload)} bytes)"
        assert not self.errors, self.errors
        return bytes(self.got)


def _through(c: Cluster, echo: int, mind_url: str | None = None) -> Forward:
    if mind_url is None:
        return Forward(c, f"0:127.0.0.1:{echo}")
    orig = c.cli_popen

    def via(*args: str):  # `mind forward --mind PROXY ...`
        return orig(args[0], "--mind", mind_url, *args[1:])

    c.cli_popen = via  # type: ignore[method-assign]
    try:
        return Forward(c, f"0:127.0.0.1:{echo}")
    finally:
        c.cli_popen = orig  # type: ignore[method-assign]


def _generation(c: Cluster) -> int:
    info = c.hand_info("box")
    assert info is not None
    return int(info["generation"])


def _exact(fw: Forward, fault, total: int = 8 << 20) -> None:
    flow = Paced(fw.address(), total)
    time.sleep(0.15)  # bytes in flight both ways
    fault()
    got = flow.result()
    assert len(got) == total and got == flow.payload  # nothing lost, doubled or reordered
    # and the forward takes new connections afterwards
    again = Paced(fw.address(), 256 << 10, pause=0)
    assert again.result() == again.payload


def test_a_cut_of_the_hands_leg_loses_no_byte_of_an_open_connection(c: Cluster, echo: int) -> None:
    fw = _through(c, echo)
    gen = _generation(c)
    proxy = c.proxy
    assert proxy is not None
    try:
        _exact(fw, lambda: (proxy.partition(800), c.wait_connected("box", min_gen=gen + 1)))
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_a_cut_of_the_clients_leg_loses_no_byte_of_an_open_connection(c: Cluster, echo: int) -> None:
    front = c.start_proxy()
    fw = _through(c, echo, front.url)
    try:
        _exact(fw, lambda: front.partition(800))
    finally:
        code, err = fw.stop()
    assert code == 0, err


def test_a_restart_of_the_mind_loses_no_byte_of_an_open_connection(c: Cluster, echo: int) -> None:
    fw = _through(c, echo)
    port = c.port
    gen = _generation(c)

    def restart() -> None:
        assert c.mind is not None
        c.mind.kill9()
        c.mind.p.wait(timeout=20)
        c.start_mind("--resume-window", str(WINDOW_S), port=port)
        assert c.proxy is not None
        c.wait_connected("box", min_gen=gen + 1, timeout=30)

    try:
        _exact(fw, restart)
    finally:
        code, err = fw.stop()
    assert code == 0, err
