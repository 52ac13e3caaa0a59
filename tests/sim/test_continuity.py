"""Continuity in the deterministic simulation (issue 22, must-hold 7; DESIGN §15): seeds of the
`continuity` variant hold every invariant (both legs resuming, Mind crashes between them, durable
endings, adoption, streams through the real endpoints with every byte checked); the checker trips
on a Hand that sends its result before its output is acknowledged; and the race matrix's
continuity rows, each scripted on the virtual clock with what a user relies on asserted: the
state, the exit code, the bytes, what the Hand was told."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import settings
from sim.checker import InvariantViolation
from sim.jobs import JobSpec
from sim.network import Link
from sim.simulation import Config, Rules, World, run_seed
from sim.stream_clients import ClientRun, StreamClient
from sim.variants import VARIANTS

from mind.core.registry import RunRegistry
from mind.core.runs import PersistEnding
from protocol.codes import CancelReason
from protocol.messages import Cancel, CancelRun, RunsPresent, StreamPosition
from protocol.states import RunState

CONTINUITY = VARIANTS["continuity"]
SEEDS_PER_CHUNK = 40 if settings().max_examples >= 600 else 2
"""Seeds 0-39 run in `test_the_seeds_exercise_continuity` (every invariant is checked on every seed),
so the chunks start at 40: 160 more in the full suite, 8 more in the edit loop (`scripts/test --fast`)."""
W = 10.0


@pytest.mark.parametrize("chunk", range(4))
def test_continuity_seeds_hold_every_invariant(chunk: int) -> None:
    for seed in range(40 + chunk * SEEDS_PER_CHUNK, 40 + (chunk + 1) * SEEDS_PER_CHUNK):
        run_seed(seed, 300, rules=CONTINUITY)


def test_the_seeds_exercise_continuity() -> None:
    """The mix reaches every path the invariants are about."""
    paths = (
        "rebound",  # a Hand back within the window
        "adopted",  # a Mind that crashed adopts a presented run
        "presented_after_end",  # a Hand presents a run the Mind has ended: killed
        "presented_result_pending",  # a result kept across a cut
        "lost:window",  # the Hand away past the window
        "lost:hand_lost_it",  # a Hand restarted
        "persisted:lost",
        "hand_window_kill",  # no Mind within the window: the Hand kills its runs
        "replaced",  # two attachments at once
        "stdin_resumed",
        "client_repeat_dropped",  # a chunk in flight before a resume, and its resent copy
        "complete_outputs",
        "hand_sender_full",  # a window's worth kept, unacknowledged: the credit rule stopped the Hand
        "attach_refused:resume_pending",
        "client_return:edge",
        "detached:within",  # `--detach`, then `attach` within the keep
        "detached:after",
        "stdin_typed_while_away",  # typed during an outage: delivered once, in order, on resume
        "stdin_window:halved",  # an upload's window grown, then halved by the Hand's real tuner
        "stdin_window:cut_after_halving",  # and the Hand's link cut right after (main's 13554b4)
        "named_exec_lost_in_a_cut",  # a named run's `exec` cut before the Mind read it: `unknown_run`
    )
    # Seeds run in order until every path was reached, within the first 30: the same bound as running
    # all 30, without the seeds that could only add to what is already shown.
    notes: Counter[str] = Counter()
    for seed in range(30):
        notes.update(run_seed(seed, 300, rules=CONTINUITY).checker.notes)
        if all(notes[what] for what in paths):
            break
    for what in paths:
        assert notes[what] > 0, what


def test_a_result_sent_before_the_output_is_acknowledged_is_caught() -> None:
    """The Hand as `hand/aio/streams.py` ships sends its result once every output stream's END is
    sent. With a window, a client away at that moment (the Mind takes no output for it, the Hand
    keeps it) comes back to a run that ended: the tail it never got is gone. The checker finds it;
    the model the shells should follow (the result after the output is acknowledged) holds."""
    rules = VARIANTS["continuity-result-before-ack"]
    for seed in range(60):
        try:
            run_seed(seed, 300, rules=rules)
        except InvariantViolation as violation:
            assert violation.invariant == "no byte lost or duplicated", violation
            assert "stdout bytes" in violation.detail or "stderr bytes" in violation.detail
            run_seed(seed, 300, rules=CONTINUITY)  # the same seed, the result after the acknowledgement
            return
    pytest.fail("no seed lost a tail")


# --- the race matrix: continuity rows -----------------------------------------------------------


def world(rules: Rules | None = None) -> World:
    rules = rules or replace(CONTINUITY, resume_windows=(W,))
    w = World(0, 0, config=Config(hands=("h1",), clients=1), rules=rules)
    w.quiesce("setup")
    assert w.mind is not None and w.hands["h1"].proc is not None
    w.mind.loop._latency = lambda: 0.0
    w.hands["h1"].proc.loop._latency = lambda: 0.0
    w.hands["h1"].proc.backoff.next_delay = lambda: 0.1  # type: ignore[method-assign]
    return w


def start(w: World, duration: float, chunks: int = 4, stdin: int = 0, rc: int = 0) -> tuple[StreamClient, ClientRun]:
    """A streamed run on h1 from the first client, delivered until it runs."""
    c = w.ext.clients[0]
    before = set(c.runs)
    w.ext.exec(c, "h1", JobSpec(duration, rc, chunks), size=30_000, stdin=stdin)
    w.deliver_all()
    w.advance(0.01)
    (run_id,) = set(c.runs) - before
    assert w.mind is not None and w.mind.registry.get(run_id).state is RunState.RUNNING  # type: ignore[union-attr]
    return c, c.runs[run_id]


def run_for(w: World, seconds: float) -> None:
    """Let `seconds` pass with every frame delivered as soon as it can be (a loopback network)."""
    end = w.clock.now + seconds
    while w.clock.now < end:
        w.drain()
        w.deliver_all()
        w.advance(min(0.05, end - w.clock.now))
    w.deliver_all()


def hand_link(w: World) -> Link:
    link = w.link_of("h1")
    assert link is not None
    return link


def hand_away(w: World, seconds: float) -> None:
    """The Hand's leg is reset and its reconnections refused for `seconds` (a partition)."""
    w.hands["h1"].refused_until = w.clock.now + seconds
    w.close_link(hand_link(w), "cut", 0.0, 0.0)


def client_away(w: World, c: StreamClient, seconds: float | str) -> None:
    """The client's leg is reset; it comes back `seconds` later (or "never")."""
    w.ext.return_after = seconds
    assert c.link is not None
    w.close_link(c.link, "cut", 0.0, 0.0)


def settle(w: World) -> None:
    w.quiesce("settle")
    w.checker.reconciled("settle")


def state(w: World, run: ClientRun) -> RunState:
    assert w.mind is not None
    r = w.mind.registry.get(run.run_id)
    assert r is not None
    return r.state


def produced(w: World, run: ClientRun, stream: str = "stdout") -> int:
    return int(w.ext.checker.jobs[run.run_id].job.produced[stream])


def to_hand(w: World, kind: type, run: ClientRun) -> list[Any]:
    """Every `kind` the Hand has read about the run (counted as they are delivered)."""
    return [m for m in w.hand_reads if isinstance(m, kind) and m.run_id == run.run_id]


def recording(w: World) -> World:
    """Record what the Hand reads (for 'delivered once' assertions)."""
    w.hand_reads = []  # type: ignore[attr-defined]
    real = w._deliver

    def deliver(link: Link, d: Any, within_step: bool = False) -> str:
        if not w.ext.owns(link) and d is link.down and d.queue:
            w.hand_reads.append(d.queue[0].msg)  # type: ignore[attr-defined]
        return real(link, d, within_step)

    w._deliver = deliver  # type: ignore[method-assign]
    return w


@pytest.mark.parametrize("back", [W - 1.0, W + 2.0], ids=["back-before-expiry", "back-after-expiry"])
def test_race_result_vs_window_expiry(back: float) -> None:
    """The command finishes while its Hand's leg is away. Back before the window ends: the result
    the Hand kept (its output resent, acknowledged, then the result) wins: `succeeded`, every byte,
    the real exit code. Back after: the Mind's `lost` came first and was persisted before anyone
    was told; the Hand's own window passed too, so it forgot the result (as `RunTable.expire`
    does) and presents nothing: the ending stays `lost`."""
    w = world()
    c, run = start(w, 2.0, rc=3)
    hand_away(w, back)
    run_for(w, back + 1.0)
    settle(w)
    assert run.end is not None
    if back < W:
        assert run.end.state is RunState.FAILED and run.end.exit_code == 3
        assert run.follower.outs["stdout"].rx.offset == produced(w, run) > 0
        assert w.ext.disk[run.run_id].end.exit_code == 3  # the Hand's result, durable before its ack
    else:
        assert run.end.state is RunState.LOST
        assert w.ext.disk[run.run_id].end.state is RunState.LOST  # durable before anyone was told
        assert w.ext.checker.notes["presented_after_end"] == 0  # its own window passed: result forgotten
    hand = w.hands["h1"].proc
    assert hand is not None and not hand.kept.unacked  # acknowledged, or forgotten


def test_race_cancel_during_an_outage_is_delivered_once_on_resume() -> None:
    """The client cancels while the Hand's leg is away: the Mind records it and sends nothing to
    an absent Hand; the Hand comes back within the window and hears the cancel exactly once."""
    w = recording(world())
    c, run = start(w, 30.0)
    hand_away(w, 3.0)
    run_for(w, 0.5)
    assert c.link is not None
    w.ext._send(c.link, CancelRun(run_id=run.run_id), "qcancel")
    w.deliver_all()
    assert state(w, run) is RunState.CANCEL_REQUESTED and not to_hand(w, Cancel, run)
    run_for(w, 4.0)
    settle(w)
    assert to_hand(w, Cancel, run) == [Cancel(run_id=run.run_id, reason=CancelReason.USER_REQUESTED)]
    assert run.end is not None and run.end.state is RunState.CANCELLED
    assert not w.hands["h1"].machine.running()  # the tree is gone


@pytest.mark.parametrize("back", [W - 0.3, W + 0.3], ids=["reattach-first", "expiry-first"])
def test_race_reattach_vs_window_expiry(back: float) -> None:
    """The client's leg is reset and it comes back just before or just after the window. Before:
    it re-attaches from its own resume point and gets the rest of the output, every byte once,
    and the real exit. After: the window's cancel (`client_disconnected`) fired first, the tree is
    killed, and the re-attaching client gets that ending."""
    w = world()
    c, run = start(w, 15.0, chunks=10)
    run_for(w, 2.0)
    client_away(w, c, back)
    run_for(w, back + 0.5)
    settle(w)
    assert run.end is not None
    if back < W:
        assert run.end.state is RunState.SUCCEEDED and run.end.exit_code == 0
        assert run.follower.outs["stdout"].rx.offset == produced(w, run)
        assert run.follower.outs["stderr"].rx.offset == produced(w, run, "stderr")
    else:
        assert run.end.state is RunState.CANCELLED and run.end.reason == CancelReason.CLIENT_DISCONNECTED.value
        job = w.ext.checker.jobs[run.run_id].job
        assert job.kill_requested and not job.alive
        assert run.follower.outs["stdout"].rx.offset < produced(w, run) or produced(w, run) == 0 or job.exited


def test_race_two_attachments_at_once_the_newest_wins() -> None:
    """The client's first connection is blackholed (it still looks open to the Mind); the client
    opens a second and re-attaches there with its resume points. The Mind gives the run to the
    newest attachment and tells the first it was `replaced`; the output goes on on the second,
    complete and never twice, and nothing more of the run reaches the first."""
    w = world()
    c, run = start(w, 8.0, chunks=8, stdin=100_000)
    run_for(w, 2.0)
    old = c.link
    assert old is not None
    old.flowing = False  # blackholed: neither side knows yet
    w.ext.connect(c)
    w.ext.attach(c, run)
    w.deliver_all()
    assert run.link is c.link and run.link is not old
    run_for(w, 1.0)
    w.faults.resume(old, old.blackhole_epoch)  # the first connection flows again: told `replaced`
    w.deliver_all()
    assert run.run_id in old.replaced
    w.close_link(old, "client left", 0.0, 0.0)
    settle(w)
    assert run.end is not None and run.end.state is RunState.SUCCEEDED and run.ends == 1
    assert run.follower.outs["stdout"].rx.offset == produced(w, run)
    assert run.follower.stdin is not None and run.follower.stdin.acked == 100_000  # the command read all of its stdin


def test_race_a_hand_restart_presents_nothing_and_the_run_is_lost_at_once() -> None:
    """kill -9 of the Hand mid-run: the new Hand process presents nothing, so the run is `lost`
    the moment it is back ("hand restarted"), not at the window's end, and the client hears it."""
    w = world()
    c, run = start(w, 30.0)
    slot = w.hands["h1"]
    w.faults.crash_hand(slot)
    run_for(w, 0.5)
    assert state(w, run) is RunState.RUNNING  # waiting for its Hand, within the window
    w.start_hand(slot)
    run_for(w, 0.5)
    assert state(w, run) is RunState.LOST and w.clock.now < W
    assert run.end is not None and run.end.state is RunState.LOST and "restarted" in (run.end.reason or "")
    assert w.ext.disk[run.run_id].end.state is RunState.LOST
    settle(w)


@pytest.mark.parametrize("crash", [False, True], ids=["same-life", "after-a-mind-crash"])
def test_race_hand_represents_a_run_the_mind_ended(crash: bool) -> None:
    race_hand_represents(crash)


def race_hand_represents(crash: bool, rules: Rules | None = None, persisted: bool = True) -> None:
    """The Mind sees the Hand's leg go at once, the Hand only much later (a half-open link): the
    Mind's window fires (`lost`, persisted), and the Hand, still running the command, presents
    it when it is back (after a Mind crash: to a Mind that restored the ending from its disk).
    The Hand is told to kill it, not adopted: the ending stays `lost`, and the owner re-attaching
    gets that ending, not a second one."""
    w = recording(world(rules))
    c, run = start(w, 60.0)
    link = hand_link(w)
    w.close_link(link, "half-open", 0.0, None)  # the Hand does not notice
    run_for(w, W + 1.0)
    assert state(w, run) is RunState.LOST
    if persisted:  # durable before anyone was told
        assert w.ext.disk[run.run_id].end.state is RunState.LOST
    if crash:
        w.faults.crash_mind()
        run_for(w, 1.0)
        w.start_mind()
        run_for(w, 0.5)
        assert w.mind is not None and w.mind.life > 0
    w.notice_hand(link)  # now the Hand sees it and dials again
    run_for(w, 1.0)
    settle(w)
    assert state(w, run) is RunState.LOST
    assert [m.reason for m in to_hand(w, Cancel, run)] == [CancelReason.CONNECTION_LOST]
    assert not w.hands["h1"].machine.running()
    assert w.ext.checker.notes["adopted"] == 0
    assert run.end is not None and run.end.state is RunState.LOST and run.ends == 1


def test_race_a_mind_crash_mid_run_the_command_goes_on_and_finishes() -> None:
    """kill -9 of the Mind mid-run, back 2 s later: the Hand re-presents the run with its owner,
    the new Mind adopts it, the client re-attaches (told to wait until the Hand has presented)
    and gets the rest: every byte of stdout and stderr, all of stdin read, the real exit code.
    (Before the registry put the owner in the `rpc`, the run was killed here instead.)"""
    w = world()
    c, run = start(w, 10.0, chunks=8, stdin=150_000, rc=5)
    run_for(w, 3.0)
    w.ext.return_after = 0.5
    w.faults.crash_mind()
    run_for(w, 2.0)
    w.start_mind()
    settle(w)
    assert w.ext.checker.notes["adopted"] == 1
    assert run.end is not None and run.end.state is RunState.FAILED and run.end.exit_code == 5
    assert run.follower.outs["stdout"].rx.offset == produced(w, run) and run.follower.outs[
        "stderr"
    ].rx.offset == produced(w, run, "stderr")
    assert run.follower.stdin is not None and run.follower.stdin.acked == 150_000


# --- the continuity checker trips on broken rules -----------------------------------------------


class ForgetfulRegistry(RunRegistry):
    """Broken: a Hand's presentation counts for nothing, so every run of that Hand ends `lost`
    when it comes back, though it holds them all."""

    def on_runs_present(self, hand: str, gen: int, msg: Any, now: float, wall: float) -> list[Any]:
        return super().on_runs_present(hand, gen, RunsPresent(runs=[]), now, wall)


class FarRelayRegistry(RunRegistry):
    """Broken: an attaching client's output resumes from what the relay forwarded, not from what
    the client says it holds: the bytes lost with the client's leg are never sent again."""

    def on_attach(
        self, run_id: str, client: str, owner: str, req_id: str, now: float, wall: float, streams: Any = ()
    ) -> list[Any]:
        run = self.get(run_id)
        if run is not None and not run.terminal:
            streams = [
                StreamPosition(stream=name, offset=relay.offset, consumed=relay.acked)  # type: ignore[arg-type]
                for name, relay in run.relays.items()
                if name != "stdin"
            ]
        return super().on_attach(run_id, client, owner, req_id, now, wall, streams)


class UnpersistedRegistry(RunRegistry):
    """Broken: the endings the Mind decides are not written before anyone is told (nor at all)."""

    def _terminate(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [a for a in super()._terminate(*args, **kwargs) if not isinstance(a, PersistEnding)]


def continuity_violation(registry: type[RunRegistry], invariant: str, seeds: int = 150) -> InvariantViolation:
    rules = replace(CONTINUITY, registry_cls=registry)
    seen = []
    for seed in range(seeds):
        try:
            run_seed(seed, 300, rules=rules)
        except InvariantViolation as violation:
            if violation.invariant == invariant:
                return violation
            seen.append(violation.invariant)
    pytest.fail(f"no seed out of {seeds} broke '{invariant}' (others broke: {sorted(set(seen))})")


def test_a_run_lost_while_its_hand_holds_it_is_caught() -> None:
    violation = continuity_violation(ForgetfulRegistry, "lost only when nobody can know")
    assert "while h" in violation.detail and "holds it" in violation.detail


def test_output_resumed_from_the_wrong_offset_is_caught() -> None:
    continuity_violation(FarRelayRegistry, "no byte lost or duplicated")


def test_an_ending_the_mind_did_not_persist_is_caught_across_a_crash() -> None:
    """The scripted row with a Mind crash, on a registry that persists nothing: the restarted Mind
    adopts the run its earlier life ended `lost`, and it ends again another way."""
    with pytest.raises(InvariantViolation) as caught:
        rules = replace(CONTINUITY, registry_cls=UnpersistedRegistry, resume_windows=(W,))
        race_hand_represents(True, rules, persisted=False)
    assert caught.value.invariant == "first terminal wins"
