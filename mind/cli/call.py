"""`mind call --hand H TOOL key=value ...`: any tool of a Hand, its arguments from the command line
(`key=value`, `key=@FILE`, `--args JSON`) and its value as JSON (bytes always `{"$bytes": BASE64}`),
or `--raw` bytes. Exit codes are `mind exec`'s (mind/cli/exits.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mind.cli import options
from mind.cli.connection import with_client
from mind.cli.exits import EXIT_INCOMPLETE, EXIT_USAGE, die, exit_code_for
from mind.cli.formatting import explain, printable
from mind.cli.hints import did_you_mean, hand_suggestions


def add_parsers(sub: Any) -> None:
    c = options.command(sub, "call", help="call any tool on a Hand: mind call --hand H TOOL key=value ...")
    options.connection(c)
    options.hand(c)
    c.add_argument(
        "--args", dest="args_json", help="tool arguments as a JSON object, @FILE to read it from a file, - from stdin"
    )
    options.timeout(c, 60.0, "the call's deadline passes")
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
    c.set_defaults(handler=with_client(call))


def parse_kv(items: list[str]) -> dict[str, Any]:
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
            out[k] = read_arg(v[1:], k)
            continue
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def read_arg(path: str, what: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        die(f"{what}=@{path}: {exc.strerror or exc}", EXIT_USAGE)


def json_args(text: str) -> dict[str, Any]:
    """`--args JSON`, `--args @FILE` or `--args -` (JSON from stdin); must be an object."""
    if text == "-" or text.startswith("@"):
        text = read_arg(text[1:] if text.startswith("@") else "-", "--args").decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        die(f"--args is not valid JSON: {exc}", EXIT_USAGE)
    if not isinstance(value, dict):
        die("--args must be a JSON object", EXIT_USAGE)
    return value


def json_value(v: Any) -> Any:
    """A tool's value as JSON, bytes always as {"$bytes": BASE64} (one shape, text or not)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        import base64

        return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
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


async def call(client: Any, args: argparse.Namespace) -> int:
    tool_args: dict[str, Any] = json_args(args.args_json) if args.args_json else {}
    tool_args.update(parse_kv(args.kv))
    end = await client.exec(args.hand, args.tool, tool_args, timeout=args.timeout)
    from protocol.codes import RejectCode
    from protocol.states import RunState

    if end.state is RunState.SUCCEEDED:
        if args.raw and isinstance(end.value, dict) and isinstance(end.value.get("data"), bytes):
            if args.tool == "read_file":
                return await _raw_pages(client, args, tool_args, end.value)
            sys.stdout.buffer.write(end.value["data"])
            sys.stdout.flush()
        else:
            print(json.dumps(json_value(end.value), indent=2))
        return 0
    if end.stdout.data:
        sys.stdout.buffer.write(end.stdout.data)
    if end.stderr.data:
        sys.stderr.buffer.write(end.stderr.data)
    explain(end)
    if end.reject_code is RejectCode.UNKNOWN_HAND and (close := await hand_suggestions(client, args.hand)):
        print(f"mind: {did_you_mean(close)}", file=sys.stderr)
    if end.state is RunState.FAILED and end.exit_code is None and end.signal is None:
        return 1
    return exit_code_for(end)
