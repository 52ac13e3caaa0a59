"""`mindhand-faultproxy`: the fault proxy as a program, and a one-shot sender of commands.

    mindhand-faultproxy --listen 127.0.0.1:7471 --target 127.0.0.1:7470 --control 127.0.0.1:7472
    hand run --mind ws://127.0.0.1:7471 ...
    mindhand-faultproxy --control 127.0.0.1:7472 --send 'frame hold result up'

On start it prints one JSON line with the ports it listens on and its token file
(`{"listen": N, "control": M, "token_file": PATH}`), so a caller that asked for port 0 learns them;
the command grammar is in `mindhand-faultproxy --help`. A command needs the token (`--send` reads
it from the file): only the proxy's owner can drive it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from mind.testing.faultproxy import GRAMMAR
from mind.testing.faultproxy.proxy import Proxy
from mind.testing.faultproxy.token import default_path, read_token, send, write_token


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise SystemExit(f"mindhand-faultproxy: {text!r} is not HOST:PORT") from None


async def serve(args: argparse.Namespace) -> None:
    proxy = Proxy(_addr(args.target) if args.target else None, seed=args.seed)
    try:
        await proxy.start(_addr(args.listen), _addr(args.control))
    except OSError as exc:
        raise SystemExit(f"mindhand-faultproxy: cannot listen: {exc.strerror or exc}") from None
    path = Path(args.token_file) if args.token_file else default_path(proxy.control_port)
    try:
        proxy.token = write_token(path)
    except OSError as exc:
        await proxy.close()
        raise SystemExit(f"mindhand-faultproxy: cannot write the token file {path}: {exc.strerror or exc}") from None
    print(json.dumps({"listen": proxy.port, "control": proxy.control_port, "token_file": str(path)}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.close()
    path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="mindhand-faultproxy",
        description="A fault-injecting TCP proxy that understands mindhand's WebSocket frames.",
        epilog=GRAMMAR,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--listen", default="127.0.0.1:0", help="where clients connect (default 127.0.0.1:0)")
    ap.add_argument("--target", help="where the proxy connects them (HOST:PORT, the Mind); later: the `target` command")
    ap.add_argument("--control", default="127.0.0.1:0", help="the command port (default 127.0.0.1:0)")
    ap.add_argument(
        "--token-file",
        help="the control token's file (0600): written by the proxy, read by --send "
        "(default: ~/.cache/mindhand-faultproxy/CONTROL_PORT.token)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of probabilities, jitter and slices (default 0)")
    ap.add_argument("--send", metavar="COMMAND", help="send one command to a running proxy's --control port and exit")
    args = ap.parse_args(argv)
    if args.send is not None:
        addr = _addr(args.control)
        path = Path(args.token_file) if args.token_file else default_path(addr[1])
        try:
            token = read_token(path)
        except OSError as exc:
            print(f"mindhand-faultproxy: cannot read the token file {path}: {exc.strerror or exc}", file=sys.stderr)
            raise SystemExit(2) from None
        try:
            reply = send(addr, token, args.send)
        except OSError as exc:
            print(f"mindhand-faultproxy: cannot reach {args.control}: {exc.strerror or exc}", file=sys.stderr)
            raise SystemExit(2) from None
        print(reply)
        raise SystemExit(0 if reply.startswith("ok") else 1)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
