# docs/examples/test_deploy_reports_lost.py
"""My deploy script reports `lost`, not success, when the Hand drops mid-run."""

import pytest

from mind.client.aio import MindClient


async def deploy(client: MindClient, hand: str) -> str:
    """The code under test: run the deploy step on `hand` and say how it went."""
    end = await client.exec(hand, "shell", {"command": "sleep 30 && echo deployed"}, timeout=60)
    return "deployed" if end.state == "succeeded" else str(end.state)


@pytest.mark.asyncio
async def test_deploy_reports_lost_when_the_hand_drops_mid_run(mind_client, hand, faultproxy):
    faultproxy.refuse()  # once the link is gone, the Hand cannot come back
    faultproxy.frame("cut", "started", direction="up", after=True)  # cut as soon as the run has started
    assert await deploy(mind_client, "box") == "lost"
