"""What a new user trips on, tried side by side with ssh and the shell's own tools, end to end with a
real Mind and Hand and the `mind` / `hand` programs as a user runs them:

- `mind exec box ls -la` takes the command as ssh does, options and all; one word of shell syntax
  (`'ls -la | head -3'`) runs through /bin/sh -c; after `--` the argv is exact, as before;
- `mind runs | head` (and every other command that prints) ends as `ls | head` does: no traceback,
  the status of a command SIGPIPE ended (141);
- every duration option and setting takes `90`, `90s`, `5m`, `2h`: `mind serve --resume-window 3s`
  as `mind exec --wait 5m`."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import struct
import subprocess
import termios
import time

import pytest

from mind.testing.cluster import BIN, Cluster, program, running

pytestmark = pytest.mark.slow  # a real Mind and Hand, and the CLI

SIGPIPE_EXIT = 141


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("forms")) as cl:
        yield cl


# --- `mind exec HAND CMD ARGS` as `ssh HOST CMD ARGS` ---------------------------------------------


def listing_dir(c: Cluster) -> str:
    """A directory of the Hand's root with known entries, made once."""
    d = c.tmp / "root-box" / "listed"
    if not d.exists():
        d.mkdir()
        for name, data in (("a.txt", b"A" * 10), ("b.log", b"B" * 200), (".hidden", b"")):
            (d / name).write_bytes(data)
        os.utime(d, (1_700_000_000, 1_700_000_000))
    return "listed"


def test_ls_with_its_own_options_after_the_hand_prints_what_ls_prints(c):
    """`mind exec box ls -la DIR` was `unrecognized arguments: -la` (exit 2): now the words after the
    Hand are the command's, byte for byte what `ls -la DIR` prints on that machine."""
    d = listing_dir(c)
    local = subprocess.run(["ls", "-la", d], cwd=c.tmp / "root-box", env=c.env, capture_output=True, check=True)
    r = c.cli("exec", "box", "ls", "-la", d)
    assert (r.returncode, r.stderr) == (0, b""), r.stderr
    assert r.stdout == local.stdout and b"b.log" in r.stdout and b".hidden" in r.stdout
    assert c.cli("exec", "--hand", "box", "ls", "-la", d).stdout == local.stdout  # --hand: the same words


def test_an_option_of_mind_after_the_command_is_the_commands(c):
    """`-n` is `mind exec -n` before the command and echo's own after it: no newline, nothing else."""
    r = c.cli("exec", "box", "echo", "-n", "hi")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"hi", b"")
    r = c.cli("exec", "box", "printf", "%s|", "--timeout", "--json", "-t")  # none of them ours
    assert (r.returncode, r.stdout) == (0, b"--timeout|--json|-t|"), r.stderr


def test_one_word_with_shell_syntax_runs_through_sh_as_ssh_runs_it(c):
    """`mind exec box 'ls -la | head -3'` ran a program named `ls -la | head -3` (127): now it is a
    shell line, and its output is the pipe's."""
    d = listing_dir(c)
    line = f"ls -la {d} | head -3"
    local = subprocess.run(["sh", "-c", line], cwd=c.tmp / "root-box", env=c.env, capture_output=True, check=True)
    r = c.cli("exec", "box", line)
    assert (r.returncode, r.stderr) == (0, b""), r.stderr
    assert r.stdout == local.stdout and r.stdout.count(b"\n") == 3
    r = c.cli("exec", "box", "printf 'b\\na\\n' | sort; echo \"x  y\" > out.txt; cat out.txt; exit 3")
    assert (r.returncode, r.stdout) == (3, b"a\nb\nx  y\n"), r.stderr


def test_several_words_stay_an_exact_argv(c):
    """ssh would join these into `printf %s| a b c` and split `a b` in two; each word stays a word."""
    r = c.cli("exec", "box", "printf", "%s|", "a b", "$HOME", "*")
    assert (r.returncode, r.stdout) == (0, b"a b|$HOME|*|"), r.stderr


def test_after_double_dash_the_argv_is_exact_as_before(c):
    r = c.cli("exec", "box", "--", "sh", "-c", "echo hi; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, b"hi\n", b"")
    r = c.cli("exec", "box", "--", "echo hi | tr a-z A-Z")  # one program's name: it does not exist
    assert r.returncode == 127 and b"--shell 'echo hi | tr a-z A-Z'" in r.stderr, r.stderr
    r = c.cli("exec", "--hand", "box", "--", "ls", "-la", listing_dir(c))
    assert r.returncode == 0 and b"b.log" in r.stdout


def test_no_stdin_and_a_terminal_before_the_hand(c):
    r = c.cli("exec", "-n", "box", "uptime")
    assert r.returncode == 0 and b"load average" in r.stdout, r.stderr
    r = c.cli("exec", "-t", "box", "top", "-b", "-n", "1")  # stdin not a terminal: runs without one
    assert r.returncode == 0 and b"load average" in r.stdout and b"stdin is not a terminal" in r.stderr


def on_a_terminal(c: Cluster, *args: str, keys: bytes = b"", until: bytes = b"", timeout: float = 30.0):
    """`mind ARGS` on the slave side of a new pty (a user's terminal): its output and exit code.
    `keys` are typed once `until` has been seen."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execve(program("mind")[0], [*program("mind"), *args], {**c.env, "TERM": "xterm"})
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out, typed, status = b"", False, None
    deadline = time.monotonic() + timeout
    try:
        while status is None and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    pass
            if keys and not typed and until in out:
                os.write(fd, keys)
                typed = True
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(st)
    finally:
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    return status, out


def test_top_in_a_terminal_before_the_hand(c):
    """`mind exec -t box top`, as `ssh -t box top`: top draws, `q` leaves it, exit 0."""
    status, out = on_a_terminal(c, "exec", "-t", "box", "top", "-d", "0.5", keys=b"q", until=b"load average")
    assert status == 0 and b"load average" in out, out[-600:]


def test_a_shell_line_in_a_terminal(c):
    """One word of shell syntax with `-t`: `ssh -t box 'tty; echo $((6*7))'` runs a line in a terminal."""
    status, out = on_a_terminal(c, "exec", "-t", "box", "tty; echo $((6*7))")
    assert status == 0 and b"/dev/pts/" in out and b"42" in out, out[-600:]


# --- `| head`: quiet, as `ls | head` --------------------------------------------------------------


def into_a_gone_reader(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """`argv` with a stdout whose reader has already gone, as `CMD | head -1` is once head has read
    its line and left: the read end is closed before the command starts, so its first write meets
    EPIPE every time, however small its output (a real `| head` meets it only past the pipe's 64 KiB)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(argv, env=env, stdout=w, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.close(w)


@pytest.fixture(scope="module")
def ids(c):
    """A run and a task to list and show (the task's log is 2 MB: more than a pipe holds)."""
    run = json.loads(c.cli("exec", "--json", "box", "true").stdout)["run_id"]
    r = c.cli("task", "start", "--hand", "box", "--id", "big-log", "--", "sh", "-c", "seq 1 300000")
    assert r.returncode == 0, r.stderr
    assert c.cli("task", "wait", "big-log", timeout=60).returncode == 0
    return {"RUN": run, "TASK": "big-log"}


PRINTING = [
    "status",
    "runs",
    "hands",
    "run get RUN",
    "run get RUN --json",
    "task list",
    "task get TASK",
    "task logs TASK",
    "call --hand box list_dir path=.",
    "config show",
    "hand list",
    "client list",
]


@pytest.mark.parametrize("words", PRINTING)
def test_every_printing_command_into_a_gone_reader_is_quiet_and_exits_141(c, ids, words):
    """It was a 30-line BrokenPipeError traceback and exit 1 (`mind status | head`)."""
    argv = [ids.get(w, w) for w in shlex.split(words)]
    r = into_a_gone_reader([*program("mind"), *argv], c.env)
    assert b"Traceback" not in r.stderr and b"BrokenPipe" not in r.stderr, r.stderr
    assert (r.returncode, r.stderr) == (SIGPIPE_EXIT, b""), r.stderr


@pytest.mark.parametrize("words, code", [("exec box seq 1 10", 0), ("exec --hands box seq 1 10", SIGPIPE_EXIT)])
def test_runs_into_a_gone_reader_keep_their_ends(c, words, code):
    """`mind exec` and a fleet run handled `| head` before; the handling moved to the entry point and
    they end as they did: one run with its command's own exit code (as ssh: the remote `seq` ended
    well), a fleet run as `ls` (its runs cancelled)."""
    r = into_a_gone_reader([*program("mind"), *shlex.split(words)], c.env)
    assert b"Traceback" not in r.stderr and r.returncode == code, r.stderr


@pytest.mark.parametrize("words", ["tasks --state-dir STATE", "config show"])
def test_the_hands_printing_commands_too(c, words):
    argv = [str(c.tmp / "state-box") if w == "STATE" else w for w in shlex.split(words)]
    r = into_a_gone_reader([*program("hand"), *argv], c.env)
    assert (r.returncode, r.stderr) == (SIGPIPE_EXIT, b""), r.stderr


@pytest.mark.parametrize("words", ["task logs TASK", "call --hand box read_file path=big.txt --raw"])
def test_a_real_pipe_to_head(c, ids, words):
    """`bash -c 'mind ... | head -1'` with more output than a pipe holds: head's line, no traceback, and
    the status a shell reports of `seq 1 1000000 | head -1`'s seq."""
    (c.tmp / "root-box" / "big.txt").write_bytes(b"line\n" * 400_000)
    cmd = " ".join(shlex.quote(ids.get(w, w)) for w in shlex.split(words))
    r = subprocess.run(
        ["bash", "-c", f"mind {cmd} | head -1; exit ${{PIPESTATUS[0]}}"],
        env=c.env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert b"Traceback" not in r.stderr and r.stderr == b"", r.stderr
    assert r.returncode == SIGPIPE_EXIT and r.stdout.count(b"\n") == 1
    seq = subprocess.run(["bash", "-c", "seq 1 1000000 | head -1; exit ${PIPESTATUS[0]}"], capture_output=True)
    assert seq.returncode == r.returncode


# --- durations: 90, 90s, 5m, 2h everywhere -------------------------------------------------------


def test_every_duration_option_of_a_run_takes_units(c):
    """`--timeout 2s` was `invalid float value` (exit 2) while `--wait 5m` took units."""
    r = c.cli("exec", "--timeout", "1.5s", "--grace", "1s", "box", "sleep", "30", timeout=30)
    assert r.returncode == 124 and b"killed because --timeout 1.5 s passed" in r.stderr, r.stderr
    r = c.cli("exec", "--timeout", "2m", "--grace", "0", "box", "echo", "ok")
    assert (r.returncode, r.stdout) == (0, b"ok\n"), r.stderr
    r = c.cli("call", "--hand", "box", "--timeout", "1m", "stat_file", "path=.")
    assert r.returncode == 0, r.stderr
    r = c.cli("shell", "--timeout", "1h", "box", input=b"exit 4\n")
    assert r.returncode == 4, r.stderr
    r = c.cli("task", "start", "--hand", "box", "--max-runtime", "1m", "--", "sleep", "30")
    task = r.stdout.split()[-1].decode()
    assert r.returncode == 0, r.stderr
    r = c.cli("task", "cancel", task, "--wait-timeout", "1m", timeout=90)
    assert r.returncode == 0, r.stderr
    r = c.cli("exec", "--timeout", "5x", "box", "true")
    assert r.returncode == 2 and b"'5x' is not a duration" in r.stderr and b"Traceback" not in r.stderr


def test_the_daemons_take_durations_as_flags_variables_and_files(tmp_path):
    """`mind serve --resume-window 3s` was refused ("wants a number"): the Mind and the Hand start
    with every duration setting in units, from a flag, a variable and a file, and the Mind
    announces the window it was given."""
    cl = Cluster(tmp_path)
    cl.env["MINDHAND_NODE_LEASE"] = "15s"
    cl.home.mkdir(parents=True)
    (cl.home / "mind.toml").write_text('keep_max = "2h"\n')
    try:
        cl.start_mind("--resume-window", "3s", "--ping-interval", "1s")
        cl.start_hand("box", "--kill-grace", "2s", "--max-backoff", "1m", "--task-retention", "36h")
        cl.wait_connected("box")
        r = cl.cli("exec", "box", "echo", "up")
        assert (r.returncode, r.stdout) == (0, b"up\n"), r.stderr
        shown = json.loads(cl.cli("config", "show", "--json", "--resume-window", "3s").stdout)
        values = {row["key"]: row["value"] for row in shown["settings"]}
        assert (values["resume_window"], values["node_lease"], values["keep_max"]) == (3.0, 15.0, 7200.0)
        r = subprocess.run(
            [str(BIN / "hand"), "config", "show", "--json", "--kill-grace", "2s", "--task-retention", "36h"],
            env=cl.env,
            capture_output=True,
            timeout=60,
        )
        rows = {row["key"]: row["value"] for row in json.loads(r.stdout)["settings"]}
        assert (rows["kill_grace"], rows["task_retention"]) == (2.0, 36 * 3600.0), r.stderr

        import asyncio

        async def window() -> float:
            async with await cl.client() as mc:
                return float(mc.resume_window)

        assert asyncio.run(window()) == 3.0
    finally:
        cl.stop_all()
