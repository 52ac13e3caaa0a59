"""What the two sides of the `mind` program share on the command line: the client commands (mind/cli)
and the daemon's own (`mind serve` and the credential admin, mind/daemon/commands.py). Neither side
may import the other (tests/layout/test_layering.py), so what both need sits here, below both:

- the options both define (`--json`, `--label`), so a flag means one thing to every command;
- what both print for a person: terminal-safe text, tables, times;
- `CommandFailed` (`fail`): how a daemon command says it failed. It raises it, and the one caller of
  every handler (`mind.cli.main.run`) reports it exactly as a client command's `die` would (`mind:
  WHY` on stderr, the JSON error object under `--json`, the exit code): the daemon exits the CLI's
  way without importing the CLI.

Only the standard library and `protocol.errors`: `mind exec`'s fast path loads this module.
"""

from __future__ import annotations

from typing import Any, NoReturn

from protocol.errors import MindhandError

EXIT_USAGE = 2
"""Bad command-line usage (argparse's own code). Defined here so a daemon command can name it; the
CLI's exit-code table (mind/cli/exits.py) takes it from here."""


class CommandFailed(MindhandError):
    """A daemon command could not do what it was asked: the sentence for the operator and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def fail(message: str, code: int = 1) -> NoReturn:
    """End a daemon command with `message` and exit `code` (said by `mind.cli.main.run`)."""
    raise CommandFailed(message, code)


def json_output(sp: Any, help: str | None = None) -> None:
    """`--json`: one JSON document on stdout instead of the human output (errors too: mind/main.py)."""
    sp.add_argument("--json", action="store_true", help=help or "print JSON instead of a table or text")


def labels(sp: Any, help: str) -> None:
    """`--label K=V`, repeatable: the labels a Hand is given (`mind hand add`) or selected by (`mind hands`)."""
    sp.add_argument("--label", dest="labels", action="append", default=[], metavar="K=V", help=help)


def printable(text: object) -> str:
    """`text` safe for a terminal: every control character (C0, DEL, C1) becomes a visible escape
    (`\\x1b`, `\\n`), so a Hand's claim or reason cannot move the cursor, retitle the window or hide
    itself. Only for human output: JSON output is escaped by `json.dumps` already."""
    s = str(text)
    if all(" " <= c < "\x7f" or c > "\x9f" for c in s):
        return s
    return "".join(c if " " <= c < "\x7f" or c > "\x9f" else repr(c)[1:-1] for c in s)


def timestamp(t: float | None) -> str:
    """A wall-clock time for a table, local time to the second; `-` for none."""
    if not t:
        return "-"
    import datetime

    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: list[str], rows: list[list[str]]) -> None:
    """Columns aligned by their widest cell, every cell `printable`, no trailing blanks."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
