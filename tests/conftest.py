import os
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

from support.spawnguard import install

from mind.testing.cluster import Cluster

# Property tests take their example counts from a profile, not from each test: `dev` keeps the edit loop
# (`scripts/test --fast`, a bare pytest) quick; `ci` tries at least as many examples as any test fixed for
# itself before, and is what the full `scripts/test` (so CI) and any run with $CI set use. HYPOTHESIS_PROFILE
# chooses explicitly. No deadline in either: the machine is shared and small, so a slow example is noise.
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=600, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

GUARD = install()

# The suite's Minds run without continuity (`--resume-window 0`, the rules of DESIGN §5 and §8 as
# written) unless a test names its window: the continuity tests do, and one checks the default.
Cluster.resume_window = 0


FIRST = (
    "integration/test_bench_quick.py",
    "integration/test_testing_guide.py",
    "integration/test_many_minds.py",
    "integration/test_mcp.py",
    "integration/test_continuity_client.py",
    "integration/test_followers_wait.py",
    "integration/test_continuity_hand.py",
    "integration/test_continuity_restart.py",
    "integration/test_demo.py",
)
"""The modules that take longest (a minute to four, `--durations`), collected first: `scripts/test`
hands whole modules to its workers in collection order (`--dist loadfile`), so a long one started
last would leave one worker running it alone at the end. A stale list costs time, never a test."""


def pytest_addoption(parser):
    parser.addoption(
        "--failed-to",
        metavar="FILE",
        help="write the node id of every test that failed to FILE, one a line (scripts/test reruns them alone)",
    )


_FAILED: list[str] = []


def pytest_runtest_logreport(report):
    """(On the controller under pytest-xdist too: the workers' reports come through here.)"""
    if report.failed and report.nodeid not in _FAILED:
        _FAILED.append(report.nodeid)


def pytest_sessionfinish(session):
    path = session.config.getoption("--failed-to", None)
    if path and not hasattr(session.config, "workerinput"):  # the controller writes it, once
        Path(path).write_text("".join(f"{nodeid}\n" for nodeid in _FAILED))


@pytest.fixture(autouse=True)
def _sigint_as_it_was():
    """A test that runs a CLI in this process may leave SIGINT ignored (the fleet follower ignores a
    late Ctrl-C on purpose, as its process ends): every process a later test starts would inherit
    that and never take a Ctrl-C. Put back what was there."""
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before and before is not None:
        signal.signal(signal.SIGINT, before)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}

    def key(item):
        path = Path(str(item.fspath))
        return rank.get(f"{path.parent.name}/{path.name}", len(FIRST))

    items.sort(key=key)  # stable: the order within a module, and of the rest, is kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arm the process guard for tests not marked slow (support/spawnguard.py says why)."""
    GUARD.current = None if item.get_closest_marker("slow") else item.nodeid
    GUARD.spawned.clear()
    try:
        return (yield)
    finally:
        GUARD.current = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Fail a fast test that tried to start a process, even if the code it drives caught the refusal."""
    result = yield
    if why := GUARD.verdict():
        GUARD.spawned.clear()
        pytest.fail(why, pytrace=False)
    return result


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def as_root():
    """Tests of `--run-as`, user switching and `useradd` need root: CI runs as root, and so must a
    run of the whole suite. Not root is a failure that says so, never a silent skip."""
    import shutil

    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.fail("this test needs root with useradd/userdel (run the suite as root, as CI does)", pytrace=False)


@pytest.fixture(scope="session")
def postgres():
    """The suite's own PostgreSQL server (support/postgres.py), started once, stopped by PID at the end.
    No server binaries is a failure that says how to get them, never a skip."""
    from support.postgres import remove, start_server

    try:
        server = start_server()
    except (RuntimeError, KeyError, OSError) as exc:
        pytest.fail(f"cannot start PostgreSQL for the tests: {exc}", pytrace=False)
    try:
        yield server
    finally:
        remove(server)


@pytest.fixture
def pg_database(postgres):
    """A fresh, empty database on the suite's server for one test: its URL."""
    import uuid

    return postgres.createdb("t_" + uuid.uuid4().hex[:12])
