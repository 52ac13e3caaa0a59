"""The one writer of the Hand's task database: writes that wait together are committed together
(`GroupCommit`), one transaction and one fsync for many."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from hand.core.rows import Write
from hand.system.taskdb import TaskStore

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class GroupCommit:
    """The one writer of the task database: every write waits here, and one owned task commits
    all the writes that are waiting in ONE transaction (`TaskStore.write_many`: one fsync for
    many), then wakes each writer once ITS write is committed (or with its own error). While a
    commit is in progress the next writes queue up and share the next one: a batch of admitted
    starts, RUNNING and terminal transitions ride together. Measured on a VM disk, the fsyncs of
    `synchronous=FULL` were a third of a task's CPU (mostly kernel time) and serialised every
    start behind the previous one's: sharing them is the throughput."""

    def __init__(self, store: TaskStore, spawn: Spawn) -> None:
        self._store = store
        self._spawn = spawn
        self._waiting: list[tuple[Write, asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def write(self, write: Write) -> Any:
        """The write's result (see `TaskStore.write_many`) once committed; its error otherwise."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((write, fut))
        if self._drainer is None:
            try:
                self._drainer = self._spawn(self._drain())
            except RuntimeError:  # the owner is closing: commit this one alone, here
                self._waiting.pop()
                return _result(await asyncio.to_thread(self._store.write_many, [write]))
        return await fut

    async def idle(self) -> None:
        """Wait until every write handed over so far is committed (or failed)."""
        if self._drainer is not None:
            await asyncio.wait({self._drainer})

    async def _drain(self) -> None:
        batch: list[tuple[Write, asyncio.Future[Any]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = await asyncio.to_thread(self._store.write_many, [w for w, _ in batch])
                except Exception as exc:  # the commit failed: no write of the batch is done
                    results = [exc] * len(batch)
                for (_, fut), result in zip(batch, results, strict=True):
                    if fut.done():  # its writer was cancelled
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
                batch = []
        except BaseException:  # cancelled with the owner: nobody is left to wait
            for _, fut in batch + self._waiting:
                fut.cancel()
            self._waiting = []
            raise
        finally:
            self._drainer = None  # no await since the last look at `_waiting`: nothing is stranded


def _result(results: list[Any]) -> Any:
    if isinstance(results[0], BaseException):
        raise results[0]
    return results[0]
