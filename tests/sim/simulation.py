"""The deterministic simulation of a Mind, its Hands and their clients (DESIGN §10, issue 4 item 4).

One seed = one world: `random.Random(seed)` picks every event, latency and fault; time is virtual;
nothing sleeps, reads a clock or touches a socket, so `World(seed).run()` replays exactly.

Each step picks one event, biased towards progress:
- deliver the next frame of some link direction (ordered; delayed frames wait, blackholed ones
  are held, and no frame waits longer than `max_latency_s` on a flowing link); to a Hand, often
  with every ready frame behind it in the same read (a burst: starts among them share a batch);
- advance the virtual clock (timers fire in order: command exits, deadlines, I/O completions,
  ask timeouts, keepalives, backoff, restarts);
- a client action (exec, cancel, task start with pooled ids, several task starts to one Hand at
  once, task get/cancel, disconnect);
- a fault: delay, cut, blackhole (keepalive declares it dead after `keepalive_s`), partition (cut,
  and new connections refused for a while), Hand crash + restart, Mind crash + restart, a start
  sent twice in one write (same id; same binding or another: one batch), a Hand's disk failing its
  next commit of starts (the batch is refused, nothing stored).
The Mind's snapshot table is the REAL `mind.store.snapshots.SnapshotStore` (SQLite in memory, one
per world: the disk; `snapshot_table.py`). After every event the always-invariants are checked
(`checker.py`). After the steps comes the quiesce phase: heal everything, restart what is down, run
until nothing is in flight and every job has ended, check the reconciled invariants; then force one
more reconnect of every Hand (a final reconciliation pass) and check them again.
"""

from __future__ import annotations

import random
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sim.checker import Checker, InvariantViolation
from sim.clients import ClientActions, SimClient, pick, record
from sim.faults import Faults
from sim.hand_agent import HandProcess
from sim.hand_store import HandTaskStore
from sim.hand_tasks import HandTasks
from sim.jobs import Machine
from sim.mind_shell import SimMind
from sim.network import Direction, Link
from sim.runtime import Clock, Loop
from sim.snapshot_table import SnapshotTable, store_rules
from sim.tracing import Tracer, describe

from hand.core.tasks import TaskLimits
from mind.core import snapshots as mind_tasks
from mind.core.registry import RunRegistry
from protocol.messages import Message, RunOutput, RunUpdate


@dataclass(frozen=True)
class Config:
    hands: tuple[str, ...] = ("h1", "h2")
    clients: int = 3
    task_ids: int = 8
    inventory_page: int = 3
    """The real page is 1000; a small one makes multi-page inventories (and their races) common."""
    kill_grace: float = 2.0
    keepalive_s: float = 20.0
    """ping_interval + ping_timeout: a blackholed side declares the connection dead after this."""
    max_latency_s: float = 1.0
    task_limits: TaskLimits = field(
        default_factory=lambda: TaskLimits(max_running=2, max_retained=6, retention_s=300.0, log_max=200)
    )
    quiesce_events: int = 20_000
    slow_io: float = 0.05
    """The share of I/O calls (database writes and reads) that stall for up to a second."""


@dataclass(frozen=True)
class Rules:
    """The code under test. Tests swap in broken rules to prove the checker trips."""

    registry_cls: type[RunRegistry] = RunRegistry
    reconcile: Callable[..., Any] = mind_tasks.reconcile
    apply_report: Callable[..., Any] = mind_tasks.apply_report
    """The rules the real snapshot store's scripts call (`SnapshotStore(rules=)`): a test swaps them."""
    hand_tasks_cls: type[HandTasks] = HandTasks
    hand_cls: type[HandProcess] = HandProcess
    mind_cls: type[SimMind] = SimMind
    checked_store: bool = False
    """After every snapshot operation, compare the rows the table kept from the real store's answers
    with a full listing of the store; the checker fails on a difference (slower)."""
    variant: str = ""
    """The `scripts/sim --variant` name that selects these rules (for the replay command)."""
    resume_windows: tuple[float, ...] = ()
    """Continuity (DESIGN §15): each seed picks its Mind's resume window from these (none: 0, the
    rules before continuity, and no draw, so the other variants' seeds replay unchanged)."""
    extension: Callable[[World], Any] | None = None
    """What a variant adds to the world (`sim.stream_clients.Continuity`: clients over links of
    their own, streamed runs, faults of the client leg, the continuity invariants)."""
    world: Callable[..., Any] | None = None
    """A variant with a world of its own (`sim.nodes_world.NodesWorld`: two Mind nodes and their
    database), built as `world(seed, steps, rules=, trace=)` by `scripts/sim`; None: `World`."""


@dataclass
class HandSlot:
    """One Hand machine: what survives its crashes (store, processes) and its current life."""

    label: str
    store: HandTaskStore
    machine: Machine
    proc: HandProcess | None = None
    refused_until: float = 0.0


class World:
    def __init__(
        self,
        seed: int,
        steps: int = 300,
        config: Config | None = None,
        rules: Rules | None = None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.seed = seed
        self.steps = steps
        self.config = config or Config()
        self.rules = rules or Rules()
        self.tracer = Tracer(self, trace) if trace is not None else None
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.step_no = 0
        self.events: Counter[str] = Counter()
        self.checker = Checker(self)
        self._ids = 0
        self.loops: list[Loop] = []
        self.snapshots = SnapshotTable(
            store_rules(self.rules.reconcile, self.rules.apply_report), checked=self.rules.checked_store
        )
        """The real `SnapshotStore` (SQLite in memory) behind a thin adapter: the disk, it outlives
        every Mind."""
        self.gens = {h: 0 for h in self.config.hands}
        self.hand_labels = frozenset(self.config.hands)
        self.links: list[Link] = []
        self.hands = {
            h: HandSlot(
                h,
                HandTaskStore(h, partial(self.checker.on_row_change, h)),
                Machine(h, self.clock, self.checker.on_exec),
            )
            for h in self.config.hands
        }
        self.clients = [SimClient(f"c{i}") for i in range(self.config.clients)]
        self.conn_clients: dict[str, SimClient] = {}
        self.actions = ClientActions(self)
        self.mind: SimMind | None = None
        self.faults = Faults(self)
        self.window = self.rng.choice(self.rules.resume_windows) if self.rules.resume_windows else 0.0
        self.ext: Any = self.rules.extension(self) if self.rules.extension is not None else None
        self._guard(self._boot)

    # --- plumbing -------------------------------------------------------------------------------

    def replay_command(self) -> str:
        variant = f" --variant {self.rules.variant}" if self.rules.variant else ""
        custom = "" if self.config == Config() else "  (with this test's Config)"
        return f"scripts/sim --seed {self.seed} --steps {self.steps}{variant} --trace{custom}"

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids}"

    def new_loop(self, name: str) -> Loop:
        loop = Loop(name, self.clock, self._io_latency)
        self.loops = [lp for lp in self.loops if lp.alive] + [loop]
        return loop

    def _io_latency(self) -> float:
        """Mostly instant (done before any other event); sometimes a few milliseconds; now and then
        a slow disk (an fsync stall of up to a second)."""
        r = self.rng.random()
        slow = self.config.slow_io
        if r < 1 - slow - 0.2:
            return 0.0
        if r < 1 - slow:
            return 0.0005 + (r - (1 - slow - 0.2)) * 0.25
        return 0.05 + (r - (1 - slow)) / slow

    def drain(self) -> None:
        """Run ready work everywhere until every proc waits (compute takes no virtual time)."""
        again = True
        while again:
            again = False
            for lp in self.loops:
                if lp.alive and lp._ready:
                    lp.run_ready()
                    again = True

    def _guard(self, fn: Callable[[], Any]) -> Any:
        """Run `fn`; any exception is a violation (with the replay command), and the trace shows the
        step that broke it up to the moment it did."""
        try:
            return fn()
        except InvariantViolation as violation:
            self._trace_failure(violation)
            raise
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)[-3:]
            where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames)
            cause = exc.__cause__ or exc
            violation = InvariantViolation(
                "no unhandled exception",
                f"{type(cause).__name__}: {cause} (at {where})",
                self.seed,
                self.step_no,
                self.replay_command(),
            )
            self._trace_failure(violation)
            raise violation from exc

    def _trace_failure(self, violation: InvariantViolation) -> None:
        if self.tracer is not None and not getattr(violation, "traced", False):
            violation.traced = True  # type: ignore[attr-defined]
            self.tracer.step(f"... broke '{violation.invariant}': {violation.detail}", str(self.step_no))

    # --- processes ------------------------------------------------------------------------------

    def _boot(self) -> None:
        self.start_mind()
        for slot in self.hands.values():
            self.start_hand(slot)
        for client in self.clients:
            self.actions.act(client)
        if self.ext is not None:
            self.ext.boot()
        self.drain()
        if self.tracer is not None:
            self.tracer.step("boot: the Mind, every Hand and every client start", "0")

    def start_mind(self) -> None:
        if self.mind is None:
            self.mind = self.rules.mind_cls(self)
            self.events["mind_start"] += 1

    def start_hand(self, slot: HandSlot) -> None:
        if slot.proc is None:
            slot.proc = self.rules.hand_cls(self, slot)
            slot.proc.start()
            self.events["hand_start"] += 1

    def dial(self, hand: HandProcess) -> Link | None:
        """A Hand connects and authenticates (atomic here); the Mind issues the next generation."""
        slot = self.hands[hand.label]
        if self.mind is None or slot.refused_until > self.clock.now or slot.proc is not hand:
            self.events["dial_failed"] += 1
            return None
        self.gens[hand.label] += 1
        link = Link(hand.label, self.gens[hand.label], self.clock.now)
        self.links.append(link)
        self.mind.hand_connected(link)
        self.events["reconnect"] += 1
        return link

    # --- the network ----------------------------------------------------------------------------

    def close_link(self, link: Link, why: str, mind_after: float | None, hand_after: float | None) -> None:
        link.close(why)
        now = self.clock.now
        if mind_after is not None:
            self.clock.at(now + mind_after, lambda: self.notice_mind(link), label="notice")
        if hand_after is not None:
            self.clock.at(now + hand_after, lambda: self.notice_hand(link), label="notice")

    def mind_close(self, link: Link, why: str) -> None:
        """The Mind closes an older connection that a newer one replaced."""
        self.close_link(link, why, mind_after=self.rng.uniform(0, 0.05), hand_after=self.rng.uniform(0, 0.05))

    def notice_mind(self, link: Link) -> None:
        if self.ext is not None and self.ext.owns(link):
            self.ext.notice_mind(link)
            return
        if self.mind is not None and link in self.mind.peers:
            self.mind.hand_link_ended(link)

    def notice_hand(self, link: Link) -> None:
        if self.ext is not None and self.ext.owns(link):
            self.ext.notice_client(link)
            return
        proc = self.hands[link.hand].proc
        if proc is not None:
            proc.notice_closed(link)

    def _receiver_ready(self, link: Link, d: Direction) -> bool:
        if self.ext is not None and self.ext.owns(link):
            return bool(self.ext.receiver_ready(link, d))
        if d is link.up:
            return self.mind is not None and link in self.mind.peers
        proc = self.hands[link.hand].proc
        return proc is not None and proc.conn is not None and proc.conn.link is link and proc.conn.receiving

    def all_links(self) -> list[Link]:
        return self.links if self.ext is None else self.links + self.ext.links()

    def _deliverable(self) -> list[tuple[Link, Direction]]:
        now = self.clock.now
        if any(not lk.open for lk in self.links):
            self.links = [lk for lk in self.links if lk.open]
        out = []
        for lk in self.all_links():
            if not lk.flowing:
                continue
            for d in (lk.down, lk.up):
                if d.queue and d.queue[0].ready_at <= now and self._receiver_ready(lk, d):
                    out.append((lk, d))
        return out

    def _forced(self) -> tuple[float, Link, Direction] | None:
        """The frame that can wait no longer: a flowing link delivers within `max_latency_s`."""
        best: tuple[float, Link, Direction] | None = None
        for lk in self.all_links():
            if not lk.open or not lk.flowing:
                continue
            for d in (lk.down, lk.up):
                if not d.queue:
                    continue
                head = d.queue[0]
                if self._receiver_ready(lk, d):
                    t = head.ready_at + self.config.max_latency_s
                    if best is None or t < best[0]:
                        best = (t, lk, d)
        return best

    def _deliver(self, link: Link, d: Direction, within_step: bool = False) -> str:
        """Deliver the head frame of `d`; returns its description (for the trace)."""
        frame = link.pop(d)
        self.events[f"deliver:{frame.msg.TYPE}"] += 1
        if self.ext is not None and self.ext.owns(link):
            return str(self.ext.deliver(link, d, frame, within_step))
        desc = "deliver"
        if self.tracer is not None:
            arrow = "->" if d is link.down else "<-"
            desc = f"deliver mind {arrow} {link.hand} gen{link.gen}: {describe(frame.msg)}"
            if within_step:
                self.tracer.note(desc)
        if d is link.down:
            proc = self.hands[link.hand].proc
            assert proc is not None and proc.conn is not None
            proc.conn.deliver(frame)
            while d.queue and d.queue[0].glued:  # written with it: read with it
                self._deliver(link, d, within_step=True)
        else:
            assert self.mind is not None
            self.mind.on_hand_message(link, frame.env_id, frame.msg)
        return desc

    def _burst(self, link: Link, d: Direction) -> str:
        """The frames that are ready behind it come in the same read: the Hand's reader takes them
        one after the other without yielding (so starts among them share one admission batch)."""
        n = 0
        while n < 8 and d.queue and d.queue[0].ready_at <= self.clock.now:
            self._deliver(link, d, within_step=True)
            n += 1
        if n:
            self.events["deliver_burst"] += 1
        return f" (+{n} in the same read)" if n else ""

    def to_client(self, conn: str, req_id: str, msg: Message) -> None:
        if self.ext is not None and self.ext.to_client(conn, req_id, msg):
            return
        client = self.conn_clients.get(conn)
        if client is None or client.conn != conn:
            return  # disconnected: nobody reads it
        req = record(client, req_id, msg)
        if req is not None:
            if self.tracer is not None and not isinstance(msg, (RunUpdate, RunOutput)):
                self.tracer.note(f"{client.name} <- {describe(msg)}")
            self.checker.on_client_msg(client, req, msg)

    # --- time -----------------------------------------------------------------------------------

    def _advance_to(self, target: float) -> None:
        while True:
            t_timer = self.clock.next_at()
            forced = self._forced()
            if forced is not None and (t_timer is None or forced[0] <= t_timer):
                if forced[0] > target:
                    break
                self.clock.now = max(self.clock.now, forced[0])
                self._deliver(forced[1], forced[2], within_step=True)
            else:
                if t_timer is None or t_timer > target:
                    break
                timer = self.clock.pop_due(target)
                if timer is None:
                    break
                if self.tracer is not None:
                    self.tracer.note(f"timer {timer.label} (t={self.clock.now:.3f})")
                timer.fn()
            self.drain()
            self.checker.after_event()
        self.clock.now = max(self.clock.now, target)

    # --- driving by hand (scripted scenarios in tests) ------------------------------------------

    def advance(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass (timers fire, overdue frames are delivered)."""
        self._guard(lambda: self._advance_to(self.clock.now + seconds))

    def deliver_all(self, hand: str | None = None, direction: str | None = None, limit: int = 10_000) -> int:
        """Deliver every frame that can be delivered now (of one Hand / one direction if given)."""
        n = 0
        while n < limit:
            ready = [
                (lk, d)
                for lk, d in self._deliverable()
                if (hand is None or lk.hand == hand) and (direction is None or d.name == direction)
            ]
            if not ready:
                return n
            self._guard(partial(self._deliver, *ready[0]))
            self._guard(self.drain)
            self.checker.after_event()
            n += 1
        return n

    def deliver_together(self, hand: str) -> int:
        """Deliver every frame ready towards `hand` in ONE read (its reader takes them all before
        anything else runs), then run what is ready. Returns how many."""
        link = self.link_of(hand)
        if link is None or not link.down.queue or (link, link.down) not in self._deliverable():
            return 0
        before = link.down.delivered

        def read() -> None:
            self._deliver(link, link.down)
            self._burst(link, link.down)

        self._guard(read)
        self._guard(self.drain)
        self.checker.after_event()
        return link.down.delivered - before

    def link_of(self, hand: str) -> Link | None:
        proc = self.hands[hand].proc
        return proc.conn.link if proc is not None and proc.conn is not None else None

    # --- the scheduler --------------------------------------------------------------------------

    def run(self) -> World:
        for _ in range(self.steps):
            self.step_no += 1
            self._guard(self._step)
        self._guard(lambda: self.quiesce("quiesce"))
        self._guard(lambda: self.checker.reconciled("quiesce"))
        self._guard(self._final_reconnect)
        self._guard(lambda: self.quiesce("final"))
        self._guard(lambda: self.checker.reconciled("final"))
        return self

    def _step(self) -> None:
        deliverable = self._deliverable()
        kind = pick(self.rng, (("deliver", 45 if deliverable else 0), ("advance", 25), ("client", 20), ("fault", 4)))
        if kind == "deliver":
            link, d = self.rng.choice(deliverable)
            desc = self._deliver(link, d)
            if d is link.down and len(d.queue) > 0 and self.rng.random() < 0.4:
                desc += self._burst(link, d)
        elif kind == "advance":
            nxt = [t for t in (self.clock.next_at(), (self._forced() or (None,))[0]) if t is not None]
            if nxt and self.rng.random() < 0.6:
                target = min(nxt)
            else:
                target = self.clock.now + self.rng.choice((0.01, 0.1, 0.5, 1.0, 3.0, 10.0))
            self._advance_to(target)
            desc = f"advance to {target:.3f}"
            self.events["advance"] += 1
        elif kind == "client" and self.ext is not None and self.rng.random() < 0.5:
            desc = self.ext.act()
            self.events[desc.split(" ", 1)[0]] += 1
        elif kind == "client":
            client = self.rng.choice(self.clients)
            desc = self.actions.act(client)
            self.events[desc] += 1
            desc = f"{client.name} {desc}"
        else:
            desc = self.faults.inject()
            self.events[desc.split(" ", 1)[0]] += 1
        self.drain()
        self.checker.after_event()
        if self.tracer is not None:
            self.tracer.step(desc, str(self.step_no))

    # --- quiesce --------------------------------------------------------------------------------

    def _final_reconnect(self) -> None:
        """One more connection per Hand, so one more reconciliation pass runs on the settled state."""
        for link in self.links:
            if link.open:
                self.close_link(link, "final reconnect", 0.0, 0.0)

    def quiesce(self, phase: str) -> None:
        self.faults.heal()
        start = self.clock.now
        for _ in range(self.config.quiesce_events):
            if self.quiet():
                return
            deliverable = self._deliverable()
            if deliverable:
                desc = self._deliver(*self.rng.choice(deliverable))
                self.drain()
                self.checker.after_event()
            else:
                t = self.clock.next_at(ignore_periodic=True)
                t = t if t is not None else self.clock.next_at()
                if t is None or t > start + 3600:
                    break
                self._advance_to(t)
                desc = f"advance to {t:.3f}"
            if self.tracer is not None:
                self.tracer.step(desc, phase)
        self.checker.fail("the system quiesces", f"[{phase}] still busy after healing: {self.busy()}")

    def busy(self) -> list[str]:
        out = []
        mind = self.mind
        if mind is None:
            return ["mind down"]
        for slot in self.hands.values():
            proc = slot.proc
            if proc is None:
                out.append(f"{slot.label} down")
                continue
            if proc.conn is None or not proc.conn.link.open:
                out.append(f"{slot.label} not connected")
            elif slot.label not in mind.hands or mind.hands[slot.label].link is not proc.conn.link:
                out.append(f"{slot.label} not registered by the mind")
            if slot.machine.running():
                out.append(f"{slot.label} jobs {[p.key for p in slot.machine.running()]}")
            if proc.tasks.busy():
                out.append(f"{slot.label} tasks queued/running")
            procs = proc.loop.transient_procs()
            if procs or proc.loop.io_pending:
                out.append(f"{slot.label} procs {[p.name for p in procs]} io {proc.loop.io_pending}")
        for link in self.links:
            if link.open and link.in_flight():
                out.append(f"{link!r}")
        procs = mind.loop.transient_procs()
        if procs or mind.loop.io_pending:
            out.append(f"mind procs {[p.name for p in procs]} io {mind.loop.io_pending}")
        active = mind.registry.active()
        if active:
            out.append(f"runs {[(r.run_id, r.state.value) for r in active]}")
        if self.ext is not None:
            out += self.ext.busy()
        return out

    def quiet(self) -> bool:
        return not self.busy()


def run_seed(
    seed: int,
    steps: int = 300,
    *,
    trace: Callable[[str], None] | None = None,
    config: Config | None = None,
    rules: Rules | None = None,
) -> World:
    """Run one seed to the end; raises `InvariantViolation` (with its replay command) on failure."""
    return World(seed, steps, config=config, rules=rules, trace=trace).run()
