"""A Mind node's ownership and liveness among many nodes sharing one database (DESIGN §16).

Pure: fed events and the caller's monotonic time, it returns what the shell must do. The shell
(`mind.daemon.nodes`) performs the database statements and tells this core how they went.

Two ideas, each the smallest that makes "at no instant two nodes act for one Hand" hold:

- **A lease.** A node heartbeats its row of `nodes` on the database's clock (`heartbeat_at =
  now()`); the database deems it live while `heartbeat_at` is younger than the lease. The core
  counts its own lease from the moment it *sent* the renewal that succeeded, never from when the
  answer came: the row was written after that moment, so the node's own view always expires no
  later than the database's. A node whose lease passed acts for nothing: its Hand connections are
  closed and new starts refused, until a renewal succeeds again. A frozen node (SIGSTOP) wakes with
  its lease long passed and closes everything before it acts.
- **Claims (fencing tokens).** A Hand's welcome claims it in one statement that bumps `hands.claim`,
  names this node, and is refused by the database unless this node's lease is live there. Every
  later write about the Hand or its runs is conditional on that claim; a write that matched no row
  means another node claimed it since. A newer claim learned (NOTIFY, or such a write) closes this
  node's stale connection and forgets the Hand: one claim per Hand is current in the database, so
  at most one node's writes about it can land.

On SQLite (one Mind) the shell never feeds this core: the credential generation is the claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_LEASE_S = 10.0
"""`--node-lease`: how long a node acts after its last successful renewal."""


def renew_every(lease: float) -> float:
    """How often to renew: a third of the lease, so one lost heartbeat (or one slow statement)
    costs nothing and two in a row still leave a margin."""
    return lease / 3


# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CloseHand:
    """Close this node's connection to the Hand at this claim: it acts for the Hand no more."""

    hand: str
    claim: int
    why: str


@dataclass(frozen=True)
class LeaseLost:
    """The lease passed: every Hand was closed (`CloseHand` before this); starts are refused."""

    since_renewal: float


@dataclass(frozen=True)
class LeaseRegained:
    """A renewal succeeded after the lease had passed: the node accepts Hands and starts again."""


NodeAction = CloseHand | LeaseLost | LeaseRegained

LEASE_LOST_MESSAGE = (
    "this Mind node lost its lease on the shared database (it cannot reach it, or it was paused); "
    "nothing was started: try again (or another Mind node)"
)
"""What a client is told when it asks a node without a live lease to start anything."""


@dataclass
class NodeCore:
    """One node's lease and the claims it holds."""

    lease: float = DEFAULT_LEASE_S
    live_until: float = float("-inf")
    """The monotonic instant the lease passes (the send time of the last renewal that succeeded,
    plus the lease)."""
    claims: dict[str, int] = field(default_factory=dict)
    """Hand label -> the claim this node holds it by (the one its writes carry)."""
    _lost: bool = True
    """The lease passed and `LeaseLost` was said (a node starts without one)."""

    # --- the lease ---

    def live(self, now: float) -> bool:
        return now < self.live_until

    def renewed(self, sent_at: float, now: float) -> list[NodeAction]:
        """A renewal sent at `sent_at` succeeded (the database wrote `heartbeat_at = now()` after
        that instant). An answer older than what we hold changes nothing. A renewal that came back
        after its own lease had passed does not revive the node: the database may have deemed it
        dead in between (and another node claimed its Hands)."""
        until = sent_at + self.lease
        if until <= self.live_until:
            return []
        self.live_until = until
        if self._lost and self.live(now):
            self._lost = False
            return [LeaseRegained()]
        return []

    def tick(self, now: float) -> list[NodeAction]:
        """Time passed (the shell's ticker, and before anything it acts on after a pause): a lease
        that passed closes every Hand connection, at once, once."""
        if self._lost or self.live(now):
            return []
        self._lost = True
        out: list[NodeAction] = [
            CloseHand(hand, claim, "this node's lease passed") for hand, claim in sorted(self.claims.items())
        ]
        self.claims.clear()
        out.append(LeaseLost(since_renewal=now - (self.live_until - self.lease)))
        return out

    def refusal(self, now: float) -> str | None:
        """Why a start (or a Hand's welcome) must be refused now, or None."""
        return None if self.live(now) else LEASE_LOST_MESSAGE

    # --- claims ---

    def claimed(self, hand: str, claim: int, now: float) -> list[NodeAction]:
        """The claim statement for `hand` returned `claim`. If the lease passed while it was on its
        way, the Hand is closed at once (another node may hold it by now)."""
        actions = self.tick(now)
        if not self.live(now):
            return [*actions, CloseHand(hand, claim, "this node's lease passed")]
        if claim > self.claims.get(hand, -1):
            self.claims[hand] = claim
        return actions

    def newer_claim(self, hand: str, claim: int) -> list[NodeAction]:
        """Another claim of `hand` was made (NOTIFY, the poll): stale if it is newer than ours."""
        held = self.claims.get(hand)
        if held is None or claim <= held:
            return []
        del self.claims[hand]
        return [CloseHand(hand, held, f"claimed by another node (claim {claim})")]

    def write_missed(self, hand: str, claim: int) -> list[NodeAction]:
        """A write conditional on `claim` matched no row: someone holds a newer claim."""
        if self.claims.get(hand) != claim:
            return []
        del self.claims[hand]
        return [CloseHand(hand, claim, "claimed by another node (a write found a newer claim)")]

    def released(self, hand: str, claim: int) -> None:
        """This node's connection at `claim` ended by itself."""
        if self.claims.get(hand) == claim:
            del self.claims[hand]

    def acts_for(self, hand: str, now: float) -> int | None:
        """The claim this node may act for `hand` by now (its writes carry it), or None: it acts
        for nothing it does not hold, and for nothing at all without a live lease."""
        if not self.live(now):
            return None
        return self.claims.get(hand)


NODE_LABEL = "mind-node"
"""The label of the client credential Mind nodes sharing a database authenticate to each other
with (DESIGN §16, routing). One row per database, made by the first node that needs it, its
secret read from the database by each node and never written to a file: an operator's credential
file cannot be used to pose as a node."""


def request_owner(sender: str, on_behalf_of: str | None, shared: bool) -> str | None:
    """Whose request this is: the sender's own, or, relayed by another node (`on_behalf_of`), the
    client the relaying node authenticated and checked the scope of. Only a node's credential on a
    shared database may name another owner; None: anyone else tried (refused, never obeyed)."""
    if on_behalf_of is None:
        return sender
    if shared and sender == NODE_LABEL:
        return on_behalf_of
    return None
