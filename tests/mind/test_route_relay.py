"""A node relaying another node's answers to its client (DESIGN §16) forwards their payloads as
they came, never built into models (issue 27 item 4: the routed hop's cost): what the client reads
must be what it would have read from a node that built them, under its own request id and its own
connection's sequence, and a frame the holding node should never have sent closes the link,
answering the client, without ever taking this node down."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from mind.daemon.outbox import Outbox
from mind.daemon.route import LINK_CLOSED, ROUTED_NUMBER_BASE, Forward, Link, Router
from protocol import PROTOCOL_VERSION, frames
from protocol.codes import ErrorCode, RejectCode
from protocol.envelope import Channel, Envelope, encode
from protocol.messages import Error, Message, RunEnd, RunList, RunOutput, RunUpdate, StreamNumbers
from protocol.states import RunState

LINK_ID = "x1"


class Wire:
    """A connection as the outbox writes to it, and as the link's reader reads from it."""

    def __init__(self, incoming: list[bytes] | None = None) -> None:
        self.frames: list[bytes] = []
        self._in = list(incoming or [])
        self.closed = False

    async def send(self, data: bytes) -> None:
        self.frames.append(data)

    def __aiter__(self) -> Wire:
        return self

    async def __anext__(self) -> bytes:
        if not self._in:
            raise StopAsyncIteration
        return self._in.pop(0)

    async def close(self) -> None:
        self.closed = True


class LinkSession:
    """The link's session as the reader uses it: the envelope checks of generation 1."""

    def __init__(self) -> None:
        self.channel = Channel()
        self.channel.gen = 1

    def accept_forwarded(self, seq: int, gen: int | None) -> None:
        self.channel.accept_header(seq, gen)


def envelope(msg: Message, seq: int, id: str | None = LINK_ID) -> bytes:
    return encode(Envelope(msg=msg, seq=seq, id=id, gen=1))


async def relay(incoming: list[bytes], cache: dict[str, str] | None = None) -> tuple[Router, Link, Any, list[Any]]:
    """The link's reader over `incoming` for one client's run waiting under `q7` (the router's
    holder cache as `cache`): what the client's connection got, read as the client reads it (its
    channel, generation 7)."""
    client = Wire()
    channel = Channel()
    channel.gen = 7
    peer = SimpleNamespace(conn_id="c1", outbox=Outbox(client, channel), ws=None)  # type: ignore[arg-type]
    router = Router(SimpleNamespace(listening=True), None, {"c1": peer}, 10.0, False, lambda c: None)  # type: ignore[arg-type]
    router.cache.update(cache or {})
    link = Link(router, "ws://a")
    link.waiting[LINK_ID] = Forward(peer, "q7", "alice", True, "box")  # type: ignore[arg-type]
    link_ws = Wire(incoming)
    await link._read(link_ws, LinkSession())  # type: ignore[arg-type]
    assert link_ws.closed
    writer = asyncio.create_task(peer.outbox.run())
    peer.outbox.close()
    async with asyncio.timeout(10):
        await writer
    reader = Channel()
    reader.gen = 7
    seen = [reader.receive_any(f) for f in client.frames]
    return router, link, peer, seen


UPDATE = RunUpdate(run_id="r1", hand="box", state=RunState.RUNNING, gen=1)
END = RunEnd(
    run_id="r1", hand="box", tool="read_file", state=RunState.SUCCEEDED, value={"data": b"x" * 100, "size": 100}
)


async def test_a_run_s_answers_reach_the_client_as_sent_under_its_id_and_its_sequence():
    router, link, _, seen = await relay([envelope(UPDATE, 1), envelope(END, 2)])
    assert [(e.seq, e.id, e.gen) for e in seen] == [(1, "q7", 7), (2, "q7", 7)]
    assert [e.msg for e in seen] == [UPDATE, END]
    assert link.waiting == {}  # ended: nothing left waiting on the link
    assert router.runs["r1"].hand == "box" and router.runs["r1"].owner == "alice"  # cancel/get go there


async def test_a_relayed_frame_is_the_frame_the_holding_node_would_write():
    """Same bytes as a node that builds the model writes (payload and all), only seq, id and gen
    its own: the fast CLI path (`mind/client/wire.py`) reads what it read before."""
    _, _, peer, _ = await relay([envelope(END, 1)])
    built = Channel()
    built.gen = 7
    assert peer.outbox._ws.frames == [built.stamp(END, "q7")]


async def test_stream_numbers_and_data_frames_are_renumbered_for_the_client():
    numbers = StreamNumbers(run_id="r1", stdout=5, stderr=6)
    chunk = frames.encode(5, 0, b"hello\n", False)
    _, link, _, seen = await relay([envelope(numbers, 1), chunk, envelope(END, 2)])
    told = seen[0].msg
    assert told == StreamNumbers(run_id="r1", stdout=ROUTED_NUMBER_BASE, stderr=ROUTED_NUMBER_BASE + 1)
    assert seen[1].msg.data == b"hello\n" and seen[1].msg.stream == "stdout"  # under the client's number
    assert seen[2].msg == END and link.numbers == {}  # the run's numbers die with it


async def test_a_refusal_naming_the_hand_gone_forgets_where_it_was():
    gone = END.model_copy(update={"state": RunState.REJECTED, "reject_code": RejectCode.HAND_OFFLINE, "value": None})
    router, _, _, seen = await relay([envelope(gone, 1)], cache={"box": "ws://a", "other": "ws://a"})
    assert seen[0].msg == gone
    assert router.cache == {"other": "ws://a"}  # the next run for `box` asks the database


def raw(t: str, p: dict[str, Any], seq: int = 1) -> bytes:
    frame = {"v": PROTOCOL_VERSION, "t": t, "id": LINK_ID, "seq": seq, "gen": 1, "p": p}
    return msgpack.packb(frame, use_bin_type=True)


BAD = {
    "a gap in seq": envelope(UPDATE, 2),
    "another generation": encode(Envelope(msg=UPDATE, seq=1, id=LINK_ID, gen=2)),
    "not msgpack": b"\x00\x01garbage",
    "an unknown type": raw("run_exploded", {"run_id": "r1"}),
    "a stream_data envelope": raw("stream_data", {"run_id": "r1", "stream": "stdout", "data": b"x"}),
    "a stream number of the wrong type": raw("stream_numbers", {"run_id": "r1", "stdout": True}),
    "a stream number out of range": raw("stream_numbers", {"run_id": "r1", "stdout": 0}),
    "stream numbers of no run": raw("stream_numbers", {"run_id": 5, "stdout": 3}),
}


@pytest.mark.parametrize("frame", BAD.values(), ids=BAD.keys())
async def test_a_bad_frame_from_the_holding_node_closes_the_link_and_answers_the_client(frame):
    _, link, _, seen = await relay([frame])
    assert link.waiting == {}
    [answer] = seen
    assert answer.id == "q7" and isinstance(answer.msg, Error)
    assert answer.msg.code is ErrorCode.BUSY and answer.msg.message == LINK_CLOSED


@pytest.mark.parametrize(
    "msg", [RunOutput(run_id="r1", stream="stdout", offset=0, data=b"x" * 1000), RunList(runs=[])], ids=str
)
def test_a_forwarded_payload_counts_in_the_client_s_queue_as_its_model_would(msg):
    """The queue's byte bound (issue 23 attack 4) holds for relayed answers as for the node's own."""
    built, forwarded = Outbox(Wire(), Channel()), Outbox(Wire(), Channel())  # type: ignore[arg-type]
    built.put(msg, "q1")
    forwarded.put_raw(msg.TYPE, msg.model_dump(), "q1")
    assert forwarded.bound.queued == built.bound.queued
