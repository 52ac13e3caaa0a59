"""A one-line status for long waits on a terminal ("is it hung, or waiting for something?").

It writes to its stream only when that stream is a terminal: `\\r<text>\\x1b[K` (back to column 0,
the text, erase the rest of the line), so each update replaces the last and `clear()` leaves an
empty line for whatever is written next. Piped or redirected, it writes nothing at all: scripts
parse our stderr, and a status line is for a person watching. Updates are rate-limited; the text is
cut to the terminal's width (a wrapped line could not be erased with `\\r`).

The caller clears it before writing anything else (output, a final message), so a status line
never ends up mixed into what the command printed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

SPINNER = "|/-\\"


def elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def is_terminal(stream: TextIO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty() and os.environ.get("TERM") != "dumb")
    except (OSError, ValueError, AttributeError):  # closed or not a real stream
        return False


class Status:
    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        min_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled and is_terminal(self.stream)
        self.min_interval = min_interval
        self._clock = clock
        self._last = float("-inf")
        self._frame = 0
        self.shown = False

    def show(self, text: str, *, force: bool = False) -> None:
        """Replace the status line with `text` (at most every `min_interval` unless `force`)."""
        if not self.enabled:
            return
        now = self._clock()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        spin = SPINNER[self._frame % len(SPINNER)]
        self._frame += 1
        clean = "".join(c if c.isprintable() else "?" for c in text)
        line = f"{spin} {clean}"[: max(10, self._width() - 1)]
        self._write(f"\r{line}\x1b[K")
        self.shown = True

    def clear(self) -> None:
        """Erase the status line (no-op if none is shown), before anything else is written."""
        if self.shown:
            self.shown = False
            self._write("\r\x1b[K")
            self._last = float("-inf")

    def __enter__(self) -> Status:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop trying
            self.enabled = False

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 80
        except (OSError, ValueError, AttributeError):
            return 80
