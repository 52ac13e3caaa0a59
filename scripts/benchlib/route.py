"""Calls through the other Mind node vs through the Hand's own node (issue 27 item 4): the
measuring loop shared by `scripts/bench-route` (two nodes and one Hand of its own) and the `nodes`
figure (its real Hands, with the simulated ones connected).

The same call alternates between a client on the Hand's node and a client on the other node, so
both series see the same machine at the same moments: the difference is the hop through the other
node (its scope check, the holder lookup in the database, the node link both ways).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from mind.client.aio import MindClient, load_credential

CALLS = (
    ("read_file 100 B", "read_file", {"path": "small.txt"}),
    ("exec -- true", "exec", {"argv": ["true"]}),
)
"""The calls measured: `read_file` of a 100-byte file the caller puts in the Hand's root first, and
`exec -- true` (a process on the Hand)."""
SMALL = b"x" * 100


async def measure(
    own: str, other: str, cred_path: Path, hand: str, n: int
) -> list[tuple[str, list[float], list[float]]]:
    """(label, ms through `own`, ms through `other`) per call of `CALLS`, `n` of each counted after
    min(50, n) of warm-up. A call that does not succeed raises: a figure of failures is no figure."""
    cred = load_credential(cred_path)
    out = []
    warm = min(50, n)
    async with await MindClient.connect(own, cred) as a, await MindClient.connect(other, cred) as b:
        for label, tool, args in CALLS:
            series: dict[str, list[float]] = {"own": [], "other": []}
            for i in range(n + warm):
                for name, mc in (("own", a), ("other", b)):
                    t0 = time.perf_counter()
                    end = await mc.exec(hand, tool, args)
                    took = (time.perf_counter() - t0) * 1000
                    if end.state.value != "succeeded":
                        raise RuntimeError(f"{label} through {name} node: {end.state.value} ({end})")
                    if i >= warm:
                        series[name].append(took)
            out.append((label, series["own"], series["other"]))
    return out


async def measure_find(
    own: str, other: str, cred_path: Path, hand: str, n: int
) -> list[tuple[str, list[float], list[float]]]:
    """`run get` of a live run started through `own`, asked first through `other` (which did not
    relay it, so it finds the run's node: `Router.find`) against the same ask through `own`."""
    import asyncio

    cred = load_credential(cred_path)
    own_s: list[float] = []
    found_s: list[float] = []
    async with await MindClient.connect(own, cred) as a, await MindClient.connect(other, cred) as b:
        for i in range(min(n, 200) + 10):  # the first 10: warm-up, not counted
            h = await a.start(hand, "exec", {"argv": ["sleep", "60"]}, stream=False)
            while h.run_id is None:  # noqa: ASYNC110 (the handle offers no admission event; ~1 ms)
                await asyncio.sleep(0.001)
            t0 = time.perf_counter()
            got = await b.get_run(h.run_id)  # `other` did not relay it: found on `own`
            t1 = time.perf_counter()
            await a.get_run(h.run_id)
            t2 = time.perf_counter()
            if got.run_id != h.run_id or got.end is not None:
                raise RuntimeError(f"run get through the other node: {got}")
            if i >= 10:
                found_s.append((t1 - t0) * 1000)
                own_s.append((t2 - t1) * 1000)
            await a.cancel(h.run_id)
            await h.wait()
    return [("run get, found", own_s, found_s)]


async def fill(url: str, cred_path: Path, hand: str, k: int) -> None:
    """`k` finished runs (`exec -- true`) in the history of the node at `url`."""
    async with await MindClient.connect(url, load_credential(cred_path)) as mc:
        for _ in range(k):
            end = await mc.exec(hand, "exec", {"argv": ["true"]})
            if end.state.value != "succeeded":
                raise RuntimeError(f"filling the history: {end}")


async def measure_runs(
    lone: str, lone_cred: Path, pair: str, pair_cred: Path, total: int, n: int
) -> list[tuple[str, list[float], list[float]]]:
    """`mind runs`: a page of 100 through a node of two (every live node's runs: its own, the
    other's page asked on the link, merged: `mind.core.runlist`) against the same page of a lone
    Mind holding as many runs (its registry alone, as before), alternating; then all `total` runs,
    page after page, the same way."""
    from protocol.messages import ListRuns, RunList

    out = []
    async with (
        await MindClient.connect(lone, load_credential(lone_cred)) as one,
        await MindClient.connect(pair, load_credential(pair_cred)) as two,
    ):
        for label, rounds, limit in (("runs, a page of 100", n, 100), (f"runs, all {total}", max(10, n // 20), total)):
            series: dict[str, list[float]] = {"one": [], "two": []}
            warm = min(20, rounds)
            for i in range(rounds + warm):
                for name, mc in (("one", one), ("two", two)):
                    t0 = time.perf_counter()
                    if limit == 100:
                        reply = await mc._ask(ListRuns(limit=100), RunList)
                        got, missing = len(reply.runs), reply.missing_nodes
                    else:
                        listing = await mc.run_listing(limit=limit)
                        got, missing = len(listing.runs), listing.missing_nodes
                    took = (time.perf_counter() - t0) * 1000
                    if got != min(limit, total) or missing:
                        raise RuntimeError(f"{label} through the {name} Mind: {got} runs, missing {missing}")
                    if i >= warm:
                        series[name].append(took)
            out.append((label, series["one"], series["two"]))
    return out


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else xs[0]
