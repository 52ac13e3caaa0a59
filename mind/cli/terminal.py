"""The local terminal of `mind exec -t` and `mind shell`: raw mode, window size, SIGWINCH (DESIGN §11).

In a terminal run the remote pty does the line editing, the echo and the signals, so the local
terminal must do none of it: in raw mode every key (Ctrl-C, Ctrl-Z, Ctrl-D included) is a byte
for the remote program, and output is written as it comes, with no `\\n` -> `\\r\\n` of our own (the
remote terminal already did that). The mode is ssh's (`enter_raw_mode` in OpenSSH), set with
TCSADRAIN so keys typed ahead are not thrown away.

**Restored on every exit path.** A shell left in raw mode looks dead (no echo, Enter does nothing),
so the saved attributes are put back, exactly, however the CLI ends:
- the end of the `with` block: a normal end, the remote command's exit, the Mind dropping, an
  exception (a crash of the CLI is one: it unwinds through `finally`); KeyboardInterrupt from a
  SIGINT that `kill` sent (raw mode makes Ctrl-C a byte, but signals from elsewhere still arrive)
  is an exception too, under Python's default SIGINT handler;
- an `atexit` hook, for an interpreter that exits without unwinding this frame (`sys.exit` in a
  thread's excepthook, a `finally` elsewhere that exits first);
- signal handlers for the signals whose default action ends the process without unwinding
  (SIGHUP, SIGTERM, SIGQUIT, and SIGINT or SIGPIPE if the program set them to SIG_DFL): the
  handler restores the terminal, then the signal is raised again with its default action, so the
  CLI still dies by it and its parent sees the same status. A signal the program handles or
  ignores itself is left to it (its handler, then `finally`, does the rest).
- SIGTSTP (`kill -TSTP`; Ctrl-Z is a byte here) stops the CLI with the terminal restored, and
  SIGCONT puts raw mode back, as a job-control shell expects.

What cannot be caught cannot be helped: after `kill -9` of the CLI (or a crash of the interpreter
itself) the terminal stays raw, and the user's shell is the only help: `reset` or `stty sane`
(typed blind, ending with Ctrl-J), which is also what ssh users do.
"""

from __future__ import annotations

import atexit
import os
import signal
import termios
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any, NamedTuple

Attributes = list[Any]
"""What `termios.tcgetattr` returns: [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]."""

FATAL_SIGNALS: tuple[int, ...] = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGPIPE)
"""Watched while raw, where their disposition is SIG_DFL (see the module docstring)."""


class WindowSize(NamedTuple):
    rows: int
    cols: int


DEFAULT_SIZE = WindowSize(24, 80)
"""For a run whose local side is not a terminal (`mind exec -t` with stdin redirected)."""


def window_size(fd: int) -> WindowSize | None:
    """The terminal's size (TIOCGWINSZ), None when `fd` is not a terminal. 0 means "unknown", as
    the kernel has it; the remote side passes that on."""
    try:
        rows, cols = termios.tcgetwinsize(fd)
    except (termios.error, OSError):
        return None
    return WindowSize(rows, cols)


def terminal_type(env: Mapping[str, str] | None = None) -> str:
    """TERM for the remote terminal: the local one's, which is what the remote program must draw
    for. "dumb" when it is not set (the claim that promises the least)."""
    env = os.environ if env is None else env
    return env.get("TERM") or "dumb"


def raw_attributes(attrs: Attributes) -> Attributes:
    """`attrs` made raw the way ssh does it: no input translation or flow control, no signals from
    keys, no canonical editing or echo, no output processing, reads return each byte at once.
    The character size and parity (cflag) are left as they are."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = attrs
    iflag |= termios.IGNPAR
    iflag &= ~(
        termios.ISTRIP
        | termios.INLCR
        | termios.IGNCR
        | termios.ICRNL
        | termios.IXON
        | termios.IXANY
        | termios.IXOFF
        | getattr(termios, "IUCLC", 0)
    )
    lflag &= ~(
        termios.ISIG | termios.ICANON | termios.ECHO | termios.ECHOE | termios.ECHOK | termios.ECHONL | termios.IEXTEN
    )
    oflag &= ~termios.OPOST
    cc = list(cc)
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class RawMode:
    """`with RawMode(fd):` the terminal on `fd` is raw inside and exactly as it was outside, on
    every exit path the process can catch. Enter it from the main thread (signal handlers can only
    be installed there; elsewhere only `finally` and `atexit` restore)."""

    def __init__(self, fd: int = 0, signals: Iterable[int] = FATAL_SIGNALS) -> None:
        self.fd = fd
        self._signals = tuple(signals)
        self.saved: Attributes | None = None
        """The attributes found on entry, put back on exit."""
        self._installed: dict[int, Handler] = {}
        """Signals we handle, with the disposition they had before."""

    @property
    def active(self) -> bool:
        return self.saved is not None

    def __enter__(self) -> RawMode:
        self.enter()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()

    def enter(self) -> None:
        """Save the attributes, set raw mode, and watch the exits. Raises termios.error when `fd` is
        not a terminal (nothing is changed then)."""
        if self.active:
            return
        saved = termios.tcgetattr(self.fd)
        atexit.register(self.restore)
        self.saved = saved
        self._install()
        termios.tcsetattr(self.fd, termios.TCSADRAIN, self.attributes(saved))

    def attributes(self, saved: Attributes) -> Attributes:
        """The attributes set while active (a playback's cbreak mode overrides this)."""
        return raw_attributes(saved)

    def restore(self) -> None:
        """Put the saved attributes back and the signal dispositions as they were. Idempotent, and
        quiet when the terminal is gone (a hangup: nothing left to restore)."""
        saved, self.saved = self.saved, None
        if saved is None:
            return
        self._uninstall()
        atexit.unregister(self.restore)
        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
        except (termios.error, OSError):
            pass

    def _install(self) -> None:
        for sig in (*self._signals, signal.SIGTSTP):
            try:
                if signal.getsignal(sig) != signal.SIG_DFL:
                    continue  # the program's own handler, or ignored: left to it
                self._installed[sig] = signal.signal(sig, self._on_tstp if sig == signal.SIGTSTP else self._on_fatal)
            except (ValueError, OSError):  # not the main thread: finally and atexit still restore
                break

    def _uninstall(self) -> None:
        installed, self._installed = self._installed, {}
        for sig, previous in installed.items():
            try:
                if signal.getsignal(sig) in (self._on_fatal, self._on_tstp):  # nobody replaced ours since
                    signal.signal(sig, previous)
            except (ValueError, OSError):
                pass

    def _on_fatal(self, signum: int, _frame: FrameType | None) -> None:
        """Restore, then die by the same signal (its default action, now that ours is gone)."""
        self.restore()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum)  # only if the signal did not end us (it is blocked somewhere)

    def _on_tstp(self, signum: int, _frame: FrameType | None) -> None:
        """Stop with the terminal restored; on SIGCONT, save what the shell left and go raw again."""
        self.restore()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # stops here until SIGCONT
        try:
            self.enter()
        except termios.error:  # continued without a terminal: stay cooked
            pass


class WindowWatch:
    """SIGWINCH while a terminal run lasts: the handler only notes that the size may have changed,
    `changed()` reads it and returns it when it differs from the last one reported. A blocking loop
    that waits in `select` is woken by the signal when it has set `signal.set_wakeup_fd` (as
    `mind exec` does for Ctrl-C); the handler itself does no I/O, so it cannot interleave a frame
    with one being written."""

    def __init__(self, fd: int = 0, on_signal: Callable[[], None] | None = None) -> None:
        """`on_signal` runs inside the signal handler: keep it to setting a flag."""
        self.fd = fd
        self.last = window_size(fd)
        """The size last reported (initially the current one, which goes in the first frame)."""
        self._on_signal = on_signal
        self._dirty = False
        self._previous: Handler = None
        self._installed = False

    def __enter__(self) -> WindowWatch:
        self._previous = signal.signal(signal.SIGWINCH, self._on_winch)
        self._installed = True
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._installed:
            self._installed = False
            if signal.getsignal(signal.SIGWINCH) == self._on_winch:
                signal.signal(signal.SIGWINCH, self._previous)

    def _on_winch(self, _signum: int, _frame: FrameType | None) -> None:
        self._dirty = True
        if self._on_signal is not None:
            self._on_signal()

    @property
    def pending(self) -> bool:
        """A SIGWINCH arrived since the last `changed()`."""
        return self._dirty

    def changed(self) -> WindowSize | None:
        """The new size if it changed since the last report, else None (a SIGWINCH that did not
        change the size, or none at all)."""
        if not self._dirty:
            return None
        self._dirty = False
        size = window_size(self.fd)
        if size is None or size == self.last:
            return None
        self.last = size
        return size
