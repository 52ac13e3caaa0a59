"""The handshake slot table (issue 23, must-hold 4): no lock-out by the silent, no throttle on the
honest. Pure: keys are the shell's connection ids, no clock.

Every connection between its TCP accept and its welcome holds a slot. A slot is *silent* until the
peer has spoken (sent its `hello`), then *speaking* until it is welcomed or gone. The table never
refuses a newcomer, because refusing is what a stranger exploits: 8 connections that never say
`hello`, renewed before their deadline, kept every admin and Hand behind the same address out
(attack 7). Instead a newcomer makes room:

- an address that holds `per_address` silent slots gives up its OLDEST silent one (a peer that
  speaks at once is never the oldest silent slot for long: it says `hello` within a round trip);
- a full table gives up the oldest silent slot of the address holding the most silent slots, and
  only when nobody is silent, the oldest speaking slot of the busiest address (a proof arrives in
  milliseconds; the oldest speaker is the one stalling).

Speaking slots do not count against their address's silent quota, so many honest peers behind one
address (Hands behind a NAT, a reconnect storm, the benchmark's simulator) are never turned away
for sharing it: they speak at once and only the table's total bounds them.
"""

from __future__ import annotations


class HandshakeSlots:
    def __init__(self, total: int, per_address: int) -> None:
        self.total = total
        self.per_address = per_address
        self._addr: dict[int, str] = {}
        self._silent: dict[str, dict[int, None]] = {}
        """Per address, its silent slots, oldest first (dicts keep insertion order)."""
        self._speaking: dict[str, dict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._addr)

    def silent(self, addr: str) -> int:
        return len(self._silent.get(addr, ()))

    def speaking(self, addr: str) -> int:
        return len(self._speaking.get(addr, ()))

    def held(self, addr: str) -> int:
        return self.silent(addr) + self.speaking(addr)

    def admit(self, key: int, addr: str) -> list[int]:
        """Take a slot for `key` from `addr`; the keys evicted to make room (the caller closes them),
        oldest first. Never refuses."""
        evicted: list[int] = []
        own = self._silent.get(addr)
        if own is not None and len(own) >= max(1, min(self.per_address, self.total)):
            evicted.append(self._drop(next(iter(own))))
        while len(self._addr) >= max(1, self.total):
            evicted.append(self._drop(self._victim()))
        self._addr[key] = addr
        self._silent.setdefault(addr, {})[key] = None
        return evicted

    def spoke(self, key: int) -> None:
        """The peer sent its `hello`: no longer silent."""
        addr = self._addr.get(key)
        if addr is None:
            return
        self._remove(self._silent, addr, key)
        self._speaking.setdefault(addr, {})[key] = None

    def done(self, key: int) -> None:
        """Welcomed, refused or gone (twice is harmless)."""
        if key in self._addr:
            self._drop(key)

    def is_silent(self, key: int) -> bool:
        addr = self._addr.get(key)
        return addr is not None and key in self._silent.get(addr, ())

    def _victim(self) -> int:
        table = self._silent if self._silent else self._speaking
        busiest = max(table, key=lambda a: len(table[a]))  # ties: the address seen first
        return next(iter(table[busiest]))

    def _drop(self, key: int) -> int:
        addr = self._addr.pop(key)
        self._remove(self._silent, addr, key)
        self._remove(self._speaking, addr, key)
        return key

    @staticmethod
    def _remove(table: dict[str, dict[int, None]], addr: str, key: int) -> None:
        keys = table.get(addr)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del table[addr]
