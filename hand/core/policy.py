"""Which tools this machine runs (DESIGN §3: the Hand's policy is final).

The Mind's request is an input, never a verdict: a denied tool is refused before anything runs,
whatever the Mind says. Deny wins over allow, so an operator can narrow a broad allow list with one
flag; no allow list means every known tool.

Terminal runs (`mind exec -t`, `mind shell`: the command on a pseudo-terminal, `hand.system.pty`)
have a switch of their own, `deny_pty`, rather than a pseudo-tool `pty` in the tool lists: a
terminal is a way to run `exec` or `shell`, not a tool. `KNOWN_TOOLS` is the tool table a request
names (an unknown name is refused as `unknown_tool`), and a name in it that no request can call
would make the lists mean two things. So a terminal run needs its tool allowed AND terminals not
denied. The default allows them: a terminal adds no capability a command lacks (any command can
allocate one itself, `script -qc bash /dev/null`), so the switch is about whether this machine is
for interactive use, not a security boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

KNOWN_TOOLS: frozenset[str] = frozenset(
    {
        "exec",
        "shell",
        "read_file",
        "write_file",
        "list_dir",
        "put_file",
        "get_file",
        "stat_file",
        "list_tree",
        "forward",
    }
)
"""`put_file` is every write of `mind cp` (files, and a tree's directories and links); `get_file`
every read of a file's bytes; `stat_file` and `list_tree` only look (like `list_dir`); `forward` is
one connection of `mind forward` (a port reached through the Hand)."""
PTY_TOOLS: frozenset[str] = frozenset({"exec", "shell"})
"""The tools a terminal can be asked for: the ones that start a command."""


class ToolPolicy(Protocol):
    """The one question the run table and the task manager ask. A fixed `Policy` answers it, and so
    does the agent's `LivePolicy`, whose answer changes when a SIGHUP reload swaps the policy."""

    def allowed(self, tool: str) -> bool: ...

    def allows_pty(self, tool: str) -> bool: ...
    def why_no_pty(self, tool: str) -> str | None: ...


@dataclass(frozen=True)
class Policy:
    allow: frozenset[str] | None = None
    """None: every tool not denied. An empty set: nothing at all."""
    deny: frozenset[str] = frozenset()
    pty: bool = True
    """Terminal runs allowed (`deny_pty` turns them off)."""

    def allowed(self, tool: str) -> bool:
        if tool in self.deny:
            return False
        return self.allow is None or tool in self.allow

    def allows_pty(self, tool: str) -> bool:
        return pty_refusal(self, tool) is None

    def why_no_pty(self, tool: str) -> str | None:
        return pty_refusal(self, tool)


def pty_refusal(policy: Policy, tool: str) -> str | None:
    """Why a terminal run of `tool` is refused here, or None when it may start: the tool must be one
    that starts a command, allowed, and terminals must not be denied. The sentence is for the user."""
    if tool not in PTY_TOOLS:
        return f"tool {tool!r} does not run a command, so it cannot have a terminal"
    if not policy.allowed(tool):
        return f"tool {tool!r} is denied by this hand's policy"
    if not policy.pty:
        return "terminal runs are denied by this hand's policy (deny_pty)"
    return None


def parse_tool_list(text: str) -> frozenset[str]:
    """`"exec, shell"` -> {"exec", "shell"}; unknown names are a configuration error (a typo in a
    deny list must not silently allow the tool the operator meant to deny)."""
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(names - KNOWN_TOOLS)
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known tools: {', '.join(sorted(KNOWN_TOOLS))}")
    return names


class LivePolicy:
    """The policy in force, shared by the run table and the task manager. A SIGHUP reload swaps
    what it holds: runs and tasks already admitted keep going (they were allowed when they asked);
    every later request meets the new policy."""

    def __init__(self, policy: Policy) -> None:
        self.current = policy

    def allowed(self, tool: str) -> bool:
        return self.current.allowed(tool)

    def allows_pty(self, tool: str) -> bool:
        return self.current.allows_pty(tool)

    def why_no_pty(self, tool: str) -> str | None:
        return self.current.why_no_pty(tool)
