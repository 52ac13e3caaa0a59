"""`mind mcp`: every Hand's tools for any AI agent, through the Model Context Protocol (DESIGN §17,
docs/agents.md). An optional room of the package: it needs the official SDK (`pip install
'mindhand[mcp]'`), and nothing outside it imports it.

- results.py: a result shaped for a model (bounded output, the paging marker, `isError`); pure.
- runs.py: the runs this server follows (output kept for paging, a bounded wait with progress).
- tools.py, tasks.py, files.py, fleet.py: the tools, their schemas and descriptions.
- cancels.py: `notifications/cancelled` (a cancel the agent meant) told apart from a closed stream.
- server.py: stdio and streamable HTTP (bearer = a mindhand client credential).
"""
