"""The Mind: the daemon that brokers runs between clients and Hands, its client library and its CLI."""

from protocol import __version__

__all__ = ["__version__"]
