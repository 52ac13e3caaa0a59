"""mindhand's benchmark suite (see scripts/bench): every figure, or a named subset, against a
reference measured in the same run, printed as one table with PASS/MISS against its target.

    scripts/bench                      # every figure, full mode (3 rounds each)
    scripts/bench latency pipelined    # a subset
    scripts/bench --quick              # a second or two per figure, 1 round (what CI runs)
    scripts/bench --list               # the figures

Timing targets are goals, not assertions: a MISS does not fail the run (exit 0); a figure that
could not be measured at all prints an ERROR row and makes the exit code 1. So does a figure that
runs past its bound (3 minutes in quick mode, an hour in full mode), with a traceback of where it
waited; the next figure runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the real packages FIRST: tests/protocol etc. would shadow them
sys.path.append(str(ROOT / "tests"))  # tests/support (Cluster, FaultProxy), last

import argparse  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from benchlib import core  # noqa: E402
from benchlib import cp as _cp  # noqa: E402, F401 - registers the `mind cp` figure
from benchlib import far as _far  # noqa: E402, F401 - registers the far-link figure (a Hand 50/100 ms away)
from benchlib import fleet as _fleet  # noqa: E402, F401 - registers the fleet figures
from benchlib import flood as _flood  # noqa: E402, F401 - registers the flood figure
from benchlib import forward as _forward  # noqa: E402, F401 - registers the `mind forward` figure
from benchlib import limits as _limits  # noqa: E402, F401 - registers the cgroup-per-run figure
from benchlib import mcp as _mcp  # noqa: E402, F401 - registers the `mind mcp` figure
from benchlib import nodes as _nodes  # noqa: E402, F401 - registers the Many Minds figure
from benchlib import reader as _reader  # noqa: E402, F401 - registers the frame reader figure
from benchlib import record as _record  # noqa: E402, F401 - registers the recording figure
from benchlib import resume as _resume  # noqa: E402, F401 - registers the continuity figures
from benchlib import streams as _streams  # noqa: E402, F401 - registers the data-plane figures
from benchlib.figures import ABOUT, FIGURES, release_unused  # noqa: E402

FIGURE_BOUND_QUICK_S = 180
FIGURE_BOUND_S = 3600
"""How long one figure may run (quick mode: its longest figure took 33 s beside two CPU burners and a disk writer; full mode:
the 1 GiB copies and the far links take minutes). Past it the figure is an ERROR row, its traceback
on stderr naming where it waited, and the next figure runs: a stall is reported, never waited out."""


class FigureOverran(Exception):
    """A figure ran past its bound (raised by SIGALRM in the main thread, wherever it waits)."""


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("figures", nargs="*", metavar="FIGURE", help=f"figures to run (default all): {', '.join(FIGURES)}")
    ap.add_argument("--quick", action="store_true", help="a second or two per figure, 1 round, smaller scales")
    ap.add_argument("--rounds", type=int, help="rounds per figure (default 3, --quick 1)")
    ap.add_argument(
        "--install-ssh",
        action="store_true",
        help="full mode only: apt-get install openssh-server and rsync if missing (the ssh, scp and rsync references)",
    )
    ap.add_argument(
        "--hands",
        type=int,
        metavar="N",
        help="simulated Hands for the `hands` figure (default 1,000, --quick 100) and the `nodes` figure "
        "(default 10,000, --quick 300); e.g. 10000",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the machine, rows and notes as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs of every process)")
    ap.add_argument("--list", action="store_true", help="list the figures and exit")
    args = ap.parse_args()
    if args.list:
        for name, about in ABOUT.items():
            print(f"{name:<10} {about}")
        return 0
    unknown = [f for f in args.figures if f not in FIGURES]
    if unknown:
        ap.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    selected = [f for f in FIGURES if not args.figures or f in args.figures]
    rounds = args.rounds or (1 if args.quick else 3)
    if rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.hands is not None and not 1 <= args.hands <= 100_000:
        ap.error("--hands must be between 1 and 100000")

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the cleanup below

    signal.signal(signal.SIGTERM, terminated)
    bound = FIGURE_BOUND_QUICK_S if args.quick else FIGURE_BOUND_S

    def overran(_signum: int, _frame: object) -> None:
        raise FigureOverran(f"ran past {bound} s (the traceback on stderr says where it waited)")

    signal.signal(signal.SIGALRM, overran)
    mode = f"{'quick' if args.quick else 'full'}, {rounds} round{'s' if rounds > 1 else ''} per figure"
    mach = core.machine()
    head = (
        f"mindhand bench ({mode}) -- nproc {mach['nproc']}, CPU {mach['cpu']}, Python {mach['python']}, "
        f"Linux {mach['kernel']}, websockets {mach['websockets']}; load average at start {core.loadavg()}"
    )
    print(head, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="mindhand-bench."))
    ctx = core.Ctx(quick=args.quick, rounds=rounds, tmp=tmp, install_ssh=args.install_ssh, hands=args.hands)
    rows: list[core.Row] = []
    errors = 0
    t_start = time.monotonic()
    try:
        for name in selected:
            t0 = time.monotonic()
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            signal.alarm(bound)
            try:
                rows += FIGURES[name](ctx)
            except Exception as exc:  # one figure failing must not hide the others
                errors += 1
                traceback.print_exc(file=sys.stderr)
                rows.append(core.Row(name, "could not be measured (see notes)", verdict="ERROR"))
                ctx.note(name, f"ERROR {type(exc).__name__}: {exc}"[:600])
            finally:
                signal.alarm(0)
            release_unused(ctx, selected[selected.index(name) + 1 :])
            print(f"bench: {name} done in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        ctx.close()
        if args.keep:
            print(f"bench: logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(core.format_table(rows))
    if ctx.notes:
        print("\nnotes:")
        for name in [*selected, "ssh"]:
            for text in ctx.notes.get(name, []):
                print(f"  {name}: {text}")
    verdicts = [r.verdict for r in rows]
    print(
        f"\n{verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS, {verdicts.count('n/a')} n/a, "
        f"{verdicts.count('ERROR')} ERROR; {time.monotonic() - t_start:.0f} s in all; load average at end {core.loadavg()}"
    )
    if args.json:
        core.dump_json(Path(args.json), mach, rows, ctx.notes, mode)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
