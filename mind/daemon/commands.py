"""The daemon side of the `mind` command: `mind serve` and the local credential admin
(`mind hand add`, `mind client rotate`, ...), which open the Mind's own database. The client
commands never import this module (tests/layout); `mind.main` dispatches here."""

from __future__ import annotations

import argparse
import json
import sys

from mind.cli.output import EXIT_USAGE, _table, _ts, die
from mind.config import settings_source as _settings_source


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
    from mind.daemon.server import Mind, MindConfig
    from protocol.io import logs
    from protocol.io.settings import ConfigError

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
        from protocol.io.tls import TLSConfigError, server_context

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
    )
    try:
        mind = Mind(cfg)
    except Exception as exc:  # one clear line for a bad state dir or database
        die(f"cannot open state in {home}: {exc}", 1)
    try:
        asyncio.run(mind.run(reload=_reloader(source, s)))
    except OSError as exc:
        die(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1)
    finally:
        audit.close()  # writes the counts of repeated refusals not yet written


def cmd_credentials(args: argparse.Namespace) -> None:
    from mind import home as paths
    from mind.core.scope import Scope, parse_patterns
    from mind.store.credentials import Store, StoreError

    home = paths.home(args.home)
    store = Store(paths.db_path(home))

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
        if args.out:
            paths.write_private(_path(args.out), cred.token() + "\n")
        print(f"# {args.cmd} credential for {args.name!r} {verb}, shown once; keep it private", file=sys.stderr)
        print(cred.token())
        if args.out:
            print(f"# also written to {args.out} (mode 0600)", file=sys.stderr)

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
            rotated = store.rotate(args.cmd, args.name)
            if rotated is None:
                die(f"no active {args.cmd} named {args.name!r}", 1)
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
                print(json.dumps([{**r.__dict__, "scope": scope_of(r)} for r in rows], indent=2))
            else:
                _table(
                    ["NAME", "STATE", "GENERATION", "CREATED", "LAST SEEN", "SCOPE"],
                    [
                        [
                            r.label,
                            "revoked" if r.revoked_at else "active",
                            str(r.generation),
                            _ts(r.created_at),
                            _ts(r.last_seen_at),
                            scope_of(r),
                        ]
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
