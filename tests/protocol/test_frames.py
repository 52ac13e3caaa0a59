"""The data frame codec (`protocol/frames.py`, DESIGN §11b) and a connection's stream numbers.

Untrusted bytes give a header and a view of the payload, or a `ProtocolError` with the codes
malformed msgpack gets (`malformed_frame`, `frame_too_large`), nothing else. A number a connection
never gave is refused; a number that has died is a late frame (None); a data frame never reads as
an envelope, nor an envelope as a data frame."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import frames, limits
from protocol.codes import ErrorCode
from protocol.envelope import Channel, Envelope, decode, encode
from protocol.errors import ProtocolError
from protocol.messages import RunEnd, StreamData, StreamNumbers
from protocol.states import RunState

NUMBERS = st.integers(1, frames.NUMBER_MAX)
OFFSETS = st.integers(0, frames.OFFSET_MAX)
PAYLOADS = st.binary(max_size=4096)


@given(NUMBERS, OFFSETS, PAYLOADS, st.booleans())
def test_round_trip(number, offset, data, eof):
    eof = eof or not data  # an empty chunk carries the end
    raw = frames.encode(number, offset, data, eof)
    assert len(raw) == frames.HEADER_SIZE + len(data) and frames.is_frame(raw)
    got = frames.decode(raw)
    assert got[:3] == (number, offset, eof) and bytes(got[3]) == data
    assert isinstance(got[3], memoryview) and got[3].obj is raw, "the payload is a view, not a copy"


@given(st.binary(max_size=frames.HEADER_SIZE - 1))
def test_a_short_header_is_malformed(data):
    data = bytes([frames.MAGIC]) + data[: frames.HEADER_SIZE - 2]
    with pytest.raises(ProtocolError) as exc:
        frames.decode(data)
    assert exc.value.code is ErrorCode.MALFORMED_FRAME


@given(st.integers(2, 255), NUMBERS, OFFSETS)
def test_unknown_flags_are_malformed(flags, number, offset):
    raw = frames.HEADER.pack(frames.MAGIC, flags, number, offset) + b"x"
    with pytest.raises(ProtocolError) as exc:
        frames.decode(raw)
    assert exc.value.code is ErrorCode.MALFORMED_FRAME


def test_number_zero_and_an_empty_chunk_without_eof_are_malformed():
    for raw in (frames.HEADER.pack(frames.MAGIC, 0, 0, 0) + b"x", frames.HEADER.pack(frames.MAGIC, 0, 1, 0)):
        with pytest.raises(ProtocolError) as exc:
            frames.decode(raw)
        assert exc.value.code is ErrorCode.MALFORMED_FRAME


def test_an_oversize_chunk_is_too_large():
    raw = frames.header(1, 0, False) + b"x" * (limits.STREAM_CHUNK_MAX + 1)
    with pytest.raises(ProtocolError) as exc:
        frames.decode(raw)
    assert exc.value.code is ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(ValueError):
        frames.encode(1, 0, b"x" * (limits.STREAM_CHUNK_MAX + 1), False)


@given(st.binary(min_size=1, max_size=64))
def test_arbitrary_bytes_give_a_frame_or_a_protocol_error(data):
    data = bytes([frames.MAGIC]) + data
    try:
        number, offset, eof, payload = frames.decode(data)
    except ProtocolError as exc:
        assert exc.code in (ErrorCode.MALFORMED_FRAME, ErrorCode.FRAME_TOO_LARGE)
    else:
        assert number >= 1 and 0 <= offset <= frames.OFFSET_MAX and (payload or eof)


@given(NUMBERS, OFFSETS, PAYLOADS)
def test_a_data_frame_is_never_an_envelope_nor_an_envelope_a_data_frame(number, offset, data):
    raw = frames.encode(number, offset, data or b"x", False)
    with pytest.raises(ProtocolError) as exc:
        decode(raw)  # a reader of envelopes (an old peer) refuses it cleanly
    assert exc.value.code is ErrorCode.MALFORMED_FRAME
    env = encode(Envelope(msg=StreamNumbers(run_id="r1", stdout=number), seq=1))
    assert not frames.is_frame(env)


# --- a connection's numbers, as the ends hold them ----------------------------------------------


def opened() -> Channel:
    ch = Channel()
    ch.gen = 1
    return ch


def test_the_ends_learn_numbers_and_name_chunks_by_them():
    mind, hand = Channel(), opened()
    mind.gen = 1
    hand.accept(Envelope(msg=StreamNumbers(run_id="r1", stdout=1, stdin=3), seq=1, gen=1))
    raw = hand.stamp(StreamData(run_id="r1", stream="stdout", offset=0, data=b"hi"))
    assert frames.decode(raw)[:3] == (1, 0, False)
    env = hand.receive_any(frames.encode(3, 5, b"in", True))
    assert env is not None and env.msg == StreamData(run_id="r1", stream="stdin", offset=5, data=b"in", eof=True)
    with pytest.raises(ProtocolError, match="no stream number"):
        hand.stamp(StreamData(run_id="r2", stream="stdout", offset=0, data=b"x"))


def test_a_number_never_given_is_refused_and_a_dead_one_is_dropped():
    ch = opened()
    with pytest.raises(ProtocolError, match="never given"):
        ch.receive_any(frames.encode(1, 0, b"x", False))  # another connection's number: not this one's
    ch.accept(Envelope(msg=StreamNumbers(run_id="r1", stdout=1, stderr=2), seq=1, id="q1", gen=1))
    env = ch.receive_any(frames.encode(2, 0, b"x", False))
    assert env is not None and env.id == "q1", "a chunk travels under its run's request id"
    end = RunEnd(run_id="r1", hand="h", tool="exec", state=RunState.SUCCEEDED, exit_code=0, duration_ms=1)
    ch.accept(Envelope(msg=end, seq=2, id="q1", gen=1))
    assert ch.receive_any(frames.encode(2, 10, b"x", False)) is None, "the run ended: a late frame"
    with pytest.raises(ProtocolError, match="never given"):
        ch.receive_any(frames.encode(3, 0, b"x", False))


def test_the_mind_never_reuses_a_number_on_a_connection():
    table = frames.Numbers()
    a = table.assign("r1", ["stdout", "stderr"])
    table.drop_run("r1")
    b = table.assign("r2", ["stdout"])
    assert set(a.values()).isdisjoint(b.values())
    assert table.lookup(a["stdout"]) is None, "dead, not unknown"
    assert table.assign("r2", ["stdout"]) == b, "a stream keeps its number while it lives"
