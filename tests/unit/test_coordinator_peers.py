"""Coordinator.carry_out's sends to other nodes, without sockets: a message that goes to several
followers is encoded once, and each of them gets those bytes; all of one Ready's messages to a
peer go as the frames of one send with queue groups, and one a send with the default placement
(as every earlier version reads them)."""
from __future__ import annotations

import logging

import pytest
import zmq

from queue_server.election.messages import Heartbeat, HeartbeatAck
from queue_server.protocol.origin import Origin
from queue_server.replication import wire
from queue_server.replication.messages import AppendAck, AppendEntries, Forward
from queue_server.server.cluster import ClusterNode
from queue_server.server.coordinator import Coordinator
from queue_server.server.group_disks import GroupDisks
from tests.unit.test_cluster_node import NODE2, PRODUCE, T0, _batch, _drain, _elected, _config, _follower

NODE3 = ("127.0.0.1", 3333)


class Outbox:
    """A socket or peer link that keeps what it is given."""

    def __init__(self, connected: bool = True) -> None:
        self.sent: list = []
        self.connected = connected

    def send(self, frames: list[bytes]) -> None:
        if not self.connected:
            raise zmq.Again()
        self.sent.append(frames)

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(frames)


def _coordinator(node: ClusterNode, tmp_path) -> Coordinator:
    """A Coordinator around `node` whose sockets are Outboxes (its other I/O is not used here)."""
    coordinator = Coordinator.__new__(Coordinator)
    coordinator.node, coordinator.storage, coordinator.config = node, None, node.config
    coordinator.log, coordinator.recovery = logging.getLogger(__name__), None
    coordinator.client = ("127.0.0.1", 1101, node.config.node_type, 0, 0)
    coordinator.multipart = False
    coordinator.workers = [Outbox() for _ in range(node.config.workers)]
    coordinator.acceptor = Outbox()
    coordinator.peers = {2: Outbox(), 3: Outbox()}
    coordinator.disks = GroupDisks.without_storage(node, str(tmp_path), coordinator.log)
    coordinator.transfers = coordinator.disks.transfers[0]
    return coordinator


def test_a_batch_for_two_followers_is_encoded_once(monkeypatch, tmp_path):
    node, now = _elected(_config(3))
    for peer, client in ((2, NODE2), (3, NODE3)):  # both hold the whole log: pushes from now on
        node.on_peer(AppendAck(node.election.vote_id, peer, node.log.last_trans_id), client, now)
    _drain(node)
    _batch(node, node.epoch, [PRODUCE])
    coordinator = _coordinator(node, tmp_path)
    encoded = []

    def encode(msg: object, *client) -> bytes:
        encoded.append(msg)
        return wire_encode(msg, *client)

    wire_encode = wire.encode
    monkeypatch.setattr(wire, "encode", encode)
    assert coordinator.carry_out(node.ready(), True)
    ([to_2],), ([to_3],) = coordinator.peers[2].sent, coordinator.peers[3].sent
    assert to_2 is to_3 and [type(m) for m in encoded] == [AppendEntries]
    assert wire.decode(to_2).msg == encoded[0]


def _forward_and_ack() -> ClusterNode:
    """A follower of node 2 whose next Ready holds two messages to it: a forwarded request and
    the ack of a heartbeat."""
    node = _follower()
    node.on_forward_requests([[Origin(3, False), 1, {"action": 1, "queue": "q", "data": "x"}]], T0)
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0 + 0.01)
    return node


def test_with_the_default_placement_each_message_to_a_peer_is_a_send_of_its_own(tmp_path):
    node = _forward_and_ack()
    coordinator = _coordinator(node, tmp_path)
    assert coordinator.carry_out(node.ready(), True)
    sends = coordinator.peers[2].sent
    assert [len(frames) for frames in sends] == [1, 1]
    assert [type(wire.decode(frames[0]).msg) for frames in sends] == [Forward, HeartbeatAck]


def test_with_queue_groups_one_readys_messages_to_a_peer_go_in_one_send(tmp_path):
    node = _forward_and_ack()
    coordinator = _coordinator(node, tmp_path)
    coordinator.multipart = True
    assert coordinator.carry_out(node.ready(), True)
    (frames,) = coordinator.peers[2].sent  # one send, ...
    assert [type(wire.decode(f).msg) for f in frames] == [Forward, HeartbeatAck]  # ... a frame per message, in order
    assert coordinator.peers[3].sent == []


@pytest.mark.parametrize("multipart", [False, True])
def test_a_send_a_peer_does_not_take_leaves_all_of_its_messages_unsent(tmp_path, monkeypatch, multipart):
    node = _forward_and_ack()
    coordinator = _coordinator(node, tmp_path)
    coordinator.multipart = multipart
    coordinator.peers[2].connected = False
    unsent = []
    monkeypatch.setattr(node, "on_unsent", lambda msg, now, group=0, to=None: unsent.append(type(msg)))
    assert coordinator.carry_out(node.ready(), True)
    assert unsent == [Forward, HeartbeatAck]
