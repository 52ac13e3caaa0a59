"""The invariants of the `nodes` variant (DESIGN §16), checked after every event, in the style of
`sim.checker` (same `InvariantViolation`, same replay line).

Always:
- **a node's lease never outlives the database's view of it**: while a node's core says its lease
  is live, the database deems it live too (the core counts from when the renewal was sent);
- **one node acts for a Hand at a time**: an act is a frame delivered to the Hand or a write about
  it that lands, each made by a claim. Claims are fencing tokens, so acts about one Hand are made
  by non-decreasing claims, each by the node the database gave that claim to: once a newer claim
  acted, no older one ever acts again. (The stronger "never while the database says another claim
  is current" does not hold for frames, and cannot: a claim statement that was slow to reach the
  database can land after the Hand moved on; until the node holding the Hand hears of it, its
  frames still reach the Hand, which holds that one connection only. Those are counted,
  `note:frame_behind_newer_claim` (rare: the claim must stall past the Hand's welcome wait); no
  write of theirs lands);
- **a write about a Hand lands only with the current claim** (kept here from the claims the
  database made, not from the database model's own check);
- **one terminal per run, recorded once**: an ending lands once per run, never changes; the Hand
  concludes each run once; a request gets at most one answer, and an ending answered is the one
  recorded;
- **runs are not lost while their Hand is within its window**: a Hand kills its runs only after
  `WINDOW_S` without any connection.

Once settled (faults healed, nodes restarted, everything run out): every request got exactly one
answer; every run whose start landed has one ending; an ending of a run the Hand ran is the Hand's
own result (never `lost`); a run the Hand never ran ends `lost`.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from sim.checker import InvariantViolation

if TYPE_CHECKING:
    from sim.nodes_world import NodesWorld, Request


class NodesChecker:
    def __init__(self, world: NodesWorld) -> None:
        self.world = world
        self.notes: Counter[str] = Counter()
        self.claims: dict[str, dict[int, str]] = {}
        """Hand -> claim -> the node the database gave it to."""
        self.acted: dict[str, int] = {}
        """Hand -> the newest claim that acted for it."""
        self.endings: dict[str, str] = {}
        self.hand_results: dict[str, tuple[str, str]] = {}
        """run -> (Hand, its result) as the Hand concluded it."""
        self.hand_started: dict[str, str] = {}
        self.started: dict[str, str] = {}

    def fail(self, invariant: str, detail: str) -> None:
        w = self.world
        raise InvariantViolation(invariant, detail, w.seed, w.step_no, w.replay_command())

    # --- what happened ---

    def on_claim(self, hand: str, node: str, claim: int) -> None:
        held = self.claims.setdefault(hand, {})
        if claim in held or (held and claim <= max(held)):
            self.fail("claims only grow", f"{hand} claim {claim} given to {node}, already had {sorted(held)}")
        held[claim] = node
        self.notes["note:claim"] += 1

    def _act(self, hand: str, node: str, claim: int, what: str) -> None:
        owner = self.claims.get(hand, {}).get(claim)
        if owner != node:
            self.fail(
                "one node acts for a Hand", f"{node} acted for {hand} ({what}) by claim {claim}, given to {owner}"
            )
        newest = self.acted.get(hand, 0)
        if claim < newest:
            self.fail(
                "one node acts for a Hand",
                f"{node} acted for {hand} ({what}) by claim {claim} after claim {newest} acted",
            )
        self.acted[hand] = claim

    def on_act(self, hand: str, node: str, claim: int, what: str) -> None:
        self._act(hand, node, claim, what)
        if claim != max(self.claims.get(hand, {0: ""})):
            self.notes["note:frame_behind_newer_claim"] += 1

    def on_write(self, hand: str, node: str, claim: int, what: str) -> None:
        current = max(self.claims.get(hand, {0: ""}))
        if claim != current:
            self.fail(
                "a write lands only with the current claim",
                f"{node} wrote '{what}' about {hand} by claim {claim}, current {current}",
            )
        self._act(hand, node, claim, what)

    def on_ending(self, run: str, state: str) -> None:
        if run in self.endings:
            self.fail("one terminal per run, recorded once", f"{run} recorded {state} after {self.endings[run]}")
        self.endings[run] = state
        self.notes[f"outcome:{state.replace(' ', '_')}"] += 1

    def on_recorded(self, run: str, how: str) -> None:
        self.notes[f"note:ending_{how}"] += 1

    def on_started(self, run: str, hand: str) -> None:
        self.started[run] = hand

    def hand_ran(self, run: str) -> bool:
        return run in self.hand_started

    def on_hand_started(self, hand: str, run: str) -> None:
        if run in self.hand_started:
            self.fail("nothing is executed twice", f"{run} started on {hand} after {self.hand_started[run]}")
        self.hand_started[run] = hand

    def on_hand_concluded(self, hand: str, run: str, result: str, away: float) -> None:
        if run in self.hand_results:
            self.fail("one terminal per run, recorded once", f"{hand} concluded {run} twice")
        self.hand_results[run] = (hand, result)
        if result == "killed_after_window":
            from sim.nodes_world import WINDOW_S

            if away < WINDOW_S - 1e-6:
                self.fail("runs within the window are not lost", f"{hand} killed {run} after {away:.1f} s away")
            self.notes["note:window_passed"] += 1

    def on_answer(self, r: Request) -> None:
        if len(r.answers) > 1:
            self.fail("every request gets one answer", f"{r.req} answered {r.answers}")
        a = r.answers[0]
        if a.startswith("ended ") and self.endings.get(r.run) != a[len("ended ") :]:
            self.fail("an answer is the ending recorded", f"{r.req} told '{a}', recorded {self.endings.get(r.run)}")

    # --- after every event ---

    def after_event(self) -> None:
        w = self.world
        for name, node in w.nodes.items():
            # (a microsecond's grace: the two clocks' origins differ, so their sums round apart)
            if node.alive and node.core.live(node.now() + 1e-6) and not w.db.live(name):
                self.fail(
                    "a node's lease never outlives the database's",
                    f"{name} thinks its lease live until {node.core.live_until:.3f}, the database's heartbeat "
                    f"{w.db.heartbeat_at.get(name)}",
                )

    def settled(self) -> None:
        w = self.world
        for r in w.requests.values():
            if len(r.answers) != 1:
                self.fail("every request gets one answer", f"{r.req} answered {r.answers}")
        for run, hand in w.db.runs.items():
            if run not in self.endings:
                self.fail("every run ends", f"{run} on {hand[0]} started, no ending")
        for run, state in self.endings.items():
            ran = self.hand_results.get(run)
            if ran is None and state != "lost":
                self.fail("an ending is what happened", f"{run} never ran, recorded {state}")
            if ran is not None and state != ran[1]:
                self.fail("runs within the window are not lost", f"{run} ran to '{ran[1]}', recorded '{state}'")
        for run in self.hand_started:
            if run not in self.hand_results:
                self.fail("every run ends", f"{run} started on its Hand and never concluded")
