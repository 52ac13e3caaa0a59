"""What a new user trips on (issue 24), end to end with a real Mind and Hand: ssh's habits
(`mind exec HAND -- CMD`, `-t` with a pipe, shell syntax in one word), a deadline that says it
killed the command, and `mind cp`'s operands and scope named as the user wrote them."""

from __future__ import annotations

import subprocess

import pytest

from mind.testing.cluster import program, running

pytestmark = pytest.mark.slow  # a real Mind and Hand, and the `mind` CLI


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("habits")) as cl:
        yield cl


def test_the_hand_as_the_first_word_runs_as_with_hand(c):
    r = c.cli("exec", "box", "--", "sh", "-c", "echo hi; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, b"hi\n", b"")
    assert c.cli("exec", "--hand", "box", "--", "sh", "-c", "echo hi; exit 3").stdout == r.stdout


def test_without_a_hand_it_is_a_usage_error_that_shows_the_form(c):
    r = c.cli("exec", "--", "box", "true")
    assert r.returncode == 2 and b"mind exec [OPTIONS] HAND COMMAND [ARG...]" in r.stderr
    assert b"Traceback" not in r.stderr


def test_one_word_with_shell_syntax_that_cannot_start_suggests_shell(c):
    r = c.cli("exec", "box", "--", "echo hi | tr a-z A-Z")
    assert r.returncode == 127
    assert b"--shell 'echo hi | tr a-z A-Z'" in r.stderr, r.stderr
    r = c.cli("exec", "box", "--shell", "echo hi | tr a-z A-Z")  # and the hint is right
    assert (r.returncode, r.stdout) == (0, b"HI\n")


def test_a_missing_program_without_shell_syntax_gets_no_hint(c):
    r = c.cli("exec", "box", "--", "no-such-program-here")
    assert r.returncode == 127 and b"--shell" not in r.stderr


@pytest.mark.parametrize("stdin", [b"hi\n", None], ids=["pipe", "devnull"])
def test_tty_with_a_stdin_that_is_not_a_terminal_runs_without_one(c, stdin):
    """As `ssh -t` with a pipe: no terminal, one line saying so, and the data is the command's stdin
    (it used to hang waiting for keys)."""
    r = c.cli("exec", "-t", "box", "--", "cat", input=stdin, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (stdin or b"")
    assert r.stderr.count(b"\n") == 1 and b"stdin is not a terminal" in r.stderr


def test_a_run_killed_by_its_timeout_says_which_flag(c):
    r = c.cli("exec", "box", "--timeout", "1", "--", "sleep", "30", timeout=30)
    assert r.returncode == 124
    assert b"killed because --timeout 1 s passed" in r.stderr and b"at most 86400" in r.stderr, r.stderr


def test_cp_of_a_local_name_with_a_colon_says_how_to_write_it_and_shows_no_temporary(c, tmp_path):
    (tmp_path / "a:b").write_bytes(b"x")
    r = subprocess.run(
        [*program("mind"), "cp", "a:b", "box:copied"], cwd=tmp_path, env=c.env, capture_output=True, timeout=60
    )
    assert r.returncode == 125, r.stderr  # Hand `a` is unknown: refused
    assert b"for the local file write ./a:b" in r.stderr and b"mindhand-cp-" not in r.stderr, r.stderr
    r = subprocess.run(
        [*program("mind"), "cp", "./a:b", "box:copied"], cwd=tmp_path, env=c.env, capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert (c.tmp / "root-box" / "copied").read_bytes() == b"x"


def test_cp_refused_one_of_its_tools_names_all_four(c, tmp_path):
    cred = tmp_path / "nostat.cred"
    assert (
        c.cli("client", "add", "nostat", "--tools", "put_file,get_file,list_tree", "--out", str(cred)).returncode == 0
    )
    (tmp_path / "f").write_bytes(b"data")
    r = c.cli("cp", "--credential", str(cred), str(tmp_path / "f"), "box:f2")
    assert r.returncode == 125, r.stderr
    assert b"put_file, get_file, stat_file, list_tree" in r.stderr, r.stderr


def test_cp_expands_a_remote_glob_in_the_last_part(c, tmp_path):
    logs = c.tmp / "root-box" / "globs"
    logs.mkdir()
    for name, data in (("a.log", b"A"), ("b.log", b"B"), ("c.txt", b"C"), (".hidden.log", b"H")):
        (logs / name).write_bytes(data)
    dest = tmp_path / "dest"
    dest.mkdir()
    r = c.cli("cp", "box:globs/*.log", str(dest))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["a.log", "b.log"]
    assert (dest / "a.log").read_bytes() == b"A" and (dest / "b.log").read_bytes() == b"B"
    r = c.cli("cp", "box:globs/*.none", str(dest))
    assert r.returncode == 1 and b"box:globs/*.none: no match" in r.stderr, r.stderr
