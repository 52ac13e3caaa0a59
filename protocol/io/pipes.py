"""Pipes sized to a stream's window (issue 25 item 2), for both ends of a stream.

A Linux pipe holds 64 KiB by default, so whoever reads one gets at most 64 KiB a read: a 256 KiB
chunk then costs four reads, four frames and four trips through every process on the way.
`F_SETPIPE_SZ` grows a pipe up to /proc/sys/fs/pipe-max-size (1 MiB by default) for anyone, so
the Hand grows the pipes of a streamed run's child and the CLI grows its own stdin when it is a
pipe. Best effort: a user past /proc/sys/fs/pipe-user-pages-soft is refused and keeps 64 KiB.
"""

from __future__ import annotations

import fcntl

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
