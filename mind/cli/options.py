"""The options several `mind` commands share, each defined once, and the help formatters. A command
module (mind/cli/exec.py, task.py, ...) builds its parser from these, so `--env` or `--mind` cannot
mean one thing to `mind exec` and another to `mind task start`. The two the daemon's commands take
too (`--json`, `--label`) are defined below both sides, in mind/commandline.py, and named here as well."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

# defined below both sides (mind/commandline.py): the daemon's commands take them too
from mind.commandline import json_output as json_output
from mind.commandline import labels as labels

EXEC_TIMEOUT_S = 3600.0
"""`mind exec`'s default deadline. ssh has none; ours kills the command's tree when it passes and says
so on stderr (README "Timeouts"). A default exists because a run nobody bounds holds a Hand's run
slot and the Mind's registry entry until the Hand restarts; an hour covers interactive use, and
a longer job is a `mind task` (24 h, durable) or an explicit `--timeout` (at most 86400)."""


class Help(argparse.HelpFormatter):
    """argparse's formatter, minus one import: it loads `shutil` (with bz2 and lzma) only to learn
    the terminal width, and builds a formatter for every option it adds."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        if width is None:
            try:
                width = int(os.environ["COLUMNS"])
            except (KeyError, ValueError):
                try:
                    width = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
                except (AttributeError, ValueError, OSError):
                    width = 0
            width = (width or 80) - 2
        super().__init__(prog, indent_increment, max_help_position, width)


class TableHelp(Help):
    """`Help` that keeps the description's and epilog's lines as written: for a table of exit codes."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


def command(sub: Any, name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand's parser, with our formatter unless the caller names another."""
    kwargs.setdefault("formatter_class", Help)
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, **kwargs)
    return parser


def connection(sp: argparse.ArgumentParser) -> None:
    """Where the Mind is and who we are to it (mind/cli/connection.py reads them)."""
    sp.add_argument(
        "--mind",
        action="append",
        help="Mind URL; repeat it (or give a comma list) for Mind nodes sharing one database: any serves "
        "(default $MINDHAND_URL, then the local Mind's mind.url)",
    )
    sp.add_argument("--credential", help="client credential file (default $MINDHAND_CREDENTIAL, then admin.cred)")
    sp.add_argument("--ca", help="CA file to verify a wss:// Mind (default $MINDHAND_CA, else system trust)")
    sp.add_argument("--pin", help="require the Mind's certificate to be sha256:HEX (default $MINDHAND_PIN)")


def hand(sp: argparse.ArgumentParser | Any, required: bool = True, help: str = "the Hand's name") -> None:
    sp.add_argument("--hand", required=required, help=help)


def duration(text: str) -> float:
    """The `type` of every duration option (`--timeout`, `--grace`, `--keep`, ...): seconds from
    `90`, `90s`, `5m`, `2h`, `1.5h`, by the one parser the daemons' settings use too
    (`protocol.units`), so no option wants "a number" where its neighbour takes `5m`. 0 is a value
    here; whether an option accepts it is the option's own check."""
    from protocol.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def timeout(sp: argparse.ArgumentParser, default: float, what: str) -> None:
    """`--timeout DURATION` for a request or a run; `what` says what happens when it passes."""
    hours = f", {default / 3600:g} h" if default >= 3600 else ""
    sp.add_argument(
        "--timeout",
        type=duration,
        default=default,
        metavar="DURATION",
        help=f"time before {what} (e.g. 90, 90s, 5m, 2h; default {default:g} s{hours})",
    )


def place(sp: argparse.ArgumentParser) -> None:
    """`--cwd` and `--env`: where and with what the command runs on the Hand."""
    sp.add_argument("--cwd", help="working directory on the Hand, inside its root")
    sp.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment variable (repeatable)")


def program(sp: argparse.ArgumentParser, words: str = "the command (after --)") -> None:
    """What to run: `--shell COMMAND` or the words after `--` (mind/cli/toolargs.py builds the call)."""
    sp.add_argument("--shell", metavar="COMMAND", help="run COMMAND through /bin/sh -c")
    sp.add_argument("argv", nargs="*", metavar="WORD", help=words)


def limits(sp: argparse.ArgumentParser) -> None:
    """The run's `limits` (mind/cli/toolargs.py reads them). `--memory`, `--pids` and `--cpus` are the
    run's cgroup's: a Hand without cgroups (`mind hands --json`: `cgroups`, `limits`) refuses them."""
    g = sp.add_argument_group(
        "resource limits (applied by the Hand to the run; it may cap them, and refuses one it cannot enforce)"
    )
    g.add_argument("--cpu-seconds", type=int, help="CPU budget for the whole tree; exhausted -> budget_exhausted (123)")
    g.add_argument(
        "--memory",
        metavar="SIZE",
        help="memory the whole run may use, e.g. 512M (at least 1M); past it the kernel kills it: failed, "
        "out_of_memory (137). Needs the Hand's cgroups",
    )
    g.add_argument(
        "--pids",
        type=int,
        metavar="N",
        help="processes and threads of the run at once; a fork past it fails. Needs the Hand's cgroups",
    )
    g.add_argument(
        "--cpus",
        metavar="X",
        help="the run's CPU share, e.g. 0.5 (half of one CPU), 2 (two CPUs). Needs the Hand's cgroups",
    )
    g.add_argument("--address-space", metavar="SIZE", help="address space per process (e.g. 4G)")
    g.add_argument("--max-files", type=int, help="open files per process")
    g.add_argument("--max-procs", type=int, help="processes of the user (mostly useful with the Hand's --run-as)")


def max_concurrency(sp: argparse.ArgumentParser | Any, help: str) -> None:
    sp.add_argument("--max-concurrency", default="50", metavar="N|P%", help=help)


def fleet(sp: argparse.ArgumentParser) -> None:
    """How a fleet run (`--hands SELECTOR`) proceeds: mind/core/fleet.py decides by these."""
    g = sp.add_argument_group("fleet runs (with --hands)")
    max_concurrency(g, "runs in flight at most (default 50)")
    g.add_argument(
        "--max-errors",
        default="0",
        metavar="N|P%",
        help="failures allowed before no new run starts (default 0: the first failure stops new starts)",
    )
    g.add_argument(
        "--deliver-within",
        metavar="DURATION",
        help="offline Hands may join until then (e.g. 5m), else undeliverable (default: hand_offline at once)",
    )
    g.add_argument("--fail-fast", action="store_true", help="a budget of 0, and runs in flight are cancelled")
    g.add_argument("--group", action="store_true", help="print each Hand's output together when it ends")
    g.add_argument("--dry-run", action="store_true", help="print the selection; run nothing")
