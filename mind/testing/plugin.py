"""The mindhand pytest plugin (`pip install 'mindhand[testing]'` registers it as `mindhand`).

Fixtures, each a real process or a real connection, on free loopback ports in a temporary directory
of their own that is removed after the test (the logs of a failed test are printed first):

- `mindhand_cluster`: a `Cluster` with a running Mind (`.mind`, `.url`); start more Hands with
  `mindhand_cluster.start_hand(name, proxy=True)` and `wait_connected(name)`.
- `mind`: the Mind's process handle (`.url`, `.port`, `.kill9()`, `.events()`).
- `hand`: a Hand named `box`, connected through a fault proxy of its own (`hand.proxy`).
- `faultproxy`: that proxy (`FaultProxy`: `blackhole()`, `cut()`, `frame("hold", "result", "up")`, ...).
- `mind_client`: an async fixture (pytest-asyncio): a connected `MindClient` allowed everything.

Importing this module starts nothing and imports nothing heavy: pytest loads it in every run of a
project that installed the extra, including runs that use none of it. A fixture of the same name in
a project's own conftest or test module wins over these (pytest's rule), so nothing here can clash.

Cleanup is by PID: a test that fails stops its processes in teardown; one that is interrupted
(Ctrl-C, SIGINT) has them killed at interpreter exit (`mind/testing/reaper.py`). A SIGKILL of pytest
itself cannot be cleaned up after by anyone in the process.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mind.client.aio import MindClient
    from mind.testing.cluster import Cluster, Hand, Mind
    from mind.testing.faultproxy import FaultProxy

TMP_PREFIX = "mindhand-test-"

try:
    import pytest_asyncio

    _async_fixture: Any = pytest_asyncio.fixture
except ImportError:  # the client fixture then says what is missing
    _async_fixture = pytest.fixture


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


def _print_logs(tmp: Path) -> None:
    for log in sorted(tmp.glob("*.log")):
        text = log.read_text(errors="replace")
        print(f"----- {log.name} (last 40 lines) -----\n" + "\n".join(text.splitlines()[-40:]), file=sys.stderr)


@pytest.fixture
def mindhand_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A running Mind in a fresh temporary directory (see the module docstring); everything the
    cluster started is stopped and the directory removed afterwards, whatever the test did."""
    from mind.testing.cluster import Cluster

    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    cl = Cluster(tmp)
    try:
        if {"hand", "faultproxy"} & set(request.fixturenames):
            cl.start("box")  # the Mind and the Hand start together (`Cluster.start` says why)
        else:
            cl.start_mind()
        yield cl
    finally:
        cl.stop_all()
        if request.node.stash.get(_FAILED, False):
            _print_logs(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def mind(mindhand_cluster: Cluster) -> Mind:
    """The Mind process of `mindhand_cluster`."""
    assert mindhand_cluster.mind is not None
    return mindhand_cluster.mind


@pytest.fixture
def hand(mindhand_cluster: Cluster) -> Hand:
    """Hand `box`, connected to the Mind through its own fault proxy (`hand.proxy`), its root
    directory `hand.root`."""
    if "box" not in mindhand_cluster.hands:
        mindhand_cluster.start_hand("box", proxy=True)
    mindhand_cluster.wait_connected("box")
    return mindhand_cluster.hands["box"]


@pytest.fixture
def faultproxy(hand: Hand) -> FaultProxy:
    """The fault proxy between `hand` and the Mind (`mindhand-faultproxy --help` lists its faults)."""
    assert hand.proxy is not None
    return hand.proxy


@_async_fixture
async def mind_client(mindhand_cluster: Cluster) -> AsyncIterator[MindClient]:
    """A `MindClient` connected to the Mind as client `tester` (all Hands, all tools); closed after."""
    if "pytest_asyncio" not in sys.modules:
        pytest.fail("the mind_client fixture needs pytest-asyncio: pip install 'mindhand[testing]'", pytrace=False)
    client = await mindhand_cluster.client("tester")
    try:
        yield client
    finally:
        await client.close()
