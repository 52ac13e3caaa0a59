"""`mind task ...`: background tasks from the command line.

Exit codes: 0 when the request did what it says (including "the Hand is offline, here is the stale
snapshot" and "cancel recorded for delivery"); 125 refused / unknown task / Hand offline for logs;
255 when a start's outcome is unknown (sent, no answer); 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from mind.cli.output import EXIT_LOST, EXIT_REFUSED, EXIT_USAGE, _table, _ts, die, printable, tool_args_from
from mind.cli.progress import Status, elapsed
from mind.client.aio import ClientError, MindClient
from protocol import limits
from protocol.codes import TaskCancelStatus
from protocol.messages import TaskView
from protocol.states import TASK_TERMINAL, TaskState
from protocol.units import positive_duration as parse_duration

LOGS_QUIET_S = 2.0
"""`logs --follow` shows its status line once the log has been silent this long (on a terminal)."""
CANCEL_STATUS_AFTER_S = 1.0


def view_json(v: TaskView) -> dict[str, Any]:
    info = v.task
    return {
        "task_id": v.task_id,
        "hand": v.hand,
        "state": v.state.value,
        "stale": v.stale,
        "last_synced_at": v.last_synced_at,
        "cancel_pending": v.cancel_pending,
        "tool": info.tool if info else None,
        "created_at": info.created_at if info else v.created_at,
        "started_at": info.started_at if info else None,
        "finished_at": info.finished_at if info else None,
        "exit_code": info.exit_code if info else None,
        "signal": info.signal if info else None,
        "reason": (info.reason if info else "") or v.reason,
        "error": info.error if info else None,
        "log_bytes": info.log_bytes if info else 0,
        "truncated": info.truncated if info else False,
        "max_runtime_ms": info.max_runtime_ms if info else None,
        "args_digest": info.args_digest if info else None,
    }


def freshness(v: TaskView) -> str:
    if not v.stale:
        return f"fresh (synced {_ts(v.last_synced_at)})"
    when = _ts(v.last_synced_at) if v.last_synced_at else "never"
    return f"STALE: hand {v.hand!r} is not connected; this is what the Mind last heard (synced {when})"


async def run(client: MindClient, args: argparse.Namespace) -> int:
    try:
        return await {
            "start": start,
            "get": get,
            "logs": logs,
            "cancel": cancel,
            "list": list_,
        }[args.action](client, args)
    except ClientError as exc:
        die(exc.message, EXIT_REFUSED)


async def start(client: MindClient, args: argparse.Namespace) -> int:
    try:
        max_runtime = parse_duration(args.max_runtime)
    except ValueError as exc:
        die(f"--max-runtime: {exc}", EXIT_USAGE)
    if max_runtime * 1000 > limits.MAX_RUNTIME_MAX_MS:
        die("--max-runtime is at most 24h", EXIT_USAGE)
    if args.task_id is not None and not limits.ID_RE.match(args.task_id):
        die("--id must be 1-128 of A-Z a-z 0-9 . _ - , starting with a letter or digit", EXIT_USAGE)
    tool, tool_args = tool_args_from(args)
    res = await client.task_start(args.hand, tool, tool_args, max_runtime=max_runtime, task_id=args.task_id)
    if args.json:
        print(
            json.dumps(
                {
                    "task_id": res.task_id,
                    "hand": res.hand,
                    "outcome": res.outcome,
                    "reject_code": res.reject_code.value if res.reject_code else None,
                    "message": res.message,
                    "state": res.view.state.value if res.view else None,
                }
            )
        )
    elif res.outcome in ("accepted", "duplicate"):
        print(res.task_id)
        note = " (already existed with this binding: nothing new was run)" if res.outcome == "duplicate" else ""
        print(f"mind: task {res.task_id} accepted by {res.hand}{note}", file=sys.stderr)
    else:
        code = f" ({res.reject_code.value})" if res.reject_code else ""
        print(f"mind: task {res.task_id} {res.outcome}{code}: {printable(res.message)}", file=sys.stderr)
    if res.outcome in ("accepted", "duplicate"):
        return 0
    return EXIT_LOST if res.outcome == "unknown" else EXIT_REFUSED


async def get(client: MindClient, args: argparse.Namespace) -> int:
    v = await client.task_get(args.task_id)
    if args.json:
        print(json.dumps(view_json(v), indent=2))
        return 0
    d = view_json(v)
    print(f"task      {v.task_id}\nhand      {v.hand}\nstate     {v.state.value}")
    print(f"freshness {freshness(v)}")
    if v.cancel_pending:
        print("cancel    requested; will be delivered when the hand reconnects")
    print(f"created   {_ts(d['created_at'])}\nstarted   {_ts(d['started_at'])}\nfinished  {_ts(d['finished_at'])}")
    exit_line = d["exit_code"] if d["exit_code"] is not None else "-"
    if d["signal"] is not None:
        exit_line = f"{exit_line} (signal {d['signal']})"
    print(f"exit      {exit_line}")
    print(f"log       {d['log_bytes']} bytes{' (truncated at its bound)' if d['truncated'] else ''}")
    if d["reason"]:
        print(f"reason    {printable(d['reason'])}")
    if d["error"]:
        print(f"error     {printable(d['error'])}")
    return 0


async def logs(client: MindClient, args: argparse.Namespace) -> int:
    if args.offset < 0:
        die("--offset must be >= 0", EXIT_USAGE)
    offset = args.offset
    out = sys.stdout.buffer
    # On a terminal, a silent log says what it is waiting for: the task's state and its size so far
    # (erased before the next output; nothing at all when stderr is not a terminal).
    with Status(sys.stderr, enabled=args.follow) as status:
        quiet_since = time.monotonic()
        while True:
            page = await client.task_logs(args.task_id, offset)
            if page.data:
                status.clear()
                out.write(page.data)
                out.flush()
                quiet_since = time.monotonic()
            offset = page.next_offset
            if page.eof or (not args.follow and not page.data):
                break
            if not args.follow and page.next_offset >= page.log_bytes:
                break
            if not page.data:
                quiet = time.monotonic() - quiet_since
                if quiet >= LOGS_QUIET_S:
                    status.show(
                        f"task {args.task_id} {page.state.value}, {page.log_bytes} bytes so far; "
                        f"waiting for output... {elapsed(quiet)}"
                    )
                await asyncio.sleep(0.3)
    if page.truncated and page.eof:
        print(f"\n[mindhand: the log was truncated at its bound of {page.log_bytes} bytes]", file=sys.stderr)
    return 0


async def cancel(client: MindClient, args: argparse.Namespace) -> int:
    reply = await client.task_cancel(args.task_id)
    st = reply.status
    if st is TaskCancelStatus.UNKNOWN_TASK:
        die(f"no task {args.task_id}", EXIT_REFUSED)
    if st is TaskCancelStatus.ALREADY_DONE:
        state = reply.view.state.value if reply.view else "ended"
        print(f"task {args.task_id} had already ended: {state}")
        return 0
    if st is TaskCancelStatus.PENDING_DELIVERY:
        hand = reply.view.hand if reply.view else "its hand"
        print(f"cancel recorded: hand {hand!r} is offline; it will be delivered when the hand reconnects")
        return 0
    print("cancel requested", flush=True)
    if args.no_wait:
        return 0
    t0 = time.monotonic()
    deadline = t0 + args.wait_timeout
    with Status(sys.stderr) as status:
        while time.monotonic() < deadline:
            v = await client.task_get(args.task_id)
            if v.state in TASK_TERMINAL:
                status.clear()
                why = f" ({printable(v.task.reason)})" if v.task and v.task.reason else ""
                print(f"task {args.task_id} {v.state.value}{why}")
                return 0
            waited = time.monotonic() - t0
            if waited >= CANCEL_STATUS_AFTER_S:
                stale = " (last heard: its hand is offline)" if v.stale else ""
                status.show(f"waiting for task {args.task_id} to end: {v.state.value}{stale}... {elapsed(waited)}")
            await asyncio.sleep(0.2)
    print(f"mind: task {args.task_id} has not ended yet; `mind task get {args.task_id}` will tell", file=sys.stderr)
    return 0


async def list_(client: MindClient, args: argparse.Namespace) -> int:
    state = TaskState(args.state) if args.state else None
    views = await client.task_list(args.hand, state, args.limit)
    if args.json:
        print(json.dumps([view_json(v) for v in views], indent=2))
        return 0
    rows = []
    for v in views:
        d = view_json(v)
        rows.append(
            [
                v.task_id,
                v.hand,
                v.state.value,
                "stale" if v.stale else "fresh",
                _ts(d["created_at"]),
                "-" if d["exit_code"] is None else str(d["exit_code"]),
                str(d["log_bytes"]),
            ]
        )
    _table(["TASK", "HAND", "STATE", "SYNC", "CREATED", "EXIT", "LOG BYTES"], rows)
    return 0
