# docs/examples/test_cut_once_then_reconnect.py
"""My agent rides out one cut link: the run in flight is `lost`, the Hand reconnects by itself, and
the next command runs (a frame rule cuts the live connection once, not every reconnect)."""

import asyncio

import pytest


@pytest.mark.asyncio
async def test_one_cut_then_the_hand_is_back(mind_client, hand, faultproxy):
    faultproxy.frame("cut", "started", direction="up", after=True)  # the live connection, once
    end = await mind_client.exec("box", "exec", {"argv": ["sleep", "5"]})
    assert end.state == "lost"  # nobody can know how it ended: the link went away mid-run
    for _ in range(100):  # the Hand reconnects by itself (backoff); meanwhile runs are refused
        end = await mind_client.exec("box", "exec", {"argv": ["echo", "back"]})
        if end.state == "succeeded":
            break
        await asyncio.sleep(0.1)
    assert end.stdout.data == b"back\n"  # the reconnect was not cut: the rule was for one connection
