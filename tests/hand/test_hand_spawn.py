"""A command that cannot start ends as a shell says: 127 not found, 126 not executable, with the
OS's message; anything that is not the program's own `execve` failing keeps no exit code."""

from __future__ import annotations

import errno
import os

import pytest
from test_hand_runs import Hand

from hand.core.spawn import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, spawn_failure
from hand.core.tasks import not_started
from protocol.states import RunState, TaskState


def test_not_found_is_127_and_every_other_exec_failure_126_with_the_os_message():
    """`subprocess` names argv[0] as the failing file when `execve` itself failed."""
    f = spawn_failure(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "no-such"), "no-such")
    assert (f.exit_code, f.error) == (EXIT_NOT_FOUND, "cannot start no-such: No such file or directory")
    assert f.reason == "command not found (exit status 127)"
    for code in (errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.ELOOP, errno.ETXTBSY):
        f = spawn_failure(OSError(code, os.strerror(code), "./x"), "./x")
        assert f.exit_code == EXIT_NOT_EXECUTABLE and f.error == f"cannot start ./x: {os.strerror(code)}"
        assert f.reason == "command not executable (exit status 126)"


def test_a_failure_before_exec_is_not_the_programs_exit_status():
    cwd = spawn_failure(FileNotFoundError(errno.ENOENT, "No such file or directory", "/gone"), "ls")
    before = spawn_failure(PermissionError(errno.EPERM, "Operation not permitted"), "ls")  # user switch
    sandbox = spawn_failure(OSError("the sandbox could not be set up (boom)"), "ls")
    for f in (cwd, before, sandbox):
        assert f.exit_code is None and f.reason == "tool failed" and f.error.startswith("cannot start ls: ")
    assert sandbox.error == "cannot start ls: the sandbox could not be set up (boom)"


def test_a_task_that_could_not_start_records_the_same_code():
    e = not_started(spawn_failure(FileNotFoundError(errno.ENOENT, "No such file or directory", "nope"), "nope"))
    assert (e.state, e.exit_code, e.reason) == (TaskState.FAILED, 127, "command not found (exit status 127)")
    assert e.error == "cannot start nope: No such file or directory"


@pytest.fixture
async def hand(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    h = Hand(root)
    yield h
    await h.close()


@pytest.mark.slow
async def test_runs_that_cannot_start_end_127_and_126(hand):
    (hand.root / "plain.sh").write_text("#!/bin/sh\necho hi\n")  # not executable
    (hand.root / "dir").mkdir()
    cases = [
        (["no-such-program-xyz"], 127, "No such file or directory"),
        (["./plain.sh"], 126, "Permission denied"),
        (["./dir"], 126, "Permission denied"),
        (["./plain.sh/x"], 126, "Not a directory"),
    ]
    for argv, code, message in cases:
        result = await hand.wait(hand.rpc("exec", {"argv": argv}))
        assert result.state is RunState.FAILED and result.exit_code == code, (argv, result)
        assert result.error == f"cannot start {argv[0]}: {message}", result.error
    ok = await hand.wait(hand.rpc("shell", {"command": "exit 127"}))  # the program's own 127 stays its own
    assert ok.exit_code == 127 and ok.error is None and ok.reason == "exit status 127"
