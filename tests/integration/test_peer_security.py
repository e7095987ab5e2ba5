"""The peer wire of a real 3-node cluster with a cluster secret (CURVE): forged peer messages
change nothing, whether sent from a socket without the cluster's keys or from one holding node
2's key and claiming to be node 3; a node with a wrong secret cannot join; a node whose peer
address others can reach refuses to start without a secret."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import zmq

from queue_server.election.messages import VoteRequest
from queue_server.protocol.records import Purge
from queue_server.replication import wire
from queue_server.replication.log import Entry
from queue_server.replication.messages import AppendEntries, InstallSnapshot
from queue_server.server import peer_keys
from tests.harness import Cluster, RawTcp, free_port, metric, wait_for

HUGE = 2**62


def secured_cluster(workdir, secrets: dict[int, str] | None = None) -> Cluster:
    """A 3-node cluster sharing one secret (or each node's own, from `secrets`), metrics on."""
    shared = os.path.join(workdir, "cluster.secret")
    peer_keys.write_secret(shared)
    cluster = Cluster(workdir, 3, cluster_secret_file=shared, in_memory=True)
    for node_id, node in cluster.nodes.items():
        node.config["metrics_port"] = free_port()
        if secrets and node_id in secrets:
            node.config["cluster_secret_file"] = secrets[node_id]
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = secured_cluster(str(tmp_path_factory.mktemp("peersec")))
    c.start()
    yield c
    c.stop()


def peer_address(cluster: Cluster, node_id: int) -> str:
    me = next(n for n in cluster.nodes[node_id].config["cluster_node_list"] if n["node_id"] == node_id)
    return f"tcp://127.0.0.1:{me['port']}"


def forgeries(src: int, leader: int) -> list:
    return [
        VoteRequest(HUGE, src, HUGE, HUGE, False),
        AppendEntries(HUGE, src, 0, 0, (Entry(1, HUGE, Purge(queue="jobs", count=1)),), HUGE),
        InstallSnapshot(HUGE, src, HUGE, HUGE, {}),
    ]


def state(cluster: Cluster) -> dict:
    """What forged messages must not change: each node's leader, and the queue's contents."""
    leader = cluster.wait_leader()
    conn = RawTcp(*cluster.nodes[leader].address)
    try:
        peek = conn.call({"action": "peek", "queue": "jobs", "count": 10})
    finally:
        conn.close()
    return {"leader": leader, "views": [cluster.leader_view(i) for i in cluster.nodes],
            "jobs": [m["data"] for m in peek.get("messages", [])]}


def term(cluster: Cluster, node_id: int) -> float:
    return metric(cluster.nodes[node_id].config["metrics_port"], "queue_server_term")


def prepared(cluster: Cluster) -> tuple[dict, dict[int, float]]:
    leader = cluster.wait_serving()
    conn = RawTcp(*cluster.nodes[leader].address)
    try:
        if not conn.call({"action": "peek", "queue": "jobs", "count": 10}).get("messages"):
            for i in range(3):
                assert conn.call({"action": 1, "queue": "jobs", "data": f"m{i}"})["code"] == 0
    finally:
        conn.close()
    terms = {i: wait_for(lambda i=i: term(cluster, i) or None, 10, f"node {i}'s term metric") for i in cluster.nodes}
    return state(cluster), terms


def send_all(sock: zmq.Socket, cluster: Cluster, msgs: list, cluster_id: int = 10) -> None:
    for msg in msgs:
        sock.send(wire.encode(msg, "127.0.0.1", 1, cluster_id))


def dealer(ctx: zmq.Context, target: str, **curve) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    for name, value in curve.items():
        setattr(sock, name, value)
    sock.connect(target)
    return sock


def unchanged_after(cluster: Cluster, send, expected: dict[int, dict[str, int]]) -> None:
    """send(ctx, secret, before) sends forged messages (returning its sockets: one garbage-collected
    is closed before it has connected); once every node counts the refusals `expected` (node ->
    reason -> at least), the leaders, terms and queue contents are what they were."""
    before, terms = prepared(cluster)
    secret = peer_keys.read_secrets(cluster.nodes[1].config["cluster_secret_file"])[0]
    ctx = zmq.Context()
    try:
        kept = send(ctx, secret, before)
        for node_id, reasons in expected.items():
            port = cluster.nodes[node_id].config["metrics_port"]
            wait_for(lambda: all(metric(port, "queue_server_peer_rejected_total", reason=r) >= n
                                 for r, n in reasons.items()), 10, f"node {node_id} to refuse {reasons}")
        assert kept
    finally:
        ctx.destroy(linger=0)
    assert state(cluster) == before
    assert {i: term(cluster, i) for i in cluster.nodes} == terms


def test_forgeries_without_the_cluster_key_change_nothing(cluster):
    def send(ctx, secret, before):
        kept = []
        for node_id in cluster.nodes:
            target = peer_address(cluster, node_id)
            # no CURVE at all; and an attacker who even knows the node's public key, with a key of its own
            public, private = zmq.curve_keypair()
            kept += [dealer(ctx, target), dealer(ctx, target, curve_publickey=public, curve_secretkey=private,
                                                 curve_serverkey=peer_keys.keypair(secret, node_id)[0])]
            for sock in kept[-2:]:
                send_all(sock, cluster, forgeries(2 if node_id != 2 else 3, before["leader"]))
        return kept
    unchanged_after(cluster, send, {i: {"bad_key": 1} for i in cluster.nodes})


def as_node_2(ctx: zmq.Context, cluster: Cluster, secret: bytes, node_id: int) -> zmq.Socket:
    """A DEALER to node `node_id` authenticated with node 2's key."""
    public2, private2 = peer_keys.keypair(secret, 2)
    return dealer(ctx, peer_address(cluster, node_id), curve_publickey=public2, curve_secretkey=private2,
                  curve_serverkey=peer_keys.keypair(secret, node_id)[0])


def test_forgeries_from_an_authenticated_node_claiming_another_id_change_nothing(cluster):
    def send(ctx, secret, before):
        kept = []
        for node_id in (1, 3):
            kept.append(sock := as_node_2(ctx, cluster, secret, node_id))
            send_all(sock, cluster, forgeries(3 if node_id == 1 else 1, before["leader"]))
            send_all(sock, cluster, forgeries(2, before["leader"]), cluster_id=99)  # node 2, another cluster
        return kept
    unchanged_after(cluster, send, {i: {"src_not_sender": 3, "other_cluster": 3} for i in (1, 3)})


def test_every_frame_of_a_peers_send_is_read_and_another_placement_is_dropped(cluster):
    """A peer sends several messages as the frames of one send: each is read (and counted when
    refused); messages from a node whose placement of the queue groups differs are dropped,
    and logged once."""
    def send(ctx, secret, before):
        kept = []
        for node_id in (1, 3):
            kept.append(sock := as_node_2(ctx, cluster, secret, node_id))
            sock.send_multipart([wire.encode(m, "127.0.0.1", 1, 10, 0, 0xC0FFEE) for m in forgeries(2, before["leader"])])
        return kept
    unchanged_after(cluster, send, {i: {"other_placement": 3} for i in (1, 3)})
    for node_id in (1, 3):
        log = cluster.nodes[node_id].log()
        assert log.count("dropped a peer message (other_placement)") == 1, log
        assert "placement hash 00c0ffee (this node's: 00000000;" in log


def test_a_node_with_a_wrong_secret_cannot_join(tmp_path):
    wrong = str(tmp_path / "wrong.secret")
    peer_keys.write_secret(wrong)
    c = secured_cluster(str(tmp_path), secrets={3: wrong})
    try:
        c.start()
        leader = c.wait_leader(among=[1, 2])
        conn = RawTcp(*c.nodes[leader].address)
        try:
            assert conn.call({"action": 1, "queue": "jobs", "data": "x"})["code"] == 0  # a quorum without node 3
        finally:
            conn.close()
        port = c.nodes[leader].config["metrics_port"]
        other = 3 - leader
        # The leader has sent node 3 what node 2 acknowledged, and heard nothing back.
        wait_for(lambda: metric(port, "queue_server_replication_lag_records", follower="3") >= 2
                 and metric(port, "queue_server_replication_lag_records", follower=str(other)) == 0,
                 15, "the leader to see node 3 fall behind")
        assert c.leader_view(3) is None
        assert c.leader_view(other) == leader
    finally:
        c.stop()


def start_error(config: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    return subprocess.run([sys.executable, "-P", "-m", "queue_server.server.main", "--config", str(path)],
                          capture_output=True, text=True, timeout=30)


def exposed(tmp_path, **extra) -> dict:
    return {"node_id": 1, "port": free_port(), "http_port": 0, "in_memory": True, **extra, "cluster_node_list": [
        {"node_id": 1, "host": "0.0.0.0", "port": free_port()},
        {"node_id": 2, "host": "127.0.0.1", "port": free_port()},
        {"node_id": 3, "host": "127.0.0.1", "port": free_port()}]}


def test_a_reachable_peer_port_without_a_secret_refuses_to_start(tmp_path):
    proc = start_error(exposed(tmp_path), tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert out.strip().splitlines() == [
        "queue-server: config key 'cluster_secret_file': the peer address 0.0.0.0 is not loopback, so peers "
        "must be authenticated: make a secret with `queue-server keygen --out FILE` and set cluster_secret_file "
        "on every node (or set insecure_peers to true)"]


def test_insecure_peers_starts_with_a_warning(tmp_path):
    from tests.harness import NodeProcess
    node = NodeProcess(str(tmp_path), exposed(tmp_path, insecure_peers=True))
    try:
        node.start()
        wait_for(lambda: "insecure_peers: the peer port on 0.0.0.0 takes unauthenticated" in node.log(), 10,
                 "the insecure_peers warning")
    finally:
        node.stop()
