"""A far Hand's stream grows its window (`protocol.streams.WindowTuner`), and a Mind killed -9 while
the grown window is in flight adopts the run within it: every byte arrives once, the exit code is
the command's. Both ways: a command's stdout (the client's tuner), and a `mind cp` to the Hand (the
Hand's tuner on the copy's stdin).

The Hand dials the Mind through the shipped fault proxy holding every piece 150 ms each way. With
the opening's 2 MiB window the Hand can never have more than 2 MiB unacknowledged, so the proxy can
never hold more than that (and a few bytes of framing) on its way up; the test waits until the proxy
holds twice that (the client's
acknowledgements grew the window), then kills the Mind and starts it again on the same port. The
Hand presents the run with the window it was granted, the new Mind relays within it, the CLI
re-attaches, and the rest of the stream follows.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

import pytest

from mind.testing.cluster import running
from protocol import limits

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # how much the proxy holds is the machine's speed times 150 ms

MIB = 1 << 20
SIZE = 96 * MIB
ONE_WAY_MS = 150
WINDOW = ("--resume-window", "60")


def test_a_far_streams_window_grows_and_a_mind_killed_meanwhile_adopts_it_whole(tmp_path):
    with running(tmp_path, "box", via_proxy=True, mind_args=WINDOW) as cl:
        data = os.urandom(SIZE)
        (cl.hands["box"].root / "big.bin").write_bytes(data)
        proxy = cl.proxy
        assert proxy is not None
        proxy.latency(ONE_WAY_MS, direction="both")
        p = cl.cli_popen("exec", "box", "--", "cat", "big.bin")
        got = bytearray()
        held = 0
        try:
            assert p.stdout is not None
            os.set_blocking(p.stdout.fileno(), False)
            deadline = time.monotonic() + 60
            while held <= 2 * limits.STREAM_WINDOW and time.monotonic() < deadline:
                held = max(held, *(c["up_held"] for c in proxy.status()["connections"]))
                try:
                    got += os.read(p.stdout.fileno(), 1 << 20)
                except BlockingIOError:
                    time.sleep(0.01)
            assert held > 2 * limits.STREAM_WINDOW, f"the proxy held at most {held} bytes: the window did not grow"
            assert len(got) < SIZE, "the stream ended before the Mind was killed: nothing was tested"
            port = cl.port
            assert cl.mind is not None
            cl.mind.signal(signal.SIGKILL)
            cl.mind.p.wait(timeout=20)
            cl.start_mind(*WINDOW, port=port)
            os.set_blocking(p.stdout.fileno(), True)
            rest, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        got += rest
        assert p.returncode == 0, err.decode(errors="replace")
        assert len(got) == SIZE and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
        logs = "".join(f.read_text(errors="replace") for f in cl.tmp.rglob("*.log"))
        assert "stream_refused" not in logs


def test_a_far_uploads_window_grows_and_a_mind_killed_meanwhile_adopts_it_whole(tmp_path):
    """The same, the other way: the Hand grants the copy's stdin a larger window, so the proxy holds
    more than the opening's 2 MiB on its way down to the Hand; the Mind is killed -9 and started
    again, the Hand presents the stdin window it granted, and the one `mind cp` finishes the file."""
    with running(tmp_path, "box", via_proxy=True, mind_args=WINDOW) as cl:
        data = os.urandom(SIZE)
        src = tmp_path / "up.bin"
        src.write_bytes(data)
        proxy = cl.proxy
        assert proxy is not None
        proxy.latency(ONE_WAY_MS, direction="both")
        p = cl.cli_popen("cp", str(src), "box:up.bin")
        held = 0
        try:
            deadline = time.monotonic() + 60
            while held <= 2 * limits.STREAM_WINDOW and time.monotonic() < deadline and p.poll() is None:
                held = max(held, *(c["down_held"] for c in proxy.status()["connections"]))
                time.sleep(0.01)
            assert held > 2 * limits.STREAM_WINDOW, f"the proxy held at most {held} bytes: the window did not grow"
            assert p.poll() is None, "the copy ended before the Mind was killed: nothing was tested"
            port = cl.port
            assert cl.mind is not None
            cl.mind.signal(signal.SIGKILL)
            cl.mind.p.wait(timeout=20)
            cl.start_mind(*WINDOW, port=port)
            _, err = p.communicate(timeout=180)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        assert p.returncode == 0, err.decode(errors="replace")
        copied = (cl.hands["box"].root / "up.bin").read_bytes()
        assert hashlib.sha256(copied).digest() == hashlib.sha256(data).digest()
        logs = "".join(f.read_text(errors="replace") for f in cl.tmp.rglob("*.log"))
        assert "stream_refused" not in logs
