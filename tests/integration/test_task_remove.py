"""`mind task rm ID`: a finished task is forgotten on its Hand (its row and its log files) and on the
Mind (its snapshot), audited on both sides, so it no longer counts against the Hand's retention
quota; a task still running is refused and goes on; an unknown id, and a task whose Hand is offline,
are clear errors that remove nothing. Real processes: a Mind, a Hand and the CLI. Before, `mind task
rm` did not exist (a usage error), and a finished task held its place in the quota until the
retention time passed."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from mind.testing.cluster import running, wait_until

pytestmark = pytest.mark.slow  # a real Mind and Hand

GATE = "while [ ! -e {gate} ]; do sleep 0.05; done"


def wait_state(cl, task_id: str, state: str, timeout: float = 30.0) -> dict:
    return wait_until(
        lambda: (t := cl.task(task_id))["state"] == state and not t["stale"] and t, timeout, f"task {task_id} {state}"
    )


def log_files(state_dir: Path, task_id: str) -> list[str]:
    return sorted(p.name for p in (state_dir / "logs").iterdir() if p.name.startswith(f"{task_id}."))


def audited(path: Path, event: str) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == event]


def test_a_finished_task_is_removed_on_the_hand_and_the_mind_and_frees_its_place(tmp_path):
    """The quota is one task: a finished task refuses the next start (`quota_exceeded`) until it is
    removed. `rm` then answers what went (state, exit code, log size); `task get` says unknown, the
    Hand's log files are gone from its state dir, `hand tasks` no longer lists it, both audit files
    hold the removal (the Mind's with the client who asked), and the next start is accepted. A
    second `rm` of the same id is a clear error."""
    with running(tmp_path, "box", "--max-retained-tasks", "1") as cl:
        state = cl.hands["box"].state_dir
        assert state is not None
        first = cl.cli("task", "start", "--hand", "box", "--id", "t1", "--shell", "echo hello; echo oops >&2")
        assert first.returncode == 0, first.stderr
        done = wait_state(cl, "t1", "succeeded")
        assert log_files(state, "t1") == ["t1.log", "t1.stderr", "t1.stdout"]
        assert "t1" in cl.hand_tasks("box")
        full = cl.cli("task", "start", "--hand", "box", "--id", "t2", "--shell", "true")
        assert full.returncode == 125 and b"quota_exceeded" in full.stderr, full.stderr

        rm = cl.cli("task", "rm", "t1")
        assert rm.returncode == 0, rm.stderr
        assert (
            rm.stdout
            == (
                f"task t1 removed from hand 'box' (succeeded, exit code 0; its log of {done['log_bytes']} bytes is gone)\n"
            ).encode()
        )
        gone = cl.cli("task", "get", "t1")
        assert gone.returncode == 125 and b"no task t1" in gone.stderr, gone
        assert log_files(state, "t1") == []
        assert "t1" not in cl.hand_tasks("box") and "t1" not in cl.task_snapshots()
        [on_hand] = audited(state / "audit.jsonl", "task_removed")
        assert (on_hand["task_id"], on_hand["state"], on_hand["log_bytes"]) == ("t1", "succeeded", done["log_bytes"])
        [on_mind] = audited(cl.home / "audit.jsonl", "task_removed")
        assert (on_mind["task_id"], on_mind["hand"], on_mind["client"], on_mind["hand_had_it"]) == (
            "t1",
            "box",
            "admin",
            True,
        )

        again = cl.cli("task", "rm", "t1")
        assert again.returncode == 125 and b"no task t1" in again.stderr, again
        nope = cl.cli("task", "rm", "nope", "--json")
        assert nope.returncode == 125 and b"no task nope" in nope.stderr
        assert json.loads(nope.stdout)["code"] == "unknown_task"

        room = cl.cli("task", "start", "--hand", "box", "--id", "t2", "--json", "--shell", "true")
        assert room.returncode == 0 and json.loads(room.stdout)["outcome"] == "accepted", room.stderr
        wait_state(cl, "t2", "succeeded")


def test_a_running_task_is_refused_and_goes_on(tmp_path):
    """`rm` of a running task exits 125 saying so (cancel it first) and removes nothing: the task
    runs on, keeps its log and its rows, and ends as it would have; once it has, `rm` removes it."""
    with running(tmp_path) as cl:
        hand = cl.hands["box"]
        assert hand.state_dir is not None and hand.root is not None
        gate = hand.root / "gate"
        shell = f"echo started; {GATE.format(gate=gate)}; echo finished"
        r = cl.cli("task", "start", "--hand", "box", "--id", "t1", "--shell", shell)
        assert r.returncode == 0, r.stderr
        wait_state(cl, "t1", "running")
        refused = cl.cli("task", "rm", "t1")
        assert refused.returncode == 125, refused
        assert b"task t1 is running" in refused.stderr and b"mind task cancel t1" in refused.stderr
        assert cl.task("t1")["state"] == "running" and cl.hand_tasks("box")["t1"]["state"] == "running"
        assert log_files(hand.state_dir, "t1") == ["t1.log", "t1.stderr", "t1.stdout"]
        assert audited(hand.state_dir / "audit.jsonl", "task_removed") == []
        gate.touch()
        wait_state(cl, "t1", "succeeded")
        logs = cl.cli("task", "logs", "t1")
        assert logs.stdout == b"started\nfinished\n"  # it ran on, writing its log, to its own end
        assert cl.cli("task", "rm", "t1").returncode == 0
        assert log_files(hand.state_dir, "t1") == []


def test_a_task_of_an_offline_hand_is_refused_naming_the_hand(tmp_path):
    """The record and the log live on the Hand: with the Hand away, `rm` exits 125 naming it and
    removes nothing (the Mind's snapshot stays, stale); once the Hand is back, `rm` works."""
    with running(tmp_path) as cl:
        hand = cl.hands["box"]
        r = cl.cli("task", "start", "--hand", "box", "--id", "t1", "--shell", "true")
        assert r.returncode == 0, r.stderr
        wait_state(cl, "t1", "succeeded")
        hand.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: not (cl.hand_info("box") or {}).get("connected"), 15, "the Mind to see the Hand gone")
            refused = cl.cli("task", "rm", "t1")
        finally:
            hand.signal(signal.SIGCONT)
        assert refused.returncode == 125, refused
        assert b"hand 'box' is offline" in refused.stderr and b"nothing was removed" in refused.stderr
        assert cl.task("t1")["state"] == "succeeded"
        cl.wait_connected("box", min_gen=2)
        assert "t1" in cl.hand_tasks("box")
        assert cl.cli("task", "rm", "t1").returncode == 0
        assert "t1" not in cl.hand_tasks("box")
