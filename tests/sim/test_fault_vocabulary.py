"""The simulation and the fault proxy speak one fault vocabulary (`mind/testing/vocabulary.py`): every
fault the simulation injects is named there and marked as one the simulation performs, so a trace of
a failing seed names faults the proxy and the harness know (docs/testing.md, "Determinism and replay")."""

from __future__ import annotations

from sim.simulation import run_seed

from mind.testing.vocabulary import WHERE, Fault


def test_every_fault_the_simulation_injects_is_in_the_vocabulary() -> None:
    kinds: set[str] = set()
    for seed in range(30):
        world = run_seed(seed, steps=200)
        kinds |= {k.split(":", 1)[1].split()[0] for k in world.events if k.startswith("fault:")}
    kinds.discard("none")
    assert len(kinds) >= 6, kinds  # the mix was exercised
    for kind in kinds:
        assert kind in set(Fault), f"the simulation injects {kind!r}, which the vocabulary does not name"
        assert "sim" in WHERE[Fault(kind)], f"{kind} is injected by the simulation but not marked so"
