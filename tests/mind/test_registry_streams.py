"""The Mind relays a streamed run's bytes (`RunRegistry.on_hand_stream` / `on_client_stream`):
each chunk forwarded at once to the one peer it is for, never beyond the window the final receiver
granted, never from a stale generation or another client, never after the end."""

from mind.core.registry import Log, RunRegistry, SendToClient, SendToHand
from protocol import limits
from protocol.messages import Exec, Resize, Result, Rpc, StreamAck, StreamData, Streams
from protocol.states import RunState

HAND = "laptop"
W = limits.STREAM_WINDOW


def streamed(stdin=True, gen=1):
    reg = RunRegistry()
    req = Exec(hand=HAND, tool="exec", args={"argv": ["cat"]}, timeout_ms=10_000, streams=Streams(stdin=stdin))
    acts = reg.admit("r1", req, "c1", "q1", gen, True, now=0.0, wall=1000.0)
    [rpc] = [a.msg for a in acts if isinstance(a, SendToHand) and isinstance(a.msg, Rpc)]
    assert rpc.streams == req.streams, "the Hand learns the run is streamed"
    reg.on_accepted("r1", HAND, gen, 0.1)
    reg.on_started("r1", HAND, gen, 0.2)
    return reg


def out(offset, n=10, stream="stdout", eof=False):
    return StreamData(run_id="r1", stream=stream, offset=offset, data=b"x" * n, eof=eof)


def test_output_goes_to_the_attached_client_under_its_request():
    reg = streamed()
    [a] = reg.on_hand_stream(out(0), HAND, 1)
    assert isinstance(a, SendToClient) and a.client == "c1" and a.req_id == "q1" and not a.droppable
    assert reg.on_hand_stream(out(10), HAND, 2) == [], "another generation's bytes are not this run's"
    assert reg.on_hand_stream(out(10), "other", 1) == []


def test_a_hand_beyond_the_window_is_refused_not_forwarded():
    reg = streamed()
    big = limits.STREAM_CHUNK_MAX
    offset = 0
    while offset + big <= W:
        assert isinstance(reg.on_hand_stream(out(offset, big), HAND, 1)[0], SendToClient)
        offset += big
    acts = reg.on_hand_stream(out(offset, 1), HAND, 1)
    assert [a.event for a in acts if isinstance(a, Log)] == ["stream_refused"]
    assert not any(isinstance(a, SendToClient) for a in acts), "the Mind holds at most one window"
    [fwd] = reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=big), "c1")
    assert isinstance(fwd, SendToHand) and fwd.gen == 1
    assert isinstance(reg.on_hand_stream(out(offset, big), HAND, 1)[0], SendToClient), "credit came back"


def test_stdin_flows_only_from_the_runs_own_client():
    reg = streamed()
    chunk = StreamData(run_id="r1", stream="stdin", offset=0, data=b"hi")
    [a] = reg.on_client_stream(chunk, "c1")
    assert isinstance(a, SendToHand) and a.msg == chunk
    assert reg.on_client_stream(chunk, "intruder") == []
    [ack] = reg.on_hand_stream(StreamAck(run_id="r1", stream="stdin", offset=2), HAND, 1)
    assert isinstance(ack, SendToClient)


def test_without_stdin_there_is_no_stdin_stream():
    reg = streamed(stdin=False)
    acts = reg.on_client_stream(StreamData(run_id="r1", stream="stdin", offset=0, data=b"x"), "c1")
    assert not any(isinstance(a, SendToHand) for a in acts)


def test_directions_are_checked():
    reg = streamed()
    acts = reg.on_client_stream(out(0), "c1")  # a client may not forge the Hand's output
    assert [a.event for a in acts if isinstance(a, Log)] == ["stream_wrong_direction"]
    acts = reg.on_hand_stream(StreamData(run_id="r1", stream="stdin", offset=0, data=b"x"), HAND, 1)
    assert not any(isinstance(a, SendToClient) for a in acts)


def test_nothing_flows_after_the_end_and_streams_never_move_a_state():
    reg = streamed()
    reg.on_hand_stream(out(0, eof=True), HAND, 1)
    assert reg.get("r1").state is RunState.RUNNING, "an eof is not success"
    reg.on_result(Result(run_id="r1", state="succeeded", exit_code=0), HAND, 1, 1.0, 1001.0)
    assert reg.on_hand_stream(out(10), HAND, 1) == []
    assert reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=10), "c1") == []


def test_resize_goes_only_to_a_terminal_run():
    reg = streamed()
    assert reg.on_client_stream(Resize(run_id="r1", rows=50, cols=100), "c1") == []
