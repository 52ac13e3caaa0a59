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
from typing import Any, NoReturn

EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 130
EXIT_REFUSED = 125
EXIT_BUDGET = 123
EXIT_LOST = 255
EXIT_USAGE = 2


def die(msg: str, code: int = EXIT_REFUSED) -> NoReturn:
    print(f"mind: {msg}", file=sys.stderr)
    raise SystemExit(code)


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

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None) -> None:
        if width is None:
            try:
                width = int(os.environ["COLUMNS"])
            except (KeyError, ValueError):
                try:
                    width = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
                except (AttributeError, ValueError, OSError):
                    width = 0
            width = (width or 80) - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _top_parser() -> tuple[argparse.ArgumentParser, Any]:
    p = argparse.ArgumentParser(prog="mind", description="mindhand: run commands and tools on remote machines.",
                                formatter_class=_Help)
    p.add_argument("--home", help="state directory (default $MINDHAND_HOME or ~/.local/state/mindhand)")
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
    _limit_opts(e)
    out = e.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object at the end instead of the output")
    out.add_argument("--events", action="store_true", help="print every event as one JSON line (NDJSON)")
    e.add_argument("argv", nargs="*", help="the command (after --)")


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
    if _command_word(argv) == "exec":
        p, sub = _top_parser()
        _add_exec(sub)
        return p.parse_args(argv)
    return _parser().parse_args(argv)


def _parser() -> argparse.ArgumentParser:
    p, sub = _top_parser()
    limit_opts, conn_opts = _limit_opts, _conn_opts

    from mind.config import GROUPS, KEYS
    from protocol.settings import add_flags

    file_help = "TOML settings file (default $MINDHAND_CONFIG, else HOME/mind.toml if it exists)"
    s = sub.add_parser("serve", help="run the Mind daemon",
                       description="Run the Mind. SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the config file "
                       "and applies the log level and handshake limits without dropping connections.")
    add_flags(s, KEYS, GROUPS, {}, file_help=file_help)
    cf = sub.add_parser("config", help="show the daemon's effective settings and where each comes from")
    cfs = cf.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cfs.add_parser("show", help="print every setting of `mind serve`, its value and its source",
                          description="Resolve the settings exactly as `mind serve` would with the same flags, "
                          "environment and file, and print each value with its source.")
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
            a.add_argument("--read-others", action="store_true",
                           help="may read and cancel other clients' runs and tasks (default: its own only)")
        ls = rs.add_parser("list", help=f"list {role} credentials")
        ls.add_argument("--json", action="store_true")
        rv = rs.add_parser("revoke", help=f"revoke a {role} credential; its live connections are closed at once")
        rv.add_argument("name")
        ro = rs.add_parser("rotate", help=f"give a {role} a new secret (printed once); the old one stops working at once")
        ro.add_argument("name")
        ro.add_argument("--out", help="also write the new credential to this file (mode 0600)")

    h = sub.add_parser("hands", help="list Hands known to the Mind, live")
    conn_opts(h)
    h.add_argument("--json", action="store_true")

    _add_exec(sub)

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
    st.add_argument("--max-runtime", default="24h", help="the Hand kills it after this long (e.g. 90s, 30m, 2h; max 24h)")
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
    rn.add_argument("--state", choices=["admitted", "sent", "accepted", "running", "cancel_requested", "succeeded",
                                        "failed", "rejected", "cancelled", "timed_out", "lost", "budget_exhausted"])
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


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    try:
        if args.cmd == "exec":
            from mind import exec_cli

            raise SystemExit(exec_cli.run(args))
        elif args.cmd == "serve":
            cmd_serve(args)
        elif args.cmd == "config":
            cmd_config_show(args)
        elif args.cmd in ("hand", "client"):
            cmd_credentials(args)
        else:
            import asyncio

            code = asyncio.run(_client_command(args))
            raise SystemExit(code)
    except KeyboardInterrupt:
        raise SystemExit(EXIT_CANCELLED)


# --- serve and local admin -----------------------------------------------------------------


def _settings_source(args: argparse.Namespace):
    from mind import paths
    from mind.config import KEYS, config_path
    from protocol.settings import Source, flags_given, read_file

    env = dict(os.environ)
    path, explicit = config_path(args.config, paths.home(args.home), env)
    return Source(keys=KEYS, flags=flags_given(args, KEYS), env=env, path=path, explicit=explicit, read=read_file)


def cmd_config_show(args: argparse.Namespace) -> None:
    from protocol.settings import ConfigError, format_table

    source = _settings_source(args)
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


def _reloader(source, started):
    """SIGHUP: the log level is applied here, the handshake limits by the Mind (new connections)."""
    from protocol import logs
    from protocol.settings import Reloader

    reread, log = Reloader(source, started), logs.get("mind")

    def reload() -> dict:
        changes = reread(log)
        if "log_level" in changes:
            logs.set_levels(changes["log_level"])
        return changes

    return reload


def cmd_serve(args: argparse.Namespace) -> None:
    import asyncio

    from mind import paths
    from mind.server import Mind, MindConfig
    from protocol import logs
    from protocol.settings import ConfigError

    home = paths.home(args.home)
    source = _settings_source(args)
    try:
        s = source.load()
        if bool(s["tls_cert"]) != bool(s["tls_key"]):
            missing, given = ("tls_key", "tls_cert") if s["tls_cert"] else ("tls_cert", "tls_key")
            raise s.fail(given, f"needs {missing} too (--tls-cert and --tls-key go together)")
    except ConfigError as exc:
        die(str(exc), EXIT_USAGE)
    host, _, port_text = s["listen"].rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    try:
        audit = logs.AuditLog(home / "audit.jsonl")
        stream = logs.ReopeningFile(s["log_file"]) if s["log_file"] else None
        logs.configure(s["log_format"], s["log_level"], stream=stream, audit=audit)
    except ValueError as exc:
        die(str(exc), EXIT_USAGE)
    except OSError as exc:
        die(f"cannot open the audit log in {home}: {exc.strerror}", 1)
    if s["tls_cert"]:
        from protocol.tls import TLSConfigError, server_context

        try:
            server_context(s["tls_cert"], s["tls_key"])
        except TLSConfigError as exc:
            die(str(exc), EXIT_USAGE)
    elif host not in ("127.0.0.1", "::1", "localhost"):
        print(
            f"mind: WARNING: serving {host} without TLS: anyone on the network path can read and alter "
            "the traffic (not the secrets). Use --tls-cert/--tls-key (scripts/mkcerts makes a local CA).",
            file=sys.stderr,
        )
    cfg = MindConfig(
        home=home, host=host, port=port, ping_interval=s["ping_interval"], ping_timeout=s["ping_interval"],
        tls_cert=_path(s["tls_cert"]) if s["tls_cert"] else None, tls_key=_path(s["tls_key"]) if s["tls_key"] else None,
        max_pending_handshakes=s["max_pending_handshakes"], auth_fail_limit=s["auth_fail_limit"],
        retain_runs=s["retain_runs"],
    )
    try:
        mind = Mind(cfg)
    except Exception as exc:  # noqa: BLE001 - one clear line for a bad state dir or database
        die(f"cannot open state in {home}: {exc}", 1)
    try:
        asyncio.run(mind.run(reload=_reloader(source, s)))
    except OSError as exc:
        die(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1)


def cmd_credentials(args: argparse.Namespace) -> None:
    from mind import paths
    from mind.store import Store, StoreError

    from mind.scope import FULL, Scope, parse_patterns

    home = paths.home(args.home)
    store = Store(paths.db_path(home))

    def audit(action: str) -> None:
        import datetime

        from protocol.logs import AuditLog

        a = AuditLog(home / "audit.jsonl")
        a.write({"event": "credential_changed", "role": args.cmd, "label": args.name, "action": action,
                 "by": "local admin (mind CLI)", "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat()})
        a.close()

    def show(cred, verb: str) -> None:
        if args.out:
            paths.write_private(_path(args.out), cred.token() + "\n")
        print(f"# {args.cmd} credential for {args.name!r} {verb}, shown once; keep it private", file=sys.stderr)
        print(cred.token())
        if args.out:
            print(f"# also written to {args.out} (mode 0600)", file=sys.stderr)

    def scope_of(row) -> str:
        if row.role != "client":
            return "-"
        return (FULL if row.label == "admin" else Scope.from_json(row.scope)).describe()

    try:
        if args.action == "add":
            scope = None
            if args.cmd == "client":
                try:
                    scope = Scope(
                        hands=parse_patterns(args.hands, "hands"), tools=parse_patterns(args.tools, "tools"),
                        read_others=args.read_others,
                    ).to_json()
                except ValueError as exc:
                    die(str(exc), EXIT_USAGE)
            try:
                cred = store.add(args.cmd, args.name, scope)
            except StoreError as exc:
                die(str(exc), 1)
            audit("add")
            show(cred, "created")
        elif args.action == "rotate":
            cred = store.rotate(args.cmd, args.name)
            if cred is None:
                die(f"no active {args.cmd} named {args.name!r}", 1)
            audit("rotate")
            if args.cmd == "client" and args.name == "admin":
                paths.write_private(paths.admin_cred_file(home), "# mindhand admin client credential (full scope); keep private\n" + cred.token() + "\n")
            show(cred, "rotated (the old secret no longer works; live connections are closed)")
        elif args.action == "list":
            rows = store.list(args.cmd)
            if args.json:
                print(json.dumps([{**r.__dict__, "scope": scope_of(r)} for r in rows], indent=2))
            else:
                _table(
                    ["NAME", "STATE", "GENERATION", "CREATED", "LAST SEEN", "SCOPE"],
                    [
                        [r.label, "revoked" if r.revoked_at else "active", str(r.generation), _ts(r.created_at),
                         _ts(r.last_seen_at), scope_of(r)]
                        for r in rows
                    ],
                )
        elif args.action == "revoke":
            if not store.revoke(args.cmd, args.name):
                die(f"no active {args.cmd} named {args.name!r}", 1)
            audit("revoke")
            print(f"revoked {args.cmd} {args.name!r}; it can no longer connect, and its live connections are closed")
    finally:
        store.close()


def _path(p: str):
    from pathlib import Path

    return Path(p).expanduser()


# --- client commands -----------------------------------------------------------------------


def _connection_params(args: argparse.Namespace) -> tuple[str, str, str | None, str | None]:
    """URL, credential file, CA file and pin: flags, then env vars, then the local Mind's files."""
    from mind import paths

    home = paths.home(args.home)
    local = False
    url = args.mind or os.environ.get("MINDHAND_URL")
    if not url:
        try:
            url = paths.url_file(home).read_text().strip()
            local = True
        except OSError:
            die(f"no Mind URL: pass --mind URL, set MINDHAND_URL, or start `mind serve` (looked in {paths.url_file(home)})")
    cred = args.credential or os.environ.get("MINDHAND_CREDENTIAL") or str(paths.admin_cred_file(home))
    ca = args.ca or os.environ.get("MINDHAND_CA")
    pin = args.pin or os.environ.get("MINDHAND_PIN")
    if local and not ca and not pin and url.startswith("wss://"):
        try:
            pin = paths.pin_file(home).read_text().strip()
        except OSError:
            pass
    return url, cred, ca, pin


async def _client_command(args: argparse.Namespace) -> int:
    from mind.client import ClientError, MindClient, load_credential

    url, cred_path, ca, pin = _connection_params(args)
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
            from mind import task_cli

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


def exit_code_for(end: Any) -> int:
    from protocol.states import RunState

    s = end.state
    if s in (RunState.SUCCEEDED, RunState.FAILED):
        if end.exit_code is not None:
            return end.exit_code
        if end.signal is not None:
            return 128 + end.signal
        return 0 if s is RunState.SUCCEEDED else 1
    return {
        RunState.TIMED_OUT: EXIT_TIMED_OUT,
        RunState.CANCELLED: EXIT_CANCELLED,
        RunState.REJECTED: EXIT_REFUSED,
        RunState.LOST: EXIT_LOST,
        RunState.BUDGET_EXHAUSTED: EXIT_BUDGET,
    }.get(s, 1)


def _text(b: bytes) -> Any:
    try:
        return b.decode()
    except UnicodeDecodeError:
        import base64

        return {"base64": base64.b64encode(b).decode()}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return _text(bytes(v))
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def end_summary(end: Any) -> dict[str, Any]:
    return {
        "run_id": end.run_id,
        "hand": end.hand,
        "tool": end.tool,
        "state": end.state.value,
        "reason": end.reason,
        "reject_code": end.reject_code.value if end.reject_code else None,
        "exit_code": end.exit_code,
        "signal": end.signal,
        "stage": end.stage.value if end.stage else None,
        "progress_dropped": end.progress_dropped,
        "truncated": end.truncated,
        "duration_ms": end.duration_ms,
        "error": end.error,
    }


class _StreamPrinter:
    """Writes streamed output live, marks gaps left by dropped progress, and completes the output
    from the result's tail so the user always sees how the command ended."""

    def __init__(self) -> None:
        self.upto = {"stdout": 0, "stderr": 0}
        self.out = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    def chunk(self, stream: str, offset: int, data: bytes) -> None:
        if offset < self.upto[stream]:
            data = data[self.upto[stream] - offset :]
            offset = self.upto[stream]
            if not data:
                return
        if offset > self.upto[stream]:
            self._gap(stream, offset - self.upto[stream])
        f = self.out[stream]
        f.write(data)
        f.flush()
        self.upto[stream] = offset + len(data)

    def _gap(self, stream: str, n: int) -> None:
        sys.stderr.buffer.write(f"\n[mindhand: {n} bytes of {stream} not shown: progress cap]\n".encode())
        sys.stderr.buffer.flush()

    def finish(self, stream: str, tail: Any) -> None:
        total, data = tail.total, tail.data
        if self.upto[stream] >= total or not data:
            return
        self.chunk(stream, total - len(data), data)


def _explain(end: Any) -> None:
    """One line on stderr for any end that is not the command's own exit."""
    from protocol.states import RunState

    s = end.state
    if s is RunState.SUCCEEDED or (s is RunState.FAILED and end.exit_code is not None):
        return
    detail = end.error or end.reason
    code = f" ({end.reject_code.value})" if end.reject_code else ""
    stage = f", stopped by SIG{end.stage.value.upper()}" if end.stage else ""
    print(f"mind: run {end.run_id} {s.value}{code}{stage}: {detail}", file=sys.stderr)


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
    print(f"run      {info.run_id}\nhand     {info.hand} (gen {info.gen})\ntool     {info.tool}\nstate    {info.state.value}")
    print(f"created  {_ts(info.created_at)}\nended    {_ts(info.ended_at)}")
    if info.end is not None:
        e = info.end
        print(f"exit     {e.exit_code}  signal {e.signal}  duration {e.duration_ms} ms  dropped {e.progress_dropped}")
        if e.reason:
            print(f"reason   {e.reason}")
    return 0


def _run_row(r: Any) -> list[str]:
    e = r.end
    exit_ = "-" if e is None or e.exit_code is None else str(e.exit_code)
    dur = "-" if e is None else f"{e.duration_ms / 1000:.2f}s"
    return [r.run_id, r.hand, r.tool, r.state.value, _ts(r.created_at), dur, exit_]


RUN_HEADERS = ["RUN", "HAND", "TOOL", "STATE", "CREATED", "DURATION", "EXIT"]


async def cmd_runs(client: Any, args: argparse.Namespace) -> int:
    import time as _time

    from mind.task_cli import parse_duration
    from protocol.states import RunState

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
    print(f"mind {st.mind_id}  version {st.version}  up {up // 3600}h{up % 3600 // 60:02d}m{up % 60:02d}s  "
          f"retained runs {st.retained_runs}")
    live = sum(1 for h in st.hands if h.connected)
    print(f"\nHANDS ({live} of {len(st.hands)} connected)")
    _table(["NAME", "CONNECTED", "GEN", "SINCE", "RUNNING"],
           [[h.name, "yes" if h.connected else "no", str(h.generation), _ts(h.since), str(h.running)] for h in st.hands])
    print(f"\nRUNNING ({len(st.active_runs)})")
    _table(RUN_HEADERS, [_run_row(r) for r in st.active_runs])
    counts = ", ".join(f"{k} {v}" for k, v in sorted(st.task_counts.items())) or "none"
    print(f"\nTASKS  {counts};  stale snapshots {st.stale_snapshots}")
    print(f"\nRECENT FAILURES ({len(st.recent_failures)})")
    _table(RUN_HEADERS, [_run_row(r) for r in st.recent_failures])
    return 0


# --- formatting ----------------------------------------------------------------------------


def tool_args_from(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """`--shell COMMAND` or `-- ARGV`, plus `--cwd` and `--env`, as a tool call."""
    if args.shell is not None and args.argv:
        die("give either --shell COMMAND or -- ARGV, not both", EXIT_USAGE)
    if args.shell is None and not args.argv:
        die("nothing to run: give -- ARGV or --shell COMMAND", EXIT_USAGE)
    tool_args: dict[str, Any] = {"command": args.shell} if args.shell is not None else {"argv": list(args.argv)}
    if args.cwd:
        tool_args["cwd"] = args.cwd
    if args.env:
        env = {}
        for kv in args.env:
            k, sep, v = kv.partition("=")
            if not sep or not k:
                die(f"--env wants K=V, got {kv!r}", EXIT_USAGE)
            env[k] = v
        tool_args["env"] = env
    lim: dict[str, int] = {}
    for flag, key in (("cpu_seconds", "cpu_seconds"), ("max_files", "open_files"), ("max_procs", "processes")):
        value = getattr(args, flag, None)
        if value is not None:
            if value <= 0:
                die(f"--{flag.replace('_', '-')} must be positive", EXIT_USAGE)
            lim[key] = value
    if getattr(args, "memory", None):
        lim["address_space"] = _size(args.memory)
    if lim:
        tool_args["limits"] = lim
    return ("shell" if args.shell is not None else "exec"), tool_args


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = units.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if t[-1:] in units else t) * mult)
    except ValueError:
        die(f"{text!r} is not a size (use e.g. 512M)", EXIT_USAGE)
    if value <= 0:
        die(f"size {text!r} must be positive", EXIT_USAGE)
    return value


def _ts(t: float | None) -> str:
    if not t:
        return "-"
    import datetime

    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    main()
