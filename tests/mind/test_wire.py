"""mind/client/wire.py (the fast path's pydantic-free checks) against protocol/messages.py (the contract).

The property: for any payload, if `wire` accepts it then the pydantic model accepts it too and
holds the same values (same types); and `wire` accepts every payload the models produce. Plus the
drift check (same fields, same defaults), byte-identical outgoing frames, and the same handshake.
"""

import math
import os

import msgpack
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mind.client import wire
from mind.core.handshake import ServerHandshake
from mind.client.blocking import _Handshake
from protocol import PROTOCOL_VERSION, limits
from protocol.auth import ClientHandshake, Credential
from protocol.codes import CancelStatus, ErrorCode, KillStage, RejectCode
from protocol.envelope import Channel, Envelope, decode, encode
from protocol.errors import ProtocolError
from protocol.messages import MESSAGE_TYPES, CancelRun, Exec, Hello, OutputTail, Proof, RunEnd
from protocol.states import RunState

ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
INT64 = st.integers(-(2**63), 2**64 - 1)
NONNEG = st.integers(0, 2**64 - 1)
MSGPACK = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def values(e):
    return st.sampled_from([m.value for m in e])


TAIL = st.fixed_dictionaries({}, optional={"data": st.binary(max_size=100), "total": NONNEG})
OUTCOME = {
    "run_id": ID,
    "state": values(RunState),
    "reason": st.text(max_size=30),
    "exit_code": st.none() | INT64,
    "signal": st.none() | INT64,
    "stage": st.none() | values(KillStage),
    "stdout": TAIL,
    "stderr": TAIL,
    "truncated": st.booleans(),
    "progress_dropped": NONNEG,
    "value": MSGPACK,
    "error": st.none() | st.text(max_size=30),
    "duration_ms": NONNEG,
}
VALID = {  # field -> strategy of values the model accepts; `required` as in the model
    "challenge": (
        {
            "mind_id": ID,
            "handshake_id": ID,
            "nonce": st.binary(min_size=32, max_size=32),
            "expires_in_ms": st.integers(1, 60_000),
        },
        {},
    ),
    "welcome": (
        {
            "gen": st.integers(1, 2**63),
            "mac": st.binary(min_size=32, max_size=32),
            "ping_interval_s": st.floats(0, 3600, exclude_min=True) | st.integers(1, 3600),
        },
        {},
    ),
    "error": ({"code": values(ErrorCode), "message": st.text(max_size=50)}, {}),
    "run_update": (
        {"run_id": ID, "hand": ID.filter(lambda s: len(s) <= 64), "state": values(RunState)},
        {"gen": st.none() | INT64},
    ),
    "run_output": (
        {
            "run_id": ID,
            "stream": st.sampled_from(["stdout", "stderr"]),
            "offset": NONNEG,
            "data": st.binary(min_size=1, max_size=200),
        },
        {},
    ),
    "run_end": (
        {
            "run_id": ID,
            "state": st.sampled_from(
                [
                    s.value
                    for s in RunState
                    if s.value not in ("admitted", "sent", "accepted", "running", "cancel_requested")
                ]
            ),
            "hand": ID.filter(lambda s: len(s) <= 64),
            "tool": ID.filter(lambda s: len(s) <= 64),
        },
        {
            **{k: v for k, v in OUTCOME.items() if k not in ("run_id", "state")},
            "reject_code": st.none() | values(RejectCode),
        },
    ),
    "cancel_run_result": ({"run_id": ID, "status": values(CancelStatus), "state": values(RunState)}, {}),
}
NASTY = (
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            1,
            -1,
            2**63,
            2**64 - 1,
            1.0,
            0.5,
            -0.0,
            math.inf,
            math.nan,
            "",
            "a",
            "a\n",
            "\na",
            "x" * 4097,
            "x" * 16385,
            "A" * 65,
            "-ab",
            "ab cd",
            "r1",
            "running",
            "succeeded",
            "admitted",
            "stdout",
            "term",
            "42",
            b"",
            b"x",
            b"x" * 32,
            b"x" * 33,
            b"x" * 4097,
            [],
            {},
            {"data": b"x"},
            {"total": -1},
            {"data": "x"},
            {"extra": 1},
            [1, 2],
            3600.5,
            3600,
            60_001,
        ]
    )
    | MSGPACK
)


def payloads(t):
    required, optional = VALID[t]
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def mutated(draw, t):
    p = dict(draw(payloads(t)))
    required, optional = VALID[t]
    keys = sorted(set(required) | set(optional))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["set", "set", "set", "drop", "extra"]))
        if how == "set":
            p[draw(st.sampled_from(keys))] = draw(NASTY)
        elif how == "drop" and p:
            p.pop(draw(st.sampled_from(sorted(p, key=repr))))
        else:
            p[draw(st.sampled_from(["extra", "TYPE", b"run_id"]))] = draw(NASTY)
    return p


def typed(v):
    """A value with its type spelled out, so 5 and 5.0 (or "x" and an enum) do not compare equal."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    if isinstance(v, float) and math.isnan(v):
        return ("float", "nan")
    return (type(v).__name__, v)


def both(t, p):
    try:
        m = MESSAGE_TYPES[t].model_validate(p)
    except pydantic.ValidationError:
        m = None
    try:
        lite = wire.INBOUND[t](p)
    except wire.Invalid:
        lite = None
    return m, lite


@pytest.mark.parametrize("t", sorted(wire.INBOUND))
def test_fields_and_defaults_match_the_model(t):
    model = MESSAGE_TYPES[t]
    fields = wire.INBOUND[t].fields
    assert list(fields) == list(model.model_fields), f"{t}: field list drifted from protocol/messages.py"
    for name, (_, default) in fields.items():
        info = model.model_fields[name]
        assert (default is wire.REQUIRED) == info.is_required(), f"{t}.{name}: required differs"
        if default is not wire.REQUIRED:
            want = info.default.model_dump() if isinstance(info.default, pydantic.BaseModel) else info.default
            got = default.model_dump() if isinstance(default, wire.Msg) else default
            assert typed(got) == typed(want), f"{t}.{name}: default differs"
    assert set(VALID[t][0]) == {n for n, f in model.model_fields.items() if f.is_required()}


@pytest.mark.parametrize("t", sorted(wire.INBOUND))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_payload_the_model_accepts_from_a_peer_is_read_the_same(t, data):
    p = data.draw(payloads(t))
    m, lite = both(t, p)
    assert m is not None, "the test's strategy made an invalid payload"
    assert lite is not None, f"wire refused a valid {t}: {p!r}"
    assert typed(lite.model_dump()) == typed(m.model_dump(mode="python"))


@pytest.mark.parametrize("t", sorted(wire.INBOUND))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_wire_never_accepts_what_the_model_refuses(t, data):
    p = data.draw(mutated(t))
    m, lite = both(t, p)
    if lite is not None:
        assert m is not None, f"wire accepted a {t} the model refuses: {p!r}"
        assert typed(lite.model_dump()) == typed(m.model_dump(mode="python"))


def test_trailing_newline_and_bool_for_int_are_refused_like_the_model():
    ok = {"run_id": "r1", "hand": "box", "state": "running"}
    assert wire.INBOUND["run_update"](ok).state is RunState.RUNNING
    for bad in ({**ok, "run_id": "r1\n"}, {**ok, "hand": "box\n"}, {**ok, "gen": True}, {**ok, "state": "nope"}):
        m, lite = both("run_update", bad)
        assert m is None and lite is None


def test_run_end_must_be_terminal():
    p = {"run_id": "r1", "state": "running", "hand": "h", "tool": "exec"}
    with pytest.raises(ProtocolError) as ei:
        wire.decode(frame("run_end", p))
    assert ei.value.code is ErrorCode.INVALID_PAYLOAD and "terminal" in ei.value.message


def frame(t, p, **over):
    raw = {"v": PROTOCOL_VERSION, "t": t, "id": "x1", "seq": 1, "gen": 1, "p": p, **over}
    return msgpack.packb(raw, use_bin_type=True)


def test_frames_encoded_from_models_decode_to_the_same_fields():
    end = RunEnd(
        run_id="r1",
        state=RunState.FAILED,
        hand="h",
        tool="exec",
        exit_code=3,
        stdout=OutputTail(data=b"out", total=3),
        value={"k": [1, b"b"]},
        reject_code=None,
    )
    env = wire.decode(encode(Envelope(msg=end, seq=4, id="x1", gen=2)))
    assert (env.seq, env.id, env.gen, env.msg.TYPE) == (4, "x1", 2, "run_end")
    assert typed(env.msg.model_dump()) == typed(end.model_dump(mode="python"))
    assert env.msg.stdout.data == b"out" and env.msg.state is RunState.FAILED


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        msgpack.packb([1]),
        frame("run_update", {}, v=PROTOCOL_VERSION + 1),
        frame("run_update", {}, seq=0),
        frame("run_update", {}, id="bad id"),
        frame("nope", {}),
        frame("run_update", {"run_id": 1}),
        "text",
    ],
)
def test_bad_frames_are_protocol_errors_with_the_envelopes_codes(data):
    with pytest.raises(ProtocolError) as lite:
        wire.decode(data)
    try:
        decode(data)
    except ProtocolError as full:
        if full.code is not ErrorCode.UNKNOWN_TYPE:  # wire: any type it does not read is unexpected
            assert lite.value.code is full.code
    else:
        pytest.fail("the full decoder accepted it")


def test_types_the_fast_path_does_not_read_are_refused():
    with pytest.raises(ProtocolError) as ei:
        wire.decode(frame("hands_list", {"hands": []}))
    assert ei.value.code is ErrorCode.UNEXPECTED_MESSAGE


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_any_bytes_give_a_message_or_a_protocol_error(data):
    try:
        wire.decode(data)
    except ProtocolError:
        pass


def test_outgoing_frames_are_byte_identical_to_the_models():
    pairs = [
        (wire.hello("client", "admin", b"n" * 32), Hello(role="client", label="admin", nonce=b"n" * 32)),
        (wire.proof("hs1", b"m" * 32), Proof(handshake_id="hs1", mac=b"m" * 32)),
        (
            wire.exec_("box", "exec", {"argv": ["ls", "-l"], "env": {"A": "1"}}, 5000, None, False),
            Exec(hand="box", tool="exec", args={"argv": ["ls", "-l"], "env": {"A": "1"}}, timeout_ms=5000, watch=False),
        ),
        (
            wire.exec_("box", "shell", {"command": "true"}, 1, 250, True),
            Exec(hand="box", tool="shell", args={"command": "true"}, timeout_ms=1, grace_ms=250, watch=True),
        ),
        (wire.cancel_run("r1"), CancelRun(run_id="r1")),
    ]
    for lite, model in pairs:
        a, b = Channel(), Channel()
        a.gen = b.gen = 3
        assert a.stamp(lite, "q1") == b.stamp(model, "q1"), model.TYPE


def test_the_handshake_is_the_same_state_machine_with_the_same_bytes():
    cred = Credential(role="client", label="admin", secret=os.urandom(32))
    nonce = os.urandom(32)
    full, lite = ClientHandshake(cred, nonce), _Handshake(cred, nonce)
    assert Channel().stamp(lite.hello()) == Channel().stamp(full.hello())
    server = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)
    challenge = server.on_hello(full.hello(), cred.secret, os.urandom(32), now=0.0)
    lite_challenge = wire.decode(encode(Envelope(msg=challenge, seq=1))).msg
    lite_proof = lite.on_challenge(lite_challenge)
    assert Channel().stamp(lite_proof) == Channel().stamp(full.on_challenge(challenge))
    assert server.on_proof(decode(Channel().stamp(lite_proof)).msg, now=0.0).label == "admin"
    welcome = server.welcome(5, 10.0)
    lite_welcome = wire.decode(encode(Envelope(msg=welcome, seq=2, gen=5))).msg
    assert lite.on_welcome(lite_welcome) == full.on_welcome(welcome) == 5
    forged = welcome.model_copy(update={"mac": bytes(32)})
    lite2 = _Handshake(cred, nonce)
    lite2.on_challenge(lite_challenge)
    with pytest.raises(ProtocolError) as ei:
        lite2.on_welcome(wire.decode(encode(Envelope(msg=forged, seq=2, gen=5))).msg)
    assert ei.value.code is ErrorCode.AUTH_FAILED


def test_msg_is_read_only_and_hides_values_in_repr():
    m = wire.hello("client", "admin", b"secret-nonce-xxxxxxxxxxxxxxxxxxxx")
    with pytest.raises(AttributeError):
        m.label = "x"
    assert "secret" not in repr(m)
    assert limits.NONCE_BYTES == 32
