"""The house's arrows (docs/design.md §2), read from the source with `ast`, so a wrong import fails
here before a reviewer has to notice it. An import counts wherever it is written (inside a function
too), and a fence holds for everything a module loads, not only for what it names: a chain of
imports through a module of the package root (`mind/config.py`, say) crosses the fence as surely
as a direct import.

- The pure rooms (`protocol/` itself, `mind/core/`, `hand/core/`, the client's session core
  `mind/client/session.py` and the CLI's escape state machine `mind/cli/escapes.py`) import no
  asyncio, sqlite3, socket, subprocess, threading, time or select, and hold no `async def`: their
  rules take the time as an argument, which is what lets the simulation and the race tests drive them.
- `mind` and `hand` never import each other; `protocol` imports neither.
- `protocol/` (pure) never imports `protocol/io/` (plumbing).
- The client side, the rooms that reach the Mind through the protocol only, reaches no daemon or
  store module through any chain of imports: the client library, the CLI, the MCP server
  (`mind/mcp/`, a client of the Mind) and the testing toolkit (`mind/testing/`, an I/O shell room:
  it starts the daemons as processes, `mind serve` and `hand run`, never imports them); the
  toolkit's fault vocabulary (`mind/testing/vocabulary.py`) is pure, because the simulation
  imports it. So `mind exec` never pays for the daemon's imports, and a client installed without
  the daemon's dependencies works.
- The Mind's side (`mind/daemon/`, `mind/store/`) reaches no CLI module either: what both sides
  of the `mind` program share sits below both (`mind/commandline.py`, `mind/config.py`), and only
  the entry point `mind/main.py` knows both.
- No two rooms reach each other (the CLI starts the MCP server, so the server may not use the
  CLI), and there is no import cycle anywhere.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
from support.sources import tree as parsed

pytestmark = pytest.mark.xdist_group("sources")  # `scripts/test --fast`: one worker parses the sources

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
    tree = parsed(path)
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
CLIENT_ROOMS = ("mind.client", "mind.cli", "mind.mcp", "mind.testing")
"""The rooms on the client's side of the wire: they reach the Mind through the protocol only."""
MIND_ROOMS = ("mind.daemon", "mind.store")
"""The Mind's own side: the daemon and the stores it opens."""


def is_pure(name: str) -> bool:
    if any(in_room(name, r) for r in PURE_ROOMS):
        return True
    return in_room(name, "protocol") and not in_room(name, "protocol.io")


@pytest.mark.parametrize("name", [n for n in MODULES if is_pure(n)])
def test_pure_rooms_do_no_io(name: str) -> None:
    bad = {n for n in imports_of(name) if n.split(".")[0] in IO_MODULES}
    assert not bad, f"{name} is in a pure room but imports {sorted(bad)}"
    tree = parsed(MODULES[name])
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


@cache
def graph() -> dict[str, set[str]]:
    """Each module and the modules of ours it imports, anywhere in it. Built when a test first asks,
    not at import: every worker of `scripts/test --fast` collects this module, one runs it."""
    return {n: {m for m in ours(imports_of(n)) if m in MODULES and m != n} for n in MODULES}


def chain_to(start: str, rooms: tuple[str, ...]) -> list[str] | None:
    """The shortest chain of imports from `start` into one of `rooms` (`start` first), or None when
    nothing `start` loads, however indirectly, is in them."""
    came_from = {start: start}
    queue = [start]
    for n in queue:
        for d in sorted(graph()[n]):
            if d in came_from:
                continue
            came_from[d] = n
            if any(in_room(d, r) for r in rooms):
                chain = [d]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return chain[::-1]
            queue.append(d)
    return None


def in_any(name: str, rooms: tuple[str, ...]) -> bool:
    return any(in_room(name, r) for r in rooms)


@pytest.mark.parametrize("name", [n for n in MODULES if in_any(n, CLIENT_ROOMS)])
def test_client_side_reaches_no_daemon_or_store(name: str) -> None:
    chain = chain_to(name, MIND_ROOMS)
    assert chain is None, f"{name} (client side) reaches the Mind's side: {' -> '.join(chain)}"


@pytest.mark.parametrize("name", [n for n in MODULES if in_any(n, MIND_ROOMS)])
def test_daemon_and_store_reach_no_cli(name: str) -> None:
    chain = chain_to(name, ("mind.cli",))
    assert chain is None, f"{name} (the Mind's side) reaches the CLI: {' -> '.join(chain)}"


def rooms() -> list[str]:
    """Every room: a package directly under one of ours (`mind.cli`, `hand.aio`, `protocol.io`)."""
    return sorted({n for n, p in MODULES.items() if p.name == "__init__.py" and n.count(".") == 1})


def room_chain(a: str, b: str) -> list[str] | None:
    """A chain of imports from some module of room `a` into room `b`, or None."""
    for n in sorted(MODULES):
        if in_room(n, a) and (chain := chain_to(n, (b,))):
            return chain
    return None


@pytest.mark.parametrize("a,b", [(a, b) for i, a in enumerate(rooms()) for b in rooms()[i + 1 :]])
def test_no_two_rooms_reach_each_other(a: str, b: str) -> None:
    """A loop between rooms (`mind/cli` starts the MCP server, which once found the Mind through
    the CLI's connection options) is a cycle waiting for one more import: one room must lie below."""
    there, back = room_chain(a, b), room_chain(b, a)
    assert there is None or back is None, f"{a} and {b} reach each other: {' -> '.join(there)} and {' -> '.join(back)}"


def test_no_import_cycles() -> None:
    # a package's own __init__ is imported by every submodule; an edge into it is not a cycle
    edges = {n: {d for d in deps if not in_room(n, d)} for n, deps in graph().items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(edges[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_wrong_arrow(tmp_path: Path) -> None:
    """The rules above would pass vacuously if `imports_of` saw nothing: it must see the arrows
    we know are there."""
    assert "protocol.messages" in imports_of("mind.core.registry")
    assert "asyncio" in imports_of("mind.daemon.server")
    assert any(in_room(n, "hand.system") for n in imports_of("hand.aio.agent"))
