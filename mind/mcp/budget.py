"""What the runs `mind mcp` follows may hold in memory: a byte budget per credential and one for the
whole server, so no agent (and no number of agents over `--listen`) grows the server without bound.

Every run the server follows keeps its output for `read_output` (mind/mcp/results.py: the first
4 KiB and a window of the last 4 MiB of each stream). Without a bound, a thousand runs printing
fast would be gigabytes. So each run holds its bytes in a `Ledger` (its credential's, under the
server's): at least `RUN_FLOOR` while it runs, printed or not (so the number of runs going at once is
bounded too), and exactly what it keeps once it ended. Three rules, in this order:

- a new run (one `exec`, each member of a selector, a run taken up by `run_get`) is admitted only if
  its `RUN_FLOOR` fits; ended runs are let go first, oldest first, to make room (their output falls
  back to the Mind's record of their end); if it still does not fit it is refused before anything
  starts, with a tool error saying why and what to do (`OverBudget`);
- a running run's window grows while its growth fits, ended runs let go first as above;
- past that, its window slides at the size it has (never below `WINDOW_FLOOR`): its oldest bytes are
  dropped, and a marker or `read_output` names exactly which bytes are gone.

The budget counts the bytes kept; the memory they take is somewhat more (a window's buffer is
allocated with room to grow, frames pass through on their way in): about a third on top, measured
with 64 MiB held (tests/integration/test_mcp_seams.py). Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from types import TracebackType

from mind.mcp.results import HEAD_KEEP, WINDOW_FLOOR
from protocol.errors import MindhandError

CREDENTIAL_BYTES = 64 << 20
"""What one credential's followed runs may hold. Eight runs keeping both streams' full 4 MiB, or many
more smaller ones: far more than an agent reads back (a model is shown 8 KiB of a stream and pages
the rest), while one agent (or one stolen bearer) cannot take the server's memory for itself."""
SERVER_BYTES = 256 << 20
"""What every credential's followed runs together may hold: `--listen` serves many bearers, and this
is the memory the operator gives the server for output whatever their number (four credentials at
their full budget; a fifth is refused new runs until runs end)."""
RUN_FLOOR = 2 * (HEAD_KEEP + WINDOW_FLOOR)
"""What a running run holds at least (128 KiB): both streams' heads and window floors, which it may
always fill. So at most 512 runs go at once per credential, 2,048 per server."""
MIB = 1 << 20


class OverBudget(MindhandError):
    """A new run refused: its `RUN_FLOOR` does not fit even with every ended run let go."""

    code = "over_budget"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Ledger:
    """Bytes held against `limit`, and against the `parent` ledger's too (a credential's under the
    server's)."""

    def __init__(self, limit: int, parent: Ledger | None = None) -> None:
        if limit <= 0:
            raise ValueError("a ledger's limit must be more than 0 bytes")
        self.limit = limit
        self.parent = parent
        self.used = 0

    def room(self) -> int:
        """What may still be added here (and above)."""
        own = self.limit - self.used
        return own if self.parent is None else min(own, self.parent.room())

    def fits(self, n: int) -> bool:
        return n <= 0 or n <= self.room()

    def add(self, n: int) -> None:
        """Hold `n` more bytes (less, when negative), here and above."""
        self.used += n
        if self.parent is not None:
            self.parent.add(n)

    def refusal(self, need: int, running: int) -> str:
        """Why a run needing `need` bytes is not started, and what the agent can do."""
        if self.limit - self.used < need or self.parent is None:
            whose = f"this credential's {running} runs still going hold {self.used / MIB:.1f} MiB of output"
            bound = f"the most one credential may hold here is {self.limit / MIB:.0f} MiB"
        else:
            whose = f"the runs of every agent of this server hold {self.parent.used / MIB:.1f} MiB of output"
            bound = f"the most the server holds is {self.parent.limit / MIB:.0f} MiB"
        return (
            f"not started: {whose} for read_output, and {bound} (ended runs were let go first). "
            "Wait for a run to end (run_get with wait_s) or cancel one, then start again."
        )


class Reservation:
    """`RUN_FLOOR` for each of some runs about to start, held in the ledger from the moment they are
    admitted (so runs admitted at once cannot together pass the budget); each `take` hands one run
    its floor, and leaving the `with` gives back what no run took."""

    def __init__(self, ledger: Ledger, size: int) -> None:
        self.ledger = ledger
        self.left = size

    def take(self) -> int:
        """One run's floor, from what is left (0 if none: the run then adds its own)."""
        n = min(self.left, RUN_FLOOR)
        self.left -= n
        return n

    def release(self) -> None:
        self.ledger.add(-self.left)
        self.left = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
