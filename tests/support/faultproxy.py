"""The fault proxy our tests use is the shipped one (`mind/testing/faultproxy/`); this module keeps
the old import path (`from support.faultproxy import FaultProxy`) and `python tests/support/faultproxy.py`
working. The command grammar: `mindhand-faultproxy --help`."""

from mind.testing.faultproxy import FaultProxy, FaultProxyError, Proxy, start_proxy
from mind.testing.faultproxy.cli import main

__all__ = ["FaultProxy", "FaultProxyError", "Proxy", "main", "start_proxy"]

if __name__ == "__main__":
    main()
