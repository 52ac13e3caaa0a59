"""Docstrings, comments of the map and the contributor's guide name modules by path
(`hand/aio/tasks.py`) or by dotted name (`mind.core.registry.RunRegistry`). When a module moves and
the prose does not, a reader follows a name into nothing: this test reads every docstring of the
three packages, the tests and the scripts, and CONTRIBUTING.md, and fails on a name that does not
resolve to a file, a package or a top-level name of a module."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from support.sources import tree

pytestmark = pytest.mark.xdist_group("sources")  # `scripts/test --fast`: one worker parses the sources

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "mind", "hand")
SOURCES = (*PACKAGES, "tests", "scripts")
PATH = re.compile(r"(?<![\w./-])((?:protocol|mind|hand|tests|scripts)/[\w/]*\w(?:\.py)?)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:protocol|mind|hand)(?:\.[A-Za-z_]\w*)+)")
# `mind.toml`, `hand.service`, `mind.url` are files a reader sees, not modules.
NOT_MODULES = {
    "toml",
    "url",
    "crt",
    "key",
    "cred",
    "service",
    "log",
    "db",
    "sqlite",
    "json",
    "pem",
    "sock",
    "pid",
    "md",
}
NOT_MODULES |= {"internal", "example", "com", "org", "net", "local"}  # `mind.example.internal`: a host
COMPONENT = re.compile(r"""get_logger\(component=["']([\w.]+)["']""")


@cache
def log_components() -> frozenset[str]:
    """`info,mind.tasks=debug`: log levels are set per component, and a component is the name a
    logger was given (`structlog.get_logger(component=...)`), which need not be a module's."""
    found: set[str] = set()
    for room in PACKAGES:
        for path in (ROOT / room).rglob("*.py"):
            found |= set(COMPONENT.findall(path.read_text()))
    return frozenset(found)


@cache
def top_level_names(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in tree(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def path_exists(name: str) -> bool:
    p = ROOT / name
    return p.exists() or p.with_suffix(".py").exists() or (ROOT / (name + ".py")).exists()


@cache
def fixture_attributes() -> frozenset[str]:
    """`hand.proxy`, `mind.url`: the toolkit's fixtures are objects named `hand` and `mind`, and the
    guides name their attributes. Those are the names the classes in `mind/testing/cluster.py` define."""
    names: set[str] = set()
    for cls in tree(ROOT / "mind/testing/cluster.py").body:
        if isinstance(cls, ast.ClassDef) and cls.name in ("Proc", "Mind", "Hand"):
            for node in ast.walk(cls):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                    names.add(node.attr)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
    return frozenset(names)


def dotted_exists(name: str) -> bool:
    parts = name.split(".")
    if parts[-1] in NOT_MODULES or name in log_components():
        return True
    if len(parts) == 2 and parts[1] in fixture_attributes():
        return True
    here = ROOT / parts[0]
    for i, part in enumerate(parts[1:], start=1):
        if (here / part).is_dir():
            here = here / part
        elif (here / f"{part}.py").is_file():
            rest = parts[i + 1 :]
            return not rest or rest[0] in top_level_names(here / f"{part}.py")
        elif (here / "__init__.py").is_file() and part in top_level_names(here / "__init__.py"):
            return True
        else:
            return False
    return True


def docstrings(path: Path) -> list[str]:
    found = []
    for node in ast.walk(tree(path)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if doc := ast.get_docstring(node, clean=False):
                found.append(doc)
    return found


def unresolved(text: str) -> set[str]:
    bad = {m for m in PATH.findall(text) if not path_exists(m)}
    return bad | {m for m in DOTTED.findall(text) if not dotted_exists(m)}


def texts() -> list[tuple[str, str]]:
    out = [("CONTRIBUTING.md", (ROOT / "CONTRIBUTING.md").read_text())]
    for room in SOURCES:
        for path in sorted((ROOT / room).rglob("*.py")):
            if ".venv" in path.parts or not unresolved(path.read_text()):
                continue  # no name in the whole file fails, so none in its docstrings: no parse needed
            rel = path.relative_to(ROOT).as_posix()
            out += [(rel, doc) for doc in docstrings(path)]
    return out


def test_the_resolver_tells_a_real_name_from_a_moved_one() -> None:
    assert unresolved("see `mind/core/registry.py` and mind.core.registry.RunRegistry, mind.toml") == set()
    assert unresolved("`mind/registry.py`, mind.daemon.nowhere, mind.core.registry.NoSuchThing") == {
        "mind/registry.py",
        "mind.daemon.nowhere",
        "mind.core.registry.NoSuchThing",
    }


def test_no_docstring_or_guide_names_a_module_that_does_not_exist() -> None:
    bad = sorted(f"{where}: {name}" for where, text in texts() for name in unresolved(text))
    assert not bad, "names of modules that do not exist:\n" + "\n".join(bad)
