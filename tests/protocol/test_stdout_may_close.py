"""`protocol.io.pipes.stdout_may_close`: a reader of stdout that went away (`| head`) ends a command
as it ends `ls` (quiet, 141); a broken pipe anywhere else is still an error with its traceback."""

from __future__ import annotations

import io
import os
import sys
from contextlib import contextmanager

import pytest

from protocol.io.pipes import EXIT_SIGPIPE, reader_gone, stdout_may_close


@contextmanager
def gone_stdout():
    """sys.stdout on a pipe whose reader has left (set in the test's body: pytest's capture sets
    sys.stdout again between a fixture and the test)."""
    r, w = os.pipe()
    os.close(r)
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(w, "w")), encoding="utf-8")
    saved, sys.stdout = sys.stdout, out
    try:
        yield out
    finally:
        sys.stdout = saved
        out.close()


@contextmanager
def file_stdout(path):
    saved = sys.stdout
    with open(path, "w") as f:
        sys.stdout = f
        try:
            yield f
        finally:
            sys.stdout = saved


def test_a_gone_reader_is_seen_and_a_live_one_is_not():
    r, w = os.pipe()
    try:
        assert not reader_gone(w)
        os.close(r)
        assert reader_gone(w)
    finally:
        os.close(w)


def test_output_to_a_gone_reader_ends_with_141_and_stdout_on_devnull():
    with gone_stdout() as out:
        with pytest.raises(SystemExit) as exc:
            stdout_may_close(lambda: print("more than the reader wanted"))  # buffered: the flush meets EPIPE
        assert exc.value.code == EXIT_SIGPIPE == 141
        print("after", file=out)
        out.flush()  # on /dev/null now: the interpreter's own flush at exit fails no more


def test_an_exit_after_printing_is_flushed_inside_and_keeps_141():
    def command() -> None:
        print("listing")
        raise SystemExit(0)

    with gone_stdout(), pytest.raises(SystemExit) as exc:
        stdout_may_close(command)
    assert exc.value.code == EXIT_SIGPIPE


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback(tmp_path):
    """A socket or a child's pipe that breaks is a real error, not `| head`."""

    def command() -> None:
        raise BrokenPipeError(32, "Broken pipe (a socket)")

    with file_stdout(tmp_path / "out"), pytest.raises(BrokenPipeError):
        stdout_may_close(command)


def test_a_command_that_returns_gets_its_value_and_its_output_flushed(tmp_path):
    with file_stdout(tmp_path / "out"):
        assert stdout_may_close(lambda: print("x") or 7) == 7
        assert (tmp_path / "out").read_text() == "x\n"
