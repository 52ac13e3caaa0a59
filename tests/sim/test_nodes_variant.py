"""The `nodes` variant (issue 27, DESIGN §16): two Mind nodes driving the real `NodeCore`, one
database with its own clock, Hands that move between the nodes. Its seeds hold every invariant of
`sim.nodes_checker`, they exercise what the issue names (kills, freezes past the lease, cut and slow
database links, cut and blackholed Hand links, Hands moving and re-presenting their runs), a seed
replays exactly, and the checker trips on each broken rule below (so a green run means something)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from sim.checker import InvariantViolation
from sim.nodes_world import LEASE, NodesWorld, Request, SimDb, SimHand
from sim.variants import VARIANTS

from mind.core.nodes import NodeAction, NodeCore

NODES = VARIANTS["nodes"]
SEEDS_PER_CHUNK = 15 if settings().max_examples >= 600 else 5
"""Seeds 0-19 run in `test_the_seeds_exercise_nodes_leases_and_moves` (every invariant is checked on
every seed), so the chunks start at 20: 30 more in the full suite, 10 more in the edit loop."""


def run(seed: int, world: type[NodesWorld] = NodesWorld, trace: Any = None) -> NodesWorld:
    return world(seed, 300, rules=NODES, trace=trace).run()


@pytest.mark.parametrize("chunk", range(2))
def test_nodes_seeds_hold_every_invariant(chunk: int) -> None:
    for seed in range(20 + chunk * SEEDS_PER_CHUNK, 20 + (chunk + 1) * SEEDS_PER_CHUNK):
        run(seed)


def test_the_seeds_exercise_nodes_leases_and_moves() -> None:
    seen: Counter[str] = Counter()
    for seed in range(20):
        w = run(seed)
        seen.update(w.events)
        seen.update(w.checker.notes)
    for what in (
        "fault:mind_crash",  # kill a node
        "fault:freeze",  # SIGSTOP past the lease, then wake
        "fault:partition",  # node <-> database cut
        "fault:latency",  # node <-> database slow
        "fault:cut",  # Hand <-> node cut
        "node:lease_lost",
        "node:lease_regained",
        "node:close this node's lease passed",
        "client:reattach",  # a client whose node died asks the other one
        "node:handed_over",  # a claim by the other node: the runs started here go with their Hand
        "answer:refused:lease",
        "node:relayed",  # an exec for a Hand the other node holds: relayed over the node link
        "node:relay_lost",  # the far end died or lost the Hand: the client went round
        "answer:refused:offline",  # no live node holds it: refused, with an answer
        "outcome:exit_0",
        "outcome:lost",  # a start that never reached its Hand, reconciled
    ):
        assert seen[what] > 0, what
    assert seen["note:claim"] > 100


def test_a_seed_replays_exactly() -> None:
    a: list[str] = []
    b: list[str] = []
    run(7, trace=a.append)
    run(7, trace=b.append)
    assert a == b and len(a) > 300


def first_violation(world: type[NodesWorld], seeds: int = 200) -> InvariantViolation:
    for seed in range(seeds):
        try:
            run(seed, world)
        except InvariantViolation as violation:
            return violation
    raise AssertionError("the checker never tripped")


class LeaseFromAnswer(NodeCore):
    """Counts its lease from when the renewal's answer came, not from when it was sent."""

    def renewed(self, sent_at: float, now: float) -> list[NodeAction]:
        return super().renewed(now, now)


class UnfencedDb(SimDb):
    """Writes about a Hand land whatever claim they carry."""

    fences = False


class LastEndingWinsDb(SimDb):
    def end(self, run: str, hand: str, node: str, claim: int, state: str) -> str:
        self.endings.pop(run, None)
        return super().end(run, hand, node, claim, state)


def test_a_lease_counted_from_the_answer_is_caught() -> None:
    v = first_violation(type("W", (NodesWorld,), {"core_cls": LeaseFromAnswer}))
    assert v.invariant == "a node's lease never outlives the database's"


def test_a_write_without_its_claim_is_caught() -> None:
    v = first_violation(type("W", (NodesWorld,), {"db_cls": UnfencedDb}))
    assert v.invariant == "a write lands only with the current claim"
    assert "--variant nodes" in v.replay


def test_an_ending_recorded_twice_is_caught() -> None:
    v = first_violation(type("W", (NodesWorld,), {"db_cls": LastEndingWinsDb}))
    assert v.invariant == "one terminal per run, recorded once"


class ImpatientHand(SimHand):
    """Kills its runs a second after its connection drops: a node's death would lose them."""

    window = 1.0


def test_runs_killed_within_the_window_are_caught() -> None:
    v = first_violation(type("W", (NodesWorld,), {"hand_cls": ImpatientHand}))
    assert v.invariant == "runs within the window are not lost"


class SlowRunsHand(SimHand):
    durations = (30.0,)


def settled_world(seed: int = 1) -> NodesWorld:
    """A world with no random steps: both nodes up, every Hand welcomed somewhere, runs of 30 s."""
    w = type("W", (NodesWorld,), {"hand_cls": SlowRunsHand})(seed, steps=0, rules=NODES)
    w.advance_to(w.clock.now + 2.0)
    assert all(h.link is not None and h.link.welcomed for h in w.hands.values())
    return w


def exec_on_holder(w: NodesWorld, hand: str, run: str) -> tuple[str, Request]:
    holder = w.hands[hand].link
    assert holder is not None
    req = Request("c0", f"q-{run}", holder.node, w.nodes[holder.node].life, run)
    w.requests[req.req] = req
    node = w.nodes[holder.node]
    node.run(lambda: node.exec("c0", req.req, hand, run))
    for _ in range(100):  # the start statement (it may stall), the Start frame
        w.advance_to(w.clock.now + 0.1)
        if run in w.hands[hand].runs:
            break
    return holder.node, req


def test_a_run_outlives_a_freeze_of_its_node_past_the_lease() -> None:
    """SIGSTOP of the node holding a Hand mid-run, for three leases, then SIGCONT: the Hand moved,
    the other node recorded the run's real result once, the client (asking the other node once
    its own fell silent) is told that result, and the woken node holds nothing."""
    w = settled_world()
    first, req = exec_on_holder(w, "h1", "r-frozen")
    assert w.hands["h1"].runs, "the Hand runs it"
    other = next(n for n in w.nodes if n != first)
    w.nodes[first].freeze(3 * LEASE)
    w.advance_to(w.clock.now + 3 * LEASE + 60.0)
    hand_link = w.hands["h1"].link
    assert hand_link is not None and hand_link.node == other
    assert w.db.hands["h1"][0] == other
    ran = w.checker.hand_results["r-frozen"][1]
    assert w.db.endings["r-frozen"] == ran and ran != "lost"
    assert req.answers == [f"ended {ran}"]
    assert "h1" not in w.nodes[first].core.claims
    w.checker.settled()


def test_a_node_cut_from_its_database_refuses_starts_with_an_answer() -> None:
    """Cut from the database past its lease, a node closes its Hands and refuses a start with
    its lease refusal (never accepted and then forgotten); healed, it serves again."""
    w = settled_world(3)
    name = "n1"
    w.db_links[name].up = False
    w.db_links[name].epoch += 1
    w.advance_to(w.clock.now + LEASE + 1.0)
    node = w.nodes[name]
    assert not node.core.live(node.now()) and not node.conns
    req = Request("c0", "q-cut", name, node.life, "r-cut")
    w.requests[req.req] = req
    node.run(lambda: node.exec("c0", "q-cut", "h1", "r-cut"))
    assert req.answers == ["refused: lease"]
    assert "r-cut" not in w.db.runs
    w.db_links[name].up = True
    w.advance_to(w.clock.now + LEASE)
    assert node.core.live(node.now())


def test_an_answer_relayed_to_a_client_that_went_round_is_caught() -> None:
    """The relaying node hands the holder's answer to the client only while the client is still on
    its connection; one that went round asks elsewhere, so a second answer would reach it."""
    from sim.nodes_world import SimNode

    class Careless(SimNode):
        def relayed_answer(self, client: str, req: str, what: str) -> None:
            self.relays.pop(req, None)
            self.w.answer(client, req, what)

    class W(NodesWorld):
        def start_node(self, name: str) -> None:
            super().start_node(name)
            self.nodes[name].__class__ = Careless

    v = first_violation(W)
    assert v.invariant == "every request gets one answer", v
