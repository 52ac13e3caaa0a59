"""`/healthz` and `/metrics` on the Mind's own port, scraped over plain HTTP during real runs."""

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mind.testing.cluster import running

pytestmark = pytest.mark.slow  # a real Mind and Hand (mind.testing.cluster)


def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


def test_healthz_and_metrics_over_http_during_runs(tmp_path):
    with running(tmp_path) as cl:
        base = cl.url.replace("ws://", "http://")
        status, ctype, body = get(base + "/healthz")
        h = json.loads(body)
        assert status == 200 and ctype == "application/json"
        assert h["status"] == "ok" and h["hands_connected"] == 1 and h["uptime_s"] > 0 and h["version"]
        for args in (["--", "true"], ["--", "sh", "-c", "exit 2"], ["--timeout", "1", "--", "sleep", "5"]):
            cl.cli("exec", "--hand", "box", *args)
        cl.cli("hands", "--credential", str(tmp_path / "box.cred"))  # a hand credential as a client: refused
        status, ctype, body = get(base + "/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        samples = {}
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        assert samples[("mindhand_hands_connected", ())] == 1
        assert samples[("mindhand_runs_total", (("state", "succeeded"),))] >= 1
        assert samples[("mindhand_runs_total", (("state", "failed"),))] >= 1
        assert samples[("mindhand_runs_total", (("state", "timed_out"),))] >= 1
        assert samples[("mindhand_run_duration_seconds_count", ())] >= 3
        assert samples[("mindhand_handshakes_total", (("result", "ok"),))] >= 4
        assert ("mindhand_event_loop_lag_seconds", ()) in samples
        assert ("mindhand_task_snapshots_stale", ()) in samples
        assert ("mindhand_reconcile_duration_seconds_count", ()) in samples


def test_run_retention_is_configurable_and_bounds_history(tmp_path):
    with running(tmp_path, mind_args=("--retain-runs", "3")) as cl:
        ids = []
        for i in range(6):
            r = cl.cli("exec", "--hand", "box", "--json", "--", "echo", str(i))
            ids.append(json.loads(r.stdout)["run_id"])
        kept = [r["run_id"] for r in json.loads(cl.cli("runs", "--json").stdout)]
        assert kept == list(reversed(ids[-3:]))  # the newest three, newest first
        assert cl.cli("run", "get", ids[0]).returncode == 125  # pruned: no longer known
        assert cl.cli("run", "get", ids[-1]).returncode == 0
