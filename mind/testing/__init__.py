"""mindhand's testing toolkit, shipped for users' own integration tests (docs/testing.md):
`cluster` (real Mind and Hand processes), `faultproxy` (the proxy and `mindhand-faultproxy`),
`plugin` (the pytest fixtures), `vocabulary` (the fault names, shared with the simulation)."""
