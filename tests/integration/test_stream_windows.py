"""A client's stream budget counts each streamed run at the window it asked (`Streams.window`), and
the Mind refuses a window over its cap: before, every stream was counted at the 2 MiB default, so a
client asking 64 MiB windows could hold 32 times its budget in the Mind. Real Mind and Hand
processes; the requests are sent frame by frame, as a client asking large windows would."""

from __future__ import annotations

import asyncio

import pytest
from support.rawpeer import handshake

from mind.client.aio import load_credential
from mind.core.budgets import STREAM_BUDGET_BYTES, STREAM_WINDOW_CAP
from mind.testing.cluster import running
from protocol.codes import RejectCode
from protocol.envelope import decode
from protocol.messages import Exec, RunEnd, RunUpdate, Streams

pytestmark = pytest.mark.slow  # a real Mind and Hand


def sleeper(window: int) -> Exec:
    return Exec(
        hand="box",
        tool="exec",
        args={"argv": ["sleep", "30"]},
        timeout_ms=60_000,
        streams=Streams(window=window),
        watch=False,
    )


async def verdicts(ws, ch, reqs: dict[str, Exec]) -> dict[str, object]:
    """Each request's verdict: `admitted` (sent on to the Hand, no end within a second: a `sleep
    30` that was refused ends at once) or its `run_end`'s reject code and reason."""
    for rid, req in reqs.items():
        await ws.send(ch.stamp(req, rid))
    out: dict[str, object] = {}
    try:
        async with asyncio.timeout(1.0 if len(reqs) > 1 else 3.0):
            while True:
                env = decode(await ws.recv())
                if env.id not in reqs:
                    continue
                if isinstance(env.msg, RunUpdate) and env.id not in out:
                    out[env.id] = "admitted"
                elif isinstance(env.msg, RunEnd):
                    out[env.id] = (env.msg.reject_code, env.msg.reason)
    except TimeoutError:
        pass
    return out


async def test_the_budget_counts_the_asked_window_and_the_cap_refuses_a_larger_one(tmp_path):
    with running(tmp_path) as cl:
        path = cl.tmp / "wide.cred"
        assert cl.cli("client", "add", "wide", "--out", str(path)).returncode == 0
        ws, ch = await handshake(cl.url, load_credential(path))
        try:
            # over the cap: refused at once, the cap named
            over = await verdicts(ws, ch, {"over": sleeper(64 << 20)})
            code, why = over["over"]  # type: ignore[misc]
            assert code == RejectCode.QUOTA_EXCEEDED and "cap of 32 MiB" in str(why), over
            # at the cap a run holds two 32 MiB windows: the budget (256 MiB) holds three of them and
            # a run at the default window (4 MiB); a fourth at the cap no longer fits (counted at
            # the 2 MiB default, as before, it was admitted: 4 MiB a run)
            fits = STREAM_BUDGET_BYTES // (2 * STREAM_WINDOW_CAP) - 1
            wide = {f"w{i}": sleeper(STREAM_WINDOW_CAP) for i in range(fits)}
            wide["small"] = sleeper(2 << 20)
            got = await verdicts(ws, ch, wide)
            assert got == dict.fromkeys(wide, "admitted"), got
            last = await verdicts(ws, ch, {"last": sleeper(STREAM_WINDOW_CAP)})
            code, why = last["last"]  # type: ignore[misc]
            assert code == RejectCode.QUOTA_EXCEEDED and "budget 256 MiB" in str(why), last
        finally:
            await ws.close()
