"""Issue 14, items 1-5: the answers stay true when a daemon dies, a Hand freezes, a link is cut or
the Hand's state disk is full (and a full disk never ends the Hand). Real processes, the fault
proxy, a real tmpfs; each test failed before the fix it names.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mind.testing.cluster import running, wait_until

pytestmark = pytest.mark.slow  # real Minds, Hands, proxies and a tmpfs


def ran(cl, task_id: str) -> int:
    """How many times the task's command ran (each run appends one line to a file in the root)."""
    f = cl.hands["box"].root / f"ran-{task_id}"
    return len(f.read_text().splitlines()) if f.exists() else 0


def start(cl, task_id: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return cl.cli("task", "start", "--hand", "box", "--id", task_id, *extra, "--shell", f"echo x >> ran-{task_id}")


def wait_task(cl, task_id: str, state: str, timeout: float = 20.0) -> dict:
    return wait_until(
        lambda: (t := cl.task(task_id))["state"] == state and not t["stale"] and t,
        timeout,
        f"task {task_id} {state}",
        interval=0.2,
    )


# --- item 1: the Mind dies while the start is unanswered --------------------------------------------


def test_a_start_cut_off_by_the_minds_death_exits_255_and_is_settled_by_the_hand(tmp_path):
    """The Hand is frozen with the start in its socket; the Mind is killed. The CLI cannot know
    whether the task was committed: 255 ("sent, answer never came"), not 125 ("refused, nothing
    stored"). A retry by id is settled by the Hand, and the command runs once."""
    with running(tmp_path) as cl:
        hand = cl.hands["box"]
        hand.signal(signal.SIGSTOP)
        try:
            p = cl.cli_popen("task", "start", "--hand", "box", "--id", "t1", "--shell", "echo x >> ran-t1")
            assert cl.mind is not None
            wait_until(
                lambda: any(
                    e.get("event") == "run_admitted" and e.get("run_id") == "t1"
                    for e in cl.mind.events(cl.mind.log_start)
                ),
                15,
                "the Mind to send the start",
            )
            cl.mind.kill9()
            _, err = p.communicate(timeout=20)
        finally:
            hand.signal(signal.SIGCONT)
        assert p.returncode == 255, err
        assert b"never came" in err and b"t1" in err
        cl.start_mind(port=cl.port)
        cl.wait_connected("box", min_gen=1)
        # Whether the start reached the Hand before the Mind died depends on a few microseconds;
        # either way the Hand settles the retry: `duplicate` if it has the task, `accepted` if not,
        # and the command runs exactly once.
        again = start(cl, "t1", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["outcome"] in ("duplicate", "accepted")
        wait_task(cl, "t1", "succeeded", 30)
        third = start(cl, "t1", "--json")
        assert third.returncode == 0 and json.loads(third.stdout)["outcome"] == "duplicate"
        time.sleep(0.5)
        assert ran(cl, "t1") == 1


# --- item 2: a retry after an unanswered start asks the Hand ----------------------------------------


def test_a_retry_after_a_start_that_never_reached_the_hand_runs_it_once(tmp_path):
    """The link is reset just before the start reaches the Hand: 255. The retry with the same id is
    settled by the Hand, which never had it: it runs now, once (before: `duplicate`, exit 0, and
    the task later `lost` and never runnable under that id)."""
    with running(tmp_path, via_proxy=True) as cl:
        assert cl.proxy is not None
        cl.proxy.frame("cut", "rpc", "down")
        first = start(cl, "t1")
        assert first.returncode == 255, first.stderr
        cl.proxy.reset()  # (the rule touched only the live connection; nothing is left for the reconnect)
        cl.wait_connected("box", min_gen=2)
        retry = start(cl, "t1", "--json")
        assert retry.returncode == 0, retry.stderr
        assert json.loads(retry.stdout)["outcome"] == "accepted"
        wait_task(cl, "t1", "succeeded")
        assert ran(cl, "t1") == 1
        # and once more: now the Hand has it, a duplicate that runs nothing
        dup = start(cl, "t1", "--json")
        assert dup.returncode == 0 and json.loads(dup.stdout)["outcome"] == "duplicate"
        time.sleep(0.5)
        assert ran(cl, "t1") == 1


async def test_two_starts_of_one_id_at_once_both_hear_the_hands_truth(tmp_path):
    """Two connections start one id at once and the first start is lost on the way: neither is told
    `duplicate` from the Mind's record of what it sent; both hear `unknown`. A retry then runs the
    task exactly once."""
    with running(tmp_path, via_proxy=True) as cl:
        assert cl.proxy is not None
        cl.proxy.hold("rpc", "down")
        args = {"command": "echo x >> ran-t1"}
        async with await cl.client("agent") as a, await cl.client("agent") as b:  # two processes of one agent
            first = asyncio.create_task(a.task_start("box", "shell", args, task_id="t1"))
            await asyncio.to_thread(wait_until, lambda: cl.proxy.held() > 0, 10, "the start to be held")
            second = asyncio.create_task(b.task_start("box", "shell", args, task_id="t1"))
            await asyncio.sleep(0.3)
            assert not second.done(), f"the second start was answered at once: {second.result()}"
            cl.proxy.cut("rst")  # the held start is lost with the connection
            cl.proxy.reset()
            r1, r2 = await asyncio.wait_for(asyncio.gather(first, second), 20)
            assert (r1.outcome, r2.outcome) == ("unknown", "unknown")
            await asyncio.to_thread(cl.wait_connected, "box", 2)
            again = await a.task_start("box", "shell", args, task_id="t1")
            assert again.outcome == "accepted"
            also = await b.task_start("box", "shell", args, task_id="t1")
            assert also.outcome == "duplicate"
        wait_task(cl, "t1", "succeeded")
        assert ran(cl, "t1") == 1


# --- items 3 and 4: a full state disk ----------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "4m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(where: Path) -> Path:
    """Fill the filesystem of `where` to the last byte; returns the filler (remove it to free)."""
    filler = where / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * 65536
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with contextlib.suppress(OSError):  # the last partial blocks too
        with open(where / "filler2", "wb") as f:
            while True:
                f.write(b"\0" * 512)
                f.flush()
    return filler


def brim(path: Path) -> None:
    """On a filesystem `fill` filled, fill the room left in the last block of the file at `path`
    too (an append there needs no new block): its next append fails. The padding is one JSON line
    (or empty lines, if fewer bytes are left than a line takes), so the file stays JSON lines."""
    st = os.stat(path)
    room = st.st_blocks * 512 - st.st_size
    line = b'{"event":"test_padding"}'
    pad = line[:-1] + b" " * (room - len(line) - 1) + b"}\n" if room > len(line) else b"\n" * room
    with open(path, "ab") as f:
        f.write(pad)
    with pytest.raises(OSError) as full, open(path, "ab") as f:
        f.write(b"\n")
    assert full.value.errno == errno.ENOSPC


def free(where: Path) -> None:
    for name in ("filler", "filler2"):
        with contextlib.suppress(FileNotFoundError):
            (where / name).unlink()


def test_a_start_refused_for_a_full_disk_leaves_the_id_free(tmp_path, as_root):
    """Item 4: the Hand refuses a start it cannot store ("nothing stored"); once space is back the
    same start is accepted (before: `conflicting_duplicate`, the refused start's run blocked it)."""
    with tmpfs(tmp_path / "state-box"), running(tmp_path) as cl:
        state = cl.hands["box"].state_dir
        for i in range(3):  # a few tasks, so the database and its WAL have their size
            assert start(cl, f"w{i}").returncode == 0
        wait_task(cl, "w2", "succeeded")
        fill(state)
        refused = start(cl, "t1")
        assert refused.returncode == 125, refused.stderr
        assert ran(cl, "t1") == 0
        free(state)
        retry = start(cl, "t1", "--json")
        assert retry.returncode == 0, retry.stderr
        assert json.loads(retry.stdout)["outcome"] == "accepted"
        wait_task(cl, "t1", "succeeded")
        assert ran(cl, "t1") == 1


def test_a_task_that_ends_while_the_disk_is_full_keeps_its_outcome(tmp_path, as_root):
    """Item 3: the task exits 0 while its final write cannot be committed. The Hand keeps the
    outcome, says so (`/healthz` degraded, the metric, `uncommitted` in `task get`), and commits it
    when space returns: the task ends `succeeded` with exit code 0, not `running` for good or
    `lost` at the next restart."""
    with tmpfs(tmp_path / "state-box"), running(tmp_path, "box", "--metrics-listen", "127.0.0.1:0") as cl:
        hand = cl.hands["box"]
        state = hand.state_dir
        for i in range(3):
            assert start(cl, f"w{i}").returncode == 0
        wait_task(cl, "w2", "succeeded")
        gate = hand.root / "gate"
        r = cl.cli(
            "task", "start", "--hand", "box", "--id", "t1", "--shell",
            f"while [ ! -e {gate} ]; do sleep 0.05; done; echo x >> ran-t1",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        wait_task(cl, "t1", "running")
        fill(state)
        gate.touch()
        wait_until(lambda: ran(cl, "t1") == 1, 10, "the task to finish its work")
        seen = wait_until(lambda: (t := cl.task("t1")).get("uncommitted") and t, 15, "the uncommitted outcome")
        assert seen["state"] == "running" and "succeeded" in seen["uncommitted"]
        cancel = cl.cli("task", "cancel", "t1")  # nothing to cancel: it ended, and says how
        assert cancel.returncode == 0 and b"already ended: ended (succeeded, exit code 0)" in cancel.stdout, cancel
        addr = wait_until(lambda: (state / "metrics.addr").exists() and (state / "metrics.addr").read_text().strip(), 5)
        health = json.loads(_get(addr, "/healthz"))
        assert health["status"] == "degraded" and health["tasks"]["uncommitted"] == 1
        assert "mindhand_hand_tasks_uncommitted 1.0" in _get(addr, "/metrics")
        free(state)
        done = wait_task(cl, "t1", "succeeded", 30)
        assert done["exit_code"] == 0 and not done.get("uncommitted")
        assert json.loads(_get(addr, "/healthz"))["status"] == "ok"
    assert any(e.get("event") == "task_outcome_uncommitted" for e in hand.events())


def _get(addr: str, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as resp:
        return resp.read().decode()


def _json_lines(text: str) -> list[dict]:
    """The whole lines of a JSON-lines file (a line the full disk cut short is not one)."""
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _dropped(metrics: str, sink: str) -> float:
    m = re.search(rf'^mindhand_hand_log_writes_dropped_total{{sink="{sink}"}} (\S+)$', metrics, re.M)
    assert m is not None, metrics
    return float(m.group(1))


def test_a_full_state_disk_never_ends_the_hand(tmp_path, as_root):
    """The state disk fills while a run is going. Before, the audit line of its end (`run_terminal`)
    raised ENOSPC out of the run's task group and the Hand exited 1; the run was `lost` and the
    next `mind exec -- true` waited 12 s to end 124. Now: the admitted run ends truthfully (its
    output and exit code), its audit lines are counted and dropped (the metric, one log line when
    failures start), new starts are refused at once with 125 and `disk_full` (a run that cannot be
    audited does not run; a task neither), the Hand stays up, and once there is room a run works
    again and one log line says how many lines were dropped."""
    with tmpfs(tmp_path / "state-box"), running(tmp_path, "box", "--metrics-listen", "127.0.0.1:0") as cl:
        hand = cl.hands["box"]
        state = hand.state_dir
        addr = wait_until(lambda: (state / "metrics.addr").exists() and (state / "metrics.addr").read_text().strip(), 5)
        assert _dropped(_get(addr, "/metrics"), "audit") == 0
        gate, started = hand.root / "gate", hand.root / "started"
        admitted = cl.cli_popen(
            "exec", "--hand", "box", "--", "sh", "-c",
            f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done; echo done; exit 3",
        )  # fmt: skip
        wait_until(started.exists, 15, "the admitted run to start")
        fill(state)
        brim(state / "audit.jsonl")  # its next line needs a block of its own: none is left
        gate.touch()
        out, err = admitted.communicate(timeout=30)
        assert (admitted.returncode, out) == (3, b"done\n"), err  # its own exit code, not lost (255)
        assert hand.alive()
        refused = cl.cli("exec", "--hand", "box", "--", "true")
        assert refused.returncode == 125 and b"disk_full" in refused.stderr, refused
        assert b"state disk is full" in refused.stderr
        task = start(cl, "t1")
        assert task.returncode == 125 and b"disk_full" in task.stderr, task
        assert ran(cl, "t1") == 0
        dropped = _dropped(_get(addr, "/metrics"), "audit")
        assert dropped >= 1  # at least the admitted run's `run_terminal`
        health = json.loads(_get(addr, "/healthz"))
        assert (health["status"], health["state_disk_full"]) == ("degraded", True)
        assert hand.alive()
        free(state)
        again = cl.cli("exec", "--hand", "box", "--", "echo", "back")
        assert (again.returncode, again.stdout) == (0, b"back\n"), again.stderr
        recovered = wait_until(
            lambda: [e for e in hand.events() if e.get("event") == "log_writes_recovered"], 10, "the recovery line"
        )
        assert len(recovered) == 1 and recovered[0]["sink"] == "audit"
        assert recovered[0]["dropped"] == _dropped(_get(addr, "/metrics"), "audit") >= dropped
        failing = [e for e in hand.events() if e.get("event") == "log_writes_failing"]
        assert len(failing) == 1 and failing[0]["sink"] == "audit" and "ENOSPC" in failing[0]["error"]
        assert json.loads(_get(addr, "/healthz"))["state_disk_full"] is False
        audited = _json_lines((state / "audit.jsonl").read_text())
        assert any(e["event"] == "run_terminal" and e.get("exit_code") == 0 for e in audited)  # written again
        assert hand.alive()
    assert hand.p.returncode == 0  # stopped by the harness's SIGTERM, cleanly: it never ended on its own


# --- item 5: a frozen Hand reports the command's own exit ----------------------------------------


def test_a_command_that_exited_while_the_hand_was_frozen_past_its_deadline_reports_its_exit(tmp_path):
    """The Hand is stopped from before the command's exit until after the run's deadline. It wakes
    to both; the command exited on its own, so the run is `succeeded` with exit code 0 (before:
    `timed_out` with exit code 0, a record that contradicts itself)."""
    with running(tmp_path, mind_args=("--ping-interval", "30")) as cl:
        hand = cl.hands["box"]
        started = hand.root / "started"
        p = cl.cli_popen(
            "exec", "--hand", "box", "--timeout", "3", "--json", "--", "sh", "-c", "touch started; sleep 0.5"
        )
        # Frozen only once the command runs (a Hand frozen before its spawn rightly kills it late).
        wait_until(started.exists, 15, "the command to start")
        hand.signal(signal.SIGSTOP)
        try:
            time.sleep(4.5)  # the command exits at 0.5 s, the deadline passes at 3 s
        finally:
            hand.signal(signal.SIGCONT)
        out, err = p.communicate(timeout=30)
        end = json.loads(out)
        assert (end["state"], end["exit_code"], p.returncode) == ("succeeded", 0, 0), err
    # the Hand's line of the end is written once its loop's turn is over: after the result it sent
    ends = wait_until(lambda: [e for e in hand.events() if e.get("event") == "run_terminal"], 10, "the Hand's end line")
    assert ends[-1]["state"] == "succeeded" and ends[-1]["exit_code"] == 0
    assert os.path.exists(tmp_path)
