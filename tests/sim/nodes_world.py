"""The `nodes` variant: two Mind nodes sharing one database, a lease clock per node (DESIGN §16).

Why a world of its own: the other variants drive one Mind's registry, admission and snapshots; what
§16 adds is ownership among nodes, and its races live between the nodes, the database and the Hands'
moves, not inside one Mind. So this world keeps those three and drives the real
`mind.core.nodes.NodeCore` (one per node, never a copy) the way `mind.daemon.nodes.NodeShell` does:

- **the database** (`SimDb`) holds the rows the core's safety rests on: `hands(label, node, claim)`,
  `nodes(heartbeat_at)`, `runs` (a start, written conditional on the claim) and `endings` (first
  terminal wins). It has its own clock (the virtual one): the claim statement is refused unless the
  node's heartbeat is younger than the lease there, as `_CLAIM` in `mind/store/postgres/nodes.py` is;
- **each node's link to the database** carries every statement there and its answer back, with a
  latency; the fault layer cuts it (a statement on its way is lost, or executed with its answer
  lost) or delays it; every statement is bounded (half the lease, as the shell's are);
- **each node** has a monotonic clock of its own (its origin drawn from the seed; its core sees
  only that clock, the database only its own), renews every third of the lease, ticks its core (and always before it acts on
  anything, as the shell does after a pause), claims a Hand at its welcome, hears other claims
  (NOTIFY over its database link, and a poll), and performs what the core says (`CloseHand`);
  a claim by the other node hands over the runs started here on an older claim (`hand_over`):
  their clients' connections are closed and they go round, as after a node's death;
- **each Hand** holds both node addresses (random start, the other one next), keeps its runs
  across a drop for the resume window and re-presents them (results included) on its next
  connection, wherever that is;
- **clients** talk to any node: where an `exec` is served is decided by the real routing core
  (`mind.core.routing`), as `Dispatch` asks it: here when the Hand is held here, else looked up
  (the Hand's holder read from the database) and relayed over a node link to the node holding it,
  at most one hop (a relayed request is never relayed again). The holder answers through the
  relaying node; a client whose node died, or whose relay's far end lost the Hand (a claim heard
  by the relaying node, or the holder handing it over), goes round and asks a live node for its
  run's ending.

Faults: kill a node (restarted later, empty), freeze it (SIGSTOP: nothing runs for longer than the
lease, then it wakes and runs what piled up, core tick first), cut or delay node<->database, cut
Hand<->node. The invariants are in `sim.nodes_checker`, checked after every step.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from sim.checker import InvariantViolation
from sim.clients import pick
from sim.nodes_checker import NodesChecker
from sim.runtime import Clock

from mind.core.nodes import CloseHand, LeaseLost, NodeCore, renew_every
from mind.core.routing import Facts, Kind, Route, after_lookup, decide
from mind.testing.vocabulary import Fault

LEASE = 10.0
STATEMENT_S = LEASE / 2
"""Each statement is bounded by half the lease (`NodeShell.renew`)."""
KEEPALIVE_S = 6.0
"""A Hand declares a silent connection dead after this (and moves)."""
WELCOME_S = 4.0
"""A Hand gives up on a welcome (its handshake) after this and dials the other node."""
WINDOW_S = 20.0
"""The resume window: a Hand keeps its runs this long without any connection, then kills them."""
POLL_S = 1.0
NODE_LINK_S = (0.0, 0.001, 0.01, 0.1)
"""One way over a node-to-node link (ordered per direction, like every WebSocket)."""
DB_AWAY = "this Mind cannot reach its database right now; nothing was started"
NODES = ("n1", "n2")
HANDS = ("h1", "h2", "h3")


# --- the database --------------------------------------------------------------------------------


@dataclass
class SimDb:
    """The shared database's rows, on its own clock (the statements of `mind/store/postgres/`)."""

    world: NodesWorld
    hands: dict[str, tuple[str, int]] = field(default_factory=dict)
    generation: Counter[str] = field(default_factory=Counter)
    heartbeat_at: dict[str, float] = field(default_factory=dict)
    runs: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    """run id -> (hand, node, claim) of its start."""
    endings: dict[str, str] = field(default_factory=dict)

    offset: float = 0.0
    """The database's clock (`clock_timestamp()`) is its own: set from the seed at boot."""

    def now(self) -> float:
        return self.world.clock.now + self.offset

    def live(self, node: str) -> bool:
        hb = self.heartbeat_at.get(node)
        return hb is not None and self.now() - hb < LEASE

    def current(self, hand: str) -> tuple[str, int] | None:
        return self.hands.get(hand)

    def heartbeat(self, node: str) -> bool:
        self.heartbeat_at[node] = self.now()
        return True

    def claim(self, hand: str, node: str) -> int | None:
        """`_CLAIM` (the shell's welcome: `_WELCOME`, the same claim with the secret re-read and the
        Hand's endings read in its statement; the links here are authenticated by construction and
        the endings are first-terminal-wins rows of this model): refused (None) unless this node is
        live on the database's clock."""
        if not self.live(node):
            return None
        self.generation[hand] += 1
        claim = self.generation[hand]
        self.hands[hand] = (node, claim)
        self.world.checker.on_claim(hand, node, claim)
        for n in self.world.nodes.values():
            self.world.notify(n, hand, claim, node)
        return claim

    fences: ClassVar[bool] = True
    """Writes are conditional on the claim (tests turn it off to show the checker trips)."""

    def _fenced(self, hand: str, node: str, claim: int) -> bool:
        return self.fences and self.hands.get(hand) != (node, claim)

    def start(self, run: str, hand: str, node: str, claim: int) -> str:
        if self._fenced(hand, node, claim):
            return "fenced"
        self.runs[run] = (hand, node, claim)
        self.world.checker.on_write(hand, node, claim, f"start {run}")
        return "landed"

    def end(self, run: str, hand: str, node: str, claim: int, state: str) -> str:
        """An ending, conditional on the claim; the first terminal wins (`dup` returns it)."""
        if self._fenced(hand, node, claim):
            return "fenced"
        if run in self.endings:
            return "dup"
        self.endings[run] = state
        self.world.checker.on_write(hand, node, claim, f"end {run} {state}")
        self.world.checker.on_ending(run, state)
        return "landed"

    def ending(self, run: str) -> tuple[bool, str | None]:
        """(its start landed, its ending)."""
        return run in self.runs, self.endings.get(run)

    def unended(self, hand: str, below: int) -> list[str]:
        return sorted(r for r, (h, _, c) in self.runs.items() if h == hand and c < below and r not in self.endings)

    def claim_of(self, hand: str) -> int:
        return self.hands.get(hand, ("", 0))[1]

    def live_holder(self, hand: str) -> tuple[str, int] | None:
        """`PgNodes.route`: the node holding the Hand's current claim, if that node is live."""
        node, claim = self.hands.get(hand, ("", 0))
        return (node, claim) if node and self.live(node) else None

    def holder(self, hand: str) -> tuple[str, int]:
        """(node, claim) of the Hand's current claim (`PgNodes.holders`, what the poll reads)."""
        return self.hands.get(hand, ("", 0))


# --- links ---------------------------------------------------------------------------------------


@dataclass
class HandLink:
    """One connection between a Hand and a node: ordered, lossy only when closed."""

    hand: str
    node: str
    serial: int
    claim: int = 0
    open: bool = True
    welcomed: bool = False
    blackholed: bool = False
    last_heard: float = 0.0
    ready_at: dict[str, float] = field(default_factory=lambda: {"up": 0.0, "down": 0.0})


@dataclass
class DbLink:
    up: bool = True
    epoch: int = 0
    delay: float = 0.0


# --- a node --------------------------------------------------------------------------------------


@dataclass
class Waiter:
    client: str
    req: str
    run: str
    attached: bool = False
    hand: str = ""
    claim: int = 0
    """A run started here: its Hand and the claim it was started on (an attach waits for a run
    this node does not hold: the real node asks the node that does, `Router.find`)."""
    via: tuple[str, int] | None = None
    """Relayed here by another node (its name and life): answered through it."""


@dataclass
class Relay:
    """A request this node relayed to the node holding its Hand (`Forward` in `mind.daemon.route`)."""

    req: str
    hand: str
    holder: str
    holder_life: int


class SimNode:
    """One Mind node's shell around the real `NodeCore`: what `mind.daemon.nodes.NodeShell` and the
    host do with its actions."""

    def __init__(self, world: NodesWorld, name: str, life: int) -> None:
        self.w = world
        self.name = name
        self.life = life
        self.core = world.core_cls(lease=LEASE)
        self.offset = round(world.rng.uniform(0.0, 10_000.0), 3)
        """This process's monotonic clock starts anywhere: the core sees only this clock (its
        lease clock), the database only its own."""
        self.conns: dict[str, HandLink] = {}
        self.waiters: list[Waiter] = []
        self.relays: dict[str, Relay] = {}
        """Requests relayed from here, by request id, until answered or gone round."""
        self.uncertain: list[tuple[str, HandLink]] = []
        """Starts whose statement failed: (run, the connection it was for)."""
        self.frozen_until = 0.0
        self.backlog: list[Callable[[], None]] = []
        self.alive = True
        self.every(renew_every(LEASE), self.renew, "renew")
        self.every(0.5, lambda: None, "tick")
        self.every(POLL_S, self.poll, "poll")
        self.renew()

    # --- the process: dead, frozen or running ---

    def run(self, fn: Callable[[], None]) -> None:
        """Run `fn` in this process: nothing if it died, later if it is frozen; the core's tick
        first (the shell ticks before it acts on anything after a pause)."""
        if not self.alive:
            return
        if self.w.clock.now < self.frozen_until:
            self.backlog.append(fn)
            return
        self.tick()
        fn()

    def later(self, dt: float, fn: Callable[[], None], label: str) -> None:
        self.w.clock.at(self.w.clock.now + dt, lambda: self.run(fn), label=f"{self.name} {label}")

    def every(self, dt: float, fn: Callable[[], None], label: str) -> None:
        def again() -> None:
            if self.alive:
                self.run(fn)
                self.w.clock.at(self.w.clock.now + dt, again, label=f"{self.name} {label}")

        self.w.clock.at(self.w.clock.now + dt, again, label=f"{self.name} {label}")

    def freeze(self, seconds: float) -> None:
        self.frozen_until = self.w.clock.now + seconds
        self.w.clock.at(self.frozen_until, self.wake, label=f"{self.name} wake")

    def wake(self) -> None:
        if not self.alive or self.w.clock.now < self.frozen_until:
            return
        backlog, self.backlog = self.backlog, []
        for fn in backlog:
            self.run(fn)

    def now(self) -> float:
        """`time.monotonic()` in this node."""
        return self.w.clock.now + self.offset

    def running(self) -> bool:
        return self.alive and self.w.clock.now >= self.frozen_until

    # --- the core's actions ---

    def tick(self) -> None:
        self.perform(self.core.tick(self.now()))

    def perform(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, CloseHand):
                link = self.conns.get(a.hand)
                if link is not None and link.claim == a.claim:
                    del self.conns[a.hand]
                    self.w.close_link(link, a.why)
                self.w.events[f"node:close {a.why.split(' (')[0]}"] += 1
            elif isinstance(a, LeaseLost):
                self.w.events["node:lease_lost"] += 1
                for link in list(self.conns.values()):  # not yet claimed: a welcome on its way
                    self.w.close_link(link, "this node's lease passed")
                self.conns.clear()
            else:
                self.w.events["node:lease_regained"] += 1

    # --- the database ---

    def db(self, what: str, stmt: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """One statement over this node's database link; `done(None)` if it failed (bounded)."""
        self.w.statement(self, what, stmt, done)

    def renew(self) -> None:
        sent = self.now()

        def done(ok: Any) -> None:
            if ok:
                self.perform(self.core.renewed(sent, self.now()))

        self.db("heartbeat", lambda: self.w.db.heartbeat(self.name), done)

    def poll(self) -> None:
        """The claims of the Hands held here (LISTEN may have missed one), and the endings of the
        runs clients wait for here."""
        db = self.w.db
        for hand in sorted(self.core.claims):
            self.db("claim of", partial(db.holder, hand), partial(self.polled_claim, hand))
        for run, link in list(self.uncertain):
            self.db("ending", partial(db.ending, run), partial(self.settle, run, link))
        for wt in list(self.waiters):
            self.db("ending", partial(db.ending, wt.run), partial(self.answer_ending, wt))

    def polled_claim(self, hand: str, found: tuple[str, int] | None) -> None:
        if found is None:
            return
        node, claim = found
        self.perform(self.core.newer_claim(hand, claim))
        if node != self.name:
            self.hand_over(hand, claim)

    def settle(self, run: str, link: HandLink, found: Any) -> None:
        """A start whose statement failed (its client was told it was refused): if it landed
        after all, it ends `lost` (its Start was never sent), here while this node holds the Hand,
        else at the next holder's reconciliation."""
        if found is None or (run, link) not in self.uncertain:
            return
        self.uncertain.remove((run, link))
        started, ending = found
        if started and ending is None and self.conns.get(link.hand) is link:
            self.w.events["node:refused_start_landed"] += 1
            self.record_ending(link, run, "lost")

    def link_ended(self, link: HandLink) -> None:
        if self.conns.get(link.hand) is link:
            del self.conns[link.hand]
            self.core.released(link.hand, link.claim)

    def heard_claim(self, hand: str, claim: int, node: str) -> None:
        if node != self.name:
            self.perform(self.core.newer_claim(hand, claim))
            self.hand_over(hand, claim)
        # `Router.hand_moved` / `hand_here`: a run relayed to a node that no longer holds its Hand
        # is presented elsewhere; its client goes round and re-attaches where it is now
        for rl in [rl for rl in self.relays.values() if rl.hand == hand and rl.holder != node]:
            self.go_round(rl.req)

    def hand_over(self, hand: str, claim: int) -> None:
        """Another node claimed `hand` at `claim` (`NodeShell.hand_over`): the runs started here on
        an older claim are that node's now; their clients' connections are closed and they go
        round (re-attach at a live node, as after a node's death), without waiting here for an
        ending, and this node decides none."""
        for wt in [wt for wt in self.waiters if wt.hand == hand and wt.claim < claim]:
            self.waiters.remove(wt)
            self.w.events["node:handed_over"] += 1
            if wt.via is None:
                self.w.client_closed(wt.req, self.name, self.life)
            else:  # its client is on the relaying node: told over the link (the link's run is lost)
                self.w.over_link(self, wt.via, lambda n, req=wt.req: n.go_round(req))

    def fenced(self, hand: str, claim: int) -> None:
        actions = self.core.write_missed(hand, claim)
        self.perform(actions)
        if actions:
            self.hand_over(hand, claim + 1)

    # --- Hands ---

    def hello(self, link: HandLink) -> None:
        """A Hand's handshake: refused without a live lease, else claimed in one statement."""
        if self.core.refusal(self.now()) is not None:
            self.w.events["node:refused_hello"] += 1
            self.w.close_link(link, "refused: its lease is not live")
            return
        old = self.conns.get(link.hand)
        if old is not None:
            self.w.close_link(old, "replaced by a newer connection")
        self.conns[link.hand] = link

        def claimed(claim: Any) -> None:
            if self.conns.get(link.hand) is not link or not link.open:
                return
            if claim is None:
                del self.conns[link.hand]
                self.w.close_link(link, "claim refused or database away")
                return
            link.claim = claim
            actions = self.core.claimed(link.hand, claim, self.now())
            self.perform(actions)
            if link.open and self.core.acts_for(link.hand, self.now()) == claim:
                link.welcomed = True
                self.send(link, ("welcome", claim))

        self.db("claim", lambda: self.w.db.claim(link.hand, self.name), claimed)

    def send(self, link: HandLink, msg: tuple[Any, ...]) -> None:
        """Send to a Hand: only on the connection of a claim the core says this node acts by."""
        claim = self.core.acts_for(link.hand, self.now())
        if claim is None or claim != link.claim or self.conns.get(link.hand) is not link:
            self.w.events["node:send_withheld"] += 1
            return
        self.w.to_hand(link, msg, claim)

    def from_hand(self, link: HandLink, msg: tuple[Any, ...]) -> None:
        if self.conns.get(link.hand) is not link or self.core.acts_for(link.hand, self.now()) != link.claim:
            return
        kind = msg[0]
        if kind in ("result", "present_result"):
            _, run, state = msg
            self.record_ending(link, run, state)
        elif kind == "present":
            self.reconcile(link, set(msg[1]))

    def reconcile(self, link: HandLink, presented: set[str]) -> None:
        """The Hand presented its runs on this claim: a run started on an older claim that is not
        among them and has no ending never reached it (its Start was on a connection now closed),
        and never will: it ends `lost`, written like any ending (conditional on this claim)."""
        hand, claim = link.hand, link.claim

        def found(runs: Any) -> None:
            if runs is None:  # the database away: again while this connection is ours
                if self.conns.get(hand) is link:
                    self.later(POLL_S, lambda: self.reconcile(link, presented), "reconcile")
                return
            for run in runs:
                if run not in presented:
                    self.w.events["node:reconciled_lost"] += 1
                    self.record_ending(link, run, "lost")

        self.db("unended", lambda: self.w.db.unended(hand, claim), found)

    def record_ending(self, link: HandLink, run: str, state: str) -> None:
        hand, claim = link.hand, link.claim

        def done(r: Any) -> None:
            if r is None:  # the database away: the Hand re-sends it on its next connection
                self.w.close_link(link, "the ending could not be written")
                return
            if r == "fenced":
                self.fenced(hand, claim)
                return
            self.send(link, ("ack", run))
            self.w.events[f"node:ending_{r}"] += 1
            self.w.checker.on_recorded(run, r)
            self.answer_all(run)

        self.db("ending", lambda: self.w.db.end(run, hand, self.name, claim, state), done)

    # --- clients ---

    def exec(self, client: str, req: str, hand: str, run: str, via: tuple[str, int] | None = None) -> None:
        """`Dispatch._exec`: the routing core decides (here, or looked up and relayed); `via`: the
        node that relayed it here (answers go back through it)."""
        refusal = self.core.refusal(self.now())
        if refusal is not None:
            self.reply(client, req, via, "refused: lease")
            return
        here = self.held(hand)
        route = decide(Facts(Kind.EXEC, clustered=True, relayed=via is not None, here=here is not None))
        if route is Route.HERE:
            assert here is not None
            self.start(client, req, hand, run, via, *here)
            return

        def looked_up(found: Any) -> None:  # `_admit_offline`: the holder from the database
            holder = found is not None and found[0] not in ("", self.name) and self.w.db.live(found[0])
            r = self.w.requests[req]
            client_here = via is not None or (r.node == self.name and r.node_life == self.life)
            if after_lookup(holder, client_here, self.held(hand) is not None, relayed=via is not None) is Route.RELAY:
                self.relay(client, req, hand, run, found[0])
                return
            now_here = self.held(hand)
            if now_here is None:
                self.reply(client, req, via, "refused: offline")
            else:
                self.start(client, req, hand, run, via, *now_here)

        self.db("holder", partial(self.w.db.live_holder, hand), looked_up)

    def held(self, hand: str) -> tuple[int, HandLink] | None:
        """The claim and connection this node acts for `hand` by, or None."""
        claim = self.core.acts_for(hand, self.now())
        link = self.conns.get(hand)
        if claim is None or link is None or link.claim != claim:
            return None
        return claim, link

    def start(
        self, client: str, req: str, hand: str, run: str, via: tuple[str, int] | None, claim: int, link: HandLink
    ) -> None:
        def started(r: Any) -> None:
            if r is None:  # it may have landed with its answer lost: settled by the poll
                self.uncertain.append((run, link))
                self.reply(client, req, via, "refused: database away")
                return
            if r == "fenced":
                self.fenced(hand, claim)
                self.reply(client, req, via, "refused: moved")
                return
            self.w.checker.on_started(run, hand)
            self.waiters.append(Waiter(client, req, run, hand=hand, claim=claim, via=via))
            self.send(link, ("start", run))

        self.db("start", lambda: self.w.db.start(run, hand, self.name, claim), started)

    def relay(self, client: str, req: str, hand: str, run: str, holder: str) -> None:
        """`Link.relay`: the request over the link to the node holding the Hand, for this client."""
        node = self.w.nodes[holder]
        self.relays[req] = Relay(req, hand, holder, node.life)
        self.w.events["node:relayed"] += 1
        me = (self.name, self.life)

        def unreachable() -> None:  # the far node is down: the client is told `busy`, as `Link.offer` does
            if self.relays.pop(req, None) is not None:
                r = self.w.requests[req]
                if r.node == self.name and r.node_life == self.life:
                    self.w.answer(client, req, "refused: busy")

        self.w.over_link(self, (holder, node.life), lambda n: n.exec(client, req, hand, run, via=me), unreachable)

    def reply(self, client: str, req: str, via: tuple[str, int] | None, what: str) -> None:
        """An answer to the client: at once, or back over the link it was relayed on."""
        if via is None:
            self.w.answer(client, req, what)
            return
        self.w.over_link(self, via, lambda n: n.relayed_answer(client, req, what))

    def relayed_answer(self, client: str, req: str, what: str) -> None:
        """The holder's answer to a request relayed from here: to the client, if it is still on this
        connection (gone round, it asks elsewhere and this answer is nobody's)."""
        if self.relays.pop(req, None) is None:
            return
        r = self.w.requests[req]
        if r.node == self.name and r.node_life == self.life:
            self.w.answer(client, req, what)

    def go_round(self, req: str) -> None:
        """`Link._lost` with a resume window: the client's connection is closed; it re-attaches."""
        if self.relays.pop(req, None) is not None:
            self.w.events["node:relay_lost"] += 1
            self.w.client_closed(req, self.name, self.life)

    def link_to_dead(self, holder: str, life: int) -> None:
        """The link to a node that died closed: every request relayed there goes round."""
        for rl in [rl for rl in self.relays.values() if (rl.holder, rl.holder_life) == (holder, life)]:
            self.go_round(rl.req)

    def attach(self, client: str, req: str, run: str) -> None:
        """A client whose node died asks here for its run's ending (read from the database). Its
        start either landed before that node died or never will (a dead node's statement that the
        server did not have is gone), so "not started" is final."""
        self.waiters.append(Waiter(client, req, run, attached=True))

    def answer_ending(self, wt: Waiter, found: Any) -> None:
        if found is None or wt not in self.waiters:
            return
        started, ending = found
        if ending is not None:
            self.waiters.remove(wt)
            self.reply(wt.client, wt.req, wt.via, f"ended {ending}")
        elif wt.attached and not started:
            self.waiters.remove(wt)
            self.reply(wt.client, wt.req, wt.via, "refused: not started (its node died)")

    def answer_all(self, run: str) -> None:
        for wt in [wt for wt in self.waiters if wt.run == run]:
            self.answer_ending(wt, self.w.db.ending(run))


# --- a Hand --------------------------------------------------------------------------------------


@dataclass
class HandRun:
    run: str
    result: str | None = None


class SimHand:
    """A Hand with both node addresses: one connection at a time, its runs kept across a drop for
    the resume window and re-presented on the next connection (to whichever node)."""

    window = WINDOW_S
    durations = (0.2, 1.0, 4.0, 12.0, 30.0)

    def __init__(self, world: NodesWorld, label: str) -> None:
        self.w = world
        self.label = label
        self.link: HandLink | None = None
        self.runs: dict[str, HandRun] = {}
        self.away_since: float | None = 0.0
        self.next = world.rng.randrange(len(NODES))
        self.dialing = False
        self.dial()

    def dial(self) -> None:
        if self.link is not None and self.link.open:
            return
        node = NODES[self.next % len(NODES)]
        self.next += 1
        self.link = self.w.connect(self, node)
        link = self.link
        self.w.clock.at(
            self.w.clock.now + WELCOME_S, lambda: self.welcome_overdue(link), label=f"{self.label} welcome?"
        )

    def welcome_overdue(self, link: HandLink) -> None:
        if link is self.link and link.open and not link.welcomed:
            self.w.close_link(link, "no welcome in time")

    def closed(self, link: HandLink) -> None:
        """This connection ended (noticed): keep the runs, start the window, dial the other node."""
        if link is not self.link:
            return
        self.link = None
        if self.away_since is None:
            self.away_since = self.w.clock.now
            since = self.away_since
            self.w.clock.at(since + self.window, lambda: self.window_passed(since), label=f"{self.label} window")
        self.w.clock.at(self.w.clock.now + self.w.rng.uniform(0.05, 1.0), self.dial, label=f"{self.label} dial")

    def window_passed(self, since: float) -> None:
        if self.away_since != since:
            return
        for r in self.runs.values():
            if r.result is None:
                r.result = "killed_after_window"
                self.w.checker.on_hand_concluded(self.label, r.run, r.result, self.w.clock.now - since)

    def on_message(self, link: HandLink, msg: tuple[Any, ...]) -> None:
        if link is not self.link:
            return
        link.last_heard = self.w.clock.now
        kind = msg[0]
        if kind == "welcome":
            self.away_since = None
            self.w.to_node(link, ("present", tuple(sorted(self.runs))))
            for r in sorted(self.runs.values(), key=lambda r: r.run):  # re-present
                if r.result is not None:
                    self.w.to_node(link, ("present_result", r.run, r.result))
        elif kind == "start":
            run = msg[1]
            if run in self.runs or self.w.checker.hand_ran(run):
                return
            self.runs[run] = HandRun(run)
            self.w.checker.on_hand_started(self.label, run)
            took = self.w.rng.choice(self.durations)
            self.w.clock.at(self.w.clock.now + took, lambda: self.finished(run), label=f"{self.label} exit {run}")
        elif kind == "ack":
            self.runs.pop(msg[1], None)

    def finished(self, run: str) -> None:
        r = self.runs.get(run)
        if r is None or r.result is not None:
            return
        r.result = self.w.rng.choice(("exit 0", "exit 1", "exit 137"))
        self.w.checker.on_hand_concluded(self.label, run, r.result, 0.0)
        if self.link is not None and self.link.open and self.link.welcomed:
            self.w.to_node(self.link, ("result", run, r.result))


# --- the world -----------------------------------------------------------------------------------


@dataclass
class Request:
    client: str
    req: str
    node: str
    node_life: int
    run: str
    answers: list[str] = field(default_factory=list)


class NodesWorld:
    core_cls: type[NodeCore] = NodeCore
    """The real core; tests swap in a broken one to show the checker trips."""
    db_cls: type[SimDb] = SimDb
    hand_cls: type[SimHand] = SimHand

    def __init__(
        self, seed: int, steps: int = 300, rules: Any = None, trace: Callable[[str], None] | None = None
    ) -> None:
        self.seed = seed
        self.steps = steps
        self.variant = getattr(rules, "variant", "nodes") or "nodes"
        self.trace = trace
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.step_no = 0
        self.events: Counter[str] = Counter()
        self.notes: list[str] = []
        self.checker = NodesChecker(self)
        self.db = self.db_cls(self)
        self.db.offset = round(self.rng.uniform(100_000.0, 1_000_000.0), 3)
        self.db_links = {n: DbLink() for n in NODES}
        self.lives = Counter[str]()
        self.nodes: dict[str, SimNode] = {}
        self.down: set[str] = set()
        self.serial = 0
        self.links: list[HandLink] = []
        self.node_links: dict[tuple[str, str], float] = {}
        """(from, to) -> when the last message on that node link arrives (keeps them in order)."""
        self.requests: dict[str, Request] = {}
        self._ids = 0
        self._shown: dict[str, str] = {}
        for n in NODES:
            self.start_node(n)
        self.hands = {h: self.hand_cls(self, h) for h in HANDS}

    def replay_command(self) -> str:
        return f"scripts/sim --seed {self.seed} --steps {self.steps} --variant {self.variant} --trace"

    def note(self, what: str) -> None:
        if self.trace is not None:
            self.notes.append(what)

    # --- processes ---

    def start_node(self, name: str) -> None:
        self.lives[name] += 1
        self.down.discard(name)
        self.nodes[name] = SimNode(self, name, self.lives[name])
        self.events["node:start"] += 1

    def kill_node(self, name: str) -> None:
        node = self.nodes[name]
        node.alive = False
        self.down.add(name)
        for link in [lk for lk in self.links if lk.node == name and lk.open]:
            self.close_link(link, "node killed")
        for r in self.requests.values():  # the client's connection to it closed: it asks elsewhere
            if r.node == name and r.node_life == node.life and not r.answers:
                r.node = ""
                self.clock.at(self.clock.now + self.rng.uniform(0.1, 2.0), partial(self.reattach, r), label="reattach")
        for other in self.nodes.values():  # their links to it closed (noticed a moment later)
            if other is not node:
                self.clock.at(
                    self.clock.now + self.rng.uniform(0.0, 0.2),
                    partial(other.run, partial(other.link_to_dead, name, node.life)),
                    label="node link closed",
                )
        self.clock.at(self.clock.now + self.rng.choice((2.0, 15.0, 40.0)), lambda: self.restart(name), label="restart")

    def client_closed(self, req: str, node: str, life: int) -> None:
        """Node `node` closed the connection of the client waiting on `req`: it goes round (§15).
        A connection it no longer has (it went round already) is not closed twice."""
        r = self.requests[req]
        if (r.node, r.node_life) != (node, life):
            return
        r.node = ""  # on no node until it lands on one (a node killed meanwhile is not its node)
        if not r.answers:
            self.clock.at(self.clock.now + self.rng.uniform(0.1, 2.0), partial(self.reattach, r), label="reattach")

    def restart(self, name: str) -> None:
        if name in self.down:
            self.start_node(name)

    def reattach(self, r: Request) -> None:
        if r.answers:
            return
        live = [n for n in NODES if n not in self.down]
        if not live:
            self.clock.at(self.clock.now + 1.0, lambda: self.reattach(r), label="reattach")
            return
        name = self.rng.choice(live)
        node = self.nodes[name]
        r.node, r.node_life = name, node.life
        self.events["client:reattach"] += 1
        node.run(lambda: node.attach(r.client, r.req, r.run))

    # --- the database link ---

    def statement(self, node: SimNode, what: str, stmt: Callable[[], Any], done: Callable[[Any], None]) -> None:
        link = self.db_links[node.name]
        epoch, sent = link.epoch, self.clock.now
        state = {"done": False}

        def finish(value: Any) -> None:
            if not state["done"]:
                state["done"] = True
                node.run(lambda: done(value))

        def answer(value: Any) -> None:
            if link.up and link.epoch == epoch:
                finish(value)

        def execute() -> None:
            # a statement the server never received dies with its process (kill -9), and one the
            # client gave up on is cancelled (asyncpg closes the connection; `statement_timeout`):
            # it committed before the timeout or never, so a read sent after it sees it for good
            if state["done"] or not (link.up and link.epoch == epoch) or not node.alive:
                return
            value = stmt()
            back = self.rng.choice((0.0, 0.001, 0.01)) + link.delay
            self.clock.at(self.clock.now + back, lambda: answer(value), label=f"{node.name} {what} answer")

        out = self.rng.choice((0.0, 0.001, 0.01, 0.2, 1.0)) + link.delay
        if self.rng.random() < 0.05:  # a statement that stalls (a lock wait, an fsync) but commits
            out += self.rng.uniform(1.0, STATEMENT_S)
        self.clock.at(sent + out, execute, label=f"{node.name} {what} exec")
        self.clock.at(sent + STATEMENT_S, lambda: finish(None), label=f"{node.name} {what} timeout")

    def notify(self, node: SimNode, hand: str, claim: int, claimer: str) -> None:
        link = self.db_links[node.name]
        if not link.up:
            return
        epoch = link.epoch

        def heard() -> None:  # lost if the link was cut meanwhile (the node polls)
            if link.up and link.epoch == epoch:
                node.run(partial(node.heard_claim, hand, claim, claimer))

        self.clock.at(
            self.clock.now + self.rng.choice((0.0, 0.01, 0.3)) + link.delay, heard, label=f"{node.name} notify"
        )

    # --- Hand links ---

    def connect(self, hand: SimHand, node_name: str) -> HandLink:
        self.serial += 1
        link = HandLink(hand.label, node_name, self.serial, last_heard=self.clock.now)
        self.links.append(link)
        self.events["hand:dial"] += 1
        node = self.nodes[node_name]
        if node_name in self.down:
            self.clock.at(self.clock.now + 0.01, lambda: self.close_link(link, "connection refused"), label="refused")
        else:
            self.clock.at(self.clock.now + 0.005, lambda: node.run(lambda: node.hello(link)), label="hello")
        return link

    def close_link(self, link: HandLink, why: str) -> None:
        if not link.open:
            return
        link.open = False
        self.note(f"close {link.hand}<->{link.node}#{link.serial} ({why})")
        hand = self.hands.get(link.hand) if hasattr(self, "hands") else None
        if hand is not None:
            self.clock.at(self.clock.now + self.rng.uniform(0.0, 0.2), lambda: hand.closed(link), label="notice")
        # the node notices on its own schedule: a moment later (RST), or, on a blackholed path,
        # when its own keepalive gives up; a frozen one when it wakes
        node = self.nodes[link.node]
        after = KEEPALIVE_S if link.blackholed else self.rng.uniform(0.0, 0.2)
        self.clock.at(self.clock.now + after, lambda: node.run(lambda: node.link_ended(link)), label="notice")

    def _send(self, link: HandLink, way: str, fn: Callable[[], None]) -> None:
        at = max(self.clock.now + self.rng.choice((0.0, 0.001, 0.01, 0.1)), link.ready_at[way])
        link.ready_at[way] = at

        def deliver() -> None:
            if link.open and not link.blackholed:
                fn()
            elif link.open:  # held while blackholed: delivered when it flows, in order
                self.clock.at(self.clock.now + 0.5, deliver, label="held")

        self.clock.at(at, deliver, label=f"{way} {link.hand}")

    def to_hand(self, link: HandLink, msg: tuple[Any, ...], claim: int) -> None:
        if self.db.claim_of(link.hand) != claim:  # the brief's strict "acting": counted, see nodes_checker
            self.checker.notes["note:send_behind_newer_claim" + ("" if link.open else "_on_closed_link")] += 1

        def deliver() -> None:
            self.checker.on_act(link.hand, link.node, claim, f"deliver {msg[0]}")
            self.note(f"{link.node} -> {link.hand}#{link.serial} claim {claim}: {' '.join(map(str, msg))}")
            self.hands[link.hand].on_message(link, msg)

        self._send(link, "down", deliver)

    def to_node(self, link: HandLink, msg: tuple[Any, ...]) -> None:
        node = self.nodes[link.node]

        def deliver() -> None:
            self.note(f"{link.hand}#{link.serial} -> {link.node}: {' '.join(map(str, msg))}")
            node.run(lambda: node.from_hand(link, msg))

        self._send(link, "up", deliver)

    def keepalive(self) -> None:
        """A Hand whose connection has been silent past its keepalive declares it dead (a node
        pings every second while it runs; a frozen, dead or blackholed one does not)."""
        now = self.clock.now
        for link in self.links:
            if not link.open:
                continue
            node = self.nodes[link.node]
            if node.running() and not link.blackholed:
                link.last_heard = now
            elif now - link.last_heard >= KEEPALIVE_S:
                self.close_link(link, "keepalive")
        self.links = [lk for lk in self.links if lk.open]

    def over_link(
        self,
        sender: SimNode,
        to: tuple[str, int],
        fn: Callable[[SimNode], None],
        unreachable: Callable[[], None] | None = None,
    ) -> None:
        """A message over the node-to-node link from `sender` to the node `to` (name, life): lost
        if either end died meanwhile (the link closed with it), ordered per direction. A link that
        cannot be opened (the far node is down: its lease may still look live in the database)
        calls `unreachable` on the sender (`Link.offer` answers the client `busy`)."""
        key = (sender.name, to[0])
        at = max(self.clock.now + self.rng.choice(NODE_LINK_S), self.node_links.get(key, 0.0))
        self.node_links[key] = at
        life = sender.life

        def deliver() -> None:
            node = self.nodes[to[0]]
            if self.nodes[sender.name].life != life or not sender.alive:
                return
            if node.life == to[1] and node.alive:
                node.run(lambda: fn(node))
            elif unreachable is not None:
                sender.run(unreachable)

        self.clock.at(at, deliver, label=f"{sender.name}->{to[0]}")

    # --- clients ---

    def answer(self, client: str, req: str, what: str) -> None:
        r = self.requests[req]
        if client != r.client:
            self.checker.fail("every answer reaches the client that asked", f"{req} of {r.client} answered to {client}")
        r.answers.append(what)
        self.note(f"{client} <- {req}: {what}")
        self.checker.on_answer(r)
        self.events[
            f"answer:{what.split(':')[0].split(' ')[0]}{':' + what.split(': ')[1] if ': ' in what else ''}"
        ] += 1

    def client_exec(self) -> str:
        self._ids += 1
        client = f"c{self.rng.randrange(3)}"
        hand = self.rng.choice(HANDS)
        live = [n for n in NODES if n not in self.down]
        if not live:
            return "client:none"
        name = self.rng.choice(live)
        node = self.nodes[name]
        req, run = f"q{self._ids}", f"r{self._ids}"
        self.requests[req] = Request(client, req, name, node.life, run)
        node.run(lambda: node.exec(client, req, hand, run))
        return f"client:exec {client} {req} {hand}@{name} run {run}"

    # --- faults ---

    def inject(self) -> str:
        kind = pick(
            self.rng,
            (("kill", 10), ("freeze", 10), ("db_cut", 15), ("db_delay", 8), ("hand_cut", 15), ("blackhole", 8)),
        )
        name = self.rng.choice(NODES)
        node = self.nodes[name]
        if kind == "kill":
            if name in self.down:
                return "fault:none"
            self.kill_node(name)
            return f"fault:{Fault.MIND_CRASH} {name}"
        if kind == "freeze":
            if not node.running():
                return "fault:none"
            s = self.rng.choice((LEASE * 1.5, LEASE * 3, 2.0))
            node.freeze(s)
            return f"fault:freeze {name} {s}s"
        if kind in ("db_cut", "db_delay"):
            link = self.db_links[name]
            if kind == "db_delay":
                link.delay = self.rng.choice((0.5, 3.0, 8.0))
                self.clock.at(
                    self.clock.now + self.rng.choice((2.0, 20.0)), lambda: setattr(link, "delay", 0.0), label="heal"
                )
                return f"fault:{Fault.LATENCY} {name}<->db {link.delay}s"
            link.up = False
            link.epoch += 1
            dur = self.rng.choice((1.0, LEASE, LEASE * 3))
            self.clock.at(self.clock.now + dur, lambda: setattr(link, "up", True), label="heal")
            return f"fault:{Fault.PARTITION} {name}<->db {dur}s"
        links = [lk for lk in self.links if lk.open]
        if not links:
            return "fault:none"
        hl = self.rng.choice(links)
        if kind == "hand_cut":
            self.close_link(hl, "cut")
            return f"fault:{Fault.CUT} {hl.hand}<->{hl.node}"
        hl.blackholed = True
        self.clock.at(
            self.clock.now + self.rng.choice((1.0, 10.0)), lambda: setattr(hl, "blackholed", False), label="heal"
        )
        return f"fault:{Fault.BLACKHOLE} {hl.hand}<->{hl.node}"

    def heal(self) -> None:
        for link in self.db_links.values():
            link.up, link.delay = True, 0.0
        for lk in self.links:
            lk.blackholed = False
        for name in list(self.down):
            self.start_node(name)

    # --- the scheduler ---

    def advance_to(self, target: float) -> None:
        while True:
            timer = self.clock.pop_due(target)
            if timer is None:
                break
            timer.fn()
            self.keepalive()
            self.checker.after_event()
        self.clock.now = max(self.clock.now, target)
        self.keepalive()

    def guard(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except InvariantViolation:
            raise
        except Exception as exc:
            raise InvariantViolation(
                "no unhandled exception", f"{type(exc).__name__}: {exc}", self.seed, self.step_no, self.replay_command()
            ) from exc

    def step(self) -> None:
        kind = pick(self.rng, (("advance", 55), ("client", 30), ("fault", 6)))
        if kind == "advance":
            nxt = self.clock.next_at()
            if nxt is not None and self.rng.random() < 0.6:
                target = nxt
            else:
                target = self.clock.now + self.rng.choice((0.01, 0.1, 0.5, 1.0, 3.0, 10.0))
            self.advance_to(target)
            desc = f"advance to {target:.3f}"
            self.events["advance"] += 1
        elif kind == "client":
            desc = self.client_exec()
            self.events[desc.split(" ", 1)[0]] += 1
        else:
            desc = self.inject()
            self.events[desc.split(" ", 1)[0]] += 1
        self.checker.after_event()
        self.emit(desc, str(self.step_no))

    def emit(self, desc: str, label: str) -> None:
        """The `--trace` output: the step, what happened in it, and each node's state when it changed."""
        if self.trace is None:
            return
        self.trace(f"[{label}] t={self.clock.now:.3f} {desc}")
        for what in self.notes:
            self.trace(f"      {what}")
        self.notes.clear()
        for name, node in self.nodes.items():
            state = "down" if name in self.down else ("frozen" if not node.running() else "up")
            held = " ".join(f"{h}:{c}" for h, c in sorted(node.core.claims.items()))
            line = f"{state} life{node.life} lease {'live' if node.core.live(node.now()) else 'passed'} holds [{held}]"
            if self._shown.get(name) != line:
                self._shown[name] = line
                self.trace(f"      {name}: {line}")
        rows = " ".join(f"{h}={n}:{c}" for h, (n, c) in sorted(self.db.hands.items()))
        if self._shown.get("db") != rows:
            self._shown["db"] = rows
            self.trace(f"      db hands: {rows}")

    def busy(self) -> list[str]:
        out = []
        for h in self.hands.values():
            if h.link is None or not h.link.open or not h.link.welcomed:
                out.append(f"{h.label} not connected")
            if h.runs:
                out.append(f"{h.label} runs {sorted(h.runs)}")
        for r in self.requests.values():
            if not r.answers:
                out.append(f"{r.req} unanswered")
        out += [f"{run} not ended" for run in self.db.runs if run not in self.db.endings]
        return out

    def run(self) -> NodesWorld:
        for _ in range(self.steps):
            self.step_no += 1
            self.guard(self.step)
        self.guard(self.quiesce)
        self.guard(self.checker.settled)
        return self

    def quiesce(self) -> None:
        self.heal()
        start = self.clock.now
        while self.busy():
            nxt = self.clock.next_at()
            if nxt is None or nxt > start + 3600:
                self.checker.fail("the system quiesces", f"still busy after healing: {self.busy()}")
                return
            self.advance_to(nxt)
            self.emit(f"advance to {self.clock.now:.3f}", "quiesce")
