"""The local ends of a streamed run for `mind exec` (DESIGN §11): our stdin becomes the run's `stdin`
stream, its `stdout`/`stderr` (or `pty`) streams become our stdout/stderr, byte for byte.

- Output is written by one thread per stream with plain blocking writes, so a slow reader of our
  stdout (a pipe into a slow command) blocks that thread only: the connection's loop keeps its
  keepalive and the other stream flowing. What is written is acknowledged, and only then may the
  Hand send more (credit): a slow reader slows the remote producer and nothing piles up here
  beyond one window per stream.
- A reader that went away (EPIPE: `mind exec ... | head`) stops that stream: the Hand is told
  (`closed`), closes the pipe, and the remote command gets SIGPIPE on its next write, as it would
  on one machine.
- stdin is read only while the Hand has granted credit; end of input closes the run's stdin.
- Nothing of mindhand's own is ever written into stdout: every notice goes to stderr.
"""

from __future__ import annotations

import errno
import os
import queue
import stat
import sys
import threading
from typing import Any

from mind.cli.escapes import Escape, EscapeFilter
from protocol import limits
from protocol.io.pipes import grow_pipe


class OutputStream:
    """One remote output stream written to a local file descriptor by its own thread. What was
    received, in what order, and what is acknowledged is the run follower's (mind/client/follow.py):
    this only writes, and counts what it wrote."""

    def __init__(self, name: str, fd: int | None, wake_fd: int, start: int = 0) -> None:
        """`fd` None: the bytes are counted, not written (`--json`). `start`: the offset this
        consumer begins at (`mind attach` takes over a stream under way)."""
        self.name = name
        self.fd = fd
        self.start = start
        self.delivered = 0
        """Bytes written to `fd`."""
        self.broken = False
        self.error: str | None = None
        self.closed_sent = False
        self._q: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._written = 0
        self._lock = threading.Lock()
        self._wake = wake_fd
        self._thread = threading.Thread(target=self._write_loop, name=f"mind-{name}", daemon=True)
        self._thread.start()

    def feed(self, data: bytes) -> None:
        """New bytes, in order (the follower checked them and dropped repeats): queued for the writer."""
        if data:
            self._q.put(data)

    def consumed(self) -> int:
        """The offset up to which the writer has taken the stream (written, or discarded once
        the reader went away)."""
        with self._lock:
            return self.start + self._written

    def finish(self, timeout: float | None = None) -> None:
        """Wait until everything queued is written (or the reader went away)."""
        self._q.put(None)
        self._thread.join(timeout)

    def _write_loop(self) -> None:
        while True:
            data = self._q.get()
            if data is None:
                return
            if self.fd is None:
                self.delivered += len(data)
            elif not self.broken:
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(self.fd, view) :]
                except OSError as exc:
                    self.broken = True  # EPIPE, or the descriptor is gone: the rest is discarded
                    if exc.errno not in (errno.EPIPE, errno.EBADF, errno.EINVAL):
                        self.error = exc.strerror
                else:
                    self.delivered += len(data)
            with self._lock:
                self._written += len(data)  # consumed, written or discarded: the Hand may go on
            try:
                os.write(self._wake, b"w")
            except OSError:
                pass


class InputStream:
    """Our stdin as the run's `stdin` stream, read only while the Hand has granted credit (the
    follower's: mind/client/follow.py keeps what was sent until the Hand consumed it, and resends
    from where the Hand stands after a cut). For a terminal run the keys pass through the `~`
    escape filter (mind/cli/escapes.py) first."""

    def __init__(self, fd: int = 0, escapes: EscapeFilter | None = None, window: int = limits.STREAM_WINDOW) -> None:
        self.fd = fd
        self.escapes = escapes
        self.pending: bytes | bytearray = b""
        """Read and filtered, not yet sent (the filter may give back a held `~`). One read is
        kept as the bytes it came in, and sent as they are when the credit allows."""
        self.eof_read = False
        self.done = False
        """End of input was sent (or stdin is not forwarded any more)."""
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            mode = 0
        if stat.S_ISFIFO(mode):  # read a chunk at a time, not the default pipe's 64 KiB
            grow_pipe(fd, window)
        self.always_ready = stat.S_ISREG(mode) or stat.S_ISBLK(mode)
        """A regular file cannot be waited on (epoll refuses it) and never blocks: read it whenever
        there is credit."""

    def wants_data(self, credit: int) -> bool:
        """Worth reading now: not at the end, and the Hand has room beyond what is pending."""
        return not self.done and not self.eof_read and credit > len(self.pending)

    def read(self, credit: int) -> list[Escape]:
        """Read what `fd` has (call when it is readable and `wants_data()`); the escapes typed."""
        n = min(credit - len(self.pending), limits.STREAM_CHUNK_MAX)
        try:
            data = os.read(self.fd, max(1, n))
        except OSError:
            data = b""  # a stdin that cannot be read is an empty one
        if not data:
            self.eof_read = True
            if self.escapes is not None:
                self._keep(self.escapes.flush())
            return []
        if self.escapes is None:
            self._keep(data)
            return []
        out, actions = self.escapes.feed(data)
        self._keep(out)
        return actions

    def _keep(self, data: bytes) -> None:
        if not self.pending:
            self.pending = data
        elif isinstance(self.pending, bytes):
            self.pending = bytearray(self.pending) + data
        else:
            self.pending += data

    def next_piece(self, credit: int) -> bytes | None:
        """The bytes to send now (at most `credit`), if any."""
        if self.done or not self.pending or credit <= 0:
            return None
        n = min(len(self.pending), credit, limits.STREAM_CHUNK_MAX)
        if n == len(self.pending) and isinstance(self.pending, bytes):
            data, self.pending = self.pending, b""  # as read: no copy
        else:
            data = bytes(self.pending[:n])
            self.pending = self.pending[n:]
        return data

    def at_end(self) -> bool:
        """Everything was read and sent: the end of input is due (once)."""
        if self.done or not self.eof_read or self.pending:
            return False
        self.done = True
        return True


class StreamPrinter:
    """The output of a run that was not streamed (`run_output` progress, an older Hand): written
    live, gaps left by dropped progress marked, and completed from the result's tail so the user
    always sees how the command ended."""

    def __init__(self) -> None:
        self.upto = {"stdout": 0, "stderr": 0}
        self.out = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    def chunk(self, stream: str, offset: int, data: bytes) -> None:
        if offset < self.upto[stream]:
            data = data[self.upto[stream] - offset :]
            offset = self.upto[stream]
            if not data:
                return
        if offset > self.upto[stream]:
            self._gap(stream, offset - self.upto[stream])
        f = self.out[stream]
        f.write(data)
        f.flush()
        self.upto[stream] = offset + len(data)

    def _gap(self, stream: str, n: int) -> None:
        sys.stderr.buffer.write(f"\n[mindhand: {n} bytes of {stream} not shown: progress cap]\n".encode())
        sys.stderr.buffer.flush()

    def finish(self, stream: str, tail: Any) -> None:
        total, data = tail.total, tail.data
        if self.upto[stream] >= total or not data:
            return
        self.chunk(stream, total - len(data), data)
