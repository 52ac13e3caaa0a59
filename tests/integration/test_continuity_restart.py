"""Issue 22: a restart of the Mind is a reconnect on both legs (DESIGN §15).

Real processes: a Mind with a resume window, a Hand, `mind exec` as the client. The Mind is stopped
(SIGTERM, or kill -9) mid-run and started again on the same port: the Hand presents its run, the new
Mind adopts it for its owner, the CLI re-attaches, and the run finishes with its real exit code and
every byte of its output. First terminal wins across a crash: an ending the Mind decided by itself
before the crash stands, and the run is killed on the Hand when it is presented again.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from mind.testing.cluster import Cluster, pid_alive, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind (restarted), Hand and CLI

LINES = 32
TICKER = f"echo $$ > tick.pid; i=1; while [ $i -le {LINES} ]; do echo line $i; i=$((i+1)); sleep 0.25; done; exit 3"
"""About 8 s of a numbered line every 0.25 s, then exit 3 (a real exit code, not 0)."""
EXPECTED = b"".join(b"line %d\n" % i for i in range(1, LINES + 1))
WINDOW = ("--resume-window", "30")


@pytest.fixture
def cl(tmp_path) -> Iterator[Cluster]:
    with running(tmp_path, "box", mind_args=WINDOW) as c:
        yield c


class Output:
    """A `mind exec` child's stdout, read as it comes (bounded waits)."""

    def __init__(self, p: subprocess.Popen[bytes]) -> None:
        self.p = p
        self.data = b""

    def until(self, needle: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.data:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {needle!r}; got {self.data[-200:]!r}"
            self._read(left)

    def rest(self, timeout: float) -> tuple[int, bytes, str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"mind exec did not end; got {self.data[-200:]!r}"
            if not self._read(left):
                break
        assert self.p.stderr is not None
        err = self.p.stderr.read().decode(errors="replace")
        return self.p.wait(timeout=max(1.0, deadline - time.monotonic())), self.data, err

    def _read(self, left: float) -> bool:
        assert self.p.stdout is not None
        ready, _, _ = select.select([self.p.stdout], [], [], left)
        if not ready:
            return True
        chunk = os.read(self.p.stdout.fileno(), 65536)
        self.data += chunk
        return bool(chunk)


def start_ticker(cl: Cluster) -> Output:
    (cl.hands["box"].root / "tick.pid").unlink(missing_ok=True)
    out = Output(cl.cli_popen("exec", "box", "--", "sh", "-c", TICKER))
    out.until(b"line 6\n", 20)
    return out


def restart(cl: Cluster, sig: int, down_s: float = 1.0) -> None:
    """Stop the Mind with `sig`, leave it down `down_s`, start it again on the same port."""
    assert cl.mind is not None
    port = cl.port
    cl.mind.signal(sig)
    cl.mind.p.wait(timeout=20)
    time.sleep(down_s)
    cl.start_mind(*WINDOW, port=port)


def run_info(cl: Cluster, run_id: str) -> dict:
    r = cl.cli("run", "get", run_id, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def run_id_of(cl: Cluster) -> str:
    r = cl.cli("runs", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    rows = rows if isinstance(rows, list) else rows.get("runs", [])
    return str(rows[0]["run_id"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_restart_of_the_mind_mid_run_the_run_finishes_with_every_line_and_its_exit_code(cl, sig):
    out = start_ticker(cl)
    started = time.monotonic()
    restart(cl, sig)
    rc, data, err = out.rest(40)
    assert rc == 3, err
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(EXPECTED).hexdigest(), (data[-300:], err)
    assert time.monotonic() - started < 25  # a pause, not the window
    # the run's record in the new Mind: adopted, then ended by the Hand's own result
    info = run_info(cl, run_id_of(cl))
    assert info["state"] == "failed" and info["end"]["exit_code"] == 3


def test_a_client_back_before_the_hand_is_told_to_wait_and_then_gets_the_rest(tmp_path):
    """The Hand cannot reach the restarted Mind for a while (its link refuses connections): the CLI
    re-attaches first, hears `resume_pending`, asks again, and gets everything once the Hand is back."""
    with running(tmp_path, "box", via_proxy=True, mind_args=WINDOW) as cl:
        out = start_ticker(cl)
        assert cl.proxy is not None
        cl.proxy.refuse()
        restart(cl, signal.SIGKILL)
        time.sleep(4)  # the CLI is back, the Hand is not: the run is not in this Mind yet
        assert out.p.poll() is None
        cl.proxy.accept()
        rc, data, err = out.rest(40)
        assert rc == 3, err
        assert data == EXPECTED, err
        events = [e.get("event") for e in cl.mind.events()] if cl.mind else []
        assert "run_adopted" in events


def test_an_ending_the_mind_decided_before_a_crash_stands_and_the_run_is_killed_when_presented(tmp_path):
    """The Hand stops answering (SIGSTOP) past a 4 s window: the Mind ends the run `lost` and writes
    it durably. Then the Mind is killed -9 and restarted, and the Hand resumes: it presents the run,
    and the new Mind kills it on the Hand instead of adopting it. The first ending stands."""
    window = ("--resume-window", "4")
    with running(tmp_path, "box", mind_args=window) as cl:
        root = cl.hands["box"].root
        p = cl.cli_popen("exec", "box", "--", "sh", "-c", "echo $$ > held.pid; sleep 60")
        pidfile = root / "held.pid"
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "the command to start")
        pid = int(pidfile.read_text())
        hand = cl.hands["box"]
        hand.signal(signal.SIGSTOP)
        try:
            rc = p.wait(timeout=30)  # the Mind decided: lost, once the window passed
            assert rc == 255
            run_id = run_id_of(cl)
            assert run_info(cl, run_id)["state"] == "lost"
            assert cl.mind is not None
            port = cl.mind.port
            cl.mind.kill9()
            cl.mind.p.wait(timeout=20)
            cl.start_mind(*window, port=port)
        finally:
            hand.signal(signal.SIGCONT)
        cl.wait_connected("box", min_gen=2, timeout=20)
        wait_until(lambda: not pid_alive(pid), 15, "the presented run to be killed on the Hand")
        info = run_info(cl, run_id)
        assert info["state"] == "lost"  # the ending from before the crash, not a second one
        events = [e.get("event") for e in cl.mind.events()]
        assert "run_adopted" not in events and "run_presented_after_end" in events


def test_ctrl_c_during_a_mind_outage_is_delivered_on_its_return(cl):
    root = cl.hands["box"].root
    out = start_ticker(cl)
    pid = int((root / "tick.pid").read_text())
    assert cl.mind is not None
    port = cl.port
    cl.mind.kill9()
    cl.mind.p.wait(timeout=20)
    out.p.send_signal(signal.SIGINT)  # typed while the Mind is down
    time.sleep(1.0)
    assert out.p.poll() is None  # still waiting: the Ctrl-C is queued, not lost
    cl.start_mind(*WINDOW, port=port)
    rc, data, err = out.rest(40)
    assert rc == 130, err
    wait_until(lambda: not pid_alive(pid), 10, "the command's tree to be killed")
    assert data == EXPECTED[: len(data)]  # what arrived is a prefix, in order, nothing repeated


def test_sigterm_with_a_window_leaves_runs_resumable_and_says_so(cl):
    out = start_ticker(cl)
    assert cl.mind is not None
    mind = cl.mind
    mind.signal(signal.SIGTERM)
    assert mind.p.wait(timeout=10) == 0  # promptly
    stopping = [e for e in mind.events() if e.get("event") == "mind_stopping"]
    assert stopping and stopping[-1].get("runs_resumable") == 1
    cl.start_mind(*WINDOW, port=mind.port)
    rc, data, err = out.rest(40)
    assert (rc, data) == (3, EXPECTED), err
