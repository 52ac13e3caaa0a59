"""The Hand keeps the memory of its large buffers between runs instead of faulting it in afresh.

A `read_file` of 4 MiB passes through the Hand as several buffers of that size at once: the bytes
read, the encoded frame, its masked copy (a client's frames are masked). glibc serves a buffer that
large with `mmap` until its adaptive threshold has seen one freed, and from then on from its heap,
which it trims from the top whenever more than twice that threshold is free there: either way the
next run's buffers come from pages the kernel must find, zero and map again. Measured (perf on the
Hand, 200 sequential reads of 4 MiB): page faults and zeroing were a third of the Hand's CPU, and
the Hand took 12.6-14.3 ms of CPU per read. With the thresholds fixed here it took 5.4-6.1 ms, and a
read's p50 through a Mind went from 23-30 ms to 14-16 ms.

- `MMAP_THRESHOLD`: buffers up to this size come from the heap (a frame is at most 8 MiB, and a
  run's buffers are freed when it answers).
- `TRIM_THRESHOLD`: the heap gives its top back only when more than this is free there. That is
  what the Hand may keep after a burst of large runs, bounded, instead of paying faults for each.

glibc only (`mallopt` through the C library); elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes

MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 32 << 20
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
