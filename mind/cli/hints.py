"""What the user probably meant: close names after a typo (`did you mean 'web1'?`), and `--shell`
when a one-word command is shell syntax. Hints are best effort: a hint never turns into an error."""

from __future__ import annotations

from typing import Any

SHELL_SYNTAX = frozenset("|&;<>()$`*?[]{}~=\"' \t\n")
"""Characters that mean something to a shell (or split words) but are plain bytes in an argv."""


def close_names(name: str, names: Any) -> list[str]:
    """Known names close to a mistyped one, as a mistyped config key gets (`protocol.io.settings`):
    difflib, the three closest."""
    import difflib

    return difflib.get_close_matches(name, sorted(set(names) - {name}), n=3, cutoff=0.6)


def did_you_mean(names: list[str]) -> str:
    return "did you mean " + " or ".join(repr(n) for n in names) + "?"


async def hand_suggestions(client: Any, name: str) -> list[str]:
    """For an `unknown_hand` refusal: close names among the Hands this client may see. The Mind lists
    only the Hands within the client's scope, so a hint never names one outside it (issue 14). Best
    effort: a failing list gives no hint, never another error."""
    from mind.errors import ClientError

    try:
        return close_names(name, [h.name for h in await client.hands()])
    except ClientError:
        return []


def shell_hint(tool_args: dict[str, Any], exit_code: int | None) -> str | None:
    """`mind exec --hand h -- 'a | b'` runs the program named `a | b`, which does not exist (127), as
    ssh would not: ssh hands its words to a shell. When a one-word argv that could not start (127/126)
    holds shell syntax, the sentence to add under the OS's message."""
    argv = tool_args.get("argv")
    if exit_code not in (126, 127) or not isinstance(argv, list) or len(argv) != 1:
        return None
    word = argv[0]
    if not isinstance(word, str) or not SHELL_SYNTAX.intersection(word):
        return None
    return f"{word!r} is one word with shell syntax in it; to run it through /bin/sh -c, use --shell {word!r}"
