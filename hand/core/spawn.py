"""How a command that could not start ends: as a shell (and so ssh) reports it.

`sh -c no-such-program` exits 127 and `sh -c ./not-executable` exits 126, each with the system's
own message; scripts test for these codes (`command -v`, retry loops, CI steps), so a run whose
program could not be executed ends `failed` with the same exit code and the OS's message in its
`error`, never a bare 1. Any other reason it could not start (the working directory, the sandbox,
the user switch) is not the program's exit status, and keeps no exit code.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

EXIT_NOT_FOUND = 127
"""The program does not exist (`ENOENT`), on `PATH` or at the path given."""
EXIT_NOT_EXECUTABLE = 126
"""The program exists but cannot be executed: not executable, a directory, not a binary the kernel
runs, ... (any other reason `execve` fails, as bash decides)."""


@dataclass(frozen=True)
class SpawnFailure:
    exit_code: int | None
    reason: str
    error: str


def spawn_failure(exc: OSError, program: str) -> SpawnFailure:
    """The end of a run (or task) whose `program` failed to start with `exc`. Only a failure of
    `execve` itself names the program (`exc.filename`, as `subprocess` reports it); one in the
    child before it (changing directory, user, limits) names another file or none."""
    message = exc.strerror or str(exc)
    error = f"cannot start {program}: {message}"
    if exc.errno is None or exc.filename != program:
        return SpawnFailure(None, "tool failed", error)
    code = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_NOT_EXECUTABLE
    what = "command not found" if code == EXIT_NOT_FOUND else "command not executable"
    return SpawnFailure(code, f"{what} (exit status {code})", error)
