"""Continuity in the registry (DESIGN §15), race by race: a leg that goes away leaves its run
running for the window; the Hand re-presents its runs on a new generation; the owner re-attaches
(newest wins); past the window the seed's rule fires, and a terminal the Mind decides by itself is
persisted before anyone is told."""

from hypothesis import given
from hypothesis import strategies as st

from mind.core.registry import (
    MIND_DEADLINE_SLACK_S,
    Log,
    PersistEnding,
    RunRegistry,
    SendToClient,
    SendToHand,
    StartEnded,
)
from mind.core.seal import seal
from protocol import limits
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, CancelStatus, ErrorCode, RejectCode
from protocol.messages import (
    Attached,
    Background,
    Cancel,
    Detached,
    Error,
    Exec,
    PresentedRun,
    Replaced,
    Resize,
    Result,
    ResultAck,
    RunEnd,
    RunsPresent,
    RunUpdate,
    StreamAck,
    StreamNumbers,
    StreamPosition,
    StreamResume,
    Streams,
)
from protocol.states import RunState
from protocol.streams import Incoming, Outgoing

HAND = "laptop"
WINDOW = 60.0
W = limits.STREAM_WINDOW


def setup(window=WINDOW, streams=None, timeout_ms=600_000, started=True, **kw):
    reg = RunRegistry(resume_window=window, **kw)
    req = Exec(hand=HAND, tool="exec", args={"argv": ["sleep", "20"]}, timeout_ms=timeout_ms, streams=streams)
    reg.admit("r1", req, "c1", "q1", 1, True, now=0.0, wall=1000.0, owner="alice")
    reg.on_accepted("r1", HAND, 1, 0.1)
    if started:
        reg.on_started("r1", HAND, 1, 0.2)
    return reg


def to_hand(acts, gen=None):
    """What the Hand is told, but the stream numbers that come with every binding of a run."""
    return [
        a.msg
        for a in acts
        if isinstance(a, SendToHand) and (gen is None or a.gen == gen) and not isinstance(a.msg, StreamNumbers)
    ]


def to_client(acts, client=None):
    return [
        a.msg
        for a in acts
        if isinstance(a, SendToClient)
        and (client is None or a.client == client)
        and not isinstance(a.msg, StreamNumbers)
    ]


def ends(acts):
    return [m for m in to_client(acts) if isinstance(m, RunEnd)]


def present(*run_ids, **kw):
    return RunsPresent(runs=[PresentedRun(run_id=r, started=True, **kw) for r in run_ids])


def ok(state="succeeded"):
    return Result(run_id="r1", state=state, exit_code=0 if state == "succeeded" else None)


def state(reg):
    return reg.get("r1").state


# --- the Hand's leg ------------------------------------------------------------------------------


def test_a_hand_drop_leaves_the_run_running_and_says_since_when():
    reg = setup()
    acts = reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    assert not ends(acts) and state(reg) is RunState.RUNNING
    info = reg.get("r1").info()
    assert info.hand_away_since == 1005.0 and info.client_away_since is None
    assert [a.event for a in acts if isinstance(a, Log)] == ["run_hand_away"]
    [update] = to_client(acts, "c1")
    assert isinstance(update, RunUpdate) and update.hand_away_since == 1005.0, "the client can say so"
    acts = reg.on_runs_present(HAND, 2, present("r1"), 6.0, 1006.0)
    [update] = to_client(acts, "c1")
    assert update.hand_away_since is None and update.gen == 2, "and that the Hand is back"


def test_a_hand_presenting_streams_it_cannot_have_sent_makes_the_run_lost():
    reg = setup(streams=Streams())
    hand_chunk(reg, "stdout", 0, 100)
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    positions = [StreamPosition(stream="stdout", offset=50, consumed=0)]  # the Mind relayed 100
    acts = reg.on_runs_present(HAND, 2, present("r1", streams=positions), 6.0, 1006.0)
    assert state(reg) is RunState.LOST and "inconsistently" in ends(acts)[0].reason
    assert to_hand(acts, gen=2) == [Cancel(run_id="r1", reason=CancelReason.INTERNAL_FAILURE)]


def test_window_zero_keeps_todays_rules_exactly():
    reg = setup(window=0.0)
    acts = reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    assert [e.state for e in ends(acts)] == [RunState.LOST]
    assert not any(isinstance(a, PersistEnding) for a in acts), "no run outlives a connection: nothing to persist"
    reg = setup(window=0.0)
    acts = reg.on_client_gone("c1", 5.0, 1005.0)
    assert to_hand(acts) == [Cancel(run_id="r1", reason=CancelReason.CLIENT_DISCONNECTED)]
    assert not any(isinstance(m, ResultAck) for m in to_hand(reg.on_result(ok(), HAND, 1, 6.0, 1006.0)))


def test_the_start_run_of_a_task_is_still_lost_with_its_connection():
    reg = RunRegistry(resume_window=WINDOW)
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=10_000)
    reg.admit("t1", req, "c1", "q1", 1, True, 0.0, 1000.0, background=Background(max_runtime_ms=1000))
    acts = reg.on_hand_gone(HAND, 1, 1.0, 1001.0)
    assert reg.get("t1").state is RunState.LOST and any(isinstance(a, StartEnded) for a in acts)


def test_a_cancel_answer_to_an_earlier_start_of_a_task_is_not_taken_for_the_next_one():
    """A task's start sent again reuses the task's id. The cancel of the first start reached the
    Hand after it had refused that start, so it answers `unknown_run`; the second start's `rpc` is
    behind that cancel on the connection. The answer is not the second start's: it is not `lost`
    (the simulation found this: seed 884 of the continuity variant), its own answer decides."""
    reg = RunRegistry(resume_window=WINDOW)
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=10_000)
    reg.admit("t1", req, "c1", "q1", 1, True, 0.0, 1000.0, background=Background(max_runtime_ms=1000))
    assert to_hand(reg.on_cancel("t1", CancelReason.USER_REQUESTED, 0.1, 1000.1)[1]) == [
        Cancel(run_id="t1", reason=CancelReason.USER_REQUESTED)
    ]
    reg.on_rejected("t1", HAND, 1, RejectCode.INVALID_REQUEST, "bad", 0.2, 1000.2)
    assert reg.get("t1").state is RunState.REJECTED
    reg.admit("t1", req, "c2", "q2", 1, True, 0.3, 1000.3, background=Background(max_runtime_ms=1000))
    acts = reg.on_cancel_result("t1", HAND, 1, CancelStatus.UNKNOWN_RUN, 0.4, 1000.4)
    assert not ends(acts) and reg.get("t1").state is RunState.SENT
    reg.on_rejected("t1", HAND, 1, RejectCode.INVALID_REQUEST, "bad", 0.5, 1000.5)
    assert reg.get("t1").state is RunState.REJECTED, "the second start's own answer decides"
    # a cancel of this start that the Hand does not know: that one is `lost`, as before
    reg.admit("t1", req, "c3", "q3", 1, True, 0.6, 1000.6, background=Background(max_runtime_ms=1000))
    reg.on_cancel("t1", CancelReason.USER_REQUESTED, 0.7, 1000.7)
    acts = reg.on_cancel_result("t1", HAND, 1, CancelStatus.UNKNOWN_RUN, 0.8, 1000.8)
    assert [e.state for e in ends(acts)] == [RunState.LOST]


def test_result_before_the_window_ends_wins_and_is_acknowledged():
    reg = setup()
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    acts = reg.on_runs_present(HAND, 2, present("r1"), 10.0, 1010.0)
    assert not ends(acts) and reg.get("r1").gen == 2 and reg.get("r1").hand_away_since is None
    acts = reg.on_result(ok(), HAND, 2, 11.0, 1011.0)
    assert [e.state for e in ends(acts)] == [RunState.SUCCEEDED]
    assert to_hand(acts, gen=2) == [ResultAck(run_id="r1")], "the Hand may let the result go"


def test_window_expiry_before_the_result_is_lost_persisted_first_then_the_result_is_late():
    reg = setup()
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    assert not reg.on_tick(5.0 + WINDOW - 0.1, 1065.0)
    acts = reg.on_tick(5.0 + WINDOW, 1065.0)
    assert isinstance(acts[0], PersistEnding) and acts[0].end.state is RunState.LOST, "durable before anyone is told"
    i_end = next(i for i, a in enumerate(acts) if isinstance(a, SendToClient) and isinstance(a.msg, RunEnd))
    assert i_end > 0 and "resume window" in acts[i_end].msg.reason
    assert not to_hand(acts), "the Hand is away: it hears when it presents the run"
    # the Hand comes back with the run and its result: the Mind's terminal stands
    acts = reg.on_runs_present(HAND, 2, present("r1", result_pending=True), 70.0, 1070.0)
    assert to_hand(acts, gen=2) == [Cancel(run_id="r1", reason=CancelReason.CONNECTION_LOST)]
    acts = reg.on_result(ok(), HAND, 2, 70.1, 1070.1)
    assert state(reg) is RunState.LOST and not ends(acts), "first terminal wins"
    assert to_hand(acts) == [ResultAck(run_id="r1")], "acknowledged all the same: the Hand lets it go"


def test_hand_presenting_nothing_after_a_restart_is_lost_at_once():
    reg = setup()
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    acts = reg.on_runs_present(HAND, 2, RunsPresent(), 6.0, 1006.0)
    assert isinstance(acts[0], PersistEnding)
    [end] = ends(acts)
    assert end.state is RunState.LOST and end.reason == "hand restarted: it no longer has this run"


def test_hand_presenting_a_run_the_mind_ended_or_never_knew_is_told_to_kill_it():
    reg = setup()
    reg.on_client_gone("c1", 1.0, 1001.0)
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    acts = reg.on_tick(1.0 + WINDOW, 1061.0)  # both legs away, the client's window ends first
    assert state(reg) is RunState.CANCELLED and isinstance(acts[0], PersistEnding), "the Mind decided it"
    acts = reg.on_runs_present(HAND, 2, present("r1", "ghost"), 66.0, 1066.0)
    assert to_hand(acts, gen=2) == [
        Cancel(run_id="r1", reason=CancelReason.CLIENT_DISCONNECTED),
        Cancel(run_id="ghost", reason=CancelReason.CONNECTION_LOST),
    ]
    assert state(reg) is RunState.CANCELLED and reg.get("r1").gen == 1, "killed, not adopted"


def test_nothing_from_the_old_generation_counts_after_the_rebind():
    reg = setup()
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    reg.on_runs_present(HAND, 2, present("r1"), 6.0, 1006.0)
    acts = reg.on_result(ok(), HAND, 1, 7.0, 1007.0)
    assert state(reg) is RunState.RUNNING
    assert [a.event for a in acts if isinstance(a, Log)] == [AuditEvent.HAND_INPUT_WRONG_GENERATION]
    acts = reg.on_runs_present(HAND, 2, present("r1"), 8.0, 1008.0)
    assert not to_hand(acts), "a second presentation on the same generation re-binds nothing"


def test_cancel_during_an_outage_is_delivered_once_on_resume():
    reg = setup()
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    status, acts = reg.on_cancel("r1", CancelReason.USER_REQUESTED, 6.0, 1006.0)
    assert status is CancelStatus.CANCEL_REQUESTED and not to_hand(acts)
    acts = reg.on_runs_present(HAND, 2, present("r1"), 7.0, 1007.0)
    assert to_hand(acts, gen=2) == [Cancel(run_id="r1", reason=CancelReason.USER_REQUESTED)]
    acts = reg.on_result(Result(run_id="r1", state="cancelled", signal=15), HAND, 2, 7.5, 1007.5)
    assert [e.state for e in ends(acts)] == [RunState.CANCELLED]


def test_a_resize_typed_during_an_outage_reaches_the_hand_once():
    reg = setup(streams=Streams(pty={"rows": 24, "cols": 80}))
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    assert reg.on_client_stream(Resize(run_id="r1", rows=50, cols=100), "c1") == []
    assert reg.on_client_stream(Resize(run_id="r1", rows=60, cols=120), "c1") == []
    acts = reg.on_runs_present(HAND, 2, present("r1"), 7.0, 1007.0)
    assert [m for m in to_hand(acts) if isinstance(m, Resize)] == [Resize(run_id="r1", rows=60, cols=120)]


def test_a_sent_run_the_hand_presents_was_accepted():
    reg = setup(started=False)
    reg.get("r1").state = RunState.SENT  # the `accepted` was cut
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    reg.on_runs_present(HAND, 2, present("r1"), 6.0, 1006.0)
    assert state(reg) is RunState.RUNNING


# --- the client's leg ----------------------------------------------------------------------------


def test_a_client_drop_detaches_and_the_owner_reattaches_before_the_window():
    reg = setup()
    acts = reg.on_client_gone("c1", 5.0, 1005.0)
    assert not to_hand(acts) and state(reg) is RunState.RUNNING
    assert reg.get("r1").info().client_away_since == 1005.0
    acts = reg.on_attach("r1", "c2", "alice", "q9", 30.0, 1030.0)
    [attached] = to_client(acts, "c2")
    assert isinstance(attached, Attached) and attached.state is RunState.RUNNING
    assert not reg.on_tick(5.0 + WINDOW + 1, 1066.0), "attached again: the window no longer runs"
    acts = reg.on_result(ok(), HAND, 1, 70.0, 1070.0)
    assert [(a.client, a.req_id) for a in acts if isinstance(a, SendToClient)] == [("c2", "q9")]


def test_past_the_window_an_unattended_run_is_cancelled_as_before():
    reg = setup()
    reg.on_client_gone("c1", 5.0, 1005.0)
    acts = reg.on_tick(5.0 + WINDOW, 1065.0)
    assert to_hand(acts) == [Cancel(run_id="r1", reason=CancelReason.CLIENT_DISCONNECTED)]
    assert state(reg) is RunState.CANCEL_REQUESTED and not reg.on_tick(5.0 + WINDOW + 1, 1066.0)
    # re-attach after the expiry: the owner gets the run as it is, and its end when it comes
    acts = reg.on_attach("r1", "c2", "alice", "q9", 66.0, 1066.0)
    assert to_client(acts)[-1].state is RunState.CANCEL_REQUESTED
    acts = reg.on_result(Result(run_id="r1", state="cancelled"), HAND, 1, 67.0, 1067.0)
    assert [(a.client, a.msg.state) for a in acts if isinstance(a, SendToClient)] == [("c2", RunState.CANCELLED)]


def test_first_terminal_wins_a_result_racing_the_windows_cancel_stands():
    reg = setup()
    reg.on_client_gone("c1", 5.0, 1005.0)
    reg.on_tick(5.0 + WINDOW, 1065.0)  # the window's cancel is on its way to the Hand
    reg.on_result(ok(), HAND, 1, 65.1, 1065.1)  # the command finished first
    assert state(reg) is RunState.SUCCEEDED, "the command did run"
    late = reg.on_result(Result(run_id="r1", state="cancelled"), HAND, 1, 65.2, 1065.2)
    assert state(reg) is RunState.SUCCEEDED and not ends(late)


def test_reattach_to_a_run_that_ended_meanwhile_gets_its_end():
    reg = setup()
    reg.on_client_gone("c1", 5.0, 1005.0)
    reg.on_result(ok(), HAND, 1, 6.0, 1006.0)
    [end] = to_client(reg.on_attach("r1", "c2", "alice", "q9", 7.0, 1007.0))
    assert isinstance(end, RunEnd) and end.state is RunState.SUCCEEDED and end.exit_code == 0


def test_two_attachments_at_once_the_newest_wins_and_the_other_is_told():
    reg = setup(streams=Streams())
    acts = reg.on_attach("r1", "c2", "alice", "q2", 5.0, 1005.0)
    assert to_client(acts, "c1") == [Replaced(run_id="r1")]
    assert isinstance(to_client(acts, "c2")[0], Attached)
    assert [a.client for a in hand_chunk(reg, "stdout", 0, 2)] == ["c2"]
    assert reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=2), "c1") == [], "c1 lost the run"


def test_only_the_owner_may_attach():
    reg = setup()
    [err] = to_client(reg.on_attach("r1", "c2", "mallory", "q2", 5.0, 1005.0))
    assert isinstance(err, Error) and err.code is ErrorCode.NOT_ALLOWED and "owner" in err.message
    assert reg.get("r1").client == "c1"
    [err] = to_client(reg.on_attach("nope", "c2", "alice", "q2", 5.0, 1005.0))
    assert err.code is ErrorCode.UNKNOWN_RUN


def test_a_detached_run_is_kept_for_its_keep_capped_by_the_mind():
    reg = setup(keep_max=600.0)
    acts = reg.on_detach("r1", "c1", "q1", 3600.0, 5.0, 1005.0)
    assert to_client(acts) == [Detached(run_id="r1", keep_s=600.0)]
    assert not reg.on_tick(5.0 + WINDOW + 1, 1066.0), "kept past the window"
    assert to_hand(reg.on_tick(605.0, 1605.0)) == [Cancel(run_id="r1", reason=CancelReason.CLIENT_DISCONNECTED)]
    reg = setup(window=0.0)
    [err] = to_client(reg.on_detach("r1", "c1", "q1", None, 5.0, 1005.0))
    assert isinstance(err, Error) and reg.get("r1").client == "c1"


# --- streams across a resume ---------------------------------------------------------------------


def hand_chunk(reg, stream, offset, n, gen=1):
    number = reg.stream_number(("h", HAND, str(gen)), "r1", stream)
    return reg.on_hand_frame(HAND, gen, number, offset, False, memoryview(b"x" * n))


def client_chunk(reg, stream, offset, n, client="c1"):
    number = reg.stream_number(("c", client), "r1", stream)
    return reg.on_client_frame(client, number, offset, False, memoryview(b"x" * n))


def test_the_hand_resends_output_from_what_reached_the_client_and_the_client_resends_stdin():
    reg = setup(streams=Streams(stdin=True, window=1 << 16))
    assert reg.get("r1").relays["stdout"].window == 1 << 16, "the window is the opening's"
    hand_chunk(reg, "stdout", 0, 100)
    reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=40), "c1")
    client_chunk(reg, "stdin", 0, 30)
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    assert client_chunk(reg, "stdin", 30, 10) == [], "nothing reaches an absent Hand"
    positions = [
        StreamPosition(stream="stdout", offset=150, consumed=30),
        StreamPosition(stream="stdin", offset=20, consumed=10),
    ]
    acts = reg.on_runs_present(HAND, 2, present("r1", streams=positions), 6.0, 1006.0)
    assert StreamResume(run_id="r1", stream="stdout", offset=100, consumed=40, window=1 << 16) in to_hand(acts, gen=2)
    resumes = [m for m in to_client(acts, "c1") if isinstance(m, StreamResume)]
    assert resumes == [StreamResume(run_id="r1", stream="stdin", offset=20, consumed=10, window=1 << 16)]
    assert client_chunk(reg, "stdin", 20, 5)[0].gen == 2, "stdin flows from the Hand's point"


def test_the_client_resumes_output_from_its_own_point_or_the_acknowledged_one():
    reg = setup(streams=Streams())
    hand_chunk(reg, "stdout", 0, 100)
    reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=50), "c1")
    reg.on_client_gone("c1", 5.0, 1005.0)
    assert hand_chunk(reg, "stdout", 100, 10) == [], "nobody to forward to"
    mine = [StreamPosition(stream="stdout", offset=60, consumed=55)]
    acts = reg.on_attach("r1", "c2", "alice", "q2", 6.0, 1006.0, mine)
    assert StreamResume(run_id="r1", stream="stdout", offset=60, consumed=55, window=W) in to_hand(acts, gen=1)
    stderr = next(p for p in to_client(acts)[-1].streams if p.stream == "stderr")
    assert (stderr.offset, stderr.consumed) == (0, 0), "a stream not named starts from its acknowledgement"
    [err] = to_client(
        reg.on_attach("r1", "c3", "alice", "q3", 7.0, 1007.0, [StreamPosition(stream="stdout", offset=111, consumed=0)])
    )
    assert isinstance(err, Error) and err.code is ErrorCode.INVALID_PAYLOAD, "bytes never relayed"
    both = [
        StreamPosition(stream="stdout", offset=60, consumed=60),
        StreamPosition(stream="stderr", offset=1, consumed=0),
    ]
    [err] = to_client(reg.on_attach("r1", "c3", "alice", "q3", 8.0, 1008.0, both))
    assert isinstance(err, Error) and reg.get("r1").relays["stdout"].acked == 55, "a refusal moves no relay"
    assert reg.get("r1").client == "c2"


def test_a_window_halved_while_the_hand_was_away_is_the_one_it_resumes_under():
    """The client halved its window (its reader fell behind) in an acknowledgement the Hand never
    heard: the cut took it. Resumed under the window it last heard, the Hand sent past the
    client's limit, the client could place nothing more, and the stream stopped for good (seen
    under load: `tests/integration/test_continuity_hand.py`'s 64 MiB stream). The resume carries
    the window, and the Hand's sender, resumed by it, stays within what the client granted."""
    reg = setup(streams=Streams())
    hand_chunk(reg, "stdout", 0, W)
    reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=W, window=4 * W), "c1")  # grown
    hand_chunk(reg, "stdout", W, 2 * W)
    reg.on_hand_gone(HAND, 1, 5.0, 1005.0)
    reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=3 * W, window=2 * W), "c1")  # halved
    acts = reg.on_runs_present(HAND, 2, present("r1", streams=[]), 6.0, 1006.0)
    [resume] = [m for m in to_hand(acts, gen=2) if isinstance(m, StreamResume) and m.stream == "stdout"]
    assert (resume.offset, resume.consumed, resume.window) == (3 * W, 3 * W, 2 * W)
    hand = Outgoing(W)  # the Hand's sender as it stood: it heard the growth, the halving was lost
    hand.send(b"x" * W)
    hand.on_ack(W, 4 * W)
    hand.send(b"x" * (2 * W))
    hand.resume(resume.offset, resume.consumed, resume.window)
    client = Incoming(W)  # the client's receiver, which made both acknowledgements
    assert client.on_data(0, W, False)
    client.consume(W)
    client.receiver.window = 4 * W
    assert client.receiver.ack_due() == W
    assert client.on_data(W, 2 * W, False)
    client.consume(2 * W)
    client.receiver.window = 2 * W
    assert client.receiver.ack_due() == 3 * W
    assert hand.sender.limit <= client.receiver.limit == 5 * W, "never past what the client granted"


class _Upload:
    """An upload's stdin through a real registry: the client's `Outgoing`, the Hand's `Incoming`
    (its tuner's choices made by hand), the acknowledgements between them, cuts and returns."""

    def __init__(self) -> None:
        self.reg = setup(streams=Streams(stdin=True))
        self.client: Outgoing = Outgoing(W)
        self.hand: Incoming = Incoming(W)
        self.gen = 1
        self.attached = "c1"

    def send(self, n: int) -> bool:
        """`n` bytes of stdin from the client; True if each chunk was relayed and the Hand took it."""
        taken = True
        for offset, data, _eof in self.client.send(b"x" * n):
            acts = client_chunk(self.reg, "stdin", offset, len(data), client=self.attached)
            if acts and getattr(acts[0], "gen", None) == self.gen:
                taken = self.hand.on_data(offset, len(data), False) and taken
            else:
                taken = False
        return taken

    def consume(self, n: int, window: int | None = None, lost: bool = False) -> None:
        """The Hand consumes `n` bytes (under `window`, if its tuner changed it) and acknowledges;
        `lost`: the cut takes the acknowledgement."""
        self.hand.consume(n)
        if window is not None:
            self.hand.receiver.window = window
        offset = self.hand.ack_due()
        assert offset is not None
        ack = StreamAck(run_id="r1", stream="stdin", offset=offset, window=self.hand.changed_window())
        if not lost:
            for m in to_client(self.reg.on_hand_stream(ack, HAND, self.gen), self.attached):
                self.client.on_ack(m.offset, m.window)

    def positions(self) -> list[StreamPosition]:
        """The Hand's stdin as `RunStreams.positions` presents it: no window when what it grants is
        the opening one."""
        offset, consumed = self.hand.resume_point()
        granted = self.hand.granted
        return [
            StreamPosition(stream="stdin", offset=offset, consumed=consumed, window=granted if granted != W else None)
        ]

    def hand_returns(self) -> list:
        """The Hand's leg cut and back on a new generation, presenting the run: what the client
        resends (`Outgoing.resume`)."""
        self.reg.on_hand_gone(HAND, self.gen, 5.0, 1005.0)
        self.gen += 1
        pres = present("r1", streams=self.positions(), spec=Streams(stdin=True))
        return self.resumed(self.reg.on_runs_present(HAND, self.gen, pres, 6.0, 1006.0))

    def resumed(self, acts: list) -> list:
        """The client resumes stdin where the Mind says: a `stream_resume`, or its `attached`."""
        told = to_client(acts, self.attached)
        points = [m for m in told if isinstance(m, StreamResume) and m.stream == "stdin"]
        points += [p for m in told if isinstance(m, Attached) for p in m.streams if p.stream == "stdin"]
        [point] = points
        return self.client.resume(point.offset, point.consumed, point.window)

    def within_the_hands_limit(self) -> bool:
        return self.client.sender.limit <= min(self.reg.get("r1").relays["stdin"].limit, self.hand.receiver.limit)


def test_stdin_halved_back_to_its_opening_window_in_an_ack_the_cut_lost_resumes_under_it():
    """The Hand's receiver grew the window to 2 W (told), then halved it back to W in the
    acknowledgement the cut took. What it granted, less what it consumed, is then exactly W, and
    the Hand presents no window when it grants the opening one. The Mind took no window for "no
    change" and resumed the client under the grown 2 W: the client went a window past the Hand's
    limit, the Hand dropped the chunk, and the copy stopped (the continuity simulation's
    `stream_stalled`, seed 23). No window presented is the opening window."""
    u = _Upload()
    assert u.send(W)
    u.consume(W, window=2 * W)  # grown, told: the limit is 3 W
    assert u.send(2 * W)
    u.consume(W, window=W, lost=True)  # halved back: consumed 2 W, limit 3 W, granted W
    assert u.positions()[0].window is None
    u.hand_returns()
    assert u.within_the_hands_limit(), (u.client.sender.limit, u.hand.receiver.limit)
    u.consume(W)
    assert u.send(u.client.credit()), "every byte the client may send reaches the Hand"
    assert u.within_the_hands_limit()


def test_a_stdin_window_halved_while_the_client_was_away_is_the_one_it_reattaches_under():
    """The client's leg was cut; meanwhile the Hand consumed and halved its grown window in an
    acknowledgement. The Mind dropped acknowledgements with nobody to forward them to, window and
    all, and the re-attached client resumed under the grown window, past the Hand's limit (seed
    91). Counted while the client is away, as acknowledgements of output are while the Hand is."""
    u = _Upload()
    assert u.send(W)
    u.consume(W, window=2 * W)  # grown, told: the limit is 3 W
    assert u.send(2 * W)
    u.reg.on_client_gone("c1", 5.0, 1005.0)
    u.attached = ""
    u.consume(W, window=W)  # halved while nobody is attached: consumed 2 W, the limit stays 3 W
    u.consume(W // 2)  # consumed 2.5 W: granted W / 2 under the window W
    u.attached = "c2"
    u.resumed(u.reg.on_attach("r1", "c2", "alice", "q2", 6.0, 1006.0, []))
    assert u.client.window == W, "the window the Hand grants now"
    assert u.within_the_hands_limit(), (u.client.sender.limit, u.hand.receiver.limit)
    assert u.send(u.client.credit()), "every byte the client may send reaches the Hand"


def test_stdin_resumed_under_a_limit_granted_before_a_halving_keeps_the_relays_window():
    """The Hand's receiver of an upload's stdin grew its window, then halved it (its tuner: the
    growth bought nothing); the limit it granted under the larger window stands (it never moves
    back), so when the Hand's leg was cut soon after, it presented `window` = limit - consumed,
    more than the window it grants. The Mind passed that to the client as the stdin window and kept
    the smaller one in its relay: the client took it for the rest of the stream, went past the
    relay's limit a window later, its chunk was refused (a debug line) and every one after it (out
    of order), the Hand had nothing more to acknowledge, and the copy stopped for good (`mind cp`
    cut at half under load, 1 in ~20). The resume says the relay's window, narrowed to the Hand's
    if that is smaller: every byte the client may send is relayed."""
    u = _Upload()
    assert u.send(W)
    u.consume(W, window=2 * W)  # grown: the limit is 3 W
    assert u.send(2 * W)
    u.consume(W // 2, window=W)  # halved: the limit stays at 3 W, the window is W
    assert (u.client.window, u.reg.get("r1").relays["stdin"].window) == (W, W)
    assert u.hand.granted == 3 * W // 2, "the limit granted before the halving, not the window"
    assert u.hand_returns() == []  # the Hand has it all
    assert u.client.window == u.reg.get("r1").relays["stdin"].window == W
    u.consume(3 * W // 2)  # the Hand's next acknowledgement: no window (the client heard W)
    assert u.client.credit() > 0
    assert u.send(u.client.credit()), "every byte the client may send is relayed"
    assert u.within_the_hands_limit()


def test_stdin_resumed_after_a_halving_the_cut_lost_goes_on_under_the_hands_window():
    """The same, but the cut took the acknowledgement that halved the window: the Mind and the
    client still hold the grown one, and the Hand's presentation says only the limit it granted
    (more than its window). The resume narrows them to that; the Hand's next acknowledgement says
    its window again, whatever it last said, so the client never goes past the Hand's limit."""
    u = _Upload()
    assert u.send(W)
    u.consume(W, window=2 * W)
    assert u.send(2 * W)
    u.consume(W // 2, window=W, lost=True)  # halved, in the acknowledgement the cut took
    u.hand_returns()
    assert u.client.sender.limit <= u.hand.receiver.limit
    u.consume(3 * W // 2)
    assert u.client.window == u.reg.get("r1").relays["stdin"].window == W, "the Hand said its window again"
    assert u.send(u.client.credit()), "every byte the client may send reaches the Hand"
    assert u.within_the_hands_limit()


def test_an_attach_says_the_window_the_cut_kept_from_the_mind():
    """The client's leg was cut after it halved its window: it says the window in its attach,
    the relay and the Hand's resume take the smaller one; a larger one (a growth the cut lost)
    is not taken on its word."""
    reg = setup(streams=Streams())
    hand_chunk(reg, "stdout", 0, W)
    reg.on_client_stream(StreamAck(run_id="r1", stream="stdout", offset=W // 2, window=4 * W), "c1")
    hand_chunk(reg, "stdout", W, W)
    reg.on_client_gone("c1", 5.0, 1005.0)
    halved = [StreamPosition(stream="stdout", offset=2 * W, consumed=2 * W, window=2 * W)]
    acts = reg.on_attach("r1", "c2", "alice", "q2", 6.0, 1006.0, halved)
    [resume] = [m for m in to_hand(acts, gen=1) if isinstance(m, StreamResume) and m.stream == "stdout"]
    assert resume.window == 2 * W and reg.get("r1").relays["stdout"].window == 2 * W
    reg.on_client_gone("c2", 7.0, 1007.0)
    grown = [StreamPosition(stream="stdout", offset=2 * W, consumed=2 * W, window=8 * W)]
    acts = reg.on_attach("r1", "c3", "alice", "q3", 8.0, 1008.0, grown)
    [resume] = [m for m in to_hand(acts, gen=1) if isinstance(m, StreamResume) and m.stream == "stdout"]
    assert resume.window == 2 * W


def test_an_attach_may_resume_past_a_rewind_up_to_what_was_ever_relayed():
    """An older connection's attach rewinds a stream (its consumer had nothing), then the client's
    newer one takes the run back from where it really is: the bytes up to there were relayed once
    and the Hand still keeps them, so the point is accepted, not refused as never relayed (found
    by the continuity simulation, seed 459, once windows grew)."""
    reg = setup(streams=Streams())
    hand_chunk(reg, "stdout", 0, 100)
    reg.on_client_gone("c1", 5.0, 1005.0)
    reg.on_attach("r1", "c2", "alice", "q2", 6.0, 1006.0, [StreamPosition(stream="stdout", offset=0, consumed=0)])
    assert reg.get("r1").relays["stdout"].offset == 0, "rewound: the Hand resends from 0"
    acts = reg.on_attach(
        "r1", "c2", "alice", "q3", 7.0, 1007.0, [StreamPosition(stream="stdout", offset=100, consumed=100)]
    )
    assert not [a for a in to_client(acts) if isinstance(a, Error)]
    assert StreamResume(run_id="r1", stream="stdout", offset=100, consumed=100, window=W) in to_hand(acts, gen=1)
    assert hand_chunk(reg, "stdout", 0, 100) == [], "the first resend's repeat is dropped"


def test_the_minds_own_deadline_is_persisted_first_with_a_window():
    reg = setup(timeout_ms=1000)
    acts = reg.on_tick(1.0 + 5.0 + MIND_DEADLINE_SLACK_S, 1010.0)
    assert isinstance(acts[0], PersistEnding) and acts[0].end.state is RunState.TIMED_OUT
    assert to_hand(acts) == [Cancel(run_id="r1", reason=CancelReason.DEADLINE_EXCEEDED)]


# --- any order of the events ---------------------------------------------------------------------

EVENTS = ("hand_gone", "hand_back", "hand_restarted", "client_gone", "attach", "tick", "result", "old_result", "cancel")


@given(st.lists(st.tuples(st.sampled_from(EVENTS), st.floats(0, 40)), max_size=40))
def test_any_order_of_outages_and_returns_keeps_one_terminal_persisted_first(events):
    """Whatever the order: one terminal per run, never changed after; a terminal the Mind decided
    is persisted before anything tells of it; nothing is ever sent to a Hand connection that is
    not the live one; a run the Hand presents after its end is killed, not adopted."""
    reg = setup()
    now, live, gen, client_n = 1.0, True, 1, 1
    terminal = None
    for event, dt in events:
        now += dt
        wall = 1000.0 + now
        if event == "hand_gone" and live:
            acts, live = reg.on_hand_gone(HAND, gen, now, wall), False
        elif event in ("hand_back", "hand_restarted") and not live:
            gen, live = gen + 1, True
            acts = reg.on_runs_present(HAND, gen, present("r1") if event == "hand_back" else RunsPresent(), now, wall)
            if terminal is not None and event == "hand_back":
                assert Cancel(run_id="r1", reason=reg._kill_reason(reg.get("r1"))) in to_hand(acts), "killed"
                assert reg.get("r1").gen != gen, "not adopted"
        elif event == "client_gone":
            acts = reg.on_client_gone(f"c{client_n}", now, wall)
        elif event == "attach":
            client_n += 1
            acts = reg.on_attach("r1", f"c{client_n}", "alice", "q", now, wall)
        elif event == "tick":
            acts = reg.on_tick(now, wall)
        elif event == "result" and live:
            acts = reg.on_result(ok(), HAND, gen, now, wall)
        elif event == "old_result" and gen > 1:
            acts = reg.on_result(ok(), HAND, gen - 1, now, wall)
        elif event == "cancel":
            _, acts = reg.on_cancel("r1", CancelReason.USER_REQUESTED, now, wall)
        else:
            continue
        for a in acts:
            if isinstance(a, SendToHand):
                assert live and a.gen == gen, f"{event}: sent to generation {a.gen}, live {gen if live else None}"
        ended = [a for a in acts if isinstance(a, Log) and a.event == AuditEvent.RUN_TERMINAL]
        if terminal is not None:
            assert not ended and state(reg) is terminal, "first terminal wins"
        elif ended:
            terminal = state(reg)
            # decided by the Mind, or the Hand's result (acknowledged after): persisted before anything else
            assert isinstance(acts[0], PersistEnding) and acts[0].end.state is terminal
    reg.on_tick(now + 10 * WINDOW + 700, 99_999.0)
    assert state(reg) in (RunState.SUCCEEDED, RunState.LOST, RunState.CANCELLED, RunState.TIMED_OUT) or (
        state(reg) in (RunState.RUNNING, RunState.CANCEL_REQUESTED) and live and reg.get("r1").client is not None
    ), "past every window only an attached run on a live Hand may still be going"


def test_the_rpc_names_the_runs_owner_so_a_restarted_mind_can_adopt_it():
    """Found by the simulation (issue 22): the Hand presents `PresentedRun.owner` from the `rpc`
    it was sent, and a Mind that restarted adopts only a run presented with its owner. Without the
    owner in the `rpc`, every run of a Mind that restarted was killed instead of adopted."""
    req = Exec(hand=HAND, tool="exec", args={"argv": ["sleep", "20"]}, timeout_ms=600_000)
    reg = RunRegistry(resume_window=WINDOW)
    acts = reg.admit("r1", req, "c1", "q1", 1, True, now=0.0, wall=1000.0, owner="alice")
    (rpc,) = to_hand(acts)
    assert rpc.owner == "alice"
    # a run nobody owns (the registry's own callers) says so with no owner, not an empty label
    anon = RunRegistry(resume_window=WINDOW)
    (rpc,) = to_hand(anon.admit("r2", req, "c1", "q2", 1, True, now=0.0, wall=1000.0))
    assert rpc.owner is None


def test_a_result_taken_with_a_window_is_durable_before_its_ack_so_a_crash_cannot_end_it_twice():
    """Found by the simulation (seed 4418 of `scripts/sim --variant continuity`): the Mind takes a
    Hand's result and tells the client (`cancelled`), then crashes before its `result_ack` reaches
    the Hand. The Hand presents the run again with the result pending; the restarted Mind, which
    remembered nothing, adopts it, and when the Hand's leg then stays away past the window it
    decides `lost`: a second, different ending. With a window, a result the Mind takes is written
    durably (`PersistEnding`) before the client and the Hand hear of it, like the endings it decides
    itself, so the next life kills the re-presented run and gives the owner the first ending."""
    reg = setup()
    acts = reg.on_result(ok("cancelled"), HAND, 1, 5.0, 1005.0)
    persisted = [a for a in acts if isinstance(a, PersistEnding)]
    assert persisted and persisted[0].end.state is RunState.CANCELLED and persisted[0].owner == "alice"
    told = [i for i, a in enumerate(acts) if isinstance(a, SendToClient | SendToHand)]
    assert ResultAck(run_id="r1") in to_hand(acts) and all(acts.index(persisted[0]) < i for i in told)

    # the crash: a new life restores the ending; the Hand presents the run with its result pending
    new = RunRegistry(resume_window=WINDOW)
    p = persisted[0]
    new.restore(p.end, p.owner, p.cancel_reason, p.args_digest, 1006.0, 100.0)
    new.expect_presentations(100.0 + WINDOW)
    pending = PresentedRun(run_id="r1", started=True, result_pending=True, owner="alice", tool="exec", remaining_ms=0)
    acts = new.on_runs_present(HAND, 2, RunsPresent(runs=[pending]), 100.0, 5000.0)
    assert [m.run_id for m in to_hand(acts) if isinstance(m, Cancel)] == ["r1"]  # killed, not adopted
    new.on_hand_gone(HAND, 2, 101.0, 5001.0)
    new.on_tick(101.0 + WINDOW + 1, 5100.0)
    (end,) = to_client(new.on_attach("r1", "c1", "alice", "q1", 120.0, 5020.0))
    assert isinstance(end, RunEnd) and end.state is RunState.CANCELLED  # the first ending, still


def test_without_a_window_no_result_is_persisted():
    reg = setup(window=0.0)
    assert not any(isinstance(a, PersistEnding) for a in reg.on_result(ok(), HAND, 1, 5.0, 1005.0))


def test_a_run_presented_after_the_restarted_minds_window_is_killed_not_adopted():
    """Found by the simulation (seeds 1163, 1447, 1497, ... of the continuity variant): a Mind
    that restarted tells an attach `resume_pending` for its window, then `unknown_run`. A Hand
    that comes back only after that (a partition) presented the run, and the Mind adopted it and
    ended it: its owner, told the run was unknown, never hears that ending. Past the window a
    presented run the Mind does not know is killed, as the attach was told."""
    reg = RunRegistry(resume_window=WINDOW)
    reg.expect_presentations(100.0 + WINDOW)
    (refused,) = to_client(reg.on_attach("r1", "c1", "alice", "q1", 100.0 + WINDOW + 1, 5061.0))
    assert isinstance(refused, Error) and refused.code is ErrorCode.UNKNOWN_RUN
    sealed = {"args_digest": "d", "timeout_ms": 9_000, "sealed_at": 4990.0}
    mark = seal(b"", HAND, "r1", "alice", "exec", "d", 9_000, None, None, 4990.0)
    late = PresentedRun(
        run_id="r1", started=True, result_pending=True, owner="alice", tool="exec", remaining_ms=0, seal=mark, **sealed
    )
    acts = reg.on_runs_present(HAND, 2, RunsPresent(runs=[late]), 100.0 + WINDOW + 2, 5062.0)
    assert [m.run_id for m in to_hand(acts) if isinstance(m, Cancel)] == ["r1"]
    assert reg.get("r1") is None  # still unknown, as the owner was told
    # within the window the same presentation is adopted
    early = RunRegistry(resume_window=WINDOW)
    early.expect_presentations(100.0 + WINDOW)
    assert not to_hand(early.on_runs_present(HAND, 2, RunsPresent(runs=[late]), 101.0, 5001.0))
    assert early.get("r1") is not None
