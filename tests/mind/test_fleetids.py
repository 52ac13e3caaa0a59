"""Fleet ids are minted by the Mind and bound to their owner (mind/core/fleetids.py, attack 11)."""

from __future__ import annotations

from mind.core.fleetids import FleetOwners


def test_only_the_owner_may_tag_runs_with_its_fleet():
    t = FleetOwners()
    t.opened("fleet-1", "alice")
    assert t.problem("fleet-1", "alice") is None
    assert t.problem("fleet-1", "mallory") == t.problem("fleet-2", "mallory").replace("fleet-2", "fleet-1")
    assert t.problem("fleet-never", "alice") is not None


def test_the_table_forgets_the_oldest_fleets_first():
    t = FleetOwners(max_fleets=2)
    t.opened("f1", "a")
    t.opened("f2", "a")
    t.opened("f3", "a")
    assert len(t) == 2
    assert t.problem("f1", "a") is not None and t.problem("f3", "a") is None
