"""`mind runs` across Mind nodes (DESIGN §16, `mind.core.runlist`): pages merged from every node's
page are newest first, list each run once, and paging through them never repeats or skips a run
that existed throughout, whatever the page sizes, the byte bound, or the runs that come and go
between pages. Each node pages as `Views._node_page` does: `runlist.newest` then `paging.page`.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mind.core import runlist
from mind.core.paging import page
from protocol.envelope import payload_size
from protocol.messages import RunInfo
from protocol.states import RunState


def info(run_id: str, created_at: float, gen: int | None = 1, state: RunState = RunState.SUCCEEDED) -> RunInfo:
    return RunInfo(run_id=run_id, hand="box", tool="exec", state=state, gen=gen, created_at=created_at, args_digest="d")


def node_page(runs: list[RunInfo], after: runlist.Key | None, limit: int, max_bytes: int) -> runlist.Page:
    chosen = runlist.newest(runs, runlist.key, after, limit + 1)
    taken, more = page(chosen, limit, payload_size, max_bytes)
    return runlist.Page(taken, more)


def listing(
    nodes: list[list[RunInfo]], limit: int, max_bytes: int, between: list[list[tuple[int, RunInfo]]] | None = None
) -> list[list[RunInfo]]:
    """Every page, as a client pages (the cursor of the last run of each); `between[i]`: runs that
    appear on nodes after page i."""
    pages: list[list[RunInfo]] = []
    after: str | None = None
    while True:
        key = None if after is None else runlist.parse_cursor(after)
        got = [node_page(runs, key, limit, max_bytes) for runs in nodes]
        taken, more = runlist.merge(got, limit, payload_size)
        pages.append(taken)
        if between and len(between) >= len(pages):
            for n, run in between[len(pages) - 1]:
                nodes[n].append(run)
        if not more or not taken:
            return pages
        after = runlist.cursor(taken[-1])
        assert len(pages) < 10_000


def test_two_nodes_one_listing_newest_first_each_once():
    a = [info("r-a1", 100.0), info("r-a2", 103.0), info("r-a3", 105.0)]
    b = [info("r-b1", 101.0), info("r-b2", 104.0)]
    pages = listing([a, b], limit=2, max_bytes=1 << 20)
    assert [[r.run_id for r in p] for p in pages] == [["r-a3", "r-b2"], ["r-a2", "r-b1"], ["r-a1"]]


def test_same_creation_time_is_ordered_by_id_and_never_lost_at_a_page_boundary():
    a = [info("r-1", 100.0), info("r-3", 100.0)]
    b = [info("r-2", 100.0), info("r-4", 100.0)]
    pages = listing([a, b], limit=1, max_bytes=1 << 20)
    assert [r.run_id for p in pages for r in p] == ["r-4", "r-3", "r-2", "r-1"]


def test_a_run_two_nodes_hold_is_listed_once_from_the_newer_claim():
    """Its Hand moved mid-run: the old node still waits for it (or ended it `lost` in its memory),
    the new one adopted it under a newer claim (`gen`), which is the one acting for it."""
    old = info("r-moved", 100.0, gen=3, state=RunState.LOST)
    new = info("r-moved", 100.5, gen=4, state=RunState.SUCCEEDED)
    taken, more = runlist.merge([runlist.Page([old], False), runlist.Page([new], False)], 10, payload_size)
    assert taken == [new] and not more
    taken, _ = runlist.merge([runlist.Page([new], False), runlist.Page([old], False)], 10, payload_size)
    assert taken == [new]


def test_a_cut_page_holds_back_older_runs_of_other_nodes_until_the_next_page():
    """Node A's page was cut after r-a2 (A has more below it): B's r-b1, older than r-a2, may not
    be listed yet, or A's runs between them would come after it."""
    a = runlist.Page([info("r-a3", 105.0), info("r-a2", 103.0)], True)
    b = runlist.Page([info("r-b1", 101.0)], False)
    taken, more = runlist.merge([a, b], 10, payload_size)
    assert [r.run_id for r in taken] == ["r-a3", "r-a2"] and more


def test_the_merged_page_is_bounded_in_bytes_and_moves_forward():
    a = [info(f"r-a{i}", 100.0 + i) for i in range(5)]
    b = [info(f"r-b{i}", 100.5 + i) for i in range(5)]
    one = payload_size(a[0])
    pages = listing([a, b], limit=100, max_bytes=one * 3)
    assert all(p for p in pages)
    assert [r.run_id for p in pages for r in p] == [r.run_id for r in sorted(a + b, key=runlist.key, reverse=True)]


RUNS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 40)),  # (node, creation second: many ties)
    max_size=60,
)


@given(
    runs=RUNS,
    limit=st.integers(1, 7),
    items_per_page_bytes=st.integers(1, 5),
    arrivals=st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(-5, 60)), max_size=4), max_size=8),
)
def test_paging_never_repeats_or_skips_a_run_that_existed_throughout(runs, limit, items_per_page_bytes, arrivals):
    nodes: list[list[RunInfo]] = [[], [], []]
    for i, (n, t) in enumerate(runs):
        nodes[n].append(info(f"r-{i:03d}", float(t)))
    present = {r.run_id for rs in nodes for r in rs}
    everything = sorted((r for rs in nodes for r in rs), key=runlist.key, reverse=True)
    one = payload_size(info("r-000", 1.0))
    between = [
        [(n, info(f"r-new-{p}-{j}", float(t))) for j, (n, t) in enumerate(batch)] for p, batch in enumerate(arrivals)
    ]
    pages = listing(nodes, limit, one * items_per_page_bytes, between)
    listed = [r.run_id for p in pages for r in p]
    assert len(listed) == len(set(listed))  # never twice
    assert all(len(p) <= limit for p in pages)
    keys = [runlist.key(r) for p in pages for r in p]
    assert keys == sorted(keys, reverse=True)  # newest first, across pages too
    assert [r for r in listed if r in present] == [r.run_id for r in everything]  # none skipped, in order
