"""A node's lease and claims (`mind.core.nodes`): events and times in, actions out; and, over any
interleaving of two nodes against one model of the database's rows, never two nodes acting for
one Hand, and never a node acting while the database deems it dead."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from mind.core.nodes import LEASE_LOST_MESSAGE, CloseHand, LeaseLost, LeaseRegained, NodeCore

LEASE = 10.0


def test_a_node_starts_without_a_lease_and_gains_one_on_its_first_renewal() -> None:
    core = NodeCore(lease=LEASE)
    assert core.refusal(0.0) == LEASE_LOST_MESSAGE
    assert core.renewed(sent_at=0.0, now=0.2) == [LeaseRegained()]
    assert core.refusal(5.0) is None
    assert core.renewed(sent_at=3.0, now=3.1) == []  # renewed while live: nothing to say


def test_a_lease_that_passes_closes_every_hand_once_and_refuses_starts() -> None:
    core = NodeCore(lease=LEASE)
    core.renewed(0.0, 0.1)
    core.claimed("h1", 4, 0.5)
    core.claimed("h2", 7, 0.6)
    assert core.tick(9.9) == []
    out = core.tick(10.0)
    assert out[:2] == [CloseHand("h1", 4, "this node's lease passed"), CloseHand("h2", 7, "this node's lease passed")]
    assert isinstance(out[2], LeaseLost)
    assert core.tick(11.0) == []  # said once
    assert core.acts_for("h1", 10.0) is None
    assert core.refusal(10.0) == LEASE_LOST_MESSAGE
    # a renewal that succeeds again: the node accepts Hands again, but holds none of the old ones
    assert core.renewed(12.0, 12.1) == [LeaseRegained()]
    assert core.acts_for("h1", 12.2) is None


def test_a_frozen_node_wakes_and_acts_for_nothing() -> None:
    """SIGSTOP longer than the lease: the answer to a renewal sent before the pause comes back after
    it; it must not revive the node (the database may have deemed it dead and another claimed)."""
    core = NodeCore(lease=LEASE)
    core.renewed(0.0, 0.1)
    core.claimed("h", 1, 1.0)
    # renewal sent at 2.0, the process frozen until 40.0, then the answer is read
    assert core.renewed(2.0, 40.0) == []
    assert core.acts_for("h", 40.0) is None
    assert core.tick(40.0)[0] == CloseHand("h", 1, "this node's lease passed")


def test_a_claim_answered_after_the_lease_passed_is_closed_at_once() -> None:
    core = NodeCore(lease=LEASE)
    core.renewed(0.0, 0.1)
    out = core.claimed("h", 3, 10.5)
    assert CloseHand("h", 3, "this node's lease passed") in out
    assert core.acts_for("h", 10.5) is None


def test_a_newer_claim_learned_closes_the_stale_connection() -> None:
    core = NodeCore(lease=LEASE)
    core.renewed(0.0, 0.1)
    core.claimed("h", 3, 1.0)
    assert core.newer_claim("h", 3) == []  # our own claim, echoed by NOTIFY
    assert core.newer_claim("h", 2) == []  # an older one, late
    assert core.newer_claim("h", 4) == [CloseHand("h", 3, "claimed by another node (claim 4)")]
    assert core.acts_for("h", 1.0) is None
    assert core.newer_claim("h", 5) == []  # already gone


def test_a_write_that_matched_no_row_is_the_signal() -> None:
    core = NodeCore(lease=LEASE)
    core.renewed(0.0, 0.1)
    core.claimed("h", 3, 1.0)
    assert core.write_missed("h", 2) == []  # a write of an older connection of ours
    assert core.write_missed("h", 3) == [CloseHand("h", 3, "claimed by another node (a write found a newer claim)")]
    assert core.acts_for("h", 1.0) is None


def test_a_reconnection_to_the_same_node_keeps_the_newest_claim() -> None:
    core = NodeCore(lease=LEASE)
    core.renewed(0.0, 0.1)
    core.claimed("h", 3, 1.0)
    core.claimed("h", 4, 1.1)
    core.released("h", 3)  # the old connection's end does not drop the new claim
    assert core.acts_for("h", 1.2) == 4
    core.released("h", 4)
    assert core.acts_for("h", 1.2) is None


# --- two nodes, one database, any interleaving --------------------------------------------------


@dataclass
class Db:
    """The rows that matter, on the database's clock (the test's one clock)."""

    heartbeat: dict[str, float] = field(default_factory=dict)
    hands: dict[str, tuple[str, int]] = field(default_factory=dict)
    landed: list[tuple[float, str, str, int]] = field(default_factory=list)

    def live(self, node: str, t: float) -> bool:
        return node in self.heartbeat and t - self.heartbeat[node] < LEASE

    def claim(self, node: str, hand: str, t: float) -> int | None:
        """`UPDATE hands SET node = $me, claim = claim + 1 ... WHERE <my lease is live> RETURNING claim`."""
        if not self.live(node, t):
            return None
        claim = self.hands.get(hand, ("", 0))[1] + 1
        self.hands[hand] = (node, claim)
        return claim

    def write(self, node: str, hand: str, claim: int, t: float) -> bool:
        """A write about the Hand, conditional on the claim: lands or matches no row."""
        if self.hands.get(hand) != (node, claim):
            return False
        self.landed.append((t, node, hand, claim))
        return True


NODES = ("a", "b")
HANDS = ("h1", "h2")
DELAYS = st.sampled_from([0.0, 0.1, 1.0, 4.0, 12.0])  # 12 s: past the lease (a slow database, a pause)

op = st.tuples(
    st.sampled_from([0.0, 1.0, 3.0, 6.0, 9.0, 10.0, 14.0, 20.0, 30.0]),  # when the node starts it
    st.sampled_from(NODES),
    st.sampled_from(["renew", "renew", "claim", "write", "tick"]),
    st.sampled_from(HANDS),
    DELAYS,  # until the statement lands in the database
    DELAYS,  # until its answer is read by the node
    st.one_of(st.none(), DELAYS),  # until the other node hears the claim's NOTIFY (None: never)
    st.booleans(),  # the answer is lost (a connection dropped after the commit)
)


@given(st.lists(op, min_size=1, max_size=30))
def test_no_two_nodes_ever_act_for_one_hand(ops: list[tuple[str, ...]]) -> None:
    """Renewals, claims and writes of two nodes, each statement landing in the database and its
    answer read after any delay (past a lease too: a slow database, a paused node), NOTIFYs late or
    never, answers lost. After every event: a node that acts for a Hand is live in the database's
    eyes (so a node the others deem dead acts for nothing), and at most one node acts for a Hand by
    a claim the database would let land; the writes that landed carry non-decreasing claims."""
    db = Db()
    cores = {n: NodeCore(lease=LEASE) for n in NODES}
    events: list[tuple[float, int, object]] = []

    def at(t: float, fn: object) -> None:
        events.append((t, len(events), fn))

    for start, node, kind, hand, land, answer, notify, lost in ops:  # type: ignore[misc]
        core = cores[node]
        if kind == "renew":

            def renew_land(t: float, node: str = node) -> None:
                db.heartbeat[node] = max(db.heartbeat.get(node, t), t)  # `heartbeat_at = now()`

            at(start + land, renew_land)
            if not lost:
                at(start + land + answer, lambda t, core=core, sent=start: core.renewed(sent, t))
        elif kind == "claim":
            got: list[int | None] = []

            def claim_land(
                t: float,
                node: str = node,
                hand: str = hand,
                got: list[int | None] = got,
                land: float = land,
                notify: float | None = notify,
            ) -> None:
                got.append(db.claim(node, hand, t))
                if got[0] is not None and notify is not None:
                    for other in NODES:
                        if other != node:
                            at(t + notify, lambda t, c=cores[other], h=hand, g=got[0]: c.newer_claim(h, g))
                            events.sort(key=lambda e: (e[0], e[1]))

            at(start + land, claim_land)
            if not lost:
                at(
                    start + land + answer,
                    lambda t, core=core, hand=hand, got=got: got[0] is not None and core.claimed(hand, got[0], t),
                )
        elif kind == "write":

            def write(t: float, node: str = node, core: NodeCore = core, hand: str = hand, land: float = land) -> None:
                held = core.acts_for(hand, t)
                if held is not None:
                    at(t + land, lambda t: db.write(node, hand, held, t) or core.write_missed(hand, held))
                    events.sort(key=lambda e: (e[0], e[1]))

            at(start, write)
        else:
            at(start, lambda t, core=core: core.tick(t))
    events.sort(key=lambda e: (e[0], e[1]))
    done = 0
    while done < len(events):
        t, _, fn = events[done]
        done += 1
        fn(t)  # type: ignore[operator]
        events[done:] = sorted(events[done:], key=lambda e: (e[0], e[1]))
        for probe in (t, t + 0.05):
            for h in HANDS:
                acting = [n for n in NODES if cores[n].acts_for(h, probe) is not None]
                for n in acting:
                    assert db.live(n, probe), f"{n} acts for {h} at {probe} while the database deems it dead"
                landing = [n for n in acting if db.hands.get(h) == (n, cores[n].acts_for(h, probe))]
                assert len(landing) <= 1
    for h in HANDS:
        seen = [c for (_, _, hh, c) in db.landed if hh == h]
        assert seen == sorted(seen)
