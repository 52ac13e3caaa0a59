"""Which tools this machine runs (DESIGN §3: the Hand's policy is final).

The Mind's request is an input, never a verdict: a denied tool is refused before anything runs,
whatever the Mind says. Deny wins over allow, so an operator can narrow a broad allow list with one
flag; no allow list means every known tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

KNOWN_TOOLS: frozenset[str] = frozenset({"exec", "shell", "read_file", "write_file", "list_dir"})


class ToolPolicy(Protocol):
    """The one question the run table and the task manager ask. A fixed `Policy` answers it, and so
    does the agent's `LivePolicy`, whose answer changes when a SIGHUP reload swaps the policy."""

    def allowed(self, tool: str) -> bool: ...


@dataclass(frozen=True)
class Policy:
    allow: frozenset[str] | None = None
    """None: every tool not denied. An empty set: nothing at all."""
    deny: frozenset[str] = frozenset()

    def allowed(self, tool: str) -> bool:
        if tool in self.deny:
            return False
        return self.allow is None or tool in self.allow


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
