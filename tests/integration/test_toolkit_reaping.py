"""The toolkit leaves no process behind when pytest is stopped by a signal (issue 23, attack 10):
SIGTERM (what CI sends at a timeout) and SIGHUP (a closed terminal) reap every group it started,
and even a SIGKILL of pytest takes them down (the kernel's parent-death signal). The fault proxy's
control port takes commands only with the owner's token."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mind.testing.cluster import pid_alive, wait_until
from mind.testing.faultproxy.api import FaultProxy

pytestmark = pytest.mark.slow  # every test here starts the daemons

TEST = """
import json, os, time
def test_sleeps(mindhand_cluster, hand, faultproxy):
    info = {{"pids": [mindhand_cluster.mind.pid, hand.pid, faultproxy.pid]}}
    with open({record!r} + ".part", "w") as f:
        json.dump(info, f)
    os.replace({record!r} + ".part", {record!r})
    time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_a_signalled_pytest_leaves_no_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    record = tmp_path / "record.json"
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    (tmp_path / "test_sleeps.py").write_text(TEST.format(record=str(record)))
    p = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        wait_until(record.exists, 60, "the user's test to start its cluster")
        pids = json.loads(record.read_text())["pids"]
        os.kill(p.pid, sig)
        p.communicate(timeout=60)
        wait_until(lambda: not any(pid_alive(q) for q in pids), 15, f"pids {pids} to be gone after {sig.name}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        for q in pids:  # a failure here must not leave them either
            try:
                os.killpg(q, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert p.returncode == -sig


def test_the_proxy_control_port_refuses_commands_without_the_owners_token() -> None:
    proxy = FaultProxy.start(1)
    try:
        assert proxy.token_file is not None
        mode = os.stat(proxy.token_file).st_mode
        assert stat.S_IMODE(mode) == 0o600 and stat.S_IMODE(os.stat(Path(proxy.token_file).parent).st_mode) == 0o700
        for first in (b"refuse\n", b"auth wrong\nrefuse\n", b"status\n"):
            with socket.create_connection(("127.0.0.1", proxy.control_port), timeout=10) as s:
                s.sendall(first)
                reply = s.makefile("rb").read()
            assert reply.startswith(b"error: not authorized"), reply
            assert reply.count(b"\n") == 1, "nothing after the refusal was acted on"
        assert proxy.status()["refusing"] is False, "the stranger's refuse was not applied"
        assert proxy.send("refuse").startswith("ok") and proxy.status()["refusing"] is True
    finally:
        proxy.stop()
