"""The Mind keeps run metadata, not payloads, and lists it in bounded pages (DESIGN §11).

On the sans-I/O registry and the paging rules: what a finished run keeps, what its waiting client
still gets in full, and that pages of history never repeat or skip a run while runs come and go.
"""

from __future__ import annotations

from mind.core.paging import PAGE_ITEMS, page, parse_task_cursor, task_cursor
from mind.core.registry import HISTORY_ERROR_MAX, HISTORY_TAIL_MAX, RunRegistry, SendToClient, StartEnded, retained
from protocol import limits
from protocol.envelope import payload_size
from protocol.messages import Background, Exec, OutputTail, Result, RunEnd
from protocol.states import RunState

HAND = "laptop"
BIG = b"\xab" * limits.READ_FILE_MAX


def admit(reg: RunRegistry, run_id: str, tool: str = "read_file", background: Background | None = None) -> None:
    req = Exec(hand=HAND, tool=tool, args={"path": "big.bin"}, timeout_ms=10_000)
    reg.admit(run_id, req, "c1", f"q-{run_id}", 1, True, now=0.0, wall=1000.0, background=background)
    reg.on_accepted(run_id, HAND, 1, 0.1)


def finish(reg: RunRegistry, run_id: str, **kw) -> list:
    return reg.on_result(Result(run_id=run_id, state=RunState.SUCCEEDED, **kw), HAND, 1, 1.0, 1001.0)


def test_a_finished_read_file_keeps_no_value_but_its_client_gets_it_whole():
    reg = RunRegistry()
    admit(reg, "r1")
    acts = finish(reg, "r1", value={"data": BIG, "size": len(BIG)})
    [sent] = [a.msg for a in acts if isinstance(a, SendToClient) and isinstance(a.msg, RunEnd)]
    assert sent.value["data"] == BIG  # the waiting client: the whole value, in its run_end
    run = reg.get("r1")
    assert run is not None and run.end is not None and run.end.value is None
    info = run.info()
    assert info.value_not_retained and info.end is not None and info.end.value is None
    assert info.end.state is RunState.SUCCEEDED and info.end.duration_ms == sent.duration_ms
    assert payload_size(info) < 2000  # metadata: a few hundred bytes, whatever the tool returned


def test_a_run_without_a_value_says_nothing_was_dropped():
    reg = RunRegistry()
    admit(reg, "r1", tool="exec")
    finish(reg, "r1", exit_code=0)
    assert not reg.get("r1").info().value_not_retained


def test_history_keeps_bounded_tails_with_their_totals_and_a_clipped_error():
    tail = OutputTail(data=b"o" * (limits.OUTPUT_TAIL_MAX - 1) + b"!", total=10_000_000)
    end = RunEnd(
        run_id="r1",
        hand=HAND,
        tool="exec",
        state=RunState.FAILED,
        exit_code=3,
        stdout=tail,
        stderr=OutputTail(data=b"short", total=5),
        error="e" * 16_000,
        value=[1, 2, 3],
    )
    kept = retained(end)
    assert len(kept.stdout.data) == HISTORY_TAIL_MAX and kept.stdout.data.endswith(b"!")  # the last bytes
    assert kept.stdout.total == 10_000_000  # `total - len(data)` still says where the tail starts
    assert kept.stderr == end.stderr  # small enough: kept as it was
    assert kept.error is not None and len(kept.error) == HISTORY_ERROR_MAX and kept.error.endswith("\u2026")
    assert kept.value is None and (kept.state, kept.exit_code) == (RunState.FAILED, 3)
    assert end.value == [1, 2, 3] and len(end.stdout.data) == limits.OUTPUT_TAIL_MAX  # the original is untouched


def test_the_start_run_of_a_task_still_hands_its_value_to_the_task_service():
    reg = RunRegistry()
    admit(reg, "t1", tool="exec", background=Background(max_runtime_ms=1000))
    acts = finish(reg, "t1", value={"task": "the row"})
    [started] = [a for a in acts if isinstance(a, StartEnded)]
    assert started.end.value == {"task": "the row"} and reg.get("t1").end.value is None


def pages(reg: RunRegistry, limit: int, between=None, size=payload_size, max_bytes=1 << 20):
    """Every page of the history as the Mind sends them (`Views.list_runs`), run ids per page."""
    out, before = [], None
    while True:
        items = ((r, r.info()) for r in reg.history(before=before))
        taken, more = page(items, limit, lambda item: size(item[1]), max_bytes)
        out.append([r.run_id for r, _ in taken])
        if not more:
            return out
        before = taken[-1][0].seq
        if between is not None:
            between(len(out))


def test_pages_of_history_are_newest_first_and_never_repeat_or_skip_a_run():
    reg = RunRegistry()
    for i in range(25):
        admit(reg, f"r{i:02d}")
        finish(reg, f"r{i:02d}")
    got = pages(reg, 10)
    assert [len(p) for p in got] == [10, 10, 5]
    assert sum(got, []) == [f"r{i:02d}" for i in reversed(range(25))]


def test_runs_admitted_or_pruned_between_pages_change_nothing_already_listed():
    reg = RunRegistry(retain_finished=30)
    for i in range(30):
        admit(reg, f"r{i:02d}")
        finish(reg, f"r{i:02d}")

    def meanwhile(n: int) -> None:  # ten newer runs each time, which prunes ten of the oldest
        for j in range(10):
            rid = f"n{n}{j}"
            admit(reg, rid)
            finish(reg, rid)

    listed = sum(pages(reg, 10, between=meanwhile), [])
    assert len(listed) == len(set(listed))  # nothing twice
    assert not any(rid.startswith("n") for rid in listed)  # nothing newer than the first page
    assert listed[:10] == [f"r{i:02d}" for i in reversed(range(20, 30))]
    assert listed == sorted(listed, reverse=True)  # still newest first; the pruned oldest simply end it


def test_a_page_is_bounded_in_bytes_and_always_holds_one_run():
    reg = RunRegistry()
    for i in range(8):
        admit(reg, f"r{i}", tool="exec")
        finish(reg, f"r{i}", stdout=OutputTail(data=b"x" * limits.OUTPUT_TAIL_MAX, total=1 << 30))
    one = payload_size(reg.get("r0").info())
    assert HISTORY_TAIL_MAX < one < 2 * HISTORY_TAIL_MAX
    got = pages(reg, 100, max_bytes=3 * one)
    assert [len(p) for p in got] == [3, 3, 2]
    assert [len(p) for p in pages(reg, 100, max_bytes=1)] == [1] * 8  # smaller than one run: one a page


def test_page_counts_and_bytes_and_says_whether_anything_is_left():
    assert page(range(5), 5, lambda _: 1) == ([0, 1, 2, 3, 4], False)  # exactly everything: no next page
    assert page(range(6), 5, lambda _: 1) == ([0, 1, 2, 3, 4], True)
    assert page(range(10), 100, lambda x: 10, max_bytes=35) == ([0, 1, 2], True)
    assert page([], 10, lambda _: 1) == ([], False)
    many, more = page(range(PAGE_ITEMS * 3), 10**6, lambda _: 1)
    assert len(many) == PAGE_ITEMS and more  # the Mind's own cap, whatever was asked


def test_task_cursors_round_trip_exactly_and_refuse_anything_else():
    for when in (1712345678.123456, 0.1 + 0.2, 5e-324, 1e300):
        assert parse_task_cursor(task_cursor(when, "t-1.a_b")) == (when, "t-1.a_b")
    for bad in ("", "nocolon", "1.5:", ":t1", "x:t1", "nan:t1", "inf:t1", "1.5:bad id", "1.5:-t"):
        assert parse_task_cursor(bad) is None, bad
