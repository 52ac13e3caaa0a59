"""What the simulation still models by hand, and the fingerprints that keep the models honest.

The rules themselves are shared: the simulation imports the cores (`hand.core.tasks`,
`mind.core.admission`, `mind.core.registry`, `mind.core.snapshots`, `hand.core.backoff`, ...). What
it cannot import is the asyncio glue between them (the awaits, the locks, the order in which a
shell performs decisions), because its processes are generators on a virtual clock. Each shipped
class (or module-level function) below has a model in `tests/sim`; `MIRRORS.json` holds a fingerprint of every method of the
shipped class (its AST, without docstrings, so formatting and prose do not count).

`tests/sim/test_mirrors.py` fails when a shipped method changed, appeared or went away since its
model was last checked against it, naming the method and the model to look at. Update the model
if the behaviour changed, then record the new fingerprints:

    .venv/bin/python tests/sim/mirrors.py --update

The Mind's rooms that the simulation does not model are not mirrored: the door (handshakes: the
simulated links are authenticated by construction), the views and the HTTP answers (they only
read). The task-start decisions are not mirrored either: they are a core (`mind.core.taskstart`)
that the simulation drives itself, and neither are the task-snapshot store (the simulation drives
the real `SnapshotStore` on an in-memory SQLite database) nor the Hand's restart recovery (its
rules are the core's `hand.core.tasks.orphaned` and `recovered`).

(This is the test that would have failed when the Hand's group commit changed `hand/aio/tasks.py` by
342 lines and no simulation file changed.)
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECORD = HERE / "MIRRORS.json"

MIRRORS: dict[str, str] = {
    # shipped class (module:Class)         -> its model in tests/sim (module:Class)
    "mind.daemon.nodes:NodeShell": "sim.nodes_world:SimNode",  # the nodes variant
    "hand.aio.tasks:TaskManager": "sim.hand_tasks:HandTasks",
    "hand.aio.taskstarts:TaskStarts": "sim.hand_tasks:HandTasks",
    "hand.aio.taskrun:LiveTask": "sim.hand_tasks:HandTasks",
    "hand.aio.groupcommit:GroupCommit": "sim.hand_tasks:GroupCommit",
    "hand.system.tasklogs:LogSink": "sim.hand_tasks:LogSink",
    "hand.aio.runs:RunTable": "sim.continuity_hand:KeptRuns",  # HandRuns, and what a window adds
    "hand.aio.activerun:ActiveRun": "sim.hand_runs:HandRuns",
    "hand.aio.agent:Agent": "sim.continuity_hand:ContinuityHand",  # HandProcess, and what a window adds
    "hand.system.taskdb:TaskStore": "sim.hand_store:HandTaskStore",
    "hand.system.process:ProcessRun": "sim.jobs:VProcess",
    "hand.system.process:Killable": "sim.jobs:VProcess",
    "mind.daemon.server:Mind": "sim.mind_shell:SimMind",
    "mind.daemon.connections:Connections": "sim.mind_shell:SimMind",
    "mind.daemon.dispatch:Dispatch": "sim.mind_shell:SimMind",
    "mind.daemon.taskservice:TaskService": "sim.mind_shell:SimMind",
}


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    for path in (str(HERE.parents[1]), str(HERE.parent)):  # the real packages first, then `sim.*`
        if path not in sys.path:
            sys.path.append(path)
    return getattr(importlib.import_module(module), name)


def _strip_docstrings(node: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            n.body = body[1:] or [ast.Pass()]
    return node


def fingerprints(cls: Any) -> dict[str, str]:
    """One hash per method (and one for the class's own statements: attributes, annotations); a
    module-level function (a shell's glue that is not a class) is one hash."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    klass = tree.body[0]
    if isinstance(klass, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {"<function>": _hash(klass)}
    assert isinstance(klass, ast.ClassDef)
    out: dict[str, str] = {}
    rest: list[ast.stmt] = []
    for stmt in klass.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[stmt.name] = _hash(stmt)
        elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            rest.append(stmt)
    out["<class body>"] = _hash(ast.Module(body=rest, type_ignores=[]))
    return out


def _hash(node: ast.AST) -> str:
    return hashlib.sha256(ast.dump(_strip_docstrings(node)).encode()).hexdigest()[:16]


def current() -> dict[str, dict[str, object]]:
    return {shipped: {"model": model, "methods": fingerprints(_load(shipped))} for shipped, model in MIRRORS.items()}


def recorded() -> dict[str, dict[str, object]]:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def drift() -> list[str]:
    """One line per shipped method whose fingerprint differs from the record."""
    now, then = current(), recorded()
    lines: list[str] = []
    for shipped, entry in now.items():
        model = entry["model"]
        old = then.get(shipped, {}).get("methods", {})
        assert isinstance(old, dict)
        new = entry["methods"]
        assert isinstance(new, dict)
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                what = "appeared" if name not in old else "went away" if name not in new else "changed"
                lines.append(f"{shipped}.{name} {what}: check its model in {model} (tests/sim)")
    return lines


def model_lines() -> int:
    """Lines of the hand-kept models (the classes named above), for the closing note."""
    seen = set(MIRRORS.values())
    return sum(len(inspect.getsource(_load(ref)).splitlines()) for ref in seen)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))  # run as a script: the checkout's packages, not tests/protocol
    if "--update" in sys.argv:
        RECORD.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
        print(f"recorded {sum(len(e['methods']) for e in current().values())} fingerprints in {RECORD}")
    else:
        lines = drift()
        for line in lines or ["no drift"]:
            print(line)
        print(f"{model_lines()} lines of hand-kept models")
        if lines and "--check" in sys.argv:
            print("update the models if behaviour changed, then: python tests/sim/mirrors.py --update", file=sys.stderr)
            raise SystemExit(1)
