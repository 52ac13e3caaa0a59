"""Giving the memory of large frames back to the system once they are gone.

The Mind relays payloads it does not keep (a `read_file` result is up to 4 MiB, and it passes
through as several buffers: the frame, the decoded value, the encoded reply). glibc serves such
buffers from its heap once its mmap threshold has adapted to them, and a heap with small long-lived
objects between the freed buffers is never trimmed from the top: measured, 2,000 reads of 4 MiB
left the Mind 21 MiB larger than 2,000 runs of `true` (4 MiB with this module). `malloc_trim`
returns the free pages wherever they are (about 0.1 ms), so the daemon calls it, at most once a
second, after it has received a large frame: what the Mind holds then is what it retains, metadata.
Elsewhere than glibc there is no such call and this does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

LARGE_FRAME = 1 << 20
"""A received frame at least this large makes the ticker trim the heap."""
TRIM_INTERVAL_S = 1.0
"""At most one trim a second: pages given back are faulted in again when the next large frame
comes, so trimming during a stream of them costs a little, and once a second keeps that small."""


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
