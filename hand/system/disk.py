"""The Hand's state disk as its admission reads it: the bytes free there now (`statvfs`).

The state dir holds what a run or task writes before anyone hears of it (the audit file, the task
database, the task logs); `hand.core.runs.refusal` refuses a start when too little is free. Asked
at every admission (a `statvfs` costs a couple of microseconds): a disk filled a moment ago is
refused at once, a disk freed a moment ago is used at once.
"""

from __future__ import annotations

import os
from pathlib import Path


def free_bytes(path: Path) -> int | None:
    """Bytes this process may still write on the filesystem of `path`: the blocks a process of its
    uid may use (root may use the blocks the filesystem reserves for it, as its writes will). None
    when it cannot be told (the directory is gone): a start is then not refused for it, and its
    writes say what is wrong."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize
