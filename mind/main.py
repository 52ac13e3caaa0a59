"""The `mind` program: one parser, two sides. `serve` and the local credential admin open the
Mind's own state (`mind.daemon.commands`); everything else is a client of a running Mind
(`mind.cli`). Only this module knows both, so the client side cannot grow a daemon import: it
hands the daemon's `add_parsers` to the client's assembly (mind/cli/main.py)."""

from __future__ import annotations

from typing import Any


def add_daemon_parsers(sub: Any) -> None:
    """The daemon's commands, imported only when the full parser is built (never by `mind exec`)."""
    from mind.daemon.commands import add_parsers

    add_parsers(sub)


DAEMON_WORDS = ("serve", "hand", "client")
"""The command words `add_daemon_parsers` adds: each is parsed by the daemon's parsers alone, never
importing a client command (tests/mind/test_cli_parse.py holds this to what they add)."""


def main(argv: list[str] | None = None) -> None:
    """The `mind` program. Every command runs inside `stdout_may_close`: `mind runs | head` ends as
    `ls | head` does (quiet, 141), whichever command printed, rather than each one catching it."""
    from protocol.io import gcstart

    gcstart.starting()
    from protocol.io.pipes import stdout_may_close

    stdout_may_close(lambda: command(argv))


def command(argv: list[str] | None) -> None:
    """Parse and run one command; always ends in SystemExit with its exit code."""
    import sys

    from mind.cli import exits
    from mind.cli.exits import EXIT_CANCELLED, EXIT_USAGE
    from mind.cli.main import parse, run

    words = list(sys.argv[1:] if argv is None else argv)
    if words in (["--version"], ["-V"]):  # answered without building a parser (224 -> ~30 ms)
        from protocol import __version__

        print(f"mind {__version__}")  # as argparse's `version` action says it
        raise SystemExit(0)
    ours = words[: words.index("--")] if "--" in words else words  # after `--`: the remote command's
    try:
        args = parse(words, daemon=[add_daemon_parsers], daemon_words=DAEMON_WORDS)
    except SystemExit as exc:  # argparse said why on stderr; a `--json` script gets an object too
        if exc.code == EXIT_USAGE and ("--json" in ours or "--events" in ours):
            exits.json_error("bad command-line usage (stderr says why)", EXIT_USAGE, "usage")
        raise
    if getattr(args, "json", False) or getattr(args, "events", False):
        exits.JSON_ERRORS = True  # every error exit prints a JSON object on stdout too (issue 14)
    try:
        raise SystemExit(run(args))
    except KeyboardInterrupt:
        raise SystemExit(EXIT_CANCELLED) from None
