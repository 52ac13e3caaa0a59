"""docs/agents.md is true: its Python program (the official MCP SDK's client starting `mind mcp`
over stdio) runs as written against a real Mind and a Hand named `web1`; its configuration entries
are valid JSON naming `mind mcp` as `--print-config` prints it; the README points to it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mind.testing.cluster import running

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "agents.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", GUIDE.read_text(), re.S | re.M)


def test_the_configuration_entries_start_mind_mcp():
    """The stdio entry is what `mind mcp --print-config` prints for the README's local Mind (its shape
    is checked against the real output in tests/integration/test_mcp_config.py): `mind` by an absolute
    path (an agent's PATH seldom holds a virtualenv's bin), a `ws://` loopback URL and no CA beside it
    (which `mind mcp` would refuse)."""
    stdio, http = (json.loads(b)["mcpServers"]["mindhand"] for b in blocks("json"))
    assert stdio["command"].startswith("/") and stdio["command"].endswith("/bin/mind") and stdio["args"] == ["mcp"]
    assert set(stdio["env"]) == {"MINDHAND_URL", "MINDHAND_CREDENTIAL"}
    assert stdio["env"]["MINDHAND_URL"].startswith("ws://127.0.0.1:")
    assert stdio["env"]["MINDHAND_CREDENTIAL"].startswith("/")
    assert "mind mcp --print-config" in GUIDE.read_text()
    assert http["url"].endswith("/mcp") and http["headers"]["Authorization"].startswith("Bearer mh1:client:")
    assert "docs/agents.md" in (ROOT / "README.md").read_text()


@pytest.mark.slow  # a Mind, a Hand, the guide's program and the `mind mcp` it starts
def test_the_guides_program_runs_against_a_real_mind(tmp_path):
    (program,) = blocks("python")
    with running(tmp_path, "web1", mind_args=("--resume-window", "30")) as cl:
        env = {k: v for k, v in cl.env.items() if k != "MINDHAND_HOME"}
        env.update(MINDHAND_URL=cl.url, MINDHAND_CREDENTIAL=str(cl.client_credential("agent", "--hands", "web1")))
        r = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0, r.stderr.decode()[:3000]
        tools = json.loads(r.stdout.decode().strip().replace("'", '"'))
        assert {"hands", "exec", "run_get", "read_output", "cancel", "task_start", "upload", "download"} <= set(tools)
