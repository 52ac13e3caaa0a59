"""docs/design.md §2 is the contract's map of the code: one line per room (and per module that is a room
of its own at a package's root). A map that misses a room, or names a path that has moved, is worse
than none, so this test reads the map's block and compares it with the tree, as
tests/layout/test_map.py does for CONTRIBUTING.md's tables."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "mind", "hand")
ENTRY = re.compile(r"^(\S+)\s*(.*)$")
PATH_IN_TEXT = re.compile(r"(?<![\w./-])((?:protocol|mind|hand)/[\w/]*\w(?:\.py)?/?)")


def the_map() -> dict[str, str]:
    """{path as the map writes it: its description}, from the first code block of §2. A line that
    starts at the margin opens an entry (the path, then its description); an indented line goes on
    with the entry above it."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("\n## 2. Layout") : text.index("\n## 3. ")]
    block = re.search(r"^```\n(.*?)^```", section, re.S | re.M)
    assert block, "docs/design.md §2 has no map block"
    entries: dict[str, str] = {}
    last = None
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            assert last is not None, f"a continuation line before any entry: {line!r}"
            entries[last] += " " + line.strip()
        else:
            m = ENTRY.match(line)
            assert m, line
            last = m.group(1)
            assert last not in entries, f"{last} is in the map twice"
            entries[last] = m.group(2)
    return entries


def rooms() -> dict[str, set[str]]:
    """{a directory of the three packages holding modules: the names of its modules}, without the
    empty or trivial `__init__.py` and `__main__.py`."""
    found: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "__pycache__" in path.parts or path.name in ("__init__.py", "__main__.py"):
                continue
            found.setdefault(path.parent.relative_to(ROOT).as_posix(), set()).add(path.stem)
    return found


def test_every_path_the_map_names_exists() -> None:
    entries = the_map()
    assert len(entries) > 20, "the map's block was not found: did §2 change shape?"
    for path, description in entries.items():
        assert (ROOT / path.rstrip("/")).exists(), f"docs/design.md §2 names {path}, which does not exist"
        for named in PATH_IN_TEXT.findall(description):
            assert (ROOT / named.rstrip("/")).exists(), f"docs/design.md §2 ({path}) names {named}: not in the tree"


def test_every_room_is_named() -> None:
    """A room is named by a line of its own (`mind/core/`). A package's root holds modules that are
    rooms of their own (`mind/main.py`, `hand/cli.py`): each has its line, unless the root itself has
    one (`protocol/`, whose line names the contract's modules). Which module does what, one line
    each, is CONTRIBUTING.md's map (tests/layout/test_map.py)."""
    entries = the_map()
    missing: list[str] = []
    for room, modules in sorted(rooms().items()):
        if room + "/" in entries:
            continue
        if room in PACKAGES:
            missing += [p for p in (f"{room}/{m}.py" for m in sorted(modules)) if p not in entries]
        else:
            missing.append(room + "/")
    assert not missing, f"docs/design.md §2's map misses: {missing}"


def test_the_map_names_what_the_contract_relies_on() -> None:
    """The rooms and modules other sections of the design build on, by name (§15's seal, §16's
    routing, §17's `mind mcp`, the root module both sides of `mind` share)."""
    entries = the_map()
    assert {"mind/mcp/", "mind/commandline.py", "mind/core/"} <= set(entries)
    core = set(re.findall(r"\w+", entries["mind/core/"]))
    assert {"routing", "seal"} <= core
