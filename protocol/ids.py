"""Ids are generated in one place: short, random, URL- and filename-safe.

`os.urandom` is what `secrets.token_hex` reads; importing `secrets` (and with it `random` and
`base64`) cost `mind exec`'s start 2 ms for nothing."""

import os


def new_id(prefix: str = "") -> str:
    return f"{prefix}{os.urandom(8).hex()}"
