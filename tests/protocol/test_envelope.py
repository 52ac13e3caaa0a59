"""The codec: any input yields a message or a ProtocolError, never anything else."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import PROTOCOL_VERSION, limits
from protocol.codes import ErrorCode
from protocol.envelope import Channel, Envelope, decode, encode
from protocol.errors import ProtocolError
from protocol.messages import Hello, Progress, Result, Rpc


def frame(**over):
    base = {"v": PROTOCOL_VERSION, "t": "accepted", "id": None, "seq": 1, "gen": None, "p": {"run_id": "r1"}}
    base.update(over)
    return msgpack.packb(base, use_bin_type=True)


def test_round_trip_keeps_every_field():
    msg = Rpc(run_id="r1", tool="exec", args={"argv": ["ls", "-l"], "n": 3}, timeout_ms=5000, grace_ms=100)
    env = decode(encode(Envelope(msg=msg, seq=7, id="q1", gen=4)))
    assert env.msg == msg and env.seq == 7 and env.id == "q1" and env.gen == 4


def test_other_version_is_refused_naming_both_versions():
    with pytest.raises(ProtocolError) as ei:
        decode(frame(v=PROTOCOL_VERSION + 1))
    assert ei.value.code is ErrorCode.VERSION_MISMATCH
    assert str(PROTOCOL_VERSION + 1) in ei.value.message and str(PROTOCOL_VERSION) in ei.value.message


@pytest.mark.parametrize(
    "data,code",
    [
        (b"", ErrorCode.MALFORMED_FRAME),
        (b"\xc1", ErrorCode.MALFORMED_FRAME),
        (msgpack.packb([1, 2]), ErrorCode.MALFORMED_FRAME),
        (frame() + b"\x00", ErrorCode.MALFORMED_FRAME),
        (frame(t="no_such_type"), ErrorCode.UNKNOWN_TYPE),
        (frame(p={"run_id": "r1", "extra": 1}), ErrorCode.INVALID_PAYLOAD),
        (frame(p={"run_id": 5}), ErrorCode.INVALID_PAYLOAD),
        (frame(seq=0), ErrorCode.MALFORMED_FRAME),
        (frame(seq=True), ErrorCode.MALFORMED_FRAME),
        (frame(v="1"), ErrorCode.MALFORMED_FRAME),
        ("text frame", ErrorCode.MALFORMED_FRAME),
        (b"\x00" * (limits.MAX_FRAME_BYTES + 1), ErrorCode.FRAME_TOO_LARGE),
        (msgpack.packb(msgpack.ExtType(5, b"x")), ErrorCode.MALFORMED_FRAME),
    ],
)
def test_bad_frames_get_a_code(data, code):
    with pytest.raises(ProtocolError) as ei:
        decode(data)
    assert ei.value.code is code
    assert ei.value.message


def test_deep_nesting_is_refused_not_crashing():
    deep = b"\x91" * 100_000 + b"\xc0"  # 100k nested one-element arrays
    with pytest.raises(ProtocolError):
        decode(deep)


def test_progress_chunk_over_cap_is_refused_on_receive():
    big = {"run_id": "r1", "stream": "stdout", "offset": 0, "data": b"x" * (limits.PROGRESS_CHUNK_MAX + 1)}
    with pytest.raises(ProtocolError) as ei:
        decode(frame(t="progress", p=big))
    assert ei.value.code is ErrorCode.INVALID_PAYLOAD


def test_strict_types_no_coercion():
    # a string where bytes belong is not silently accepted
    p = {"run_id": "r1", "stream": "stdout", "offset": 0, "data": "text"}
    with pytest.raises(ProtocolError):
        decode(frame(t="progress", p=p))


def test_result_cannot_claim_lost_or_rejected():
    for state in ("lost", "rejected", "running"):
        with pytest.raises(ProtocolError):
            decode(frame(t="result", p={"run_id": "r1", "state": state}))
    ok = decode(frame(t="result", p={"run_id": "r1", "state": "succeeded"}))
    assert isinstance(ok.msg, Result)


def test_error_message_never_echoes_input():
    secret = "s3cr3t-value-" + "x" * 40
    with pytest.raises(ProtocolError) as ei:
        decode(frame(p={"run_id": secret + "/"}))
    assert secret not in ei.value.message
    with pytest.raises(ProtocolError) as ei:
        decode(frame(p={"run_id": "r1", secret: 1}))
    assert secret not in ei.value.message


def test_channel_refuses_gaps_repeats_and_foreign_generations():
    tx, rx = Channel(), Channel()
    a = tx.stamp(Progress(run_id="r", stream="stdout", offset=0, data=b"a"))
    b = tx.stamp(Progress(run_id="r", stream="stdout", offset=1, data=b"b"))
    c = tx.stamp(Progress(run_id="r", stream="stdout", offset=2, data=b"c"))
    rx.receive(a)
    with pytest.raises(ProtocolError) as ei:
        rx.receive(c)  # gap
    assert ei.value.code is ErrorCode.SEQ_VIOLATION
    rx2 = Channel()
    rx2.receive(a)
    with pytest.raises(ProtocolError):
        rx2.receive(a)  # repeat
    tx3, rx3 = Channel(), Channel()
    tx3.gen, rx3.gen = 2, 3
    with pytest.raises(ProtocolError) as ei:
        rx3.receive(tx3.stamp(Progress(run_id="r", stream="stdout", offset=0, data=b"a")))
    assert ei.value.code is ErrorCode.GEN_MISMATCH
    del b


def test_oversize_outbound_frame_leaves_no_seq_gap():
    tx, rx = Channel(), Channel()
    huge = Result(run_id="r", state="succeeded", value=b"x" * limits.MAX_FRAME_BYTES)
    with pytest.raises(ProtocolError):
        tx.stamp(huge)
    rx.receive(tx.stamp(Result(run_id="r", state="succeeded")))  # seq 1, not 2


@given(st.binary(max_size=512))
def test_any_bytes_give_a_message_or_protocol_error(data):
    try:
        env = decode(data)
    except ProtocolError as exc:
        assert isinstance(exc.code, ErrorCode)
    else:
        assert isinstance(env, Envelope)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(
    st.fixed_dictionaries(
        {
            "v": st.one_of(st.just(PROTOCOL_VERSION), msgpack_values),
            "t": st.one_of(
                st.sampled_from(sorted(__import__("protocol.messages", fromlist=["x"]).MESSAGE_TYPES)), msgpack_values
            ),
            "id": st.one_of(st.none(), st.text(max_size=10), msgpack_values),
            "seq": st.one_of(st.integers(-3, 5), msgpack_values),
            "gen": st.one_of(st.none(), st.integers(-3, 5), msgpack_values),
            "p": st.one_of(st.dictionaries(st.text(max_size=12), msgpack_values, max_size=6), msgpack_values),
        }
    )
    | msgpack_values
)
def test_any_msgpack_value_gives_a_message_or_protocol_error(value):
    data = msgpack.packb(value, use_bin_type=True)
    try:
        decode(data)
    except ProtocolError:
        pass


def test_hello_label_must_be_well_formed():
    p = {"role": "hand", "label": "../etc", "nonce": b"n" * 32, "claims": None}
    with pytest.raises(ProtocolError):
        decode(frame(t="hello", p=p))
    p["label"] = "laptop"
    assert isinstance(decode(frame(t="hello", p=p)).msg, Hello)


def test_a_container_longer_than_any_message_has_is_refused_before_it_is_built():
    import gc

    raw = {"v": PROTOCOL_VERSION, "t": "hello", "id": None, "seq": 1, "gen": None}
    for p in (
        {"x": [None] * (limits.MAX_CONTAINER_ITEMS + 1)},
        {str(i): 0 for i in range(limits.MAX_CONTAINER_ITEMS + 1)},
    ):
        with pytest.raises(ProtocolError) as ei:
            decode(msgpack.packb(raw | {"p": p}, use_bin_type=True))
        assert ei.value.code is ErrorCode.MALFORMED_FRAME
        assert gc.isenabled(), "the collector is paused only while decoding"
