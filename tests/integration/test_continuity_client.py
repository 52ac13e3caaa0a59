"""Issue 22, the client leg on the CLI's fast path, with real processes: `mind exec` rides out a cut
of its own connection to the Mind (a fault proxy between the CLI and the Mind), `mind attach` takes
a run up again, `--detach` and `--wait` leave one running. Every test names its resume window (the
suite's Minds run with 0 unless told)."""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import time

import pytest

from mind.testing import reaper
from mind.testing.cluster import program, running, track

pytestmark = pytest.mark.slow  # a real Mind, Hand and fault proxy (mind.testing.cluster)

LINES = 30
NUMBERED = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.1; done; exit 7"
EXPECTED = b"".join(f"line {i}\n".encode() for i in range(1, LINES + 1))


def window(seconds: float) -> tuple[str, ...]:
    return ("--resume-window", f"{seconds:g}")


def popen(cl, *args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [*program("mind"), *args],
        env=cl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=stdin,
        start_new_session=True,
        preexec_fn=reaper.child_preexec(),
    )
    track(p)
    return p


def read_until(pipe, needle: bytes, timeout: float) -> bytes:
    """Read a child's pipe until `needle` appears (bounded)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {needle!r}; got {buf!r}"
        ready, _, _ = select.select([pipe], [], [], left)
        if ready:
            chunk = os.read(pipe.fileno(), 65536)
            assert chunk, f"pipe closed before {needle!r}; got {buf!r}"
            buf += chunk
    return buf


def finish(p: subprocess.Popen[bytes], head: bytes, timeout: float) -> tuple[bytes, bytes]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate(timeout=5)
        raise AssertionError(f"mind exec did not finish in {timeout} s; stderr: {err!r}") from None
    return head + out, err


def test_client_leg_reset_mid_run_all_lines_and_the_exit_code(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", NUMBERED)
        head = read_until(p.stdout, b"line 5\n", 20)
        fp.cut("rst")
        out, err = finish(p, head, 30)
        assert p.returncode == 7, err
        assert hashlib.sha256(out).hexdigest() == hashlib.sha256(EXPECTED).hexdigest(), (out, err)
        assert b"mind unreachable, reconnecting (up to" in err
