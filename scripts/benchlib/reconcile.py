"""Reconciliation at scale: seed a Hand's task database directly, read the Mind's `reconcile_done`
log lines, and probe the Mind's responsiveness from outside (a client asking `hands()` every 5 ms).
Used by `scripts/bench reconcile` and `scripts/bench-reconcile`."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from hand.core.rows import TaskRow
from hand.system.taskdb import _COLUMNS, _FIELDS, TaskStore, _to_values
from mind.client.aio import MindClient, load_credential
from protocol.states import TaskState

DIGEST = "ab" * 32


def seed(state_dir: Path, n: int) -> None:
    """`n` finished tasks in the Hand's database, as if it had run them (one transaction)."""
    store = TaskStore(state_dir)
    now = time.time()
    rows = [
        TaskRow(
            task_id=f"t{i:06}",
            tool="exec",
            args_digest=DIGEST,
            binding_digest=DIGEST,
            state=TaskState.SUCCEEDED,
            version=3,
            max_runtime_ms=60_000,
            created_at=now - 100 + i / n,
            started_at=now - 99,
            finished_at=now - 98,
            exit_code=0,
            log_bytes=10,
        )
        for i in range(n)
    ]
    with store._lock:
        store._db.execute("BEGIN")
        store._db.executemany(
            f"INSERT INTO tasks ({_COLUMNS}) VALUES ({', '.join('?' * len(_FIELDS))})", [_to_values(r) for r in rows]
        )
        store._db.execute("COMMIT")
    store.close()


def reconcile_lines(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if '"reconcile_done"' in line:
            out.append(json.loads(line))
    return out


async def probe(url: str, cred_path: Path, stop: asyncio.Event, rtts: list[float], every: float = 0.005) -> None:
    """Ask the Mind for its hands every `every` seconds until `stop`; append each round trip (ms)."""
    async with await MindClient.connect(url, load_credential(cred_path)) as mc:
        while not stop.is_set():
            t0 = time.perf_counter()
            await mc.hands()
            rtts.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(every)


def measure(
    cl, expect_lines: int, start_hand, idle: float = 0.2, timeout: float = 120.0
) -> tuple[dict, list[float], list[float]]:
    """Probe the Mind, start the Hand, wait for the `expect_lines`-th reconcile_done line.
    Returns (that line, RTTs while the Hand connected and reconciled, RTTs in `idle` s before)."""
    busy: list[float] = []
    quiet: list[float] = []

    async def go() -> None:
        stop = asyncio.Event()
        stop_quiet = asyncio.Event()
        q = asyncio.create_task(probe(cl.url, cl.home / "admin.cred", stop_quiet, quiet))
        await asyncio.sleep(idle)
        stop_quiet.set()
        await q
        task = asyncio.create_task(probe(cl.url, cl.home / "admin.cred", stop, busy))
        await asyncio.sleep(0.02)
        start_hand()
        deadline = time.monotonic() + timeout
        try:
            while len(reconcile_lines(cl.tmp / "mind.log")) < expect_lines:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reconciliation did not finish within {timeout} s")
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await task

    asyncio.run(go())
    return reconcile_lines(cl.tmp / "mind.log")[expect_lines - 1], busy, quiet
