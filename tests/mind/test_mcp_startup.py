"""`mind mcp --print-config` and the errors of a start that cannot work, in-process (no Mind needed):
the entry names this `mind` by an absolute path and the Mind and credential as `mind exec` finds
them; a CA or pin beside a `ws://` URL is refused naming what set it (the variable left in an
agent's configuration, or the flag), never a flag nobody gave."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from mind.client.endpoint import locate
from mind.errors import ClientCode, ClientError
from mind.main import main

TOKEN = f"mh1:client:agent:{secrets.token_hex(32)}\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local Mind's home (its `mind.url`, `ws://` on loopback as the README's) and an agent's
    credential in the working directory; no MINDHAND_* from the test's own environment."""
    for key in [k for k in os.environ if k.startswith("MINDHAND_")]:
        monkeypatch.delenv(key)
    h = tmp_path / "home"
    h.mkdir()
    (h / "mind.url").write_text("ws://127.0.0.1:7470\n")
    (h / "admin.cred").write_text(f"mh1:client:admin:{secrets.token_hex(32)}\n")
    (tmp_path / "agent.cred").write_text(TOKEN)
    monkeypatch.setenv("MINDHAND_HOME", str(h))
    monkeypatch.chdir(tmp_path)
    return h


def mind(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(words))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_print_config_is_an_entry_that_works_from_any_path(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = mind(capsys, "mcp", "--print-config", "--credential", "agent.cred")
    assert (code, err) == (0, "")
    entry = json.loads(out)["mcpServers"]["mindhand"]
    command = entry["command"]
    assert os.path.isabs(command) and os.access(command, os.X_OK)  # not "mind": the agent's PATH lacks it
    assert entry["args"][-1] == "mcp" and entry["args"] in (["mcp"], ["-m", "mind", "mcp"])
    assert entry["env"] == {
        "MINDHAND_URL": "ws://127.0.0.1:7470",
        "MINDHAND_CREDENTIAL": str(home.parent / "agent.cred"),  # absolute: the agent runs elsewhere
    }


def test_print_config_warns_when_it_hands_out_the_admin_credential(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = mind(capsys, "mcp", "--print-config")
    assert code == 0 and json.loads(out)["mcpServers"]["mindhand"]["env"]["MINDHAND_CREDENTIAL"] == str(
        home / "admin.cred"
    )
    assert "admin credential" in err and "mind client add agent" in err


def test_print_config_refuses_what_would_fail_in_the_agent(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = mind(capsys, "mcp", "--print-config", "--credential", "missing.cred")
    assert (code, out) == (125, "") and err.startswith("mind: cannot read credential file missing.cred")
    code, out, err = mind(capsys, "mcp", "--print-config", "--listen", "127.0.0.1:7480")
    assert code == 2 and "stdio" in err


def test_a_ca_variable_beside_a_ws_mind_is_named(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old desktop snippet's `MINDHAND_CA` kept with the README's local `ws://` Mind: the error
    names the variable and says what to do, in one line."""
    monkeypatch.setenv("MINDHAND_CA", "/home/me/.config/mindhand/ca.crt")
    code, out, err = mind(capsys, "mcp", "--print-config", "--credential", "agent.cred")
    assert (code, out) == (125, "")
    assert err == (
        f"mind: MINDHAND_CA is set but the Mind URL is ws://127.0.0.1:7470 (the local Mind's, from "
        f"{home / 'mind.url'}): unset it or use a wss:// URL (a CA file and a pin need a wss:// Mind URL)\n"
    )
    with pytest.raises(ClientError) as exc:  # what the server says at its start, the same sentence
        locate(None, None, "agent.cred", None, None)
    assert exc.value.code == ClientCode.CONFIG and exc.value.message.startswith("MINDHAND_CA is set but")


def test_a_flag_beside_a_ws_mind_is_named_as_the_flag(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ClientError) as exc:
        locate(None, ["ws://10.0.0.5:7470"], None, None, "sha256:" + "0" * 64)
    assert exc.value.message.startswith(
        "--pin is given but the Mind URL is ws://10.0.0.5:7470 (from --mind): drop it or use a wss:// URL"
    )
    monkeypatch.setenv("MINDHAND_PIN", "sha256:" + "0" * 64)
    with pytest.raises(ClientError) as exc:
        locate(None, None, None, "ca.crt", None)
    assert exc.value.message.startswith("--ca is given and MINDHAND_PIN is set but the Mind URL is ws://127.0.0.1:7470")
    assert "drop --ca and unset MINDHAND_PIN or use a wss:// URL" in exc.value.message
    monkeypatch.setenv("MINDHAND_URL", "wss://mind.example:7470")  # wss: both fine
    assert locate(None, None, None, "ca.crt", None)[2:] == ("ca.crt", "sha256:" + "0" * 64)
