"""`mind config show`: the daemon's effective settings, each with its source, resolved exactly as
`mind serve` would with the same flags, environment and file (no daemon needed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from mind.cli import options
from mind.cli.exits import EXIT_USAGE, die


def add_parsers(sub: Any) -> None:
    from mind.config import FILE_HELP, GROUPS, KEYS
    from protocol.io.settings import add_flags

    cf = options.command(sub, "config", help="show the daemon's effective settings and where each comes from")
    cfs = cf.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cfs.add_parser(
        "show",
        help="print every setting of `mind serve`, its value and its source",
        description="Resolve the settings exactly as `mind serve` would with the same flags, "
        "environment and file, and print each value with its source.",
    )
    add_flags(show, KEYS, GROUPS, {}, file_help=FILE_HELP)
    options.json_output(show, "a JSON object instead of a table")
    show.set_defaults(handler=show_settings)


def show_settings(args: argparse.Namespace) -> int:
    from mind.config import settings_source
    from protocol.io.settings import ConfigError, format_table

    source = settings_source(args)
    try:
        settings = source.load()
    except ConfigError as exc:
        die(str(exc), EXIT_USAGE)
    rows = settings.show()
    if args.json:
        print(json.dumps({"file": settings.file, "settings": rows}, indent=2))
    else:
        print(f"# config file: {source.describe(settings)}")
        print(format_table(rows))
    return 0
