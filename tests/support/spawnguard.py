"""The fast loop's promise, kept by the interpreter: a test not marked `slow` starts no process.

`scripts/test --fast` runs `-m "not slow"` and must stay under 30 s on a 2-core machine, which holds
only if nothing in it waits on a daemon, a script or a child. Marking by hand drifts, so CPython's
audit hooks (PEP 578) watch every way a process is started (`subprocess`, `asyncio`'s subprocesses,
`os.fork`, `os.posix_spawn`, `os.exec*`, `os.spawn*`, `os.system`): while a test that is not marked
`slow` runs, such an event is refused before the fork, and remembered so the test fails even if the
code under test swallowed the refusal. `tests/conftest.py` installs the hook and sets `current`.
"""

from __future__ import annotations

import sys

SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system"}
)


class ProcessInFastTest(RuntimeError):
    """Raised by the audit hook instead of starting the process."""


class Guard:
    def __init__(self) -> None:
        self.current: str | None = None
        """The node id of the running test when it is not marked slow, else None (no guard)."""
        self.spawned: list[str] = []
        """The events refused during the current test."""

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if self.current is None or event not in SPAWN_EVENTS:
            return
        self.spawned.append(event)
        raise ProcessInFastTest(f"{self.current} starts a process ({event}): mark it slow (pytest.mark.slow)")

    def verdict(self) -> str | None:
        """Why the current test must fail, if it tried to start a process."""
        if not self.spawned:
            return None
        return (
            f"this test tried to start a process ({', '.join(sorted(set(self.spawned)))}) but is not marked "
            "slow: add `pytestmark = pytest.mark.slow` to its module, or `@pytest.mark.slow` to it"
        )


GUARD = Guard()
_installed = False


def install() -> Guard:
    """Add the audit hook once (hooks cannot be removed; the guard is inert while `current` is None)."""
    global _installed
    if not _installed:
        sys.addaudithook(GUARD.audit)
        _installed = True
    return GUARD
