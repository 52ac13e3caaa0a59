"""The Mind with a resume window, simulated: `SimMind` (the REAL registry) plus what continuity
adds to the daemon's glue (DESIGN §15), mirrored from `mind/daemon/server.py` and `dispatch.py`:
- the registry is built with the window; at start it is given back every ending its earlier
  lives decided by themselves (`restore`, from the simulated disk) and told that, for a window,
  a Hand may still present a run it does not know (`expect_presentations`);
- `PersistEnding` is written to the disk BEFORE the actions after it are performed (the daemon
  commits the endings of one turn of its loop together and holds every later action until then:
  the same order, `mind.daemon.grouped.HeldActions`);
- a `result_ack` is held until the next frame to its Hand or `ACK_DELAY_S`, `ACK_BATCH` at most
  (`mind.daemon.grouped.ResultAcks`);
- a Hand's `runs_present`, `stream_data` and `stream_ack` go to the registry;
- clients of the continuity variant come over a link of their own (`sim.stream_clients`): their
  `exec` (with streams, and their identity as owner), `attach`, `detach`, `cancel_run`, stdin and
  acknowledgements; a client link that ends is `on_client_gone`;
- the ticker: the real one runs every second; here a tick is set for the moment a window (or a
  deadline) can fire, which is when the registry would act on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.mind_shell import SimMind
from sim.network import Link

from mind.core.admission import RunNames
from mind.core.registry import Action, FrameToClient, Log, PersistEnding, SendToClient, SendToHand
from mind.daemon.grouped import ACK_BATCH, ACK_DELAY_S
from protocol.messages import (
    Attach,
    CancelRun,
    Detach,
    Exec,
    Message,
    Resize,
    ResultAck,
    RunsPresent,
    StreamAck,
    StreamData,
)

if TYPE_CHECKING:
    from sim.simulation import World

WINDOW_EVENTS = ("run_hand_away", "run_client_away", "run_detached", "run_adopted")


class ContinuityMind(SimMind):
    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.ext: Any = world.ext
        self.window = world.window
        self.registry = world.rules.registry_cls(resume_window=self.window)
        for p in self.ext.disk.values():
            self.registry.restore(p.end, p.owner, p.cancel_reason, p.args_digest, self.now, self.now)
        self.registry.expect_presentations(self.now + self.window)
        self.client_links: dict[Link, str] = {}
        self.held_acks: dict[str, list[SendToHand]] = {}
        self.ack_timer = False
        self.conns: dict[str, Link] = {}

    # --- performing ---

    def perform(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, PersistEnding):
                self.ext.persist(self.life, a)  # durable before anyone is told
                continue
            if isinstance(a, SendToHand):
                if isinstance(a.msg, ResultAck):
                    self._hold_ack(a)
                    continue
                self._release_acks(a.hand)
            super().perform([a])
            if isinstance(a, Log) and a.event in WINDOW_EVENTS:
                keep = a.fields.get("keep_s")
                self.loop.call_at(self.now + (keep or self.window), self.tick, label="window")
                run = self.registry.get(a.fields["run_id"])
                if a.event == "run_adopted" and run is not None:
                    self.loop.call_at(run.mind_deadline, self.tick, label="mind_deadline")

    def _hold_ack(self, a: SendToHand) -> None:
        held = self.held_acks.setdefault(a.hand, [])
        held.append(a)
        if len(held) >= ACK_BATCH:
            self._release_acks(a.hand)
        elif not self.ack_timer:
            self.ack_timer = True
            self.loop.call_at(self.now + ACK_DELAY_S, self._release_all_acks, label="result_acks")

    def _release_acks(self, hand: str) -> None:
        for a in self.held_acks.pop(hand, []):
            super().perform([a])  # to the generation it was for: none if that connection is gone

    def _release_all_acks(self) -> None:
        self.ack_timer = False
        for hand in list(self.held_acks):
            self._release_acks(hand)

    # --- hands ---

    def on_hand_message(self, link: Link, env_id: str | None, msg: Message) -> None:
        peer = self.peers.get(link)
        assert peer is not None, f"a frame on {link} whose reader has ended"
        if isinstance(msg, RunsPresent):
            self.ext.checker.on_presented(peer.label, peer.gen, msg)
            self.perform(self.registry.on_runs_present(peer.label, peer.gen, msg, self.now, self.now))
            return
        if isinstance(msg, StreamData):  # a data frame: numbered by the Hand's channel, routed on its header
            number = self.registry.stream_number(("h", peer.label, str(peer.gen)), msg.run_id, msg.stream)
            if number is None:
                return  # a number that died with its run: the Mind drops the late frame
            acts = self.registry.on_hand_frame(peer.label, peer.gen, number, msg.offset, msg.eof, memoryview(msg.data))
            if any(isinstance(a, FrameToClient) for a in acts):
                self.ext.checker.on_stream_forwarded(self.life, msg.run_id, peer.gen)
            self.perform(acts)
            return
        if isinstance(msg, StreamAck):
            acts = self.registry.on_hand_stream(msg, peer.label, peer.gen)
            if any(isinstance(a, SendToClient) for a in acts):
                self.ext.checker.on_stream_forwarded(self.life, msg.run_id, peer.gen)
            self.perform(acts)
            return
        super().on_hand_message(link, env_id, msg)

    # --- clients over their own links ---

    def client_connected(self, link: Link) -> str:
        conn = self.world.next_id("k")
        self.client_links[link] = conn
        self.conns[conn] = link
        return conn

    def client_link_ended(self, link: Link) -> None:
        conn = self.client_links.pop(link, None)
        if conn is None:
            return
        del self.conns[conn]
        self.client_gone(conn)

    def on_client_frame(self, link: Link, env_id: str, msg: Message) -> None:
        conn = self.client_links.get(link)
        if conn is None:
            return  # its reader has ended
        owner = link.hand  # the client's identity (its credential's label)
        now = self.now
        if isinstance(msg, Exec):
            if msg.run_id is not None:  # `Dispatch._exec`: the REAL rule of what a connection may name
                problem = self._names.setdefault(conn, RunNames(conn)).take(msg.run_id)
                assert problem is None, f"a simulated client named a run it may not: {problem}"
            run_id = msg.run_id or self.world.next_id("r")
            live = self.hands.get(msg.hand)
            gen = live.gen if live is not None else None
            self.perform(self.registry.admit(run_id, msg, conn, env_id, gen, True, now, now, owner=owner))
            run = self.registry.get(run_id)
            if run is not None and not run.terminal:
                self.loop.call_at(run.mind_deadline, self.tick, label="mind_deadline")
        elif isinstance(msg, Attach):
            if self.registry.get(msg.run_id) is None and msg.run_id not in self.ext.checker.admitted:
                self.ext.checker.attached_unadmitted.add(msg.run_id)
            self.perform(self.registry.on_attach(msg.run_id, conn, owner, env_id, now, now, msg.streams))
        elif isinstance(msg, Detach):
            self.perform(self.registry.on_detach(msg.run_id, conn, env_id, msg.keep_s, now, now))
        elif isinstance(msg, CancelRun):
            self.on_cancel_run(conn, env_id, msg.run_id)
        elif isinstance(msg, StreamData):
            number = self.registry.stream_number(("c", conn), msg.run_id, msg.stream)
            if number is not None:  # None: a number that died with its run (or moved to a newer attachment)
                self.perform(self.registry.on_client_frame(conn, number, msg.offset, msg.eof, memoryview(msg.data)))
        elif isinstance(msg, (StreamAck, Resize)):
            self.perform(self.registry.on_client_stream(msg, conn))
        else:
            raise AssertionError(f"a client may not send {msg.TYPE} here")

    def send_to_client(self, conn: str, req_id: str, msg: Message) -> bool:
        """`SendToClient` onto a client link (False: not a client of a link; the world's own)."""
        link = self.conns.get(conn)
        if link is None:
            return conn.startswith("k")
        link.send(link.down, msg, req_id, self.now)
        return True
