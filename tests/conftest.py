"""Session-wide safety net: stop every node a test started, even one a failing test left."""
from __future__ import annotations

import pytest

from tests.harness import STARTED


@pytest.fixture(autouse=True, scope="session")
def _stop_every_node():
    yield
    for node in STARTED:
        if node.proc is not None and node.proc.poll() is None:
            node.stop()
