"""Every process group the toolkit starts, remembered until it is stopped, and killed at interpreter
exit whatever happened: an interrupted test run (Ctrl-C) leaves no Mind, Hand or proxy behind.

The processes run in sessions of their own (`start_new_session=True`), so a kill of the group takes
their children too. Only a SIGKILL of the interpreter itself escapes this.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
from typing import Any

_LIVE: dict[int, subprocess.Popen[Any]] = {}


def track(p: subprocess.Popen[Any]) -> None:
    """Remember a process started with `start_new_session=True`."""
    _LIVE[p.pid] = p


def forget(p: subprocess.Popen[Any]) -> None:
    _LIVE.pop(p.pid, None)


def kill_all() -> None:
    """SIGKILL every remembered process group and reap it (bounded)."""
    for pid, p in list(_LIVE.items()):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _LIVE.pop(pid, None)


atexit.register(kill_all)
