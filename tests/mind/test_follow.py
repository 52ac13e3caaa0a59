"""The run follower (mind/client/follow.py): the rules `mind exec`, `mind attach`, the library, `mind
mcp` and the continuity simulation all follow a run by. Fed the Mind's messages by hand, the test
reads what it decides: bytes handed over once and in order, a broken stream said and the others
still flowing, stdin resent from the Hand's position, a stdin nobody can feed closed at an attach,
and the verdict a user relies on (`mind exec` exits 122 on an incomplete 0)."""

from __future__ import annotations

import hashlib

from mind.client.follow import (
    AttachLater,
    Broken,
    Deliver,
    Ended,
    Follower,
    SendAck,
    SendStdin,
    Took,
)
from protocol import limits
from protocol.codes import ErrorCode
from protocol.messages import (
    Attached,
    Error,
    OutputTail,
    Replaced,
    RunEnd,
    RunUpdate,
    StreamAck,
    StreamData,
    StreamPosition,
    StreamResume,
)
from protocol.states import RunState

W = limits.STREAM_WINDOW

RUN = "r-1"


def data(offset: int, payload: bytes, stream: str = "stdout", eof: bool = False) -> StreamData:
    return StreamData(run_id=RUN, stream=stream, offset=offset, data=payload, eof=eof)  # type: ignore[arg-type]


def tail(sent: bytes, total: int | None = None) -> OutputTail:
    return OutputTail(
        data=sent[-4096:],
        total=len(sent) if total is None else total,
        sent=len(sent),
        sha256=hashlib.sha256(sent).hexdigest(),
    )


def end(out: bytes = b"", err: bytes = b"", total: int | None = None) -> RunEnd:
    return RunEnd(
        run_id=RUN,
        state=RunState.SUCCEEDED,
        exit_code=0,
        hand="box",
        tool="exec",
        stdout=tail(out, total),
        stderr=tail(err),
    )


def started(stdin: bool = False) -> Follower:
    f = Follower(streams=("stdout", "stderr"), stdin=stdin)
    f.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    return f


def handed(actions: list) -> bytes:
    return b"".join(a.data for a in actions if isinstance(a, Deliver))


def test_each_byte_is_handed_over_once_and_in_order_across_a_resend():
    f = started()
    got = handed(f.on_message(data(0, b"abc")))
    f.on_cut()
    assert f.resume_points() == [("stdout", 3, 0, W), ("stderr", 0, 0, W)]
    f.on_message(Attached(run_id=RUN, hand="box", state=RunState.RUNNING, streams=[]))
    got += handed(f.on_message(data(0, b"abc")))  # in flight before the resume, sent again
    got += handed(f.on_message(data(3, b"def", eof=True)))
    f.on_message(data(0, b"", "stderr", eof=True))
    assert got == b"abcdef"
    assert [type(a) for a in f.on_message(end(b"abcdef"))] == [Ended]
    assert f.delivery().complete and f.delivery().notes == []


def test_a_chunk_that_cannot_be_placed_breaks_its_stream_only_and_the_verdict_says_so():
    f = started()
    f.on_message(data(0, b"abc"))
    # a gap (the Mind broke the stream's rules): the Hand is told to stop sending it, or the run,
    # waiting on credit that can never come, would never end
    assert f.on_message(data(10, b"xyz")) == [SendAck("stdout", 0, closed=True)]
    assert f.on_message(data(3, b"def")) == []  # nothing of that stream is placed any more
    assert handed(f.on_message(data(0, b"err", "stderr", eof=True))) == b"err"  # the other flows
    assert not f.over  # the run is followed to its real end
    f.on_message(end(b"abcdef", b"err"))
    verdict = f.delivery()
    assert not verdict.complete and verdict.streams["stderr"].complete
    assert verdict.notes == ["stdout: bytes from offset 3 were not delivered (the stream broke)"]


def test_bytes_that_do_not_match_the_hands_digest_or_fell_to_the_output_limit_are_incomplete():
    f = started()
    f.on_message(data(0, b"abc", eof=True))
    f.on_message(data(0, b"", "stderr", eof=True))
    f.on_message(end(b"abd"))
    assert f.delivery().notes == ["stdout: the bytes delivered do not match the Hand's digest"]
    g = started()
    g.on_message(data(0, b"abc", eof=True))
    g.on_message(data(0, b"", "stderr", eof=True))
    g.on_message(end(b"abc", total=10))
    assert g.delivery().notes == ["stdout: cut at offset 3 by the output limit; 7 bytes of 10 were not delivered"]
    h = started()  # a reader that went away (`| head`) asked for less: the limit is no shortfall of ours
    h.on_message(data(0, b"abc", eof=True))
    h.on_message(data(0, b"", "stderr", eof=True))
    assert h.reader_closed("stdout", 3) == [SendAck("stdout", 3, closed=True)]
    h.on_message(end(b"abc", total=10))
    assert h.delivery().complete


def test_a_lost_run_is_complete_only_for_streams_that_reached_their_end():
    f = started()
    f.on_message(data(0, b"abc", eof=True))
    f.on_message(data(0, b"e", "stderr"))
    lost = RunEnd(run_id=RUN, state=RunState.LOST, hand="box", tool="exec")
    assert f.delivery(lost).notes == ["stderr: delivered up to offset 1; whether more was written is unknown"]


def test_acknowledgements_follow_what_the_consumer_took_and_wait_while_not_attached():
    f = Follower(streams=("stdout",), window=64 << 10)
    f.on_message(RunUpdate(run_id=RUN, hand="box", state=RunState.RUNNING))
    f.on_message(data(0, b"x" * (16 << 10)))
    assert f.consume("stdout", 8 << 10) == []  # a quarter window is due, not less
    assert f.consume("stdout", 8 << 10) == [SendAck("stdout", 16 << 10)]
    f.on_message(data(16 << 10, b"y"))
    f.on_cut()
    assert f.took("stdout", (16 << 10) + 1) == []  # not attached: the resume point says it
    assert [p[:3] for p in f.resume_points()] == [("stdout", (16 << 10) + 1, (16 << 10) + 1)]


def test_stdin_is_kept_while_away_and_resent_from_the_hands_position_once_attached():
    f = started(stdin=True)
    assert f.send_stdin(b"hello ") == [SendStdin(0, b"hello ", False)]
    f.on_cut()
    assert f.send_stdin(b"world") == []  # typed during the outage: kept
    assert f.close_stdin() == []
    f.resume_points()
    acts = f.on_message(
        Attached(
            run_id=RUN,
            hand="box",
            state=RunState.RUNNING,
            streams=[StreamPosition(stream="stdin", offset=3, consumed=3)],
        )
    )
    sent = [a for a in acts if isinstance(a, SendStdin)]
    assert (
        sent[0].offset == 3 and b"".join(a.data for a in sent) == b"lo world" and sent[-1] == SendStdin(11, b"", True)
    )
    resent = [
        a
        for a in f.on_message(StreamResume(run_id=RUN, stream="stdin", offset=6, consumed=6))
        if isinstance(a, SendStdin)
    ]
    assert resent == [SendStdin(6, b"world", False), SendStdin(11, b"", True)]  # the Hand came back
    f.on_message(StreamAck(run_id=RUN, stream="stdin", offset=11, closed=True))
    assert f.stdin_closed and f.stdin_credit() == 0


def test_an_attach_closes_a_stdin_nobody_can_feed_at_its_first_attachment_only():
    f = Follower(run_id=RUN)
    acts = f.on_message(
        Attached(
            run_id=RUN,
            hand="box",
            state=RunState.RUNNING,
            streams=[
                StreamPosition(stream="stdout", offset=7, consumed=7),
                StreamPosition(stream="stdin", offset=5, consumed=5),
            ],
        )
    )
    assert isinstance(acts[0], Took) and acts[0].first
    assert [a for a in acts if isinstance(a, SendStdin)] == [SendStdin(5, b"", True)]
    assert handed(f.on_message(data(7, b"more"))) == b"more"  # its stream starts where the Hand resends from
    f.on_cut()
    f.resume_points()
    again = f.on_message(
        Attached(
            run_id=RUN,
            hand="box",
            state=RunState.RUNNING,
            streams=[StreamPosition(stream="stdin", offset=5, consumed=5)],
        )
    )
    assert not any(isinstance(a, SendStdin) for a in again) and not again[0].first  # type: ignore[union-attr]


def test_resume_pending_asks_to_attach_again_and_a_forgotten_run_or_a_newer_attachment_ends_it():
    f = started()
    f.on_cut()
    f.resume_points()
    assert f.on_message(Error(code=ErrorCode.RESUME_PENDING, message="later")) == [AttachLater()]
    assert not f.attaching and not f.over
    f.resume_points()
    (forgot,) = f.on_message(Error(code=ErrorCode.UNKNOWN_RUN, message="no run"))
    assert isinstance(forgot, Broken) and "fate is unknown here" in forgot.message
    g = started()
    (replaced,) = g.on_message(Replaced(run_id=RUN))
    assert isinstance(replaced, Broken) and replaced.code is ErrorCode.REPLACED
    h = Follower(run_id=RUN)  # a first attach told `unknown_run`: the plain refusal
    (refused,) = h.on_message(Error(code=ErrorCode.UNKNOWN_RUN, message="no run r-1"))
    assert isinstance(refused, Broken) and refused.message == "no run r-1"


def test_events_of_another_run_end_the_following():
    f = started()
    (bad,) = f.on_message(RunUpdate(run_id="r-2", hand="box", state=RunState.RUNNING))
    assert isinstance(bad, Broken) and bad.code == "protocol" and "r-2" in bad.message
    assert f.on_message(data(0, b"x")) == []  # nothing after the end
