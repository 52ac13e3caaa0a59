"""`RunHandle` (mind/client/run.py) across cuts, without a socket: a fake client records what the
handle queues, and the test plays the Mind. What a caller relies on: every output byte handed over
once, in order, whatever was resent; stdin resent from exactly where the Mind's side stands; a cancel
asked during an outage sent once on return; `replaced` and `resume_pending` said plainly; a detach
that acknowledges what was handed over (so the next consumer starts after it) and nothing more."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mind.client.run import RunHandle, StillRunning
from mind.errors import ClientCode, ClientError
from protocol.codes import CancelStatus, ErrorCode
from protocol.messages import (
    Attached,
    CancelRunResult,
    DataStream,
    Error,
    Replaced,
    RunEnd,
    RunUpdate,
    StreamAck,
    StreamData,
    StreamPosition,
    StreamResume,
)
from protocol.states import RunState

RUN = "r-1"


class FakeClient:
    """What a `RunHandle` asks of its client, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, str]] = []
        self.up = True
        self.cancels = 0
        self.later: list[RunHandle] = []
        self.detached: list[float | None] = []
        self.kicks = 0

    def queue(self, msg: Any, id_: str) -> None:
        if not self.up:
            raise ClientError(ClientCode.CLOSED, "connection to the Mind closed")
        self.sent.append((msg, id_))

    def kick(self) -> None:
        self.kicks += 1

    async def flush_quietly(self) -> None:
        await asyncio.sleep(0)

    def attach_later(self, handle: RunHandle) -> None:
        self.later.append(handle)

    async def cancel(self, run_id: str) -> CancelRunResult:
        self.cancels += 1
        return CancelRunResult(run_id=run_id, status=CancelStatus.CANCEL_REQUESTED, state=RunState.RUNNING)

    async def detach_run(self, handle: RunHandle, keep: float | None) -> float:
        self.detached.append(keep)
        return 30.0 if keep is None else keep

    def stdin(self) -> list[tuple[int, bytes, bool]]:
        return [(m.offset, m.data, m.eof) for m, _ in self.sent if isinstance(m, StreamData)]

    def acks(self) -> list[tuple[str, int]]:
        return [(m.stream, m.offset) for m, _ in self.sent if isinstance(m, StreamAck)]


def data(offset: int, payload: bytes, stream: DataStream = "stdout", eof: bool = False) -> StreamData:
    return StreamData(run_id=RUN, stream=stream, offset=offset, data=payload, eof=eof)


def end(state: RunState = RunState.SUCCEEDED, code: int = 0) -> RunEnd:
    return RunEnd(run_id=RUN, state=state, exit_code=code, hand="box", tool="exec")


async def drain(handle: RunHandle) -> bytes:
    out = bytearray()
    async for ev in handle.events():
        if isinstance(ev, StreamData):
            out += ev.data
    return bytes(out)


async def test_output_resent_after_a_cut_is_handed_over_once_and_the_attach_says_where_it_stands():
    client = FakeClient()
    h = RunHandle(client, "x1")
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    h.on_message(data(0, b"abc"))
    h.on_message(data(3, b"def"))
    h.on_cut()
    points = h.attach_request()
    assert [(p.stream, p.offset, p.consumed) for p in points] == [("stdout", 6, 0)]
    h.on_message(Attached(run_id=RUN, hand="box", state=RunState.RUNNING, streams=points, hand_away_since=5.0))
    assert h.hand_away_since == 5.0  # the Hand's leg is away too: the run waits for it
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    assert h.hand_away_since is None  # and it is back
    assert not h.on_message(data(3, b"def"))  # a chunk in flight before the resume, sent again: dropped
    h.on_message(data(6, b"ghi", eof=True))
    assert h.on_message(end())
    assert await drain(h) == b"abcdefghi"


async def test_stdin_is_resent_from_the_attached_position_before_anything_new():
    client = FakeClient()
    h = RunHandle(client, "x1", stdin=b"0123456789" * 100)
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    for _ in range(10):
        await asyncio.sleep(0)
    sent = client.stdin()
    assert b"".join(d for _, d, _ in sent) == b"0123456789" * 100 and sent[-1][2]  # all of it, then eof
    h.on_cut()
    client.sent.clear()
    h.attach_request()
    stdin = StreamPosition(stream="stdin", offset=400, consumed=300)
    h.on_message(Attached(run_id=RUN, hand="box", state=RunState.RUNNING, streams=[stdin]))
    resent = client.stdin()
    assert resent[0][0] == 400 and b"".join(d for _, d, _ in resent) == (b"0123456789" * 100)[400:]
    assert resent[-1] == (1000, b"", True)  # and the end again


async def test_a_stdin_resume_from_the_mind_resends_exactly_the_missing_bytes():
    client = FakeClient()
    h = RunHandle(client, "x1", stdin=b"x" * 50)
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    for _ in range(10):
        await asyncio.sleep(0)
    client.sent.clear()
    h.on_message(StreamResume(run_id=RUN, stream="stdin", offset=20, consumed=10))
    assert client.stdin() == [(20, b"x" * 30, False), (50, b"", True)]
    client.sent.clear()
    h.on_message(StreamResume(run_id=RUN, stream="stdin", offset=5, consumed=5))  # below what was acknowledged
    assert client.stdin() == []  # nothing can be placed there: stdin stops, the run is still followed
    h.on_message(end())
    await drain(h)
    verdict = h.delivery()  # and its verdict says so (`mind exec`: 122 rather than 0)
    assert not verdict.complete and len(verdict.notes) == 1
    assert verdict.notes[0].startswith("stdin: cannot resume from offset 5")


async def test_a_cancel_asked_during_an_outage_is_sent_once_after_the_reattachment():
    client = FakeClient()
    h = RunHandle(client, "x1")
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    h.on_cut()
    asks = [asyncio.ensure_future(h.cancel()) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert client.cancels == 0 and not any(a.done() for a in asks)
    h.attach_request()
    h.on_message(Attached(run_id=RUN, hand="box", state=RunState.RUNNING))
    results = await asyncio.gather(*asks)
    assert client.cancels == 1 and all(r.run_id == RUN for r in results)
    await h.cancel()  # asked again after that answer: a new request
    assert client.cancels == 2


async def test_replaced_fails_the_handle_plainly_and_resume_pending_asks_to_attach_later():
    client = FakeClient()
    h = RunHandle(client, "x1")
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    h.on_cut()
    h.attach_request()
    assert h.on_message(Error(code=ErrorCode.RESUME_PENDING, message="ask again within the window"))
    assert client.later == [h] and h.live  # not a failure: the client attaches again shortly...
    assert not h.attaching  # ...which it does only for a handle whose attachment was answered
    h.attach_request()
    h.on_message(Attached(run_id=RUN, hand="box", state=RunState.RUNNING))
    assert h.on_message(Replaced(run_id=RUN))
    with pytest.raises(ClientError) as replaced:
        await h.wait()
    assert replaced.value.code is ErrorCode.REPLACED and "newer client" in replaced.value.message
    with pytest.raises(ClientError):  # and says so again
        await h.wait()


async def test_events_of_another_run_are_refused():
    h = RunHandle(FakeClient(), "x1")
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    assert h.on_message(RunUpdate(run_id="r-2", hand="box", state=RunState.RUNNING))
    with pytest.raises(ClientError) as bad:
        await h.wait()
    assert bad.value.code == "protocol" and "r-2" in bad.value.message


async def test_a_wait_bound_detaches_after_acknowledging_what_was_handed_over():
    client = FakeClient()
    h = RunHandle(client, "x1")
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    h.on_message(data(0, b"seen"))
    got: list[bytes] = []
    with pytest.raises(StillRunning) as still:
        await h.wait(lambda ev: got.append(ev.data) if isinstance(ev, StreamData) else None, timeout=0.05, keep=90)
    assert got == [b"seen"] and still.value.run_id == RUN and still.value.keep_s == 90
    assert f"still running: mind attach {RUN}" in str(still.value)
    assert client.acks() == [("stdout", 4)] and client.detached == [90]
    h.on_message(data(4, b"not handed over"))  # the next consumer gets these, not this handle
    with pytest.raises(StillRunning):
        await h.wait()


async def test_a_new_consumer_starts_where_the_mind_says_each_stream_stands():
    client = FakeClient()
    h = RunHandle(client, "", run_id=RUN)
    assert h.attach_request() == []
    at = StreamPosition(stream="stdout", offset=1000, consumed=1000)
    h.on_message(Attached(run_id=RUN, hand="box", state=RunState.RUNNING, streams=[at]))
    await h.attached()
    h.on_message(data(1000, b"rest", eof=True))
    h.on_message(end(RunState.FAILED, 3))
    assert await drain(h) == b"rest" and h.end is not None and h.end.exit_code == 3


async def test_detach_acknowledges_exactly_what_was_handed_over_not_what_was_only_received():
    client = FakeClient()
    h = RunHandle(client, "x1")
    h.on_message(data(0, b"one "))
    h.on_message(data(4, b"two "))
    h.on_message(data(8, b"three"))
    events = h.events()
    assert (await anext(events)) == data(0, b"one ")
    assert (await anext(events)) == data(4, b"two ")  # ("one " is consumed now)
    assert client.acks() == []  # a small amount: acknowledgements are paced
    assert await h.detach() == 30
    assert client.acks() == [("stdout", 8)]  # "two " was handed over too; "three" was only received
    with pytest.raises(StillRunning):
        await anext(events)


async def test_a_run_the_mind_forgot_across_a_cut_is_said_to_have_an_unknown_fate():
    h = RunHandle(FakeClient(), "x1")
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    h.on_cut()
    h.attach_request()
    h.on_message(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {RUN}"))
    with pytest.raises(ClientError) as forgot:
        await h.wait()
    assert forgot.value.code is ErrorCode.UNKNOWN_RUN and "fate is unknown here" in forgot.value.message
    fresh = RunHandle(FakeClient(), "", run_id=RUN)
    fresh.attach_request()
    fresh.on_message(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {RUN}"))
    with pytest.raises(ClientError) as unknown:
        await fresh.attached()
    assert unknown.value.message == f"no run {RUN}"  # a first attach of a wrong id: the Mind's own words


async def test_a_resend_the_mind_asks_for_is_written_even_when_no_pump_will_flush_it():
    """The Hand's leg was cut: the Mind's `stream_resume` asks for stdin again from the Hand's
    position. The resend may fill the whole window, so the stdin pump (waiting for credit) never
    flushes it: the handle asks the client to write it. Without that a copy cut at half stalled."""
    client = FakeClient()
    h = RunHandle(client, "x1", stdin=b"y" * 300_000)
    h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    for _ in range(20):
        await asyncio.sleep(0)
    assert h.follower.stdin_credit() == 0  # the window is full: the pump waits for credit
    client.sent.clear()
    kicks = client.kicks
    h.on_message(StreamResume(run_id=RUN, stream="stdin", offset=0, consumed=0))
    assert client.stdin()[0][0] == 0 and client.kicks > kicks


async def test_the_end_stays_once_the_events_were_read():
    """A caller that read the events to the end and then asks `wait()` (or reads again) gets the
    end at once; it waited for ever before (found by `mind forward -R`, a listener refused)."""
    h = RunHandle(FakeClient(), "x1")
    h.on_message(data(0, b"out", eof=True))
    h.on_message(end(RunState.FAILED, 3))
    assert await drain(h) == b"out"
    done = await asyncio.wait_for(h.wait(), 2)
    assert done.state is RunState.FAILED and done.exit_code == 3
    again = [ev async for ev in h.events()]
    assert len(again) == 1 and isinstance(again[0], RunEnd)


async def test_a_wait_that_ends_leaves_nothing_for_the_loop_to_clean_up():
    """`wait()` stops reading events at the end. An async generator left suspended there is
    closed by asyncio in a task of its own, started from a write to the loop's self-pipe: one more
    task and one more turn for every call. The events are an iterator object: nothing is left."""
    import gc

    loop = asyncio.get_running_loop()
    woken: list[object] = []
    wake = loop._write_to_self  # type: ignore[attr-defined]
    loop._write_to_self = lambda: (woken.append(1), wake())  # type: ignore[attr-defined]
    try:
        for _ in range(3):
            h = RunHandle(FakeClient(), "x1")
            h.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
            h.on_message(end())
            assert (await h.wait()).state is RunState.SUCCEEDED
            del h
        gc.collect()  # once for the three: a full collection of this process's heap is ~0.4 s
        await asyncio.sleep(0)
        tasks = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
    finally:
        loop._write_to_self = wake  # type: ignore[attr-defined]
    assert woken == [] and tasks == set()
