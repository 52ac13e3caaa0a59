"""`exec` on a fleet selector (`web*`, `a,b`, `role=web+dc=eu1`): one command on every Hand the
selector names within the credential's scope, as `mind exec --hands` runs it (mind/client/fleet.py:
the Mind's selection, concurrency, Hands offline at the start), answered as one result per Hand.

Every member is an ordinary run this server follows like any `exec` of one Hand, so a member still
going at `wait_s` is not stopped and `run_get`, `read_output` and `cancel` take its run id. The
fleet runs to the end on every Hand (its error budget is all of them): an agent asked for the
command everywhere, and a failing Hand is reported, not a reason to skip the others. The result is
an error (`isError`) if any Hand's run did not succeed, or any Hand was not reached.

Each Hand's output is bounded like a single run's, more tightly the more Hands there are (the whole
answer stays within a few times one run's), with the same paging marker per run. What the members
keep counts in the credential's byte budget (mind/mcp/budget.py): every member's floor is reserved
before the fleet starts, so a selector naming more Hands than the budget holds is refused whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mind.client.fleet import EmptySelection, FleetRun
from mind.errors import ClientCode, ClientError, MindhandError
from mind.mcp import results
from mind.mcp.budget import Reservation
from mind.mcp.runs import PROGRESS_EVERY_S, Followed, Runs

Progress = Callable[[float, str], Awaitable[None]]
SHOW_TOTAL = 32 << 10
"""Of a fleet's answer, at most this much output in all (each Hand's share of it, at least 1 KiB
and at most a single run's `SHOW_BYTES`)."""


class Fleet:
    """One fleet `exec`: the fleet run read to its end in the background (owned by `Runs`), each
    member's events handed to its `Followed`, whatever the call that started it does."""

    def __init__(self, runs: Runs, run: FleetRun, held: Reservation | None = None) -> None:
        self.runs = runs
        self.run = run
        self.held = held
        """The members' floors, reserved at the start; what no member took is given back at the end."""
        self.members: dict[str, Followed] = {}
        self.unreached: dict[str, str] = {}
        """Hands without a run: hand_offline, not_started, undeliverable, or refused before a run."""
        self.done = False
        self.failure: MindhandError | None = None
        self.changed = asyncio.Event()

    def member(self, hand: str) -> Followed | None:
        f = self.members.get(hand)
        handle = self.run.handle(hand)
        if f is None and handle is not None:
            f = self.members[hand] = self.runs.add(Followed(handle, hand), self.held)
        return f

    async def drive(self) -> None:
        try:
            async for ev in self.run:
                if ev.hand is not None and ev.kind in ("named", "state", "output", "end"):
                    f = self.member(ev.hand)
                    if ev.msg is not None and f is not None:
                        f.take(ev.msg)
                    elif ev.kind == "end" and ev.state is not None:
                        self.unreached[ev.hand] = ev.state
                        if f is not None and not f.done:
                            f.failure = ClientError(ClientCode.LOST, f"no end came from {ev.hand} ({ev.state})")
                            f.settle()
                            f.changed.set()
                self.changed.set()
        except MindhandError as exc:
            self.failure = exc
        finally:
            self.done = True
            if self.held is not None:
                self.held.release()
            self.changed.set()

    def all_ended(self) -> bool:
        return self.done or (self.run.selection is not None and len(self.ended()) == len(self.run.selection))

    def ended(self) -> list[str]:
        return [h for h, f in self.members.items() if f.done] + [h for h in self.unreached if h not in self.members]

    def answer(self, of_followed: Callable[[Followed, int], dict[str, Any]]) -> dict[str, Any]:
        """The answer so far; `of_followed` shapes one member's run (as `exec` of one Hand does)."""
        selection = [h.name for h in self.run.selection or []]
        limit = max(1 << 10, min(results.SHOW_BYTES, SHOW_TOTAL // max(1, len(selection))))
        rows: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        for name in selection:
            f = self.members.get(name)
            if f is not None and (f.end is not None or f.failure is None):
                row = of_followed(f, limit)
            else:
                state = self.unreached.get(name, "pending")
                row = {"hand": name, "state": state, "exit_code": None}
                if f is not None and f.run_id:
                    row["run"] = f.run_id
                elif state == "pending":
                    row["note"] = "not started yet (at most 50 start at once): runs(fleet=...) lists its run later"
            rows.append(row)
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        going = [r for r in rows if r.get("still_running") or r["state"] == "pending"]
        if going:
            state = "running"
        else:
            state = "succeeded" if set(counts) == {"succeeded"} else "failed"
        out: dict[str, Any] = {"state": state, "selector": self.run.selector, "fleet": self.run.fleet_id}
        out |= {"hands": len(selection), "counts": counts, "results": rows}
        if self.run.aggregate is not None:
            out["exit_code"] = self.run.aggregate.exit_code
        if going:
            out["still_running"] = True
            out["next"] = (
                "Runs still going were not stopped: run_get(run=..., wait_s=30) of each one's run id "
                f'waits for its end; cancel(run=...) stops it; runs(fleet="{self.run.fleet_id}") lists '
                "every run of this fleet, those started since too."
            )
        return out


async def start(runs: Runs, selector: str, tool: str, args: dict[str, Any], timeout_s: float) -> Fleet:
    """Select (the Mind, within this credential's scope) and start the fleet; `ClientError` if the
    selector is malformed or names no Hand this credential may use, `OverBudget` if the runs it would
    start do not fit the credential's byte budget (nothing started)."""
    run = runs.client.exec_many(
        selector, tool, args, timeout=timeout_s, stream=True, max_errors="100%", output_limit=1 << 50
    )
    run.fleet_id = await runs.client.open_fleet()
    run.selection = await runs.client.select_hands(selector)
    if not run.selection:
        raise EmptySelection(selector)
    fleet = Fleet(runs, run, runs.reserve(len(run.selection)))
    runs.spawn(fleet.drive(), follower=True)
    return fleet


async def wait(fleet: Fleet, wait_s: float, progress: Progress | None) -> None:
    """Wait for every member's end for at most `wait_s`, with progress (the run ids in the first,
    then how many ended) at least every `PROGRESS_EVERY_S`."""
    deadline = time.monotonic() + max(0.0, wait_s)
    count = 0.0
    announced: set[str] = set()
    while not fleet.all_ended():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        fleet.changed.clear()
        if fleet.all_ended():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fleet.changed.wait(), min(left, PROGRESS_EVERY_S))
        if progress is None:
            continue
        parts = [f"run {f.run_id} on {h}" for h, f in fleet.members.items() if f.run_id and h not in announced]
        announced.update(h for h, f in fleet.members.items() if f.run_id)
        total = len(fleet.run.selection or [])
        parts.append(f"{len(fleet.ended())} of {total} Hands ended")
        count += 1
        with contextlib.suppress(Exception):  # progress is droppable
            await progress(count, "\n".join(parts))
