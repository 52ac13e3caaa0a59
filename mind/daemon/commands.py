"""The daemon side of the `mind` command: `mind serve` and the local credential admin
(`mind hand add`, `mind client rotate`, ...), which open the Mind's own database: their parsers
(`add_parsers`, the shape of every command module in mind/cli) and what they do. The client
commands never import this module, nor this module theirs (tests/layout); `mind.main` adds these
parsers to theirs. What both sides share (`--json`, `--label`, tables, times, the settings file's
help) sits below both (mind/commandline.py, mind/config.py); a failure is `fail`, which
`mind.cli.main.run` says as the CLI's `die` would."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mind import commandline
from mind.commandline import EXIT_USAGE, fail, table, timestamp
from mind.config import FILE_HELP, settings_source
from mind.core.nodes import NODE_LABEL
from protocol.io import gcstart, heap


def add_parsers(sub: Any) -> None:
    """`mind serve`, `mind hand ...` and `mind client ...`."""
    from mind.config import GROUPS, KEYS
    from protocol.io.settings import add_flags

    s = sub.add_parser(
        "serve",
        help="run the Mind daemon",
        description="Run the Mind. SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the config file "
        "and applies the log level and handshake limits without dropping connections.",
    )
    add_flags(s, KEYS, GROUPS, {}, file_help=FILE_HELP)
    s.set_defaults(handler=cmd_serve)
    for role in ("hand", "client"):
        _add_role(sub, role)


def _add_role(sub: Any, role: str) -> None:
    r = sub.add_parser(role, help=f"manage {role} credentials (local, no daemon needed)")
    r.set_defaults(handler=cmd_credentials)
    rs = r.add_subparsers(dest="action", required=True, metavar="ACTION")
    out_help = "write the credential to this file (mode 0600) instead of printing it"
    a = rs.add_parser("add", help=f"create a {role} credential and print it once (or write it: --out)")
    a.add_argument("name")
    a.add_argument("--out", help=out_help)
    if role == "hand":
        commandline.labels(a, "a label fleet selectors match (`--hands role=web`); repeatable")
    if role == "client":
        a.add_argument("--hands", help="Hands it may use: names or globs, comma-separated (default: all)")
        a.add_argument("--tools", help="tools it may use: names or globs, comma-separated (default: all)")
        a.add_argument(
            "--read-others",
            action="store_true",
            help="may read and cancel other clients' runs and tasks (default: its own only)",
        )
        a.add_argument(
            "--recordings",
            action="store_true",
            help="may list, play and verify the recordings of any client's runs on the Hands it may use "
            "(default: those of its own runs only)",
        )
    ls = rs.add_parser("list", help=f"list {role} credentials")
    commandline.json_output(ls)
    rv = rs.add_parser("revoke", help=f"revoke a {role} credential; its live connections are closed at once")
    rv.add_argument("name")
    ro = rs.add_parser("rotate", help=f"give a {role} a new secret (printed once); the old one stops working at once")
    ro.add_argument("name")
    ro.add_argument("--out", help=out_help)
    for p in (a, ls, rv, ro):
        _database_flag(p)
    if role == "hand":
        lb = rs.add_parser(
            "label",
            help="set or remove a Hand's labels (the Mind's facts that --hands selectors match)",
            description="Set labels with K=V, remove one with K- (or -K after --). "
            "A running Mind uses the new labels at the next selection.",
        )
        lb.add_argument("name")
        lb.add_argument("edits", nargs="+", metavar="K=V|K-")
        _database_flag(lb)


def _database_flag(p: Any) -> None:
    p.add_argument(
        "--database",
        metavar="URL",
        help="the shared database to change (default: $MINDHAND_DATABASE, `database` in mind.toml, "
        "else the one this home's Mind serves from)",
    )


def _reloader(source, started):
    """SIGHUP: the log level is applied here, the handshake limits by the Mind (new connections)."""
    from protocol.io import logs
    from protocol.io.settings import Reloader

    reread, log = Reloader(source, started), logs.get("mind")

    def reload() -> dict:
        changes = reread(log)
        if "log_level" in changes:
            logs.set_levels(changes["log_level"])
        return changes

    return reload


def cmd_serve(args: argparse.Namespace) -> None:
    import asyncio

    from mind import home as paths
    from mind.daemon.server import CannotOpen, Mind, MindConfig
    from protocol.io import logs
    from protocol.io.settings import ConfigError
    from protocol.units import parse_size

    home = paths.home(args.home)
    source = settings_source(args)
    try:
        s = source.load()
        if bool(s["tls_cert"]) != bool(s["tls_key"]):
            missing, given = ("tls_key", "tls_cert") if s["tls_cert"] else ("tls_cert", "tls_key")
            raise s.fail(given, f"needs {missing} too (--tls-cert and --tls-key go together)")
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    host, _, port_text = s["listen"].rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    try:
        audit = logs.AuditLog(home / "audit.jsonl")
        stream = logs.ReopeningFile(s["log_file"]) if s["log_file"] else None
        logs.configure(s["log_format"], s["log_level"], stream=stream, audit=audit)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except OSError as exc:
        fail(f"cannot open the audit log in {home}: {exc.strerror}", 1)
    if s["tls_cert"]:
        from protocol.io.tls import TLSConfigError, server_context

        try:
            server_context(s["tls_cert"], s["tls_key"])
        except TLSConfigError as exc:
            fail(str(exc), EXIT_USAGE)
    elif host not in ("127.0.0.1", "::1", "localhost"):
        print(
            f"mind: WARNING: serving {host} without TLS: anyone on the network path can read and alter "
            "the traffic (not the secrets). Use --tls-cert/--tls-key (scripts/mkcerts makes a local CA).",
            file=sys.stderr,
        )
    cfg = MindConfig(
        home=home,
        host=host,
        port=port,
        ping_interval=s["ping_interval"],
        ping_timeout=s["ping_interval"],
        tls_cert=_path(s["tls_cert"]) if s["tls_cert"] else None,
        tls_key=_path(s["tls_key"]) if s["tls_key"] else None,
        max_pending_handshakes=s["max_pending_handshakes"],
        auth_fail_limit=s["auth_fail_limit"],
        retain_runs=s["retain_runs"],
        resume_window=s["resume_window"],
        keep_max=s["keep_max"],
        database=s["database"] or None,
        node_lease=s["node_lease"],
        node_name=s["node_name"] or None,
        node_url=s["node_url"] or None,
        record=s["record"],
        record_max_bytes=parse_size(s["record_max_bytes"]),
        record_strict=s["record_strict"],
        record_retention=s["record_retention"],
        record_key=s["record_key"] or None,
        record_dir=_path(s["record_dir"]) if s["record_dir"] else None,
    )
    try:
        mind = Mind(cfg)
    except Exception as exc:  # one clear line for a bad state dir or database
        fail(f"cannot open state in {home}: {exc}", 1)
    heap.keep_large_buffers()
    gcstart.started()
    try:
        asyncio.run(mind.run(reload=_reloader(source, s)))
    except CannotOpen as exc:  # the home, or the shared database (unreachable, schema too new)
        fail(str(exc), exc.code)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1)
    finally:
        audit.close()  # writes the counts of repeated refusals not yet written


def cmd_credentials(args: argparse.Namespace) -> None:
    from mind import home as paths
    from mind.core.scope import Scope, parse_patterns
    from mind.store.credentials import StoreError

    home = paths.home(args.home)
    store = _open_credentials(args, home)

    def audit(action: str) -> None:
        import datetime

        from protocol.audit import AuditEvent
        from protocol.io.logs import AuditLog

        a = AuditLog(home / "audit.jsonl")
        a.write(
            {
                "event": AuditEvent.CREDENTIAL_CHANGED,
                "role": args.cmd,
                "label": args.name,
                "action": action,
                "by": "local admin (mind CLI)",
                "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
            }
        )
        a.close()

    def show(cred, verb: str) -> None:
        """With `--out`, the secret goes to that file only: a terminal's scrollback, a CI log or a
        shell's `$(...)` never holds it (issue 24). Should that write still fail (the place was
        tried first: `_check_out`; a full disk), it is shown on stdout instead, so it is never lost."""
        if args.out:
            try:
                paths.write_private(_path(args.out), cred.token() + "\n")
            except OSError as exc:
                print(cred.token(), flush=True)
                fail(
                    f"the credential was {verb.split(' ')[0]} and is shown above, but --out {args.out} could not be "
                    f"written: {exc.strerror or exc}",
                    1,
                )
            print(
                f"# {args.cmd} credential for {args.name!r} {verb}, written to {args.out} (mode 0600)", file=sys.stderr
            )
            return
        print(f"# {args.cmd} credential for {args.name!r} {verb}, shown once; keep it private", file=sys.stderr)
        print(cred.token(), flush=True)

    if args.cmd == "client" and args.action in ("add", "rotate") and getattr(args, "name", None) == NODE_LABEL:
        # its secret must never be in a file: whoever holds it may act for any client (DESIGN §16)
        fail(f"{NODE_LABEL!r} is the Mind nodes' own credential: the nodes make it and never write it out", EXIT_USAGE)

    if getattr(args, "out", None) and args.action in ("add", "rotate"):
        _check_out(args.out)

    def scope_of(row) -> str:
        if row.role != "client":
            return "-"
        return Scope.from_json(row.scope).describe()

    try:
        if args.action == "add":
            scope = None
            if args.cmd == "client":
                try:
                    scope = Scope(
                        hands=parse_patterns(args.hands, "hands"),
                        tools=parse_patterns(args.tools, "tools"),
                        read_others=args.read_others,
                        recordings=args.recordings,
                    ).to_json()
                except ValueError as exc:
                    fail(str(exc), EXIT_USAGE)
            labels = _labels(getattr(args, "labels", None) or [])
            try:
                cred = store.add(args.cmd, args.name, scope, labels)
            except StoreError as exc:
                fail(str(exc), 1)
            audit("add")
            show(cred, "created")
        elif args.action == "label":
            from mind.core.selector import SelectorError, parse_label_edits

            try:
                set_, remove = parse_label_edits(args.edits)
            except SelectorError as exc:
                fail(str(exc), EXIT_USAGE)
            try:
                now = store.set_labels(args.cmd, args.name, set_, remove)
            except StoreError as exc:
                fail(str(exc), 1)
            if now is None:
                fail(f"no active {args.cmd} named {args.name!r}", 1)
            audit("label")
            shown = ",".join(f"{k}={v}" for k, v in now.items()) or "(none)"
            print(f"{args.cmd} {args.name!r} labels: {shown}")
        elif args.action == "rotate":
            rotated = store.rotate(args.cmd, args.name)
            if rotated is None:
                fail(f"no active {args.cmd} named {args.name!r}", 1)
            audit("rotate")
            if args.cmd == "client" and args.name == "admin":
                paths.write_private(
                    paths.admin_cred_file(home),
                    "# mindhand admin client credential (full scope); keep private\n" + rotated.token() + "\n",
                )
            show(rotated, "rotated (the old secret no longer works; live connections are closed)")
        elif args.action == "list":
            rows = store.list(args.cmd)
            if args.json:
                print(
                    json.dumps([{**r.__dict__, "scope": scope_of(r), "labels": r.label_map()} for r in rows], indent=2)
                )
            else:
                table(
                    ["NAME", "STATE", "GENERATION", "CREATED", "LAST SEEN", "SCOPE", "LABELS"],
                    [
                        [
                            r.label,
                            "revoked" if r.revoked_at else "active",
                            str(r.generation),
                            timestamp(r.created_at),
                            timestamp(r.last_seen_at),
                            scope_of(r),
                            ",".join(f"{k}={v}" for k, v in r.label_map().items()) or "-",
                        ]
                        for r in rows
                    ],
                )
        elif args.action == "revoke":
            if not store.revoke(args.cmd, args.name):
                fail(f"no active {args.cmd} named {args.name!r}", 1)
            audit("revoke")
            print(f"revoked {args.cmd} {args.name!r}; it can no longer connect, and its live connections are closed")
    finally:
        store.close()


def _open_credentials(args: argparse.Namespace, home: Any) -> Any:
    """The credential store the admin commands change: the shared database when one is set for
    this home (`$MINDHAND_DATABASE` or `database` in mind.toml), else the home's SQLite file."""
    from mind import home as paths
    from mind.config import database_setting
    from mind.store.api import SchemaTooNew, StoreUnavailable
    from mind.store.credentials import Store
    from protocol.io.settings import ConfigError

    try:
        database = database_setting(args)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    if not database:
        return Store(paths.db_path(home))
    from mind.store.engines import BlockingCredentials

    try:
        return BlockingCredentials(home, database)
    except (StoreUnavailable, SchemaTooNew) as exc:
        fail(str(exc), 1)


def _check_out(out: str) -> None:
    """`--out` must be writable before the credential exists (issue 14): a write that fails after
    `add` leaves a credential whose secret nobody saw, and the retry says "already exists"; after
    `rotate` the old secret is gone too. So the destination is tried first: the nearest existing
    directory gets (and loses) a probe file, as `write_private` will create its temporary there."""
    import os
    import secrets

    path = _path(out)
    if path.is_dir() and not path.is_symlink():  # a planted link is replaced, never followed (issue 13)
        fail(f"--out {out} is a directory: give the file to write; nothing was created", EXIT_USAGE)
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        fail(f"--out {out}: {parent} is not a directory; nothing was created", EXIT_USAGE)
    probe = parent / f".{path.name}.{secrets.token_hex(6)}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
    except OSError as exc:
        fail(f"cannot write --out {out} (in {parent}: {exc.strerror or exc}); nothing was created", EXIT_USAGE)


def _path(p: str):
    from pathlib import Path

    return Path(p).expanduser()


def _labels(items: list[str]) -> dict[str, str] | None:
    """`--label K=V` (repeatable) as a dict, or a usage error naming the bad one."""
    from mind.core.selector import SelectorError, parse_label

    out: dict[str, str] = {}
    for item in items:
        try:
            k, v = parse_label(item)
        except SelectorError as exc:
            fail(str(exc), EXIT_USAGE)
        out[k] = v
    return out or None
