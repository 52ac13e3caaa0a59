"""`mind task ...`: background tasks from the command line.

Exit codes: 0 when the request did what it says (including "the Hand is offline, here is the stale
snapshot" and "cancel recorded for delivery"); 125 refused (an unknown task, the Hand offline for
`logs` and `rm`, `rm` of a task that has not ended); 255 when a start's outcome is unknown (sent, no
answer); 2 bad usage.

`mind task wait ID` and `mind task logs ID --follow` end with the TASK's outcome instead (issue 14),
by the table of `mind exec` (`mind.cli.exits.task_exit_code`), so `mind task wait ID && deploy`
means what it says:

    succeeded   0
    failed      the command's exit code (128+N if signal N killed it; 127/126: it could not start)
    timed_out   124 (its --max-runtime passed; the Hand killed it)
    cancelled   130 (a cancel, or the Hand's clean shutdown)
    lost        255 (nobody can know how it ended: the Hand restarted before it finished)
    121         `wait --timeout` passed first; the task goes on (not 124: that one ended timed_out)

Both ride out a restart of the Mind and a cut of the connection: task state lives on the Hand and
in the Mind's snapshot store, so asking again is safe. They reconnect (backoff with jitter) and ask
again for as long as the Mind's resume window (60 s if it announced none), then give up with 125
and the reason; `logs --follow` goes on from the byte offset it printed up to, so nothing is
printed twice and nothing is skipped.

Only a terminal state the Mind reports is an outcome: a stale view (the Hand is offline) or an
ending the Hand has not recorded yet (`uncommitted`) keeps waiting and says so on a terminal.
`task logs` without --follow exits 0: it shows a log, not an outcome.

The log bytes always go to stdout, whichever `--stream` is read: the log is the output of this
command (`mind task logs ID --stream stderr | grep ...`). The combined log (the default) is plain
bytes in arrival order and does not record which stream a byte came from; `--stream stdout` and
`--stream stderr` read the Hand's file for that stream, with `--offset` counting its bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mind.cli import options
from mind.cli.connection import with_client
from mind.cli.exits import EXIT_LOST, EXIT_REFUSED, EXIT_USAGE, EXIT_WAIT_TIMEOUT, die, task_exit_code
from mind.cli.formatting import OUT_OF_MEMORY, printable, table, timestamp, usage_text
from mind.cli.hints import did_you_mean, hand_suggestions
from mind.cli.progress import Status, elapsed
from mind.cli.toolargs import tool_args_from
from mind.client.aio import ClientError, MindClient
from mind.client.reconnect import retryable
from mind.errors import ClientCode
from protocol import limits
from protocol.codes import ErrorCode, RejectCode, TaskCancelStatus
from protocol.ids import new_id
from protocol.messages import TaskView
from protocol.states import TASK_TERMINAL, TaskState
from protocol.units import positive_duration as parse_duration

LOGS_QUIET_S = 2.0
"""`logs --follow` shows its status line once the log has been silent this long (on a terminal)."""
CANCEL_STATUS_AFTER_S = 1.0
WAIT_STATUS_AFTER_S = 1.0
"""`wait` shows its status line after this long (on a terminal)."""
WAIT_POLL_S = (0.2, 1.0)
"""`wait` asks the Mind (which asks the Hand) first after this long, then less often, up to the
second number: a task of hours costs one small request a second, a short one is seen ending soon."""
RIDE_OUT_S = 60.0
"""How long `wait` and `logs --follow` try to reach the Mind again when it announced no resume window."""
CUT = frozenset({ClientCode.CLOSED, ClientCode.UNREACHABLE, ErrorCode.SHUTDOWN, ErrorCode.BUSY})
"""What a restart of the Mind or a cut of the connection looks like to a request."""
T = TypeVar("T")


class Reasker:
    """Asks the Mind again across an outage (a restart, a cut), for at most the resume window the
    Mind announced (RIDE_OUT_S if none) from when the outage began: the reads it repeats change
    nothing, so asking twice is safe. `hand_offline`: after an outage, also wait out the Hand
    being away (a restarted Mind sees its Hands come back a moment after its clients); before any
    outage an offline Hand is an answer, as it always was."""

    def __init__(self, client: MindClient, hand_offline: bool = False, outage: bool = False) -> None:
        self.client = client
        self.hand_offline = hand_offline
        self.outage = outage
        """An outage was met already (a Mind waited for at the command's start, `open_client`)."""
        self.since: float | None = None

    async def ask(self, call: Callable[[], Awaitable[T]]) -> T:
        while True:
            asked = time.monotonic()
            try:
                result = await call()
            except ClientError as exc:
                outage = self.outage or self.client.reconnects > 0  # (the client may ride a cut out itself)
                offline = exc.code is ErrorCode.HAND_OFFLINE and self.hand_offline and outage
                if exc.code not in CUT and not offline:
                    raise
                self.outage = True
                if self.since is None:  # the outage counts from the ask that met it (the client
                    self.since = asked  # may have spent its window reconnecting inside it)
                await self._again(exc)
                continue
            self.since = None
            return result

    async def _again(self, exc: ClientError) -> None:
        bound = self.client.resume_window or RIDE_OUT_S
        assert self.since is not None
        remaining = self.since + bound - time.monotonic()
        if remaining <= 0:
            raise ClientError(exc.code, f"{exc.message}; could not reach the Mind again within {bound:g} s")
        if exc.code is ErrorCode.HAND_OFFLINE:
            await asyncio.sleep(min(0.5, remaining))
            return
        try:
            await self.client.reconnect(within=remaining)
        except ClientError as again:
            if not retryable(again):
                raise


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
        "uncommitted": info.uncommitted if info else None,
        "usage": info.usage.model_dump(mode="json") if info and info.usage else None,
    }


def freshness(v: TaskView) -> str:
    if not v.stale:
        return f"fresh (synced {timestamp(v.last_synced_at)})"
    when = timestamp(v.last_synced_at) if v.last_synced_at else "never"
    return f"STALE: hand {v.hand!r} is not connected; this is what the Mind last heard (synced {when})"


WAIT_HELP = """Wait until the task ends (polling the Mind), print its final state on stderr
(--json: its view on stdout), and exit with its outcome, as `mind exec` does:

  succeeded   0
  failed      the command's exit code (128+N: killed by signal N; 127/126: could not start)
  timed_out   124 (its --max-runtime passed)
  cancelled   130
  lost        255 (nobody can know how it ended)
  121         --timeout passed first; the task goes on
  125         unknown task, Mind unreachable

While the Hand is offline the Mind's view is stale: it keeps waiting (and says so on a terminal).
A restart of the Mind or a cut of the connection is ridden out: it reconnects and asks again for up
to the Mind's resume window (60 s if it has none), then gives up with 125."""


def _follows(args: argparse.Namespace) -> bool:
    """`wait` and `logs --follow` follow a task: started while the Mind restarts, they wait for it."""
    return args.action == "wait" or (args.action == "logs" and bool(getattr(args, "follow", False)))


def add_parsers(sub: Any) -> None:
    t = options.command(sub, "task", help="durable background tasks: start, get, logs, wait, cancel, rm, list")
    ts = t.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str, handler: Any, **kwargs: Any) -> argparse.ArgumentParser:
        a = options.command(ts, name, help=help, **kwargs)
        options.connection(a)
        a.set_defaults(handler=with_client(handler, _follows))
        return a

    st = action("start", "start a background task; prints its id at once", start)
    which = st.add_mutually_exclusive_group(required=True)
    options.hand(which, required=False)
    which.add_argument("--hands", metavar="SELECTOR", help="one task on every Hand this names (README: Fleet runs)")
    options.max_concurrency(st, "with --hands: starts at a time")
    st.add_argument("--id", dest="task_id", help="name the task (retrying the same start is then safe)")
    st.add_argument(
        "--max-runtime",
        default="24h",
        metavar="DURATION",
        help="the Hand kills it after this long (e.g. 90s, 30m, 2h; max 24h)",
    )
    options.place(st)
    options.json_output(st)
    options.limits(st)
    options.program(st)

    tg = action("get", "a task's state, times, exit code, log size, and how fresh that is", get)
    tg.add_argument("task_id")
    options.json_output(tg)

    tl = action("logs", "a task's log (from the Hand)", logs)
    tl.add_argument("task_id")
    tl.add_argument("--offset", type=int, default=0, help="start at this byte (of the stream read)")
    tl.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep streaming until the task ends, then exit with its outcome (as `task wait`); without it, 0. "
        "Rides out a restart of the Mind, printing nothing twice",
    )
    tl.add_argument(
        "--stream",
        choices=["stdout", "stderr", "both"],
        default="both",
        help="one stream's own log, offsets in its bytes; default both, in arrival order. Bytes go to stdout",
    )

    tw = action(
        "wait",
        "wait until a task ends; exit with its outcome",
        wait,
        formatter_class=options.TableHelp,
        description=WAIT_HELP,
    )
    tw.add_argument("task_id")
    tw.add_argument("--timeout", metavar="D", help="give up after D (e.g. 90s, 30m, 2h): exit 121")
    options.json_output(tw)

    tc = action("cancel", "request a cancel, then wait for the authoritative end", cancel)
    tc.add_argument("task_id")
    tc.add_argument("--no-wait", action="store_true", help="return after the request is acknowledged")
    tc.add_argument(
        "--wait-timeout",
        type=options.duration,
        default=60.0,
        metavar="DURATION",
        help="how long to wait for the end (e.g. 90s, 5m; default 60 s)",
    )

    tr = action(
        "rm",
        "forget a finished task: its record and log on the Hand, and the Mind's snapshot",
        remove,
        description="Remove a task that has ended (succeeded, failed, cancelled, timed_out, lost): its row and "
        "its log files on the Hand, then the Mind's snapshot, so it no longer counts against the Hand's "
        "--max-retained-tasks. A task still queued or running is refused (cancel it first); its Hand must be "
        "connected, since the record and the log live there. Exit 0 once removed, 125 when refused.",
    )
    tr.add_argument("task_id", type=_task_id)
    options.json_output(tr)

    tli = action("list", "tasks the Mind knows (with staleness)", list_)
    options.hand(tli, required=False, help="only this Hand's tasks")
    tli.add_argument("--state", choices=["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"])
    tli.add_argument("--limit", type=int, default=1000)
    options.json_output(tli)


async def start(client: MindClient, args: argparse.Namespace) -> int:
    if getattr(args, "hands", None) is not None:
        from mind.cli.fleet import task_start_many

        return await task_start_many(client, args)
    try:
        max_runtime = parse_duration(args.max_runtime)
    except ValueError as exc:
        die(f"--max-runtime: {exc}", EXIT_USAGE)
    if max_runtime * 1000 > limits.MAX_RUNTIME_MAX_MS:
        die("--max-runtime is at most 24h", EXIT_USAGE)
    if args.task_id is not None and not limits.ID_RE.match(args.task_id):
        die("--id must be 1-128 of A-Z a-z 0-9 . _ - , starting with a letter or digit", EXIT_USAGE)
    tool, tool_args = tool_args_from(args)
    # The id is chosen here, not by the Mind, so that a start whose answer never comes can be
    # named, looked up and retried safely (the Hand settles a retry: issue 14).
    task_id = args.task_id or new_id("t")
    try:
        res = await client.task_start(args.hand, tool, tool_args, max_runtime=max_runtime, task_id=task_id)
    except ClientError as exc:
        if exc.code != ClientCode.CLOSED:
            raise
        # Sent (or being sent) when the connection ended: nobody here knows whether the Hand
        # committed it. 255, as the README promises, never 125 ("refused, nothing stored").
        why = (
            f"{exc.message}: the start of task {task_id} was sent but its answer never came; it may exist. "
            f"`mind task get {task_id}` tells once the Mind and the hand are connected; "
            f"`mind task start --id {task_id} ...` again is safe (it runs at most once)"
        )
        if args.json:
            print(
                json.dumps(
                    {
                        "task_id": task_id,
                        "hand": args.hand,
                        "outcome": "unknown",
                        "reject_code": None,
                        "message": why,
                        "state": None,
                    }
                )
            )
        print(f"mind: {printable(why)}", file=sys.stderr)
        return EXIT_LOST
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
        if res.reject_code is RejectCode.UNKNOWN_HAND and (close := await hand_suggestions(client, args.hand)):
            print(f"mind: {did_you_mean(close)}", file=sys.stderr)
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
    print(
        f"created   {timestamp(d['created_at'])}\nstarted   {timestamp(d['started_at'])}\nfinished  {timestamp(d['finished_at'])}"
    )
    exit_line = d["exit_code"] if d["exit_code"] is not None else "-"
    if d["signal"] is not None:
        exit_line = f"{exit_line} (signal {d['signal']})"
    print(f"exit      {exit_line}")
    print(f"log       {d['log_bytes']} bytes{' (truncated at its bound)' if d['truncated'] else ''}")
    if d["reason"]:
        print(f"reason    {printable(d['reason'])}")
    if d["error"]:
        print(f"error     {printable(d['error'])}")
    if v.task is not None and (used := usage_text(v.task.usage)) is not None:
        print(f"usage     {used}")
    if d["uncommitted"]:
        print(f"ended     {printable(d['uncommitted'])} (the hand's state disk may be full)")
    return 0


async def logs(client: MindClient, args: argparse.Namespace) -> int:
    if args.offset < 0:
        die("--offset must be >= 0", EXIT_USAGE)
    offset = args.offset
    stream = None if args.stream == "both" else args.stream
    out = sys.stdout.buffer
    # On a terminal, a silent log says what it is waiting for: the task's state and its size so far
    # (erased before the next output; nothing at all when stderr is not a terminal).
    reasker = Reasker(client, hand_offline=True, outage=getattr(args, "waited_for_mind", False))
    with Status(sys.stderr, enabled=args.follow) as status:
        quiet_since = time.monotonic()
        while True:
            if args.follow:  # from `offset`, what is printed up to: nothing twice across an outage
                page = await reasker.ask(functools.partial(client.task_logs, args.task_id, offset, stream=stream))
            else:
                page = await client.task_logs(args.task_id, offset, stream=stream)
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
            which = f"{stream} " if stream else ""
            print(f"\n[mindhand: the {which}log was truncated at its bound of {page.log_bytes} bytes]", file=sys.stderr)
        if not args.follow:
            return 0  # a log, not an outcome
        # The log is complete, so the task is terminal on the Hand; the outcome comes from the Mind's
        # view of it, which may still be catching up (or the Hand just went offline): wait for it.
        view, _ = await await_end(client, args.task_id, None, status)
    return outcome_code(view)


def outcome_code(v: TaskView) -> int:
    code = task_exit_code(v.state, *_exit(v))
    assert code is not None, "only a terminal view has an outcome"
    return code


def _exit(v: TaskView) -> tuple[int | None, int | None]:
    return (v.task.exit_code, v.task.signal) if v.task else (None, None)


async def await_end(client: MindClient, task_id: str, timeout: float | None, status: Status) -> tuple[TaskView, bool]:
    """Poll the task's view until it is terminal (True) or `timeout` seconds passed (False, with the
    last view). A stale view or an ending not yet recorded by the Hand is not an end: the Mind's
    terminal state is the only outcome, so this never guesses; the status line says what it waits for."""
    t0 = time.monotonic()
    interval, longest = WAIT_POLL_S
    reasker = Reasker(client)
    while True:
        v = await reasker.ask(functools.partial(client.task_get, task_id))
        if v.state in TASK_TERMINAL:
            status.clear()
            return v, True
        waited = time.monotonic() - t0
        if timeout is not None and waited >= timeout:
            status.clear()
            return v, False
        if waited >= WAIT_STATUS_AFTER_S:
            status.show(f"waiting for task {task_id} to end: {waiting_on(v)}... {elapsed(waited)}")
        pause = interval if timeout is None else min(interval, max(0.0, timeout - waited))
        await asyncio.sleep(pause)
        interval = min(longest, interval * 1.5)


def waiting_on(v: TaskView) -> str:
    """What a wait is waiting on, in one line: the state, and why it cannot be the answer yet."""
    text = v.state.value
    if v.task is not None and v.task.uncommitted:
        text += f"; the hand says it {printable(v.task.uncommitted)}"
    if v.stale:
        when = timestamp(v.last_synced_at) if v.last_synced_at else "never"
        text += f"; hand {v.hand!r} is offline (last heard {when}), waiting for it to reconnect"
    if v.cancel_pending:
        text += "; a cancel waits for its delivery"
    return text


def final_line(v: TaskView) -> str:
    """`wait`'s last word on stderr: the state, and what decided the exit code (the exit code and
    signal, then the reason unless it only says the same: the Hand's `exit status N`); for a task the
    kernel killed for its memory limit, the Hand's sentence naming the limit too."""
    parts = []
    exit_code, signal = _exit(v)
    if exit_code is not None:
        parts.append(f"exit code {exit_code}")
    if signal is not None:
        parts.append(f"signal {signal}")
    reason = (v.task.reason if v.task else "") or v.reason
    if reason and reason not in (f"exit status {exit_code}", f"killed by signal {signal}"):
        parts.append(printable(reason))
    said = f"task {v.task_id} {v.state.value}" + (f" ({', '.join(parts)})" if parts else "")
    if reason == OUT_OF_MEMORY and v.task is not None and v.task.error:  # the sentence naming the limit
        said += f": {printable(v.task.error)}"
    return said


async def wait(client: MindClient, args: argparse.Namespace) -> int:
    timeout = None
    if args.timeout is not None:
        try:
            timeout = parse_duration(args.timeout)
        except ValueError as exc:
            die(f"--timeout: {exc}", EXIT_USAGE)
    with Status(sys.stderr) as status:
        view, ended = await await_end(client, args.task_id, timeout, status)
    if args.json:
        print(json.dumps(view_json(view), indent=2))
    if not ended:
        assert timeout is not None
        print(
            f"mind: task {args.task_id} has not ended after {timeout:g} s: {waiting_on(view)}; it goes on: "
            f"`mind task wait {args.task_id}` again, or `mind task cancel {args.task_id}`",
            file=sys.stderr,
        )
        return EXIT_WAIT_TIMEOUT
    print(f"mind: {final_line(view)}", file=sys.stderr)
    return outcome_code(view)


async def cancel(client: MindClient, args: argparse.Namespace) -> int:
    reply = await client.task_cancel(args.task_id)
    st = reply.status
    if st is TaskCancelStatus.UNKNOWN_TASK:
        die(f"no task {args.task_id}", EXIT_REFUSED)
    if st is TaskCancelStatus.ALREADY_DONE:
        state = reply.view.state.value if reply.view else "ended"
        info = reply.view.task if reply.view else None
        if info is not None and info.uncommitted:  # ended, its outcome not on the Hand's disk yet
            state = printable(info.uncommitted)
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


def _task_id(text: str) -> str:
    """A task id as the wire takes it, checked before connecting: a typo is a usage error (2)."""
    if not limits.ID_RE.match(text):
        raise argparse.ArgumentTypeError(
            f"{printable(text)!r} is not a task id (1-128 of A-Z a-z 0-9 . _ - , starting with a letter or digit)"
        )
    return text


async def remove(client: MindClient, args: argparse.Namespace) -> int:
    """`mind task rm ID`: what went, on stdout (`--json`: one object). A refusal (unknown task, not
    ended, Hand offline) is the Mind's or the Hand's sentence and 125, as every refused request."""
    gone = await client.task_remove(args.task_id)
    info = gone.task
    if args.json:
        print(
            json.dumps(
                {
                    "task_id": gone.task_id,
                    "hand": gone.hand,
                    "removed": True,
                    "state": info.state.value if info else None,
                    "exit_code": info.exit_code if info else None,
                    "log_bytes": info.log_bytes if info else None,
                }
            )
        )
        return 0
    if info is None:
        print(
            f"task {gone.task_id} removed (hand {gone.hand!r} had already forgotten it; the Mind's record is gone too)"
        )
        return 0
    how = info.state.value + (f", exit code {info.exit_code}" if info.exit_code is not None else "")
    print(f"task {gone.task_id} removed from hand {gone.hand!r} ({how}; its log of {info.log_bytes} bytes is gone)")
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
                timestamp(d["created_at"]),
                "-" if d["exit_code"] is None else str(d["exit_code"]),
                str(d["log_bytes"]),
            ]
        )
    table(["TASK", "HAND", "STATE", "SYNC", "CREATED", "EXIT", "LOG BYTES"], rows)
    return 0
