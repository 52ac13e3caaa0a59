"""Looking at the Mind: `mind hands`, `mind status`, `mind runs` and `mind run get` (a run, or a
fleet run's members). Read-only views over the asyncio client; tables for a person, `--json` for a
script."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mind.cli import options
from mind.cli.connection import with_client
from mind.cli.exits import EXIT_USAGE, die
from mind.cli.formatting import away, byte_size, jsonable, kill_text, printable, table, timestamp, usage_text
from protocol.states import RunState


def add_parsers(sub: Any) -> None:
    h = options.command(sub, "hands", help="list Hands known to the Mind, live")
    options.connection(h)
    options.json_output(h)
    options.labels(h, "only Hands with this label")
    h.set_defaults(handler=with_client(list_hands))

    stt = options.command(sub, "status", help="one screen: the Mind, its Hands, running runs, tasks, recent failures")
    options.connection(stt)
    options.json_output(stt)
    stt.set_defaults(handler=with_client(show_status))

    rn = options.command(
        sub,
        "runs",
        help="foreground run history (newest first; retained per the Mind's settings); with Mind nodes "
        "sharing a database, every live node's runs (--json names each run's node; a node that does "
        "not answer within 5 s is named in a warning on stderr and the listing is partial, exit 0)",
    )
    options.connection(rn)
    options.hand(rn, required=False, help="only this Hand's runs")
    rn.add_argument("--state", choices=[s.value for s in RunState])
    rn.add_argument("--since", metavar="DURATION", help="only runs started within this long ago (e.g. 30m, 2h)")
    rn.add_argument("--limit", type=int, default=50)
    rn.add_argument("--fleet", metavar="ID", help="only the member runs of this fleet run")
    rn.add_argument(
        "--unattended",
        action="store_true",
        help="only runs still going with a leg away: detached, left by their client, or waiting for their Hand "
        "(mind attach RUN_ID takes one up)",
    )
    options.json_output(rn)
    rn.set_defaults(handler=with_client(list_runs))

    r = options.command(sub, "run", help="look at foreground runs")
    rs = r.add_subparsers(dest="action", required=True, metavar="ACTION")
    rg = rs.add_parser("get", help="show one run (state, times, outcome)", formatter_class=options.Help)
    options.connection(rg)
    rg.add_argument("run_id")
    options.json_output(rg)
    rg.set_defaults(handler=with_client(run_get))


async def list_hands(client: Any, args: argparse.Namespace) -> int:
    hands = await client.hands()
    if args.labels:
        from mind.core.selector import SelectorError, parse_label

        want = []
        for item in args.labels:
            try:
                want.append(parse_label(item))
            except SelectorError as exc:
                die(str(exc), EXIT_USAGE)
        hands = [h for h in hands if all(h.labels.get(k) == v for k, v in want)]
    if args.json:
        print(json.dumps([hand_json(h) for h in hands], indent=2))
        return 0
    rows = []
    nodes = any(h.node for h in hands)  # Mind nodes sharing a database: which holds each Hand
    for h in hands:
        c = h.claims
        rows.append(
            [
                h.name,
                "yes" if h.connected else "no",
                str(h.generation),
                timestamp(h.since),
                c.hostname if c else "-",
                f"{c.platform}/{c.machine}" if c else "-",
                (c.cgroups if c else None) or "-",
                str(h.running),
                ",".join(f"{k}={v}" for k, v in h.labels.items()) or "-",
            ]
            + ([h.node or "-"] if nodes else [])
        )
    table(
        ["NAME", "CONNECTED", "GEN", "SINCE", "HOST", "PLATFORM", "CGROUPS", "RUNNING", "LABELS"]
        + (["NODE"] if nodes else []),
        rows,
    )
    return 0


def hand_json(h: Any) -> dict[str, Any]:
    """A Hand for `mind hands --json`: its info, and how it contains runs (from its claims, null when
    unknown): `cgroups` (`v2`, `hybrid`, `v1`, `none`) and the cgroup `limits` it can enforce
    (`memory`, `pids`, `cpus`: what `--memory`, `--pids`, `--cpus` need)."""
    d: dict[str, Any] = h.model_dump(mode="json")
    c = h.claims
    d["cgroups"] = c.cgroups if c else None
    d["limits"] = list(c.limits) if c and c.limits is not None else None
    return d


def limits_id_ok(text: str) -> bool:
    from protocol import limits

    return bool(limits.ID_RE.fullmatch(text))


async def run_get(client: Any, args: argparse.Namespace) -> int:
    if args.run_id.startswith("fleet-"):
        return await fleet_get(client, args)
    info = await client.get_run(args.run_id)
    if args.json:
        d = info.model_dump(mode="python")
        print(json.dumps(jsonable(d), indent=2, default=str))
        return 0
    print(
        f"run      {info.run_id}\nhand     {info.hand} (gen {info.gen})\ntool     {printable(info.tool)}\n"
        f"state    {shown_state(info)}"
    )
    if info.exited is not None:
        print(f"exit     {dash(info.exited.exit_code)}  signal {dash(info.exited.signal)}")
        print(f"output   not yet collected: mind attach {info.run_id}")
    if (note := away(info)) is not None:
        print(f"away     {note}")
    print(f"created  {timestamp(info.created_at)}\nended    {timestamp(info.ended_at)}")
    if info.end is not None:
        e = info.end
        print(
            f"exit     {dash(e.exit_code)}  signal {dash(e.signal)}  duration {e.duration_ms} ms  "
            f"dropped {e.progress_dropped}"
        )
        if e.reason:
            print(f"reason   {printable(e.reason)}")
        if e.error:
            print(f"error    {printable(e.error)}")
        if (used := usage_text(e.usage)) is not None:
            print(f"usage    {used}")
        if (kill := kill_text(e.kill)) is not None:
            print(f"kill     {kill}")
    if info.value_not_retained:
        print("value    not retained (it went to the waiting client; the Mind keeps run metadata, not payloads)")
    return 0


async def fleet_get(client: Any, args: argparse.Namespace) -> int:
    """`mind run get fleet-...`: the fleet's member runs (its aggregate is theirs: DESIGN §12)."""
    if not limits_id_ok(args.run_id):
        die(f"no run {args.run_id}", EXIT_USAGE)
    runs = warn_partial(await client.run_listing(fleet=args.run_id, limit=100_000))
    if not runs:
        die(f"no fleet run {args.run_id} in the Mind's history (or none of its runs is visible to this client)")
    if args.json:
        members = [jsonable(r.model_dump(mode="python")) for r in runs]
        print(json.dumps({"fleet": args.run_id, "members": members}, indent=2, default=str))
        return 0
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    print(f"fleet    {args.run_id}\nmembers  {len(runs)}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print("(Hands the fleet never started, offline or not_started, have no run and are not listed)\n")
    table(RUN_HEADERS, [run_row(r) for r in runs])
    return 0


def warn_partial(listing: Any) -> list[Any]:
    """The listing's runs; a node that did not answer (DESIGN §16) named in a warning on stderr.
    Exit 0 all the same: every run listed is true and the missing node is named, while a failure
    would hide the runs that did answer from a script that only needs those (one it cares about
    reads the warning, or `run_listing` in Python)."""
    if listing.missing_nodes:
        names = ", ".join(printable(n) for n in listing.missing_nodes)
        print(
            f"mind: warning: partial listing: no answer from Mind node(s) {names}; their runs are not shown",
            file=sys.stderr,
        )
    return list(listing.runs)


def dash(value: Any) -> str:
    """A value, or `-` where it does not apply (never `None` on a person's screen)."""
    return "-" if value is None else str(value)


def shown_state(r: Any) -> str:
    """The state a person reads: how the process ended once the Hand said so, even while its output
    waits for a reader (the run itself ends when that output is delivered)."""
    if r.exited is not None:
        return f"{r.exited.state.value} (output not yet collected)"
    return r.state.value if (note := away(r)) is None else f"{r.state.value} ({note})"


def run_row(r: Any) -> list[str]:
    e = r.end
    exit_ = dash(e.exit_code if e is not None else r.exited.exit_code if r.exited is not None else None)
    dur = "-" if e is None else f"{e.duration_ms / 1000:.2f}s"
    return [r.run_id, r.hand, r.tool, shown_state(r), timestamp(r.created_at), dur, exit_]


RUN_HEADERS = ["RUN", "HAND", "TOOL", "STATE", "CREATED", "DURATION", "EXIT"]
COPY_PARTS = frozenset({"put_file", "get_file", "stat_file", "list_tree", "list_dir"})
"""The tools one `mind cp` runs: its transfers (`put_file`, `get_file`) and the probes that look
before them, which are not failures of the copy when they find nothing."""
TRANSFERS = frozenset({"put_file", "get_file"})


def copy_rows(runs: list[Any], nodes: bool = False) -> list[list[str]]:
    """The table of `mind runs`, a copy as one row: the runs of one group (`mind cp` tags its runs
    with a fleet id of its own) that are all copy tools become `cp` with the files and bytes it
    moved, at the place of its newest run; every other run is its own row (`run_row`)."""
    groups: dict[str, list[Any]] = {}
    for r in runs:
        if r.fleet is not None:
            groups.setdefault(r.fleet, []).append(r)
    copies = {f for f, members in groups.items() if all(m.tool in COPY_PARTS for m in members)}
    rows: list[list[str]] = []
    for r in runs:
        node = [r.node or "-"] if nodes else []
        if r.fleet not in copies:
            rows.append(run_row(r) + node)
        elif groups[r.fleet][0] is r:
            rows.append(copy_row(r.fleet, groups[r.fleet]) + node)
    return rows


def copy_row(group: str, members: list[Any]) -> list[str]:
    moved = [m for m in members if m.tool in TRANSFERS]
    files = bytes_ = 0
    for m in moved:
        value = m.end.value if m.end is not None and isinstance(m.end.value, dict) else {}
        files += int(value.get("files", 0))
        bytes_ += int(value.get("bytes", 0))
    live = [m for m in members if m.end is None]
    bad = [m for m in moved if m.end is not None and m.state is not RunState.SUCCEEDED]
    # the Mind knows the transfers' ends, not the CLI's verdict: a copy that moved nothing says so
    state = "running" if live else bad[0].state.value if bad else "succeeded" if moved else "nothing moved"
    start = min(m.created_at for m in members)
    ends = [m.created_at + m.end.duration_ms / 1000 for m in members if m.end is not None]
    dur = "-" if live or not ends else f"{max(ends) - start:.2f}s"
    hands = ",".join(sorted({m.hand for m in members}))
    what = f"cp ({files} file{'s' if files != 1 else ''}, {byte_size(bytes_)})" if moved else "cp"
    return [group, hands, what, state, timestamp(start), dur, "-"]


async def list_runs(client: Any, args: argparse.Namespace) -> int:
    import time as _time

    from protocol.units import positive_duration as parse_duration

    since = None
    if args.since:
        try:
            since = _time.time() - parse_duration(args.since)
        except ValueError as exc:
            die(f"--since: {exc}", EXIT_USAGE)
    if args.limit <= 0:
        die("--limit must be positive", EXIT_USAGE)
    if args.fleet is not None and not limits_id_ok(args.fleet):
        die("--fleet wants a fleet id (fleet-...)", EXIT_USAGE)
    listing = await client.run_listing(
        args.hand,
        RunState(args.state) if args.state else None,
        since,
        args.limit,
        fleet=args.fleet,
        unattended=args.unattended,
    )
    runs = warn_partial(listing)
    if args.json:
        print(json.dumps([jsonable(r.model_dump(mode="python")) for r in runs], indent=2, default=str))
        return 0
    nodes = any(r.node for r in runs)  # Mind nodes sharing a database: which holds each run
    headers = RUN_HEADERS + (["NODE"] if nodes else [])
    if args.fleet is not None:  # a group's parts, each its own row
        table(headers, [run_row(r) + ([r.node or "-"] if nodes else []) for r in runs])
    else:
        table(headers, copy_rows(runs, nodes))
    return 0


async def show_status(client: Any, args: argparse.Namespace) -> int:
    st = await client.status()
    if args.json:
        print(json.dumps(jsonable(st.model_dump(mode="python")), indent=2, default=str))
        return 0
    up = int(st.uptime_s)
    print(
        f"mind {st.mind_id}  version {st.version}  up {up // 3600}h{up % 3600 // 60:02d}m{up % 60:02d}s  "
        f"retained runs {st.retained_runs}"
    )
    live = st.hands_connected if st.hands_connected is not None else sum(1 for h in st.hands if h.connected)
    if st.nodes is not None:
        print(f"\nNODES ({sum(1 for n in st.nodes if n.live)} live; this is {st.node})")
        table(
            ["NAME", "LIVE", "HEARTBEAT", "HANDS", "STOPPED"],
            [
                [
                    n.name,
                    "yes" if n.live else "no",
                    f"{n.heartbeat_age_s:.1f}s ago",
                    str(n.hands),
                    "no" if n.running else "yes",
                ]
                for n in st.nodes
            ],
        )
    print(f"\nHANDS ({live} of {st.hands_total or len(st.hands)} connected)")
    table(
        ["NAME", "CONNECTED", "GEN", "SINCE", "RUNNING"] + (["NODE"] if st.nodes is not None else []),
        [
            [h.name, "yes" if h.connected else "no", str(h.generation), timestamp(h.since), str(h.running)]
            + ([h.node or "-"] if st.nodes is not None else [])
            for h in st.hands
        ],
    )
    if st.hands_total is not None and st.hands_total > len(st.hands):
        print(f"... and {st.hands_total - len(st.hands)} more: `mind hands` lists them all")
    active = st.active_runs_total if st.active_runs_total is not None else len(st.active_runs)
    print(f"\nRUNNING ({active})")
    table(RUN_HEADERS, [run_row(r) for r in st.active_runs])
    if active > len(st.active_runs):
        print(f"... and {active - len(st.active_runs)} more: `mind runs` lists them all")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(st.task_counts.items())) or "none"
    print(f"\nTASKS  {counts};  stale snapshots {st.stale_snapshots}")
    if st.recording is not None:
        print(f"\nRECORDING  {st.recording}")
    print(f"\nRECENT FAILURES ({len(st.recent_failures)})")
    table(RUN_HEADERS, [run_row(r) for r in st.recent_failures])
    return 0
