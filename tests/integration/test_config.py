"""Both daemons started from TOML files alone; `config show` from the operator's side; SIGHUP
reloads the Hand's tool policy and both daemons' log levels without dropping a connection."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from mind.testing.cluster import BIN, Cluster, Proc, wait_until

pytestmark = pytest.mark.slow  # the daemons started from TOML files, and their CLIs

SECRET_HEX = "cd" * 32


def start_mind_from_file(cl: Cluster, text: str) -> Proc:
    """`mind serve` with no flags at all: everything comes from HOME/mind.toml (the default path)."""
    cl.home.mkdir(parents=True, exist_ok=True)
    (cl.home / "mind.toml").write_text(text)
    p = Proc("mind", [str(BIN / "mind"), "serve"], cl.env, cl.tmp / "mind.log")
    cl.procs.append(p)
    cl.mind = p
    url_file = cl.home / "mind.url"
    wait_until(lambda: url_file.exists() or not p.alive(), 20, "the Mind to listen")
    assert p.alive(), p.output()
    cl.url = url_file.read_text().strip()
    cl.port = int(cl.url.rsplit(":", 1)[1])
    return p


def hand_toml(cl: Cluster, name: str, **extra: str) -> str:
    cred = cl.add_hand(name)
    root = cl.tmp / f"root-{name}"
    root.mkdir(exist_ok=True)
    (root / "hello.txt").write_text("hello\n")
    lines = [
        "# a Hand configured by file only",
        f'mind = "{cl.url}"',
        f'credential = "{cred}"',
        f'root = "{root}"',
        f'state_dir = "{cl.tmp / f"state-{name}"}"',
        "ping_interval = 1",
        "max_backoff = 1",
        'log_format = "json"',
        *(f"{k} = {v}" for k, v in extra.items()),
    ]
    return "\n".join(lines) + "\n"


def events(proc: Proc) -> list[dict]:
    out = []
    for line in proc.output().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def test_daemons_start_from_toml_and_config_show_names_sources(tmp_path):
    cl = Cluster(tmp_path)
    try:
        start_mind_from_file(cl, 'listen = "127.0.0.1:0"\nping_interval = 1\nlog_format = "json"\nretain_runs = 3\n')
        conf = tmp_path / "hand.toml"
        conf.write_text(hand_toml(cl, "filed", deny_tools='["shell"]'))
        hand = Proc("hand-filed", [str(BIN / "hand"), "run", "--config", str(conf)], cl.env, tmp_path / "hand.log")
        cl.procs.append(hand)
        cl.wait_connected("filed")

        r = cl.cli("exec", "--hand", "filed", "--", "cat", "hello.txt")
        assert (r.returncode, r.stdout) == (0, b"hello\n"), r.stderr
        r = cl.cli("exec", "--hand", "filed", "--shell", "echo hi")
        assert r.returncode == 125 and b"denied" in r.stderr  # deny_tools from the file
        for _ in range(4):
            cl.cli("exec", "--hand", "filed", "--", "true")
        runs = json.loads(cl.cli("runs", "--json", "--limit", "100").stdout)
        assert len(runs) == 3  # retain_runs = 3 from the file
        started = cl.cli("task", "start", "--hand", "filed", "--id", "filed-task", "--", "true")
        assert started.returncode == 0, started.stderr
        listed = subprocess.run(
            [str(BIN / "hand"), "tasks", "--config", str(conf), "--json"],
            env=cl.env,
            capture_output=True,
            text=True,
            timeout=30,
        )  # state_dir from the file
        assert listed.returncode == 0 and [t["task_id"] for t in json.loads(listed.stdout)] == ["filed-task"]

        shown = subprocess.run(
            [str(BIN / "hand"), "config", "show", "--config", str(conf), "--json", "--max-running-tasks", "9"],
            env={**cl.env, "MINDHAND_KILL_GRACE": "2"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert shown.returncode == 0, shown.stderr
        rows = {r["key"]: r for r in json.loads(shown.stdout)["settings"]}
        assert rows["deny_tools"]["value"] == ["shell"] and rows["deny_tools"]["source"] == f"{conf} line 9"
        assert (rows["max_running_tasks"]["value"], rows["max_running_tasks"]["source"]) == (9, "--max-running-tasks")
        assert (rows["kill_grace"]["value"], rows["kill_grace"]["source"]) == (2.0, "MINDHAND_KILL_GRACE")
        assert rows["task_log_max"]["source"] == "default"

        shown = subprocess.run(
            [str(BIN / "mind"), "config", "show"], env=cl.env, capture_output=True, text=True, timeout=30
        )
        assert shown.returncode == 0, shown.stderr
        assert f"# config file: {cl.home / 'mind.toml'}" in shown.stdout
        line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("retain_runs"))
        assert line.split()[1:] == ["3", str(cl.home / "mind.toml"), "line", "4"]
    finally:
        cl.stop_all()


def test_bad_files_stop_the_daemons_with_one_line_naming_key_file_and_line(tmp_path):
    cl = Cluster(tmp_path)
    conf = tmp_path / "hand.toml"
    conf.write_text('mind = "ws://127.0.0.1:9"\nroot = "/"\nmax_runing_tasks = 3\n')
    r = subprocess.run(
        [str(BIN / "hand"), "run", "--config", str(conf)], env=cl.env, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"hand: {conf} line 3: unknown key 'max_runing_tasks' (did you mean 'max_running_tasks'?)"
    )
    cl.home.mkdir(parents=True)
    (cl.home / "mind.toml").write_text('listen = "127.0.0.1:0"\n\nping_interval = -1\n')
    r = subprocess.run([str(BIN / "mind"), "serve"], env=cl.env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"mind: {cl.home / 'mind.toml'} line 3: ping_interval: must be between 0.1 and 3600 seconds (got -1)"
    )
    r = subprocess.run(
        [str(BIN / "hand"), "run", "--config", str(tmp_path / "nope.toml")],
        env=cl.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_sighup_reloads_policy_and_log_level_without_dropping_the_connection(tmp_path):
    cl = Cluster(tmp_path)
    try:
        mind_conf = 'listen = "127.0.0.1:0"\nping_interval = 1\nlog_format = "json"\n'
        mind = start_mind_from_file(cl, mind_conf)
        conf = tmp_path / "hand.toml"
        base = hand_toml(cl, "hup")
        conf.write_text(base)
        hand = Proc("hand-hup", [str(BIN / "hand"), "run", "--config", str(conf)], cl.env, tmp_path / "hand.log")
        cl.procs.append(hand)
        gen = cl.wait_connected("hup")["generation"]
        assert cl.cli("exec", "--hand", "hup", "--", "true").returncode == 0

        def accepted() -> int:
            return sum(e.get("event") == "run_accepted" for e in events(hand))

        # Deny exec and quieten the logs to warnings; a key that needs a restart is reported as such.
        conf.write_text(
            base.replace("max_backoff = 1", "max_backoff = 2") + 'deny_tools = ["exec"]\nlog_level = "warning"\n'
        )
        hand.signal(signal.SIGHUP)
        wait_until(lambda: any(e.get("event") == "config_reloaded" for e in events(hand)), 15, "the reload")
        reloaded = next(e for e in events(hand) if e.get("event") == "config_reloaded")
        assert sorted(reloaded["applied"]) == ["deny_tools", "log_level"]
        assert reloaded["needs_restart"] == ["max_backoff"]
        audit_file = tmp_path / "state-hup" / "audit.jsonl"

        def policy_reloaded() -> dict | None:  # logged after the reload's line: written a moment later
            audit = [json.loads(line) for line in audit_file.read_text().splitlines()]
            return next((e for e in audit if e["event"] == "policy_reloaded"), None)

        changed = wait_until(policy_reloaded, 10, "the audited policy change")  # audited whatever the log level
        assert changed["deny"] == ["exec"] and changed["allow"] == "all"
        before = accepted()
        r = cl.cli("exec", "--hand", "hup", "--", "true")
        assert r.returncode == 125 and b"denied" in r.stderr, r.stderr
        assert cl.cli("call", "--hand", "hup", "read_file", "path=hello.txt").returncode == 0
        assert accepted() == before  # the new level is in force: no info lines for the read
        assert cl.hand_info("hup")["generation"] == gen  # the same connection throughout

        # A broken file changes nothing: the Hand keeps running with the policy it has.
        conf.write_text(base + "deny_tools = [\n")
        hand.signal(signal.SIGHUP)
        wait_until(lambda: any(e.get("event") == "config_reload_failed" for e in events(hand)), 15, "the failure")
        assert hand.alive() and cl.cli("exec", "--hand", "hup", "--", "true").returncode == 125

        # Back to the original file: exec is allowed again.
        conf.write_text(base)
        hand.signal(signal.SIGHUP)
        wait_until(lambda: cl.cli("exec", "--hand", "hup", "--", "true").returncode == 0, 15, "exec allowed again")
        wait_until(lambda: accepted() > before, 15, "info lines again")
        assert cl.hand_info("hup")["generation"] == gen

        # The Mind: log level from info to debug by SIGHUP; connections stay.
        assert not any(e.get("level") == "debug" for e in events(mind))
        (cl.home / "mind.toml").write_text(mind_conf + 'log_level = "debug"\nauth_fail_limit = 3\n')
        mind.signal(signal.SIGHUP)
        wait_until(lambda: any(e.get("event") == "config_reloaded" for e in events(mind)), 15, "the Mind's reload")
        reloaded = next(e for e in events(mind) if e.get("event") == "config_reloaded")
        assert reloaded["applied"] == ["auth_fail_limit", "log_level"] and reloaded["needs_restart"] == []
        assert cl.cli("exec", "--hand", "hup", "--", "true").returncode == 0
        wait_until(lambda: any(e.get("level") == "debug" for e in events(mind)), 15, "a debug line from the Mind")
        assert mind.alive() and cl.hand_info("hup")["generation"] == gen
    finally:
        cl.stop_all()


def test_the_shipped_example_files_are_valid(tmp_path):
    """contrib/config/*.toml are what the README tells operators to install: every key must resolve."""
    contrib = Path(__file__).resolve().parents[2] / "contrib" / "config"
    env = Cluster(tmp_path).env
    for daemon in ("mind", "hand"):
        example = contrib / f"{daemon}.toml"
        r = subprocess.run(
            [str(BIN / daemon), "config", "show", "--config", str(example), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        shown = json.loads(r.stdout)
        assert shown["file"] == str(example)
        from_file = {row["key"] for row in shown["settings"] if row["source"].startswith(str(example))}
        assert {"log_format", "log_level"} <= from_file and len(from_file) >= 8
