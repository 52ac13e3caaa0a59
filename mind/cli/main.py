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
    e.add_argument("--hand", required=True)
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

    h = sub.add_parser("hands", help="list Hands known to the Mind, live")
    conn_opts(h)
    h.add_argument("--json", action="store_true")

    _add_exec(sub)
    _add_shell(sub)

    c = sub.add_parser("call", help="call any tool on a Hand: mind call --hand H TOOL key=value ...")
    conn_opts(c)
    c.add_argument("--hand", required=True)
    c.add_argument("--args", dest="args_json", help="tool arguments as a JSON object")
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument("--raw", action="store_true", help="write the result's `data` bytes to stdout as they are")
    c.add_argument("tool")
    c.add_argument("kv", nargs="*", metavar="key=value", help="values are JSON if they parse, else strings")

    t = sub.add_parser("task", help="durable background tasks: start, get, logs, cancel, list")
    ts = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    st = ts.add_parser("start", help="start a background task; prints its id at once")
    conn_opts(st)
    st.add_argument("--hand", required=True)
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
    tl.add_argument("--offset", type=int, default=0)
    tl.add_argument("--follow", "-f", action="store_true", help="keep streaming until the task ends")
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
        die(exc.message)
    try:
        if args.cmd == "hands":
            return await cmd_hands(client, args)
        if args.cmd == "call":
            return await cmd_call(client, args)
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
        die(exc.message)
    finally:
        await client.close()


async def cmd_hands(client: Any, args: argparse.Namespace) -> int:
    hands = await client.hands()
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
            ]
        )
    _table(["NAME", "CONNECTED", "GEN", "SINCE", "HOST", "PLATFORM", "RUNNING"], rows)
    return 0


def _parse_kv(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            die(f"tool arguments are key=value, got {kv!r}", EXIT_USAGE)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


async def cmd_call(client: Any, args: argparse.Namespace) -> int:
    tool_args: dict[str, Any] = {}
    if args.args_json:
        try:
            tool_args = json.loads(args.args_json)
        except json.JSONDecodeError as exc:
            die(f"--args is not valid JSON: {exc}", EXIT_USAGE)
        if not isinstance(tool_args, dict):
            die("--args must be a JSON object", EXIT_USAGE)
    tool_args.update(_parse_kv(args.kv))
    end = await client.exec(args.hand, args.tool, tool_args, timeout=args.timeout)
    from protocol.states import RunState

    if end.state is RunState.SUCCEEDED:
        if args.raw and isinstance(end.value, dict) and isinstance(end.value.get("data"), bytes):
            sys.stdout.buffer.write(end.value["data"])
            sys.stdout.flush()
        else:
            print(json.dumps(_jsonable(end.value), indent=2))
        return 0
    if end.stdout.data:
        sys.stdout.buffer.write(end.stdout.data)
    if end.stderr.data:
        sys.stderr.buffer.write(end.stderr.data)
    _explain(end)
    if end.state is RunState.FAILED and end.exit_code is None and end.signal is None:
        return 1
    return exit_code_for(end)


async def cmd_run_get(client: Any, args: argparse.Namespace) -> int:
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
    runs = await client.list_runs(args.hand, RunState(args.state) if args.state else None, since, args.limit)
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
