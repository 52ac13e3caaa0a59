"""Issue 22, the client leg on the CLI's fast path, with real processes: `mind exec` rides out a cut
of its own connection to the Mind (a fault proxy between the CLI and the Mind), `mind attach` takes
a run up again, `--detach` and `--wait` leave one running. Every test names its resume window (the
suite's Minds run with 0 unless told)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import time

import pytest

from mind.testing import reaper
from mind.testing.cluster import pid_alive, program, running, track, wait_until

pytestmark = pytest.mark.slow  # a real Mind, Hand and fault proxy (mind.testing.cluster)

LINES = 30
NUMBERED = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.1; done; exit 7"
EXPECTED = b"".join(f"line {i}\n".encode() for i in range(1, LINES + 1))


def window(seconds: float) -> tuple[str, ...]:
    return ("--resume-window", f"{seconds:g}")


def popen(cl, *args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [*program("mind"), *args],
        env=cl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=stdin,
        start_new_session=True,
        preexec_fn=reaper.child_preexec(),
    )
    track(p)
    return p


def read_until(pipe, needle: bytes, timeout: float) -> bytes:
    """Read a child's pipe until `needle` appears (bounded)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {needle!r}; got {buf!r}"
        ready, _, _ = select.select([pipe], [], [], left)
        if ready:
            chunk = os.read(pipe.fileno(), 65536)
            assert chunk, f"pipe closed before {needle!r}; got {buf!r}"
            buf += chunk
    return buf


def finish(p: subprocess.Popen[bytes], head: bytes, timeout: float) -> tuple[bytes, bytes]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate(timeout=5)
        raise AssertionError(f"mind exec did not finish in {timeout} s; stderr: {err!r}") from None
    return head + out, err


def test_client_leg_reset_mid_run_all_lines_and_the_exit_code(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", NUMBERED)
        head = read_until(p.stdout, b"line 5\n", 20)
        fp.cut("rst")
        out, err = finish(p, head, 30)
        assert p.returncode == 7, err
        assert hashlib.sha256(out).hexdigest() == hashlib.sha256(EXPECTED).hexdigest(), (out, err)
        assert b"mind unreachable, reconnecting (up to" in err


def test_a_cut_before_the_first_answer_is_ridden_out_under_the_runs_own_name(tmp_path):
    """`mind exec` names its run: an RST that takes the run's first answer (its `stream_numbers`)
    is ridden out by attaching under that name, with every byte and the real exit code (unnamed,
    the run was `lost`: exit 255, "not yet confirmed by the Mind")."""
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        fp.frame("cut", "stream_numbers", direction="down")
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", NUMBERED)
        out, err = finish(p, b"", 30)
        assert p.returncode == 7, err
        assert hashlib.sha256(out).hexdigest() == hashlib.sha256(EXPECTED).hexdigest(), (out, err)
        assert b"mind unreachable, reconnecting (up to" in err and b"reconnected; run " in err


def test_a_run_that_ends_while_the_client_leg_is_cut_still_delivers_its_tail(tmp_path):
    """The command finishes during the outage: its last lines were sent by the Hand but never
    consumed by the CLI. The result waits for their consumption, so the re-attached CLI gets them,
    then the exit code (not a cut tail and 122)."""
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        short = "for i in $(seq 1 10); do echo line $i; sleep 0.2; done; exit 7"
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", short)
        head = read_until(p.stdout, b"line 3\n", 20)
        fp.blackhole()
        time.sleep(6)  # the command ends meanwhile
        fp.clear()
        out, err = finish(p, head, 30)
        assert p.returncode == 7, err
        assert out == b"".join(f"line {i}\n".encode() for i in range(1, 11)), (out, err)
        assert b"not delivered" not in err


def drain(p: subprocess.Popen[bytes], timeout: float = 10) -> bytes:
    """What is left in a (killed) child's stdout, to its end."""
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            continue
        chunk = os.read(p.stdout.fileno(), 65536)
        if not chunk:
            return buf
        buf += chunk
    raise AssertionError("the child's stdout did not end")


def run_info(cl, run_id: str) -> dict:
    r = cl.cli("run", "get", run_id, "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def unattended(cl) -> list[str]:
    r = cl.cli("runs", "--unattended", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    return [run["run_id"] for run in json.loads(r.stdout)]


def test_client_leg_blackholed_20s_mid_run_all_lines_and_the_exit_code(tmp_path):
    # still running when the link heals (a run that ends while its client is away is the Hand leg's
    # and the Mind's to hold: its output must wait for the client, not be cut)
    slow = "for i in $(seq 1 56); do echo line $i; sleep 0.5; done; exit 7"
    expected = b"".join(f"line {i}\n".encode() for i in range(1, 57))
    with running(tmp_path, mind_args=window(60)) as cl:
        fp = cl.start_proxy()
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", slow)
        head = read_until(p.stdout, b"line 4\n", 20)
        fp.blackhole()
        time.sleep(20)
        fp.resume()
        out, err = finish(p, head, 60)
        assert p.returncode == 7, err
        assert hashlib.sha256(out).hexdigest() == hashlib.sha256(expected).hexdigest(), (out, err)
        assert err.count(b"mind unreachable, reconnecting") == 1, err


def test_stdin_through_sha256sum_with_a_reset_in_the_middle(tmp_path):
    data = tmp_path / "in.bin"
    data.write_bytes(os.urandom(8 << 20))
    want = hashlib.sha256(data.read_bytes()).hexdigest()
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        fp.bandwidth(4096, "up")  # 8 MiB take about 2 s: the reset lands in the middle
        with open(data, "rb") as f:
            p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sha256sum", stdin=f)
        time.sleep(1.0)
        fp.cut("rst")
        out, err = finish(p, b"", 60)
        assert p.returncode == 0, err
        assert out.split()[0].decode() == want, (out, err)


def test_a_window_shorter_than_the_outage_cancels_the_run_and_kills_its_tree(tmp_path):
    with running(tmp_path, mind_args=window(3)) as cl:
        fp = cl.start_proxy()
        pidfile = cl.tmp / "root-box" / "w.pid"
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", "echo $$ > w.pid; echo up; sleep 60")
        head = read_until(p.stdout, b"up\n", 20)
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "the pid file"))
        fp.blackhole()
        out, err = finish(p, head, 20)
        assert p.returncode == 255, err
        assert b"mind unreachable for longer than the resume window" in err, err
        run_id = err.split(b"mind run get ")[1].split()[0].decode()
        info = wait_until(lambda: (i := run_info(cl, run_id))["state"] == "cancelled" and i, 20, "the run cancelled")
        assert info["end"]["reason"] and "client" in info["end"]["reason"], info
        wait_until(lambda: not pid_alive(pid), 15, "the run's tree gone")
        fp.resume()


def test_mind_attach_after_the_first_cli_was_killed_gets_the_rest_and_the_exit_code(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        paced = NUMBERED.replace("sleep 0.1", "sleep 0.4")
        p = popen(cl, "exec", "box", "--", "sh", "-c", paced)
        head = read_until(p.stdout, b"line 6\n", 20)
        # A consumer killed between writing a chunk and acknowledging it (the ack follows the write
        # at once) would see that chunk again: kill it in the quiet between two lines, as a user does.
        time.sleep(0.15)
        os.kill(p.pid, signal.SIGKILL)
        head += drain(p)
        p.wait(10)
        run_id = wait_until(lambda: unattended(cl), 10, "the run listed as unattended")[0]
        r = cl.cli("attach", run_id, timeout=60)
        assert r.returncode == 7, r.stderr
        assert head + r.stdout == EXPECTED, (head, r.stdout, r.stderr)


def test_detach_then_attach(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        r = cl.cli("exec", "--detach", "box", "--", "sh", "-c", NUMBERED, timeout=30)
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.decode().strip()
        assert run_id in unattended(cl)
        other = cl.client_credential("other")
        refused = cl.cli("attach", "--credential", str(other), run_id, timeout=30)
        assert refused.returncode == 125, refused.stderr
        assert b"only its owner may attach" in refused.stderr, refused.stderr
        a = cl.cli("attach", run_id, "--json", timeout=60)
        assert a.returncode == 7, a.stderr
        first, end = (json.loads(line) for line in a.stdout.splitlines())
        assert first["attached"] == run_id and first["streams"]["stdout"]["offset"] == 0, first
        assert end["exit_code"] == 7 and end["delivered"]["stdout"]["bytes"] == len(EXPECTED), end
        again = cl.cli("attach", run_id, timeout=30)  # it ended: its retained end, its code
        assert again.returncode == 7, again.stderr
        assert run_id not in unattended(cl)


def test_detach_json_says_the_run_and_how_long_it_is_kept(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        r = cl.cli("exec", "--detach", "--keep", "2m", "--json", "box", "--", "sh", "-c", "exit 3", timeout=30)
        assert r.returncode == 0, r.stderr
        said = json.loads(r.stdout)
        assert said["detached"] is True and said["keep_s"] == 120, said
        a = cl.cli("attach", said["run_id"], timeout=30)
        assert a.returncode == 3, a.stderr
        bad = cl.cli("exec", "--keep", "2m", "box", "--", "true", timeout=30)
        assert bad.returncode == 2 and b"--keep goes with --detach or --wait" in bad.stderr


def test_wait_leaves_the_run_running_and_attach_gets_the_rest(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        r = cl.cli("exec", "--wait", "1s", "box", "--", "sh", "-c", NUMBERED, timeout=30)
        assert r.returncode == 121, r.stderr
        run_id = r.stderr.split(b"still running: mind attach ")[1].split()[0].decode()
        a = cl.cli("attach", run_id, timeout=60)
        assert a.returncode == 7, a.stderr
        assert r.stdout + a.stdout == EXPECTED, (r.stdout, a.stdout)


def test_two_attaches_at_once_the_older_is_told_it_was_replaced(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        paced = NUMBERED.replace("sleep 0.1", "sleep 0.3")  # the newer comes between two lines (see above)
        r = cl.cli("exec", "--detach", "box", "--", "sh", "-c", paced, timeout=30)
        run_id = r.stdout.decode().strip()
        older = popen(cl, "attach", run_id)
        head = read_until(older.stdout, b"line 4\n", 20)
        newer = popen(cl, "attach", run_id)
        out_old, err_old = finish(older, head, 20)
        assert older.returncode == 255, err_old
        assert b"another attachment took run" in err_old, err_old
        out_new, err_new = finish(newer, b"", 30)
        assert newer.returncode == 7, err_new
        assert out_old + out_new == EXPECTED, (out_old, out_new)


def test_ctrl_c_during_an_outage_is_delivered_once_on_return(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        pidfile = cl.tmp / "root-box" / "c.pid"
        p = popen(cl, "exec", "--mind", fp.url, "box", "--", "sh", "-c", "echo $$ > c.pid; echo up; sleep 60")
        head = read_until(p.stdout, b"up\n", 20)
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "the pid file"))
        fp.blackhole()
        time.sleep(3)  # the CLI has noticed (its keepalive) and is reconnecting
        os.kill(p.pid, signal.SIGINT)
        time.sleep(1)
        assert pid_alive(pid)  # nothing reached the Mind yet
        fp.resume()
        out, err = finish(p, head, 30)
        assert p.returncode == 130, err
        assert err.count(b"cancel requested") == 1, err
        wait_until(lambda: not pid_alive(pid), 15, "the run's tree gone")


class Term:
    """The CLI on the slave side of a fresh pty; the test types on the master side."""

    def __init__(self, env: dict[str, str], argv: list[str]) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the CLI, with the pty as its controlling terminal
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.out = b""

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            r, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if r:
                try:
                    self.out += os.read(self.fd, 65536)
                except OSError:
                    return

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.2)
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(st)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        raise AssertionError(f"the CLI did not end; output: {self.out[-800:]!r}")


def test_keys_typed_before_during_and_after_a_blackhole_arrive_exactly_once(tmp_path):
    with running(tmp_path, mind_args=window(30)) as cl:
        fp = cl.start_proxy()
        keys = cl.tmp / "root-box" / "keys.txt"
        mind = program("mind")
        t = Term(cl.env, [*mind, "exec", "--mind", fp.url, "-t", "box", "--", "sh", "-c", "cat > keys.txt"])
        try:
            wait_until(lambda: keys.exists(), 20, "the remote cat to start")
            os.write(t.fd, b"before\n")
            wait_until(lambda: keys.read_bytes() == b"before\n", 10, "the first keys")
            fp.blackhole()
            os.write(t.fd, b"during-1\n")  # read and sent at once: into the void, kept until acknowledged
            t.pump(3)  # the CLI notices and reconnects (the keys below wait in the local terminal)
            os.write(t.fd, b"during-2\n")
            t.pump(1)
            fp.resume()
            os.write(t.fd, b"after\n")
            want = b"before\nduring-1\nduring-2\nafter\n"
            wait_until(lambda: keys.read_bytes() == want, 20, "every key once")
            os.write(t.fd, b"\x04")  # end of input for cat: the run ends 0
            code, t.pid = t.wait(20), 0
            assert code == 0, t.out
        finally:
            if t.pid:  # not reaped: the test failed before the end
                os.kill(t.pid, signal.SIGKILL)
                os.waitpid(t.pid, 0)
        assert keys.read_bytes() == want


def test_the_cli_says_when_the_runs_hand_is_away_and_back(tmp_path):
    with running(tmp_path, via_proxy=True, mind_args=window(30)) as cl:
        hand_leg = cl.proxy
        assert hand_leg is not None
        p = popen(cl, "exec", "box", "--", "sh", "-c", NUMBERED)
        head = read_until(p.stdout, b"line 5\n", 20)
        hand_leg.blackhole()
        time.sleep(4)  # the Mind notices (its keepalive) and tells the attached client
        hand_leg.resume()
        out, err = finish(p, head, 40)
        assert p.returncode == 7, err
        assert out == EXPECTED, (out, err)
        assert b"mind: hand box unreachable, waiting up to" in err, err
        assert b"mind: hand box is back" in err, err


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_mind_exec_rides_out_a_restart_of_the_mind(tmp_path, how):
    with running(tmp_path, mind_args=window(30)) as cl:
        p = popen(cl, "exec", "box", "--", "sh", "-c", NUMBERED)
        head = read_until(p.stdout, b"line 5\n", 20)
        mind = cl.mind
        assert mind is not None
        if how == "kill9":
            mind.kill9()
        else:
            mind.stop()
        cl.start_mind(*window(30), port=cl.port)
        out, err = finish(p, head, 40)
        assert p.returncode == 7, err
        assert out == EXPECTED, (out, err)


def test_a_wait_whose_detach_meets_a_blackhole_reconnects_and_detaches(tmp_path):
    """`mind exec --wait` whose detach request was in flight during a 6.5 s blackhole of the
    client's leg exited 255 "outcome unknown". Within the window it reconnects, takes the run up
    and detaches it there: 121, the run's id printed, the run still going (attachable)."""
    with running(tmp_path, mind_args=window(60)) as cl:
        fp = cl.start_proxy()
        p = popen(cl, "exec", "--mind", fp.url, "--wait", "2s", "box", "--", "sh", "-c", "echo up; sleep 30")
        head = read_until(p.stdout, b"up\n", 20)
        fp.blackhole()  # before --wait's 2 s pass: the detach goes into the blackhole
        time.sleep(6.5)
        fp.resume()
        out, err = finish(p, head, 60)
        assert p.returncode == 121, err
        assert b"still running: mind attach " in err, err
        run_id = err.split(b"still running: mind attach ")[1].split()[0].decode()
        assert run_id in unattended(cl), err
