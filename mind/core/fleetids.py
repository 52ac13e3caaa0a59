"""Fleet ids are the Mind's (issue 23, attack 11), pure: it mints each one for a client
(`fleet_open`) and remembers whose it is, so a run tagged with a fleet id (`Exec.fleet`) is a member
only if its owner opened that fleet. Before, a client could tag its own failing runs with another
client's fleet id and admins read "members 5: 3 failed" in that fleet.

The table is bounded: the oldest fleets are forgotten first, and a forgotten id is refused like an
unknown one (its runs stay in history; only new members are refused)."""

from __future__ import annotations

MAX_FLEETS = 100_000


class FleetOwners:
    def __init__(self, max_fleets: int = MAX_FLEETS) -> None:
        self._owner: dict[str, str] = {}
        self._max = max_fleets

    def __len__(self) -> int:
        return len(self._owner)

    def opened(self, fleet: str, owner: str) -> None:
        """`fleet` (a fresh id from `protocol.ids`) now belongs to `owner`."""
        self._owner[fleet] = owner
        while len(self._owner) > self._max:
            self._owner.pop(next(iter(self._owner)))

    def problem(self, fleet: str, owner: str) -> str | None:
        """Why a run of `owner` may not join `fleet` (the sentence for the client), or None. An id
        of another client reads like one never minted: ids do not leak across clients."""
        if self._owner.get(fleet) == owner:
            return None
        return f"fleet {fleet} was not opened by this client (ask the mind for a fleet id: fleet_open)"
