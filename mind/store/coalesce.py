"""Many callers of one statement, answered by one statement (DESIGN §16, "A connect storm").

A node welcoming Hands by the thousand asks the database three things per Hand (its secret at the
hello, its claim after the proof, its empty reconciliation), each alone a round trip: a send, a
wakeup of a backend, a parse of the reply. Measured on the `nodes` benchmark (10,000 Hands over two
nodes on one 2-core machine) those three round trips were a quarter of each node's CPU and most of
PostgreSQL's; the socket writes alone were 16 % of a node.

`Coalescer` keeps the statement's meaning per caller and pays its round trip once per batch: a
call with no batch in flight goes at once (a lone welcome waits for nothing), and the calls that
arrive while `lanes` batches are in flight go together in the next one, `max_batch` at most. So a
batch is exactly as large as the load makes it, and nobody waits on a timer.

Each batch is one call of `run` with the callers' items in order; it returns one value per item,
in that order. An exception from `run` is every caller's of that batch (the database went away:
each of them is told). A caller cancelled (its handshake timed out) before its batch left is
dropped from it; one cancelled after is simply not told. `distinct` names the items that must not
share a batch (two welcomes of one Hand on one node are two claims, in order).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
V = TypeVar("V")

MAX_BATCH = 128
"""Callers answered by one statement at most: its arrays and its reply stay small (a welcome's
reply row is ~100 bytes plus the endings), and a slow batch delays no more than this many."""
LANES = 1
"""Batches in flight at once: one being answered while the next is formed and sent."""


class Coalescer(Generic[T, V]):
    """Calls of `run` for one item each, coalesced into calls for many (see the module)."""

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[V]]],
        *,
        distinct: Callable[[T], Hashable] | None = None,
        max_batch: int = MAX_BATCH,
        lanes: int = LANES,
    ) -> None:
        self._run = run
        self._distinct = distinct
        self._max = max_batch
        self._lanes = lanes
        self._queue: deque[tuple[T, asyncio.Future[V]]] = deque()
        self._busy = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, item: T) -> V:
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        if self._busy < self._lanes:
            self._busy += 1
            # An empty context: the lane serves every caller, it must not log as the first one.
            task = asyncio.get_running_loop().create_task(self._lane(), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    def _take(self) -> list[tuple[T, asyncio.Future[V]]]:
        """The next batch, in arrival order: callers still waiting, `max_batch` at most, no two of
        one `distinct` key (the later one stays first in line for the next batch)."""
        batch: list[tuple[T, asyncio.Future[V]]] = []
        held: list[tuple[T, asyncio.Future[V]]] = []
        keys: set[Hashable] = set()
        while self._queue and len(batch) < self._max:
            item, fut = self._queue.popleft()
            if fut.done():  # its caller gave up before the batch left
                continue
            if self._distinct is not None:
                key = self._distinct(item)
                if key in keys:
                    held.append((item, fut))
                    continue
                keys.add(key)
            batch.append((item, fut))
        self._queue.extendleft(reversed(held))
        return batch

    async def _lane(self) -> None:
        try:
            while batch := self._take():
                try:
                    values = await self._run([item for item, _ in batch])
                except asyncio.CancelledError:
                    for _, fut in batch:
                        fut.cancel()
                    raise
                except Exception as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                if len(values) != len(batch):  # a bug in `run`: every caller is told, none hangs
                    err = RuntimeError(f"a batch of {len(batch)} was answered with {len(values)} values")
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                for (_, fut), value in zip(batch, values, strict=True):
                    if not fut.done():
                        fut.set_result(value)
        finally:
            self._busy -= 1
            if self._queue and self._busy == 0:  # cancelled with callers left: they are cancelled too
                while self._queue:
                    self._queue.popleft()[1].cancel()

    async def aclose(self) -> None:
        """Cancel the batches in flight (their callers are cancelled) and wait for them."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
