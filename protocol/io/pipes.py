"""Pipes sized to a stream's window (issue 25 item 2), for both ends of a stream.

A Linux pipe holds 64 KiB by default, so whoever reads one gets at most 64 KiB a read: a 256 KiB
chunk then costs four reads, four frames and four trips through every process on the way.
`F_SETPIPE_SZ` grows a pipe up to /proc/sys/fs/pipe-max-size (1 MiB by default) for anyone, so
the Hand grows the pipes of a streamed run's child and the CLI grows its own stdin when it is a
pipe. Best effort: a user past /proc/sys/fs/pipe-user-pages-soft is refused and keeps 64 KiB.

And the other end of a pipe as a command line meets it: a reader of our stdout that goes away
(`mind runs | head`). Python ignores SIGPIPE, so the next write raises BrokenPipeError, which would
end any command with a traceback; `stdout_may_close` turns it, for both programs' entry points, into
what `ls | head` does: no word, and the status of a command killed by SIGPIPE.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

EXIT_SIGPIPE = 128 + signal.SIGPIPE
"""141: how a shell reports `ls` in `ls | head` once head has gone (SIGPIPE killed it), so `set -o
pipefail` and `${PIPESTATUS[0]}` see the same of `mind runs | head`. Not 0: the output was cut, and a
script that checks must be able to tell; not 1: that one says the command failed."""

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def pipe_max_size() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def grow_pipe(fd: int, size: int) -> int:
    """Make pipe `fd` hold `size` bytes (at most pipe-max-size); the size it has now, 0 if it
    could not be changed (not a pipe, or the user's pipe budget is spent)."""
    try:
        return fcntl.fcntl(fd, F_SETPIPE_SZ, min(size, pipe_max_size()))
    except (OSError, ValueError):
        return 0


def reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe or socket nobody reads any more (Linux polls such a pipe's write end
    as POLLERR): a BrokenPipeError is then ours to take quietly; from anywhere else (a socket to the
    Mind, a child's pipe) it is a real error and keeps its traceback."""
    try:
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def stdout_may_close(main: Callable[[], T]) -> T:
    """`main()`, its output flushed before it returns or exits, and a reader of stdout that went
    away (`| head`) taken as Python's documentation says to (stdout pointed at /dev/null, so the
    interpreter's own flush at exit fails no more) and as `ls` ends: quietly, EXIT_SIGPIPE. Once, at
    the entry point, so every command that prints, now or later, behaves the same."""
    try:
        try:
            result = main()
        except SystemExit:
            _flush()
            raise
        _flush()
        return result
    except BrokenPipeError:
        if sys.stdout is None or not reader_gone(sys.stdout.fileno()):
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise SystemExit(EXIT_SIGPIPE) from None


def _flush() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()
