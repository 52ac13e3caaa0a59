"""Named run ids (DESIGN §4, "Named runs"): the name a client gives and the number the Mind reads
back agree, and nothing but the exact form of `named_run` reads as a number."""

from hypothesis import given
from hypothesis import strategies as st

from protocol import limits
from protocol.ids import named_run, new_id, run_number


@given(st.integers(min_value=1, max_value=10**18 - 1))
def test_a_name_reads_back_as_its_number_and_is_a_valid_id(n: int) -> None:
    prefix = new_id("r")
    name = named_run(prefix, n)
    assert run_number(prefix, name) == n
    assert limits.ID_RE.match(name)


@given(st.text(max_size=40))
def test_nothing_else_reads_as_a_number_of_the_prefix(tail: str) -> None:
    prefix = new_id("r")
    number = run_number(prefix, f"{prefix}.{tail}")
    assert number is None or named_run(prefix, number) == f"{prefix}.{tail}"


def test_the_forms_a_client_could_forge_are_refused() -> None:
    prefix = new_id("r")
    other = new_id("r")
    for bad in (
        named_run(other, 1),
        f"{prefix}.0",
        f"{prefix}.01",
        f"{prefix}.-1",
        f"{prefix}.+1",
        f"{prefix}.1 ",
        f"{prefix}.١",  # a digit, but not an ASCII one
        f"{prefix}x.1",
        f"{prefix}.{'9' * 19}",
        prefix,
        f"{prefix}.",
        f"{prefix}.1.2",
    ):
        assert run_number(prefix, bad) is None, bad


def test_a_connection_names_only_its_own_runs_each_once_counting_up() -> None:
    from mind.core.admission import RunNames

    prefix = new_id("r")
    names = RunNames(prefix)
    assert names.take(named_run(prefix, 3)) is None
    assert "named before" in (names.take(named_run(prefix, 3)) or "")
    assert "named before" in (names.take(named_run(prefix, 2)) or "")
    assert "may name" in (names.take(named_run(new_id("r"), 4)) or "")
    assert names.take(named_run(prefix, 4)) is None and names.named == 4
