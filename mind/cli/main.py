"""The `mind` command: the daemon (`serve`), local credential admin, and the client commands.

Exit codes of `mind exec` / `mind call` (a good remote shell's, plus distinct codes for what ssh
cannot tell you):
  the remote exit code      when the command ran to an exit (succeeded or failed)
  128+N                     the remote command was killed by signal N (not by us)
  124                       timed out (the run's deadline passed; the process tree was killed)
  130                       cancelled (Ctrl-C, or another client cancelled it)
  123                       budget exhausted
  125                       refused: rejected by the Hand, Hand offline or unknown, bad request,
                            Mind unreachable, authentication failed
  255                       lost: the outcome is unknown (the Hand's connection or the Mind went away)
  2                         bad command-line usage
`mind exec --hands` (a fleet run) exits 0 when every selected Hand succeeded, else one aggregate code:
  118 some Hands unreached (offline / undeliverable), every run that started succeeded;
  120 some runs did not succeed, within the error budget; 119 the budget stopped the fleet (some
  not_started); 130 cancelled (Ctrl-C); 255 the connection to the Mind was lost; 2 bad usage or an
  empty selection (README "Fleet runs").
Heavy imports happen inside the commands, so `mind --help` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from mind import __version__
from mind.cli.connection import connection_params
from mind.cli.output import (
    EXIT_INCOMPLETE,
    EXIT_USAGE,
    _explain,
    _jsonable,
    _table,
    _ts,
    die,
    exit_code_for,
    printable,
)

# --- argument parsing ----------------------------------------------------------------------


def _limit_opts(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("resource limits (applied by the Hand to the process tree; it may cap them)")
    g.add_argument("--cpu-seconds", type=int, help="CPU budget for the whole tree; exhausted -> budget_exhausted (123)")
    g.add_argument("--memory", metavar="SIZE", help="address space per process (e.g. 512M)")
    g.add_argument("--max-files", type=int, help="open files per process")
    g.add_argument("--max-procs", type=int, help="processes of the user (mostly useful with the Hand's --run-as)")


def _conn_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--mind", help="Mind URL (default $MINDHAND_URL, then the local Mind's mind.url)")
    sp.add_argument("--credential", help="client credential file (default $MINDHAND_CREDENTIAL, then admin.cred)")
    sp.add_argument("--ca", help="CA file to verify a wss:// Mind (default $MINDHAND_CA, else system trust)")
    sp.add_argument("--pin", help="require the Mind's certificate to be sha256:HEX (default $MINDHAND_PIN)")


class _Help(argparse.HelpFormatter):
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


class _TableHelp(_Help):
    """`_Help` that keeps the description's and epilog's lines as written: for a table of exit codes."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


def _top_parser() -> tuple[argparse.ArgumentParser, Any]:
    p = argparse.ArgumentParser(
        prog="mind", description="mindhand: run commands and tools on remote machines.", formatter_class=_Help
    )
    p.add_argument("--home", help="state directory (default $MINDHAND_HOME or ~/.local/state/mindhand)")
    p.add_argument("--version", action="version", version=f"mind {__version__}")
    return p, p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")


def _add_exec(sub: Any) -> None:
    e = sub.add_parser("exec", help="run a command on a Hand, streaming its output", formatter_class=_Help)
    _conn_opts(e)
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--hand", help="the Hand's name")
    which.add_argument(
        "--hands",
        metavar="SELECTOR",
        help="a fleet run on every Hand this names: a,b  web*  role=web  role=web+dc=eu1 (README: Fleet runs)",
    )
    _fleet_opts(e)
    e.add_argument("--shell", metavar="COMMAND", help="run COMMAND through /bin/sh -c")
    e.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is killed (default 3600)")
    e.add_argument("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL (Hand default 5)")
    e.add_argument("--cwd", help="working directory on the Hand, inside its root")
    e.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment variable (repeatable)")
    e.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run the command in a terminal (as ssh -t): keys go to it, ~. leaves, ~? lists escapes",
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
    _limit_opts(e)
    out = e.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object at the end instead of the output")
    out.add_argument("--events", action="store_true", help="print every event as one JSON line (NDJSON)")
    e.add_argument("argv", nargs="*", help="the command (after --)")


def _fleet_opts(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("fleet runs (with --hands)")
    g.add_argument("--max-concurrency", default="50", metavar="N|P%", help="runs in flight at most (default 50)")
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


def _add_shell(sub: Any) -> None:
    s = sub.add_parser("shell", help="a login shell on a Hand, in a terminal (as `ssh host`)", formatter_class=_Help)
    _conn_opts(s)
    s.add_argument("--hand", required=True)
    s.add_argument("--cwd", help="working directory on the Hand, inside its root")
    s.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment variable (repeatable)")
    s.add_argument(
        "--timeout", type=float, default=24 * 3600.0, help="seconds before the session is killed (default 24 h)"
    )
    s.set_defaults(
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
        max_files=None,
        max_procs=None,
    )


def _command_word(argv: list[str]) -> str | None:
    """The subcommand named in `argv`, if it comes right after the global options."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--home":
            i += 2
        elif a.startswith("--home="):
            i += 1
        else:
            return None if a.startswith("-") else a
    return None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """`mind exec` is the command people run in loops and scripts: it is parsed by a parser that
    knows only it (the same definition, `_add_exec`), so its start does not pay for building, and
    importing what builds, every other command's options. Anything else gets the full parser."""
    argv = sys.argv[1:] if argv is None else list(argv)
    word = _command_word(argv)
    if word in ("exec", "shell"):
        p, sub = _top_parser()
        (_add_exec if word == "exec" else _add_shell)(sub)
        return p.parse_args(argv)
    return _parser().parse_args(argv)


def _parser() -> argparse.ArgumentParser:
    p, sub = _top_parser()
    limit_opts, conn_opts = _limit_opts, _conn_opts

    from mind.config import GROUPS, KEYS
    from protocol.io.settings import add_flags

    file_help = "TOML settings file (default $MINDHAND_CONFIG, else HOME/mind.toml if it exists)"
    s = sub.add_parser(
        "serve",
        help="run the Mind daemon",
        description="Run the Mind. SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the config file "
        "and applies the log level and handshake limits without dropping connections.",
    )
    add_flags(s, KEYS, GROUPS, {}, file_help=file_help)
    cf = sub.add_parser("config", help="show the daemon's effective settings and where each comes from")
    cfs = cf.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cfs.add_parser(
        "show",
        help="print every setting of `mind serve`, its value and its source",
        description="Resolve the settings exactly as `mind serve` would with the same flags, "
        "environment and file, and print each value with its source.",
    )
    add_flags(show, KEYS, GROUPS, {}, file_help=file_help)
    show.add_argument("--json", action="store_true", help="a JSON object instead of a table")

    for role in ("hand", "client"):
        r = sub.add_parser(role, help=f"manage {role} credentials (local, no daemon needed)")
        rs = r.add_subparsers(dest="action", required=True, metavar="ACTION")
        a = rs.add_parser("add", help=f"create a {role} credential and print it once")
        a.add_argument("name")
        a.add_argument("--out", help="also write the credential to this file (mode 0600)")
        if role == "hand":
            a.add_argument(
                "--label",
                dest="labels",
                action="append",
                default=[],
                metavar="K=V",
                help="a label fleet selectors match (`--hands role=web`); repeatable",
            )
        if role == "client":
            a.add_argument("--hands", help="Hands it may use: names or globs, comma-separated (default: all)")
            a.add_argument("--tools", help="tools it may use: names or globs, comma-separated (default: all)")
            a.add_argument(
                "--read-others",
                action="store_true",
                help="may read and cancel other clients' runs and tasks (default: its own only)",
            )
        ls = rs.add_parser("list", help=f"list {role} credentials")
        ls.add_argument("--json", action="store_true")
        rv = rs.add_parser("revoke", help=f"revoke a {role} credential; its live connections are closed at once")
        rv.add_argument("name")
        ro = rs.add_parser(
            "rotate", help=f"give a {role} a new secret (printed once); the old one stops working at once"
        )
        ro.add_argument("name")
        ro.add_argument("--out", help="also write the new credential to this file (mode 0600)")
        if role == "hand":
            lb = rs.add_parser(
                "label",
                help="set or remove a Hand's labels (the Mind's facts that --hands selectors match)",
                description="Set labels with K=V, remove one with K- (or -K after --). "
                "A running Mind uses the new labels at the next selection.",
            )
            lb.add_argument("name")
            lb.add_argument("edits", nargs="+", metavar="K=V|K-")

    h = sub.add_parser("hands", help="list Hands known to the Mind, live")
    conn_opts(h)
    h.add_argument("--json", action="store_true")
    h.add_argument(
        "--label", dest="labels", action="append", default=[], metavar="K=V", help="only Hands with this label"
    )

    _add_exec(sub)
    _add_shell(sub)

    from mind.cli import cp as cp_cli

    cp_cli.add_parser(sub, conn_opts, _Help)

    c = sub.add_parser("call", help="call any tool on a Hand: mind call --hand H TOOL key=value ...")
    conn_opts(c)
    c.add_argument("--hand", required=True)
    c.add_argument(
        "--args", dest="args_json", help="tool arguments as a JSON object, @FILE to read it from a file, - from stdin"
    )
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument(
        "--raw",
        action="store_true",
        help="write the result's `data` bytes to stdout as they are (read_file: every page to the end)",
    )
    c.add_argument("tool")
    c.add_argument(
        "kv",
        nargs="*",
        metavar="key=value",
        help="values are JSON if they parse, else strings; key=@FILE is FILE's bytes, key=@@x the string '@x'. "
        'In the output bytes are always {"$bytes": BASE64}',
    )

    t = sub.add_parser("task", help="durable background tasks: start, get, logs, wait, cancel, list")
    ts = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    st = ts.add_parser("start", help="start a background task; prints its id at once")
    conn_opts(st)
    which = st.add_mutually_exclusive_group(required=True)
    which.add_argument("--hand")
    which.add_argument("--hands", metavar="SELECTOR", help="one task on every Hand this names (README: Fleet runs)")
    st.add_argument("--max-concurrency", default="50", metavar="N|P%", help="with --hands: starts at a time")
    st.add_argument("--id", dest="task_id", help="name the task (retrying the same start is then safe)")
    st.add_argument(
        "--max-runtime", default="24h", help="the Hand kills it after this long (e.g. 90s, 30m, 2h; max 24h)"
    )
    st.add_argument("--shell", metavar="COMMAND", help="run COMMAND through /bin/sh -c")
    st.add_argument("--cwd", help="working directory on the Hand, inside its root")
    st.add_argument("--env", action="append", default=[], metavar="K=V")
    st.add_argument("--json", action="store_true")
    limit_opts(st)
    st.add_argument("argv", nargs="*", help="the command (after --)")
    tg = ts.add_parser("get", help="a task's state, times, exit code, log size, and how fresh that is")
    conn_opts(tg)
    tg.add_argument("task_id")
    tg.add_argument("--json", action="store_true")
    tl = ts.add_parser("logs", help="a task's log (from the Hand)")
    conn_opts(tl)
    tl.add_argument("task_id")
    tl.add_argument("--offset", type=int, default=0, help="start at this byte (of the stream read)")
    tl.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep streaming until the task ends, then exit with its outcome (as `task wait`); without it, 0",
    )
    tl.add_argument(
        "--stream",
        choices=["stdout", "stderr", "both"],
        default="both",
        help="one stream's own log, offsets in its bytes; default both, in arrival order. Bytes go to stdout",
    )
    tw = ts.add_parser(
        "wait",
        help="wait until a task ends; exit with its outcome",
        formatter_class=_TableHelp,
        description="Wait until the task ends (polling the Mind), print its final state on stderr\n"
        "(--json: its view on stdout), and exit with its outcome, as `mind exec` does:\n\n"
        "  succeeded   0\n"
        "  failed      the command's exit code (128+N: killed by signal N; 127/126: could not start)\n"
        "  timed_out   124 (its --max-runtime passed)\n"
        "  cancelled   130\n"
        "  lost        255 (nobody can know how it ended)\n"
        "  121         --timeout passed first; the task goes on\n"
        "  125         unknown task, Mind unreachable\n\n"
        "While the Hand is offline the Mind's view is stale: it keeps waiting (and says so on a terminal).",
    )
    conn_opts(tw)
    tw.add_argument("task_id")
    tw.add_argument("--timeout", metavar="D", help="give up after D (e.g. 90s, 30m, 2h): exit 121")
    tw.add_argument("--json", action="store_true")
    tc = ts.add_parser("cancel", help="request a cancel, then wait for the authoritative end")
    conn_opts(tc)
    tc.add_argument("task_id")
    tc.add_argument("--no-wait", action="store_true", help="return after the request is acknowledged")
    tc.add_argument("--wait-timeout", type=float, default=60.0, help="seconds to wait for the end (default 60)")
    tli = ts.add_parser("list", help="tasks the Mind knows (with staleness)")
    conn_opts(tli)
    tli.add_argument("--hand")
    tli.add_argument("--state", choices=["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"])
    tli.add_argument("--limit", type=int, default=1000)
    tli.add_argument("--json", action="store_true")

    stt = sub.add_parser("status", help="one screen: the Mind, its Hands, running runs, tasks, recent failures")
    conn_opts(stt)
    stt.add_argument("--json", action="store_true")
    rn = sub.add_parser("runs", help="foreground run history (newest first; retained per the Mind's settings)")
    conn_opts(rn)
    rn.add_argument("--hand")
    rn.add_argument(
        "--state",
        choices=[
            "admitted",
            "sent",
            "accepted",
            "running",
            "cancel_requested",
            "succeeded",
            "failed",
            "rejected",
            "cancelled",
            "timed_out",
            "lost",
            "budget_exhausted",
        ],
    )
    rn.add_argument("--since", metavar="DURATION", help="only runs started within this long ago (e.g. 30m, 2h)")
    rn.add_argument("--limit", type=int, default=50)
    rn.add_argument("--fleet", metavar="ID", help="only the member runs of this fleet run")
    rn.add_argument("--json", action="store_true")

    r = sub.add_parser("run", help="look at foreground runs")
    rs = r.add_subparsers(dest="action", required=True, metavar="ACTION")
    rg = rs.add_parser("get", help="show one run (state, times, outcome)")
    conn_opts(rg)
    rg.add_argument("run_id")
    rg.add_argument("--json", action="store_true")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return _parse(argv)


def run(args: argparse.Namespace) -> None:
    """Every command but the daemon's own (`serve`, `hand ...`, `client ...`: `mind.daemon.commands`)."""
    if args.cmd == "exec" and getattr(args, "hands", None) is not None:
        from mind.cli import fleet as fleet_cli

        raise SystemExit(fleet_cli.run(args))
    if args.cmd in ("exec", "shell"):
        from mind.cli import exec as exec_cli

        raise SystemExit(exec_cli.run(args))
    if args.cmd == "config":
        cmd_config_show(args)
        return
    import asyncio

    raise SystemExit(asyncio.run(_client_command(args)))


def cmd_config_show(args: argparse.Namespace) -> None:
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


# --- client commands -----------------------------------------------------------------------


async def _client_command(args: argparse.Namespace) -> int:
    from mind.client.aio import ClientError, MindClient, load_credential

    url, cred_path, ca, pin = connection_params(args)
    try:
        cred = load_credential(cred_path)
        client = await MindClient.connect(url, cred, ca=ca, pin=pin)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    try:
        if args.cmd == "hands":
            return await cmd_hands(client, args)
        if args.cmd == "call":
            return await cmd_call(client, args)
        if args.cmd == "cp":
            from mind.cli import cp as cp_cli

            return await cp_cli.run(client, args, lambda: MindClient.connect(url, cred, ca=ca, pin=pin))
        if args.cmd == "run":
            return await cmd_run_get(client, args)
        if args.cmd == "runs":
            return await cmd_runs(client, args)
        if args.cmd == "status":
            return await cmd_status(client, args)
        if args.cmd == "task":
            from mind.cli import task as task_cli

            return await task_cli.run(client, args)
        die(f"unknown command {args.cmd}", EXIT_USAGE)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    finally:
        await client.close()


async def cmd_hands(client: Any, args: argparse.Namespace) -> int:
    hands = await client.hands()
    if args.labels:
        from mind.core.selector import SelectorError, parse_label

        want = []
        for item in args.labels:
            try:
                want.append(parse_label(item))
            except SelectorError as exc:
                die(str(exc), EXIT_USAGE)
        hands = [h for h in hands if all(h.labels.get(k) == v for k, v in want)]
    if args.json:
        print(json.dumps([h.model_dump(mode="json") for h in hands], indent=2))
        return 0
    rows = []
    for h in hands:
        c = h.claims
        rows.append(
            [
                h.name,
                "yes" if h.connected else "no",
                str(h.generation),
                _ts(h.since),
                c.hostname if c else "-",
                f"{c.platform}/{c.machine}" if c else "-",
                str(h.running),
                ",".join(f"{k}={v}" for k, v in h.labels.items()) or "-",
            ]
        )
    _table(["NAME", "CONNECTED", "GEN", "SINCE", "HOST", "PLATFORM", "RUNNING", "LABELS"], rows)
    return 0


def _parse_kv(items: list[str]) -> dict[str, Any]:
    """`key=value`: JSON if it parses, else the string. `key=@PATH` is the bytes of the file PATH
    (`key=@-`: of stdin); `key=@@text` is the string `@text` (a literal leading '@')."""
    out: dict[str, Any] = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            die(f"tool arguments are key=value, got {kv!r}", EXIT_USAGE)
        if v.startswith("@@"):
            out[k] = v[1:]
            continue
        if v.startswith("@"):
            out[k] = _read_arg(v[1:], k)
            continue
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _read_arg(path: str, what: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        die(f"{what}=@{path}: {exc.strerror or exc}", EXIT_USAGE)


def _json_args(text: str) -> dict[str, Any]:
    """`--args JSON`, `--args @FILE` or `--args -` (JSON from stdin); must be an object."""
    if text == "-" or text.startswith("@"):
        text = _read_arg(text[1:] if text.startswith("@") else "-", "--args").decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        die(f"--args is not valid JSON: {exc}", EXIT_USAGE)
    if not isinstance(value, dict):
        die("--args must be a JSON object", EXIT_USAGE)
    return value


def _json_value(v: Any) -> Any:
    """A tool's value as JSON, bytes always as {"$bytes": BASE64} (one shape, text or not)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        import base64

        return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return v


async def _raw_pages(client: Any, args: argparse.Namespace, tool_args: dict[str, Any], value: Any) -> int:
    """`read_file --raw`: write each page, and read on from the next offset until `eof`, so the
    whole file arrives (one call returns at most a page). A failure names where it stopped."""
    from protocol.states import RunState

    out = sys.stdout.buffer
    while True:
        data = value.get("data", b"")
        out.write(data)
        offset = int(value.get("offset", 0)) + len(data)
        if value.get("eof", True):
            out.flush()
            return 0
        if not data:
            out.flush()
            print(
                f"mind: read_file stopped at offset {offset} before the end ({value.get('size')} bytes)",
                file=sys.stderr,
            )
            return EXIT_INCOMPLETE
        end = await client.exec(args.hand, "read_file", {**tool_args, "offset": offset}, timeout=args.timeout)
        if end.state is not RunState.SUCCEEDED or not isinstance(end.value, dict):
            out.flush()
            why = end.error or end.reason or end.state.value
            print(f"mind: read_file stopped at offset {offset}: {printable(why)}", file=sys.stderr)
            return EXIT_INCOMPLETE
        value = end.value


async def cmd_call(client: Any, args: argparse.Namespace) -> int:
    tool_args: dict[str, Any] = _json_args(args.args_json) if args.args_json else {}
    tool_args.update(_parse_kv(args.kv))
    end = await client.exec(args.hand, args.tool, tool_args, timeout=args.timeout)
    from mind.cli.output import did_you_mean, hand_suggestions
    from protocol.codes import RejectCode
    from protocol.states import RunState

    if end.state is RunState.SUCCEEDED:
        if args.raw and isinstance(end.value, dict) and isinstance(end.value.get("data"), bytes):
            if args.tool == "read_file":
                return await _raw_pages(client, args, tool_args, end.value)
            sys.stdout.buffer.write(end.value["data"])
            sys.stdout.flush()
        else:
            print(json.dumps(_json_value(end.value), indent=2))
        return 0
    if end.stdout.data:
        sys.stdout.buffer.write(end.stdout.data)
    if end.stderr.data:
        sys.stderr.buffer.write(end.stderr.data)
    _explain(end)
    if end.reject_code is RejectCode.UNKNOWN_HAND and (close := await hand_suggestions(client, args.hand)):
        print(f"mind: {did_you_mean(close)}", file=sys.stderr)
    if end.state is RunState.FAILED and end.exit_code is None and end.signal is None:
        return 1
    return exit_code_for(end)


def limits_id_ok(text: str) -> bool:
    from protocol import limits

    return bool(limits.ID_RE.fullmatch(text))


async def cmd_run_get(client: Any, args: argparse.Namespace) -> int:
    if args.run_id.startswith("fleet-"):
        return await cmd_fleet_get(client, args)
    info = await client.get_run(args.run_id)
    if args.json:
        d = info.model_dump(mode="python")
        print(json.dumps(_jsonable(d), indent=2, default=str))
        return 0
    print(
        f"run      {info.run_id}\nhand     {info.hand} (gen {info.gen})\ntool     {printable(info.tool)}\n"
        f"state    {info.state.value}"
    )
    print(f"created  {_ts(info.created_at)}\nended    {_ts(info.ended_at)}")
    if info.end is not None:
        e = info.end
        print(f"exit     {e.exit_code}  signal {e.signal}  duration {e.duration_ms} ms  dropped {e.progress_dropped}")
        if e.reason:
            print(f"reason   {printable(e.reason)}")
        if e.error:
            print(f"error    {printable(e.error)}")
    if info.value_not_retained:
        print("value    not retained (it went to the waiting client; the Mind keeps run metadata, not payloads)")
    return 0


async def cmd_fleet_get(client: Any, args: argparse.Namespace) -> int:
    """`mind run get fleet-...`: the fleet's member runs (its aggregate is theirs: DESIGN §12)."""
    if not limits_id_ok(args.run_id):
        die(f"no run {args.run_id}", EXIT_USAGE)
    runs = await client.list_runs(fleet=args.run_id, limit=100_000)
    if not runs:
        die(f"no fleet run {args.run_id} in the Mind's history (or none of its runs is visible to this client)")
    if args.json:
        members = [_jsonable(r.model_dump(mode="python")) for r in runs]
        print(json.dumps({"fleet": args.run_id, "members": members}, indent=2, default=str))
        return 0
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    print(f"fleet    {args.run_id}\nmembers  {len(runs)}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print("(Hands the fleet never started, offline or not_started, have no run and are not listed)\n")
    _table(RUN_HEADERS, [_run_row(r) for r in runs])
    return 0


def _run_row(r: Any) -> list[str]:
    e = r.end
    exit_ = "-" if e is None or e.exit_code is None else str(e.exit_code)
    dur = "-" if e is None else f"{e.duration_ms / 1000:.2f}s"
    return [r.run_id, r.hand, r.tool, r.state.value, _ts(r.created_at), dur, exit_]


RUN_HEADERS = ["RUN", "HAND", "TOOL", "STATE", "CREATED", "DURATION", "EXIT"]


async def cmd_runs(client: Any, args: argparse.Namespace) -> int:
    import time as _time

    from protocol.states import RunState
    from protocol.units import positive_duration as parse_duration

    since = None
    if args.since:
        try:
            since = _time.time() - parse_duration(args.since)
        except ValueError as exc:
            die(f"--since: {exc}", EXIT_USAGE)
    if args.limit <= 0:
        die("--limit must be positive", EXIT_USAGE)
    if args.fleet is not None and not limits_id_ok(args.fleet):
        die("--fleet wants a fleet id (fleet-...)", EXIT_USAGE)
    runs = await client.list_runs(
        args.hand, RunState(args.state) if args.state else None, since, args.limit, fleet=args.fleet
    )
    if args.json:
        print(json.dumps([_jsonable(r.model_dump(mode="python")) for r in runs], indent=2, default=str))
        return 0
    _table(RUN_HEADERS, [_run_row(r) for r in runs])
    return 0


async def cmd_status(client: Any, args: argparse.Namespace) -> int:
    st = await client.status()
    if args.json:
        print(json.dumps(_jsonable(st.model_dump(mode="python")), indent=2, default=str))
        return 0
    up = int(st.uptime_s)
    print(
        f"mind {st.mind_id}  version {st.version}  up {up // 3600}h{up % 3600 // 60:02d}m{up % 60:02d}s  "
        f"retained runs {st.retained_runs}"
    )
    live = st.hands_connected if st.hands_connected is not None else sum(1 for h in st.hands if h.connected)
    print(f"\nHANDS ({live} of {st.hands_total or len(st.hands)} connected)")
    _table(
        ["NAME", "CONNECTED", "GEN", "SINCE", "RUNNING"],
        [[h.name, "yes" if h.connected else "no", str(h.generation), _ts(h.since), str(h.running)] for h in st.hands],
    )
    if st.hands_total is not None and st.hands_total > len(st.hands):
        print(f"... and {st.hands_total - len(st.hands)} more: `mind hands` lists them all")
    active = st.active_runs_total if st.active_runs_total is not None else len(st.active_runs)
    print(f"\nRUNNING ({active})")
    _table(RUN_HEADERS, [_run_row(r) for r in st.active_runs])
    if active > len(st.active_runs):
        print(f"... and {active - len(st.active_runs)} more: `mind runs` lists them all")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(st.task_counts.items())) or "none"
    print(f"\nTASKS  {counts};  stale snapshots {st.stale_snapshots}")
    print(f"\nRECENT FAILURES ({len(st.recent_failures)})")
    _table(RUN_HEADERS, [_run_row(r) for r in st.recent_failures])
    return 0
