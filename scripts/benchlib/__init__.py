"""The benchmark suite behind `scripts/bench` (see `scripts/bench_suite.py`).

- `core`: statistics, the result table, child processes (all killed by PID), RSS, machine facts.
- `relay`: the reference: a raw WebSocket relay (server and answering peer in their own processes)
  and the client side of it; also a bare WebSocket server for the idle-connection RSS reference.
- `handsim`: a light Hand simulator (N WebSocket Hands in one process, real handshake; several Mind
  URLs gone round as a real Hand does, and a reconnection when a node dies).
- `sshd`: our own sshd on a free loopback port, for the ssh references (optional).
- `reconcile`: seeding a Hand's task database and probing the Mind's responsiveness.
- `nodes`: the Many Minds figure (two `mind serve --database` nodes on a PostgreSQL of the run's own).
- `figures`: the figures themselves (`fleet`, `cp`, `streams`, `nodes` and `flood` register more on import;
  `flood` is also the flooding client, run as its own process).

Importers put the repository root first on sys.path and `tests/` last (tests/protocol would shadow
the real package otherwise); `scripts/bench_suite.py` does that before importing this package.
"""
