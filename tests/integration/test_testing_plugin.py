"""The shipped pytest plugin (`mind/testing/plugin.py`) as a user meets it: a test file of theirs,
run by pytest in a directory of its own with nothing but the installed package. A passing file
passes; a failing one and an interrupted one (SIGINT to pytest) leave no process, port or temporary
directory behind, checked by PID and by port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mind.testing.cluster import Cluster, pid_alive, wait_until
from mind.testing.plugin import TMP_PREFIX

pytestmark = pytest.mark.slow  # every test here starts the daemons
pytest_plugins = ("pytester",)

RECORD = """
import json, os
def record(mindhand_cluster, hand, faultproxy, path):
    info = {
        "pids": [mindhand_cluster.mind.pid, hand.pid, faultproxy.pid],
        "ports": [mindhand_cluster.mind.port, faultproxy.port, faultproxy.control_port],
        "tmp": str(mindhand_cluster.tmp),
    }
    with open(path + ".part", "w") as f:
        json.dump(info, f)
    os.replace(path + ".part", path)
"""

INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


def port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def nothing_left(record: Path) -> None:
    info = json.loads(record.read_text())
    wait_until(lambda: not any(pid_alive(p) for p in info["pids"]), 10, f"pids {info['pids']} to be gone")
    for port in info["ports"]:
        assert port_closed(port), f"port {port} still accepts connections"
    assert not Path(info["tmp"]).exists(), f"{info['tmp']} was left behind"


def test_a_users_test_file_using_every_fixture_passes(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(
        test_user="""
        import pytest

        def test_hand_runs_a_command(mindhand_cluster, mind, hand, faultproxy):
            assert mindhand_cluster.mind is mind and hand.proxy is faultproxy
            r = mindhand_cluster.cli("exec", "--hand", "box", "--", "echo", "hi")
            assert r.returncode == 0 and r.stdout == b"hi\\n"
            assert faultproxy.status()["connections"][0]["framing"] == "ws"

        @pytest.mark.asyncio
        async def test_client(mind_client, hand):
            assert await mind_client.call("box", "list_dir", {"path": "."}) is not None
            assert [h.name for h in await mind_client.hands()] == ["box"]
        """
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2)


def test_a_failing_test_leaves_nothing_behind(pytester: pytest.Pytester, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    pytester.makeini(INI)
    pytester.makepyfile(
        test_fails=RECORD
        + f"""
def test_fails(mindhand_cluster, hand, faultproxy):
    record(mindhand_cluster, hand, faultproxy, {str(record)!r})
    assert False, "the user's assertion"
"""
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(failed=1)
    assert "mind.log (last 40 lines)" in result.stdout.str()  # the logs of a failed test are shown
    nothing_left(record)


def test_an_interrupted_run_leaves_nothing_behind(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_sleeps.py").write_text(
        RECORD
        + f"""
import time
def test_sleeps(mindhand_cluster, hand, faultproxy):
    record(mindhand_cluster, hand, faultproxy, {str(record)!r})
    time.sleep(120)
"""
    )
    tmp = tmp_path / "tmp"  # the run's own temporary directory: other tests' clusters are not in it
    tmp.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a Ctrl-C reaches it as a user's would
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(record.exists, 60, "the user's test to start its cluster")
        os.kill(p.pid, signal.SIGINT)  # Ctrl-C
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    assert p.returncode == 2, out.decode(errors="replace")  # pytest's "interrupted"
    assert b"KeyboardInterrupt" in out
    nothing_left(record)
    assert not list(tmp.glob(TMP_PREFIX + "*"))


def test_startup_of_a_mind_and_one_hand(tmp_path: Path) -> None:
    """Measured, not asserted (no timed assertions): printed for the report. `Cluster.start`
    (what the fixtures use) starts the programs together; one after the other for comparison."""
    figures: dict[str, list[float]] = {"together": [], "one after the other": []}
    for i in range(3):
        for how, times in figures.items():
            cl = Cluster(tmp_path / f"{how[:3]}{i}")
            cl.tmp.mkdir()
            t0 = time.monotonic()
            try:
                if how == "together":
                    cl.start("box")
                else:
                    cl.start_mind()
                    cl.start_hand("box", proxy=True)
                    cl.wait_connected("box")
                times.append(time.monotonic() - t0)
                r = cl.cli("exec", "--hand", "box", "--", "true")
                assert r.returncode == 0, (how, r.returncode, r.stderr, cl.mind and cl.mind.output()[-3000:])
            finally:
                cl.stop_all()
    for how, times in figures.items():
        print(f"\nMind + 1 Hand behind its proxy, connected, {how}: {', '.join(f'{t:.2f}' for t in times)} s")
