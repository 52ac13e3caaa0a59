"""Selectors are bounded in what they cost (issue 23, attack 3): repeats dropped, globs and labels
capped, plain names looked up by key. Timing is measured by `scripts/bench-selectors`, not here."""

from __future__ import annotations

import pytest

from mind.core.selector import MAX_PATTERN_ATOMS, SelectorError, parse

HANDS = [(f"h{i}", {"role": "web" if i % 2 else "db"}) for i in range(20)]


def test_repeated_terms_and_atoms_are_dropped_in_first_written_order():
    s = parse("b,a,b,a+role=web,role=web+a,a")
    assert [[a.pattern for a in t] for t in s.terms] == [["b"], ["a"], ["a", "web"]]


def test_a_list_of_2048_plain_names_parses_and_selects_by_name():
    text = ",".join(f"x{i:x}" for i in range(2048))[:4090].rsplit(",", 1)[0]
    s = parse(text + ",h3")
    assert len(s.terms) > 800
    assert s.select(HANDS) == ["h3"]
    assert not s.needs_labels


def test_globs_and_labels_beyond_the_cap_are_refused_with_a_sentence():
    ok = ",".join(f"h{i}*" for i in range(MAX_PATTERN_ATOMS))
    assert parse(ok).select(HANDS)
    with pytest.raises(SelectorError, match=f"at most {MAX_PATTERN_ATOMS}"):
        parse(ok + ",zz*")
    # an atom repeated does not count twice
    assert parse(",".join(["role=web"] * 400)).select(HANDS) == [n for n, lb in HANDS if lb["role"] == "web"]


def test_every_atom_of_a_multi_atom_term_counts_even_a_plain_name():
    text = ",".join(f"h{i}+role=web" for i in range(MAX_PATTERN_ATOMS // 2 + 1))
    with pytest.raises(SelectorError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("h1,h1*", ["h1"] + [f"h{i}" for i in range(10, 20)]),
        ("h1?,h2", ["h2"] + [f"h{i}" for i in range(10, 20)]),
        ("h3+role=web", ["h3"]),
        ("h4+role=web", []),
        ("role=d*,h1", ["h0", "h1"] + [f"h{i}" for i in range(2, 20, 2)]),
    ],
)
def test_the_fast_paths_match_what_each_term_says(text, want):
    assert parse(text).select(HANDS) == [n for n, _ in HANDS if n in want]


def test_needs_labels_only_when_a_label_atom_is_present():
    assert not parse("web*,a,b").needs_labels
    assert parse("web*,role=x").needs_labels
