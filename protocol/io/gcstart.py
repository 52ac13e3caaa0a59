"""The garbage collector while a program starts, and after.

A `mind` or `hand` process spends most of its start importing: pydantic builds ninety message
classes, dataclasses compile their methods, and every one of those allocations counts towards the
collector's next pass. With the default thresholds a start runs the collector over and over across
the whole heap it is still building (perf over the suite: about a tenth of the CPU of every `mind`
process was `gc_collect_main` and its visits). Nothing an import builds is garbage, so:

- `starting()`, first thing in `main`: a gen-0 threshold of 100,000 allocations instead of 700, so
  the imports run with the collector nearly idle. It is not switched off: a program that never
  calls `started()` still collects, only less often (its cyclic garbage is bounded by the threshold).
- `started()`, once the imports are done and before the event loop runs: `gc.freeze()` moves what
  the start built (modules, classes, their validators) into the permanent generation, which no
  later pass walks, and the default thresholds are back. A daemon's full collections then visit
  what it holds for its runs, not the interpreter's own furniture.

`python -X importtime` and `scripts/bench cli` show the start; the figure is in docs/performance.md.
"""

from __future__ import annotations

import gc

DEFAULT_THRESHOLD = gc.get_threshold()
STARTING_THRESHOLD = (100_000, DEFAULT_THRESHOLD[1], DEFAULT_THRESHOLD[2])

_started = False


def starting() -> None:
    """The program starts: collect rarely while it imports (see the module's docstring)."""
    if not _started:
        gc.set_threshold(*STARTING_THRESHOLD)


def started() -> None:
    """The imports are done: what they built is frozen, the thresholds are the defaults again.
    Idempotent (a CLI that opens a second connection calls it again: nothing more happens)."""
    global _started
    if _started:
        return
    _started = True
    gc.freeze()
    gc.set_threshold(*DEFAULT_THRESHOLD)
