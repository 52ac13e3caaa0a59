"""The project's own source files parsed once per test session: several layout tests read every
module's syntax tree (imports, audit events, names in docstrings), and parsing ~300 files is most of
their cost, so they share one parse of each file."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def tree(path: Path) -> ast.Module:
    """The syntax tree of `path` (absolute). Tests only read it: never change a shared tree."""
    return ast.parse(path.read_text(), str(path))


def python_files(*rooms: str) -> list[Path]:
    """Every `.py` file under the given top-level rooms, sorted, never inside a virtualenv."""
    return [p for room in rooms for p in sorted((ROOT / room).rglob("*.py")) if ".venv" not in p.parts]
