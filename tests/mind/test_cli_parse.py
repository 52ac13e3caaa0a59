"""The `mind` command line, parsed in-process without starting anything: every command's `--help`,
every `mind ...` line the README shows, the ssh habit `mind exec HAND CMD ARGS` and its rule, and the
house rules of mind/cli (one shape per command, no private names across files)."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from mind.cli import exits, main, options
from mind.cli.exits import EXIT_USAGE
from mind.cli.hints import shell_hint
from mind.main import DAEMON_WORDS, add_daemon_parsers

ROOT = Path(__file__).resolve().parents[2]


def parse(*words: str) -> argparse.Namespace:
    return main.parse(list(words), daemon=[add_daemon_parsers], daemon_words=DAEMON_WORDS)


def usage_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(*words)
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --- every command's --help ----------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path (`("task", "wait")`, ...) under `parser`, from its subparsers."""
    found = []
    for action in parser._actions:  # argparse keeps its subparsers here; no public walk exists
        if isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += commands(sub, (*prefix, name))
    return found


ALL = commands(main.parser([add_daemon_parsers]))


def test_the_walk_sees_every_family():
    tops = {c[0] for c in ALL}
    assert {"serve", "hand", "client", "config", "hands", "status", "runs", "run", "exec", "shell"} <= tops
    assert {"cp", "call", "task"} <= tops
    assert ("task", "wait") in ALL and ("hand", "label") in ALL and ("config", "show") in ALL


@pytest.mark.parametrize("path", [(), *ALL], ids=lambda p: " ".join(p) or "mind")
def test_every_command_has_help_that_exits_0(path, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*path, "--help")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mind") and " ".join(("mind", *path)) in out.splitlines()[0] + out


def test_every_leaf_command_has_a_handler():
    """One shape: a subcommand that runs something names its handler; dispatch has no table."""
    leaves = [p for p in ALL if not any(q[: len(p)] == p and len(q) > len(p) for q in ALL)]
    for path in leaves:
        words = {
            ("exec",): ["exec", "h", "--", "true"],
            ("shell",): ["shell", "h"],
            ("cp",): ["cp", "a", "h:b"],
            ("forward",): ["forward", "h", "-L", "0:db:1"],
            ("call",): ["call", "--hand", "h", "list_dir"],
            ("task", "start"): ["task", "start", "--hand", "h", "--", "true"],
            ("hand", "label"): ["hand", "label", "h", "k=v"],
        }.get(path)
        if words is None:
            words = [
                *path,
                *(
                    ["x"]
                    if path[-1]
                    in ("get", "logs", "wait", "cancel", "rm", "revoke", "rotate", "add", "attach", "export", "play")
                    else []
                ),
            ]
        args = parse(*words)
        assert callable(args.handler), path


# --- the README's command lines -----------------------------------------------------------------


def readme_lines() -> list[str]:
    """Every `mind ...` command in the README's code blocks (also after `|`, `;`, `&&`), with its
    optional `[...]` parts included, as the shell would split it."""
    found: list[str] = []
    in_block = False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block or "mind " not in line:  # (prose names commands in fragments: `mind exec --hand`)
            continue
        lexer = shlex.shlex(line.replace("[", "").replace("]", ""), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        skip = False
        for token in [*lexer, ";"]:
            if skip:
                skip = False
            elif token and set(token) <= set("|;&()<>"):
                if command[:1] == ["mind"] and len(command) > 1 and "|" not in command[1]:
                    found.append(shlex.join(command))
                command, skip = [], token in (">", "<", ">>")
            else:
                command.append(token)
    return found


README = readme_lines()


def test_the_readme_has_command_lines_to_check():
    assert len(README) >= 30, README


@pytest.mark.parametrize("line", README)
def test_every_readme_command_line_parses(line):
    placeholders = {"fleet-3f0c...": "fleet-3f0c", "N": "10", "D": "30m", "S": "running", "fleet-...": "fleet-1"}
    words = [placeholders.get(w, w) for w in shlex.split(line.replace("[", "").replace("]", ""))[1:]]
    args = parse(*words)
    assert callable(args.handler)


# --- `mind exec HAND CMD ARGS`, as ssh takes a host and a command ----------------------------------


def same(a: argparse.Namespace, b: argparse.Namespace) -> bool:
    return {k: v for k, v in vars(a).items() if k != "resolve"} == {k: v for k, v in vars(b).items() if k != "resolve"}


def test_the_hand_as_the_first_word_is_hand_flag():
    assert same(parse("exec", "web1", "--", "uptime"), parse("exec", "--hand", "web1", "--", "uptime"))
    assert same(parse("exec", "web1", "uptime"), parse("exec", "--hand", "web1", "--", "uptime"))
    a = parse("exec", "-t", "--timeout", "5", "web1", "--", "top", "-d", "1", "--", "x")
    assert (a.hand, a.argv, a.tty, a.timeout) == ("web1", ["top", "-d", "1", "--", "x"], True, 5.0)


def test_options_may_follow_the_hand_before_the_command():
    a = parse("exec", "web1", "--timeout", "5", "-n", "--", "ls", "-l")
    assert (a.hand, a.argv, a.timeout, a.no_stdin) == ("web1", ["ls", "-l"], 5.0, True)


def test_words_after_the_double_dash_are_never_the_hand(capsys):
    err = usage_error(capsys, "exec", "--", "web1", "uptime")
    assert "which Hand?" in err and "mind exec [OPTIONS] HAND COMMAND [ARG...]" in err


def test_with_hand_or_hands_every_word_is_the_commands():
    a = parse("exec", "--hand", "web1", "echo", "--", "hi")  # the command's own `--` is the command's
    assert (a.hand, a.argv) == ("web1", ["echo", "--", "hi"])
    f = parse("exec", "--hands", "web*", "uptime")
    assert (f.hand, f.hands, f.argv) == (None, "web*", ["uptime"])


def test_a_hand_named_like_a_subcommand_is_just_a_name():
    for name in ("exec", "shell", "cp", "task"):
        a = parse("exec", name, "--", "ls")
        assert (a.cmd, a.hand, a.argv) == ("exec", name, ["ls"])
    assert parse("shell", "exec").hand == "exec"


def test_a_hand_that_looks_like_an_option_is_refused_not_guessed(capsys):
    err = usage_error(capsys, "exec", "-web1", "--", "ls")
    assert "-web1" in err
    a = parse("exec", "--hand=-web1", "--", "ls")  # argparse takes it; no Hand may be named so
    from mind.cli.exec import check_args

    with pytest.raises(SystemExit) as exc:
        check_args(a)
    assert exc.value.code == EXIT_USAGE and "--hand wants a Hand's name" in capsys.readouterr().err


D = options.EXEC_TIMEOUT_S


@pytest.mark.parametrize(
    "words, hand, argv, timeout",
    [
        (["web1", "ls", "-la"], "web1", ["ls", "-la"], D),
        (["web1", "grep", "--timeout", "-r", "x", "."], "web1", ["grep", "--timeout", "-r", "x", "."], D),
        (["--hand", "web1", "ls", "-la", "--json"], "web1", ["ls", "-la", "--json"], D),
        (["-t", "web1", "top", "-d", "1"], "web1", ["top", "-d", "1"], D),
        (["-n", "web1", "uptime"], "web1", ["uptime"], D),
        (["-tn", "web1", "cat", "-A"], "web1", ["cat", "-A"], D),
        (["web1", "-n", "--timeout=5m", "ls", "-l"], "web1", ["ls", "-l"], 300.0),
        (["--time", "5", "web1", "ls", "-l"], "web1", ["ls", "-l"], 5.0),  # an abbreviation takes its value
        (["web1", "echo", "--", "-n"], "web1", ["echo", "--", "-n"], D),
    ],
)
def test_after_the_hand_every_word_is_the_commands_options_included(words, hand, argv, timeout):
    """ssh's form: `mind exec web1 ls -la` runs `ls -la` (it was `unrecognized arguments: -la`, exit 2).
    mind's options come before the command's first word; from there on nothing is ours."""
    a = parse("exec", *words)
    assert (a.hand, a.argv, a.shell, a.timeout) == (hand, argv, None, timeout)


@pytest.mark.parametrize("word", ["ls -la | head -3", "echo $HOME", "cd /tmp && make", "ls *.py", "a=1", "x>y"])
def test_one_word_with_shell_syntax_runs_through_sh_as_ssh_runs_it(word):
    a = parse("exec", "web1", word)
    assert (a.hand, a.shell, a.argv) == ("web1", word, [])
    from mind.cli.toolargs import tool_args_from

    assert tool_args_from(a) == ("shell", {"command": word})


@pytest.mark.parametrize(
    "words, argv",
    [
        (["--", "ls -la | head -3"], ["ls -la | head -3"]),  # after --: an argv, exactly (as before)
        (["ls", "a b", "|", "wc"], ["ls", "a b", "|", "wc"]),  # several words: never joined into a line
        (["uptime"], ["uptime"]),  # one word, no shell syntax: a program
    ],
)
def test_every_other_command_is_an_exact_argv(words, argv):
    a = parse("exec", "web1", *words)
    assert (a.shell, a.argv) == (None, argv)


def test_a_shell_line_and_shell_both_is_a_usage_error(capsys):
    a = parse("exec", "web1", "--shell", "true", "a | b")
    from mind.cli.toolargs import tool_args_from

    with pytest.raises(SystemExit) as exc:
        tool_args_from(a)
    assert exc.value.code == EXIT_USAGE and "not both" in capsys.readouterr().err


def test_a_hand_word_and_hand_flag_both_is_a_usage_error(capsys):
    assert "two Hands: --hand b and a" in usage_error(capsys, "exec", "a", "--hand", "b", "ls")


def test_an_unknown_option_before_the_command_is_still_refused(capsys):
    err = usage_error(capsys, "exec", "--bogus", "web1", "ls")
    assert "unrecognized arguments: --bogus" in err


def test_exec_is_parsed_by_its_own_parser_the_same_as_by_the_whole():
    from mind.cli.exec import split_command

    for words in (
        ["exec", "web1", "--cwd", "src", "--env", "A=1", "--json", "--", "make", "-j4"],
        ["exec", "--cwd", "src", "web1", "make", "-j4", "--json"],
    ):
        full = main.parser([add_daemon_parsers])
        sub = next(a for a in full._actions if isinstance(a.choices, dict))
        ours, tail = split_command(sub, words, 0)
        args, extra = full.parse_known_args(ours)
        args.resolve(args, tail, extra)
        assert same(parse(*words), args)


def test_each_familys_table_row_is_what_its_module_adds():
    """`main.FAMILIES` names, for every client command, the one module whose parser adds it: a
    command missing from it is parsed by the whole parser (slower, still right); a wrong row would
    parse a command with another family's parser, which does not know it."""
    import importlib

    found = {}
    for module in set(main.FAMILIES.values()):
        p, sub = main.top_parser()
        importlib.import_module(f"mind.cli.{module}").add_parsers(sub)
        found.update(dict.fromkeys(sub.choices, module))
    assert found == main.FAMILIES
    client = {c[0] for c in commands(main.parser())}
    assert client - set(main.FAMILIES) == set(main.FAST), "every client command is in a family's row or exec's"


def test_the_daemon_words_are_what_the_daemon_adds():
    """`mind.main.DAEMON_WORDS` are parsed by the daemon's parsers alone: a word missing from it is
    parsed by the whole parser (slower, still right); a word too many would not parse at all."""
    p, sub = main.top_parser()
    add_daemon_parsers(sub)
    assert set(sub.choices) == set(DAEMON_WORDS)


@pytest.mark.parametrize(
    "words",
    [
        ["serve", "--listen", "127.0.0.1:0", "--resume-window", "30s"],
        ["hand", "add", "web1", "--label", "role=web", "--out", "w.cred"],
        ["client", "add", "ci", "--hands", "web*", "--tools", "exec"],
        ["client", "rotate", "ci"],
    ],
)
def test_a_daemon_command_is_parsed_by_the_daemons_parsers_the_same_as_by_the_whole(words):
    args, extra = main.parser([add_daemon_parsers]).parse_known_args(words)
    assert not extra
    ours = parse(*words)
    assert same_but_handler(ours, args)
    assert handled_by(ours.handler) == handled_by(args.handler)


@pytest.mark.parametrize(
    "words",
    [
        ["cp", "-r", "-p", "src/", "web1:dst/"],
        ["task", "start", "--hand", "h", "--env", "A=1", "--", "x", "-y"],
        ["runs", "--hand", "web1", "--json"],
        ["forward", "-L", "8080:localhost:80", "web1"],
        ["call", "--hand", "web1", "read_file", "path=x"],
        ["config", "show"],
    ],
)
def test_a_command_is_parsed_by_its_familys_parser_the_same_as_by_the_whole(words):
    full = main.parser([add_daemon_parsers])
    args, extra = full.parse_known_args(words)
    if (resolve := getattr(args, "resolve", None)) is not None:
        resolve(args, None, extra)
    ours = parse(*words)
    assert same_but_handler(ours, args)
    assert handled_by(ours.handler) == handled_by(args.handler)


def same_but_handler(a: argparse.Namespace, b: argparse.Namespace) -> bool:
    return same(argparse.Namespace(**{**vars(a), "handler": None}), argparse.Namespace(**{**vars(b), "handler": None}))


def handled_by(handler: object) -> tuple[object, ...]:
    """A handler's code and what it closes over (each parser builds its own closure)."""
    cells = getattr(handler, "__closure__", None) or ()
    return (getattr(handler, "__code__", handler), *(c.cell_contents for c in cells))


def test_shell_takes_the_hand_as_ssh_takes_a_host(capsys):
    assert parse("shell", "web1").hand == "web1" and parse("shell", "--hand", "web1").hand == "web1"
    assert "which Hand?" in usage_error(capsys, "shell")
    assert "two Hands" in usage_error(capsys, "shell", "--hand", "a", "b")


# --- shared options: one definition ------------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    [
        ["exec", "--hand", "h", "--env", "A=1", "--cwd", "d", "--", "x"],
        ["shell", "h", "--env", "A=1", "--cwd", "d"],
        ["task", "start", "--hand", "h", "--env", "A=1", "--cwd", "d", "--", "x"],
    ],
)
def test_env_and_cwd_read_the_same_everywhere(words):
    a = parse(*words)
    assert (a.env, a.cwd) == (["A=1"], "d")


@pytest.mark.parametrize(
    "cmd", [["hands"], ["status"], ["runs"], ["run", "get", "r"], ["call", "--hand", "h", "t"], ["cp", "a", "h:b"]]
)
def test_connection_options_are_the_same_on_every_client_command(cmd):
    a = parse(*cmd[:1], *cmd[1:], "--mind", "ws://m:1", "--credential", "c", "--ca", "ca", "--pin", "sha256:00")
    assert (a.mind, a.credential, a.ca, a.pin) == (["ws://m:1"], "c", "ca", "sha256:00")
    several = parse(*cmd[:1], *cmd[1:], "--mind", "ws://m:1", "--mind", "ws://n:2,ws://o:3")
    assert several.mind == ["ws://m:1", "ws://n:2,ws://o:3"]  # every node kept (mind/cli/connection.py joins them)


def test_exec_default_timeout_is_the_documented_one():
    assert parse("exec", "h", "--", "x").timeout == options.EXEC_TIMEOUT_S == 3600.0
    readme = (ROOT / "README.md").read_text()
    assert "default --timeout is 3600 s" in readme


# --- hints -------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["a | b", "ls *.py", "echo hi", "cd /tmp && make", "x>y"])
def test_a_one_word_command_with_shell_syntax_that_did_not_start_gets_the_shell_hint(word):
    hint = shell_hint({"argv": [word]}, 127)
    assert hint is not None and f"--shell {word!r}" in hint


@pytest.mark.parametrize(
    "tool_args,code",
    [
        ({"argv": ["a | b"]}, 1),  # it started: whatever it did is its own
        ({"argv": ["ls", "|", "wc"]}, 127),  # several words: an argv on purpose
        ({"argv": ["nosuchprogram"]}, 127),  # nothing a shell would read differently
        ({"command": "a | b"}, 127),  # already --shell
    ],
)
def test_no_shell_hint_where_it_would_not_help(tool_args, code):
    assert shell_hint(tool_args, code) is None


# --- exit codes and client codes ---------------------------------------------------------------


def test_client_codes_are_strings_and_distinct_from_the_minds():
    from mind.errors import ClientCode, ClientError
    from protocol.codes import ErrorCode

    assert not {c.value for c in ClientCode} & {c.value for c in ErrorCode}
    err = ClientError(ClientCode.CLOSED, "gone")
    assert err.code == "closed" and f"{err.code}" == "closed"
    import json

    assert json.dumps({"code": err.code}) == '{"code": "closed"}'


def test_every_end_a_run_or_copy_can_fail_with_has_a_client_code():
    from mind.errors import ClientCode
    from protocol.states import RUN_TERMINAL, RunState

    for state in RUN_TERMINAL:
        if state is not RunState.SUCCEEDED:
            assert ClientCode(state.value).value == state.value


def test_fleet_summary_says_not_started_only_when_a_hand_was_not_started(capsys):
    from mind.cli.fleet import Printer
    from mind.core import fleet as plan_core

    def summary(counts: dict[str, int]) -> str:
        args = SimpleNamespace(json=False, events=False, group=False, fail_fast=False, timeout=3600.0)
        fleet = SimpleNamespace(fleet_id="fleet-1", plan=SimpleNamespace(max_errors=0), results={})
        p = Printer(args, [SimpleNamespace(name="a"), SimpleNamespace(name="b")], fleet)  # type: ignore[arg-type]
        not_ok = {h: s for h, s in (("a", "failed"), ("b", "not_started")) if counts.get(s)}
        p.summary(plan_core.Aggregate(2, counts, not_ok, 1, True, False, 119))
        return capsys.readouterr().err

    every_started = summary({"failed": 1, "succeeded": 1})
    assert "not_started" not in every_started and "every Hand had started" in every_started
    some_not = summary({"failed": 1, "not_started": 1})
    assert "(1 not_started)" in some_not
    assert "--timeout" not in some_not
    assert "killed because --timeout 3600 s passed" in summary({"timed_out": 1, "not_started": 1})


# --- the house rules of mind/cli -------------------------------------------------------------------


def cli_modules() -> list[Path]:
    return [*sorted((ROOT / "mind" / "cli").glob("*.py")), ROOT / "mind" / "main.py", ROOT / "mind/daemon/commands.py"]


@pytest.mark.parametrize("path", cli_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_is_imported_across_files(path):
    tree = ast.parse(path.read_text())
    bad = [
        f"{node.module}.{a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("mind", "protocol", "hand")
        for a in node.names
        if a.name.startswith("_") and not a.name.endswith("__")
    ]
    assert not bad, f"{path.name} imports private names {bad}"


def test_exit_table_has_no_two_names_for_one_code():
    codes: dict[int, list[str]] = {}
    for name, value in vars(exits).items():
        if name.startswith("EXIT_") and isinstance(value, int):
            codes.setdefault(value, []).append(name)
    assert {v: n for v, n in codes.items() if len(n) > 1} == {}


def test_task_exit_codes_follow_the_exec_table():
    from protocol.states import TaskState

    assert exits.task_exit_code(TaskState.SUCCEEDED, 0, None) == 0
    assert exits.task_exit_code(TaskState.FAILED, None, 9) == 137
    assert exits.task_exit_code(TaskState.TIMED_OUT, None, None) == exits.EXIT_TIMED_OUT
    assert exits.task_exit_code(TaskState.RUNNING, None, None) is None


# --- durations: every option of seconds takes 90, 90s, 5m, 2h ----------------------------------


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a.choices, dict)]
    if not subs:
        return [(path, parser)]
    return [leaf for a in subs for name, sp in a.choices.items() for leaf in leaves(sp, (*path, name))]


LATE = {("exec", "--wait"), ("exec", "--keep"), ("exec", "--deliver-within"), ("runs", "--since")}
LATE |= {("task", "start", "--max-runtime"), ("task", "wait", "--timeout")}
"""Duration options kept as text by argparse and read by `protocol.units` in their handler (with a
sentence naming the option), the same parser `options.duration` uses."""


TIMED = re.compile(r"timeout|wait$|keep|grace|runtime|within|since|window|interval|lease|backoff|retention")
"""The names of options that hold a time (`--cpu-seconds` is a CPU budget, counted as ulimit counts it)."""


def test_every_duration_option_of_every_command_reads_units():
    """`mind serve --resume-window 3s` was refused while `--wait 5m` was taken: no option of seconds
    may want a bare number (`type=float`), and each one of a duration reads `protocol.units`."""
    from mind.config import KEYS
    from protocol.io.settings import Duration

    settings = {k.flag: k for k in KEYS}
    seen = set()
    for path, p in leaves(main.parser([add_daemon_parsers])):
        for action in p._actions:
            assert action.type is not float, (path, action.option_strings)
            if TIMED.search(action.dest) and action.option_strings and action.nargs != 0:
                assert action.metavar in ("DURATION", "D"), (path, action.option_strings)
            if action.metavar not in ("DURATION", "D") or not action.option_strings:
                continue
            flag = action.option_strings[-1]
            seen.add((*path, flag))
            if path in (("serve",), ("config", "show")):
                assert settings[flag].kind is Duration, flag
            else:
                assert action.type is options.duration or (*path, flag) in LATE, (path, flag)
    assert LATE <= seen
    assert {("exec", "--timeout"), ("exec", "--grace"), ("shell", "--timeout"), ("call", "--timeout")} <= seen
    assert {("task", "cancel", "--wait-timeout"), ("mcp", "--keep"), ("serve", "--resume-window")} <= seen


@pytest.mark.parametrize(
    "words, attr, seconds",
    [
        (["exec", "--timeout", "90s", "h", "x"], "timeout", 90.0),
        (["exec", "--grace", "1.5s", "h", "x"], "grace", 1.5),
        (["exec", "--timeout", "90", "h", "x"], "timeout", 90.0),
        (["shell", "--timeout", "2h", "h"], "timeout", 7200.0),
        (["call", "--hand", "h", "--timeout", "5m", "t"], "timeout", 300.0),
        (["task", "cancel", "t1", "--wait-timeout", "1m"], "wait_timeout", 60.0),
        (["mcp", "--keep", "30m"], "keep", 1800.0),
    ],
)
def test_duration_options_read_as_seconds(words, attr, seconds):
    assert getattr(parse(*words), attr) == seconds


def test_a_bad_duration_is_a_usage_error_with_an_example(capsys):
    err = usage_error(capsys, "exec", "--timeout", "soon", "h", "x")
    assert "--timeout: 'soon' is not a duration (use e.g. 90s" in err
