"""Fleet runs (issue 16, DESIGN §12) with real processes: a Mind, five Hands (one never started,
one behind the fault proxy), the `mind` CLI and the Python client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time

import pytest

from mind.testing.cluster import BIN, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind, real Hands, the `mind` CLI

ONLINE = ("web1", "web2", "db1")


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    from mind.testing.faultproxy import FaultProxy

    with running(tmp_path_factory.mktemp("fleet"), hand=None) as cl:
        for name in ONLINE:
            cl.start_hand(name)
        cl.add_hand("off1")  # registered, never connected
        proxy = FaultProxy.start(cl.port)
        cl.proxy = proxy
        try:
            cl.start_hand("bh1", url=proxy.url)
            for name in (*ONLINE, "bh1"):
                cl.wait_connected(name)
            for name, labels in (
                ("web1", ["role=web", "dc=eu1"]),
                ("web2", ["role=web", "dc=us1"]),
                ("db1", ["role=db"]),
            ):
                r = cl.cli("hand", "label", name, *labels)
                assert r.returncode == 0, r.stderr
            yield cl
        finally:
            proxy.stop()


def selected(c, selector: str, *extra: str) -> list[str]:
    r = c.cli("exec", "--hands", selector, "--dry-run", "--json", *extra, timeout=30)
    assert r.returncode == 0, r.stderr
    return [h["name"] for h in json.loads(r.stdout)["hands"]]


def fleet_json(c, *args: str, timeout: float = 60) -> tuple[int, dict]:
    r = c.cli("exec", "--json", *args, timeout=timeout)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


# --- selecting ---


def test_selection_by_glob_list_and_label(c):
    assert selected(c, "web*") == ["web1", "web2"]
    assert selected(c, "db1,web2") == ["db1", "web2"]
    assert selected(c, "*") == ["bh1", "db1", "off1", "web1", "web2"]
    assert selected(c, "role=web") == ["web1", "web2"]
    assert selected(c, "role=web+dc=eu1") == ["web1"]
    assert selected(c, "role=web+dc=eu1,db1") == ["db1", "web1"]


def test_dry_run_prints_the_selection_and_runs_nothing(c, tmp_path):
    marker = tmp_path / "ran"
    r = c.cli("exec", "--hands", "web*", "--dry-run", "--", "touch", str(marker), timeout=30)
    assert r.returncode == 0, r.stderr
    assert re.search(rb"^web1\s+yes", r.stdout, re.M) and re.search(rb"^web2\s+yes", r.stdout, re.M)
    assert b"nothing was run" in r.stderr
    assert not marker.exists()


def test_labels_show_in_hands_and_filter_it(c):
    hands = {h["name"]: h for h in c.hands_json()}
    assert hands["web1"]["labels"] == {"dc": "eu1", "role": "web"} and hands["off1"]["labels"] == {}
    r = c.cli("hands", "--label", "role=web", "--json", timeout=30)
    assert [h["name"] for h in json.loads(r.stdout)] == ["web1", "web2"]


def test_a_label_change_applies_to_the_running_mind_and_can_be_removed(c):
    assert c.cli("hand", "label", "db1", "tier=x").returncode == 0
    assert selected(c, "tier=x") == ["db1"]
    assert c.cli("hand", "label", "db1", "tier-").returncode == 0
    r = c.cli("exec", "--hands", "tier=x", "--", "true", timeout=30)
    assert r.returncode == 2 and b"tier=x" in r.stderr


def test_empty_selection_is_exit_2_naming_the_selector(c):
    r = c.cli("exec", "--hands", "nothing*", "--", "true", timeout=30)
    assert r.returncode == 2 and b"nothing*" in r.stderr
    r = c.cli("exec", "--hands", "a,,b", "--", "true", timeout=30)
    assert r.returncode == 2 and b"--hands" in r.stderr


def test_only_hands_in_the_clients_scope_match(c):
    cred = c.tmp / "webonly.cred"
    r = c.cli("client", "add", "webonly", "--hands", "web*", "--out", str(cred))
    assert r.returncode == 0, r.stderr
    assert selected(c, "*", "--credential", str(cred)) == ["web1", "web2"]
    assert selected(c, "role=*", "--credential", str(cred)) == ["web1", "web2"]
    r = c.cli("exec", "--hands", "db1", "--credential", str(cred), "--", "true", timeout=30)
    assert r.returncode == 2 and b"db1" in r.stderr


def test_the_hands_own_claims_are_never_a_selector(c):
    host = c.hand_info("web1")["claims"]["hostname"]
    r = c.cli("exec", "--hands", f"hostname={host}", "--dry-run", timeout=30)
    assert r.returncode == 2


# --- output ---


def test_prefixed_output_per_hand_stdout_and_stderr_apart(c):
    script = 'printf "one\\ntwo\\n"; printf "err\\n" >&2; printf "partial"'
    r = c.cli("exec", "--hands", "web1,web2,db1", "--", "sh", "-c", script, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines(keepends=True)
    for h in ("web1", "web2", "db1"):
        p = f"{h.ljust(4)} | "
        assert [x for x in lines if x.startswith(p)] == [p + "one\n", p + "two\n", p + "partial\n"]
        assert f"{p}err\n" in r.stderr.decode()
        assert f"{p}err" not in r.stdout.decode()
    assert len(lines) == 9
    assert "3 hands: 3 succeeded" in r.stderr.decode()


def test_group_prints_each_hands_lines_together(c):
    script = 'for i in 1 2 3; do echo "$i"; sleep 0.05; done'
    r = c.cli("exec", "--hands", "web1,web2", "--group", "--", "sh", "-c", script, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert sorted(lines[:3]) == lines[:3] and len({x[:4] for x in lines[:3]}) == 1
    assert len({x[:4] for x in lines[3:]}) == 1 and len(lines) == 6


def test_json_has_per_hand_results_and_the_aggregate(c):
    code, out = fleet_json(c, "--hands", "web1,web2,off1", "--", "sh", "-c", "echo hi; echo oops >&2")
    assert code == 118  # every run succeeded, one Hand was not reached
    assert out["hands"]["web1"]["state"] == "succeeded" and out["hands"]["web1"]["exit_code"] == 0
    assert out["hands"]["web1"]["bytes"] == {"stdout": 3, "stderr": 5}
    assert out["hands"]["web2"]["tails"] == {"stdout": "hi\n", "stderr": "oops\n"}
    assert out["hands"]["off1"]["state"] == "hand_offline"
    assert out["aggregate"]["counts"] == {"succeeded": 2, "hand_offline": 1}
    assert out["aggregate"]["exit_code"] == 118


def test_events_are_ndjson_with_a_hand_field(c):
    r = c.cli("exec", "--hands", "web*", "--events", "--", "echo", "x", timeout=60)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["event"] == "selected" and events[-1]["event"] == "aggregate"
    ends = {e["hand"]: e for e in events if e["event"] == "end"}
    assert set(ends) == {"web1", "web2"} and all(e["state"] == "succeeded" for e in ends.values())
    outs = [e for e in events if e["event"] == "output"]
    assert sorted(e["hand"] for e in outs) == ["web1", "web2"] and all(e["data"] == "x\n" for e in outs)


# --- rate control ---


def test_failures_give_a_summary_and_the_aggregate_code(c):
    script = 'case "$PWD" in *web2) exit 3;; esac'
    r = c.cli("exec", "--hands", "web*,db1", "--max-errors", "5", "--", "sh", "-c", script, timeout=60)
    assert r.returncode == 120, r.stderr
    err = r.stderr.decode()
    assert "3 hands: 2 succeeded, 1 failed" in err
    assert re.search(r"mind:\s+web2\s+failed \(exit 3\)", err)


@pytest.mark.parametrize("budget", [0, 1])
def test_error_budget_is_exact_with_concurrency_one(c, budget):
    code, out = fleet_json(
        c, "--hands", "web1,web2,db1", "--max-concurrency", "1", "--max-errors", str(budget), "--", "false"
    )
    assert code == 119
    counts = out["aggregate"]["counts"]
    assert counts == {"failed": budget + 1, "not_started": 2 - budget}
    assert out["aggregate"]["budget_spent"]


def test_concurrency_is_never_exceeded_as_observed_on_the_hands(c, tmp_path):
    log = tmp_path / "overlap.log"
    script = f'echo "+ $(date +%s%N)" >> {log}; sleep 0.3; echo "- $(date +%s%N)" >> {log}'
    r = c.cli("exec", "--hands", "web1,web2,db1,bh1", "--max-concurrency", "2", "--", "sh", "-c", script, timeout=60)
    assert r.returncode == 0, r.stderr
    marks = sorted((int(t), kind) for kind, t in (line.split() for line in log.read_text().splitlines()))
    assert len(marks) == 8
    now = peak = 0
    for _, kind in sorted(marks, key=lambda m: (m[0], m[1] == "+")):  # an end before a start at the same ns
        now += 1 if kind == "+" else -1
        peak = max(peak, now)
    assert peak == 2


def test_one_offline_hand_ends_hand_offline_at_once_while_the_others_succeed(c):
    code, out = fleet_json(c, "--hands", "web1,off1,web2", "--", "true")
    assert code == 118
    assert {h: v["state"] for h, v in out["hands"].items()} == {
        "web1": "succeeded",
        "off1": "hand_offline",
        "web2": "succeeded",
    }
    assert out["aggregate"]["errors"] == 0  # not reached is not an error: the budget of 0 holds


def test_deliver_within_past_the_window_is_undeliverable(c):
    code, out = fleet_json(c, "--hands", "web1,off1", "--deliver-within", "1s", "--", "true")
    assert code == 118 and out["hands"]["off1"]["state"] == "undeliverable"
    assert out["hands"]["web1"]["state"] == "succeeded"


def test_deliver_within_lets_a_late_hand_join(c):
    c.add_hand("late1")
    p = c.cli_popen("exec", "--hands", "web1,late1", "--deliver-within", "60s", "--json", "--", "echo", "joined")
    try:
        time.sleep(1.0)
        assert p.poll() is None  # waiting for late1
        c.start_hand("late1")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, err
    res = json.loads(out)
    assert res["hands"]["late1"]["state"] == "succeeded" and res["hands"]["late1"]["tails"]["stdout"] == "joined\n"


# --- control ---


def _running_on(c, hands: set[str]) -> bool:
    r = c.cli("runs", "--state", "running", "--json", timeout=30)
    return r.returncode == 0 and hands <= {x["hand"] for x in json.loads(r.stdout)}


def test_ctrl_c_cancels_every_run_in_flight_and_starts_no_more(c):
    # The Mind's order is by name: db1 and web1 start, web2 waits for a slot.
    p = c.cli_popen("exec", "--hands", "web1,web2,db1", "--max-concurrency", "2", "--", "sleep", "30")
    try:
        wait_until(lambda: _running_on(c, {"db1", "web1"}), 20, "both runs running")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = err.decode()
    assert p.returncode == 130, text
    assert "db1: cancel requested" in text and "web1: cancel requested" in text
    assert re.search(r"mind:\s+web1\s+cancelled", text) and re.search(r"mind:\s+db1\s+cancelled", text)
    assert re.search(r"mind:\s+web2\s+not_started", text)
    assert "error budget" not in text  # cancelled by us is not a budget spent
    assert not _running_on(c, {"db1"}) and not _running_on(c, {"web1"})


def test_a_second_ctrl_c_detaches(c):
    # The command ignores SIGTERM: the cancel waits out --grace, so the second Ctrl-C comes first.
    script = 'trap "" TERM; sleep 30'
    p = c.cli_popen("exec", "--hands", "web1", "--grace", "20", "--", "sh", "-c", script)
    try:
        wait_until(lambda: _running_on(c, {"web1"}), 20, "the run running")
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130 and b"web1: cancel requested" in err and b"detached" in err, err
    wait_until(lambda: not _running_on(c, {"web1"}), 40, "the run to end after the detach")


def test_fail_fast_cancels_the_runs_in_flight(c):
    # db1 and web1 start (the Mind's order); db1 fails at once, web1 is cancelled, web2 never starts.
    script = 'case "$PWD" in *db1) exit 1;; *) sleep 30;; esac'
    code, out = fleet_json(c, "--hands", "web*,db1", "--max-concurrency", "2", "--fail-fast", "--", "sh", "-c", script)
    states = {h: v["state"] for h, v in out["hands"].items()}
    assert states == {"db1": "failed", "web1": "cancelled", "web2": "not_started"}
    assert code == 119 and out["aggregate"]["budget_spent"]


def test_runs_fleet_and_run_get_show_the_members(c):
    code, out = fleet_json(c, "--hands", "web*", "--", "true")
    assert code == 0
    fid = out["fleet"]
    r = c.cli("runs", "--fleet", fid, "--json", timeout=30)
    runs = json.loads(r.stdout)
    assert sorted(x["hand"] for x in runs) == ["web1", "web2"] and all(x["fleet"] == fid for x in runs)
    assert {x["run_id"] for x in runs} == {out["hands"][h]["run_id"] for h in ("web1", "web2")}
    r = c.cli("run", "get", fid, timeout=30)
    assert r.returncode == 0 and b"members  2: 2 succeeded" in r.stdout


def test_task_start_on_many_hands(c):
    r = c.cli("task", "start", "--hands", "web*", "--json", "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr
    hands = json.loads(r.stdout)["hands"]
    assert set(hands) == {"web1", "web2"} and all(h["outcome"] == "accepted" for h in hands.values())


def test_exec_many_from_python(c):
    from mind.client.aio import MindClient, load_credential

    async def go():
        cred = load_credential(c.home / "admin.cred")
        async with await MindClient.connect(c.url, cred) as mc:
            fleet = mc.exec_many("role=web,off1", "exec", {"argv": ["echo", "py"]}, max_concurrency="50%")
            kinds = []
            out = {}
            async for ev in fleet:
                kinds.append(ev.kind)
                if ev.kind == "output":
                    out[ev.hand] = out.get(ev.hand, b"") + ev.msg.data
            return fleet, kinds, out

    fleet, kinds, out = asyncio.run(go())
    assert kinds[0] == "selected" and kinds[-1] == "aggregate"
    assert out == {"web1": b"py\n", "web2": b"py\n"}
    assert fleet.aggregate.counts == {"succeeded": 2, "hand_offline": 1}
    assert fleet.results["web1"].exit_code == 0 and fleet.results["off1"].state == "hand_offline"


def test_the_mind_going_away_mid_fleet_is_lost_not_cancelled(tmp_path):
    with running(tmp_path, hand="solo") as cl:
        cl.add_hand("later")
        p = cl.cli_popen("exec", "--hands", "solo,later", "--deliver-within", "60s", "--", "sleep", "30")
        try:
            wait_until(lambda: _running_on(cl, {"solo"}), 20, "the run running")
            cl.mind.kill9()
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    text = err.decode()
    assert p.returncode == 255, text
    assert re.search(r"mind:\s+solo\s+lost", text) and re.search(r"mind:\s+later\s+not_started", text)
    assert "Traceback" not in text


# --- truth: a frozen or blackholed Hand never holds back the others (last: they disturb the fixture) ---


def _events_popen(c, selector: str) -> subprocess.Popen:
    p = subprocess.Popen(
        [str(BIN / "mind"), "exec", "--hands", selector, "--events", "--", "echo", "ok"],
        env=c.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return p


def _read_events(p, until, timeout: float) -> list[dict]:
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    assert p.stdout is not None
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        events.append(json.loads(line))
        if until(events):
            return events
    raise AssertionError(f"condition not met; events so far: {events}")


@pytest.mark.parametrize("fault", ["frozen", "blackholed"])
def test_a_frozen_or_blackholed_hand_never_holds_back_the_others(c, fault):
    slow = "db1" if fault == "frozen" else "bh1"
    before = c.hand_info(slow)["generation"]
    if fault == "frozen":
        c.hands["db1"].signal(signal.SIGSTOP)
    else:
        c.proxy.send("blackhole")
    p = _events_popen(c, f"web1,web2,{slow}")
    try:
        others_done = lambda evs: {e.get("hand") for e in evs if e["event"] == "end"} >= {"web1", "web2"}
        events = _read_events(p, others_done, 30)
        ends = {e["hand"]: e["state"] for e in events if e["event"] == "end"}
        assert ends["web1"] == "succeeded" and ends["web2"] == "succeeded"
        assert slow not in ends  # still pending while the others are reported
        rest = _read_events(p, lambda evs: evs[-1]["event"] == "aggregate", 30)
        final = {e["hand"]: e["state"] for e in rest if e["event"] == "end"}
        assert final[slow] == "lost"  # its connection was declared dead: the outcome is unknown
        assert p.wait(timeout=10) == 120
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if fault == "frozen":
            c.hands["db1"].signal(signal.SIGCONT)
        else:
            c.proxy.send("resume")
    c.wait_connected(slow, min_gen=before + 1, timeout=30)
