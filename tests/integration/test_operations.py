"""Operating mindhand with real processes: the Hand's local /healthz and /metrics, what SIGTERM
does to work in flight (the end states README "Running it for real" documents), and the shape of
every `--json` listing.

Every wait is bounded and polls a condition; every process is cleaned up by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mind.testing.cluster import BIN, pid_alive, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind and Hand, signalled and scraped

METRICS = ("--metrics-listen", "127.0.0.1:0")
SIGTERM_EXIT = 128 + signal.SIGTERM


# --- helpers ------------------------------------------------------------------------------------


def metrics_addr(cl, hand: str = "box") -> tuple[str, int]:
    """Where the Hand bound `--metrics-listen 127.0.0.1:0` (it writes `metrics.addr`)."""
    path = cl.tmp / f"state-{hand}" / "metrics.addr"
    text = wait_until(lambda: path.exists() and path.read_text().strip(), 20, f"{path} to be written")
    host, _, port = text.rpartition(":")
    return host, int(port)


def http(addr: tuple[str, int], raw: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the answer until the server closes (it always does); bounded."""
    with socket.create_connection(addr, timeout=timeout) as s:
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before it read everything (an oversized head)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), data[:200]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def get(addr: tuple[str, int], path: str) -> tuple[int, dict[str, str], bytes]:
    return http(addr, f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())


def healthz(addr: tuple[str, int]) -> dict:
    status, headers, body = get(addr, "/healthz")
    assert status == 200 and headers["content-type"] == "application/json"
    return json.loads(body)


def scrape(addr: tuple[str, int]) -> dict[tuple[str, tuple], float]:
    status, headers, body = get(addr, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def read_pid(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), 20, f"{path.name} to be written"))


@contextmanager
def client(cl, *args: str):
    """A `mind` CLI child, killed (by PID, its own session) if the test did not see it end."""
    p = cl.cli_popen(*args)
    try:
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def start_tree(tag: str) -> list[str]:
    """A command whose tree is a `sleep` that IS the run's process (exec) plus a background child:
    both pids are written to the root, so the test can check the whole tree by PID."""
    return ["--", "sh", "-c", f"sleep 300 & echo $! > {tag}.child; echo $$ > {tag}.pid; exec sleep 300"]


def tree_pids(cl, tag: str, hand: str = "box") -> list[int]:
    root = cl.tmp / f"root-{hand}"
    return [read_pid(root / f"{tag}.pid"), read_pid(root / f"{tag}.child")]


def gone(pids: list[int]) -> bool:
    return not any(pid_alive(p) for p in pids)


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def hand_exit(cl, hand: str = "box", timeout: float = 30.0) -> int:
    return cl.hands[hand].p.wait(timeout=timeout)


# --- 1. the Hand's /healthz and /metrics --------------------------------------------------------


def test_hand_healthz_and_metrics_over_http_during_a_run(tmp_path):
    with running(tmp_path, "box", *METRICS) as cl:
        addr = metrics_addr(cl)
        h = healthz(addr)
        assert h["status"] == "ok" and h["connected"] is True and h["hand"] == "box"
        assert h["generation"] == cl.hand_info("box")["generation"] and h["mind"] == cl.url
        assert h["runs_running"] == 0 and h["tasks"] == {"queued": 0, "running": 0, "uncommitted": 0}
        assert h["version"] and h["uptime_s"] >= 0
        before = scrape(addr)
        root = cl.tmp / "root-box"
        with client(cl, "exec", "--hand", "box", "--json", "--", "sh", "-c", "echo $$ > m.pid; exec sleep 300") as p:
            pid = read_pid(root / "m.pid")
            wait_until(lambda: healthz(addr)["runs_running"] == 1, 20, "/healthz to show the run")
            m = scrape(addr)
            assert m[("mindhand_hand_connected", ())] == 1
            assert m[("mindhand_hand_runs_active", ())] == 1
            assert m[("mindhand_hand_runs_started_total", ())] == before[("mindhand_hand_runs_started_total", ())] + 1
            assert m[("mindhand_hand_connects_total", ())] >= 1
            assert m[("mindhand_hand_reconnect_backoff_seconds", ())] == 0
            assert m[("mindhand_hand_tasks", (("state", "running"),))] == 0
            assert m[("mindhand_hand_build_info", (("version", h["version"]),))] == 1
            for name in (
                "mindhand_hand_event_loop_lag_seconds",
                "mindhand_hand_event_loop_lag_max_seconds",
                "mindhand_hand_uptime_seconds",
                "mindhand_hand_disconnects_total",
                "mindhand_hand_connect_failures_total",
                "mindhand_hand_progress_dropped_frames_total",
                "mindhand_hand_progress_dropped_bytes_total",
            ):
                assert (name, ()) in m, name
            os.kill(pid, signal.SIGTERM)  # the command dies by a signal that is not mindhand's: `failed`
            out, err = p.communicate(timeout=30)
        assert p.returncode == SIGTERM_EXIT, err
        assert json.loads(out)["state"] == "failed"
        wait_until(lambda: healthz(addr)["runs_running"] == 0, 20, "/healthz to show the run ended")
        m = scrape(addr)
        failed = ("mindhand_hand_runs_finished_total", (("state", "failed"),))
        assert m[failed] == before.get(failed, 0) + 1
        assert m[("mindhand_hand_runs_active", ())] == 0
        count = ("mindhand_hand_run_duration_seconds_count", ())
        assert m[count] == before[count] + 1
        # a background task shows in the task gauges and counters too
        assert cl.cli("task", "start", "--hand", "box", "--id", "quick", "--", "true").returncode == 0
        wait_until(lambda: cl.hand_tasks("box")["quick"]["state"] == "succeeded", 20, "the task to succeed")
        m = scrape(addr)
        assert m[("mindhand_hand_task_starts_total", (("result", "accepted"),))] == 1
        assert m[("mindhand_hand_tasks_finished_total", (("state", "succeeded"),))] == 1


def test_bad_requests_get_4xx_and_close_and_the_hand_stays_healthy(tmp_path):
    with running(tmp_path, "box", *METRICS) as cl:
        addr = metrics_addr(cl)
        silent = socket.create_connection(addr, timeout=10)  # says nothing: must not hold up anyone else
        partial = socket.create_connection(addr, timeout=10)
        partial.sendall(b"GET /metr")  # half a request line, then nothing more
        try:
            cases = [
                (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400),  # a TLS hello
                (b"GARBAGE\r\n\r\n", 400),
                (b"GET /healthz HTTP/2.0\r\n\r\n", 400),
                (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
                (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 400),  # oversized head
                (b"GET " + b"/" * 20000 + b" HTTP/1.1\r\n\r\n", 400),  # oversized request line
                (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
                (b"DELETE /healthz HTTP/1.1\r\n\r\n", 405),
                (b"GET /nope HTTP/1.1\r\n\r\n", 404),
                (b"GET /healthz/../metrics HTTP/1.1\r\n\r\n", 404),
            ]
            for raw, want in cases:
                status, headers, _ = http(addr, raw)
                assert status == want, (raw[:40], status)
                assert headers["connection"] == "close"
                if want == 405:
                    assert headers["allow"] == "GET"
            assert healthz(addr)["connected"] is True  # answered while two connections say nothing
        finally:
            silent.close()
            partial.close()
        # a query string is not part of the path; HTTP/1.0 is fine
        assert http(addr, b"GET /healthz?verbose=1 HTTP/1.0\r\n\r\n")[0] == 200
        assert cl.hands["box"].alive()
        assert healthz(addr)["status"] == "ok"
        r = cl.cli("exec", "--hand", "box", "--", "echo", "still fine")
        assert r.returncode == 0 and r.stdout == b"still fine\n"
        assert scrape(addr)[("mindhand_hand_runs_finished_total", (("state", "succeeded"),))] == 1


def test_metrics_listen_warns_off_loopback_refuses_a_busy_port_and_cleans_up(tmp_path):
    with running(tmp_path, "box", *METRICS) as cl:
        addr = metrics_addr(cl)
        # a port already taken is a local configuration error: exit 2 before any dial, and say why
        busy = cl.start_hand("busy", "--metrics-listen", f"127.0.0.1:{addr[1]}")
        assert busy.p.wait(timeout=30) == 2
        assert "cannot serve --metrics-listen" in busy.output()
        # a syntax error is caught with the other settings
        bad = subprocess.run(
            [
                str(BIN / "hand"),
                "run",
                "--mind",
                cl.url,
                "--credential",
                str(tmp_path / "box.cred"),
                "--root",
                str(tmp_path),
                "--state-dir",
                str(tmp_path / "state-bad"),
                "--metrics-listen",
                "::1:9",
            ],
            env=cl.env,
            capture_output=True,
            timeout=30,
        )
        assert bad.returncode == 2 and b"--metrics-listen" in bad.stderr and b"brackets" in bad.stderr
        # any address that is not loopback: served, with a warning on stderr (it is unauthenticated)
        wide = cl.start_hand("wide", "--metrics-listen", "0.0.0.0:0")
        cl.wait_connected("wide")
        wide_addr = metrics_addr(cl, "wide")
        assert wide_addr[0] == "0.0.0.0"
        assert "is not a loopback address" in wide.output()
        assert healthz(("127.0.0.1", wide_addr[1]))["hand"] == "wide"
        # a clean stop removes the address file
        wide.signal(signal.SIGTERM)
        assert wide.p.wait(timeout=30) == 0
        assert not (tmp_path / "state-wide" / "metrics.addr").exists()


# --- 2. SIGTERM with work in flight -------------------------------------------------------------


def test_sigterm_mind_during_a_foreground_run_gives_lost_and_kills_the_tree(tmp_path):
    """docs/operations.md: "SIGTERM stops cleanly: without a resume window the Mind ends unfinished
    foreground runs `lost` (it will not be there to hear their results) and tells their clients (with
    one, above, it ends nothing)" -> the client exits 255. This cluster's Mind has no window (the
    toolkit's default); with one, tests/integration/test_continuity_restart.py holds the other half."""
    pids: list[int] = []
    with running(tmp_path, "box", *METRICS) as cl:
        addr = metrics_addr(cl)
        try:
            with client(cl, "exec", "--hand", "box", "--json", *start_tree("a")) as p:
                pids = tree_pids(cl, "a")
                assert not gone(pids)
                cl.mind.signal(signal.SIGTERM)
                out, err = p.communicate(timeout=30)
            assert p.returncode == 255, err
            end = json.loads(out)
            assert end["state"] == "lost" and end["reason"] == "mind shut down before a result"
            assert cl.mind.p.wait(timeout=30) == 0
            wait_until(lambda: gone(pids), 20, "the Hand to kill the run's whole tree")
            assert cl.hands["box"].alive()  # the Hand stays up, reconnecting; alive and says so
            h = wait_until(lambda: (x := healthz(addr))["connected"] is False and x, 20, "the Hand to notice")
            assert h["status"] == "disconnected" and h["runs_running"] == 0 and h["generation"] is None
            m = scrape(addr)
            assert m[("mindhand_hand_connected", ())] == 0
            assert m[("mindhand_hand_disconnects_total", ())] >= 1
            assert m[("mindhand_hand_runs_finished_total", (("state", "cancelled"),))] == 1
        finally:
            kill_leftovers(pids)


def test_sigterm_hand_during_a_foreground_run_reports_cancelled_shutdown(tmp_path):
    """README: "the Hand kills its runs and tasks as trees and reports them `cancelled` (reason
    `shutdown`)" -> the client exits 130 (cancelled), and the Hand exits 0."""
    pids: list[int] = []
    with running(tmp_path) as cl:
        try:
            with client(cl, "exec", "--hand", "box", "--json", *start_tree("b")) as p:
                pids = tree_pids(cl, "b")
                cl.hands["box"].signal(signal.SIGTERM)
                out, err = p.communicate(timeout=30)
            assert p.returncode == 130, err
            end = json.loads(out)
            assert end["state"] == "cancelled" and end["reason"] == "shutdown"
            assert end["signal"] == signal.SIGTERM and end["stage"] == "term"
            assert hand_exit(cl) == 0
            assert gone(pids)
            run = json.loads(cl.cli("run", "get", end["run_id"], "--json").stdout)
            assert run["state"] == "cancelled" and run["end"]["reason"] == "shutdown"
        finally:
            kill_leftovers(pids)


def test_sigterm_hand_with_a_background_task_ends_it_cancelled_shutdown(tmp_path):
    """README: "The Hand is stopped cleanly (SIGTERM): unfinished tasks are killed and end `cancelled`
    with reason `shutdown`. Not `lost`"."""
    pids: list[int] = []
    with running(tmp_path) as cl:
        try:
            r = cl.cli("task", "start", "--hand", "box", "--id", "bg", *start_tree("c"))
            assert r.returncode == 0, r.stderr
            pids = tree_pids(cl, "c")
            wait_until(lambda: cl.hand_tasks("box")["bg"]["state"] == "running", 20, "the task to run")
            cl.hands["box"].signal(signal.SIGTERM)
            assert hand_exit(cl) == 0
            assert gone(pids)
            row = cl.hand_tasks("box")["bg"]
            assert row["state"] == "cancelled" and row["reason"] == "shutdown"
            assert row["signal"] == signal.SIGTERM and row["stage"] == "term" and row["finished_at"]
            view = cl.task("bg")  # the update went out before the connection closed
            assert view["state"] == "cancelled" and view["reason"] == "shutdown" and view["stale"] is False
        finally:
            kill_leftovers(pids)


# --- 3. every --json listing --------------------------------------------------------------------


def cli_json(cl, *args: str):
    r = cl.cli(*args, "--json", timeout=30)
    assert r.returncode == 0, (args, r.stderr)
    return json.loads(r.stdout)


def test_every_json_listing_parses_with_the_expected_shape_and_order(tmp_path):
    with running(tmp_path) as cl:
        cl.add_hand("alpha")  # known, never connected: listed (by name) before box
        assert cl.cli("client", "add", "ci", "--hands", "box", "--tools", "exec").returncode == 0
        for tid in ("t1", "t2"):  # a task's start is a run too (it succeeds once the row is committed)
            assert cl.cli("task", "start", "--hand", "box", "--id", tid, "--", "true").returncode == 0
            wait_until(lambda tid=tid: cl.task(tid)["state"] == "succeeded", 20, f"task {tid} to succeed")
        run_ids = ["t1", "t2"]
        for argv in (["--", "true"], ["--", "sh", "-c", "exit 3"], ["--", "echo", "hi"]):
            r = cl.cli("exec", "--hand", "box", "--json", *argv)
            run_ids.append(json.loads(r.stdout)["run_id"])

        hands = cli_json(cl, "hands")
        assert [h["name"] for h in hands] == ["alpha", "box"]
        box = hands[1]
        assert box["connected"] is True and box["generation"] >= 1 and box["running"] == 0
        assert set(box["claims"]) >= {"hostname", "platform", "machine", "python", "version"}
        assert hands[0]["connected"] is False and hands[0]["claims"] is None

        runs = cli_json(cl, "runs")
        assert [r["run_id"] for r in runs] == list(reversed(run_ids))  # newest first
        assert [r["state"] for r in runs] == ["succeeded", "failed", "succeeded", "succeeded", "succeeded"]
        assert all(r["hand"] == "box" and r["tool"] == "exec" and r["args_digest"] for r in runs)
        assert [r["created_at"] for r in runs] == sorted((r["created_at"] for r in runs), reverse=True)
        assert runs[1]["end"]["exit_code"] == 3

        tasks = cli_json(cl, "task", "list")
        assert [t["task_id"] for t in tasks] == ["t2", "t1"]  # newest first
        for t in tasks:
            assert t["hand"] == "box" and t["state"] == "succeeded" and t["stale"] is False
            assert set(t) >= {
                "task_id",
                "hand",
                "state",
                "stale",
                "last_synced_at",
                "created_at",
                "finished_at",
                "exit_code",
                "log_bytes",
                "reason",
                "args_digest",
            }

        status = cli_json(cl, "status")
        assert set(status) >= {
            "version",
            "mind_id",
            "uptime_s",
            "hands",
            "active_runs",
            "recent_failures",
            "task_counts",
            "stale_snapshots",
            "retained_runs",
        }
        assert [h["name"] for h in status["hands"]] == ["alpha", "box"]
        assert status["active_runs"] == [] and status["task_counts"] == {"succeeded": 2}
        assert [r["run_id"] for r in status["recent_failures"]] == [run_ids[3]]
        assert status["retained_runs"] == 5 and status["stale_snapshots"] == 0

        creds = cli_json(cl, "hand", "list")
        assert [c["label"] for c in creds] == ["alpha", "box"]
        assert all(c["role"] == "hand" and c["revoked_at"] is None and c["scope"] == "-" for c in creds)
        clients = cli_json(cl, "client", "list")
        assert [c["label"] for c in clients] == ["admin", "ci"]
        assert all(c["role"] == "client" and isinstance(c["scope"], str) for c in clients)
        assert "box" in clients[1]["scope"] and "exec" in clients[1]["scope"]

        r = subprocess.run(
            [str(BIN / "hand"), "tasks", "--state-dir", str(tmp_path / "state-box"), "--json"],
            env=cl.env,
            capture_output=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        assert [t["task_id"] for t in rows] == ["t1", "t2"]  # oldest first
        assert all(t["state"] == "succeeded" and t["exit_code"] == 0 and t["version"] >= 3 for t in rows)

        run = cli_json(cl, "run", "get", run_ids[3])
        assert run["run_id"] == run_ids[3] and run["state"] == "failed" and run["hand"] == "box"
        assert run["gen"] == box["generation"] and run["ended_at"] >= run["created_at"]
        assert run["end"]["exit_code"] == 3 and run["end"]["state"] == "failed"

        task = cli_json(cl, "task", "get", "t1")
        assert task["task_id"] == "t1" and task["state"] == "succeeded" and task["exit_code"] == 0
        assert task["stale"] is False and task["tool"] == "exec" and task["started_at"] <= task["finished_at"]
