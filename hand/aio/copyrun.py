"""A copy run on the Hand (`put_file`, `get_file`): the file work of `hand.system.copy` connected to
the run's streams (`hand.aio.streams.RunStreams`), with the same credit windows as a process run.

An upload consumes the `stdin` stream: chunks are written on a file thread (the run's user's with
`--run-as`) and acknowledged only once written, so the client never has more than a window in
flight and the Mind never holds more than one. A download produces the `stdout` stream: a chunk is
read only while the client has credit, so a slow reader slows the disk reads, not the memory.

One copy id is written by one run at a time, whichever connection it came on: a resumed upload
that arrives while the interrupted one is still stopping waits for it (a lock per copy id), then
cuts the part file back to its own offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from hand.aio.streams import RunStreams
from hand.system.copy import READ_CHUNK, CopyFailed, Download, Upload
from hand.system.copytree import TreeDownload, TreeUpload
from hand.system.tools import StreamCall, ToolFailed
from protocol.control import RunControl
from protocol.errors import MindhandError

T = TypeVar("T")
_locks: dict[str, list[Any]] = {}
"""copy id -> [its lock, runs using it]: forgotten when the last one ends."""


class Interrupted(MindhandError):
    """The run was stopped (cancel, deadline, connection lost) before its stream ended."""


class _Sink:
    """`RunStreams`' pipes for an upload: stdin chunks are queued for the writer."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.ready = asyncio.Event()

    def write_stdin(self, data: bytes) -> None:
        self.chunks.append(data)
        self.ready.set()

    def close_stdin(self) -> None:
        self.eof = True
        self.ready.set()

    def pause_output(self, stream: str) -> None: ...
    def resume_output(self, stream: str) -> None: ...
    def close_output(self, stream: str) -> None: ...


class _Gate:
    """`RunStreams`' pipes for a download: open while the client has credit."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.gone = False

    def pause_output(self, stream: str) -> None:
        if stream == "stdout":
            self.open.clear()

    def resume_output(self, stream: str) -> None:
        if stream == "stdout":
            self.open.set()

    def close_output(self, stream: str) -> None:
        if stream == "stdout":
            self.gone = True
            self.open.set()

    def write_stdin(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...


async def _either(event: asyncio.Event, stopped: asyncio.Event) -> None:
    if event.is_set() or stopped.is_set():
        return
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def drive(call: StreamCall, streams: RunStreams, ctl: RunControl) -> dict[str, Any]:
    """Run the copy; its value, or `ToolFailed` (failed), or `Interrupted` (stopped)."""
    loop = asyncio.get_running_loop()

    def hop(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return loop.run_in_executor(call.executor, call.guard(partial(fn, *args)))

    stopped = asyncio.Event()
    unregister = ctl.cancellation.on_cancel(lambda _reason: stopped.set())
    try:
        if ctl.cancellation.cancelled:
            raise Interrupted("stopped before it began")
        if call.tree:
            if call.kind == "put":
                return await _upload(call.make(), streams, stopped, hop)
            return await _download_tree(call.make(), streams, stopped, hop)
        if call.kind == "put":
            assert call.copy_id is not None
            held = _locks.setdefault(call.copy_id, [asyncio.Lock(), 0])
            held[1] += 1
            try:
                async with held[0]:
                    return await _upload(call.make(), streams, stopped, hop)
            finally:
                held[1] -= 1
                if held[1] == 0:
                    _locks.pop(call.copy_id, None)
        return await _download(call.make(), streams, stopped, hop)
    except CopyFailed as exc:
        raise ToolFailed(exc.message) from None
    finally:
        unregister()


async def _upload(up: Upload | TreeUpload, streams: RunStreams, stopped: asyncio.Event, hop: Any) -> dict[str, Any]:
    if stopped.is_set():
        raise Interrupted("stopped before it began")
    await hop(up.open)
    sink = _Sink()
    streams.attach(sink)  # stdin that came early is fed now (at most a window)
    try:
        while True:
            await _either(sink.ready, stopped)
            if stopped.is_set():
                await hop(up.interrupt)
                raise Interrupted("the stream did not end")
            sink.ready.clear()
            chunks, sink.chunks = sink.chunks, []
            if chunks:
                written = await hop(up.write, chunks)
                streams.on_stdin_consumed(written)
            if sink.eof and not sink.chunks:
                value: dict[str, Any] = await hop(up.finish)
                return value
    except asyncio.CancelledError:
        up.interrupt()  # fsync and close by descriptor: no access check, fine on this thread
        raise


async def _download(down: Download, streams: RunStreams, stopped: asyncio.Event, hop: Any) -> dict[str, Any]:
    try:
        remaining = await hop(down.open)
        if streams.spec.output_limit < remaining:
            raise CopyFailed(
                f"the stream's output_limit ({streams.spec.output_limit}) is below the {remaining} bytes to send"
            )
        if down.offset == 0:
            down.hash_as_sent(streams.sent_hash("stdout"))
        gate = _Gate()
        streams.attach(gate)
        streams.on_output_end("stderr")
        while remaining > 0:
            await _either(gate.open, stopped)
            if stopped.is_set() or gate.gone:
                raise Interrupted("the reader went away")
            data = await hop(down.read, READ_CHUNK)
            remaining -= len(data)
            streams.on_output("stdout", data)
        streams.on_output_end("stdout")
        await _either(streams.flushed, stopped)
        if not streams.flushed.is_set():
            raise Interrupted("the stream did not end")
        value: dict[str, Any] = await hop(down.finish)
        return value
    finally:
        down.close()


async def _download_tree(down: TreeDownload, streams: RunStreams, stopped: asyncio.Event, hop: Any) -> dict[str, Any]:
    """A tree's files as one `stdout` stream: each read fills a chunk with as many (small) files as
    fit, so 5,000 files of 2 KiB are ~40 thread hops, not 5,000."""
    try:
        await hop(down.open)
        gate = _Gate()
        streams.attach(gate)
        streams.on_output_end("stderr")
        while True:
            await _either(gate.open, stopped)
            if stopped.is_set() or gate.gone:
                raise Interrupted("the reader went away")
            data = await hop(down.read, READ_CHUNK)
            if not data:
                break
            streams.on_output("stdout", data)
        streams.on_output_end("stdout")
        await _either(streams.flushed, stopped)
        if not streams.flushed.is_set():
            raise Interrupted("the stream did not end")
        value: dict[str, Any] = await hop(down.finish)
        return value
    finally:
        down.close()
