"""queue-cli's error lines on a real node say what a person can do about them."""
from __future__ import annotations

import io
import sys

from queue_server.client import cli
from tests.harness import NodeProcess, free_port


def test_no_leader_says_why_a_node_may_know_none(tmp_path, monkeypatch):
    # node 1 of three whose two others never start: it can never elect a leader
    node = NodeProcess(str(tmp_path), {"in_memory": True, "node_id": 1, "election_timeout_ms": 100,
                                       "cluster_node_list": [{"node_id": i, "host": "127.0.0.1", "port": free_port()}
                                                             for i in (1, 2, 3)]}).start()
    try:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert cli.main(["--hosts", node.hosts, "--timeout", "1", "produce", "jobs", "x"]) == 1
    finally:
        node.stop()
    assert err.getvalue() == ("queue-cli: no leader (the nodes reached know no leader: fewer than a majority of "
                              "the cluster are up and in touch, or an election is on; give --hosts every node)\n")
