"""`mindhand-faultproxy`: the fault proxy as a program, and a one-shot sender of commands.

    mindhand-faultproxy --listen 127.0.0.1:7471 --target 127.0.0.1:7470 --control 127.0.0.1:7472
    hand run --mind ws://127.0.0.1:7471 ...
    mindhand-faultproxy --control 127.0.0.1:7472 --send 'frame hold result up'

On start it prints one JSON line with the ports it listens on (`{"listen": N, "control": M}`), so
a caller that asked for port 0 learns them; the command grammar is in `mindhand-faultproxy --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys

from mind.testing.faultproxy import GRAMMAR
from mind.testing.faultproxy.proxy import Proxy


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
    print(json.dumps({"listen": proxy.port, "control": proxy.control_port}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.close()


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
    ap.add_argument("--seed", type=int, default=0, help="seed of probabilities, jitter and slices (default 0)")
    ap.add_argument("--send", metavar="COMMAND", help="send one command to a running proxy's --control port and exit")
    args = ap.parse_args(argv)
    if args.send is not None:
        try:
            with socket.create_connection(_addr(args.control), timeout=10) as s:
                s.sendall(args.send.encode() + b"\n")
                reply = s.makefile("rb").readline().decode().strip()
        except OSError as exc:
            print(f"mindhand-faultproxy: cannot reach {args.control}: {exc.strerror or exc}", file=sys.stderr)
            raise SystemExit(2) from None
        print(reply)
        raise SystemExit(0 if reply.startswith("ok") else 1)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
