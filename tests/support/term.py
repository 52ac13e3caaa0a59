"""A CLI on the slave side of a real pseudo-terminal, typed at from the master side: the terminal
tests' and the recording tests' user at a keyboard."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time


class Term:
    """The CLI running on the slave side of a fresh pty; the test types on the master side."""

    def __init__(self, env: dict[str, str], argv: list[str], rows: int = 24, cols: int = 80) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the CLI, on the pty as its controlling terminal
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.set_size(rows, cols, signal_cli=False)
        self.out = b""
        self.status: int | None = None

    def set_size(self, rows: int, cols: int, signal_cli: bool = True) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))  # the kernel sends SIGWINCH

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, what: bytes, timeout: float = 20.0) -> bytes:
        deadline = time.monotonic() + timeout
        while what not in self.out:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{what!r} not seen; output so far: {self.out[-800:]!r}")
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the CLI is gone
                    data = b""
                if not data:
                    raise AssertionError(f"{what!r} not seen before the end; output: {self.out[-800:]!r}")
                self.out += data
        return self.out

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.status is None:
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if r:
                try:
                    self.out += os.read(self.fd, 65536)
                except OSError:
                    pass
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
            elif time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                raise AssertionError(f"the CLI did not end; output: {self.out[-800:]!r}")
        return self.status

    def attrs(self) -> list:
        return termios.tcgetattr(self.fd)

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)
