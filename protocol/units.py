"""Durations and sizes as people type them, parsed one way for every command and config key.

`90s`, `30m`, `2h`, `7d`, `1.5h` or plain seconds; `65536`, `512K`, `64M`, `1G` (binary multiples,
`KiB`/`MB` spellings accepted) or plain bytes. A size is a whole number: `1.5M` is refused rather
than rounded, because a limit that silently differs from what was typed is worse than an error.
Before this module the Hand's config and the `mind` CLI had a parser each, and they disagreed.
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_BYTES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_duration(text: str) -> float:
    """Seconds (ValueError with an example for anything else; 0 is allowed, negatives are not)."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90s, 30m, 2h, 7d)")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def parse_size(text: str) -> int:
    """Bytes (ValueError with an example for anything else)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (use e.g. 65536, 512K, 64M, 1G)")
    return int(m.group(1)) * _BYTES[m.group(2).lower()]


def positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"duration {text!r} must be more than 0")
    return value


def positive_size(text: str) -> int:
    value = parse_size(text)
    if value <= 0:
        raise ValueError(f"size {text!r} must be more than 0")
    return value
