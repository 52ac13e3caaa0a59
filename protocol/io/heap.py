"""The C library's heap under a daemon's large buffers: kept between uses, given back once a second.

A 4 MiB `read_file` answer, a stream's 256 KiB frames, a TLS record buffer: both daemons make and
free large buffers all the time. Two settings of glibc's, and one call, decide what that costs.

- **Kept between uses** (`keep_large_buffers`, at each daemon's start). glibc serves a buffer that
  large with `mmap` until its adaptive threshold has seen one freed, then from its heap, which it
  trims from the top whenever more than twice that threshold is free there: either way the next
  buffer came from pages the kernel had to find, zero and map again. Measured on the Hand (perf,
  200 sequential reads of 4 MiB): page faults and zeroing were a third of its CPU, 12.4-13.5 ms per
  read, against 4.3-5.1 ms with the thresholds fixed here; on the Mind over `wss://`, 157 faults per
  MiB of a stream (60 % of its pages), none with them. Buffers up to `MMAP_THRESHOLD` come from the
  heap, and its top is given back only past `TRIM_THRESHOLD` free.
- **Given back once a second** (`trim`, the Mind's ticker, after a large frame). A heap with small
  long-lived objects between freed buffers is never trimmed from the top: measured, 2,000 reads of
  4 MiB left the Mind 21 MiB larger than 2,000 runs of `true` (4 MiB with the trim). `malloc_trim`
  returns the free pages wherever they are (about 0.1 ms): what the Mind holds then is what it
  retains, metadata. At most once a second, so a stream of large frames pays for it little.

Elsewhere than glibc there are no such calls and this does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

LARGE_FRAME = 1 << 20
"""A received frame at least this large makes the ticker trim the heap."""
TRIM_INTERVAL_S = 1.0
"""At most one trim a second: pages given back are faulted in again when the next large frame
comes, so trimming during a stream of them costs a little, and once a second keeps that small."""


MMAP_THRESHOLD = 16 << 20
"""Buffers up to this come from the heap (a frame is at most 8 MiB)."""
TRIM_THRESHOLD = 32 << 20
"""The heap's top is given back by itself only when more than this is free there."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_large_buffers() -> bool:
    """Fix glibc's thresholds (see the module's docstring); False where the C library has none."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # the C library the process runs with
    except OSError:
        return None


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
