"""A Hand's task database after a restart, and over time: what the previous run of the Hand left
unfinished becomes `lost`, and rows past their retention are forgotten (DESIGN §7). The rules are
the core's (`hand.core.tasks.orphaned`, `recovered`, `purge_cutoff`), which the simulation drives
too; this is their I/O.

- Hand restart: every `queued`/`running` row becomes `lost` ("hand restarted before completion");
  nothing re-runs; the log stays readable. If a `running` row's process is still alive (same pid
  AND same /proc start time) its process group, orphaned by the crash, is killed: nobody else will
  stop it, and the reason says so.
- Retention: terminal rows that finished more than `retention_s` ago go, with their logs, at open,
  every `PURGE_EVERY_S`, and before each batch of starts is decided (`hand.aio.taskstarts`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from hand.aio.metrics import HandMetrics
from hand.core.rows import Change, TaskRow, Write
from hand.core.tasks import orphaned, purge_cutoff, recovered
from hand.system.process import kill_group, start_time
from hand.system.taskdb import TaskStore
from protocol.audit import AuditEvent

PURGE_EVERY_S = 60.0


async def recover(
    store: TaskStore,
    write: Callable[[Write], Awaitable[Any]],
    *,
    grace: float,
    clock: Callable[[], float],
    log: Any,
    metrics: HandMetrics,
) -> None:
    """Settle every row the previous run of the Hand left unfinished: `lost`, its orphan killed."""
    rows = await asyncio.to_thread(store.unfinished)
    if not rows:
        return
    async with asyncio.TaskGroup() as tg:
        for row in rows:
            tg.create_task(_recover_one(row, store, write, grace, clock, log, metrics))
    log.info("tasks_recovered", lost=len(rows))


async def _recover_one(
    row: TaskRow,
    store: TaskStore,
    write: Callable[[Write], Awaitable[Any]],
    grace: float,
    clock: Callable[[], float],
    log: Any,
    metrics: HandMetrics,
) -> None:
    killed = False
    if row.pid is not None and orphaned(row, start_time(row.pid)):
        await kill_group(row.pid, grace)  # the crashed Hand's tree: nobody else will stop it
        killed = True
    size: int | None
    try:
        size = os.stat(store.log_path(row.task_id)).st_size
    except OSError:
        size = None
    new = await write(Change(row.task_id, recovered(row, killed, size, clock())))
    log.bind(task_id=row.task_id).info(
        AuditEvent.TASK_TERMINAL,
        state=new.state.value,
        reason=new.reason,
        log_bytes=new.log_bytes,
        args_digest=new.args_digest,
        orphan_killed=killed,
    )
    metrics.tasks_finished.labels(new.state.value).inc()


async def purge(store: TaskStore, *, retention_s: float, clock: Callable[[], float], log: Any) -> None:
    """Forget the terminal rows (and logs) past their retention."""
    ids = await asyncio.to_thread(store.purge, purge_cutoff(clock(), retention_s))
    if ids:
        log.info("tasks_purged", count=len(ids))


async def purge_forever(store: TaskStore, *, retention_s: float, clock: Callable[[], float], log: Any) -> None:
    while True:
        await asyncio.sleep(PURGE_EVERY_S)
        try:
            await purge(store, retention_s=retention_s, clock=clock, log=log)
        except Exception:  # try again next time
            log.exception("tasks_purge_failed")
