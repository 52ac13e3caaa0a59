"""The `mind` command assembled: the top-level parser, one family of subcommands per module, and the
fast path that builds only `mind exec`'s parser for `mind exec` (and `mind shell`); any other client
command is parsed by its own family's parser alone (`FAMILIES`).

A command module (mind/cli/exec.py, cp.py, forward.py, call.py, task.py, views.py, config.py; the
daemon's own in mind/daemon/commands.py) has `add_parsers(sub)`, which adds its subcommands built from the shared
options (mind/cli/options.py) and sets each one's `handler` (args -> exit code). Dispatch is
`args.handler(args)`: no table of names to keep in step.

Exit codes of `mind exec` / `mind call` (a good remote shell's, plus distinct codes for what ssh
cannot tell you):
  the remote exit code      when the command ran to an exit (succeeded or failed)
  128+N                     the remote command was killed by signal N (not by us)
  124                       timed out (the run's deadline passed; the process tree was killed)
  130                       cancelled (Ctrl-C, or another client cancelled it)
  123                       budget exhausted
  125                       refused: rejected by the Hand, Hand offline or unknown, bad request,
                            Mind unreachable, authentication failed
  255                       lost: the outcome is unknown (the Hand's connection or the Mind went away
                            for longer than the Mind's resume window), or a newer `mind attach` took
                            the run over
  121                       `mind exec --wait D`: D passed and the run goes on (`mind attach RUN_ID`)
  2                         bad command-line usage
`mind exec --hands` (a fleet run) exits 0 when every selected Hand succeeded, else one aggregate code:
  118 some Hands unreached (offline / undeliverable), every run that started succeeded;
  120 some runs did not succeed, within the error budget; 119 the budget stopped the fleet (some
  not_started); 130 cancelled (Ctrl-C); 255 the connection to the Mind was lost; 2 bad usage or an
  empty selection (README "Fleet runs").
`mind exec` imports only its own modules (no asyncio, no pydantic: tests/integration/test_cli_fastpath.py);
the full parser imports every command module, and `cp` and `task` bring the asyncio client with them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any

from mind import __version__
from mind.cli.options import Help

AddParsers = Callable[[Any], None]
"""A command module's `add_parsers(sub)`: adds its subcommands to the `mind` parser's subparsers."""

FAST = ("exec", "shell", "attach")
"""The commands parsed by a parser that knows only them (mind/cli/exec.py)."""


def top_parser() -> tuple[argparse.ArgumentParser, Any]:
    p = argparse.ArgumentParser(
        prog="mind", description="mindhand: run commands and tools on remote machines.", formatter_class=Help
    )
    p.add_argument("--home", help="state directory (default $MINDHAND_HOME or ~/.local/state/mindhand)")
    p.add_argument("--version", action="version", version=f"mind {__version__}")
    return p, p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")


def client_families() -> list[AddParsers]:
    """Every client command module's `add_parsers`, in the order `mind --help` lists them."""
    from mind.cli import call, config, cp, exec, forward, mcp, recordings, task, views

    return [
        config.add_parsers,
        views.add_parsers,
        recordings.add_parsers,
        exec.add_parsers,
        cp.add_parsers,
        forward.add_parsers,
        call.add_parsers,
        task.add_parsers,
        mcp.add_parsers,
    ]


FAMILIES = {
    "config": "config",
    "hands": "views",
    "run": "views",
    "runs": "views",
    "status": "views",
    "play": "recordings",
    "recordings": "recordings",
    "cp": "cp",
    "forward": "forward",
    "call": "call",
    "task": "task",
    "mcp": "mcp",
}
"""Each client command word and the module (`mind.cli.<module>`) whose `add_parsers` adds it: a
command is parsed by a parser of its own family only (`mind cp` spent 0.34 s of its start building,
and importing what builds, every family's parser; the asyncio client and pydantic's models are
the part it needs). `tests/mind/test_cli_parse.py` holds this table to what the families add."""


def family_parser(word: str) -> argparse.ArgumentParser | None:
    """The `mind` parser with only the family that has the command `word` (None: not a client
    command of a family, such as the daemon's or a misspelt one: the full parser says which)."""
    import importlib

    module = FAMILIES.get(word)
    if module is None:
        return None
    p, sub = top_parser()
    importlib.import_module(f"mind.cli.{module}").add_parsers(sub)
    return p


def parser(daemon: Sequence[AddParsers] = ()) -> argparse.ArgumentParser:
    """The whole `mind` parser: `daemon` are the daemon's families (mind.main passes them: this
    module never imports the daemon), then every client command."""
    p, sub = top_parser()
    for add in [*daemon, *client_families()]:
        add(sub)
    return p


def command_at(argv: list[str]) -> int | None:
    """Where the subcommand is named in `argv`, if it comes right after the global options."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--home":
            i += 2
        elif a.startswith("--home="):
            i += 1
        else:
            return None if a.startswith("-") else i
    return None


def command_word(argv: list[str]) -> str | None:
    """The subcommand named in `argv`, if it comes right after the global options."""
    at = command_at(argv)
    return None if at is None else argv[at]


def parse(
    argv: list[str] | None = None, daemon: Sequence[AddParsers] = (), daemon_words: Collection[str] = ()
) -> argparse.Namespace:
    """`mind exec` is the command people run in loops and scripts: it is parsed by a parser that
    knows only it (the same definition, mind/cli/exec.py), so its start does not pay for building,
    and importing what builds, every other command's options. Anything else gets the full parser.
    `mind exec HAND CMD ARGS...` takes its command as ssh does, options and all, which argparse
    cannot say: its words are split first (`exec.split_command`: ours, then the command's tail) and
    only ours are parsed. A command that reads more than argparse can say finishes the namespace in
    its `resolve(args, tail, unrecognized)`. The daemon's commands (`daemon_words`: `mind serve`,
    `mind hand add`, ...) are parsed by the daemon's families alone, as a client command is by its
    own: `mind hand add` spent most of its 0.25 s of CPU importing every client command."""
    words = sys.argv[1:] if argv is None else list(argv)
    at = command_at(words)
    tail: list[str] | None = None
    if at is not None and words[at] in FAST:
        from mind.cli import exec

        p, sub = top_parser()
        exec.add_parsers(sub)
        words, tail = exec.split_command(sub, words, at)
    elif at is not None and words[at] in daemon_words:
        p, sub = top_parser()
        for add in daemon:
            add(sub)
    else:
        p = (family_parser(words[at]) if at is not None else None) or parser(daemon)
    args, extra = p.parse_known_args(words)
    resolve = getattr(args, "resolve", None)
    if resolve is not None:
        resolve(args, tail, extra)
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def run(args: argparse.Namespace) -> int:
    """The parsed command's handler: its exit code (None from a daemon command: 0). A daemon command
    that fails raises `CommandFailed` rather than calling `die` (it may not import the CLI): said here
    as `die` says a client command's failure, `--json` included."""
    from mind.cli.exits import die
    from mind.commandline import CommandFailed

    try:
        code: int | None = args.handler(args)
    except CommandFailed as exc:
        die(exc.message, exc.code)
    return code or 0
