"""The house's arrows (docs/design.md §2), read from the source with `ast`, so a wrong import fails
here before a reviewer has to notice it.

- The pure rooms (`protocol/` itself, `mind/core/`, `hand/core/`, the client's session core
  `mind/client/session.py` and the CLI's escape state machine `mind/cli/escapes.py`) import no
  asyncio, sqlite3, socket, subprocess, threading, time or select, and hold no `async def`: their
  rules take the time as an argument, which is what lets the simulation and the race tests drive them.
- `mind` and `hand` never import each other; `protocol` imports neither.
- `protocol/` (pure) never imports `protocol/io/` (plumbing).
- The client library, the CLI and the testing toolkit (`mind/testing/`, an I/O shell room: it starts
  the daemons as processes, `mind serve` and `hand run`, never imports them) import no daemon module;
  its fault vocabulary (`mind/testing/vocabulary.py`) is pure, because the simulation imports it.
- There is no import cycle anywhere, counting imports inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "mind", "hand")
IO_MODULES = {"asyncio", "sqlite3", "socket", "subprocess", "threading", "time", "select", "selectors"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = all_modules()


def imports_of(name: str, *, top_level_only: bool = False) -> set[str]:
    """Every module `name` imports (absolute names, resolved against our own modules)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            for a in node.names:  # `from mind import home` imports the module mind.home
                if f"{mod}.{a.name}" in MODULES:
                    found.add(f"{mod}.{a.name}")
    return found


def ours(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in PACKAGES}


def in_room(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


PURE_ROOMS = ("mind.core", "hand.core", "mind.client.session", "mind.cli.escapes", "mind.testing.vocabulary")
CLIENT_ROOMS = ("mind.client", "mind.cli", "mind.testing")
"""The rooms on the client's side of the wire: they reach the Mind through the protocol only."""


def is_pure(name: str) -> bool:
    if any(in_room(name, r) for r in PURE_ROOMS):
        return True
    return in_room(name, "protocol") and not in_room(name, "protocol.io")


@pytest.mark.parametrize("name", [n for n in MODULES if is_pure(n)])
def test_pure_rooms_do_no_io(name: str) -> None:
    bad = {n for n in imports_of(name) if n.split(".")[0] in IO_MODULES}
    assert not bad, f"{name} is in a pure room but imports {sorted(bad)}"
    tree = ast.parse(MODULES[name].read_text())
    asyncs = [n.name for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)]
    assert not asyncs, f"{name} is in a pure room but defines async {asyncs}"
    plumbing = {n for n in ours(imports_of(name)) if in_room(n, "protocol.io")}
    assert not plumbing, f"{name} is pure but imports the plumbing {sorted(plumbing)}"


@pytest.mark.parametrize("name", list(MODULES))
def test_packages_import_one_way(name: str) -> None:
    top = name.split(".")[0]
    others = {n for n in ours(imports_of(name)) if n.split(".")[0] != top}
    allowed = {"protocol"} if top != "protocol" else set()
    bad = {n for n in others if n.split(".")[0] not in allowed}
    assert not bad, f"{name} imports across the house: {sorted(bad)}"


@pytest.mark.parametrize("name", [n for n in MODULES if any(in_room(n, r) for r in CLIENT_ROOMS)])
def test_client_and_cli_import_no_daemon(name: str) -> None:
    bad = {n for n in ours(imports_of(name)) if in_room(n, "mind.daemon") or in_room(n, "mind.store")}
    assert not bad, f"{name} (client side) imports daemon modules {sorted(bad)}"


def test_no_import_cycles() -> None:
    graph = {n: {m for m in ours(imports_of(n)) if m in MODULES and m != n} for n in MODULES}
    # a package's own __init__ is imported by every submodule; an edge into it is not a cycle
    for n, deps in graph.items():
        graph[n] = {d for d in deps if not in_room(n, d)}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_wrong_arrow(tmp_path: Path) -> None:
    """The rules above would pass vacuously if `imports_of` saw nothing: it must see the arrows
    we know are there."""
    assert "protocol.messages" in imports_of("mind.core.registry")
    assert "asyncio" in imports_of("mind.daemon.server")
    assert any(in_room(n, "hand.system") for n in imports_of("hand.aio.agent"))
