"""A race the deterministic simulation found (`tests/sim`, variant `hand-as-shipped`): a start
still in admission (its row not yet committed) when its connection drops is missing from the
inventory the next connection's reconciliation reads, so the Mind declares the task `lost`
("unknown to hand") while the Hand goes on to run it.

The fix: `TaskManager.inventory` reads the page under the admission lock, so every admission
already under way is committed, and listed, first.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from hand.aio.tasks import TaskManager
from protocol.messages import Background, Rpc, TaskInventory

pytestmark = pytest.mark.slow  # the admitted task may start as a real process before the shutdown ends it


async def test_a_start_still_in_admission_is_in_the_next_inventory(tmp_path):
    jobs: list[asyncio.Task] = []

    def spawn(coro):
        jobs.append(asyncio.get_running_loop().create_task(coro))
        return jobs[-1]

    (tmp_path / "root").mkdir()
    m = TaskManager(state_dir=tmp_path / "state", root=tmp_path / "root", spawn=spawn, kill_grace=0.5)
    await m.open()
    entered, release = threading.Event(), threading.Event()
    write_many = m.store.write_many

    def slow_commit(writes):  # a disk that stalls on the (group) commit of the new row
        entered.set()
        release.wait(10)
        return write_many(writes)

    m.store.write_many = slow_commit  # type: ignore[method-assign]
    sent: list = []
    start = asyncio.create_task(
        m.on_start(
            Rpc(
                run_id="t1",
                tool="shell",
                args={"command": "true"},
                timeout_ms=10_000,
                background=Background(max_runtime_ms=60_000),
            ),
            sent.append,
        )
    )
    assert await asyncio.to_thread(entered.wait, 10)  # admission is under way; its connection drops here
    inventory = asyncio.create_task(m.inventory(TaskInventory()))  # the next connection's reconciliation
    await asyncio.wait({inventory}, timeout=0.5)  # bounded: with the fix it waits for the admission
    release.set()
    page = await inventory
    await start
    try:
        assert [t.task_id for t in page.tasks] == ["t1"]
    finally:
        await m.shutdown()
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
