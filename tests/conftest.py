import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.cluster import Cluster  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()
