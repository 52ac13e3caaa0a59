# docs/examples/test_agent_retries_by_id.py
"""My agent retries a task start by id after a cut, and the task runs once."""

import asyncio

import pytest

from mind.client.aio import ClientError, MindClient


async def start_once(client: MindClient, hand: str, task_id: str, command: str) -> str:
    """The code under test: start a task, retrying with the same id until the Mind knows it."""
    for _ in range(100):
        try:
            res = await client.task_start(hand, "shell", {"command": command}, task_id=task_id)
            if res.outcome in ("accepted", "duplicate"):
                return res.outcome
        except ClientError:
            pass  # the Mind or the Hand is unreachable: try again
        await asyncio.sleep(0.2)
    raise RuntimeError(f"task {task_id} never started")


@pytest.mark.asyncio
async def test_a_start_retried_after_a_cut_runs_once(mind_client, hand, faultproxy):
    # The Hand commits the start, then the link is cut before its `accepted` reaches the Mind.
    faultproxy.frame("cut", "accepted", direction="up")
    await start_once(mind_client, "box", "deploy-42", "echo ran >> runs.txt")
    for _ in range(200):
        if (await mind_client.task_get("deploy-42")).state == "succeeded":
            break
        await asyncio.sleep(0.05)
    assert (hand.root / "runs.txt").read_text() == "ran\n"
