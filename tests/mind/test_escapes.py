"""The `~.` escapes of a terminal session (mind/cli/escapes.py): ssh's rules, as a table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mind.cli.escapes import Escape, EscapeFilter, help_text

LEAVE, HELP = Escape.LEAVE, Escape.HELP

CASES = [
    # (reads, bytes sent, actions)
    ([b"~."], b"", [LEAVE]),  # at the very start
    ([b"ls\r~."], b"ls\r", [LEAVE]),  # after CR (what Enter sends in raw mode)
    ([b"ls\n~."], b"ls\n", [LEAVE]),  # after LF
    ([b"a~."], b"a~.", []),  # mid-line: ordinary bytes
    ([b"cd ~/src\r"], b"cd ~/src\r", []),
    ([b"\t~."], b"\t~.", []),  # only CR and LF start a line
    ([b"ls\r", b"~", b"."], b"ls\r", [LEAVE]),  # split across reads, one key per read
    ([b"ls\r~", b"."], b"ls\r", [LEAVE]),
    ([b"ls", b"\r", b"~."], b"ls\r", [LEAVE]),
    ([b"ab\r~.cd"], b"ab\r", [LEAVE]),  # nothing after the escape is sent
    ([b"~.", b"more"], b"", [LEAVE]),  # nor anything read later
    ([b"~?"], b"", [HELP]),
    ([b"~?~."], b"", [HELP, LEAVE]),  # still at the start of a line after ~?
    ([b"x\r~?", b"y"], b"x\ry", [HELP]),
    ([b"~~"], b"~", []),  # one ~ is sent
    ([b"~~."], b"~.", []),  # ... and the line has started: no escape
    ([b"~", b"~", b"."], b"~.", []),
    ([b"~x"], b"~x", []),  # anything else: both bytes
    ([b"~\r~."], b"~\r", [LEAVE]),  # ~ then CR sends both, and CR starts a line
    ([b"\x03\r~."], b"\x03\r", [LEAVE]),  # Ctrl-C is a byte like any other
    ([b"~", b""], b"", []),  # a held ~ stays held over an empty read
    ([b"a\r\r~."], b"a\r\r", [LEAVE]),
]


@pytest.mark.parametrize(("reads", "sent", "actions"), CASES)
def test_escape_table(reads, sent, actions):
    f = EscapeFilter()
    out, seen = b"", []
    for data in reads:
        chunk, acts = f.feed(data)
        out += chunk
        seen += acts
    assert (out, seen) == (sent, actions)
    assert f.left == (LEAVE in actions)


def test_a_held_tilde_is_sent_when_the_input_ends():
    f = EscapeFilter()
    assert f.feed(b"ls\r~") == (b"ls\r", [])
    assert f.flush() == b"~"
    assert f.flush() == b""
    assert f.feed(b".") == (b".", [])  # the line has started: no longer an escape


def test_no_escape_character_sends_everything():
    f = EscapeFilter(escape=None)
    assert f.feed(b"~.\r~?~~") == (b"~.\r~?~~", [])
    assert f.flush() == b"" and not f.left


def test_another_escape_character():
    f = EscapeFilter(escape=ord("%"))
    assert f.feed(b"~.\r%?%%") == (b"~.\r%", [HELP])
    f = EscapeFilter(escape=ord("%"))
    assert f.feed(b"x\r%.") == (b"x\r", [LEAVE])


def test_help_lists_the_escapes_with_crlf():
    text = help_text()
    assert "~." in text and "~?" in text and "~~" in text
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    assert "%." in help_text(ord("%"))


@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"~", b"-")), max_size=8))
def test_without_the_escape_character_input_passes_unchanged(reads):
    f = EscapeFilter()
    assert b"".join(f.feed(data)[0] for data in reads) == b"".join(reads)


@given(
    st.lists(st.sampled_from([b"~", b".", b"?", b"\r", b"\n", b"a", b"~~", b"\x03"]), max_size=30),
    st.lists(st.integers(min_value=0, max_value=60), max_size=6),
)
def test_how_input_is_split_into_reads_does_not_matter(pieces, cuts):
    data = b"".join(pieces)
    whole = EscapeFilter()
    expected = whole.feed(data)
    split = EscapeFilter()
    out, actions, last = b"", [], 0
    for cut in sorted(min(c, len(data)) for c in cuts) + [len(data)]:
        chunk, acts = split.feed(data[last:cut])
        out, actions, last = out + chunk, actions + acts, cut
    assert (out, actions) == expected
    assert whole.flush() == split.flush() and whole.left == split.left
