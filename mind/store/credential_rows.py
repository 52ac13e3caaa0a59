"""A credential's row as both engines keep it (`CredentialRow`), and a Hand's labels as stored.

Apart from mind/store/rows.py, whose codecs need the protocol's message models: the local admin
commands (`mind hand add`, `mind client rotate`) read and write credentials only, and start without
importing those models (about 85 ms of every such command's start)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class CredentialRow:
    role: str
    label: str
    created_at: float
    revoked_at: float | None
    generation: int
    last_seen_at: float | None
    scope: str | None = None
    labels: str | None = None
    """A Hand's operator labels as JSON (`{"role": "web"}`), None when it has none."""

    def label_map(self) -> dict[str, str]:
        return json.loads(self.labels) if self.labels else {}


def labels_json(labels: dict[str, str] | None) -> str | None:
    """A Hand's labels as stored: compact JSON sorted by key, None for none."""
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":")) if labels else None
