"""The Mind relays a streamed run's bytes (`RunRegistry.on_hand_frame` / `on_client_frame`, and
acknowledgements by `on_hand_stream` / `on_client_stream`): each chunk forwarded at once to the one
peer it is for, under that peer's number for the stream, never beyond the window the final receiver
granted, never from a stale generation or another client, never after the end; a number never
given, or a stream the sender does not own, ends the connection (`ProtocolError`)."""

import pytest

from mind.core.registry import FrameToClient, FrameToHand, Log, RunRegistry, SendToClient, SendToHand
from protocol import limits
from protocol.errors import ProtocolError
from protocol.messages import Exec, Resize, Result, Rpc, StreamAck, StreamNumbers, Streams
from protocol.states import RunState

HAND = "laptop"
W = limits.STREAM_WINDOW


def streamed(stdin=True, gen=1):
    reg = RunRegistry()
    req = Exec(hand=HAND, tool="exec", args={"argv": ["cat"]}, timeout_ms=10_000, streams=Streams(stdin=stdin))
    acts = reg.admit("r1", req, "c1", "q1", gen, True, now=0.0, wall=1000.0)
    to_hand = [a.msg for a in acts if isinstance(a, SendToHand)]
    assert isinstance(to_hand[0], StreamNumbers) and isinstance(to_hand[1], Rpc), "numbers before the rpc"
    assert to_hand[1].streams == req.streams, "the Hand learns the run is streamed"
    to_client = [a.msg for a in acts if isinstance(a, SendToClient)]
    assert isinstance(to_client[0], StreamNumbers), "the client learns its numbers before the run's first event"
    reg.on_accepted("r1", HAND, gen, 0.1)
    reg.on_started("r1", HAND, gen, 0.2)
    return reg


def hn(reg, stream, gen=1):
    return reg.stream_number(("h", HAND, str(gen)), "r1", stream)


def cn(reg, stream, client="c1"):
    return reg.stream_number(("c", client), "r1", stream)


def out(reg, offset, n=10, stream="stdout", eof=False, gen=1):
    return reg.on_hand_frame(HAND, gen, hn(reg, stream, gen), offset, eof, memoryview(b"x" * n))


def test_output_goes_to_the_attached_client_under_its_number_and_the_payload_untouched():
    reg = streamed()
    payload = memoryview(bytearray(b"0123456789"))
    [a] = reg.on_hand_frame(HAND, 1, hn(reg, "stdout"), 0, False, payload)
    assert isinstance(a, FrameToClient) and a.client == "c1" and a.number == cn(reg, "stdout")
    assert a.payload is payload, "the received buffer itself is forwarded: no copy, no decode"
    with pytest.raises(ProtocolError):  # numbers are per connection: gen 2 was never given one
        reg.on_hand_frame(HAND, 2, hn(reg, "stdout"), 10, False, payload)
    with pytest.raises(ProtocolError):
        reg.on_hand_frame("other", 1, hn(reg, "stdout"), 10, False, payload)


def test_a_hand_beyond_the_window_is_refused_not_forwarded():
    reg = streamed()
    big = limits.STREAM_CHUNK_MAX
    offset = 0
    while offset + big <= W:
        assert isinstance(out(reg, offset, big)[0], FrameToClient)
        offset += big
    acts = out(reg, offset, 1)
    assert [a.event for a in acts if isinstance(a, Log)] == ["stream_refused"]
    assert not any(isinstance(a, FrameToClient) for a in acts), "the Mind holds at most one window"
    [fwd] = reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=big), "c1")
    assert isinstance(fwd, SendToHand) and fwd.gen == 1
    assert isinstance(out(reg, offset, big)[0], FrameToClient), "credit came back"


def test_an_offset_gap_is_refused_not_forwarded():
    reg = streamed()
    acts = out(reg, 5)
    assert [a.event for a in acts if isinstance(a, Log)] == ["stream_refused"]


def test_stdin_flows_only_from_the_runs_own_client():
    reg = streamed()
    [a] = reg.on_client_frame("c1", cn(reg, "stdin"), 0, False, memoryview(b"hi"))
    assert isinstance(a, FrameToHand) and a.number == hn(reg, "stdin") and bytes(a.payload) == b"hi"
    with pytest.raises(ProtocolError):  # another connection's number means nothing on this one
        reg.on_client_frame("intruder", cn(reg, "stdin"), 2, False, memoryview(b"x"))
    [ack] = reg.on_hand_stream(StreamAck(run_id="r1", stream="stdin", offset=2), HAND, 1)
    assert isinstance(ack, SendToClient)


def test_without_stdin_there_is_no_stdin_stream():
    reg = streamed(stdin=False)
    assert cn(reg, "stdin") is None and hn(reg, "stdin") is None


def test_directions_are_checked():
    reg = streamed()
    with pytest.raises(ProtocolError, match="client may not send on the stdout"):
        reg.on_client_frame("c1", cn(reg, "stdout"), 0, False, memoryview(b"x"))  # no forging the Hand's output
    with pytest.raises(ProtocolError, match="hand may not send on the stdin"):
        reg.on_hand_frame(HAND, 1, hn(reg, "stdin"), 0, False, memoryview(b"x"))
    with pytest.raises(ProtocolError, match="never given"):
        reg.on_hand_frame(HAND, 1, 99, 0, False, memoryview(b"x"))


def test_nothing_flows_after_the_end_and_streams_never_move_a_state():
    reg = streamed()
    number = hn(reg, "stdout")
    reg.on_hand_frame(HAND, 1, number, 0, True, memoryview(b""))
    assert reg.get("r1").state is RunState.RUNNING, "an eof is not success"
    reg.on_result(Result(run_id="r1", state="succeeded", exit_code=0), HAND, 1, 1.0, 1001.0)
    assert reg.on_hand_frame(HAND, 1, number, 10, False, memoryview(b"x")) == [], "a late frame: dropped"
    assert reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=10), "c1") == []


def test_resize_goes_only_to_a_terminal_run():
    reg = streamed()
    assert reg.on_client_stream(Resize(run_id="r1", rows=50, cols=100), "c1") == []


def test_a_grown_window_passes_within_the_clients_budget_and_is_lowered_to_what_it_leaves():
    """A client's acknowledgement that grows a window (`stream_ack.window`) is forwarded to the Hand,
    and the relay then passes bytes up to the new limit; a growth past half the client's stream
    budget is lowered to what that half leaves in the acknowledgement the Hand gets (the budget
    counts the grown window), and a window never shrinks the limit already granted."""
    from mind.core.budgets import STREAM_BUDGET_BYTES

    reg = streamed(stdin=False)
    big = limits.STREAM_CHUNK_MAX
    for offset in range(0, W, big):
        out(reg, offset, big)
    [fwd] = reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=W, window=8 * W), "c1")
    assert isinstance(fwd, SendToHand) and fwd.msg.window == 8 * W, "within the budget: passed as asked"
    for offset in range(W, 9 * W, big):
        assert isinstance(out(reg, offset, big)[0], FrameToClient), "the relay passes the grown window"
    assert [a.event for a in out(reg, 9 * W, 1) if isinstance(a, Log)] == ["stream_refused"]

    # the same client's other runs hold most of its budget: the next growth gets only what is left
    req = Exec(hand=HAND, tool="exec", args={"argv": ["cat"]}, timeout_ms=10_000, streams=Streams(window=32 << 20))
    reg.admit("r2", req, "c1", "q2", 1, True, now=0.0, wall=1000.0)
    reg.admit("r5", req.model_copy(update={"streams": Streams(window=16 << 20)}), "c1", "q5", 1, True, 0.0, 1000.0)
    held = sum(x.holds for r in reg.active_of(reg.get("r1").owner) for x in r.relays.values())
    left = STREAM_BUDGET_BYTES // 2 - held  # growth takes at most half: new runs find the rest
    assert 0 < left < 16 * W
    [fwd] = reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=9 * W, window=16 * W), "c1")
    assert isinstance(fwd, SendToHand) and fwd.msg.window == 8 * W + left, "lowered to what the budget leaves"
    assert reg.get("r1").relays["stdout"].window == 8 * W + left

    # a smaller window: the limit already granted stands
    [fwd] = reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=9 * W, window=W), "c1")
    assert fwd.msg.window == W and reg.get("r1").relays["stdout"].limit == 9 * W + 8 * W + left
