"""Layered settings: flags > MINDHAND_* > TOML file > defaults, and errors that say where."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.io.settings import ConfigError, Key, Source, between, log_levels, mask, resolve

KEYS = (
    Key("ping_interval", float, 10.0, check=between(0.1, 3600, " seconds")),
    Key("workers", int, 4, check=between(1, 100)),
    Key("name", str, "box"),
    Key("deny_tools", list, []),
    Key("inherit", bool, False),
    Key("log_level", str, "info", check=log_levels, reloadable=True),
    Key("url", str, None, env="MINDHAND_URL", required=True, what="Mind URL"),
)
BASE_FLAGS = {"url": "ws://m:1"}


def res(flags=None, env=None, text=None, path="/etc/mh/hand.toml"):
    return resolve(
        KEYS,
        flags={**BASE_FLAGS, **(flags or {})},
        env=env or {},
        file_text=text,
        file_path=path if text is not None else None,
    )


@given(
    flag=st.one_of(st.none(), st.integers(1, 100)),
    env=st.one_of(st.none(), st.integers(1, 100)),
    file=st.one_of(st.none(), st.integers(1, 100)),
)
def test_the_highest_layer_present_wins_and_is_named(flag, env, file):
    s = res(
        flags={"workers": str(flag)} if flag is not None else {},
        env={"MINDHAND_WORKERS": str(env)} if env is not None else {},
        text=f"# comment\n\nworkers = {file}\n" if file is not None else "",
    )
    if flag is not None:
        assert (s["workers"], s.origins["workers"].where) == (flag, "--workers")
    elif env is not None:
        assert (s["workers"], s.origins["workers"].where) == (env, "MINDHAND_WORKERS")
    elif file is not None:
        assert (s["workers"], s.origins["workers"].where) == (file, "/etc/mh/hand.toml line 3")
    else:
        assert (s["workers"], s.origins["workers"].kind) == (4, "default")


def test_kinds_from_text_and_from_toml():
    s = res(
        flags={"deny_tools": ["exec,shell", "list_dir"]},
        env={"MINDHAND_INHERIT": "yes", "MINDHAND_PING_INTERVAL": "2.5"},
        text='name = "lab-1"\nlog_level = "info,hand=debug"\n',
    )
    assert s["deny_tools"] == ["exec", "shell", "list_dir"]
    assert s["inherit"] is True and s["ping_interval"] == 2.5
    assert s["name"] == "lab-1" and s["log_level"] == "info,hand=debug"
    s = res(text='deny_tools = ["exec", "shell"]\nping_interval = 3\ninherit = true\n')
    assert s["deny_tools"] == ["exec", "shell"] and s["ping_interval"] == 3.0 and s["inherit"] is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("workers = 4\nwrokers = 5\n", "/etc/mh/hand.toml line 2: unknown key 'wrokers' (did you mean 'workers'?)"),
        ("zzz = 1\n", "/etc/mh/hand.toml line 1: unknown key 'zzz' (known keys: deny_tools, inherit,"),
        ('\n\nworkers = "many"\n', "/etc/mh/hand.toml line 3: workers: wants an integer, got str 'many'"),
        ("workers = 0\n", "/etc/mh/hand.toml line 1: workers: must be between 1 and 100 (got 0)"),
        ("inherit = 1\n", "/etc/mh/hand.toml line 1: inherit: wants true or false, got int 1"),
        ("ping_interval = true\n", "/etc/mh/hand.toml line 1: ping_interval: wants a number, got bool True"),
        ("deny_tools = [1, 2]\n", "/etc/mh/hand.toml line 1: deny_tools: wants a list of strings"),
        ('log_level = "loud"\n', "/etc/mh/hand.toml line 1: log_level: unknown log level 'loud'"),
        ("[sandbox]\nx = 1\n", "/etc/mh/hand.toml line 1: unknown table 'sandbox'"),
        ("workers = \n", "/etc/mh/hand.toml: not valid TOML: "),
        ("workers = 1\nworkers = 2\n", "(at line 2"),
    ],
)
def test_file_errors_name_the_key_the_file_and_the_line(text, message):
    with pytest.raises(ConfigError) as err:
        res(text=text)
    assert message in str(err.value)


def test_flag_and_env_errors_name_their_source():
    with pytest.raises(ConfigError, match=r"^--workers: wants an integer, got 'x'$"):
        res(flags={"workers": "x"})
    with pytest.raises(ConfigError, match=r"^MINDHAND_PING_INTERVAL: must be between 0.1 and 3600 seconds"):
        res(env={"MINDHAND_PING_INTERVAL": "0"})
    with pytest.raises(ConfigError, match=r"^MINDHAND_INHERIT: wants true or false, got 'maybe'$"):
        res(env={"MINDHAND_INHERIT": "maybe"})


def test_a_bad_value_in_a_lower_layer_is_not_an_error_when_a_higher_one_wins():
    # An operator overriding a broken file value with a flag can still start the daemon.
    assert res(flags={"workers": "7"}, text="workers = 0\n")["workers"] == 7


def test_required_keys_say_every_way_to_set_them():
    with pytest.raises(ConfigError) as err:
        resolve(KEYS, flags={}, env={}, file_text="workers = 2\n", file_path="/etc/mh/hand.toml")
    assert str(err.value) == "no Mind URL: pass --url, set MINDHAND_URL, or set url in /etc/mh/hand.toml"
    assert resolve(KEYS, flags={}, env={"MINDHAND_URL": "ws://x:1"})["url"] == "ws://x:1"
    assert resolve(KEYS, flags={}, env={}, require=False)["url"] is None


def test_show_masks_credential_tokens_and_names_sources():
    token = "mh1:hand:lab-1:" + "ab" * 32
    keys = KEYS + (Key("credential", str, None),)
    s = resolve(
        keys, flags=BASE_FLAGS, env={"MINDHAND_CREDENTIAL": token}, file_text="workers = 9\n", file_path="/f.toml"
    )
    rows = {r["key"]: r for r in s.show()}
    assert rows["credential"] == {
        "key": "credential",
        "value": "mh1:hand:lab-1:****",
        "source": "MINDHAND_CREDENTIAL",
        "reloadable": False,
    }
    assert "ab" * 32 not in repr(s.show())
    assert rows["workers"]["source"] == "/f.toml line 1"
    assert rows["url"]["source"] == "--url" and rows["name"]["source"] == "default"
    assert rows["log_level"]["reloadable"] is True
    assert mask(["a", token]) == ["a", "mh1:hand:lab-1:****"]
    assert mask("/etc/mindhand/hand.cred") == "/etc/mindhand/hand.cred"


def test_source_rereads_the_file_and_reports_what_changed():
    texts = {"/f.toml": "workers = 2\n"}
    src = Source(
        keys=KEYS, flags={**BASE_FLAGS, "name": "flagged"}, env={}, path="/f.toml", explicit=True, read=texts.get
    )
    first = src.load()
    texts["/f.toml"] = 'workers = 3\nname = "from-file"\nlog_level = "debug"\n'
    second = src.load()
    assert second["workers"] == 3 and second["name"] == "flagged"  # flags still win after a reload
    assert first.changed(second) == ["workers", "log_level"]
    missing = Source(keys=KEYS, flags=BASE_FLAGS, env={}, path="/nope.toml", explicit=True, read=lambda p: None)
    with pytest.raises(ConfigError, match="config file /nope.toml does not exist"):
        missing.load()
    default = Source(keys=KEYS, flags=BASE_FLAGS, env={}, path="/nope.toml", explicit=False, read=lambda p: None)
    assert default.load().file is None and default.describe(default.load()) == "none (/nope.toml does not exist)"


def test_reloader_reports_reloadable_changes_once_and_keeps_going_on_a_bad_file():
    from structlog.testing import capture_logs

    from protocol.io.settings import Reloader

    texts = {"/f.toml": "workers = 2\n"}
    src = Source(keys=KEYS, flags=BASE_FLAGS, env={}, path="/f.toml", explicit=True, read=texts.get)
    reread = Reloader(src, src.load())
    import structlog

    log = structlog.get_logger()
    with capture_logs() as events:
        texts["/f.toml"] = 'workers = 3\nlog_level = "debug"\n'
        assert reread(log) == {"log_level": "debug"}
        assert reread(log) == {}  # already applied: nothing new
        texts["/f.toml"] = "workers = [\n"
        assert reread(log) == {}
    kinds = [
        (e["event"], e.get("applied"), e.get("needs_restart")) for e in events if e["event"] != "config_needs_restart"
    ]
    assert kinds[0] == ("config_reloaded", ["log_level"], ["workers"])
    assert kinds[1] == ("config_reloaded", [], ["workers"])
    assert kinds[2][0] == "config_reload_failed"


def test_show_masks_a_password_in_a_url_and_keeps_the_rest():
    from protocol.io.settings import mask

    assert mask("postgresql://mind:s3cr%40t@db:5432/mindhand") == "postgresql://mind:****@db:5432/mindhand"
    assert mask("postgresql://mind@db/mindhand") == "postgresql://mind@db/mindhand"  # no password: nothing hidden
    assert mask(["ws://a:7470", "wss://b:7470/x"]) == ["ws://a:7470", "wss://b:7470/x"]  # a port is not a password
