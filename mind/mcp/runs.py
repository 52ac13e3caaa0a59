"""The runs this server follows for its agents: each one's output as it comes (kept for `read_output`),
its end, and a wait bounded by the call's `wait_s` that reports progress while it waits.

A run belongs to the server, not to the tool call that started it: the call waits on it and goes
away (its `wait_s` passed, its client cancelled it, its HTTP response stream closed), the run goes on
and is still followed, so a later `run_get` or `read_output` finds it, its output is read off the
Hand (a run nobody reads stops on flow control) and its end is seen. When the server ends, every
run still going is detached with `keep_s`: the Mind keeps it unattended, and `run_get` from the next
server (the same credential) attaches to it again.

What the runs keep is bounded by their credential's byte budget (mind/mcp/budget.py): a run beyond
it is refused before it starts, and a running run's window stops growing when it is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from mind.client.aio import MindClient
from mind.client.run import RunHandle, StillRunning
from mind.errors import ClientError, MindhandError
from mind.mcp.budget import CREDENTIAL_BYTES, RUN_FLOOR, SERVER_BYTES, Ledger, OverBudget, Reservation
from mind.mcp.results import Retained
from protocol.messages import RunEnd, StreamData

PROGRESS_EVERY_S = 15.0
"""A silent run still gets a progress notification this often (the issue asks for at least every
20 s): clients that reset their request timer on progress keep waiting."""
PROGRESS_TEXT_MAX = 2 << 10
"""A progress notification carries at most this much of the new output (it is droppable: the whole
output is in the result and `read_output`)."""
KEEP_ENDED = 64
"""Ended runs whose output this server keeps for `read_output` (at most 8 MiB each: `RETAIN_BYTES`
per stream, and all of them within the credential's byte budget, mind/mcp/budget.py); an older one
is answered from the Mind's record (the last 4 KiB of each stream)."""
DETACH_KEEP_S = 3600.0
"""When the server ends, a run still going is kept this long by the Mind (capped by its --keep-max)."""

Progress = Callable[[float, str], Awaitable[None]]
"""Sends one progress notification: a number that only grows, and a message."""


FEED_MAX = 1 << 20
"""What `write_stdin` may queue for a run that has not read it yet (one call's most): past it a call is
refused until the command reads, so a command that never reads its stdin holds a bounded buffer."""


class Feed:
    """A run's standard input kept open for `write_stdin`: what each call gives, in order, then its end.
    `queued` counts what the command has not taken yet (held in the run's budget, at most `FEED_MAX`
    from `write_stdin`)."""

    def __init__(self, first: bytes | None = None) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False
        self.queued = 0
        self.on_change: Callable[[], None] | None = None
        """Told when `queued` changes (the run's budget follows it)."""
        if first:
            self.write(first, False)

    def write(self, data: bytes, eof: bool) -> None:
        if data:
            self._queue.put_nowait(data)
            self.queued += len(data)
        if eof:
            self.closed = True
            self._queue.put_nowait(None)
        if self.on_change is not None:
            self.on_change()

    async def chunks(self) -> AsyncIterator[bytes]:
        while (data := await self._queue.get()) is not None:
            self.queued -= len(data)
            if self.on_change is not None:
                self.on_change()
            yield data


@dataclass(eq=False)
class Followed:
    """One run and what this server has seen of it."""

    handle: RunHandle
    hand: str
    stdout: Retained = field(default_factory=Retained)
    stderr: Retained = field(default_factory=Retained)
    feed: Feed | None = None
    end: RunEnd | None = None
    failure: MindhandError | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    ledger: Ledger | None = None
    """The budget its bytes are held in (its credential's); None: not counted (nothing kept yet)."""
    held: int = 0
    """What it holds in `ledger` now: at least `RUN_FLOOR` while it runs, what it keeps once ended."""
    make_room: Callable[[int], bool] | None = None
    """Lets ended runs of its credential go until this many more bytes fit (`Runs.make_room`)."""

    @property
    def run_id(self) -> str | None:
        return self.handle.run_id

    @property
    def done(self) -> bool:
        return self.end is not None or self.failure is not None

    def stream(self, name: str) -> Retained:
        return self.stdout if name == "stdout" else self.stderr

    def __post_init__(self) -> None:
        if self.feed is not None:
            self.feed.on_change = self.settle

    @property
    def charge(self) -> int:
        """What it should hold in its ledger: its bytes (output kept, stdin not taken yet), and while
        it runs at least its floor."""
        kept = self.stdout.held + self.stderr.held + (self.feed.queued if self.feed is not None else 0)
        return kept if self.done else max(kept, RUN_FLOOR)

    def may_queue(self, n: int) -> bool:
        """Whether `n` more bytes of stdin fit the run's budget (ended runs let go to make room)."""
        return self._fits(self.charge - self.held + n)

    def settle(self) -> None:
        """Hold `charge` in the ledger (more as it grew, less once it ended)."""
        if self.ledger is not None:
            self.ledger.add(self.charge - self.held)
            self.held = self.charge

    def release(self) -> None:
        """Forgotten: what it held goes back to the ledger, and nothing more is counted."""
        if self.ledger is not None:
            self.ledger.add(-self.held)
        self.ledger, self.held = None, 0

    def _may_grow(self, r: Retained, n: int) -> bool:
        return self._fits(max(self.charge + r.growth(n), RUN_FLOOR) - self.held)

    def _fits(self, more: int) -> bool:
        if self.ledger is None or self.ledger.fits(more):
            return True
        return self.make_room is not None and self.make_room(more)

    def take(self, ev: object) -> None:
        """One event of the run: its output kept (within its budget), its end noted, its waiters woken."""
        if isinstance(ev, StreamData) and ev.data:
            r = self.stream(ev.stream)
            r.append(ev.data, self._may_grow(r, len(ev.data)))
            self.settle()
        elif isinstance(ev, RunEnd):
            self.end = ev
            self.settle()
        self.changed.set()

    async def follow(self) -> None:
        """Read every event of the run to its end (the client re-attaches across a cut of the Mind)."""
        try:
            async for ev in self.handle.events():
                self.take(ev)
        except StillRunning:  # detached by this server's shutdown: nothing more comes here
            pass
        except MindhandError as exc:
            self.failure = exc
        finally:
            self.settle()
            self.changed.set()


class Runs:
    """The runs followed on one connection to the Mind (one credential), by run id. Ended runs are
    kept for `read_output` up to `keep_ended` of them (the oldest forgotten first): a server that
    lives for weeks holds at most that many runs' retained output, not every run it ever saw. What
    they all hold is bounded by `ledger` (this credential's budget, under the server's)."""

    def __init__(self, client: MindClient, keep_ended: int = KEEP_ENDED, ledger: Ledger | None = None) -> None:
        self.client = client
        self.keep_ended = keep_ended
        self.ledger = ledger if ledger is not None else Ledger(CREDENTIAL_BYTES, Ledger(SERVER_BYTES))
        self._by_id: dict[str, Followed] = {}
        self._all: dict[Followed, None] = {}  # insertion-ordered: the oldest first
        self._chores: set[asyncio.Task[None]] = set()
        self._followers: set[asyncio.Task[None]] = set()

    def spawn(self, chore: Coroutine[Any, Any, None], follower: bool = False) -> None:
        """Run `chore` beyond the call that asked for it (held here until it ends). A `follower`
        (a fleet's reader of its members' events) lasts as long as its runs: when the server ends
        it is stopped once the runs are detached, where any other chore (a cancel) is awaited."""
        task = asyncio.create_task(chore)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)
        if follower:
            self._followers.add(task)
            task.add_done_callback(self._followers.discard)

    def reserve(self, runs: int = 1) -> Reservation:
        """Admit `runs` new runs: their floors held now (ended runs let go to make room), handed to
        each by `follow`/`add`; `OverBudget` if they do not fit. Use it as `with runs.reserve():`
        around the start, so a start that fails gives its floor back."""
        need = runs * RUN_FLOOR
        if not self.make_room(need):
            running = sum(1 for f in self._all if not f.done)
            raise OverBudget(self.ledger.refusal(need, running))
        self.ledger.add(need)
        return Reservation(self.ledger, need)

    def make_room(self, need: int) -> bool:
        """Let ended runs go, oldest first, until `need` more bytes fit; False if they never do."""
        while not self.ledger.fits(need):
            oldest = next((f for f in self._all if f.done), None)
            if oldest is None:
                return False
            self._forget(oldest)
        return True

    def follow(
        self, handle: RunHandle, hand: str, feed: Feed | None = None, held: Reservation | None = None
    ) -> Followed:
        f = self.add(Followed(handle, hand, feed=feed), held)
        f.task = asyncio.create_task(f.follow(), name=f"mcp-follow-{hand}")
        return f

    def add(self, f: Followed, held: Reservation | None = None) -> Followed:
        """Keep a run whose events someone else reads and hands to `f.take` (a fleet member: the
        fleet run reads its members' events), so `run_get`, `read_output` and `cancel` find it. Its
        floor comes from `held` (what admitted it), else it is added to the ledger as it stands."""
        f.ledger, f.held, f.make_room = self.ledger, held.take() if held is not None else 0, self.make_room
        f.settle()
        self._all[f] = None
        self._forget_old()
        return f

    def _forget_old(self) -> None:
        ended = [f for f in self._all if f.done]
        for f in ended[: max(0, len(ended) - self.keep_ended)]:
            self._forget(f)

    def _forget(self, f: Followed) -> None:
        del self._all[f]
        f.release()
        if f.run_id is not None and self._by_id.get(f.run_id) is f:
            del self._by_id[f.run_id]

    def get(self, run_id: str) -> Followed | None:
        self._index()
        return self._by_id.get(run_id)

    def _index(self) -> None:
        for f in self._all:
            if f.run_id is not None and f.run_id in self._by_id:
                continue
            if f.run_id is not None:
                self._by_id[f.run_id] = f

    async def adopt(self, run_id: str, hand: str) -> Followed:
        """Follow a run started elsewhere by this identity (another server's, one detached): `attach`
        takes it over, its output from where the previous consumer stopped. `OverBudget` as for a
        new run."""
        with self.reserve() as held:
            handle = await self.client.attach(run_id)
            f = self.follow(handle, hand, held=held)
        self._by_id[run_id] = f
        return f

    async def close(self, keep_s: float = DETACH_KEEP_S) -> None:
        """Detach every run still going (the Mind keeps it `keep_s`), then stop following."""
        for f in list(self._all):
            if not f.done and f.run_id is not None:
                with contextlib.suppress(MindhandError, OSError):
                    await asyncio.wait_for(f.handle.detach(keep_s), 5.0)
            if f.task is not None:
                f.task.cancel()
        for task in list(self._followers):
            task.cancel()
        await asyncio.gather(*self._chores, return_exceptions=True)
        await asyncio.gather(*(f.task for f in self._all if f.task is not None), return_exceptions=True)
        for f in self._all:  # the server's budget gets back what this credential held
            f.release()


async def wait(f: Followed, wait_s: float, progress: Progress | None) -> None:
    """Wait for the run's end for at most `wait_s`, sending progress as output comes (the run id in
    the first) and at least every `PROGRESS_EVERY_S`. Returns when it ended or the bound passed."""
    deadline = time.monotonic() + max(0.0, wait_s)
    sent = {"stdout": f.stdout.total, "stderr": f.stderr.total}
    count = 0.0
    announced = False
    while not f.done:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        f.changed.clear()
        if f.done:
            break
        if announced or progress is None or f.run_id is None:  # (a named run's id is told at once)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(f.changed.wait(), min(left, PROGRESS_EVERY_S))
        if progress is None:
            continue
        parts = []
        if not announced and f.run_id is not None:
            parts.append(f"run {f.run_id} on {f.hand}")
            announced = True
        for name in ("stdout", "stderr"):
            r = f.stream(name)
            if r.total > sent[name]:
                start, data = r.read(sent[name], PROGRESS_TEXT_MAX)
                sent[name] = r.total  # what does not fit is skipped here (progress is droppable)
                prefix = "" if name == "stdout" else "[stderr] "
                parts.append(prefix + data.decode("utf-8", "replace"))
        if not parts:
            parts.append(f"run {f.run_id} still running" if f.run_id else "starting")
        count += 1
        with contextlib.suppress(Exception):  # a progress that cannot be sent changes nothing
            await progress(count, "\n".join(parts))


async def cancel_for_peer(runs: Runs, f: Followed) -> None:
    """The agent cancelled the call (`notifications/cancelled`): a mindhand cancel of the run, then
    its end is awaited by the follower as for any run."""
    run_id = f.run_id
    if run_id is None or f.done:
        return
    with contextlib.suppress(ClientError, TimeoutError):
        await asyncio.wait_for(runs.client.cancel(run_id), 10.0)
