"""A background task's log files on the Hand: the combined log and one file per stream, written on
the event loop as the output arrives and read back in pages (`hand.aio.tasks` performs both).

- The log keeps the HEAD, bounded by `log_max` bytes: offsets stay stable for paging, and the
  first bytes (the command line echo, the first error) are usually the ones worth keeping. Past
  the bound nothing more is written and `truncated` is set. Chunks are appended on the event loop:
  a page-cache append of at most a pipe buffer takes microseconds, and a single writer keeps
  stdout and stderr interleaved in arrival order. Beside that combined log each stream has a file
  of its own, bounded the same way (`TaskLog`), so `task logs --stream stderr` pages by stable
  offsets in that stream's bytes; a task logged before that answers `no_stream_log` for it.
- Files are private (0600 from the first byte) and never opened through a symlink.
"""

from __future__ import annotations

import os
from pathlib import Path

from hand.core.tasks import at_eof, page_length
from protocol.messages import TaskLogPage
from protocol.states import TaskState


class LogSink:
    """Append-only, head-bounded log file of one task (0600). Stops writing at `cap` bytes and
    sets `truncated`; a write error stops writing too and is remembered as `error`."""

    def __init__(self, path: Path, cap: int) -> None:
        self.cap = cap
        self.size = 0
        self.truncated = False
        self.error: str | None = None
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        os.fchmod(self._fd, 0o600)

    def append(self, data: bytes) -> None:
        if not data:
            return
        if self._fd is None:  # closed at the bound (or by a write error): drop, and say so
            self.truncated = True
            return
        room = self.cap - self.size
        piece = data if len(data) <= room else data[:room]
        try:
            view = memoryview(piece)
            while view:
                n = os.write(self._fd, view)
                self.size += n
                view = view[n:]
        except OSError as exc:
            self.error = f"task log write failed: {exc.strerror or exc}"
            self.truncated = True
            self.close()
            return
        if len(piece) < len(data):
            self.truncated = True
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_log(path: Path, offset: int, length: int) -> bytes:
    if length <= 0:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return b""
    try:
        chunks: list[bytes] = []
        got = 0
        while got < length:
            chunk = os.pread(fd, length - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class TaskLog:
    """The log of one task, as three `LogSink`s bounded at the same `cap`: the combined file (both
    streams in arrival order: its size is the row's `log_bytes`, its offsets the ones `task logs`
    pages by, exactly as before streams were kept apart) and one file per stream (issue 14: `task
    logs --stream`, offsets in that stream's bytes). Keeping the streams apart costs at most the
    bytes once more; it never changes the combined log.

    The stream files are created first: a combined file without them is a task logged before they
    existed (`stream_log_size` says so), never a task of this Hand that lost one."""

    def __init__(self, path: Path, stream_paths: dict[str, Path], cap: int) -> None:
        self.streams: dict[str, LogSink] = {}
        try:
            for stream, stream_path in stream_paths.items():
                self.streams[stream] = LogSink(stream_path, cap)
            self.combined = LogSink(path, cap)
        except BaseException:
            for sink in self.streams.values():
                sink.close()
            raise

    @property
    def size(self) -> int:
        return self.combined.size

    @property
    def truncated(self) -> bool:
        return self.combined.truncated

    @property
    def error(self) -> str | None:
        """The first write error of any of the files: part of the log is missing, and the task says so."""
        for sink in (self.combined, *self.streams.values()):
            if sink.error is not None:
                return sink.error
        return None

    def append(self, stream: str, data: bytes) -> None:
        self.combined.append(data)
        self.streams[stream].append(data)

    def close(self) -> None:
        self.combined.close()
        for sink in self.streams.values():
            sink.close()


def stream_log_size(path: Path, combined: Path) -> int | None:
    """(in a thread) The bytes in a stream's file now: 0 while the task has no log at all (not
    started yet, or its log could not be opened); None for a task logged before streams were kept
    apart (a combined file, no stream file). The combined file is looked at first: it is created
    after the stream files, so a task starting meanwhile is never taken for an old one."""
    if not combined.exists():
        return 0
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def log_page(
    task_id: str,
    path: Path,
    offset: int,
    limit: int,
    size: int,
    state: TaskState,
    truncated: bool,
    terminal: bool,
) -> TaskLogPage:
    """(in a thread) One page of a log file whose known size is `size`: never past it, so a page
    never shows bytes the `log_bytes` beside it does not count; `eof` once a finished task's log
    is read to its end."""
    data = read_log(path, offset, page_length(offset, limit, size))
    end = offset + len(data)
    return TaskLogPage(
        task_id=task_id,
        offset=offset,
        data=data,
        next_offset=end,
        log_bytes=size,
        state=state,
        truncated=truncated,
        eof=at_eof(end, size, terminal),
    )
