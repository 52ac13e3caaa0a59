"""A program's start collects rarely, and what it runs afterwards collects as any Python program does.

In a fresh interpreter (this process's collector is pytest's): the thresholds while importing, and
after `started()` the defaults again with the imports frozen, so a daemon never runs for days on
the start's thresholds (its cyclic garbage would wait 100,000 allocations for each pass).
"""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter: a process

PROGRAM = r"""
import gc
from protocol.io import gcstart
default = gc.get_threshold()
gcstart.starting()
assert gc.get_threshold()[0] == 100_000, gc.get_threshold()
import protocol.messages  # what a start imports
gcstart.started()
assert gc.get_threshold() == default, (gc.get_threshold(), default)
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen  # the classes and validators the import built are out of every pass
gcstart.started()  # a second connection of one CLI: nothing more
gcstart.starting()  # too late: the program runs on the defaults
assert gc.get_freeze_count() == frozen and gc.get_threshold() == default
# and a cycle made after the start is collected by the default passes
class Node:
    pass
import weakref
a = Node(); a.me = a
gone = weakref.ref(a)
del a
for _ in range(3):
    [[] for _ in range(default[0] * 2)]
    gc.collect(0)
assert gone() is None
print("ok")
"""


def test_the_start_collects_rarely_and_the_program_after_it_as_python_does():
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b"ok\n"
