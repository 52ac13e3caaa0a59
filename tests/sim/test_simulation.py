"""The deterministic simulation: a few hundred seeds hold every invariant; a seed replays exactly;
the in-memory snapshot table is the real store; and the checker does trip, on deliberately broken
rules and on the two races it found (replayed here as scripted scenarios on the virtual clock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mind.registry import RunRegistry
from mind.tasks import reconcile
from protocol.messages import Result, TaskStart
from sim.checker import InvariantViolation
from sim.hand_agent import HandConn, HandProcess
from sim.hand_tasks import HandTasks, _Live
from sim.jobs import JobSpec
from sim.mind_shell import SimMind
from sim.simulation import Config, Rules, World, run_seed
from sim.variants import VARIANTS

ROOT = Path(__file__).resolve().parents[2]
SEEDS_PER_CHUNK = 50


@pytest.mark.parametrize("chunk", range(6))
def test_seeds_hold_every_invariant(chunk: int) -> None:
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        run_seed(seed, 300)  # raises InvariantViolation with its replay command


def test_a_seed_replays_exactly() -> None:
    first: list[str] = []
    second: list[str] = []
    run_seed(7, 200, trace=first.append)
    run_seed(7, 200, trace=second.append)
    assert first == second and len(first) > 200


def test_a_seed_replays_exactly_in_another_process() -> None:
    """Nothing depends on string hashing (set order) or the wall clock: other hash seeds, same run."""
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "sim.py"), "--seed", "11", "--digest"],
                              capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and "digest" in outs[0]


def test_the_snapshot_model_is_the_real_store() -> None:
    """Every snapshot operation runs against the model and the real SQLite `SnapshotStore`."""
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
    violation = first_violation(Rules(registry_cls=GenerationBlindRegistry, hand_cls=ResendingHand),
                                "results only from the accepting generation")
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
    """Broken: never declares a task the Hand does not know `lost`."""
    plan = reconcile(*args, **kwargs)
    plan.unchanged += len(plan.lost)
    plan.lost = []
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
    w.actions.start_task(w.clients[0], TaskStart(hand="h1", task_id=task_id, tool="exec",
                                                 args=JobSpec(seconds).args(), max_runtime_ms=60_000))


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


def test_the_hand_as_shipped_leaves_the_mind_saying_lost() -> None:
    with pytest.raises(InvariantViolation) as caught:
        race_admission_across_a_reconnect(VARIANTS["hand-before-fix"])
    assert caught.value.invariant == "mind snapshot equals the hand's row"
    assert "t1: mind says lost (unknown to hand)" in caught.value.detail
