"""Layered settings: flags > MINDHAND_* > TOML file > defaults, and errors that say where."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.io.settings import ConfigError, Duration, Key, Source, between, duration_text, log_levels, mask, resolve

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


# --- durations: one parser for every key that holds seconds -------------------------------------

WINDOW = (Key("resume_window", Duration, 60.0, check=between(0, 86400, " seconds")),)


@pytest.mark.parametrize(
    "how, raw, seconds",
    [
        ("flag", "3s", 3.0),
        ("flag", "90", 90.0),
        ("flag", "1.5m", 90.0),
        ("env", "2h", 7200.0),
        ("file", "5", 5.0),
        ("file", "2.5", 2.5),
        ("file", '"5m"', 300.0),
    ],
)
def test_a_duration_key_takes_what_every_duration_option_takes(how, raw, seconds):
    """`mind serve --resume-window 3s` was refused ("wants a number") while `mind exec --wait 5m` took
    units: a duration key reads flags, variables and the file by `protocol.units`, to a float."""
    s = resolve(
        WINDOW,
        flags={"resume_window": raw} if how == "flag" else {},
        env={"MINDHAND_RESUME_WINDOW": raw} if how == "env" else {},
        file_text=f"resume_window = {raw}\n" if how == "file" else None,
        file_path="/etc/mh/mind.toml" if how == "file" else None,
    )
    assert s["resume_window"] == seconds and type(s["resume_window"]) is float


@pytest.mark.parametrize(
    "flags, text, message",
    [
        ({"resume_window": "soon"}, None, "--resume-window: 'soon' is not a duration (use e.g. 90s"),
        ({"resume_window": "2d"}, None, "--resume-window: must be between 0 and 86400 seconds (got 172800)"),
        ({}, "resume_window = true\n", "line 1: resume_window: wants a duration (seconds, or a string such as"),
        ({}, 'resume_window = "5x"\n', "line 1: resume_window: '5x' is not a duration"),
    ],
)
def test_a_bad_duration_says_where_and_what_to_type(flags, text, message):
    with pytest.raises(ConfigError) as err:
        resolve(WINDOW, flags=flags, env={}, file_text=text, file_path="/etc/mh/mind.toml" if text else None)
    assert message in str(err.value)


def test_every_daemon_key_of_seconds_is_a_duration():
    """Both daemons' tables: a key whose help or metavar speaks of seconds or a duration reads units."""
    from hand.config import KEYS as HAND_KEYS
    from mind.config import KEYS as MIND_KEYS

    timed = {k.name for k in (*HAND_KEYS, *MIND_KEYS) if k.kind is Duration}
    assert timed == {
        "ping_interval",
        "node_lease",
        "resume_window",
        "keep_max",
        "max_backoff",
        "kill_grace",
        "task_retention",
        "record_retention",
    }
    for k in (*HAND_KEYS, *MIND_KEYS):
        assert k.kind is Duration or (k.metavar != "S" and k.kind is not float), k.name


def test_help_shows_a_duration_default_as_typed():
    assert [duration_text(s) for s in (10.0, 60.0, 3600.0, 604800.0, 0.5, 90.0)] == [
        "10s",
        "1m",
        "1h",
        "7d",
        "0.5s",
        "90s",
    ]
