"""Fixtures that start real nodes on loopback ports chosen at run time."""
from __future__ import annotations

import itertools
import os
import time

import pytest

from tests.harness import NodeProcess

_names = itertools.count()


NODE_CONFIG = {"queue_size": 1000, "max_wait": 5, "max_request_size": 65536, "udp_max_response": 4000,
               "virtual_queue_list": [{"name": "fan", "queue_list": ["fan_a", "fan_b"]}]}
# The client token of `authed_node`.
AUTH_TOKEN = "battery-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One single node shared by a test module (tests use their own queue names), serving."""
    n = NodeProcess(str(tmp_path_factory.mktemp("node")), NODE_CONFIG).start(serving=True)
    yield n
    n.stop()


@pytest.fixture(scope="module")
def authed_node(tmp_path_factory):
    """`node` with client authentication on: clients present AUTH_TOKEN (TCP: an auth request
    first; UDP: auth_token in every datagram)."""
    workdir = tmp_path_factory.mktemp("authed-node")
    token_file = workdir / "token"
    token_file.write_text(AUTH_TOKEN + "\n")
    n = NodeProcess(str(workdir), {**NODE_CONFIG, "auth_token_file": str(token_file)}).start(serving=True)
    yield n
    n.stop()


@pytest.fixture
def roles(cluster) -> tuple[int, int]:
    """(leader, a follower that knows it) of the module's own `cluster` fixture."""
    return cluster.roles()


@pytest.fixture
def qname(request) -> str:
    """A queue name no other test uses."""
    return f"{request.node.name[:40]}-{os.getpid()}-{next(_names)}-{time.monotonic_ns()}"
