"""The Mind's outbox never leaves a request unanswered: a reply that cannot be sent (over the frame
limit, or not encodable) becomes an `error` reply for the same request id (DESIGN §11). Before,
the frame was logged and dropped, and `mind runs` waited for ever for a run list of 9-100 MB."""

from __future__ import annotations

import asyncio

from mind.daemon.outbox import Outbox
from protocol import limits
from protocol.codes import ErrorCode
from protocol.envelope import Channel, decode
from protocol.errors import ProtocolError
from protocol.messages import Error, RunEnd, RunList
from protocol.states import RunState


class Wire:
    """What the outbox writes to: every frame, in order."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def send(self, data: bytes) -> None:
        self.frames.append(data)

    def decoded(self) -> list[tuple[int, str | None, object]]:
        return [(env.seq, env.id, env.msg) for env in map(decode, self.frames)]


def end(value: object) -> RunEnd:
    return RunEnd(run_id="r1", hand="h", tool="read_file", state=RunState.SUCCEEDED, value=value)


TOO_LARGE = end({"data": b"x" * limits.MAX_FRAME_BYTES})


async def drain(box: Outbox) -> None:
    task = asyncio.create_task(box.run())
    box.close()
    async with asyncio.timeout(10):
        await task


async def test_a_reply_too_large_to_send_becomes_an_error_for_its_request_in_order():
    wire = Wire()
    box = Outbox(wire, Channel())  # type: ignore[arg-type]
    box.put(TOO_LARGE, "q1")
    box.put(RunList(runs=[]), "q2")
    await drain(box)
    [(seq1, id1, err), (seq2, id2, after)] = wire.decoded()
    assert (seq1, id1, seq2, id2) == (1, "q1", 2, "q2")  # no gap in seq, nothing reordered
    assert isinstance(err, Error) and err.code is ErrorCode.FRAME_TOO_LARGE
    assert "run_end" in err.message and str(limits.MAX_FRAME_BYTES) in err.message
    assert after == RunList(runs=[]) and box.refused == 1


async def test_a_reply_that_cannot_be_encoded_becomes_an_internal_error():
    wire = Wire()
    box = Outbox(wire, Channel())  # type: ignore[arg-type]
    box.put(end({"not": object()}), "q1")
    await drain(box)
    [(_, id_, err)] = wire.decoded()
    assert id_ == "q1" and isinstance(err, Error) and err.code is ErrorCode.INTERNAL_ERROR


async def test_a_push_that_cannot_be_sent_is_dropped_without_a_gap():
    wire = Wire()
    box = Outbox(wire, Channel())  # type: ignore[arg-type]
    box.put(TOO_LARGE)  # no request id: nobody waits for it, nothing to answer
    box.put(RunList(runs=[]), "q2")
    await drain(box)
    assert [(seq, id_) for seq, id_, _ in wire.decoded()] == [(1, "q2")]


async def test_on_a_hands_connection_the_waiting_request_is_told_instead():
    """There the ids name the Mind's own requests, and a Hand drops a connection on `error`."""
    wire = Wire()
    told: list[tuple[str, ProtocolError]] = []
    box = Outbox(wire, Channel(), on_refused=lambda id_, why: told.append((id_, why)))  # type: ignore[arg-type]
    box.put(TOO_LARGE, "m1")
    await drain(box)
    assert wire.frames == [] and [(i, w.code) for i, w in told] == [("m1", ErrorCode.FRAME_TOO_LARGE)]
