"""Ids are generated in one place: short, random, URL- and filename-safe.

`os.urandom` is what `secrets.token_hex` reads; importing `secrets` (and with it `random` and
`base64`) cost `mind exec`'s start 2 ms for nothing."""

import os


def new_id(prefix: str = "") -> str:
    return f"{prefix}{os.urandom(8).hex()}"


def named_run(prefix: str, n: int) -> str:
    """The `n`th run id a client names on a connection whose `welcome` gave it `prefix` (DESIGN §4,
    "Named runs"): the client knows its run's id before the Mind answers, so a call needs no
    `admitted` frame to learn it."""
    return f"{prefix}.{n}"


def run_number(prefix: str, run_id: str) -> int | None:
    """`n` if `run_id` is `named_run(prefix, n)` with `n >= 1` written as `named_run` writes it;
    None for any other id (another connection's prefix, a made-up one, `n` padded or signed)."""
    head, dot, tail = run_id.rpartition(".")
    if head != prefix or not dot or not tail.isdigit() or not tail.isascii() or tail[0] == "0" or len(tail) > 18:
        return None
    return int(tail)
