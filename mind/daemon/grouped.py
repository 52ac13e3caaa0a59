"""Work the Mind does for many calls at once instead of once per call (issue 25, calls near the relay).

Two things a call's end costs the Mind that do not have to be paid per call:

- **Its durable ending** (`PersistEnding`, DESIGN §15): one SQLite commit per ending was the largest
  single cost of a routed call after the socket writes. `HeldActions` writes every ending that
  arrives in one turn of the event loop in one transaction, and holds back *every* action after the
  first of them (in order, whatever connection they are for) until that transaction has committed.
  The promise is unchanged: an ending is durable before anyone is told of it, because nothing that
  tells anyone (a `run_end` to the client, a `result_ack` to the Hand) leaves before the commit.
- **The Hand's `result_ack`**: the Hand keeps a result until it is acknowledged, and nothing else
  waits for the acknowledgement, so `ResultAcks` holds it back until the next frame to that Hand
  (a sequential caller's next call: they leave in one write) or `ACK_DELAY_S`, at most `ACK_BATCH`
  at a time. A Hand that loses its connection with acknowledgements held presents those results
  again on the next one, and they are acknowledged then, as after any cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from mind.core.runs import Action, PersistEnding
from mind.daemon.peer import Peer
from protocol.messages import ResultAck

log = structlog.get_logger(component="mind")

ACK_DELAY_S = 0.05
"""How long a `result_ack` waits for a frame to ride with: well under the Hand's bound on kept
results at any rate a Hand can serve (`RUNS_PRESENT_MAX` 10,000), and unnoticed by anyone."""
ACK_BATCH = 256
"""Acknowledgements held for one Hand at most: then they go at once."""


class ResultAcks:
    """`result_ack`s held per Hand connection until a frame to it or `ACK_DELAY_S`."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[Peer, list[ResultAck]]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, peer: Peer, ack: ResultAck) -> None:
        entry = self._held.get(id(peer))
        if entry is None or entry[0] is not peer:
            entry = self._held[id(peer)] = (peer, [])
        entry[1].append(ack)
        if len(entry[1]) >= ACK_BATCH:
            self.release(peer)
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(ACK_DELAY_S, self.release_all)
            except RuntimeError:  # no loop (a test driving the shell by hand): nothing to wait for
                self.release(peer)

    def release(self, peer: Peer) -> None:
        """Queue the acknowledgements held for `peer` now (before the frame about to follow)."""
        entry = self._held.pop(id(peer), None)
        if entry is not None and entry[0] is peer:
            for ack in entry[1]:
                peer.outbox.put(ack)

    def release_all(self) -> None:
        self._timer = None
        for peer, _ in list(self._held.values()):
            self.release(peer)


class HeldActions:
    """The actions after a `PersistEnding`, held until the endings held with them are committed.

    `perform` performs one action that is not an ending (never holding it again); `commit` writes a
    batch of endings durably and returns None when it wrote them at once (SQLite, on the loop), or an
    awaitable that finishes when they are written (PostgreSQL, over the network): meanwhile every
    new action waits too, so the order of everything the Mind says is the order it decided it in.
    Neither raises: a commit logs what it could not write, as the writer of one ending did."""

    def __init__(
        self, perform: Callable[[Action], None], commit: Callable[[list[PersistEnding]], Awaitable[None] | None]
    ) -> None:
        self._perform = perform
        self._commit = commit
        self._held: list[Action] | None = None
        self._writing: asyncio.Task[None] | None = None
        """The commit over the network in flight, with the actions that wait for it."""

    @property
    def holding(self) -> bool:
        return self._held is not None or self._writing is not None

    def hold(self, actions: list[Action]) -> None:
        """`actions` start with a `PersistEnding`, or come while others are held: they wait, in order."""
        if self._held is not None:
            self._held.extend(actions)
            return
        self._held = list(actions)
        if self._writing is not None:
            return  # flushed when the commit in flight is done
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop: commit at once
            self.flush()

    def flush(self) -> None:
        """Commit every held ending in one transaction, then perform the rest in their order."""
        if self._writing is not None:
            return
        held, self._held = self._held, None
        if not held:
            return
        try:
            pending = self._commit([a for a in held if isinstance(a, PersistEnding)])
        except Exception:  # the commit logs what it could not write; this is a bug's last net
            log.exception("run_endings_commit_failed", count=len(held))
            pending = None
        if pending is None:
            self._release(held)
            return
        self._writing = asyncio.ensure_future(self._after(pending, held))

    async def _after(self, pending: Awaitable[None], held: list[Action]) -> None:
        try:
            await pending
        except Exception:
            log.exception("run_endings_commit_failed", count=len(held))
        finally:
            self._writing = None
            self._release(held)
            if self._held is not None:
                self.flush()  # what gathered while this commit was in flight

    async def drain(self) -> None:
        """Until nothing is held (the Mind stops: every ending written before the stores close)."""
        while self.holding:
            self.flush()
            if self._writing is not None:
                await asyncio.shield(self._writing)

    def _release(self, held: list[Action]) -> None:
        """The actions held belong to many calls: a failure in one (a bug) is logged and ends only
        that action, never the others' answers (which would otherwise wait forever)."""
        for a in held:
            if not isinstance(a, PersistEnding):
                try:
                    self._perform(a)
                except Exception:
                    log.exception("held_action_failed", action=type(a).__name__)
