"""Fleet selectors (mind/core/selector.py): the grammar, and that matching is over the Mind's names
and labels only."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mind.core.selector import SelectorError, parse, parse_label, parse_label_edits

HANDS = [
    ("web1", {"role": "web", "dc": "eu1"}),
    ("web2", {"role": "web", "dc": "us1"}),
    ("db1", {"role": "db", "dc": "eu1"}),
    ("box", {}),
]


def sel(text: str) -> list[str]:
    return parse(text).select(HANDS)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("web1", ["web1"]),
        ("web1,db1", ["web1", "db1"]),
        ("db1,web1", ["web1", "db1"]),  # the order is the Mind's, not the selector's
        ("web*", ["web1", "web2"]),
        ("*", ["web1", "web2", "db1", "box"]),
        ("role=web", ["web1", "web2"]),
        ("dc=eu1", ["web1", "db1"]),
        ("role=web+dc=eu1", ["web1"]),
        ("role=web+dc=eu1,box", ["web1", "box"]),
        ("web*+dc=us1", ["web2"]),
        ("dc=eu*", ["web1", "db1"]),
        ("role=nothing", []),
        ("nope", []),
        (" web1 , db1 ", ["web1", "db1"]),
        ("db[12]", ["db1"]),
    ],
)
def test_selection(text, want):
    assert sel(text) == want


def test_a_label_never_matches_a_hand_without_it():
    assert sel("role=*") == ["web1", "web2", "db1"]  # box has no role


@pytest.mark.parametrize(
    "bad",
    ["", " ", ",", "web1,", ",web1", "a,,b", "+", "a+", "role=", "=web", "ro le=web", "web;rm", "a b", "x" * 5000],
)
def test_bad_selectors_are_refused_with_a_sentence(bad):
    with pytest.raises(SelectorError) as exc:
        parse(bad)
    assert str(exc.value)


def test_names_only():
    assert parse("a,b").names_only == ("a", "b")
    assert parse("a*,b").names_only is None
    assert parse("role=web").names_only is None


def test_labels_and_edits():
    assert parse_label("role=web") == ("role", "web")
    for bad in ("role", "=x", "role=", "ro le=x", "role=we b", "-role=x"):
        with pytest.raises(SelectorError):
            parse_label(bad)
    assert parse_label_edits(["dc=eu1", "role-", "-zone"]) == ({"dc": "eu1"}, ["role", "zone"])
    with pytest.raises(SelectorError):
        parse_label_edits(["-"])


NAME = st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,8}\Z")
PATTERN = st.from_regex(r"\A[a-z0-9*?][a-z0-9*?._-]{0,6}\Z")


@given(st.lists(NAME, unique=True, max_size=20), st.lists(PATTERN, min_size=1, max_size=4))
def test_a_comma_list_is_the_union_of_its_globs(names, patterns):
    hands = [(n, {}) for n in names]
    got = parse(",".join(patterns)).select(hands)
    assert got == [n for n in names if any(fnmatchcase(n, p) for p in patterns)]


@given(
    st.lists(st.tuples(NAME, st.sampled_from(["web", "db", "x"]), st.sampled_from(["eu1", "us1"])), max_size=20),
    st.sampled_from(["web", "db", "x"]),
    st.sampled_from(["eu1", "us1"]),
)
def test_plus_is_the_intersection(rows, role, dc):
    hands = [(n, {"role": r, "dc": d}) for n, r, d in {n: (n, r, d) for n, r, d in rows}.values()]
    both = parse(f"role={role}+dc={dc}").select(hands)
    a, b = set(parse(f"role={role}").select(hands)), set(parse(f"dc={dc}").select(hands))
    assert set(both) == a & b
