"""File tools act as the run's user (DESIGN §13): threads whose filesystem identity is `--run-as`.

A Hand running as root with `--run-as` must not read, list or write with root's rights: a client's
`read_file` of a root-only file has to fail the way it would for the user, and a file it writes has
to belong to that user. Linux keeps a filesystem uid and gid per thread (`setfsuid`, `setfsgid`), and
the kernel checks file access against them, not the effective ids; changing the fsuid from 0 drops
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID and CAP_CHOWN from the thread's
effective set. So a small pool of threads switches ONCE, when it starts, to the user's fsuid, fsgid
and supplementary groups, and never back: every file call of a run-as Hand runs there.

Why threads and not a helper process: a thread hop costs tens of microseconds, a fork or a pipe
round trip with serialisation costs more, and nothing has to be restored (a thread that never
switches back cannot be left half-switched by an exception). The supplementary groups are set with
the raw `setgroups` system call, which, unlike glibc's wrapper, changes only the calling thread.
Every call checks its thread's fsuid before doing anything (one system call), so a thread that is
not the user never touches a file.

One consequence: these threads see the filesystem as the user does, so they cannot import a Python
module the user cannot read (an interpreter under `/root`, say). File calls use only modules imported
at start (`os`, `stat`, `heapq`, `secrets`), and text is encoded as UTF-8 (always loaded).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar

from hand.system.sandbox import RunAs
from protocol.errors import MindhandError

T = TypeVar("T")

_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
"""`setgroups` (32-bit gid_t) per architecture; not in Python's `os`, which only has the process-wide one."""
_QUERY = ctypes.c_uint(0xFFFFFFFF)  # an invalid id: setfs[ug]id changes nothing and returns the current value
WORKERS = 4


class NotThisUser(MindhandError, OSError):
    """A file call found its thread not switched to the run's user: refuse rather than act as root."""


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _fsuid() -> int:
    return int(_libc().setfsuid(_QUERY))


def _fsgid() -> int:
    return int(_libc().setfsgid(_QUERY))


def become(run_as: RunAs) -> None:
    """Switch the CALLING thread's filesystem identity to `run_as` (groups, then gid, then uid: the
    uid last, since it drops the capabilities the others need). Raises OSError if any step fails."""
    libc = _libc()
    number = _SYS_SETGROUPS.get(platform.machine())
    if number is None:
        raise OSError(f"file tools as another user are not supported on {platform.machine()}")
    gids = (ctypes.c_uint * max(1, len(run_as.groups)))(*run_as.groups)
    if libc.syscall(ctypes.c_long(number), ctypes.c_size_t(len(run_as.groups)), gids) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setgroups: {os.strerror(err)}")
    libc.setfsgid(ctypes.c_uint(run_as.gid))
    libc.setfsuid(ctypes.c_uint(run_as.uid))
    if _fsgid() != run_as.gid or _fsuid() != run_as.uid:
        raise OSError(f"could not switch this thread to user {run_as.name!r}")


def thread_groups() -> tuple[int, ...]:
    """The calling thread's supplementary groups, as the kernel has them (for tests and checks)."""
    with open("/proc/thread-self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("Groups:"):
                return tuple(sorted(int(g) for g in line.split()[1:]))
    return ()


class AsUser:
    """Runs blocking file calls on threads that act as `run_as`."""

    def __init__(self, run_as: RunAs) -> None:
        self.run_as = run_as
        self.executor: Executor = ThreadPoolExecutor(
            max_workers=WORKERS, thread_name_prefix=f"files-as-{run_as.uid}", initializer=become, initargs=(run_as,)
        )

    def wrap(self, call: Callable[[], T]) -> Callable[[], T]:
        """`call`, refusing to run on a thread whose fsuid is not the user's."""
        uid = self.run_as.uid

        def checked() -> T:
            if _fsuid() != uid:
                raise NotThisUser(f"this thread does not act as uid {uid}; refusing the file call")
            return call()

        return checked


@functools.cache
def as_user(run_as: RunAs) -> AsUser:
    """One pool per user for the life of the process (a Hand has one `--run-as`)."""
    return AsUser(run_as)
