"""The escape sequences of a terminal session, in ssh's convention, as a pure state machine.

In raw mode every key goes to the remote program, Ctrl-C included, so leaving needs a sequence no
program is likely to want: ssh's `~` at the start of a line. The rules are ssh's own (OpenSSH
`process_escapes`), so the habit carries over:

- `~` is an escape only at the very start of the session or right after a newline (CR or LF):
  typed mid-line (`cd ~/src`) it is an ordinary byte.
- `~.` leaves. What was typed before it is still sent; what follows it is not.
- `~?` shows the list of escapes (nothing is sent, and a `~` right after it is an escape again).
- `~~` sends one `~` (how to type a line that starts with `~.`).
- `~` followed by any other byte sends both.

A `~` at the start of a line is held until the next byte says what it is, across reads (a key per
read is the usual case in raw mode); `flush()` gives it back when the input ends. No I/O here: the
CLI feeds what it read from its terminal and gets what to send and what to do.
"""

from __future__ import annotations

from enum import Enum

NEWLINES = frozenset(b"\r\n")
DEFAULT_ESCAPE = ord("~")


class Escape(Enum):
    LEAVE = "leave"
    """`~.`: end the session here (the run is cancelled as for a client disconnect)."""
    HELP = "help"
    """`~?`: show `help_text()` on the local terminal."""


def help_text(escape: int = DEFAULT_ESCAPE) -> str:
    """The list `~?` shows, with CRLF line ends: the local terminal is in raw mode (no output
    processing), so a bare LF would not return the cursor."""
    e = chr(escape)
    lines = (
        "Supported escape sequences:",
        f" {e}.   - leave (the remote command is cancelled)",
        f" {e}?   - this message",
        f" {e}{e}   - send the escape character by typing it twice",
        "(Note that escapes are only recognized immediately after newline.)",
    )
    return "\r\n".join(lines) + "\r\n"


class EscapeFilter:
    """Feed it what the user typed; it returns the bytes to send and the escapes to act on.

    `escape` is the escape character (ssh's `-e`), None to recognise none at all (`-e none`: every
    byte is sent as is)."""

    def __init__(self, escape: int | None = DEFAULT_ESCAPE) -> None:
        self.escape = escape
        self._line_start = True
        """The last byte passed on was a newline, or none was yet: a `~` now is an escape."""
        self._pending = False
        """A `~` at the start of a line was held; the next byte decides."""
        self.left = False
        """`~.` was seen: the session is over and later input is ignored."""

    def feed(self, data: bytes) -> tuple[bytes, list[Escape]]:
        if self.left:
            return b"", []
        if self.escape is None:
            return bytes(data), []
        out = bytearray()
        actions: list[Escape] = []
        for byte in data:
            if self._pending:
                self._pending = False
                if byte == ord("."):
                    self.left = True
                    actions.append(Escape.LEAVE)
                    return bytes(out), actions
                if byte == ord("?"):
                    actions.append(Escape.HELP)
                    continue  # still at the start of a line
                if byte != self.escape:
                    out.append(self.escape)
                # the byte after the escape is an ordinary one, `~` itself included
            elif self._line_start and byte == self.escape:
                self._pending = True
                continue
            self._line_start = byte in NEWLINES
            out.append(byte)
        return bytes(out), actions

    def flush(self) -> bytes:
        """At the end of input: a `~` still held was an ordinary byte after all; send it."""
        if self._pending and not self.left and self.escape is not None:
            self._pending = False
            self._line_start = False
            return bytes([self.escape])
        return b""
