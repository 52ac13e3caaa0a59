"""The runs this server follows for its agents: each one's output as it comes (kept for `read_output`),
its end, and a wait bounded by the call's `wait_s` that reports progress while it waits.

A run belongs to the server, not to the tool call that started it: the call waits on it and goes
away (its `wait_s` passed, its client cancelled it, its HTTP response stream closed), the run goes on
and is still followed, so a later `run_get` or `read_output` finds it, its output is read off the
Hand (a run nobody reads stops on flow control) and its end is seen. When the server ends, every
run still going is detached with `keep_s`: the Mind keeps it unattended, and `run_get` from the next
server (the same credential) attaches to it again.
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
per stream); an older one is answered from the Mind's record (the last 4 KiB of each stream)."""
DETACH_KEEP_S = 3600.0
"""When the server ends, a run still going is kept this long by the Mind (capped by its --keep-max)."""

Progress = Callable[[float, str], Awaitable[None]]
"""Sends one progress notification: a number that only grows, and a message."""


class Feed:
    """A run's standard input kept open for `write_stdin`: what each call gives, in order, then its end."""

    def __init__(self, first: bytes | None = None) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False
        if first:
            self._queue.put_nowait(first)

    def write(self, data: bytes, eof: bool) -> None:
        if data:
            self._queue.put_nowait(data)
        if eof:
            self.closed = True
            self._queue.put_nowait(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (data := await self._queue.get()) is not None:
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

    @property
    def run_id(self) -> str | None:
        return self.handle.run_id

    @property
    def done(self) -> bool:
        return self.end is not None or self.failure is not None

    def stream(self, name: str) -> Retained:
        return self.stdout if name == "stdout" else self.stderr

    def take(self, ev: object) -> None:
        """One event of the run: its output kept, its end noted, its waiters woken."""
        if isinstance(ev, StreamData) and ev.data:
            self.stream(ev.stream).append(ev.data)
        elif isinstance(ev, RunEnd):
            self.end = ev
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
            self.changed.set()


class Runs:
    """The runs followed on one connection to the Mind (one credential), by run id. Ended runs are
    kept for `read_output` up to `keep_ended` of them (the oldest forgotten first): a server that
    lives for weeks holds at most that many runs' retained output, not every run it ever saw."""

    def __init__(self, client: MindClient, keep_ended: int = KEEP_ENDED) -> None:
        self.client = client
        self.keep_ended = keep_ended
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

    def follow(self, handle: RunHandle, hand: str, feed: Feed | None = None) -> Followed:
        f = Followed(handle, hand, feed=feed)
        f.task = asyncio.create_task(f.follow(), name=f"mcp-follow-{hand}")
        self._all[f] = None
        self._forget_old()
        return f

    def add(self, f: Followed) -> Followed:
        """Keep a run whose events someone else reads and hands to `f.take` (a fleet member: the
        fleet run reads its members' events), so `run_get`, `read_output` and `cancel` find it."""
        self._all[f] = None
        self._forget_old()
        return f

    def _forget_old(self) -> None:
        ended = [f for f in self._all if f.done]
        for f in ended[: max(0, len(ended) - self.keep_ended)]:
            del self._all[f]
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
        takes it over, its output from where the previous consumer stopped."""
        handle = await self.client.attach(run_id)
        f = self.follow(handle, hand)
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
