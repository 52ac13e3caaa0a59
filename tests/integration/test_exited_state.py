"""A detached run whose command has exited is shown as it ended, before anyone collects its output:
it showed `running` in `mind run get` and `mind runs` until someone attached (the Hand holds the
result until the output is delivered). Now the Hand says the process ended (`run_exited`) and the
listings show `failed (output not yet collected)` with the exit code; attach still gets every byte
and the exit code, after which the run has its end. Real Mind, Hand and CLI."""

from __future__ import annotations

import json

import pytest

from mind.testing.cluster import running, wait_until

pytestmark = pytest.mark.slow  # a real Mind and Hand, the CLI


def test_an_exited_detached_run_shows_how_it_ended_and_attach_collects_it(tmp_path):
    with running(tmp_path, "box", mind_args=("--resume-window", "60")) as cl:
        r = cl.cli("exec", "--detach", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.decode().strip().split()[-1]

        def info() -> dict:
            return json.loads(cl.cli("run", "get", run_id, "--json").stdout)

        got = wait_until(lambda: (i := info()).get("exited") and i, 20, "the Mind to hear the process ended")
        assert got["exited"]["exit_code"] == 3 and got["end"] is None  # its output is still owed
        text = cl.cli("run", "get", run_id).stdout.decode()
        assert "state    failed (output not yet collected)" in text and "exit     3  signal -" in text, text
        assert f"mind attach {run_id}" in text and "None" not in text, text
        row = [ln for ln in cl.cli("runs").stdout.decode().splitlines() if ln.startswith(run_id)]
        assert len(row) == 1 and "failed (output not yet collected)" in row[0] and row[0].rstrip().endswith("3"), row
        a = cl.cli("attach", run_id)
        assert a.returncode == 3 and a.stdout == b"out\n" and a.stderr == b"err\n", a
        done = info()
        assert done["state"] == "failed" and done["exited"] is None and done["end"]["exit_code"] == 3, done


def test_attach_after_the_end_prints_nothing_the_previous_consumer_took(tmp_path):
    """`mind exec --wait 1s ... > f` printed everything; the run then ended; `mind attach RUN >> f`
    printed the last 4 KiB again (exit 0), so f held them twice. The Mind's retained end says what
    its clients had acknowledged, and attach prints only what follows: here nothing."""
    with running(tmp_path, "box", mind_args=("--resume-window", "60")) as cl:
        r = cl.cli("exec", "--wait", "1s", "box", "--", "sh", "-c", "seq 1 3000; sleep 2")
        assert r.returncode == 121, r.stderr  # still running: left unattended, its id on stderr
        expected = "".join(f"{i}\n" for i in range(1, 3001)).encode()
        assert r.stdout == expected
        run_id = json.loads(cl.cli("runs", "--json").stdout)[0]["run_id"]
        wait_until(lambda: json.loads(cl.cli("run", "get", run_id, "--json").stdout)["end"], 20, "the run's end")
        a = cl.cli("attach", run_id)
        assert a.returncode == 0, a.stderr
        assert r.stdout + a.stdout == expected, a.stdout[-200:]  # nothing twice


def test_output_made_after_the_detach_is_kept_until_collected_not_a_4_kib_tail(tmp_path):
    """Issue 35 row 10: a run left by `--wait` writes 335 KB more and ends before anyone attaches.
    Its unacknowledged output is kept (the Hand holds the run's streams until they are collected,
    within the resume window), so attach prints exactly what the first consumer did not take:
    every byte once, not the last 4 KiB."""
    with running(tmp_path, "box", mind_args=("--resume-window", "60")) as cl:
        r = cl.cli("exec", "--wait", "1s", "box", "--", "sh", "-c", "seq 1 3000; sleep 2; seq 3001 60000")
        assert r.returncode == 121, r.stderr
        run_id = json.loads(cl.cli("runs", "--json").stdout)[0]["run_id"]
        wait_until(lambda: json.loads(cl.cli("run", "get", run_id, "--json").stdout).get("exited"), 20, "the exit")
        a = cl.cli("attach", run_id)
        assert a.returncode == 0, a.stderr
        expected = "".join(f"{i}\n" for i in range(1, 60001)).encode()
        assert len(a.stdout) > 300_000 and r.stdout + a.stdout == expected
