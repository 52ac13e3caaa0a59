"""The shell of `mind.core.nodes` on a shared database: heartbeats, claims, and what is heard.

Only a node on PostgreSQL has one (`Mind.nodes`); a SQLite Mind is alone and its Hands'
generations fence their connections as before. The core decides; this performs:

- the heartbeat task renews this node's row every third of the lease (one statement per node,
  whatever its Hands), each bounded by half the lease, and tells the core when each renewal was
  sent and whether it succeeded;
- `claim` is a Hand's welcome (`PgNodes.claim`, one statement); `refusal` answers a handshake or
  a start while the lease is not live;
- the LISTEN connection hears other nodes' claims (a stale connection here is closed) and
  credential changes (the sweep runs at once); while it is down, the claims of the Hands held
  here are polled every 0.5 s, as is the credential epoch;
- a write that found a newer claim (`Fenced`) is the same signal as a NOTIFY.

Closing connections is the one act: a Hand closed here reconnects (to another node, since this
one refuses it until it is live again), and re-presents its runs there (DESIGN §15). A claim by
another node also hands over the runs of that Hand held here (`hand_over`): forgotten, their
attached clients closed, to re-attach where the runs are now.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from mind.core.nodes import (
    LEASE_LOST_MESSAGE,
    NODE_LABEL,
    CloseHand,
    LeaseLost,
    LeaseRegained,
    NodeAction,
    NodeCore,
    renew_every,
)
from mind.daemon.peer import CLOSE_TRY_LATER, close_quietly
from mind.store.api import Nodes, NotLive, StoreUnavailable
from protocol import limits
from protocol.codes import CancelReason, ErrorCode
from protocol.messages import Error, NodeInfo

if TYPE_CHECKING:
    from mind.daemon.host import Host
    from mind.store.endings import Ending

log = structlog.get_logger(component="mind.nodes")

POLL_S = 0.5
"""How often claims are polled while the LISTEN connection is down."""


class NodeShell:
    def __init__(self, mind: Host, nodes: Nodes, lease: float, credentials_changed: Callable[[], None]) -> None:
        self.mind = mind
        self._credentials_changed = credentials_changed
        self.nodes = nodes
        self.name = nodes.name
        self.core = NodeCore(lease=lease)
        nodes.fence.on_fenced = self.fenced
        nodes.fence.active = True

    # --- the lease ---

    async def renew(self) -> None:
        """One heartbeat; the core counts the lease from the instant it was sent."""
        sent = time.monotonic()
        await self.nodes.heartbeat(timeout=self.core.lease / 2)
        self.perform(self.core.renewed(sent, time.monotonic()))

    async def heartbeats(self) -> None:
        away = False
        while True:
            await asyncio.sleep(renew_every(self.core.lease))
            try:
                await self.renew()
            except StoreUnavailable as exc:  # once per outage; the lease passes by itself
                if not away:
                    away = True
                    log.error("node_heartbeat_failed", node=self.name, error=str(exc))
                continue
            if away:
                away = False
                log.info("node_heartbeat_ok", node=self.name)

    def tick(self, now: float) -> None:
        self.perform(self.core.tick(now))

    def live(self) -> bool:
        """The lease is live now (nothing performed: `refusal` and the ticker close what it held)."""
        return self.core.live(time.monotonic())

    def refusal(self) -> str | None:
        """Why a handshake or a start must be refused now (the lease passed), or None."""
        now = time.monotonic()
        self.tick(now)
        return self.core.refusal(now)

    # --- claims ---

    async def claim(self, hand: str, secret: bytes) -> int | None:
        """A Hand's welcome after its proof: claimed in one statement (`PgNodes.welcome`) that also
        re-reads its secret and reads what any node ended of its runs; None when the secret no
        longer matches (revoked or rotated since the hello); or `NotLive`/`StoreUnavailable`."""
        got = await self.nodes.welcome(hand, self.core.lease, secret, self._endings_since())
        if got is None:
            return None
        claim, endings = got
        self._learn_endings(endings)
        actions = self.core.claimed(hand, claim, time.monotonic())
        self.perform(actions)
        if any(isinstance(a, CloseHand) and a.hand == hand and a.claim == claim for a in actions):
            raise NotLive(LEASE_LOST_MESSAGE)
        if self.mind.router is not None:  # its runs relayed from here to its old node come here now
            self.mind.router.hand_here(hand)
        return claim

    def _endings_since(self) -> float:
        """The wall-clock start of the endings a Hand's runs may still need (none without a window)."""
        window = self.mind.cfg.resume_window
        if window <= 0:
            return math.inf
        return time.time() - limits.RUN_TIMEOUT_MAX_MS / 1000 - window

    def _learn_endings(self, endings: list[Ending]) -> None:
        """Before the Hand (claimed here now) presents its runs: what any node ended of them, so
        that a run another node ended is killed, not adopted (first terminal wins, across nodes).
        Read in the claim's statement once the claim holds the Hand's row, with a snapshot of its
        own: a node that lost the Hand can write no ending after it."""
        m = self.mind
        now = time.monotonic()
        for e in endings:
            try:
                reason = CancelReason(e.cancel_reason) if e.cancel_reason else None
            except ValueError:  # written by a newer Mind: the Hand is told the generic reason
                reason = None
            m.registry.restore(e.end, e.owner, reason, e.args_digest, e.ended_at, now)

    def acts(self, hand: str, gen: int) -> bool:
        """This node may act for the Hand's connection `gen` now (its messages are read)."""
        now = time.monotonic()
        self.tick(now)
        return self.core.acts_for(hand, now) == gen

    def released(self, hand: str, gen: int) -> None:
        self.core.released(hand, gen)
        self.mind.spawn(self._release(hand, gen))

    async def _release(self, hand: str, gen: int) -> None:
        try:
            await self.nodes.release(hand, gen)
        except StoreUnavailable:  # shown held until its node's heartbeat is older than a lease
            pass

    async def holders(self) -> dict[str, str]:
        """The Hands held by live nodes (`mind hands` through any node): label -> node."""
        return {h: node for h, (node, _, age) in (await self.nodes.holders()).items() if age < self.core.lease}

    async def node_infos(self) -> list[NodeInfo]:
        counts: dict[str, int] = {}
        for node, _, _ in (await self.nodes.holders()).values():
            counts[node] = counts.get(node, 0) + 1
        return [
            NodeInfo(
                name=name,
                live=age < self.core.lease,
                running=running,
                heartbeat_age_s=round(max(0.0, age), 3),
                hands=counts.get(name, 0) if age < self.core.lease else 0,
            )
            for name, running, age in await self.nodes.nodes()
        ]

    def heard_claim(self, hand: str, claim: int, node: str) -> None:
        if self.mind.router is not None:
            self.mind.router.forget(hand)  # where to relay its runs: asked again
        if node != self.name:
            self.perform(self.core.newer_claim(hand, claim))
            self.hand_over(hand, claim)  # whether or not this node still held it (a lease lost)
            if self.mind.router is not None:  # runs of it relayed from here to a third node
                self.mind.router.hand_moved(hand)

    def fenced(self, hand: str, claim: int) -> None:
        log.warning("node_write_fenced", hand=hand, claim=claim)
        actions = self.core.write_missed(hand, claim)
        self.perform(actions)
        if actions:  # this node's own claim was the newest it knew: another node's is newer
            self.hand_over(hand, claim + 1)

    def hand_over(self, hand: str, claim: int) -> None:
        """Another node claimed `hand` at `claim`: the runs of it held here on an older claim are
        that node's now (the Hand presents them there, that node adopts them and records their
        endings), so they are forgotten here at once, no ending written (`RunRegistry.on_hand_moved`).
        Each client attached to one of them through this node is closed as when the lease is lost:
        it goes round its URLs and re-attaches where the run is now (DESIGN §15, §16): on the new
        holder, or here again, where an attach to a run not held is asked of the live nodes
        (`Router.find`). Its resume points say what it has, so no byte is lost or doubled. A
        node's link is not closed (it carries other runs): the relaying node hears the claim too."""
        m = self.mind
        moved, acts = m.registry.on_hand_moved(hand, claim)
        if not moved:
            return
        m.perform(acts)
        for conn in {run.client for run in moved if run.client is not None}:
            peer = m.clients.get(conn)
            if peer is None or peer.ident.label == NODE_LABEL:
                continue
            peer.outbox.close()
            m.spawn(close_quietly(peer.ws, CLOSE_TRY_LATER, "the Hand of your run moved to another Mind node"))

    async def listen(self) -> None:
        await self.nodes.listen(self.heard_claim, self._credentials_changed)

    async def poll(self) -> None:
        """While the LISTEN connection is down: the holders of the Hands held here, every 0.5 s."""
        while True:
            await asyncio.sleep(POLL_S)
            if self.nodes.listening or not self.core.claims:
                continue
            try:
                holders = await self.nodes.holders()
            except StoreUnavailable:
                continue
            for hand, claim in list(self.core.claims.items()):
                node, current, _ = holders.get(hand, (self.name, claim, 0.0))
                if node != self.name or current != claim:
                    self.perform(self.core.newer_claim(hand, max(current, claim + 1)))
                if node != self.name:
                    self.hand_over(hand, max(current, claim + 1))

    # --- acts ---

    def perform(self, actions: list[NodeAction]) -> None:
        m = self.mind
        for a in actions:
            if isinstance(a, CloseHand):
                peer = m.hands.get(a.hand)
                log.warning("node_hand_closed", hand=a.hand, claim=a.claim, why=a.why)
                if peer is not None and peer.gen == a.claim:
                    peer.outbox.put(Error(code=ErrorCode.BUSY, message=f"this Mind node no longer holds you: {a.why}"))
                    peer.outbox.close()
                    m.spawn(close_quietly(peer.ws, CLOSE_TRY_LATER, "not held here"))
            elif isinstance(a, LeaseLost):
                # The clients go round to another node too: the runs they wait on move with their Hands.
                log.error("node_lease_lost", node=self.name, since_renewal_s=round(a.since_renewal, 3))
                for peer in list(m.clients.values()):
                    peer.outbox.close()
                    m.spawn(close_quietly(peer.ws, CLOSE_TRY_LATER, "this Mind node lost its lease"))
            elif isinstance(a, LeaseRegained):
                log.info("node_lease_live", node=self.name)
