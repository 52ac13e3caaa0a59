"""mind/client/session.py, the client session core both shells use, fed frames in every order.

The Mind's side is the real one where it can be: `mind.core.handshake.ServerHandshake` answers
the handshake and a `protocol.envelope.Channel` numbers its frames, so a frame here is byte for byte
what a Mind sends. Every test runs with both codecs the shells use: the pydantic models
(`MindClient`) and `mind.client.wire` (the fast path), and one test checks they see the same events.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mind.client import wire
from mind.client.session import (
    CLOSE_PROTOCOL_ERROR,
    ClientSession,
    Closed,
    Failed,
    Opened,
    Reply,
    RunEnded,
    RunEvent,
)
from mind.core.handshake import ServerHandshake
from mind.errors import ClientError
from protocol import PROTOCOL_VERSION, limits
from protocol.auth import ClientHandshake, Credential
from protocol.codes import CancelStatus, ErrorCode
from protocol.envelope import Channel, decode
from protocol.messages import (
    Attach,
    Attached,
    CancelRun,
    CancelRunResult,
    Error,
    Exec,
    Replaced,
    RunEnd,
    RunOutput,
    RunUpdate,
    StreamPosition,
    StreamResume,
)
from protocol.states import RunState

GEN = 5
SECRET = bytes(range(32))
CRED = Credential(role="client", label="admin", secret=SECRET)


class Codec(NamedTuple):
    name: str
    decode: Any
    handshake: Any
    exec_: Any
    cancel_run: Any


def _exec(**fields: Any) -> Any:
    return Exec(**fields)


def _cancel_run(**fields: Any) -> Any:
    return CancelRun(**fields)


FULL = Codec("models", decode, ClientHandshake, _exec, _cancel_run)
FAST = Codec("wire", wire.decode, wire.Handshake, wire.exec_, wire.cancel_run)
CODECS = pytest.mark.parametrize("codec", [FULL, FAST], ids=lambda c: c.name)


class Mind:
    """The Mind's end of one connection: reads what the session sends, stamps what it answers."""

    def __init__(self, secret: bytes | None = SECRET) -> None:
        self.channel = Channel()
        self.inbound = Channel()
        self.hs = ServerHandshake("mind-1", "hs-1", os.urandom(32), now=0.0)
        self.secret = secret

    def read(self, session: ClientSession) -> list[Any]:
        """The envelopes the session wants sent, decoded and checked as the Mind checks them."""
        return [self.inbound.receive(data) for data in session.data_to_send()]

    def frame(self, msg: Any, id: str | None = None) -> bytes:
        return self.channel.stamp(msg, id)

    def challenge(self, session: ClientSession) -> bytes:
        (hello,) = self.read(session)
        return self.frame(self.hs.on_hello(hello.msg, self.secret, os.urandom(32), now=0.0))

    def welcome(self, session: ClientSession, mac: bytes | None = None, window: float = 0.0) -> bytes:
        (proof,) = self.read(session)
        self.hs.on_proof(proof.msg, now=0.0)
        welcome = self.hs.welcome(GEN, 20.0, window)
        if mac is not None:
            welcome = welcome.model_copy(update={"mac": mac})
        data = self.frame(welcome)
        self.channel.gen = self.inbound.gen = GEN
        return data


def new_session(codec: Codec, cred: Credential = CRED) -> ClientSession:
    return ClientSession(cred, os.urandom(limits.NONCE_BYTES), decode=codec.decode, handshake=codec.handshake)


def opened(codec: Codec) -> tuple[ClientSession, Mind]:
    s, mind = new_session(codec), Mind()
    assert s.receive_data(mind.challenge(s)) == []
    assert s.receive_data(mind.welcome(s)) == [Opened(GEN)]
    return s, mind


def exec_msg(codec: Codec) -> Any:
    return codec.exec_(hand="box", tool="exec", args={"argv": ["true"]}, timeout_ms=1000, grace_ms=None, watch=True)


def update(run_id: str, state: RunState = RunState.ADMITTED) -> RunUpdate:
    return RunUpdate(run_id=run_id, hand="box", state=state, gen=GEN)


def output(run_id: str, data: bytes = b"out") -> RunOutput:
    return RunOutput(run_id=run_id, stream="stdout", offset=0, data=data)


def end(run_id: str) -> RunEnd:
    return RunEnd(run_id=run_id, state=RunState.SUCCEEDED, hand="box", tool="exec", exit_code=0)


def cancel_result(run_id: str) -> CancelRunResult:
    return CancelRunResult(run_id=run_id, status=CancelStatus.ALREADY_DONE, state=RunState.SUCCEEDED)


def dump(ev: Any) -> tuple:
    """An event with its message as plain typed values, to compare across codecs."""
    if isinstance(ev, Failed):
        return ("failed", ev.id, ev.error.code, ev.error.message, ev.lost)
    if isinstance(ev, Closed):
        return ("closed", ev.error.code, ev.error.message, ev.close_code, ev.close_reason)
    if isinstance(ev, Opened):
        return ("opened", ev.gen)
    return (type(ev).__name__, ev.id, ev.msg.TYPE, _typed(ev.msg.model_dump(mode="python")))


def _typed(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_typed(x) for x in v]
    return (type(v).__name__, v)


# --- the handshake ------------------------------------------------------------------------------


@CODECS
def test_the_handshake_sends_hello_then_proof_and_opens_on_a_welcome_with_the_minds_mac(codec):
    s, mind = new_session(codec), Mind()
    assert not s.is_open and s.label == "admin"
    challenge = mind.challenge(s)  # the hello was ready at once
    assert s.data_to_send() == []
    assert s.receive_data(challenge) == []
    welcome = mind.welcome(s)  # the Mind checked our proof: it raises on a wrong MAC
    assert s.receive_data(welcome) == [Opened(GEN)]
    assert s.is_open and s.gen == GEN and s.data_to_send() == []


@CODECS
def test_a_hand_credential_is_refused_before_anything_is_sent(codec):
    with pytest.raises(ClientError) as ei:
        new_session(codec, Credential(role="hand", label="box", secret=SECRET))
    assert ei.value.code == "auth_failed" and "hand credential" in ei.value.message


@CODECS
def test_a_welcome_without_the_minds_mac_ends_the_session(codec):
    s, mind = new_session(codec), Mind()
    s.receive_data(mind.challenge(s))
    events = s.receive_data(mind.welcome(s, mac=bytes(32)))
    assert [type(e) for e in events] == [Closed]
    assert events[0].error.code == ErrorCode.AUTH_FAILED.value and "could not prove" in events[0].error.message
    assert not s.is_open and s.data_to_send() == []
    with pytest.raises(ClientError) as ei:
        s.start_run(exec_msg(codec))
    assert ei.value is events[0].error


@CODECS
def test_the_secret_of_another_mind_fails_at_its_proof_check(codec):
    s, mind = new_session(codec), Mind(secret=os.urandom(32))
    s.receive_data(mind.challenge(s))
    with pytest.raises(Exception, match="authentication failed"):
        mind.welcome(s)


@CODECS
@pytest.mark.parametrize("at", ["hello", "proof"])
def test_an_error_frame_during_the_handshake_is_the_refusal(codec, at):
    s, mind = new_session(codec), Mind()
    if at == "proof":
        s.receive_data(mind.challenge(s))
    events = s.receive_data(mind.frame(Error(code=ErrorCode.RATE_LIMITED, message="too many handshakes")))
    assert [dump(e) for e in events] == [("closed", "rate_limited", "too many handshakes", None, "")]


@CODECS
@pytest.mark.parametrize("at", ["hello", "proof"])
def test_the_connection_closing_mid_handshake(codec, at):
    s, mind = new_session(codec), Mind()
    if at == "proof":
        s.receive_data(mind.challenge(s))
    (ev,) = s.connection_lost(ClientError("closed", "received 1008 (policy violation) busy"))
    assert isinstance(ev, Closed) and ev.error.code == "closed"
    assert (
        ev.error.message
        == "the Mind closed the connection during the handshake (received 1008 (policy violation) busy)"
    )
    assert s.connection_lost() == [] and s.receive_data(b"late") == []
    s2 = new_session(codec)
    (ev,) = s2.connection_lost()
    assert ev.error.message == "the Mind closed the connection during the handshake (connection closed)"


@CODECS
def test_frames_out_of_the_handshakes_order_end_it(codec):
    s, mind = new_session(codec), Mind()
    mind.read(s)
    (ev,) = s.receive_data(mind.frame(update("r1")))
    assert (ev.error.code, ev.error.message) == ("protocol", "expected challenge, got run_update")

    s, mind = new_session(codec), Mind()
    challenge = mind.challenge(s)
    s.receive_data(challenge)
    mind.read(s)
    again = mind.frame(decode(challenge).msg)  # the same challenge, sent again
    (ev,) = s.receive_data(again)
    assert (ev.error.code, ev.error.message) == ("protocol", "expected welcome, got challenge")


@CODECS
def test_the_shells_deadline_ends_the_handshake(codec):
    s = new_session(codec)
    (ev,) = s.handshake_timed_out()
    assert (ev.error.code, ev.error.message) == ("handshake_timeout", "the Mind did not complete the handshake in time")
    assert s.handshake_timed_out() == []
    s, _ = opened(codec)
    assert s.handshake_timed_out() == [] and s.is_open


@CODECS
def test_nothing_is_sent_before_the_welcome(codec):
    s = new_session(codec)
    for call in (lambda: s.start_run(exec_msg(codec)), lambda: s.expect_run(), lambda: s.send(exec_msg(codec))):
        with pytest.raises(ClientError) as ei:
            call()
        assert ei.value.code == "protocol"


# --- routing ---------------------------------------------------------------------------------------


@CODECS
def test_ids_are_new_for_each_request_and_run_and_frames_carry_them(codec):
    s, mind = opened(codec)
    ids = [
        s.start_run(exec_msg(codec)),
        s.start_run(exec_msg(codec)),
        s.request(codec.cancel_run(run_id="r1"), "cancel_run_result"),
    ]
    assert len(set(ids)) == 3 and ids[0].startswith("x") and ids[2].startswith("q")
    sent = mind.read(s)
    assert [(e.id, e.msg.TYPE) for e in sent] == [(ids[0], "exec"), (ids[1], "exec"), (ids[2], "cancel_run")]
    assert [e.seq for e in sent] == [3, 4, 5]  # after hello and proof, no gap
    assert sent[0].gen == GEN


@st.composite
def interleavings(draw):
    """Two runs (each: admitted, running, output, end, in order) and two requests, their frames
    interleaved in any order, as a Mind serving them concurrently may send them."""
    streams = {"run0": 4, "run1": 4, "req0": 1, "req1": 1}
    order = draw(st.permutations([k for k, n in streams.items() for _ in range(n)]))
    return order


@CODECS
@given(order=interleavings())
def test_replies_and_run_events_reach_what_asked_for_them_in_any_interleaving(codec, order):
    s, mind = opened(codec)
    ids = {
        "run0": s.start_run(exec_msg(codec)),
        "run1": s.start_run(exec_msg(codec)),
        "req0": s.request(codec.cancel_run(run_id="r-a"), "cancel_run_result"),
        "req1": s.request(codec.cancel_run(run_id="r-b"), "cancel_run_result"),
    }
    script = {
        "run0": [update("r0"), update("r0", RunState.RUNNING), output("r0"), end("r0")],
        "run1": [update("r1"), update("r1", RunState.RUNNING), output("r1", b"x"), end("r1")],
        "req0": [cancel_result("r-a")],
        "req1": [cancel_result("r-b")],
    }
    want = {k: list(v) for k, v in script.items()}
    got: dict[str, list] = {k: [] for k in ids}
    by_id = {v: k for k, v in ids.items()}
    for key in order:
        for ev in s.receive_data(mind.frame(script[key].pop(0), ids[key])):
            got[by_id[ev.id]].append(ev)
    for key in ("run0", "run1"):
        kinds = [type(e) for e in got[key]]
        assert kinds == [RunEvent, RunEvent, RunEvent, RunEnded], key
        assert [e.msg.model_dump() for e in got[key]] == [m.model_dump() for m in want[key]]
    for key in ("req0", "req1"):
        (reply,) = got[key]
        assert isinstance(reply, Reply) and reply.msg.run_id == want[key][0].run_id
    # nothing is left in flight: the end fails nothing
    assert [dump(e) for e in s.connection_lost()] == [("closed", "closed", "connection to the Mind closed", None, "")]


@CODECS
def test_frames_for_unknown_or_forgotten_ids_and_after_the_end_are_dropped(codec):
    s, mind = opened(codec)
    run = s.start_run(exec_msg(codec))
    gone = s.request(codec.cancel_run(run_id="r9"), "cancel_run_result")
    s.forget(gone)
    assert s.receive_data(mind.frame(update("r7"), "x-nobody")) == []
    assert s.receive_data(mind.frame(end("r7"), "x-nobody")) == []
    assert s.receive_data(mind.frame(cancel_result("r9"), gone)) == []
    assert s.receive_data(mind.frame(update("r1"), None)) == []  # an id-less frame that is not an error
    assert [type(e) for e in s.receive_data(mind.frame(end("r1"), run))] == [RunEnded]
    assert s.receive_data(mind.frame(output("r1"), run)) == []  # after its end
    assert s.receive_data(mind.frame(end("r1"), run)) == []
    assert s.is_open


@CODECS
def test_an_error_frame_fails_only_the_request_or_run_it_names(codec):
    s, mind = opened(codec)
    run, other = s.start_run(exec_msg(codec)), s.start_run(exec_msg(codec))
    req = s.request(codec.cancel_run(run_id="r1"), "cancel_run_result")
    refused = Error(code=ErrorCode.DENIED_BY_SCOPE, message="not your hand")
    events = s.receive_data(mind.frame(refused, run))
    assert [dump(e) for e in events] == [("failed", run, "denied_by_scope", "not your hand", False)]
    (ev,) = s.receive_data(mind.frame(Error(code=ErrorCode.UNKNOWN_RUN, message="no such run"), req))
    assert isinstance(ev, Failed) and (ev.id, ev.error.code, ev.lost) == (req, "unknown_run", False)
    assert [type(e) for e in s.receive_data(mind.frame(end("r2"), other))] == [RunEnded]


@CODECS
def test_a_reply_of_another_type_fails_the_request(codec):
    s, mind = opened(codec)
    req = s.request(codec.cancel_run(run_id="r1"), "cancel_run_result")
    (ev,) = s.receive_data(mind.frame(update("r1"), req))
    assert isinstance(ev, Failed) and ev.error.code == "protocol" and not ev.lost
    assert ev.error.message == "expected cancel_run_result in reply to cancel_run, got run_update"


@CODECS
def test_a_run_whose_events_name_two_runs_fails_and_so_does_a_non_event(codec):
    s, mind = opened(codec)
    run = s.start_run(exec_msg(codec))
    assert [type(e) for e in s.receive_data(mind.frame(update("r1"), run))] == [RunEvent]
    (ev,) = s.receive_data(mind.frame(output("r2"), run))
    assert isinstance(ev, Failed) and ev.error.message == "the Mind sent events of run r2 for run r1"
    run = s.start_run(exec_msg(codec))
    (ev,) = s.receive_data(mind.frame(cancel_result("r3"), run))
    assert isinstance(ev, Failed) and ev.error.message == "the Mind answered a run with cancel_run_result"


@CODECS
def test_the_welcome_says_how_long_the_mind_keeps_a_run_for_a_client_that_comes_back(codec):
    s, mind = new_session(codec), Mind()
    assert s.resume_window_s == 0.0
    s.receive_data(mind.challenge(s))
    assert s.receive_data(mind.welcome(s, window=30.0)) == [Opened(GEN)]
    assert (s.resume_window_s, s.ping_interval_s) == (30.0, 20.0)


@CODECS
def test_an_attach_holds_the_run_until_a_newer_attachment_replaces_it(codec):
    s, mind = opened(codec)
    positions = [{"stream": "stdout", "offset": 12, "consumed": 10, "window": None}]
    msg = wire.attach(run_id="r1", streams=positions) if codec is FAST else Attach(run_id="r1", streams=positions)
    att = s.start_run(msg)
    (sent,) = mind.read(s)
    assert sent.msg.TYPE == "attach" and [p.model_dump() for p in sent.msg.streams] == positions
    attached = Attached(run_id="r1", hand="box", state=RunState.RUNNING, streams=[StreamPosition(**positions[0])])
    (ev,) = s.receive_data(mind.frame(attached, att))
    assert isinstance(ev, RunEvent) and ev.msg.TYPE == "attached" and ev.msg.streams[0].offset == 12
    resume = StreamResume(run_id="r1", stream="stdin", offset=3, consumed=3)
    (ev,) = s.receive_data(mind.frame(resume, att))
    assert isinstance(ev, RunEvent) and (ev.msg.TYPE, ev.msg.offset) == ("stream_resume", 3)
    (ev,) = s.receive_data(mind.frame(Replaced(run_id="r1"), att))
    assert isinstance(ev, Failed) and ev.error.code == ErrorCode.REPLACED and not ev.lost
    assert "another attachment took run r1" in ev.error.message
    assert s.receive_data(mind.frame(end("r1"), att)) == []  # nothing more of it is ours


# --- the end -----------------------------------------------------------------------------------


@CODECS
def test_a_lost_connection_fails_everything_in_flight_once_in_order(codec):
    s, mind = opened(codec)
    a, b = s.start_run(exec_msg(codec)), s.request(codec.cancel_run(run_id="r1"), "cancel_run_result")
    c = s.start_run(exec_msg(codec))
    s.receive_data(mind.frame(update("r1"), a))
    lost = ClientError("closed", "the Mind stopped answering (keepalive ping timed out)")
    events = s.connection_lost(lost)
    assert events == [Failed(a, lost, True), Failed(b, lost, True), Failed(c, lost, True), Closed(lost)]
    assert s.connection_lost() == [] and s.receive_data(mind.frame(end("r1"), a)) == []
    with pytest.raises(ClientError) as ei:
        s.start_run(exec_msg(codec))
    assert ei.value is lost


@CODECS
def test_the_reason_the_mind_gave_before_closing_is_the_error(codec):
    s, mind = opened(codec)
    run = s.start_run(exec_msg(codec))
    assert s.receive_data(mind.frame(Error(code=ErrorCode.AUTH_FAILED, message="credential revoked"))) == []
    assert s.is_open  # the Mind closes next
    events = s.connection_lost(ClientError("closed", "connection reset"))
    assert [dump(e) for e in events] == [
        ("failed", run, "auth_failed", "credential revoked", True),
        ("closed", "auth_failed", "credential revoked", None, ""),
    ]
    assert events[0].error is events[1].error


UPDATE = {"run_id": "r1", "hand": "box", "state": "running", "gen": GEN}


def _raw(t: str, p: dict, seq: int, gen: int | None = GEN, id: str | None = None) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, "t": t, "id": id, "seq": seq, "gen": gen, "p": p}, use_bin_type=True)


@CODECS
@pytest.mark.parametrize(
    "bad,code",
    [
        (lambda mind: b"\xc1", "malformed_frame"),
        (lambda mind: _raw("run_update", {"run_id": "r1"}, mind.channel._out + 1), "invalid_payload"),
        (lambda mind: _raw("run_update", UPDATE, mind.channel._out + 2), "seq_violation"),
        (lambda mind: _raw("run_update", UPDATE, mind.channel._out + 1, gen=GEN + 1), "gen_mismatch"),
    ],
)
def test_a_bad_frame_ends_the_session_with_a_protocol_close(codec, bad, code):
    s, mind = opened(codec)
    run = s.start_run(exec_msg(codec))
    events = s.receive_data(bad(mind))
    assert [type(e) for e in events] == [Failed, Closed]
    closed = events[1]
    assert (closed.error.code, closed.close_code, closed.close_reason) == (code, CLOSE_PROTOCOL_ERROR, code)
    assert closed.error.message.startswith("the Mind sent a bad frame: ")
    assert events[0] == Failed(run, closed.error, True)
    assert s.data_to_send() == []  # the run's frame, not yet written, is not written after it
    assert s.receive_data(mind.frame(end("r1"), run)) == []  # nothing after it is read


@CODECS
def test_a_frame_too_large_is_refused_without_spending_a_sequence_number(codec):
    s, mind = opened(codec)
    big = codec.exec_(
        hand="box",
        tool="exec",
        args={"blob": b"x" * limits.MAX_FRAME_BYTES},
        timeout_ms=1000,
        grace_ms=None,
        watch=True,
    )
    with pytest.raises(ClientError) as ei:
        s.start_run(big)
    assert ei.value.code == "frame_too_large"
    run = s.start_run(exec_msg(codec))
    (env,) = mind.read(s)  # the Mind's channel would refuse a gap
    assert env.id == run and s.is_open


def test_both_codecs_make_the_same_events_of_the_same_frames():
    """The two shells' sessions see one stream of frames the same way, message values included."""
    frames = [
        lambda ids: (update("r1"), ids[0]),
        lambda ids: (output("r1", b"\x00\xff"), ids[0]),
        lambda ids: (cancel_result("r1"), ids[1]),
        lambda ids: (
            RunEnd(run_id="r1", state=RunState.FAILED, hand="box", tool="exec", exit_code=3, value={"k": [1]}),
            ids[0],
        ),
        lambda ids: (Error(code=ErrorCode.HAND_OFFLINE, message="box is offline"), ids[2]),
        lambda ids: (Error(code=ErrorCode.SHUTDOWN, message="bye"), None),
    ]
    seen = []
    for codec in (FULL, FAST):
        s, mind = opened(codec)
        ids = [s.start_run(exec_msg(codec)), s.request(codec.cancel_run(run_id="r1"), "cancel_run_result")]
        ids.append(s.start_run(exec_msg(codec)))
        ids.append(s.start_run(exec_msg(codec)))
        events = []
        for make in frames:
            msg, id = make(ids)
            events += s.receive_data(mind.frame(msg, id))
        events += s.connection_lost()
        names = {v: f"id{i}" for i, v in enumerate(ids)}
        seen.append([tuple(names.get(x, x) if isinstance(x, str) else x for x in dump(e)) for e in events])
    assert seen[0] == seen[1]
    assert [e[0] for e in seen[0]] == ["RunEvent", "RunEvent", "Reply", "RunEnded", "failed", "failed", "closed"]
    assert seen[0][-1][1:3] == ("shutdown", "bye")
