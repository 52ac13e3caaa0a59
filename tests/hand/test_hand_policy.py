import pytest

from hand.core.policy import KNOWN_TOOLS, PTY_TOOLS, LivePolicy, Policy, parse_tool_list, pty_refusal


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


def test_terminal_runs_need_their_tool_and_no_deny_pty():
    assert PTY_TOOLS <= KNOWN_TOOLS
    p = Policy()
    assert p.allows_pty("exec") and p.allows_pty("shell") and pty_refusal(p, "exec") is None
    assert not p.allows_pty("read_file") and "cannot have a terminal" in (pty_refusal(p, "read_file") or "")
    p = Policy(deny=frozenset({"shell"}))
    assert p.allows_pty("exec") and not p.allows_pty("shell") and "denied" in (pty_refusal(p, "shell") or "")
    p = Policy(pty=False)
    assert p.allowed("exec") and not p.allows_pty("exec")  # the tool itself stays allowed
    assert pty_refusal(p, "exec") == "terminal runs are denied by this hand's policy (deny_pty)"


def test_the_live_policy_answers_for_terminals_too():
    live = LivePolicy(Policy())
    assert live.allows_pty("exec")
    live.current = Policy(pty=False)  # a SIGHUP reload
    assert not live.allows_pty("exec") and live.allowed("exec")


def test_deny_pty_from_the_settings():
    from hand.cli import policy_of

    base = {"allow_tools": None, "deny_tools": []}
    assert policy_of({**base, "deny_pty": False}) == Policy()
    assert policy_of({**base, "deny_pty": True}) == Policy(pty=False)


@pytest.mark.parametrize(
    ("argv", "env", "toml", "expected"),
    [
        ([], {}, "", False),
        (["--deny-pty"], {}, "", True),
        ([], {"MINDHAND_DENY_PTY": "1"}, "", True),
        ([], {}, "deny_pty = true\n", True),
    ],
)
def test_deny_pty_is_a_flag_a_variable_and_a_key(tmp_path, argv, env, toml, expected):
    from hand.cli import _parser, policy_of, settings_source

    conf = tmp_path / "hand.toml"
    conf.write_text(toml)
    args = _parser().parse_args(["run", "--config", str(conf), *argv])
    settings = settings_source(args, env).load(require=False)
    assert settings["deny_pty"] is expected and policy_of(settings).pty is not expected
