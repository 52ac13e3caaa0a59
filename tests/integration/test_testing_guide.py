"""docs/testing.md's examples are real tests: each ```python block that names a file of
docs/examples/ is that file, byte for byte, and the files pass when pytest runs them as a user would
(a directory of their own, the installed plugin, no conftest of ours)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the examples start Minds and Hands

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "testing.md"
EXAMPLES = ROOT / "docs" / "examples"
BLOCK = re.compile(r"```python\n(# (docs/examples/[\w.]+)\n.*?)```", re.S)


def blocks() -> dict[str, str]:
    return {name: text for text, name in BLOCK.findall(GUIDE.read_text())}


def test_every_example_in_the_guide_is_its_file_and_every_file_is_in_the_guide() -> None:
    shown = blocks()
    files = {f"docs/examples/{p.name}": p.read_text() for p in sorted(EXAMPLES.glob("test_*.py"))}
    assert len(files) >= 3
    assert shown.keys() == files.keys()
    for name, text in files.items():
        assert shown[name] == text, f"the block for {name} in docs/testing.md differs from the file"


def test_the_readme_links_the_guide() -> None:
    assert "docs/testing.md" in (ROOT / "README.md").read_text()


def test_the_examples_pass_as_written(tmp_path: Path) -> None:
    for p in EXAMPLES.glob("test_*.py"):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        timeout=300,
    )
    out = r.stdout.decode(errors="replace")
    assert r.returncode == 0, out + r.stderr.decode(errors="replace")
    assert f"{len(list(EXAMPLES.glob('test_*.py')))} passed" in out, out
