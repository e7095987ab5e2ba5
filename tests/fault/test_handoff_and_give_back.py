"""Leadership changes on real 3-node clusters and what clients hold across them: a hand-off that
fails (its target is stopped, so TimeoutNow never makes it campaign, and it is not replaced
within the hand-off's time) keeps the long polls and subscriptions parked on the leader, which
goes on leading and serves them; and an at-most-once message whose reply could not be delivered
is restored by the node that leads when it is given back, not only by the one that delivered
it. A hand-off whose target does not answer goes to the other follower.
"""
from __future__ import annotations

import os
import signal
import socket
import struct

from queue_server.client import QueueClient
from tests.harness import Cluster, wait_for

TIMEOUT = 20.0


def _waiters(cluster: Cluster, node_id: int, queue: str) -> int | None:
    reply = cluster.ask(node_id, {"action": 4, "queue": queue})
    return reply.get("waiters") if reply and reply.get("code") == 0 else None


def test_a_hand_off_that_fails_keeps_parked_long_polls_and_subscriptions(tmp_path):
    # shutdown_grace 3: a hand-off is given 1.5 s before the node leads on; election_timeout_ms
    # 3000: not long enough for the stopped target to be replaced by the other follower, which
    # keeps the leader's quorum (Election.retarget_transfer)
    cluster = Cluster(str(tmp_path), shutdown_grace=3.0, election_timeout_ms=3000)
    try:
        cluster.start()
        leader = cluster.wait_serving(60)
        lp, sq = cluster.in_first_group("lp"), cluster.in_first_group("sq")  # (with queue groups, the leader's)
        node = cluster.nodes[leader]
        # Once both followers' logs equal the leader's (wait_level), the hand-off picks the lower id.
        target = min(i for i in cluster.nodes if i != leader)
        poll, sub = node.connect(), node.connect()
        poll.send({"action": "consume", "queue": lp, "wait": TIMEOUT, "seq": 1})
        subscribed = sub.call({"action": "subscribe", "queue": sq, "credit": 5})
        assert subscribed["code"] == 0, subscribed
        wait_for(lambda: _waiters(cluster, leader, lp) == 1, 10, "the long poll to be parked on the leader")
        cluster.wait_level(leader)
        with cluster.nodes[target].child_stopped("coordinator"):
            os.kill(node.child_pid("coordinator"), signal.SIGUSR1)  # what a SIGTERM's hand-off starts with
            wait_for(lambda: f"handing leadership to node {target}" in node.log(), 10, "the hand-off to start")
            wait_for(lambda: "no follower took over" in node.log(), 10, "the hand-off to fail")
            with QueueClient(node.hosts, timeout=10) as client:
                client.produce(lp, "for the poll")
                client.produce(sq, "for the subscription")
            answered = poll.recv()
            assert (answered["code"], answered.get("seq"), answered.get("data")) == (0, 1, "for the poll"), answered
            pushed = sub.recv()
            assert (pushed.get("push"), pushed["code"], pushed.get("data")) == (True, 0, "for the subscription"), pushed
            assert cluster.role(leader) == "leader"
        poll.close()
        sub.close()
    finally:
        cluster.stop()


def test_a_hand_off_whose_target_does_not_answer_goes_to_the_other_follower(tmp_path):
    """The follower picked for a hand-off is stopped: after an election timeout the leader picks
    the other one, says so in its log, and that one leads."""
    cluster = Cluster(str(tmp_path), shutdown_grace=6.0)
    try:
        cluster.start()
        leader = cluster.wait_serving(60)
        node = cluster.nodes[leader]
        target = min(i for i in cluster.nodes if i != leader)
        other = max(i for i in cluster.nodes if i != leader)
        cluster.wait_level(leader)
        with cluster.nodes[target].child_stopped("coordinator"):
            os.kill(node.child_pid("coordinator"), signal.SIGUSR1)
            wait_for(lambda: f"handing leadership to node {target}" in node.log(), 10, "the hand-off to start")
            wait_for(lambda: f"stopping: node {other} leads now" in node.log(), 10, "the other follower to lead")
            assert (f"node {target} did not answer for an election timeout; handing leadership to node {other} "
                    "instead") in node.log()
            wait_for(lambda: cluster.role(other) == "leader", 10, f"node {other} to lead")
    finally:
        cluster.stop()


def test_an_at_most_once_message_given_back_after_a_change_of_leader_is_restored(tmp_path):
    """A follower's client long-polls (forwarded, parked on the leader) and leaves; the leader
    then serves the poll, consuming an at-most-once message, and its reply reaches the
    follower's acceptor only after leadership moved (the acceptor is stopped meanwhile). The
    follower gives the message back to the new leader, which restores it from the consume
    record it replayed."""
    cluster = Cluster(str(tmp_path))
    try:
        cluster.start()
        leader = cluster.wait_serving(60)
        follower = next(i for i in cluster.nodes if i != leader)
        conn = cluster.nodes[follower].connect()
        conn.send({"action": "consume", "queue": "amo", "wait": TIMEOUT, "seq": 1})
        wait_for(lambda: _waiters(cluster, leader, "amo") == 1, 10, "the forwarded long poll to be parked on the leader")
        port = conn.sock.getsockname()[1]
        # A reset, not a FIN (which the node takes for a half-close and answers the poll anyway).
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        wait_for(lambda: cluster.nodes[follower].server_side(port) is None, 10,
                 "the follower's acceptor to close its end of the connection")
        old = cluster.nodes[leader]
        with cluster.nodes[follower].child_stopped("acceptor"):
            with QueueClient(old.hosts, timeout=10) as client:
                msg_id = client.produce("amo", "once")  # served to the parked poll, whose client is gone
            os.kill(old.child_pid("coordinator"), signal.SIGUSR1)  # hand leadership over
            wait_for(lambda: "leads now (hand-off took" in old.log(), 10, "the hand-off")
        new = cluster.wait_leader(exclude=leader)
        with QueueClient(cluster.nodes[new].hosts, timeout=10) as client:
            restored = client.consume("amo", wait=10)
            assert restored is not None, "the message was not given back"
            assert (restored.msg_id, restored.data) == (msg_id, "once")
            assert client.consume("amo") is None  # restored once: at most once holds
    finally:
        cluster.stop()
