"""Fixtures that start real nodes on loopback ports chosen at run time."""
from __future__ import annotations

import itertools
import os
import time

import pytest

from tests.harness import NodeProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One single node shared by a test module (tests use their own queue names)."""
    workdir = str(tmp_path_factory.mktemp("node"))
    n = NodeProcess(
        workdir,
        {"queue_size": 1000, "max_wait": 5, "max_request_size": 65536, "udp_max_response": 4000,
         "virtual_queue_list": [{"name": "fan", "queue_list": ["fan_a", "fan_b"]}]},
    ).start()
    yield n
    n.stop()


@pytest.fixture
def qname(request) -> str:
    """A queue name no other test uses."""
    return f"{request.node.name[:40]}-{os.getpid()}-{next(_names)}-{time.monotonic_ns()}"
