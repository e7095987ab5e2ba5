"""The harness's waits (tests/harness.py): a node that accepts connections is not yet one that
serves, and wait_serving tells them apart."""
from __future__ import annotations

from tests.harness import Cluster


def test_a_node_without_a_quorum_accepts_connections_but_does_not_serve_until_a_leader_is_known(tmp_path):
    c = Cluster(str(tmp_path), 3)
    try:
        alone = c.nodes[1].start()  # wait_ready: the port is open
        assert not alone.serves(), "a node of 3 serves with no peer up"
        for node_id in (2, 3):
            c.nodes[node_id].start(wait=False)
        alone.wait_serving()
        assert alone.serves()
        leader = c.wait_serving()
        assert all(c.leader_view(i) == leader for i in c.nodes)
    finally:
        c.stop()
