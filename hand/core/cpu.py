"""How a CPU budget shows in an outcome: the reason text, and whether the kernel's own RLIMIT_CPU
(rather than us, or someone's `kill -9`) ended a process. Pure, so the task rules can use it."""

from __future__ import annotations

import signal

CPU_SECONDS = "cpu_seconds"
"""The budget kind a run's or a task's CPU seconds are reserved under (`protocol.control.Budget`)."""


def cpu_exhausted(limit: int) -> str:
    """The reason of a run or task whose tree spent its CPU budget."""
    return f"cpu budget of {limit} s exhausted"


def kernel_cpu_kill(killed: bool, sig: int | None, cpu_limit: int | None, used: float) -> bool:
    """Did the kernel end the main process for its RLIMIT_CPU, rather than us or anyone else?
    SIGXCPU (the soft limit) is unambiguous. A SIGKILL is the hard limit only if the tree had spent
    about its budget (the backstop sits above it, and the poll lags by at most one interval): an
    OOM kill or someone's `kill -9` of a run that was far from its budget is not a budget."""
    if cpu_limit is None or killed or sig is None:
        return False
    return sig == signal.SIGXCPU or (sig == signal.SIGKILL and used >= cpu_limit - 1)
