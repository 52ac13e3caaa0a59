"""The deterministic simulation: a few hundred seeds hold every invariant; a seed replays exactly;
the snapshot table keeps what the real store holds; the checker does trip, on deliberately broken
rules and on the races it found (replayed here as scripted scenarios on the virtual clock); and the
Hand's batched admission (group commit) behaves as shipped: one batch per read, the same id twice in
a batch, the quota within a batch, a failed commit, a crash before the commit, requests waiting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from sim.checker import InvariantViolation
from sim.clients import Request
from sim.faults import Faults
from sim.hand_agent import HandConn, HandProcess
from sim.hand_tasks import HandTasks, _Live
from sim.jobs import JobSpec
from sim.mind_shell import SimMind
from sim.simulation import Config, Rules, World, run_seed
from sim.variants import VARIANTS

from hand.core.tasks import TaskLimits
from mind.core.registry import RunRegistry
from mind.core.snapshots import reconcile
from protocol.messages import Accepted, Rejected, Result, TaskGet, TaskInfo, TaskStart, TaskStartResult, TaskStatus
from protocol.states import TaskState

ROOT = Path(__file__).resolve().parents[2]
SEEDS_PER_CHUNK = 50 if settings().max_examples >= 600 else 3
"""Seeds 0-39 run in `test_the_seeds_exercise_batched_admission` (every invariant is checked on every
seed), so the chunks start at 40: 300 more in the full suite (the `ci` hypothesis profile, which CI and
`scripts/test` use; CI also runs `scripts/sim --seeds 1500`), 18 more in the edit loop (`scripts/test
--fast`, the `dev` profile), where a broken invariant shows within the first few dozen seeds and the
loop must stay under 30 s."""


@pytest.mark.parametrize("chunk", range(6))
def test_seeds_hold_every_invariant(chunk: int) -> None:
    for seed in range(40 + chunk * SEEDS_PER_CHUNK, 40 + (chunk + 1) * SEEDS_PER_CHUNK):
        run_seed(seed, 300)  # raises InvariantViolation with its replay command


def test_a_seed_replays_exactly() -> None:
    first: list[str] = []
    second: list[str] = []
    run_seed(7, 200, trace=first.append)
    run_seed(7, 200, trace=second.append)
    assert first == second and len(first) > 200


@pytest.mark.slow
def test_a_seed_replays_exactly_in_another_process() -> None:
    """Nothing depends on string hashing (set order) or the wall clock: other hash seeds, same run."""
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "sim.py"), "--seed", "11", "--digest"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and "digest" in outs[0]


def test_the_snapshot_table_keeps_what_the_real_store_holds() -> None:
    """The checker looks at the rows the table keeps from the real `SnapshotStore`'s answers: after
    every operation, they are the whole store (a full listing)."""
    for seed in range(12):
        run_seed(seed, 300, rules=Rules(checked_store=True))


# --- the checker trips on broken rules --------------------------------------------------------


def first_violation(rules: Rules, invariant: str, seeds: int = 400) -> InvariantViolation:
    """The first seed that breaks `invariant` (a broken rule may break others first, on other seeds)."""
    seen = []
    for seed in range(seeds):
        try:
            run_seed(seed, 300, rules=rules)
        except InvariantViolation as violation:
            if violation.invariant == invariant:
                return violation
            seen.append(violation.invariant)
    pytest.fail(f"no seed out of {seeds} broke '{invariant}' (others broke: {sorted(set(seen))})")


class GenerationBlindRegistry(RunRegistry):
    """Broken: takes a Hand's word for a run whatever the connection, and keeps the runs of a
    connection that ended (so a result sent again on the next one would count)."""

    def _from_hand(self, run_id: str, hand: str, gen: int, what: str) -> Any:
        run = self.get(run_id)
        if run is not None and run.hand == hand and not run.terminal:
            return run, []
        return super()._from_hand(run_id, hand, gen, what)

    def on_hand_gone(self, hand: str, gen: int, now: float, wall: float) -> list[Any]:
        return []


class ResendingHand(HandProcess):
    """Broken: results that could not go out on a dropped connection are sent on the next one."""

    unsent: list[Result]

    def make_conn(self, link: Any) -> HandConn:
        hand = self
        if not hasattr(self, "unsent"):
            self.unsent = []

        class Conn(HandConn):
            def send(self, msg: Any, env_id: str | None = None) -> None:
                if not self.wire_open and isinstance(msg, Result):
                    hand.unsent.append(msg)
                super().send(msg, env_id)

        conn = Conn(self, link)
        for msg in self.unsent:
            conn.send(msg)
        self.unsent = []
        return conn


def test_a_result_from_another_generation_is_caught() -> None:
    violation = first_violation(
        Rules(registry_cls=GenerationBlindRegistry, hand_cls=ResendingHand),
        "results only from the accepting generation",
    )
    assert "scripts/sim --seed" in str(violation)


def test_the_real_registry_refuses_results_sent_again_on_a_new_generation() -> None:
    for seed in range(40):
        run_seed(seed, 300, rules=Rules(hand_cls=ResendingHand))


class RerunningTasks(HandTasks):
    """Broken: a restarted Hand runs its unfinished tasks again instead of marking them `lost`."""

    def open(self) -> None:
        specs = self.hand.world.actions.specs
        for row in self.store.unfinished():
            self._queued[row.task_id] = _Live(row, specs[row.args_digest])
        self._purge()
        self._schedule_purge()
        self._pump()


def test_a_task_run_again_after_a_restart_is_caught() -> None:
    first_violation(Rules(hand_tasks_cls=RerunningTasks), "no task executed twice")


class ForgetfulMind(SimMind):
    """Broken: when a Hand's connection ends, its runs are `lost` but its snapshots stay fresh."""

    def hand_link_ended(self, link: Any) -> None:
        peer = self.peers.pop(link, None)
        if peer is None:
            return
        peer.fail_pending()
        if self.hands.get(link.hand) is peer:
            del self.hands[link.hand]
            self.hands_changed = True
            self.perform(self.registry.on_hand_gone(link.hand, link.gen, self.now, self.now))


def test_a_fresh_looking_snapshot_of_an_offline_hand_is_caught() -> None:
    first_violation(Rules(mind_cls=ForgetfulMind), "an offline hand's tasks are shown stale")


def trusting_reconcile(*args: Any, **kwargs: Any) -> Any:
    """Broken: never declares a task the Hand does not know `lost` (nor forgets a start that never
    reached it)."""
    plan = reconcile(*args, **kwargs)
    plan.unchanged += len(plan.lost) + len(plan.never_stored)
    plan.lost, plan.never_stored = [], []
    return plan


def test_a_snapshot_left_stale_after_reconciliation_is_caught() -> None:
    first_violation(Rules(reconcile=trusting_reconcile), "every non-terminal snapshot is fresh")


# --- the races the simulation found, as scripted scenarios ---------------------------------------


def world(rules: Rules, **config: Any) -> World:
    w = World(0, 0, config=Config(hands=("h1",), clients=1, **config), rules=rules)
    w.quiesce("setup")
    assert w.mind is not None and w.hands["h1"].proc is not None
    w.mind.loop._latency = lambda: 0.0
    w.hands["h1"].proc.loop._latency = lambda: 0.0
    w.hands["h1"].proc.backoff.next_delay = lambda: 0.1  # type: ignore[method-assign]
    return w


def start(w: World, task_id: str, seconds: float) -> None:
    w.actions.start_task(
        w.clients[0],
        TaskStart(hand="h1", task_id=task_id, tool="exec", args=JobSpec(seconds).args(), max_runtime_ms=60_000),
    )


def reconnect(w: World) -> None:
    link = w.link_of("h1")
    assert link is not None
    w.close_link(link, "cut", 0.0, 0.0)
    w.advance(0.5)  # both sides notice; the Hand dials again after 0.1 s; the Mind asks the inventory
    assert w.link_of("h1") is not link


def settle(w: World) -> None:
    w.quiesce("settle")
    w.checker.reconciled("settle")


def race_start_during_a_paged_inventory(rules: Rules) -> None:
    """A task started while the reconciliation pass reads the inventory page by page, with an id in
    a page already read: it is missing from every page, though the Hand reported it meanwhile."""
    w = world(rules, inventory_page=1)
    start(w, "t5", 0.05)
    start(w, "t7", 0.05)
    settle(w)
    reconnect(w)
    w.deliver_all("h1", "down")  # page 1 asked and read: [t5]
    start(w, "t0", 5.0)  # "t0" < "t5": its page was read already
    w.deliver_all("h1", "down")  # the Hand admits t0 and starts it
    w.deliver_all("h1", "up")  # page 1, then t0 accepted + running: the Mind asks page 2
    w.deliver_all("h1", "down")  # page 2: [t7]
    w.deliver_all("h1", "up")  # the pass ends: before the fix, t0 was declared lost
    settle(w)


def test_a_task_started_during_reconciliation_is_not_declared_lost() -> None:
    race_start_during_a_paged_inventory(Rules())


def test_the_mind_before_the_fix_changed_a_terminal() -> None:
    with pytest.raises(InvariantViolation) as caught:
        race_start_during_a_paged_inventory(VARIANTS["mind-before-fix"])
    assert caught.value.invariant == "terminals never change"
    assert "t0: lost" in caught.value.detail


def race_admission_across_a_reconnect(rules: Rules) -> None:
    """The Hand is still admitting a start (its disk stalls) when the connection drops; the next
    connection's inventory is read before the row is committed."""
    w = world(rules)
    hand = w.hands["h1"].proc
    assert hand is not None
    hand.loop._latency = lambda: 2.0
    start(w, "t1", 1.0)
    w.deliver_all("h1", "down")  # the rpc: admission starts, its read of the store stalls
    reconnect(w)
    w.deliver_all("h1", "down")  # the new connection's inventory request
    hand.loop._latency = lambda: 0.0
    settle(w)


def test_a_start_admitted_across_a_reconnect_is_in_the_next_inventory() -> None:
    race_admission_across_a_reconnect(Rules())


def test_the_hand_as_shipped_leaves_the_mind_not_knowing_a_task_it_has() -> None:
    """Before the fix the inventory missed the row still being committed, so the Mind forgot a
    start the Hand then had (it would have said `lost` before issue 14)."""
    with pytest.raises(InvariantViolation) as caught:
        race_admission_across_a_reconnect(VARIANTS["hand-before-fix"])
    assert caught.value.invariant == "every hand task is known to the mind"
    assert "t1 on h1" in caught.value.detail


# --- batched admission (group commit) ------------------------------------------------------------


def answers(w: World, hand: str = "h1") -> list[tuple[str, ...]]:
    """What the Hand has sent and the Mind not yet read: (type, run/task id, detail)."""
    link = w.link_of(hand)
    assert link is not None
    out: list[tuple[str, ...]] = []
    for f in link.up.queue:
        m = f.msg
        if isinstance(m, Result):
            out.append(("result", m.run_id, "duplicate" if m.value["duplicate"] else "new"))
        elif isinstance(m, Rejected):
            out.append(("rejected", m.run_id, m.code.value))
        elif isinstance(m, Accepted):
            out.append(("accepted", m.run_id))
        elif isinstance(m, TaskInfo):
            out.append(("task_info", m.task_id, m.state.value))
        else:
            out.append((m.TYPE,))
    return out


def outcome(w: World, task_id: str) -> str:
    results = [
        m
        for req in w.clients[0].requests.values()
        if req.kind == "task_start" and req.target == task_id
        for m in req.replies
        if isinstance(m, TaskStartResult)
    ]
    assert len(results) == 1, results
    code = results[0].reject_code
    return results[0].outcome + (f":{code.value}" if code else "")


def ask(w: World, req_id: str, kind: str, target: str) -> str:
    client = w.clients[0]
    assert client.conn is not None
    client.requests[req_id] = Request(req_id, kind, client.conn, target)
    return client.conn


def count_commits(w: World, hand: str = "h1") -> list[list[Any]]:
    """Record every group commit (`write_many`) of the Hand's store."""
    store = w.hands[hand].store
    commits: list[list[Any]] = []
    real = store.write_many

    def write_many(writes: Any) -> list[Any]:
        commits.append(list(writes))
        return real(writes)

    store.write_many = write_many  # type: ignore[method-assign]
    return commits


def test_the_seeds_exercise_batched_admission() -> None:
    """The fault and client mix keeps the batched paths busy: several starts per batch, the same id
    twice in a batch (answered duplicate and conflict), a refused commit, a crash mid-admission."""
    paths = [
        f"admit_batch:{what}"
        for what in (
            "size2",
            "same_id_twice",
            "later_insert",
            "later_duplicate",
            "later_conflict",
            "refused_by_commit",
            "crash_undecided",
        )
    ]
    # Seeds in order until every path was reached, within the first 40 (the bound of running all 40).
    notes: Counter[str] = Counter()
    for seed in range(40):
        notes.update(run_seed(seed, 300).checker.notes)
        if all(notes[what] for what in paths):
            break
    for what in paths:
        assert notes[what] > 0, what


@pytest.mark.parametrize("conflict", [False, True], ids=["same-binding", "other-binding"])
def test_the_same_id_twice_in_one_batch(conflict: bool) -> None:
    """The start goes out twice in one write (the `start_twice` fault): one batch holds the id twice;
    `admit_batch` answers the copy as the first's duplicate (or conflict), one row, one execution."""
    w = world(Rules())
    link = w.link_of("h1")
    assert link is not None
    link.twin = lambda msg: Faults._twin(link, msg, conflict)
    start(w, "t1", 0.5)
    assert [f.glued for f in link.down.queue] == [False, True]
    commits = count_commits(w)
    w.deliver_all("h1", "down")  # the copy is read with the original: one batch
    copy = ("rejected", "t1", "conflicting_duplicate") if conflict else ("accepted", "t1")
    assert answers(w)[:3] == [("accepted", "t1"), ("result", "t1", "new"), copy]
    if not conflict:
        assert answers(w)[3] == ("result", "t1", "duplicate")
    assert w.checker.notes["admit_batch:size2"] == 1 and w.checker.notes["admit_batch:same_id_twice"] == 1
    assert [type(wr).__name__ for wr in commits[0]] == ["Insert"] and len(commits[0][0].rows) == 1  # one row
    settle(w)
    assert outcome(w, "t1") == "accepted"
    assert w.checker.executions[("h1", "task", "t1")] == 1


def test_starts_read_together_are_one_batch_committed_once_and_answered_after_the_commit() -> None:
    """Three starts in one read: one batch, decided in arrival order against the quota (the third
    sees the two admitted before it), ONE commit for both rows, and no answer before it completes."""
    w = world(Rules(), task_limits=TaskLimits(max_running=2, max_retained=2, retention_s=300.0, log_max=200))
    hand = w.hands["h1"].proc
    assert hand is not None
    hand.loop._latency = lambda: 1.0  # every look and commit takes a second
    commits = count_commits(w)
    for t in ("t1", "t2", "t3"):
        start(w, t, 0.5)
    assert w.deliver_together("h1") == 3
    assert w.checker.notes["admit_batch:size3"] == 1
    w.advance(1.0)  # the look is done, the commit is submitted (the rows are on disk) ...
    assert sorted(w.hands["h1"].store.rows) == ["t1", "t2"] and len(commits) == 1
    assert answers(w) == []  # ... but nothing is answered before the commit completes
    w.advance(1.0)
    assert answers(w)[:5] == [
        ("accepted", "t1"),
        ("result", "t1", "new"),
        ("accepted", "t2"),
        ("result", "t2", "new"),
        ("rejected", "t3", "quota_exceeded"),
    ]
    hand.loop._latency = lambda: 0.0
    settle(w)
    assert [outcome(w, t) for t in ("t1", "t2", "t3")] == ["accepted", "accepted", "rejected:quota_exceeded"]


def test_a_failed_commit_refuses_the_whole_batch_and_stores_nothing() -> None:
    w = world(Rules())
    w.hands["h1"].store.fail_commits = 1
    start(w, "t1", 0.5)
    start(w, "t2", 0.5)
    w.deliver_together("h1")
    assert answers(w) == [("rejected", "t1", "internal_error"), ("rejected", "t2", "internal_error")]
    settle(w)
    assert w.hands["h1"].store.rows == {} and not w.checker.executions
    assert [outcome(w, t) for t in ("t1", "t2")] == ["rejected:internal_error"] * 2
    assert w.snapshots.get("t1") is None and w.snapshots.get("t2") is None


@pytest.mark.parametrize("committed", [False, True], ids=["before-the-commit", "commit-unanswered"])
def test_a_hand_crash_loses_the_undecided_starts(committed: bool) -> None:
    """A crash while the batch is being looked up: nothing stored, never answered, the Mind says
    `unknown` and reconciliation forgets the start (the Hand never had it: the id is free for a
    retry, issue 14). A crash once the commit is on disk but unanswered: the restarted Hand marks
    the row `lost`. Nothing runs either way."""
    w = world(Rules())
    slot = w.hands["h1"]
    assert slot.proc is not None
    latencies = iter([0.0, 2.0] if committed else [2.0])
    slot.proc.loop._latency = lambda: next(latencies, 0.0)
    start(w, "t1", 0.5)
    w.deliver_all("h1", "down")
    assert slot.proc.tasks.undecided() and answers(w) == []
    assert ("t1" in slot.store.rows) is committed
    w.faults.crash_hand(slot)
    w.advance(0.5)
    w.start_hand(slot)
    settle(w)
    assert outcome(w, "t1") == "unknown"
    snap = w.snapshots.get("t1")
    if committed:
        row = slot.store.rows["t1"]
        assert snap is not None and snap.state is TaskState.LOST
        assert row.state is TaskState.LOST and snap.info is not None and snap.info.reason == row.reason
    else:
        assert "t1" not in slot.store.rows and snap is None
    assert not w.checker.executions


def test_a_request_read_after_a_start_sees_it() -> None:
    """`task_status` read in the same read as the start is answered after the start is decided."""
    w = world(Rules())
    hand = w.hands["h1"].proc
    link = w.link_of("h1")
    assert hand is not None and link is not None
    hand.loop._latency = lambda: 0.5
    start(w, "t1", 5.0)
    link.send(link.down, TaskStatus(task_id="t1"), "probe", w.clock.now)
    assert w.deliver_together("h1") == 2
    w.advance(1.6)  # look 0.5 s, commit 0.5 s, then the status's own read 0.5 s
    assert answers(w)[:3] == [("accepted", "t1"), ("result", "t1", "new"), ("task_info", "t1", "queued")]
    hand.loop._latency = lambda: 0.0
    settle(w)


# --- bugs the simulation found in the batched admission as first shipped (fixed; `sim.variants`) ----


def race_cancel_of_an_undecided_start(rules: Rules) -> None:
    """A client cancels a task's start run; the `cancel` reaches the Hand in the same read as the start
    (or while its batch is looked up). The Hand as shipped answers it `unknown_run` at once, before the
    start is decided: the Mind ends the start run `lost` and keeps the snapshot. The quota then
    refuses the start: nothing is stored, and the Mind shows a `queued` task that nothing will ever
    refresh (`task get` gets `unknown_task` and keeps it) until the Hand reconnects."""
    w = world(rules, task_limits=TaskLimits(max_running=2, max_retained=1, retention_s=300.0, log_max=200))
    start(w, "t5", 0.05)
    settle(w)  # the one row the quota allows
    start(w, "t1", 0.05)
    assert w.mind is not None
    w.mind.on_cancel_run(ask(w, "qc", "cancel_run", "t1"), "qc", "t1")
    w.drain()
    assert w.deliver_together("h1") == 2  # rpc t1, cancel t1
    settle(w)


def test_the_hand_before_the_fix_answers_a_start_runs_cancel_before_the_start() -> None:
    with pytest.raises(InvariantViolation) as caught:
        race_cancel_of_an_undecided_start(VARIANTS["hand-batch-before-fix"])
    assert caught.value.invariant == "every non-terminal snapshot is fresh"
    assert "t1 queued stale=True" in caught.value.detail


def test_a_cancel_that_waits_for_the_undecided_starts_leaves_nothing_stale() -> None:
    race_cancel_of_an_undecided_start(Rules())


def race_reader_cancelled_while_deciding_a_batch(rules: Rules) -> None:
    """The reader reads a start and a `task_status` in one go; `settle` (for the status) decides the
    start's batch in the READER's task. The connection drops while the batch's commit is in flight:
    the reader is cancelled, the group commit still stores the row, and nobody queues it."""
    w = world(rules)
    start(w, "t5", 0.05)
    settle(w)
    hand = w.hands["h1"].proc
    assert hand is not None and w.mind is not None
    latencies = iter([0.0, 2.0])  # the look is quick, the commit stalls
    hand.loop._latency = lambda: next(latencies, 0.0)
    start(w, "t1", 1.0)
    w.mind.on_task_get(ask(w, "qg", "task_get", "t5"), "qg", TaskGet(task_id="t5"))
    w.drain()
    assert w.deliver_together("h1") == 2  # rpc t1, task_status t5
    reconnect(w)
    settle(w)


def test_the_hand_before_the_fix_strands_a_batch_its_cancelled_reader_was_deciding() -> None:
    with pytest.raises(InvariantViolation) as caught:
        race_reader_cancelled_while_deciding_a_batch(VARIANTS["hand-batch-before-fix"])
    assert caught.value.invariant == "every task ends"
    assert "t1 on h1 still queued" in caught.value.detail


def test_batches_decided_in_the_owner_survive_a_cancelled_reader() -> None:
    race_reader_cancelled_while_deciding_a_batch(Rules())


# --- retries the Hand settles (issue 14) ------------------------------------------------------------


def start_results(w: World, task_id: str) -> list[str]:
    return [
        m.outcome
        for req in w.clients[0].requests.values()
        if req.kind == "task_start" and req.target == task_id
        for m in req.replies
        if isinstance(m, TaskStartResult)
    ]


def test_a_retry_of_a_start_the_hand_never_saw_is_asked_of_the_hand_and_runs_once() -> None:
    """The start is lost with the link before the Hand reads it; the retry comes after the Hand is
    back but before reconciliation: the Mind's snapshot (never reported) is no answer, so the start
    goes to the Hand again, which admits it: `accepted`, and it runs once."""
    w = world(Rules())
    start(w, "t1", 0.05)
    link = w.link_of("h1")
    assert link is not None
    w.close_link(link, "cut", 0.0, 0.0)  # the rpc in flight is lost
    w.advance(0.05)
    assert start_results(w, "t1") == ["unknown"]
    snap = w.snapshots.get("t1")
    assert snap is not None and snap.version == 0 and not snap.start_pending
    w.advance(0.3)  # the Hand dials again; the Mind welcomes it (inventory not yet answered)
    assert w.link_of("h1") is not None
    held = w.snapshots.get("t1")
    assert held is not None and held.version == 0, "reconciliation ran first: this is not the retry path"
    start(w, "t1", 0.05)  # the retry: same binding
    settle(w)
    assert start_results(w, "t1") == ["unknown", "accepted"]
    assert [n for key, n in w.checker.executions.items() if "t1" in key] == [1]


def test_two_starts_of_one_id_in_flight_hear_one_answer_from_the_hand() -> None:
    """A second start of the same id while the first is in flight joins it: both hear the Hand's
    answer (the joiner `duplicate` of an accepted one), and the Hand receives one start."""
    w = world(Rules())
    start(w, "t1", 0.05)
    w.advance(0.001)
    start(w, "t1", 0.05)
    settle(w)
    assert sorted(start_results(w, "t1")) == ["accepted", "duplicate"]
