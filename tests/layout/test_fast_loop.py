"""`scripts/test --fast` is every test that starts no process; the guard in `tests/support/spawnguard.py`
is what keeps that true as tests are added. This test is itself fast, so the guard is armed while it
runs: every way of starting a process must be refused before anything starts, and remembered."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.spawnguard import GUARD, ProcessInFastTest

ROOT = Path(__file__).resolve().parents[2]


def test_a_test_not_marked_slow_cannot_start_a_process() -> None:
    assert GUARD.current is not None and GUARD.current.endswith("test_a_test_not_marked_slow_cannot_start_a_process")
    try:
        with pytest.raises(ProcessInFastTest):
            subprocess.run(["true"], check=True)
        with pytest.raises(ProcessInFastTest):
            os.system("true")
        with pytest.raises(ProcessInFastTest):
            os.posix_spawn("/bin/true", ["true"], {})

        async def via_asyncio() -> None:
            await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

        with pytest.raises(ProcessInFastTest):
            asyncio.run(via_asyncio())
        with pytest.raises(ProcessInFastTest):
            pid = os.fork()
            if pid == 0:  # only if the guard failed: leave at once, never run pytest twice
                os._exit(0)
            os.waitpid(pid, 0)
        assert set(GUARD.spawned) == {"subprocess.Popen", "os.system", "os.posix_spawn", "os.fork"}
        assert "but is not marked slow" in (GUARD.verdict() or "")
    finally:
        GUARD.spawned.clear()  # the refusals were the point: do not fail this test for them


@pytest.mark.slow
def test_a_slow_test_may_start_one() -> None:
    assert GUARD.current is None
    assert subprocess.run(["true"], timeout=30).returncode == 0
    assert GUARD.spawned == []


def test_pytest_refuses_unknown_markers_and_knows_slow() -> None:
    """A misspelt `@pytest.mark.slwo` would silently put a process-starting test in the fast loop."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in options["addopts"].split()
    assert any(m.split(":")[0].strip() == "slow" for m in options["markers"])


def test_property_tests_take_their_examples_from_the_profile() -> None:
    """A count fixed in one test outranks the profile (tests/conftest.py): 300 examples there ran in
    the fast loop as in CI, and a handful of such tests held the loop above its 30 s. Only a test that
    starts processes (tests/integration, which the fast loop never runs) may fix its own, smaller."""
    fixed = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tests").rglob("test_*.py"))
        if "integration" not in p.parts and p != Path(__file__).resolve() and "max_examples=" in p.read_text()
    ]
    assert not fixed, f"these tests fix their example count: {fixed}"
