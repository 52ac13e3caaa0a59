"""Ids are generated in one place: short, random, URL- and filename-safe."""

import secrets


def new_id(prefix: str = "") -> str:
    return f"{prefix}{secrets.token_hex(8)}"
