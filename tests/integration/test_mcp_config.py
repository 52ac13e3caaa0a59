"""A desktop agent's configuration, the way a user makes it: `mind mcp --print-config` run from a
shell, its JSON started exactly as printed (command, args, env) by the official MCP SDK's stdio
client in an agent's environment (the SDK's minimal one: a PATH without this virtualenv's `bin`, no
MINDHAND_*, another HOME), against a real Mind and Hand. And a start that cannot work (the CA line
of a `wss://` example kept with a local `ws://` Mind) is one line on stderr naming what to change,
and exit 125."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mind.testing.cluster import Cluster, program, running

pytestmark = pytest.mark.slow  # a real Mind and Hand, `mind mcp` as the agent starts it


def printed(cl: Cluster, *flags: str) -> dict[str, Any]:
    """`mind mcp --print-config FLAGS` as a user runs it in a shell (in `cl.tmp`) on the Mind's machine."""
    r = subprocess.run(
        [*program("mind"), "mcp", "--print-config", *flags], env=cl.env, capture_output=True, timeout=60, cwd=cl.tmp
    )
    assert r.returncode == 0, r.stderr.decode()
    entry: dict[str, Any] = json.loads(r.stdout)["mcpServers"]["mindhand"]
    return entry


async def test_the_printed_configuration_starts_as_pasted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running(tmp_path, "web1") as cl:
        cred = cl.client_credential("agent", "--hands", "web1")
        entry = printed(cl, "--credential", cred.name)  # a relative path, made absolute
        assert os.path.isabs(entry["command"]) and entry["args"][-1] == "mcp"
        assert entry["env"] == {"MINDHAND_URL": cl.url, "MINDHAND_CREDENTIAL": str(cred)}
        assert cl.url.startswith("ws://127.0.0.1:")  # the local Mind as `mind exec` finds it: no CA line

        # the agent's own environment, which the SDK passes on (PATH, HOME, ...): nothing of ours
        for key in [k for k in os.environ if k.startswith("MINDHAND_")]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        monkeypatch.setenv("HOME", str(tmp_path / "agent-home"))
        monkeypatch.chdir("/")
        server = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
        async with Client(server, read_timeout_seconds=30) as agent:
            res = await agent.call_tool("hands", {})
            assert [h["name"] for h in json.loads(res.content[0].text)["hands"]] == ["web1"]
            res = await agent.call_tool("exec", {"hand": "web1", "argv": ["echo", "from the agent"]})
            out = json.loads(res.content[0].text)
            assert not res.is_error and (out["state"], out["stdout"]) == ("succeeded", "from the agent\n")


def test_a_ca_kept_beside_a_ws_mind_is_one_line_naming_it(tmp_path: Path) -> None:
    with running(tmp_path, "web1") as cl:
        cred = cl.client_credential("agent", "--hands", "web1")
        entry = printed(cl, "--credential", str(cred))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **entry["env"]}
        env["MINDHAND_CA"] = str(tmp_path / "ca.crt")  # the line of the wss:// example, kept
        argv = [entry["command"], *entry["args"]]
        r = subprocess.run(argv, env=env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 125
        assert r.stderr.decode() == (
            f"mind: MINDHAND_CA is set but the Mind URL is {cl.url} (from MINDHAND_URL): unset it or use a "
            "wss:// URL (a CA file and a pin need a wss:// Mind URL)\n"
        )
        del env["MINDHAND_CA"]
        r = subprocess.run(
            [*argv, "--ca", "ca.crt"], env=env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL
        )
        assert r.returncode == 125 and r.stderr.decode().startswith(f"mind: --ca is given but the Mind URL is {cl.url}")
        assert len(r.stderr.splitlines()) == 1
