"""mind/mcp/results.py: what a model is shown of a run's output, and the offsets it pages from."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from mind.cli.main import parse
from mind.mcp.results import HEAD_KEEP, SHOW_BYTES, Retained, StreamView, is_error, render, run_result
from mind.mcp.runs import Runs
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

OUTPUT = b"".join(b"%d\n" % i for i in range(1, 30001))


def retained(data: bytes, cap: int = 1 << 20, step: int = 977) -> Retained:
    r = Retained(cap=cap)
    for i in range(0, len(data), step):
        r.append(data[i : i + step])
    return r


def test_short_output_is_shown_whole() -> None:
    assert render(retained(b"hello\n").view(), "r1", "stdout") == "hello\n"
    assert render(StreamView(0, b"", b""), "r1", "stdout") == ""


def test_long_output_shows_head_and_tail_and_names_the_gap_in_bytes() -> None:
    shown = render(retained(OUTPUT).view(), "r1", "stdout")
    m = re.search(
        r"\(bytes (\d+) to (\d+) of (\d+)\): read_output\(run=\"r1\", stream=\"stdout\", offset=(\d+)\)", shown
    )
    assert m is not None
    start, end, total, offset = map(int, m.groups())
    assert (total, start, offset) == (len(OUTPUT), SHOW_BYTES // 2, SHOW_BYTES // 2)
    head, tail = shown.split("\n[...", 1)[0], shown.rsplit("...]\n", 1)[1]
    assert OUTPUT[:start] == head.encode() and OUTPUT[end:] == tail.encode()


def test_the_window_slides_the_head_stays_and_a_read_in_between_starts_at_what_is_kept() -> None:
    r = retained(OUTPUT, cap=10_000)
    assert r.total == len(OUTPUT) and r.base == len(OUTPUT) - 10_000 and r.head == OUTPUT[:HEAD_KEEP]
    assert r.gone() == (HEAD_KEEP, r.base)
    assert r.read(0, 500) == (0, OUTPUT[:500])  # the head is kept: offset 0 is still readable
    assert r.read(100, 1 << 20) == (100, OUTPUT[100:HEAD_KEEP])  # up to the gap, never across it
    start, data = r.read(HEAD_KEEP, 500)
    assert start == r.base and data == OUTPUT[r.base : r.base + 500]
    start, data = r.read(len(OUTPUT) - 10, 500)
    assert data == OUTPUT[-10:]
    assert r.read(len(OUTPUT) + 5, 10) == (len(OUTPUT), b"")


def test_only_the_ends_tail_known_the_marker_still_names_real_offsets() -> None:
    view = StreamView.of_tail(len(OUTPUT), OUTPUT[-4096:])
    shown = render(view, "r2", "stderr")
    assert shown.startswith("\n[... ") and shown.endswith(OUTPUT[-4096:].decode())
    assert f"(bytes 0 to {len(OUTPUT) - 4096} of {len(OUTPUT)})" in shown
    assert "no longer kept" in shown and "read_output(" not in shown  # nothing of the gap can be read
    assert StreamView.of_tail(3, b"ab\n") == StreamView(3, b"ab\n", b"ab\n")


def test_bytes_that_are_not_utf8_do_not_break_a_result() -> None:
    assert render(retained(b"\xff\xfeok").view(), "r", "stdout") == "\ufffd\ufffdok"


@pytest.mark.parametrize(
    ("state", "error"),
    [("succeeded", False), ("failed", True), ("rejected", True), ("cancelled", True), ("running", False)],
)
def test_is_error_for_anything_but_succeeded_except_still_running(state: str, error: bool) -> None:
    empty = StreamView(0, b"", b"")
    out = run_result(run_id="r", hand="h", state=state, stdout=empty, stderr=empty)
    assert is_error(out) is error
    assert ("still_running" in out) is (state == "running")


@pytest.mark.parametrize("listen", ["nohost", "h:0", "h:99999", "h:x"])
def test_mcp_listen_must_be_host_port(listen: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["mcp", "--listen", listen])
    assert args.handler(args) == 2
    assert "--listen wants HOST:PORT" in capsys.readouterr().err


class FakeHandle:
    """What `Runs` reads of a `RunHandle`: its id and its events (here: some output, then the end)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    async def events(self) -> AsyncIterator[object]:
        yield StreamData(run_id=self.run_id, stream="stdout", offset=0, data=b"out of " + self.run_id.encode())
        yield RunEnd(run_id=self.run_id, state=RunState.SUCCEEDED, hand="h", tool="exec", exit_code=0)


async def test_a_long_lived_server_keeps_only_the_newest_ended_runs() -> None:
    runs = Runs(client=None, keep_ended=3)  # type: ignore[arg-type]  # the client is not asked here
    for i in range(6):
        f = runs.follow(FakeHandle(f"r{i}"), "h")  # type: ignore[arg-type]
        assert f.task is not None
        await f.task
        assert f.end is not None and f.stdout.read(0, 100) == (0, b"out of r%d" % i)
    last = runs.follow(FakeHandle("r6"), "h")  # type: ignore[arg-type]  # (each follow forgets the oldest ended)
    assert [r for r in (f"r{i}" for i in range(6)) if runs.get(r) is not None] == ["r3", "r4", "r5"]
    assert last.task is not None
    await last.task
    await runs.close()  # nothing live: nothing to detach
