"""Rotating the cluster secret and the client token without downtime (docs/security.md,
Rotation), on a real 3-node cluster restarted one node at a time while a client produces and
consumes: (1) every node gets the new secret and token as a second line; (2) the secret lines
are swapped; (3) the old lines are removed. After every single restart the three nodes agree on a
leader, the restarted node relays requests to it, and no node has refused a peer's key; at the
end every acknowledged message has been consumed."""
from __future__ import annotations

import os
import threading
import time

from queue_server import QueueClient
from queue_server.client.errors import QueueError
from queue_server.server import peer_keys
from tests.harness import Cluster, NodeProcess, free_port, metric, wait_for

OLD_TOKEN, NEW_TOKEN = "old-token-0123456789", "new-token-9876543210"


class Traffic(threading.Thread):
    """Produces and consumes (at least once, confirmed) until stopped; remembers what was
    acknowledged, what was consumed, and the longest time without a successful request."""

    def __init__(self, hosts: str) -> None:
        super().__init__(daemon=True)
        self.client = QueueClient(hosts, timeout=2, token=OLD_TOKEN)
        self.token: str | None = None  # set: the client presents it from its next connection on
        self.stop = threading.Event()
        self.acked: set[str] = set()
        self.consumed: set[str] = set()
        self.last_ok = time.monotonic()
        self.longest_outage = 0.0
        self.errors = 0

    def run(self) -> None:
        q = self.client
        i = 0
        while not self.stop.is_set():
            if self.token is not None:
                q.token, self.token = self.token, None
                q.close()
            try:
                data = f"m{i}"
                q.produce("rot", data, retry=1)
                self.acked.add(data)
                i += 1
                m = q.consume("rot")
                if m is not None:
                    self.consumed.add(m.data)
                    q.confirm("rot", m.msg_id)
            except QueueError:
                self.errors += 1
                self.stop.wait(0.05)  # pace retries while a node restarts (not a wait for a condition)
                continue
            now = time.monotonic()
            self.longest_outage = max(self.longest_outage, now - self.last_ok)
            self.last_ok = now

    def drain(self) -> None:
        """Consume until everything acknowledged has been seen (redelivered after `retry`)."""
        with QueueClient(self.client.hosts, timeout=2, token=NEW_TOKEN) as q:
            def done() -> bool:
                for m in q.consume_batch("rot", 1000):
                    self.consumed.add(m.data)
                    q.confirm("rot", m.msg_id)
                return self.acked <= self.consumed
            wait_for(done, 20, "every acknowledged message to be consumed")


def write_lines(path: str, *lines: str) -> None:
    with open(path, "w") as f:
        f.write("# rotation in progress\n" + "".join(line + "\n" for line in lines))


def authenticates(cluster: Cluster, token: str) -> bool:
    """Whether a fresh client holding `token` is served (a produce on any node)."""
    try:
        with QueueClient(cluster.hosts, timeout=2, token=token) as q:
            q.produce("probe", "x")
        return True
    except QueueError as exc:
        assert "authentication failed" in str(exc)
        return False


def test_rolling_rotation_of_secret_and_token_keeps_the_cluster_serving(tmp_path):
    workdir = str(tmp_path)
    old_secret, new_secret = peer_keys.new_secret(), peer_keys.new_secret()
    cluster = Cluster(workdir, 3)
    for node_id, node in cluster.nodes.items():
        node.config["cluster_secret_file"] = os.path.join(workdir, f"node{node_id}.secret")
        node.config["auth_token_file"] = os.path.join(workdir, f"node{node_id}.token")
        node.config["metrics_port"] = free_port()
        write_lines(node.config["cluster_secret_file"], old_secret)
        write_lines(node.config["auth_token_file"], OLD_TOKEN)
    cluster.token = OLD_TOKEN
    cluster.start()
    traffic = Traffic(cluster.hosts)
    try:
        cluster.wait_leader()
        traffic.start()
        steps = [((old_secret, new_secret), (OLD_TOKEN, NEW_TOKEN)),
                 ((new_secret, old_secret), (NEW_TOKEN, OLD_TOKEN)),
                 ((new_secret,), (NEW_TOKEN,))]
        for number, (secrets, tokens) in enumerate(steps, 1):
            for node_id in sorted(cluster.nodes):
                node = cluster.nodes[node_id]
                node.stop()
                write_lines(node.config["cluster_secret_file"], *secrets)
                write_lines(node.config["auth_token_file"], *tokens)
                fresh = NodeProcess(node.workdir, node.config, name=node.name)
                fresh.log_path = node.log_path
                cluster.nodes[node_id] = fresh.start()
                leader = cluster.wait_serving(timeout=30)
                for i, n in cluster.nodes.items():
                    assert metric(n.config["metrics_port"], "queue_server_peer_rejected_total", reason="bad_key") == 0, \
                        f"step {number}, node {node_id} restarted: node {i} refused a peer's key"
            if number == 1:  # every node takes both tokens: clients move to the new one
                assert authenticates(cluster, OLD_TOKEN) and authenticates(cluster, NEW_TOKEN)
                traffic.token = cluster.token = NEW_TOKEN
        assert authenticates(cluster, NEW_TOKEN) and not authenticates(cluster, OLD_TOKEN)
        acked_before_stop = len(traffic.acked)
        wait_for(lambda: len(traffic.acked) > acked_before_stop + 10, 20, "the client to go on producing")
        traffic.stop.set()
        traffic.join(10)
        assert not traffic.is_alive(), "the client thread did not stop"
        traffic.drain()
        assert traffic.longest_outage < 20, f"{traffic.longest_outage:.1f} s without a successful request"
    finally:
        traffic.stop.set()
        if traffic.is_alive():
            traffic.join(10)
        traffic.client.close()
        cluster.stop()
