# docs/examples/test_service_sees_stale.py
"""My service sees `stale` while the Hand is offline, and fresh state once it is back."""

import asyncio

import pytest

from mind.client.aio import MindClient


async def task_health(client: MindClient, task_id: str) -> str:
    """The code under test: what a dashboard shows for a task."""
    view = await client.task_get(task_id)
    return "stale" if view.stale else str(view.state)


async def eventually(what, want: str, timeout: float = 20.0) -> None:
    """Poll `what()` until it answers `want` (a test waits with a deadline, never a fixed sleep)."""
    async with asyncio.timeout(timeout):
        while True:
            if await what() == want:
                return
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_service_sees_stale_while_the_hand_is_offline(mind_client, hand, faultproxy):
    await mind_client.task_start("box", "shell", {"command": "sleep 60"}, task_id="long-1")
    await eventually(lambda: task_health(mind_client, "long-1"), "running")
    faultproxy.partition()  # every connection reset, new ones refused: the Hand is offline
    await eventually(lambda: task_health(mind_client, "long-1"), "stale")
    faultproxy.accept()  # the Hand reconnects by itself; the Mind reconciles
    await eventually(lambda: task_health(mind_client, "long-1"), "running")
