"""The faults the scheduler injects, and the healing of the quiesce phase.

Each is what the fault proxy (`mind/testing/faultproxy/`) or `kill -9` does to a real cluster, named
from the one vocabulary both use (`mind/testing/vocabulary.py`; docs/testing.md says which faults
replay between the two):
- latency: every frame of one direction is held a while (ordered, nothing lost);
- cut: the connection is closed (RST): in-flight frames are lost, both sides notice shortly;
- blackhole: nothing flows and nobody is told; each side's keepalive (`keepalive_s`) declares the
  connection dead, unless the path resumes first (then what was held is delivered, in order);
- partition: a cut, and the Hand's new connections are refused for a while;
- Hand crash: its loop dies (its store and its commands' processes do not); it restarts later;
- Mind crash: its registry, asks and connections vanish (snapshots and generations stay); it
  restarts later and marks every unfinished snapshot stale;
- duplicate (the proxy's `frame duplicate rpc down`): the next background start on a connection goes out twice in one write (same id;
  the same binding, or another max runtime: a conflict). The Mind never does this (its snapshot
  dedups ids); it is here so that one admission batch holds the same id twice, which `admit_batch`
  must answer as the first's duplicate or conflict (the copy's answers are late inputs to the Mind);
- disk failure: the Hand's next commit of starts fails as a whole (`HandTaskStore.fail_commits`):
  the batch is refused, nothing stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.clients import pick
from sim.network import Link

from mind.testing.vocabulary import Fault
from protocol.messages import Background, Rpc

if TYPE_CHECKING:
    from sim.simulation import HandSlot, World


class Faults:
    def __init__(self, world: World) -> None:
        self.world = world

    def inject(self) -> str:
        """One random fault; returns what it did (its first word is its kind)."""
        w = self.world
        rng, now = w.rng, w.clock.now
        if w.ext is not None and rng.random() < 0.35:
            return str(w.ext.inject_fault())
        kind = pick(
            rng,
            (
                (Fault.LATENCY, 25),
                (Fault.CUT, 25),
                (Fault.BLACKHOLE, 15),
                (Fault.PARTITION, 10),
                (Fault.HAND_CRASH, 12),
                (Fault.MIND_CRASH, 8),
                (Fault.DUPLICATE, 10),
                (Fault.DISK_FAIL, 5),
            ),
        )
        links = [lk for lk in w.links if lk.open]
        if kind in (Fault.LATENCY, Fault.CUT, Fault.BLACKHOLE, Fault.DUPLICATE) and not links:
            return "fault:none"
        if kind == Fault.DUPLICATE:
            link = rng.choice(links)
            conflict = rng.random() < 0.4
            link.twin = lambda msg: self._twin(link, msg, conflict)
            return f"fault:{kind} {link.hand} gen{link.gen}{' conflicting' if conflict else ''}"
        if kind == Fault.DISK_FAIL:
            slot = rng.choice(list(w.hands.values()))
            slot.store.fail_commits += 1
            return f"fault:{kind} {slot.label}"
        if kind == Fault.LATENCY:
            link = rng.choice(links)
            d = rng.choice((link.down, link.up))
            d.delay = rng.choice((0.2, 1.0, 3.0, 8.0))
            w.clock.at(now + rng.choice((1.0, 5.0, 20.0)), lambda: setattr(d, "delay", 0.0), label="fault")
            return f"fault:{kind} {link.hand} gen{link.gen} {d.name} {d.delay}s"
        if kind == Fault.CUT:
            link = rng.choice(links)
            w.close_link(link, "cut", rng.uniform(0, 0.2), rng.uniform(0, 0.2))
            return f"fault:cut {link.hand} gen{link.gen}"
        if kind == Fault.BLACKHOLE:
            link = rng.choice(links)
            if not link.flowing:
                return "fault:none"
            link.flowing = False
            link.blackhole_epoch += 1
            epoch, k = link.blackhole_epoch, w.config.keepalive_s
            w.clock.at(now + rng.choice((2.0, 8.0, 15.0, 45.0)), lambda: self.resume(link, epoch), label="fault")
            w.clock.at(now + k * rng.uniform(1, 1.5), lambda: self.keepalive(link, epoch, "mind"), label="fault")
            w.clock.at(now + k * rng.uniform(1, 1.5), lambda: self.keepalive(link, epoch, "hand"), label="fault")
            return f"fault:blackhole {link.hand} gen{link.gen}"
        if kind == Fault.PARTITION:
            slot = rng.choice(list(w.hands.values()))
            slot.refused_until = now + rng.choice((3.0, 15.0, 60.0))
            for link in links:
                if link.hand == slot.label:
                    w.close_link(link, "partition", rng.uniform(0, 0.2), rng.uniform(0, 0.2))
            return f"fault:partition {slot.label} until {slot.refused_until:.1f}"
        if kind == Fault.HAND_CRASH:
            up = [s for s in w.hands.values() if s.proc is not None]
            if not up:
                return "fault:none"
            slot = rng.choice(up)
            self.crash_hand(slot)
            w.clock.at(now + rng.choice((0.5, 3.0, 20.0)), lambda: w.start_hand(slot), label="restart")
            return f"fault:hand_crash {slot.label}"
        if w.mind is None:
            return "fault:none"
        self.crash_mind()
        w.clock.at(now + rng.choice((0.5, 3.0, 20.0)), w.start_mind, label="restart")
        return "fault:mind_crash"

    @staticmethod
    def _twin(link: Link, msg: object, conflict: bool) -> Rpc | None:
        if not isinstance(msg, Rpc) or msg.background is None:
            return None
        link.twin = None
        if conflict:
            return msg.model_copy(update={"background": Background(max_runtime_ms=msg.background.max_runtime_ms - 1)})
        return msg

    def crash_hand(self, slot: HandSlot) -> None:
        w = self.world
        proc = slot.proc
        assert proc is not None
        if proc.tasks.undecided():
            w.checker.notes["admit_batch:crash_undecided"] += 1
        proc.loop.kill()
        slot.proc = None
        if w.ext is not None:
            w.ext.on_hand_crash(proc)
        for link in w.links:
            if link.hand == slot.label and link.open:
                w.close_link(link, "hand crashed", w.rng.uniform(0, 0.1), None)

    def crash_mind(self) -> None:
        w = self.world
        assert w.mind is not None
        w.mind.loop.kill()
        w.mind = None
        if w.ext is not None:
            w.ext.on_mind_crash()
        for link in w.links:
            if link.open:
                w.close_link(link, "mind crashed", None, w.rng.uniform(0, 0.2))
        for client in w.clients:
            client.conn = None

    def keepalive(self, link: Link, epoch: int, side: str) -> None:
        w = self.world
        if link.blackhole_epoch != epoch or link.flowing:
            return
        link.close("keepalive")
        if side == "mind":
            w.notice_mind(link)
        else:
            w.notice_hand(link)

    def resume(self, link: Link, epoch: int) -> None:
        w = self.world
        if link.blackhole_epoch != epoch:
            return
        link.flowing = True
        link.blackhole_epoch += 1
        if not link.open:  # one side gave up meanwhile: the other now sees the close
            w.close_link(link, link.closed_why, w.rng.uniform(0, 0.2), w.rng.uniform(0, 0.2))

    def heal(self) -> None:
        """The quiesce phase: every link flows, every partition ends, every process is up."""
        w = self.world
        if w.tracer is not None:
            w.tracer.line("--- heal: every link flows, every partition ends, every process is up ---")
        for link in w.links:
            link.down.delay = link.up.delay = 0.0
            link.twin = None
            if not link.flowing:
                self.resume(link, link.blackhole_epoch)
        if w.ext is not None:
            w.ext.heal()
        for slot in w.hands.values():
            slot.refused_until = 0.0
            slot.store.fail_commits = 0
            w.start_hand(slot)
        w.start_mind()
        w.drain()
