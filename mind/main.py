"""The `mind` program: one parser, two sides. `serve` and the local credential admin open the
Mind's own state (`mind.daemon.commands`); everything else is a client of a running Mind
(`mind.cli`). Only this module knows both, so the client side cannot grow a daemon import."""

from __future__ import annotations

DAEMON_COMMANDS = ("serve", "hand", "client")


def main(argv: list[str] | None = None) -> None:
    import sys

    from mind.cli import output
    from mind.cli.main import parse, run
    from mind.cli.output import EXIT_CANCELLED, EXIT_USAGE

    words = list(sys.argv[1:] if argv is None else argv)
    ours = words[: words.index("--")] if "--" in words else words  # after `--`: the remote command's
    try:
        args = parse(argv)
    except SystemExit as exc:  # argparse said why on stderr; a `--json` script gets an object too
        if exc.code == EXIT_USAGE and ("--json" in ours or "--events" in ours):
            output.json_error("bad command-line usage (stderr says why)", EXIT_USAGE, "usage")
        raise
    if getattr(args, "json", False) or getattr(args, "events", False):
        output.JSON_ERRORS = True  # every error exit prints a JSON object on stdout too (issue 14)
    try:
        if args.cmd == "serve":
            from mind.daemon.commands import cmd_serve

            cmd_serve(args)
        elif args.cmd in DAEMON_COMMANDS:
            from mind.daemon.commands import cmd_credentials

            cmd_credentials(args)
        else:
            run(args)
    except KeyboardInterrupt:
        raise SystemExit(EXIT_CANCELLED) from None
