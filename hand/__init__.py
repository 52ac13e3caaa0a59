"""The Hand: an agent on each machine that connects out to the Mind and runs tools there.

It is the authority on what really ran on its machine (DESIGN §3): its policy is final, it kills
what it was asked to stop, and it reports the truth about how each run ended.
"""

from protocol import __version__

__all__ = ["__version__"]
