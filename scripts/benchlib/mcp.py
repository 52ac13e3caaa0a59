"""The `mind mcp` figure (issue 26): what the MCP server adds to a short call. An agent's `tools/call`
of `exec` (`true`) through `mind mcp` over stdio, driven by the official SDK's own client, against
the same exec through the native asyncio client (`MindClient.exec`) to the same Mind and Hand,
interleaved round by round in the same run. Target: p50 at most 3 ms above the native p50.

What the difference holds: the SDK client's JSON-RPC over two pipes, the SDK server's dispatch
(validation of the arguments against the tool's schema, the result's serialization), and what our
tool does beyond `exec` (a followed run, the result shaped for a model).

Registered into `benchlib.figures.FIGURES` on import (bench_suite imports this module).
"""

from __future__ import annotations

import time
from typing import Any

from benchlib.core import Ctx, Row, med, ms, pct, spread, verdict
from benchlib.figures import basic, client, figure, flat, run
from protocol.states import RunState

TARGET_MS = 3.0
TRUE = {"argv": ["true"]}


def delta(x: float) -> str:
    """A difference in ms, signed (a noisy p99 can come out below the reference's)."""
    return f"{'+' if x >= 0 else '-'}{ms(abs(x))} ms"


async def _native(cl: Any, n: int, warm: int) -> list[float]:
    async with await client(cl) as mc:
        for _ in range(warm):
            await mc.exec("bench", "exec", TRUE)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            end = await mc.exec("bench", "exec", TRUE)
            out.append((time.perf_counter() - t0) * 1000)
            if end.state is not RunState.SUCCEEDED:
                raise RuntimeError(f"exec true ended {end.state.value}")
        return out


async def _through_mcp(cl: Any, n: int, warm: int) -> list[float]:
    import json

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from mind.testing.cluster import program

    argv = [*program("mind"), "mcp"]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(cl.env))
    call = {"hand": "bench", "argv": ["true"]}
    async with Client(params, read_timeout_seconds=60) as c:
        for _ in range(warm):
            await c.call_tool("exec", call)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            res = await c.call_tool("exec", call)
            out.append((time.perf_counter() - t0) * 1000)
            if res.is_error:
                raise RuntimeError(f"exec true through mind mcp: {res.content[0].text[:300]}")  # type: ignore[union-attr]
        body = json.loads(res.content[0].text)  # type: ignore[union-attr]
        if (body["state"], body["exit_code"]) != ("succeeded", 0):
            raise RuntimeError(f"exec true through mind mcp answered {body}")
        return out


@figure(
    "mcp",
    "`tools/call` exec `true` through `mind mcp` (stdio, the official SDK client) vs the native client",
    basic=True,
)
def fig_mcp(ctx: Ctx) -> list[Row]:
    try:
        import mcp  # noqa: F401 - only whether the optional SDK is there
    except ImportError:
        ctx.note("mcp", "n/a: the MCP SDK is not installed (pip install 'mindhand[mcp]')")
        return [
            Row(
                "mcp",
                "tools/call exec true p50 ms",
                "",
                "",
                "",
                "n/a (no SDK)",
                "",
                f"<= native + {TARGET_MS:g} ms",
                "n/a",
            )
        ]
    cl = basic(ctx)
    n = 100 if ctx.quick else 500
    ours_r: list[list[float]] = []
    ref_r: list[list[float]] = []
    for _ in range(ctx.rounds):
        ref_r.append(run(_native(cl, n, warm=20), 180))
        ours_r.append(run(_through_mcp(cl, n, warm=20), 180))
    ours, ref = flat(ours_r), flat(ref_r)
    o50, r50, o99, r99 = med(ours), med(ref), pct(ours, 99), pct(ref, 99)
    ctx.note(
        "mcp",
        f"{n} calls a round per side after 20 warm-up, sequential; ours = the SDK's Client.call_tool('exec') "
        f"to `mind mcp` over stdio (the server a child of the client, as an agent runs it); reference = "
        f"MindClient.exec of the same argv; native p99 {ms(r99)} ms",
    )
    return [
        Row(
            "mcp",
            "tools/call exec true p50 ms",
            ms(o50),
            ms(o99),
            spread([med(r) for r in ours_r], ms),
            f"{ms(r50)} (native client p50)",
            delta(o50 - r50),
            f"<= native + {TARGET_MS:g} ms",
            verdict(o50 - r50 <= TARGET_MS),
        ),
        Row(
            "mcp",
            "tools/call exec true p99 ms",
            ms(o99),
            "",
            spread([pct(r, 99) for r in ours_r], ms),
            f"{ms(r99)} (native client p99)",
            delta(o99 - r99),
            "",
            "info",
        ),
    ]
