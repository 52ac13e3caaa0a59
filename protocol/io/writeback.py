"""A copied file goes to the disk as it is written, and leaves the page cache once it is there; a file
read for a copy leaves the page cache as it found it.

Both ends of `mind cp` write a part file and fsync it before the rename (DESIGN §11 Files). Left to
the kernel, a gigabyte's dirty pages pile up in the page cache: the writer is throttled when they
pass the dirty limits, the final fsync waits for whatever is left, and every page is a new one the
kernel must find (on a virtual machine whose free memory goes back to its host, a fault there too).
`Writeback` instead, every `STEP` written:
- starts the disk writing that step (`sync_file_range(SYNC_FILE_RANGE_WRITE)`: it returns at once);
- drops from the page cache the step written `LAG` steps before (`posix_fadvise(DONTNEED)`), by
  then on the disk; a page still dirty or under writeback is left where it is, so this never waits
  and never loses a byte: the fsync that ends the file still writes whatever is left.

So a copy holds a few steps of the file in memory, not all of it, reuses the same pages, and its
fsync finds little to do. What it gives up: the copied file is not in the page cache afterwards (a
read of it right after the copy goes to the disk), as with `dd oflag=nocache`. A copy of a tree is
not written through here: its many small files end with one `syncfs` (`protocol.io.tree`).

The reading end of a copy (`DropBehind`): a file that was not in the page cache when the copy
opened it (its first, middle and last pages looked up with `RWF_NOWAIT`, which fails rather than
wait for the disk) has the pages the copy read dropped behind it, every `STEP`; a file that was
cached is left alone. Reading a gigabyte that nobody had cached otherwise filled the cache with it,
page by new page; pages someone else uses are never dropped.

Linux only (`sync_file_range(2)` through the C library, `RWF_NOWAIT`); elsewhere nothing is done
and the fsync does it all, as before.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

STEP = 8 << 20
"""Bytes written between two writebacks started: the calls cost ~10 us each, a step's writing
far more."""
LAG = 2
"""Steps between a step's writeback started and its pages dropped: time for the disk to finish it
(a page not yet clean is simply kept)."""

_SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_START = _sync_file_range()


class Writeback:
    """The writeback of one file written sequentially from `start` on: `wrote(pos)` after each
    write (see the module's docstring)."""

    __slots__ = ("fd", "started", "steps")

    def __init__(self, fd: int, start: int) -> None:
        self.fd = fd
        self.started = start
        self.steps: list[tuple[int, int]] = []
        """The steps whose writeback was started and whose pages are still kept (at most `LAG`)."""

    def wrote(self, pos: int) -> None:
        if _START is None or pos - self.started < STEP:
            return
        _START(self.fd, self.started, pos - self.started, _SYNC_FILE_RANGE_WRITE)
        self.steps.append((self.started, pos - self.started))
        self.started = pos
        if len(self.steps) > LAG:
            offset, length = self.steps.pop(0)
            try:
                os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass  # advice only: the file is written either way


def was_cached(fd: int, size: int) -> bool:
    """Whether the file `fd` (of `size` bytes) is in the page cache now, judged by its first,
    middle and last pages (a read with `RWF_NOWAIT` fails with EAGAIN for a page that is not).
    True where that cannot be asked (the cache is then left alone)."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    if nowait is None or size <= 0:
        return True
    probe = bytearray(1)
    for offset in {0, size // 2, size - 1}:
        try:
            os.preadv(fd, [probe], offset, nowait)
        except BlockingIOError:
            return False
        except OSError:
            return True  # a filesystem that does not answer (EOPNOTSUPP): leave its cache alone
    return True


class DropBehind:
    """The pages of a file read sequentially from `start` on, dropped from the page cache every
    `STEP` read (`read(pos)` after each read): for a file that was not cached (`was_cached`)."""

    __slots__ = ("fd", "dropped")

    def __init__(self, fd: int, start: int) -> None:
        self.fd = fd
        self.dropped = start

    def read(self, pos: int) -> None:
        if pos - self.dropped < STEP:
            return
        try:
            os.posix_fadvise(self.fd, self.dropped, pos - self.dropped, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass  # advice only
        self.dropped = pos
