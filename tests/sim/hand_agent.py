"""One life of a simulated Hand process: `hand.aio.agent.Agent`, synchronously.

Mirrored from `hand/aio/agent.py` (keep in step): the task manager is opened (restart recovery) before
the first dial; the Hand dials forever with the REAL `hand.core.backoff.Backoff` (seeded); per
connection it has its own run table and reader; task messages are handled IN ORDER by the reader
(each awaited before the next frame is read), foreground `rpc`/`cancel` synchronously. Frames that
arrived in one read (a burst, see `World._step`) wait in `inbox` and the reader takes them without
yielding, as websockets' `recv` returns a buffered frame without suspending: background starts
read in one go are taken in before the admission drainer first runs (one batch). When the
connection ends its foreground runs are cancelled (`connection_lost`) and awaited, and only then
does it wait out the backoff. Nothing of an earlier connection is ever resent.

A crash is the loss of this object (and of its loop); the store and the machine's processes stay.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from sim.hand_runs import HandRuns
from sim.network import Frame, Link
from sim.runtime import Fut

from hand.core.backoff import Backoff
from hand.core.policy import Policy
from hand.core.runs import RecentRuns
from protocol.codes import CancelReason
from protocol.messages import Cancel, Message, Rpc, TaskCancel, TaskInventory, TaskStatus

if TYPE_CHECKING:
    from sim.simulation import HandSlot, World


class HandConn:
    """The Hand's side of one connection: its one writer path and its reader's mailbox."""

    def __init__(self, hand: HandProcess, link: Link) -> None:
        self.hand = hand
        self.link = link
        self.wire_open = True
        self.closed = Fut()
        self.recv_fut: Fut | None = None
        self.inbox: deque[Frame] = deque()
        """Frames read off the socket that the reader has not taken yet."""
        self.runs = HandRuns(hand, self.send)

    def send(self, msg: Message, env_id: str | None = None) -> None:
        if self.wire_open:
            self.link.send(self.link.up, msg, env_id, self.hand.clock.now)

    def recv(self) -> Fut:
        self.recv_fut = Fut()
        return self.recv_fut

    @property
    def receiving(self) -> bool:
        return self.recv_fut is not None and not self.recv_fut.done

    def deliver(self, frame: Frame) -> None:
        """The frame read off the socket: to the waiting reader, or to the buffer if it is busy."""
        if self.receiving:
            self.recv_fut.resolve(frame)  # type: ignore[union-attr]
        else:
            self.inbox.append(frame)


class HandProcess:
    cancel_waits_for_starts = True
    """True as `hand/aio/agent.py` ships: a run `cancel` read while some start is undecided waits for
    it (`await tasks.settle()` first, as `TaskManager.answer` does). False as the group commit first
    shipped (`sim.variants`, "hand-batch-before-fix"): the cancel of a task's start run was answered
    `unknown_run` before the start's `accepted`/`rejected`, and the Mind ended the start run `lost`."""

    def __init__(self, world: World, slot: HandSlot) -> None:
        self.world = world
        self.clock = world.clock
        self.label = slot.label
        self.store = slot.store
        self.machine = slot.machine
        self.kill_grace = world.config.kill_grace
        self.policy = Policy(deny=frozenset({"write_file"}))
        self.loop = world.new_loop(slot.label)
        self.recent = RecentRuns()
        self.tasks = world.rules.hand_tasks_cls(self)
        self.conn: HandConn | None = None
        self.backoff = Backoff(rng=random.Random(world.rng.random()))

    def start(self) -> None:
        self.tasks.open()
        self.loop.spawn(self._connect_forever(), "connect_forever", transient=False)

    def _connect_forever(self) -> Generator[Any, Any, None]:
        while True:
            lived: float | None = None
            link = self.world.dial(self)
            if link is not None:
                lived = yield from self._session(link)
            self.backoff.connection_ended(lived)
            yield self.loop.sleep(self.backoff.next_delay(), "backoff")

    def make_conn(self, link: Link) -> HandConn:
        return HandConn(self, link)

    def _session(self, link: Link) -> Generator[Any, Any, float]:
        conn = self.make_conn(link)
        self.conn = conn
        welcomed = self.clock.now
        self.tasks.attach(conn.send)
        reader = self.loop.spawn(self._read_loop(conn), f"reader gen{link.gen}", transient=False)
        yield conn.closed
        conn.runs.cancel_all(CancelReason.CONNECTION_LOST)  # foreground runs only: tasks outlive it
        reader.cancel()
        conn.wire_open = False
        yield from conn.runs.wait_idle(self.kill_grace + 1)
        self.tasks.attach(None)
        self.conn = None
        return self.clock.now - welcomed

    def notice_closed(self, link: Link) -> None:
        """The connection's reader saw it end (reset, FIN, or keepalive)."""
        if self.conn is not None and self.conn.link is link:
            self.conn.closed.resolve(None)

    def _read_loop(self, conn: HandConn) -> Generator[Any, Any, None]:
        while True:
            frame = conn.inbox.popleft() if conn.inbox else (yield conn.recv())
            msg = frame.msg
            if isinstance(msg, Rpc) and msg.background is not None:
                yield from self.tasks.on_start(msg, conn.send)
            elif isinstance(msg, Rpc):
                conn.runs.on_rpc(msg)
            elif isinstance(msg, (TaskStatus, TaskCancel, TaskInventory)):
                reply = yield from self.tasks.answer(msg)
                conn.send(reply, frame.env_id)
            elif isinstance(msg, Cancel):
                if self.cancel_waits_for_starts:
                    yield from self.tasks.settle()
                conn.runs.on_cancel(msg)
            else:
                raise AssertionError(f"a mind may not send {msg.TYPE} to a hand")

    def busy(self) -> bool:
        return self.tasks.busy() or bool(self.loop.transient_procs())
