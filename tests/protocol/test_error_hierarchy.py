"""One exception hierarchy: every exception class mindhand defines derives from `MindhandError`
(`protocol/errors.py` draws the tree), and those that callers catch as `ValueError` still are."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import protocol
from protocol.errors import MindhandError


def defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in ("protocol", "mind", "hand"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.endswith(".__main__"):
                continue  # `python -m mind`: importing it runs the CLI
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_mindhand_defines_is_a_mindhand_error():
    found = defined_exceptions()
    assert len(found) >= 15, sorted(found)  # the walk did find the modules
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, MindhandError))
    assert outside == [], "derive these from protocol.errors.MindhandError (and list them in its docstring)"


def test_the_hierarchy_is_documented_where_it_is_defined():
    doc = protocol.errors.__doc__ or ""
    for name in defined_exceptions():
        short = name.rsplit(".", 1)[1]
        if not short.startswith("_"):
            assert short in doc, f"{name} is missing from the tree in protocol/errors.py"


def test_errors_caught_as_value_errors_still_are():
    from hand.system.sandbox import OverCap
    from protocol.io.settings import ConfigError
    from protocol.io.tls import TLSConfigError

    for cls in (ConfigError, TLSConfigError, OverCap):
        assert issubclass(cls, ValueError) and issubclass(cls, MindhandError)
