"""A restart of the Mind in the registry (DESIGN §15): a new registry knows nothing but the endings
its earlier life persisted; a Hand presents the runs it kept, each with its owner, and the new
registry adopts those it has no ending for, kills those it has, and gives each back to its owner
only. The durable store round-trips what the registry needs (mind/store/endings.py)."""

from mind.core.registry import (
    MIND_DEADLINE_SLACK_S,
    FrameToClient,
    PersistEnding,
    RunRegistry,
    SendToClient,
    SendToHand,
)
from mind.core.seal import seal
from mind.store.endings import Ending, EndingStore
from protocol.codes import CancelReason, ErrorCode
from protocol.limits import STREAM_WINDOW
from protocol.messages import (
    Attached,
    Background,
    Cancel,
    Error,
    Exec,
    OutputTail,
    PresentedRun,
    Result,
    ResultAck,
    RunEnd,
    RunsPresent,
    StreamNumbers,
    StreamPosition,
    StreamResume,
    Streams,
)
from protocol.states import RunState

HAND = "box"
WINDOW = 60.0


def to_hand(acts):
    """What the Hand is told, but the stream numbers that come with every binding of a run."""
    return [a.msg for a in acts if isinstance(a, SendToHand) and not isinstance(a.msg, StreamNumbers)]


def to_client(acts, client=None):
    return [
        a.msg
        for a in acts
        if isinstance(a, SendToClient)
        and (client is None or a.client == client)
        and not isinstance(a.msg, StreamNumbers)
    ]


SENT_AT = 4990.0
"""When the earlier life sent the runs presented here (its wall clock)."""


def presented(
    run_id="r1", owner="alice", started=True, streams=(), spec=None, remaining_ms=30_000, hand=HAND, key=b"", **kw
):
    """A run as a Hand presents it, sealed as the earlier life sent it (the registries here share
    the default key, as a Mind's lives share the key in its store)."""
    timeout_ms = kw.pop("timeout_ms", 60_000)
    mark = seal(key, hand, run_id, owner, "exec", "digest", timeout_ms, 1_000, spec, SENT_AT)
    return PresentedRun(
        run_id=run_id,
        started=started,
        owner=owner,
        tool="exec",
        remaining_ms=remaining_ms,
        grace_ms=1_000,
        streams=list(streams),
        spec=spec,
        args_digest="digest",
        timeout_ms=timeout_ms,
        seal=mark,
        sealed_at=SENT_AT,
        **kw,
    )


def restarted(now=100.0):
    reg = RunRegistry(resume_window=WINDOW)
    reg.expect_presentations(now + WINDOW)
    return reg


def test_a_presented_run_is_adopted_for_its_owner_with_its_deadline_and_streams():
    reg = restarted()
    spec = Streams(stdin=True)
    streams = [
        StreamPosition(stream="stdout", offset=700, consumed=500),
        StreamPosition(stream="stderr", offset=0, consumed=0),
        StreamPosition(stream="stdin", offset=40, consumed=40),
    ]
    acts = reg.on_runs_present(HAND, 3, RunsPresent(runs=[presented(streams=streams, spec=spec)]), 100.0, 5000.0)
    assert not to_hand(acts)  # nothing killed
    run = reg.get("r1")
    assert run is not None and run.state is RunState.RUNNING and run.gen == 3 and run.owner == "alice"
    assert run.mind_deadline == 100.0 + 31.0 + MIND_DEADLINE_SLACK_S
    assert (run.relays["stdout"].offset, run.relays["stdout"].acked) == (700, 500)
    assert run.info().client_away_since == 5000.0  # unattended until its owner comes back

    # another client identity may not take it; the owner may, from what it holds (600 of 700)
    refused = reg.on_attach("r1", "c9", "mallory", "q9", 101.0, 5001.0)
    assert [m.code for m in to_client(refused)] == [ErrorCode.NOT_ALLOWED]
    pos = [StreamPosition(stream="stdout", offset=600, consumed=600)]
    acts = reg.on_attach("r1", "c1", "alice", "q1", 101.0, 5001.0, streams=pos)
    attached = [m for m in to_client(acts, "c1") if isinstance(m, Attached)]
    assert attached and {p.stream: (p.offset, p.consumed) for p in attached[0].streams}["stdin"] == (40, 40)
    assert StreamResume(run_id="r1", stream="stdout", offset=600, consumed=600, window=STREAM_WINDOW) in to_hand(acts)
    # the resent bytes flow to the owner
    number = reg.stream_number(("h", HAND, "3"), "r1", "stdout")
    [fwd] = reg.on_hand_frame(HAND, 3, number, 600, False, memoryview(b"x" * 100))
    assert isinstance(fwd, FrameToClient) and fwd.client == "c1" and fwd.offset == 600
    assert fwd.number == reg.stream_number(("c", "c1"), "r1", "stdout")


def test_a_pending_result_after_adoption_ends_the_run_and_the_owner_gets_it():
    reg = restarted()
    reg.on_runs_present(HAND, 2, RunsPresent(runs=[presented(result_pending=True)]), 100.0, 5000.0)
    acts = reg.on_result(Result(run_id="r1", state="succeeded", exit_code=7), HAND, 2, 100.5, 5000.5)
    assert ResultAck(run_id="r1") in to_hand(acts)
    assert reg.get("r1").state is RunState.SUCCEEDED
    acts = reg.on_attach("r1", "c1", "alice", "q1", 101.0, 5001.0)
    (end,) = to_client(acts)
    assert isinstance(end, RunEnd) and end.exit_code == 7


def test_a_run_the_earlier_life_ended_is_killed_not_adopted_and_its_ending_stands(tmp_path):
    # the earlier life: the Hand stayed away past the window (and its client left too)
    old = RunRegistry(resume_window=WINDOW)
    req = Exec(hand=HAND, tool="exec", args={"argv": ["sleep", "99"]}, timeout_ms=600_000)
    old.admit("r1", req, "c1", "q1", 1, True, now=0.0, wall=1000.0, owner="alice")
    old.on_accepted("r1", HAND, 1, 0.1)
    old.on_hand_gone(HAND, 1, 1.0, 1001.0)
    old.on_client_gone("c1", 1.0, 1001.0)
    acts = old.on_tick(1.0 + WINDOW + 0.1, 1062.0)
    persisted = [a for a in acts if isinstance(a, PersistEnding)]
    assert persisted and persisted[0].end.state is RunState.LOST and persisted[0].owner == "alice"
    told = [i for i, a in enumerate(acts) if isinstance(a, SendToClient | SendToHand)]
    assert all(acts.index(persisted[0]) < i for i in told)  # written before anyone is told

    store = EndingStore(tmp_path / "endings.db")
    p = persisted[0]
    store.put(Ending(p.end, p.owner, 1002.0, p.cancel_reason.value if p.cancel_reason else None, p.args_digest))
    store.close()

    # a crash, a new life
    reg = restarted()
    for e in EndingStore(tmp_path / "endings.db").load(WINDOW, now=1003.0):
        reg.restore(e.end, e.owner, None, e.args_digest, e.ended_at, 100.0)
    acts = reg.on_runs_present(HAND, 2, RunsPresent(runs=[presented()]), 100.0, 5000.0)
    assert [m for m in to_hand(acts) if isinstance(m, Cancel)] == [
        Cancel(run_id="r1", reason=CancelReason.CONNECTION_LOST)
    ]
    assert reg.get("r1").state is RunState.LOST
    (end,) = to_client(reg.on_attach("r1", "c1", "alice", "q1", 101.0, 5001.0))
    assert isinstance(end, RunEnd) and end.state is RunState.LOST  # the first ending, not a second


def test_an_attach_before_the_hand_presents_is_told_to_wait_until_the_window_passes():
    reg = restarted(now=100.0)
    (err,) = to_client(reg.on_attach("r1", "c1", "alice", "q1", 110.0, 5010.0))
    assert isinstance(err, Error) and err.code is ErrorCode.RESUME_PENDING
    (err,) = to_client(reg.on_attach("r1", "c1", "alice", "q1", 100.0 + WINDOW + 0.1, 5070.0))
    assert isinstance(err, Error) and err.code is ErrorCode.UNKNOWN_RUN


def test_an_adopted_run_nobody_attaches_to_is_cancelled_at_the_windows_end():
    reg = restarted()
    reg.on_runs_present(HAND, 2, RunsPresent(runs=[presented(remaining_ms=600_000)]), 100.0, 5000.0)
    assert not to_hand(reg.on_tick(100.0 + WINDOW - 1, 5059.0)) and reg.get("r1").state is RunState.RUNNING
    acts = reg.on_tick(100.0 + WINDOW + 0.1, 5060.1)
    assert Cancel(run_id="r1", reason=CancelReason.CLIENT_DISCONNECTED) in to_hand(acts)
    assert reg.get("r1").state is RunState.CANCEL_REQUESTED


def test_a_presented_run_without_an_owner_is_killed_as_before():
    reg = restarted()
    bare = PresentedRun(run_id="r1", started=True)
    acts = reg.on_runs_present(HAND, 2, RunsPresent(runs=[bare]), 100.0, 5000.0)
    assert [type(m) for m in to_hand(acts)] == [Cancel] and reg.get("r1") is None


def test_the_store_keeps_only_what_can_still_matter(tmp_path):
    store = EndingStore(tmp_path / "endings.db")
    end = RunEnd(run_id="r1", hand=HAND, tool="exec", state=RunState.LOST, reason="x")
    store.put(Ending(end, "alice", 1000.0))
    store.put(Ending(end.model_copy(update={"run_id": "r2"}), "bob", 1000.0 + 10 * 24 * 3600))
    kept = store.load(WINDOW, now=1000.0 + 10 * 24 * 3600)
    assert [(e.end.run_id, e.owner) for e in kept] == [("r2", "bob")]


def test_only_a_life_that_may_have_left_runs_makes_the_next_start_wait_for_presentations(tmp_path):
    path = tmp_path / "endings.db"
    store = EndingStore(path)
    assert store.begin_life() is False  # the first start: nobody can present anything
    store.end_life(0)
    store.close()
    store = EndingStore(path)
    assert store.begin_life() is False  # stopped cleanly with nothing running
    store.end_life(2)
    store.close()
    store = EndingStore(path)
    assert store.begin_life() is True  # stopped leaving two runs resumable
    store.close()  # ... and then crashed: it never said it stopped
    store = EndingStore(path)
    assert store.begin_life() is True
    store.close()


def test_the_store_trims_tails_and_prunes_as_it_writes(tmp_path, monkeypatch):
    from mind.store import endings

    monkeypatch.setattr(endings, "PRUNE_EVERY", 10)
    monkeypatch.setattr(endings, "MAX_ROWS", 5)
    store = EndingStore(tmp_path / "endings.db")
    store.load(WINDOW, now=1000.0)
    tail = OutputTail(data=b"x" * 4000 + b"END", total=4003)
    for i in range(10):
        end = RunEnd(run_id=f"r{i}", hand=HAND, tool="exec", state=RunState.SUCCEEDED, exit_code=0, stdout=tail)
        store.put(Ending(end, "alice", 1000.0 + i))
    kept = store.load(WINDOW, now=1010.0)
    assert [e.end.run_id for e in kept] == [f"r{i}" for i in range(5, 10)]  # pruned at the 10th write
    assert kept[0].end.stdout.data.endswith(b"END") and len(kept[0].end.stdout.data) == endings.TAIL_KEPT
    assert kept[0].end.stdout.total == 4003


def test_a_run_whose_hand_another_node_claimed_is_handed_over_and_adopted_if_it_comes_back():
    """Many Minds (DESIGN §16): node A hears that node B claimed the Hand at claim 5 while A holds
    runs of it on claim 4. They are B's now: forgotten here at once, no ending decided (no
    `PersistEnding`, nothing told), the attached client named for the shell to move. A run on the
    newer claim stays, as does a task's start run; the Hand claimed back presents the run again
    and it is adopted for its owner."""
    reg = RunRegistry(resume_window=WINDOW)
    reg.expect_presentations(float("inf"))  # as every node on a shared database does
    req = Exec(hand=HAND, tool="exec", args={"argv": ["sleep", "99"]}, timeout_ms=600_000, streams=Streams())
    reg.admit("r1", req, "c1", "q1", 4, True, now=100.0, wall=5000.0, owner="alice")
    reg.on_accepted("r1", HAND, 4, 100.1)
    reg.on_started("r1", HAND, 4, 100.2)
    reg.admit("r2", req, "c2", "q2", 6, True, now=100.0, wall=5000.0, owner="bob")  # already on a newer claim

    moved, acts = reg.on_hand_moved(HAND, 5)
    assert [(r.run_id, r.client) for r in moved] == [("r1", "c1")]
    assert not [a for a in acts if isinstance(a, PersistEnding | SendToClient | SendToHand)]
    assert reg.get("r1") is None and reg.get("r2") is not None
    assert reg.stream_number(("c", "c1"), "r1", "stdout") is None  # its numbers dropped too
    assert not [a for a in reg.on_tick(100.0 + 2 * WINDOW, 9000.0) if isinstance(a, PersistEnding)]  # never `lost` here
    assert reg.on_hand_moved(HAND, 5) == ([], [])  # heard twice (NOTIFY and a poll): once

    # the Hand comes back here (claim 7) and presents the run: adopted as any presented run
    acts = reg.on_runs_present(HAND, 7, RunsPresent(runs=[presented("r1")]), 200.0, 5100.0)
    assert not [m for m in to_hand(acts) if isinstance(m, Cancel)]
    run = reg.get("r1")
    assert run is not None and run.state is RunState.RUNNING and run.gen == 7 and run.owner == "alice"


def test_a_task_start_run_is_not_handed_over():
    reg = restarted()
    req = Exec(hand=HAND, tool="exec", args={"argv": ["true"]}, timeout_ms=60_000)
    reg.admit("r1", req, None, "", 4, True, 100.0, 5000.0, Background(max_runtime_ms=60_000), owner="alice")
    assert reg.on_hand_moved(HAND, 5)[0] == []
    assert reg.get("r1") is not None


# --- a Hand's word: only what a Mind of this database sent it is adopted ---------------------------


def test_a_run_the_mind_sent_is_sealed_and_its_presentation_adopted_with_the_runs_own_times():
    """The seal is made at admission from what the run is adopted from; the Hand echoes it."""
    life1 = RunRegistry(resume_window=WINDOW, seal_key=b"k" * 32)
    req = Exec(hand=HAND, tool="exec", args={"argv": ["sleep", "9"]}, timeout_ms=9_000, streams=Streams())
    acts = life1.admit("r1", req, "c1", "q1", 1, True, 10.0, 4990.0, owner="alice")
    (rpc,) = [m for m in to_hand(acts)]
    assert rpc.seal is not None and rpc.sealed_at == 4990.0
    # the next life, same key: the Hand presents what it was sent
    life2 = RunRegistry(resume_window=WINDOW, seal_key=b"k" * 32)
    life2.expect_presentations(100.0 + WINDOW)
    p = PresentedRun(
        run_id="r1",
        started=True,
        owner="alice",
        tool="exec",
        remaining_ms=10**9,  # the Hand's word on the time left: capped by the sealed timeout
        spec=rpc.streams,
        grace_ms=rpc.grace_ms,
        args_digest=life1.get("r1").args_digest,
        timeout_ms=rpc.timeout_ms,
        seal=rpc.seal,
        sealed_at=rpc.sealed_at,
    )
    assert not to_hand(life2.on_runs_present(HAND, 2, RunsPresent(runs=[p]), 100.0, 5000.0))
    run = life2.get("r1")
    assert run is not None and run.owner == "alice"
    assert run.created_wall == 4990.0 and run.info().created_at == 4990.0  # its own time, not the adoption's
    assert run.mind_deadline == 100.0 + 9.0 + 5.0 + MIND_DEADLINE_SLACK_S  # remaining <= timeout, + grace


def test_made_up_or_altered_presentations_are_killed_never_adopted():
    """A Hand credential presented runs "owned" by any client it named, and each counted against
    that client's stream budget: now a run adopts only with the seal of what was sent to that Hand."""
    reg = restarted()
    good = presented(run_id="r1")
    forged = [
        presented(run_id="r2").model_copy(update={"seal": None}),  # no seal at all
        presented(run_id="r3").model_copy(update={"owner": "victim"}),  # another owner than sealed
        presented(run_id="r4").model_copy(update={"timeout_ms": 86_400_000}),  # a longer timeout
        presented(run_id="r5", hand="other"),  # sealed for another Hand
        presented(run_id="r6", key=b"x" * 32),  # sealed with another key
        presented(run_id="r7", spec=Streams(window=64 << 20)).model_copy(update={"spec": Streams()}),
    ]
    acts = reg.on_runs_present(HAND, 2, RunsPresent(runs=[good, *forged]), 100.0, 5000.0)
    killed = [m.run_id for m in to_hand(acts) if isinstance(m, Cancel)]
    assert killed == ["r2", "r3", "r4", "r5", "r6", "r7"]
    assert reg.get("r1") is not None and all(reg.get(f"r{i}") is None for i in range(2, 8))


def test_one_presentation_per_welcome_and_a_bound_on_what_one_adopts():
    """`runs_present` was taken any number of times, 10,000 runs a message: 100,000 adopted runs."""
    from mind.core.registry import ADOPT_MAX

    reg = restarted()
    many = [presented(run_id=f"r{i}") for i in range(ADOPT_MAX + 5)]
    acts = reg.on_runs_present(HAND, 2, RunsPresent(runs=many), 100.0, 5000.0)
    assert len(reg.active()) == ADOPT_MAX
    assert len([m for m in to_hand(acts) if isinstance(m, Cancel)]) == 5
    assert [a.event for a in acts if getattr(a, "event", "") == "runs_present_over_bound"] == [
        "runs_present_over_bound"
    ]
    again = [presented(run_id=f"x{i}") for i in range(10)]
    acts = reg.on_runs_present(HAND, 2, RunsPresent(runs=again), 101.0, 5001.0)
    assert [getattr(a, "event", None) for a in acts] == ["runs_present_repeated"] and len(reg.active()) == ADOPT_MAX


def test_a_cancel_the_hand_never_answers_ends_the_run_lost_after_a_bound():
    from mind.core.registry import CANCEL_ANSWER_S

    reg = restarted()
    long = presented(remaining_ms=3_000_000, timeout_ms=3_600_000)  # its own deadline far off
    reg.on_runs_present(HAND, 2, RunsPresent(runs=[long]), 100.0, 5000.0)
    status, acts = reg.on_cancel("r1", CancelReason.USER_REQUESTED, 101.0, 5001.0)
    assert Cancel(run_id="r1", reason=CancelReason.USER_REQUESTED) in to_hand(acts)
    bound = 101.0 + 1.0 + CANCEL_ANSWER_S  # its grace (1 s) and the bound
    assert not reg.on_tick(bound - 0.1, 5050.0) and reg.get("r1").state is RunState.CANCEL_REQUESTED
    reg.on_tick(bound, 5051.0)
    assert reg.get("r1").state is RunState.LOST  # nobody can know: never `cancelled` on a guess
