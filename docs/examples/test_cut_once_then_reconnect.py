# docs/examples/test_cut_once_then_reconnect.py
"""My agent rides out one cut link: the run in flight goes on (the Hand keeps it and presents it
again on its new connection, within the Mind's resume window) and ends with its real outcome, and the
next command runs (a frame rule cuts the live connection once, not every reconnect)."""

import pytest


@pytest.mark.asyncio
async def test_one_cut_then_the_hand_is_back(mind_client, hand, faultproxy):
    faultproxy.frame("cut", "started", direction="up", after=True)  # the live connection, once
    end = await mind_client.exec("box", "exec", {"argv": ["sh", "-c", "sleep 2; echo done; exit 3"]})
    assert (end.state, end.exit_code) == ("failed", 3)  # the command's own outcome, through the cut
    assert end.stdout.data == b"done\n"
    end = await mind_client.exec("box", "exec", {"argv": ["echo", "back"]})
    assert end.stdout.data == b"back\n"  # the reconnect was not cut: the rule was for one connection
