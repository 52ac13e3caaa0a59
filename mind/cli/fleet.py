"""`mind exec --hands SELECTOR` and `mind task start --hands SELECTOR`: one command on many Hands.

The CLI shell of a fleet run (DESIGN §12; the plan is mind/core/fleet.py, the driver
mind/client/fleet.py). It goes through the asyncio client, not `mind exec`'s blocking fast path:
a fleet is many runs on one connection.

Output, live: every line of a Hand's output is prefixed by its name, aligned (`web1  | ...`),
coloured when the stream is a terminal; stdout stays stdout and stderr stays stderr. A partial
line is held per Hand per stream until its newline or the Hand's end (then it is ended with one),
so two Hands never share a line. `--group` prints each Hand's lines together when it ends. At the
end a summary on stderr: counts per state, and each Hand that did not succeed with its end.
`--json` prints one object instead; `--events` one JSON line per event, each with a `hand` field.

Ctrl-C once cancels every run in flight and starts no more (`cancel requested` per Hand, then the
authoritative ends and the summary); a second Ctrl-C detaches (the Mind cancels the runs of a client
that went away). Exit codes: mind/core/fleet.py and README "Fleet runs".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

from mind.cli.connection import open_client
from mind.cli.exits import EXIT_CANCELLED, EXIT_LOST, EXIT_REFUSED, EXIT_USAGE, die
from mind.cli.formatting import OUT_OF_MEMORY, end_summary, json_text, printable, table
from mind.cli.toolargs import tool_args_from
from mind.core import fleet as plan_core
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.codes import ErrorCode
from protocol.messages import SelectedHand

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")
TAIL_BYTES = 4 << 10
"""Bytes of each stream's last output kept per Hand for `--json`."""
END_KEYS = ("run_id", "exit_code", "signal", "reason", "reject_code", "duration_ms", "usage", "kill")
"""What `--json` says of each Hand's run end (`usage` and `kill` as `mind exec --json` has them)."""


def check_fleet_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], float, float | None, float | None]:
    """Usage errors before any connection."""
    if getattr(args, "tty", False):
        die("--hands cannot be combined with -t/--tty: a terminal is one Hand's", EXIT_USAGE)
    if args.timeout <= 0 or args.timeout * 1000 > limits.RUN_TIMEOUT_MAX_MS:
        die("--timeout must be positive and at most 86400 seconds", EXIT_USAGE)
    grace = None
    if args.grace is not None:
        if not 0 <= args.grace <= 600:
            die("--grace must be between 0 and 600 seconds", EXIT_USAGE)
        grace = args.grace
    deliver = None
    if args.deliver_within is not None:
        from protocol.units import positive_duration

        try:
            deliver = positive_duration(args.deliver_within)
        except ValueError as exc:
            die(f"--deliver-within: {exc}", EXIT_USAGE)
    for what, text in (("max-concurrency", args.max_concurrency), ("max-errors", args.max_errors)):
        try:
            plan_core.parse_limit(text, what)
        except plan_core.LimitError as exc:
            die(str(exc), EXIT_USAGE)
    if args.max_concurrency.strip() in ("0", "0%"):
        die("--max-concurrency must allow at least one run", EXIT_USAGE)
    from mind.core.selector import SelectorError, parse

    try:
        parse(args.hands)
    except SelectorError as exc:
        die(f"--hands: {exc}", EXIT_USAGE)
    if args.dry_run and args.shell is None and not args.argv:
        return "exec", {}, args.timeout, grace, deliver  # a selection needs no command
    tool, tool_args = tool_args_from(args)
    return tool, tool_args, args.timeout, grace, deliver


def run(args: argparse.Namespace) -> int:
    check_fleet_args(args)
    return asyncio.run(_main(args))  # (a reader of stdout gone, `| head`: mind/main.py; the Mind cancels the runs)


async def _connect(args: argparse.Namespace) -> Any:
    try:
        return await open_client(args)
    except ClientError as exc:
        die(exc.message, kind=exc.code)


async def select(client: Any, selector: str) -> list[SelectedHand]:
    """The Mind's answer, or exit 2 naming the selector when it matches nothing."""
    try:
        hands: list[SelectedHand] = await client.select_hands(selector)
    except ClientError as exc:
        if exc.code == ErrorCode.INVALID_PAYLOAD:
            die(f"--hands: {exc.message}", EXIT_USAGE)
        raise
    if not hands:
        die(f"--hands {selector!r} matches no Hand (in this client's scope)", EXIT_USAGE)
    return hands


def dry_run(args: argparse.Namespace, hands: list[SelectedHand]) -> int:
    if args.json:
        print(json.dumps({"selector": args.hands, "hands": [h.model_dump(mode="json") for h in hands]}, indent=2))
        return 0
    table(
        ["NAME", "CONNECTED", "GEN", "LABELS"],
        [[h.name, "yes" if h.connected else "no", str(h.generation), _labels(h.labels) or "-"] for h in hands],
    )
    online = sum(1 for h in hands if h.connected)
    print(f"mind: {len(hands)} hands selected by {args.hands!r} ({online} connected); nothing was run", file=sys.stderr)
    return 0


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


async def _main(args: argparse.Namespace) -> int:
    tool, tool_args, timeout, grace, deliver = check_fleet_args(args)
    client = await _connect(args)
    try:
        try:
            hands = await select(client, args.hands)
        except ClientError as exc:
            die(exc.message)
        if args.dry_run:
            return dry_run(args, hands)
        fleet = client.exec_many(
            args.hands,
            tool,
            tool_args,
            max_concurrency=args.max_concurrency,
            max_errors=args.max_errors,
            deliver_within=deliver,
            fail_fast=args.fail_fast,
            timeout=timeout,
            grace=grace,
            watch=bool(args.events),
            output_limit=_output_limit(args),
            selection=hands,
        )
        return await Printer(args, hands, fleet).drive()
    finally:
        await client.close()


def _output_limit(args: argparse.Namespace) -> int:
    if args.output_limit is None:
        return limits.OUTPUT_LIMIT_DEFAULT
    from protocol.units import parse_size

    try:
        return parse_size(args.output_limit)
    except ValueError as exc:
        die(f"--output-limit: {exc}", EXIT_USAGE)


class Printer:
    """Everything a fleet run prints, from its events."""

    def __init__(self, args: argparse.Namespace, hands: list[SelectedHand], fleet: Any) -> None:
        self.args = args
        self.fleet = fleet
        self.quiet = bool(args.json or args.events)
        self.group = bool(getattr(args, "group", False))
        width = max(len(h.name) for h in hands)
        self.fds = {"stdout": _fileno(sys.stdout, 1), "stderr": _fileno(sys.stderr, 2)}
        colour = {name: os.isatty(fd) and not os.environ.get("NO_COLOR") for name, fd in self.fds.items()}
        self.prefix: dict[tuple[str, str], bytes] = {}
        for i, h in enumerate(hands):
            plain = f"{h.name.ljust(width)} | "
            for stream, on in colour.items():
                text = f"\x1b[{COLOURS[i % len(COLOURS)]}m{plain}\x1b[0m" if on else plain
                self.prefix[(h.name, stream)] = text.encode()
        self.partial: dict[tuple[str, str], bytes] = {}
        self.grouped: dict[str, list[tuple[str, bytes]]] = {}
        self.tails: dict[tuple[str, str], bytes] = {}
        self.interrupts = 0
        self.detached = False

    # --- the loop ---

    async def drive(self) -> int:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_sigint, done)
        except (NotImplementedError, RuntimeError):
            pass
        try:
            consume = asyncio.ensure_future(self._consume())
            waiter = asyncio.ensure_future(done.wait())
            await asyncio.wait({consume, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if self.detached:
                consume.cancel()
                self._say(f"mind: detached from fleet {self.fleet.fleet_id}; its runs are cancelled by the Mind")
                return EXIT_CANCELLED
            waiter.cancel()
            return consume.result()
        finally:
            try:
                loop.remove_signal_handler(signal.SIGINT)
            except (NotImplementedError, RuntimeError):
                pass
            # The outcome is decided: a Ctrl-C from here on (a second press as the fleet ends) must
            # not turn it into a KeyboardInterrupt.
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _on_sigint(self, done: asyncio.Event) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self._say("\nmind: cancel requested for the fleet (Ctrl-C again to detach)")
            self.fleet.cancel()
        else:
            self.detached = True
            done.set()

    async def _consume(self) -> int:
        try:
            async for ev in self.fleet:
                self._on_event(ev)
        except ClientError as exc:
            if exc.code == ClientCode.EMPTY_SELECTION:
                die(exc.message, EXIT_USAGE)
            if exc.code == ClientCode.INVALID_REQUEST:
                die(exc.message, EXIT_USAGE)
            die(exc.message, EXIT_LOST if self.fleet.plan is not None else EXIT_REFUSED)
        agg = self.fleet.aggregate
        assert agg is not None
        if self.args.json:
            print(json.dumps(self._json(agg)))
        elif not self.args.events:
            self.summary(agg)
        return agg.exit_code

    def _on_event(self, ev: Any) -> None:
        if self.args.events:
            line = self._event_line(ev)
            if line is not None:
                print(json.dumps(line), flush=True)
        if ev.kind == "output":
            self._output(ev.hand, ev.msg.stream, ev.msg.data)
        elif ev.kind == "cancel_requested" and not self.quiet:
            self._say(f"mind: {ev.hand}: cancel requested")
        elif ev.kind == "end":
            self._end(ev)

    # --- output ---

    def _output(self, hand: str, stream: str, data: bytes) -> None:
        key = (hand, stream)
        self.tails[key] = (self.tails.get(key, b"") + data)[-TAIL_BYTES:]
        if self.quiet:
            return
        buf = self.partial.get(key, b"") + data
        cut = buf.rfind(b"\n") + 1
        self.partial[key] = buf[cut:]
        if cut:
            self._lines(hand, stream, buf[:cut])

    def _lines(self, hand: str, stream: str, data: bytes) -> None:
        """Whole lines (each ending in a newline), prefixed, written at once or kept for `--group`."""
        prefix = self.prefix.get((hand, stream), f"{hand} | ".encode())
        text = b"".join(prefix + line for line in data.splitlines(keepends=True))
        if self.group:
            self.grouped.setdefault(hand, []).append((stream, text))
        else:
            _write(self.fds[stream], text)

    def _end(self, ev: Any) -> None:
        hand = ev.hand
        if self.quiet:
            return
        for stream in ("stdout", "stderr"):
            rest = self.partial.pop((hand, stream), b"")
            if rest:
                self._lines(hand, stream, rest + b"\n")
        for stream, text in self.grouped.pop(hand, []):
            _write(self.fds[stream], text)
        if ev.state != plan_core.SUCCEEDED:
            plan = self.fleet.plan
            why = _why(ev, plan is not None and plan.interrupted)
            prefix = self.prefix.get((hand, "stderr"), b"")
            _write(self.fds["stderr"], prefix + f"mind: {ev.state}{why}\n".encode())

    def _say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # --- the end ---

    def summary(self, agg: plan_core.Aggregate) -> None:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(agg.counts.items(), key=lambda kv: (-kv[1], kv[0])))
        self._say(f"mind: fleet {self.fleet.fleet_id}: {agg.total} hands: {counts}")
        if agg.abandoned:
            self._say(f"mind: {printable(self.fleet._lost.message)}; the runs in flight ended lost (outcome unknown)")
        elif agg.budget_spent:
            budget = "fail-fast" if self.args.fail_fast else f"error budget of {self.fleet.plan.max_errors}"
            unstarted = agg.counts.get(plan_core.NOT_STARTED, 0)
            after = (
                f"no new run started after that ({unstarted} not_started)" if unstarted else "every Hand had started"
            )
            self._say(f"mind: errors {agg.errors}, over the {budget}: {after}")
        if agg.not_succeeded:
            width = max(len(h) for h in agg.not_succeeded)
            for hand, state in agg.not_succeeded.items():
                r = self.fleet.results.get(hand)
                how = _how(r.end) if r is not None and r.end is not None else []
                code = f" ({', '.join(how)})" if how else ""
                self._say(f"mind:   {printable(hand).ljust(width)}  {state}{code}")
        if agg.counts.get("timed_out"):
            self._say(
                f"mind: timed_out: killed because --timeout {self.args.timeout:g} s passed; give a longer "
                f"--timeout SECONDS (at most {limits.RUN_TIMEOUT_MAX_MS // 1000}), or `mind task start --hands`"
            )

    def _json(self, agg: plan_core.Aggregate) -> dict[str, Any]:
        hands = {}
        for name in [h.name for h in self.fleet.selection]:
            r = self.fleet.results.get(name)
            item: dict[str, Any] = {"state": r.state if r else "pending"}
            if r is not None and r.end is not None:
                e = end_summary(r.end)
                item.update({k: e[k] for k in END_KEYS})
            item["bytes"] = {s: (r.bytes.get(s, 0) if r else 0) for s in ("stdout", "stderr")}
            item["tails"] = {s: json_text(self.tails.get((name, s), b"")) for s in ("stdout", "stderr")}
            hands[name] = item
        return {
            "fleet": self.fleet.fleet_id,
            "selector": self.args.hands,
            "hands": hands,
            "aggregate": {
                "total": agg.total,
                "counts": agg.counts,
                "errors": agg.errors,
                "budget_spent": agg.budget_spent,
                "interrupted": agg.interrupted,
                "not_succeeded": agg.not_succeeded,
                "exit_code": agg.exit_code,
            },
        }

    def _event_line(self, ev: Any) -> dict[str, Any] | None:
        base: dict[str, Any] = {"fleet": self.fleet.fleet_id}
        if ev.kind == "selected":
            return {**base, "event": "selected", "hands": [h.name for h in self.fleet.selection]}
        if ev.kind == "aggregate":
            agg = self.fleet.aggregate
            return {**base, "event": "aggregate", "counts": agg.counts, "exit_code": agg.exit_code}
        base["hand"] = ev.hand
        if ev.kind == "output":
            m = ev.msg
            if not m.data:
                return None
            return {
                **base,
                "event": "output",
                "run_id": m.run_id,
                "stream": m.stream,
                "offset": m.offset,
                "data": json_text(m.data),
            }
        if ev.kind == "state":
            m = ev.msg
            return {**base, "event": "state", "run_id": getattr(m, "run_id", None), "state": ev.state}
        if ev.kind == "named":
            return {**base, "event": "named", "run_id": self.fleet.results[ev.hand].run_id}
        if ev.kind == "end":
            if ev.msg is None:
                return {**base, "event": "end", "state": ev.state}
            return {**base, "event": "end", **end_summary(ev.msg), "state": ev.state}
        return {**base, "event": ev.kind}


def _why(ev: Any, interrupted: bool) -> str:
    e = ev.msg
    if e is None:
        return {
            plan_core.NOT_STARTED: " (the fleet was cancelled before its turn)"
            if interrupted
            else " (the error budget was spent before its turn)",
            plan_core.HAND_OFFLINE: " (not connected; --deliver-within waits for it)",
            plan_core.UNDELIVERABLE: " (did not connect within --deliver-within)",
            plan_core.LOST: " (the connection to the Mind was lost: the outcome is unknown)",
        }.get(ev.state, "")
    if e.reason == OUT_OF_MEMORY:  # the reason, then the Hand's sentence naming the limit
        return f" ({', '.join(_how(e))})" + (f": {printable(e.error)}" if e.error else "")
    if e.exit_code is not None:
        return f" (exit {e.exit_code})"
    if e.signal is not None:
        return f" (signal {e.signal})"
    detail = e.error or e.reason
    return f": {printable(detail)}" if detail else ""


def _how(e: Any) -> list[str]:
    """What the summary says of a Hand's end beside its state: its exit code, and the reason of a run
    the kernel killed for its memory limit (with the signal, when that is how it ended)."""
    how = [f"exit {e.exit_code}"] if e.exit_code is not None else []
    if e.reason != OUT_OF_MEMORY:
        return how
    if not how and e.signal is not None:
        how = [f"signal {e.signal}"]
    return [*how, OUT_OF_MEMORY]


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            import select

            select.select([], [fd], [])
            continue
        view = view[n:]


def _fileno(stream: Any, default: int) -> int:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return default


# --- mind task start --hands ------------------------------------------------------------------


async def task_start_many(client: Any, args: argparse.Namespace) -> int:
    """One background task per selected Hand, at most `--max-concurrency` starts at a time; each
    Hand's line says its task id and outcome. Exit 0 when every Hand accepted its task."""
    from protocol.units import positive_duration

    try:
        max_runtime = positive_duration(args.max_runtime)
    except ValueError as exc:
        die(f"--max-runtime: {exc}", EXIT_USAGE)
    if max_runtime * 1000 > limits.MAX_RUNTIME_MAX_MS:
        die("--max-runtime is at most 24h", EXIT_USAGE)
    if args.task_id is not None:
        die("--id names one task; with --hands every Hand gets its own id", EXIT_USAGE)
    tool, tool_args = tool_args_from(args)
    hands = await select(client, args.hands)
    try:
        conc = plan_core.resolve_concurrency(args.max_concurrency, len(hands))
    except plan_core.LimitError as exc:
        die(str(exc), EXIT_USAGE)
    plan = plan_core.FleetPlan([(h.name, h.connected) for h in hands], max_concurrency=conc, max_errors=len(hands))
    results: dict[str, dict[str, Any]] = {}
    sem = asyncio.Semaphore(conc)

    async def one(hand: str) -> None:
        async with sem:
            try:
                res = await client.task_start(hand, tool, tool_args, max_runtime=max_runtime)
                results[hand] = {"task_id": res.task_id, "outcome": res.outcome, "message": res.message}
            except ClientError as exc:
                results[hand] = {"task_id": None, "outcome": "unknown", "message": exc.message}

    starts = [a.hand for a in plan.next(0) if isinstance(a, plan_core.Start)] + plan.waiting()
    for a in list(plan.ends.items()):
        results[a[0]] = {"task_id": None, "outcome": a[1], "message": "not connected"}
    await asyncio.gather(*(one(h) for h in starts))
    ok = all(r["outcome"] in ("accepted", "duplicate") for r in results.values())
    if args.json:
        print(json.dumps({"selector": args.hands, "hands": results}))
    else:
        width = max(len(h) for h in results)
        for hand in sorted(results):
            r = results[hand]
            print(f"{hand.ljust(width)}  {r['task_id'] or '-'}  {r['outcome']}")
    return 0 if ok else plan_core.EXIT_FLEET_FAILED
