"""The `mind` program: one parser, two sides. `serve` and the local credential admin open the
Mind's own state (`mind.daemon.commands`); everything else is a client of a running Mind
(`mind.cli`). Only this module knows both, so the client side cannot grow a daemon import."""

from __future__ import annotations

DAEMON_COMMANDS = ("serve", "hand", "client")


def main(argv: list[str] | None = None) -> None:
    from mind.cli.main import parse, run
    from mind.cli.output import EXIT_CANCELLED

    args = parse(argv)
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
