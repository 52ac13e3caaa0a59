"""`mind runs` across Mind nodes sharing a database (DESIGN §16): one listing out of every live
node's page, newest first, each run once, pages that never repeat or skip a run.

Pure: the shell (`mind.daemon.views`) asks each peer node for a page and hands the answers here.

Why the order is `(created_at, run_id)` and not a node's admission number: admission numbers count
per node and mean nothing on another, while a run's creation time and id are the same wherever it
is listed. So a cursor made of them is understood by every node, each node pages by it alone
(`after_key`), and a run present throughout a listing sits at one place in one total order: it is
listed on exactly one page. (A single Mind keeps its admission-number cursor: nothing changes for
it.)

Merging pages: each node sends its newest runs below the cursor, at most `limit` of them and a
bounded number of bytes. The union's newest `limit` are then exactly the listing's next page, with
one care: a node whose page was cut (it has more) says nothing about runs older than its last one,
so the merged page stops there (`frontier`); the next page starts from its last run. At least the
node with the newest cut page contributes all its runs, so every page moves forward.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from mind.core.paging import page, parse_task_cursor, task_cursor
from protocol.messages import RunInfo
from protocol.states import RunState

Key = tuple[float, str]
"""Where a run sits in the listing: (created_at, run_id), newest (largest) first."""

T = TypeVar("T")


def key(info: RunInfo) -> Key:
    return (info.created_at, info.run_id)


def cursor(info: RunInfo) -> str:
    """The `next_after` that starts a page right after `info`, on any node."""
    return task_cursor(info.created_at, info.run_id)


def parse_cursor(text: str) -> Key | None:
    """The key a cursor made by `cursor` names; None if it is not one."""
    return parse_task_cursor(text)


def newest(items: Iterable[T], key_of: Callable[[T], Key], after: Key | None, count: int) -> list[T]:
    """One node's runs below `after` in the listing's order, the newest `count` of them, newest
    first (a node's registry is in admission order, which a run adopted from another node or a
    clock step makes differ from creation order)."""
    below = (item for item in items if after is None or key_of(item) < after)
    return heapq.nlargest(count, below, key=key_of)


@dataclass(frozen=True)
class Page:
    """One node's answer: its runs (newest first) and whether it has more below the last."""

    runs: list[RunInfo]
    more: bool


def authority(a: RunInfo, b: RunInfo) -> RunInfo:
    """The copy to list of a run two nodes hold (its Hand moved mid-run: the old node waits for it
    or ended it `lost` in its memory, the new one adopted it). The newer claim of the Hand is the
    one that acts for it (claims are fencing tokens: `gen` is the claim a run's Hand connection was
    welcomed with), so the higher `gen` wins; then a run not ended `lost` (the old node's guess)."""
    rank_a = (a.gen if a.gen is not None else -1, a.state is not RunState.LOST)
    rank_b = (b.gen if b.gen is not None else -1, b.state is not RunState.LOST)
    return b if rank_b > rank_a else a


def merge(pages: list[Page], limit: int, size: Callable[[RunInfo], int]) -> tuple[list[RunInfo], bool]:
    """The listing's next page from every node's page: newest first, each run once, at most
    `limit` runs and `mind.core.paging.PAGE_BYTES` together; and whether more may follow. Runs
    below a cut page's last run wait for the next page (see the module's docstring)."""
    cut = [p.runs[-1] for p in pages if p.more and p.runs]
    frontier = max((key(r) for r in cut), default=None)
    chosen: dict[str, RunInfo] = {}
    for p in pages:
        for info in p.runs:
            held = chosen.get(info.run_id)
            chosen[info.run_id] = info if held is None else authority(held, info)
    ordered = sorted(chosen.values(), key=key, reverse=True)
    within = [r for r in ordered if frontier is None or key(r) >= frontier]
    taken, more = page(within, limit, size)
    return taken, more or len(within) < len(ordered) or any(p.more for p in pages)
