"""Every process group the toolkit starts, remembered until it is stopped, and killed whatever
happened: at interpreter exit (an interrupted test run, Ctrl-C), on SIGTERM and SIGHUP (what CI
sends at a timeout, and a closed terminal; issue 23, attack 10: the Mind, the Hand and the proxy
kept running, orphaned), and, on Linux, when the process that started them dies by any means
(`PR_SET_PDEATHSIG`: the kernel kills the child, so even a SIGKILL of pytest leaves nothing).

The processes run in sessions of their own (`start_new_session=True`), so a kill of the group takes
their children too.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_LIVE: dict[int, subprocess.Popen[Any]] = {}
PR_SET_PDEATHSIG = 1
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_installed = False


def track(p: subprocess.Popen[Any]) -> None:
    """Remember a process started with `start_new_session=True`."""
    _LIVE[p.pid] = p
    _install_handlers()


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


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the parent thread dies."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the prctl took: do not outlive it
        os._exit(1)


def child_preexec() -> Callable[[], None] | None:
    """The `preexec_fn` for a toolkit process: die with the parent, where the OS allows. Only from
    the main thread: the kernel's "parent" is the thread that forked, and a worker thread (an
    executor's) may end long before the test does."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    return _die_with_parent


def _install_handlers() -> None:
    """On the first process: SIGTERM and SIGHUP kill every group, then do what they did before
    (a Python handler is called; the default ends the interpreter by the same signal). Only from
    the main thread (signals can be set nowhere else), and never over a handler that ignores them."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    for sig in _SIGNALS:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue
        signal.signal(sig, _handler(sig, previous))


def _handler(sig: signal.Signals, previous: Any) -> Callable[[int, FrameType | None], None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        kill_all()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)

    return handle


atexit.register(kill_all)
