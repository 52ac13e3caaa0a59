"""CONTRIBUTING.md is the newcomer's map: one line per module, by room. A map that misses a module, or
names one that has moved, is worse than none, so this test reads the map and compares it with the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "mind", "hand")
SECTION = re.compile(r"^### `([a-z/]+/)`")
ROW = re.compile(r"^\| (`[^|]+`) \|")


def mapped() -> set[str]:
    """Every module path named in the first column of a table under a `### \\`pkg/\\`` heading."""
    base, named = None, set()
    for line in (ROOT / "CONTRIBUTING.md").read_text().splitlines():
        if m := SECTION.match(line):
            base = m.group(1) if m.group(1).split("/")[0] in PACKAGES else None
        elif line.startswith("### "):
            base = None
        elif base and (m := ROW.match(line)):
            named |= {base + name for name in re.findall(r"`([\w/]+\.py)`", m.group(1))}
    return named


def modules() -> set[str]:
    """Every module of the three packages, but the empty or trivial `__init__.py` and `__main__.py`."""
    found = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if path.name in ("__init__.py", "__main__.py") and rel != "protocol/__init__.py":
                continue
            found.add(rel)
    return found


def test_the_map_names_every_module_and_only_modules_that_exist() -> None:
    named, present = mapped(), modules()
    assert len(named) > 40, "the map's tables were not found: did the headings change?"
    assert not present - named, f"modules missing from CONTRIBUTING.md: {sorted(present - named)}"
    assert not named - present - {"protocol/__init__.py"}, (
        f"CONTRIBUTING.md names modules that do not exist: {sorted(named - present)}"
    )
