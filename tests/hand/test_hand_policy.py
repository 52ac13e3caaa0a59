import pytest

from hand.core.policy import KNOWN_TOOLS, Policy, parse_tool_list


def test_no_allow_list_allows_every_tool_not_denied():
    p = Policy()
    assert all(p.allowed(t) for t in KNOWN_TOOLS)


def test_allow_list_limits():
    p = Policy(allow=frozenset({"read_file", "list_dir"}))
    assert p.allowed("read_file") and p.allowed("list_dir")
    assert not p.allowed("exec") and not p.allowed("shell")


def test_deny_wins_over_allow():
    p = Policy(allow=frozenset({"exec", "shell"}), deny=frozenset({"shell"}))
    assert p.allowed("exec")
    assert not p.allowed("shell")


def test_empty_allow_list_allows_nothing():
    assert not any(Policy(allow=frozenset()).allowed(t) for t in KNOWN_TOOLS)


def test_parse_tool_list():
    assert parse_tool_list(" exec, shell ,") == {"exec", "shell"}
    assert parse_tool_list("") == frozenset()
    with pytest.raises(ValueError, match="unknown tool"):
        parse_tool_list("exec,rm_rf")
