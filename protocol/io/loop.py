"""Event-loop plumbing both daemons run: the lag probe.

A stalled loop delays every run's output and every keepalive; sampling it every 10 ms (a ticker's
250 ms would miss short stalls) is how an operator sees it on `/metrics`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

LAG_PERIOD_S = 0.01


async def probe_lag(observe: Callable[[float], None], period: float = LAG_PERIOD_S) -> None:
    """Report how late each `period`-long sleep woke up, forever (cancel it to stop)."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(period)
        observe(max(0.0, loop.time() - t0 - period))
