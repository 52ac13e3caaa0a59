"""`mind exec` and `mind shell`: their parsers, the checks before any connection, and the start of
the run (mind/cli/execloop.py is the loop that carries it; mind/cli/fleet.py a `--hands` fleet run).

This is the CLI's fast path: `mind exec` builds only these parsers (mind/cli/main.py) and runs over
one blocking `Link` (mind/client/blocking.py: no asyncio, no pydantic), so nothing here may import
the asyncio client at module level.

Which Hand and which command, as ssh takes them (`ssh web1 ls -la`): `mind exec web1 ls -la` runs
`ls -la` on web1. The rule, without ambiguity (`split_command` and `resolve_hand`):
- mind's options come first: before the Hand, or right after it (as `ssh web1 -t top`);
- with neither `--hand` nor `--hands` before it, the first word that is neither an option nor an
  option's value is the Hand;
- the command starts at the next such word, and from there every word is the command's, options
  included (`mind exec web1 ls -la`; `mind exec --hand web1 grep -r x .`);
- `--` ends mind's options: every word after it is the command's, exactly (`mind exec web1 -- ls -la`);
- a command given as one single word holding shell syntax (a space, `|`, `;`, `&`, `<`, `>`, `$`,
  quotes, globs...: hints.SHELL_SYNTAX), and no `--`, runs as `/bin/sh -c WORD`, as ssh runs it:
  `mind exec web1 'ls -la | head -3'`. Every other command is an argv, word for word: several words
  are not joined into one shell line as ssh joins them (ssh's `rm 'my file'` removes two files;
  ours removes one), and after `--` one word is one program's name (`--shell` says "a shell line"
  outright).
A Hand's name never starts with `-` (protocol/limits.py LABEL_RE), so it cannot be read as an option,
and `mind exec` has no subcommands, so a Hand named `exec` or `shell` is just a name (`mind exec
shell ls`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mind.cli import options
from mind.cli.connection import FOLLOW_WAIT_S, connection_params, patient
from mind.cli.exits import EXIT_USAGE, die
from mind.cli.hints import SHELL_SYNTAX
from mind.cli.toolargs import tool_args_from
from mind.client.credentials import load_credential
from mind.errors import ClientError
from protocol import limits
from protocol.io import gcstart

HAND_RULE = "mind exec [OPTIONS] HAND COMMAND [ARG...] (or --hand HAND; --hands SELECTOR for a fleet)"

TTY_NOTICE = "mind: -t: stdin is not a terminal, so the command runs without one (as ssh -t does)"
"""`mind exec -t` with a pipe or a file as stdin: as `ssh -t`, no terminal is made (a terminal
would wait for keys that never come: issue 24) and the data is the command's stdin."""


def add_parsers(sub: Any) -> None:
    e = options.command(sub, "exec", help="run a command on a Hand, streaming its output")
    options.connection(e)
    which = e.add_mutually_exclusive_group()
    options.hand(which, required=False, help="the Hand's name (or give it as the first word: mind exec HAND CMD)")
    which.add_argument(
        "--hands",
        metavar="SELECTOR",
        help="a fleet run on every Hand this names: a,b  web*  role=web  role=web+dc=eu1 (README: Fleet runs)",
    )
    options.fleet(e)
    options.timeout(e, options.EXEC_TIMEOUT_S, "the run is killed; stderr says so when it happens")
    e.add_argument(
        "--grace",
        type=options.duration,
        default=None,
        metavar="DURATION",
        help="time between SIGTERM and SIGKILL (e.g. 5, 5s, 1m; Hand default 5 s)",
    )
    options.place(e)
    e.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run the command in a terminal (as ssh -t): keys go to it, ~. leaves, ~? lists escapes; "
        "with a stdin that is not a terminal, no terminal (as ssh -t)",
    )
    e.add_argument(
        "-n",
        "--no-stdin",
        action="store_true",
        help="the command reads /dev/null instead of our stdin (as ssh -n: for `while read h; do mind exec -n ...`)",
    )
    e.add_argument(
        "--output-limit",
        metavar="SIZE",
        help="bytes per output stream to deliver (default 1G; the Hand may cap it); past it the stream is cut",
    )
    options.limits(e)
    away = e.add_mutually_exclusive_group()
    away.add_argument(
        "--detach",
        action="store_true",
        help="print the run id once admitted and exit 0, leaving the run running unattended (as with -n: "
        "no stdin); `mind attach RUN_ID` takes it up",
    )
    away.add_argument(
        "--wait",
        metavar="DURATION",
        help="stream as usual; if the run still goes after DURATION (30, 30s, 5m, 2h), leave it running, "
        "say `still running: mind attach RUN_ID` on stderr and exit 121",
    )
    e.add_argument(
        "--keep",
        metavar="DURATION",
        help="with --detach/--wait: how long the Mind keeps the run unattended (default its resume window; "
        "capped by its --keep-max)",
    )
    out = e.add_mutually_exclusive_group()
    options.json_output(out, "print one JSON object at the end instead of the output")
    out.add_argument("--events", action="store_true", help="print every event as one JSON line (NDJSON)")
    options.program(
        e,
        "HAND (without --hand/--hands), then the command, options and all: mind exec web1 ls -la. One word "
        "with shell syntax runs through /bin/sh -c (mind exec web1 'ls | head -3'); after -- the words are "
        "the argv exactly",
    )
    e.set_defaults(handler=run, resolve=resolve_hand, login=False)

    s = options.command(sub, "shell", help="a login shell on a Hand, in a terminal (as `ssh host`)")
    options.connection(s)
    options.hand(s, required=False, help="the Hand's name (or give it as the word: mind shell HAND)")
    s.add_argument("target", nargs="?", metavar="HAND", help="the Hand's name, as ssh's host")
    options.place(s)
    options.timeout(s, 24 * 3600.0, "the session is killed")
    s.set_defaults(
        handler=run,
        resolve=resolve_shell_hand,
        hands=None,
        shell=None,
        argv=[],
        tty=True,
        login=True,
        no_stdin=False,
        output_limit=None,
        json=False,
        events=False,
        grace=None,
        cpu_seconds=None,
        memory=None,
        pids=None,
        cpus=None,
        address_space=None,
        max_files=None,
        max_procs=None,
        detach=False,
        wait=None,
        keep=None,
    )

    a = options.command(
        sub,
        "attach",
        help="take up a run again (after --detach, --wait, or a client that died): the rest of its output, "
        "then its exit code",
    )
    options.connection(a)
    a.add_argument("run_id", metavar="RUN_ID", help="the run (mind exec --detach printed it; mind runs --unattended)")
    options.json_output(
        a, "print the attached positions as one JSON object first, then the end as with mind exec --json"
    )
    a.set_defaults(
        handler=attach,
        attach=True,
        hand=None,
        hands=None,
        tty=False,
        login=False,
        no_stdin=True,
        output_limit=None,
        events=False,
        timeout=options.EXEC_TIMEOUT_S,
        detach=False,
        wait=None,
        keep=None,
    )


def split_command(sub: Any, words: list[str], at: int) -> tuple[list[str], list[str] | None]:
    """`words` (the whole command line, `at` its subcommand) as the words argparse parses and the
    command's tail, for `mind exec`; other commands are not split (None). The tail is what follows
    mind's options and the Hand (the module's docstring has the rule), kept as typed: with its
    leading `--` if one ended the options, so `resolve_hand` can tell `-- 'a | b'` (an argv) from
    `'a | b'` (a shell line). The option table is the parser's own: a value-taking option (`--timeout
    5`) and its value are ours, a switch (`-t`) is one word, a cluster (`-tn`) or `--opt=value` is
    one, an abbreviation (`--time 5`) counts as argparse will read it."""
    if words[at] != "exec":
        return words, None
    table: dict[str, argparse.Action] = sub.choices["exec"]._option_string_actions
    named = hand_word = False
    i = at + 1
    while i < len(words):
        word = words[i]
        if word == "--":
            return words[:i], words[i:]
        if word.startswith("-") and word != "-":
            width, action = option_width(table, words, i)
            named = named or (action is not None and action.dest in ("hand", "hands"))
            i += width
            continue
        if named or hand_word:
            return words[:i], words[i:]
        hand_word = True
        i += 1
    return words, []


def option_width(table: dict[str, argparse.Action], words: list[str], i: int) -> tuple[int, argparse.Action | None]:
    """How many words the option at `words[i]` takes (itself, and its value if separate), and its
    action. An option the table does not know is one word: argparse says it is unrecognized."""
    word = words[i]
    if word.startswith("--"):
        name, eq, _ = word.partition("=")
        action = table.get(name)
        if action is None:
            close = [o for o in table if o.startswith("--") and o.startswith(name)]
            action = table[close[0]] if len(close) == 1 else None
        if action is None:
            return 1, None
        return (1 if eq or action.nargs == 0 else 2), action
    for k in range(1, len(word)):  # -t, -tn, and a short option's value joined (-x5) or apart (-x 5)
        action = table.get("-" + word[k])
        if action is None:
            return 1, None
        if action.nargs != 0:
            return (1 if k + 1 < len(word) else 2), action
    return 1, table.get(word)


def resolve_hand(args: argparse.Namespace, tail: list[str] | None, extra: list[str]) -> None:
    """The Hand given as a word, and the command from the tail `split_command` cut (the module's
    docstring has the rule)."""
    if extra:
        die(f"unrecognized arguments: {' '.join(extra)}; usage: {HAND_RULE}", EXIT_USAGE)
    if tail is None:  # not split (never for `mind exec`, which the fast path parses): as typed
        tail = args.argv[1:] if args.hand is None and args.hands is None else args.argv
        args.argv = args.argv[: len(args.argv) - len(tail)]
    exact = tail[:1] == ["--"]
    command = tail[1:] if exact else tail
    if args.hand is not None or args.hands is not None:
        if args.argv:
            flag = "--hand" if args.hand is not None else "--hands"
            die(f"two Hands: {flag} {args.hand or args.hands} and {args.argv[0]}; give one", EXIT_USAGE)
    elif args.argv:
        args.hand = args.argv[0]
    else:
        die(f"which Hand? {HAND_RULE}", EXIT_USAGE)
    args.argv = command
    if not exact and args.shell is None and len(command) == 1 and SHELL_SYNTAX.intersection(command[0]):
        args.shell, args.argv = command[0], []  # one word of shell syntax: a shell line, as ssh runs it


def resolve_shell_hand(args: argparse.Namespace, tail: list[str] | None, extra: list[str]) -> None:
    if extra:
        die(f"unrecognized arguments: {' '.join(extra)}", EXIT_USAGE)
    if args.hand is not None and args.target is not None and args.target != args.hand:
        die(f"two Hands: --hand {args.hand} and {args.target}; give one", EXIT_USAGE)
    args.hand = args.hand or args.target
    if args.hand is None:
        die("which Hand? mind shell HAND (or --hand HAND)", EXIT_USAGE)


def check_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], int, int | None]:
    """Usage errors before any connection, with a sentence instead of a validation dump."""
    if args.timeout <= 0:
        die("--timeout must be positive", EXIT_USAGE)
    timeout_ms = max(1, int(args.timeout * 1000))
    if timeout_ms > limits.RUN_TIMEOUT_MAX_MS:
        die(f"--timeout is at most {limits.RUN_TIMEOUT_MAX_MS // 1000} seconds (24 h)", EXIT_USAGE)
    grace_ms = None
    if args.grace is not None:
        grace_ms = int(args.grace * 1000)
        if not 0 <= grace_ms <= 600_000:
            die("--grace must be between 0 and 600 seconds", EXIT_USAGE)
    if not limits.LABEL_RE.fullmatch(args.hand):
        die("--hand wants a Hand's name: 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)", EXIT_USAGE)
    tool, tool_args = tool_args_from(args)
    check_away(args)
    return tool, tool_args, timeout_ms, grace_ms


def check_away(args: argparse.Namespace) -> None:
    """`--detach` / `--wait` / `--keep` as numbers, or a usage error."""
    from protocol.units import positive_duration

    for name in ("wait", "keep"):
        text = getattr(args, name, None)
        if text is None:
            continue
        try:
            setattr(args, name, positive_duration(text))
        except ValueError as exc:
            die(f"--{name}: {exc} (for example 30, 30s, 5m, 2h)", EXIT_USAGE)
    if args.keep is not None and not (args.detach or args.wait is not None):
        die("--keep goes with --detach or --wait (how long the Mind keeps the run unattended)", EXIT_USAGE)
    if args.detach and args.tty:
        die("--detach leaves nobody at the terminal: drop -t (mind attach shows the output later)", EXIT_USAGE)
    if args.detach:
        args.no_stdin = True  # nobody will be there to type: as -n


def run(args: argparse.Namespace) -> int:
    if args.hands is not None:
        from mind.cli import fleet

        return fleet.run(args)
    from mind.cli.execloop import ExecSession
    from mind.client.blocking import Link

    tool, tool_args, timeout_ms, grace_ms = check_args(args)
    if args.tty and not args.login and not os.isatty(0):
        args.tty = False
        print(TTY_NOTICE, file=sys.stderr, flush=True)
    url, cred_path, ca, pin = connection_params(args)
    try:
        credential = load_credential(cred_path)
        link = Link.connect(url, credential, ca=ca, pin=pin)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    gcstart.started()
    session = ExecSession(
        link, args, lambda t: Link.connect(url, credential, ca=ca, pin=pin, open_timeout=t, handshake_timeout=t)
    )
    session.hand_names = lambda: hand_names(url, cred_path, ca, pin)
    try:  # (a reader of our stdout that goes away, `| head`, ends us as it ends `ls`: mind/main.py)
        return session.run(tool, tool_args, timeout_ms, grace_ms)
    finally:
        session.status.clear()
        link.close()


def attach(args: argparse.Namespace) -> int:
    """`mind attach RUN_ID`: the fast path's loop, started by an `attach` instead of an `exec`."""
    from mind.cli.execloop import ExecSession
    from mind.client.blocking import Link

    if not limits.ID_RE.fullmatch(args.run_id):
        die(f"not a run id: {args.run_id!r}", EXIT_USAGE)
    url, cred_path, ca, pin = connection_params(args)
    try:
        credential = load_credential(cred_path)
        link = Link.connect(url, credential, ca=ca, pin=pin, patience=patient(FOLLOW_WAIT_S, url))
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    gcstart.started()
    session = ExecSession(
        link, args, lambda t: Link.connect(url, credential, ca=ca, pin=pin, open_timeout=t, handshake_timeout=t)
    )
    try:
        return session.attach(args.run_id)
    finally:
        session.status.clear()
        link.close()


def hand_names(url: str, cred_path: str, ca: str | None, pin: str | None) -> list[str]:
    """The Hands this client may see, for a "did you mean" after an `unknown_hand` refusal: a second,
    short connection through the full client (the fast path has no hand list), only on that error."""
    import asyncio

    from mind.client.aio import MindClient

    async def names() -> list[str]:
        client = await MindClient.connect(url, load_credential(cred_path), ca=ca, pin=pin)
        try:
            return [h.name for h in await client.hands()]
        finally:
            await client.close()

    try:
        return asyncio.run(names())
    except (ClientError, OSError):
        return []
