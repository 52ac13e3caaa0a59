"""The simulation's runtime: a virtual clock with timers, futures, and one tiny event loop per
simulated process.

Why this shape: the Mind's task service and the Hand's task manager are asyncio code whose races
live between their `await`s. The simulation mirrors them as generators that `yield` where the real
code awaits, and runs them on loops that behave like asyncio's where it matters:
- ready work runs FIFO and takes no virtual time (compute is instant, only I/O and timers wait);
- an I/O call (`await db(...)`, `await asyncio.to_thread(...)`) executes when it is submitted and
  completes later, in submission order (one database thread on the Mind, one store lock on the
  Hand), after a seeded latency;
- a process that crashes loses every proc, timer and pending completion it owned, at once.
Nothing here reads a clock, sleeps or uses asyncio, so a seed replays exactly.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

Coro = Generator[Any, Any, Any]


class Fut:
    """A one-shot result: procs that yield it resume when it is resolved (or failed)."""

    __slots__ = ("done", "value", "exc", "_callbacks", "_procs")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.exc: BaseException | None = None
        self._callbacks: list[Callable[[Fut], None]] = []
        self._procs: list[Proc] = []

    def resolve(self, value: Any = None) -> bool:
        if self.done:
            return False
        self.done, self.value = True, value
        self._fire()
        return True

    def fail(self, exc: BaseException) -> bool:
        if self.done:
            return False
        self.done, self.exc = True, exc
        self._fire()
        return True

    def then(self, callback: Callable[[Fut], None]) -> None:
        if self.done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def _fire(self) -> None:
        procs, self._procs = self._procs, []
        for proc in procs:
            proc.loop._wake(proc, self)
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)


class Timer:
    __slots__ = ("at", "fn", "owner", "cancelled", "label")

    def __init__(self, at: float, fn: Callable[[], None], owner: Loop | None, label: str) -> None:
        self.at = at
        self.fn = fn
        self.owner = owner
        self.cancelled = False
        self.label = label

    def cancel(self) -> None:
        self.cancelled = True

    @property
    def live(self) -> bool:
        return not self.cancelled and (self.owner is None or self.owner.alive)


class Clock:
    """Virtual time and the timer heap. Timers at the same instant fire in creation order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = 0

    def at(self, when: float, fn: Callable[[], None], owner: Loop | None = None, label: str = "") -> Timer:
        timer = Timer(max(when, self.now), fn, owner, label)
        self._seq += 1
        heapq.heappush(self._heap, (timer.at, self._seq, timer))
        return timer

    def next_at(self, ignore_periodic: bool = False) -> float | None:
        while self._heap and not self._heap[0][2].live:
            heapq.heappop(self._heap)
        if not ignore_periodic:
            return self._heap[0][0] if self._heap else None
        times = [t.at for _, _, t in self._heap if t.live and not t.label.startswith("periodic")]
        return min(times) if times else None

    def pending(self, include_periodic: bool = False) -> list[Timer]:
        return [t for _, _, t in self._heap if t.live and (include_periodic or not t.label.startswith("periodic"))]

    def pop_due(self, until: float) -> Timer | None:
        """The next live timer due at or before `until` (the clock moves to its time), or None."""
        while self._heap:
            when, _, timer = self._heap[0]
            if not timer.live:
                heapq.heappop(self._heap)
                continue
            if when > until:
                return None
            heapq.heappop(self._heap)
            self.now = max(self.now, when)
            return timer
        return None


class Cancelled(BaseException):
    """`asyncio.CancelledError` for simulated coroutines (a BaseException, as there)."""


class Proc:
    """One coroutine (an asyncio task in the real code) on a loop."""

    __slots__ = ("gen", "loop", "name", "done", "cancelled", "transient", "waiting_on")

    def __init__(self, gen: Coro, loop: Loop, name: str, transient: bool) -> None:
        self.gen = gen
        self.loop = loop
        self.name = name
        self.done = Fut()
        self.cancelled = False
        """Dead with its process: it never runs again, and no `finally` of it runs either."""
        self.transient = transient
        """False for the procs a process always has (its connect loop, a connection's reader):
        quiescence waits only for transient ones."""
        self.waiting_on: Fut | None = None

    def cancel(self) -> None:
        """`task.cancel()`: `Cancelled` is thrown in at the await it is parked on, so its `finally`
        blocks run (a lock it holds is released); what it was waiting for no longer wakes it."""
        if self.done.done or self.cancelled:
            return
        fut = Fut()
        fut.fail(Cancelled())
        self.waiting_on = fut
        self.loop._ready.append((self, fut))


class ProcError(Exception):
    """A simulated coroutine raised: in the real code that is an unhandled exception (a bug)."""


class Loop:
    """One simulated process's event loop: FIFO ready queue, I/O completed in submission order."""

    def __init__(self, name: str, clock: Clock, latency: Callable[[], float]) -> None:
        self.name = name
        self.clock = clock
        self.alive = True
        self._latency = latency
        self._ready: deque[tuple[Proc, Fut | None]] = deque()
        self._io_tail = 0.0
        self.io_pending = 0
        self.procs: list[Proc] = []

    # --- procs ---

    def spawn(self, gen: Coro, name: str, transient: bool = True) -> Proc:
        proc = Proc(gen, self, name, transient)
        self.procs.append(proc)
        self._ready.append((proc, None))
        return proc

    def transient_procs(self) -> list[Proc]:
        self.procs = [p for p in self.procs if not p.done.done and not p.cancelled]
        return [p for p in self.procs if p.transient]

    def has_ready(self) -> bool:
        return self.alive and bool(self._ready)

    def run_ready(self) -> None:
        """Run every ready proc until each waits on something (FIFO, no virtual time passes)."""
        while self.alive and self._ready:
            proc, fut = self._ready.popleft()
            if proc.cancelled or proc.done.done:
                continue
            self._step(proc, fut)

    def _step(self, proc: Proc, fut: Fut | None) -> None:
        if fut is not None and fut is not proc.waiting_on:
            return  # a wake-up for an await it has left (it was cancelled meanwhile)
        proc.waiting_on = None
        try:
            if fut is not None and fut.exc is not None:
                yielded = proc.gen.throw(fut.exc)
            else:
                yielded = proc.gen.send(fut.value if fut is not None else None)
        except StopIteration as stop:
            proc.done.resolve(stop.value)
            return
        except Cancelled:
            proc.done.resolve(None)
            return
        except Exception as exc:
            raise ProcError(f"{self.name}: {proc.name} raised {type(exc).__name__}: {exc}") from exc
        if yielded is None:
            yielded = _DONE
        elif yielded.__class__ is not Fut:
            raise ProcError(f"{self.name}: {proc.name} yielded {yielded!r}, not a Fut")
        proc.waiting_on = yielded
        if yielded.done:
            self._ready.append((proc, yielded))
        else:
            yielded._procs.append(proc)

    def _wake(self, proc: Proc, fut: Fut) -> None:
        if self.alive and not proc.cancelled and fut is proc.waiting_on:
            self._ready.append((proc, fut))

    # --- time and I/O ---

    def sleep(self, seconds: float, label: str = "sleep") -> Fut:
        fut = Fut()
        self.clock.at(self.clock.now + seconds, lambda: fut.resolve(None), owner=self, label=label)
        return fut

    def call_at(self, when: float, fn: Callable[[], None], label: str = "") -> Timer:
        return self.clock.at(when, fn, owner=self, label=label)

    def io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Fut:
        """Execute `fn` now (it is submitted now, and the store serialises submissions) and hand its
        result to the waiter later, after every earlier submission has completed."""
        fut = Fut()
        try:
            value, exc = fn(*args, **kwargs), None
        except Exception as e:  # delivered to the waiter, as to_thread would
            value, exc = None, e
        latency = self._latency()
        if latency <= 0 and not self.io_pending:  # nothing ahead of it: done before anything else happens
            if exc is not None:
                fut.fail(exc)
            else:
                fut.resolve(value)
            return fut
        done_at = max(self.clock.now + latency, self._io_tail)
        self._io_tail = done_at
        self.io_pending += 1

        def complete() -> None:
            self.io_pending -= 1
            if exc is not None:
                fut.fail(exc)
            else:
                fut.resolve(value)

        self.clock.at(done_at, complete, owner=self, label="io")
        return fut

    def kill(self) -> None:
        """The process dies: nothing it owned runs again."""
        self.alive = False
        self._ready.clear()
        for proc in self.procs:
            proc.cancelled = True
        self.procs = []
        self.io_pending = 0


_DONE = Fut()
_DONE.resolve(None)
"""What a bare `yield` waits on: nothing (a scheduling point)."""


class SimLock:
    """asyncio.Lock: FIFO hand-over to waiters; a waiter cancelled while queued leaves the queue,
    one cancelled after the hand-over passes the lock on. Use: `yield from lock.acquire()`."""

    def __init__(self) -> None:
        self.locked = False
        self._waiters: deque[Fut] = deque()

    def acquire(self) -> Coro:
        if not self.locked:
            self.locked = True
            return
        fut = Fut()
        self._waiters.append(fut)
        try:
            yield fut
        except Cancelled:
            if fut.done:
                self.release()
            else:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().resolve(None)
        else:
            self.locked = False


def first_of(*futs: Fut) -> Fut:
    """A future resolved as soon as any of `futs` is (asyncio.wait FIRST_COMPLETED)."""
    out = Fut()
    for f in futs:
        f.then(lambda _f: out.resolve(None))
    return out
