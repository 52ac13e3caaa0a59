"""docs/client.md, the Python client's front door, is true: every ```python block runs, as written,
against a real Mind and two real Hands over TLS (issue 24 item 5). The first block is a whole
program; each later one is a `main()` put in its place, as the guide says. A block's asserts are its
claims, so an example that drifts from the client fails here.

Also: the Python client's default timeouts are the CLI's (`mc.exec` allowed 60 s where `mind exec`
allows 3600 s)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mind.cli.main import parse
from mind.client.aio import MindClient
from mind.client.fleet import FleetRun
from mind.testing.cluster import running

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "client.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def programs() -> list[tuple[str, str]]:
    """(the section's title, the program) for each block of the guide."""
    text = GUIDE.read_text()
    blocks = [(m.start(), m.group(1)) for m in BLOCK.finditer(text)]
    assert len(blocks) >= 8, "docs/client.md: connect, exec, streams, events, tools, hands, tasks, files, ..."
    first = blocks[0][1]
    assert first.rstrip().endswith("asyncio.run(main())") and "async def main() -> None:" in first
    prelude = first[: first.index("async def main() -> None:")]
    out = [("Connect", first)]
    for pos, block in blocks[1:]:
        title = text[:pos].rsplit("\n## ", 1)[1].split("\n", 1)[0]
        assert "async def main() -> None:" in block, f"the block under '{title}' is not a main()"
        out.append((title, f"{prelude}\n{block}\n\nasyncio.run(main())\n"))
    return out


def test_the_python_clients_default_timeouts_are_the_clis():
    def default(fn, name: str = "timeout") -> float:
        return inspect.signature(fn).parameters[name].default

    exec_cli = parse(["exec", "--hand", "box", "--", "true"]).timeout
    fleet_cli = parse(["exec", "--hands", "web*", "--", "true"]).timeout
    call_cli = parse(["call", "--hand", "box", "read_file"]).timeout
    assert exec_cli == fleet_cli == 3600
    assert default(MindClient.exec) == default(MindClient.start) == exec_cli
    assert default(FleetRun.__init__) == fleet_cli
    assert default(MindClient.call) == call_cli == 60
    assert "| 3600 s, as `mind exec --timeout`" in GUIDE.read_text()


def test_the_readme_points_to_the_client_guide():
    readme = (ROOT / "README.md").read_text()
    assert "docs/client.md" in readme


@pytest.mark.slow  # a Mind, two Hands, mkcerts, and a Python process per example
def test_every_example_of_the_client_guide_runs_against_a_real_mind(tmp_path):
    certs = tmp_path / "certs"
    subprocess.run([str(ROOT / "scripts" / "mkcerts"), str(certs)], capture_output=True, check=True, timeout=60)
    tls = ("--tls-cert", str(certs / "mind.crt"), "--tls-key", str(certs / "mind.key"))
    with running(tmp_path, hand=None, mind_args=tls) as cl:
        for name in ("web1", "web2"):
            cl.start_hand(name, "--ca", str(certs / "ca.crt"))
        for name in ("web1", "web2"):
            cl.wait_connected(name)
            assert cl.cli("hand", "label", name, "role=web").returncode == 0
        env = {k: v for k, v in cl.env.items() if k != "MINDHAND_HOME"}
        env.update(
            MINDHAND_URL=cl.url,
            MINDHAND_CREDENTIAL=str(cl.client_credential("alice")),
            MINDHAND_CA=str(certs / "ca.crt"),
        )
        assert cl.url.startswith("wss://")
        work = tmp_path / "work"
        work.mkdir()
        for i, (title, program) in enumerate(programs()):
            path = work / f"example_{i}.py"
            path.write_text(program)
            r = subprocess.run(
                [sys.executable, str(path)], cwd=work, env=env, capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, f"docs/client.md, '{title}':\n{program}\n{r.stdout}\n{r.stderr}"
            assert "Traceback" not in r.stderr, (title, r.stderr)
