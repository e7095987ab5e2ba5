"""Coordinator.carry_out's sends to other nodes, without sockets: a message that goes to several
followers is encoded once, and each of them gets those bytes."""
from __future__ import annotations

import logging

from queue_server.replication import wire
from queue_server.replication.messages import AppendAck, AppendEntries
from queue_server.server.coordinator import Coordinator
from queue_server.server.transfers import Transfers
from tests.unit.test_cluster_node import NODE2, PRODUCE, _batch, _drain, _elected, _config

NODE3 = ("127.0.0.1", 3333)


class Outbox:
    """A socket or peer link that keeps what it is given."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(frames)


def test_a_batch_for_two_followers_is_encoded_once(monkeypatch, tmp_path):
    node, now = _elected(_config(3))
    for peer, client in ((2, NODE2), (3, NODE3)):  # both hold the whole log: pushes from now on
        node.on_peer(AppendAck(node.election.vote_id, peer, node.log.last_trans_id), client, now)
    _drain(node)
    _batch(node, node.epoch, [PRODUCE])
    coordinator = Coordinator.__new__(Coordinator)  # its I/O but the peer links is not used here
    coordinator.node, coordinator.storage, coordinator.config = node, None, node.config
    coordinator.log, coordinator.recovery = logging.getLogger(__name__), None
    coordinator.client = ("127.0.0.1", 1101, node.config.node_type, 0)
    coordinator.workers = [Outbox() for _ in range(node.config.workers)]
    coordinator.acceptor = Outbox()
    coordinator.peers = {2: Outbox(), 3: Outbox()}
    coordinator.transfers = Transfers(node, None, str(tmp_path), coordinator.log)
    encoded = []

    def encode(msg: object, *client) -> bytes:
        encoded.append(msg)
        return wire_encode(msg, *client)

    wire_encode = wire.encode
    monkeypatch.setattr(wire, "encode", encode)
    assert coordinator.carry_out(node.ready(), True)
    (to_2,), (to_3,) = coordinator.peers[2].sent, coordinator.peers[3].sent
    assert to_2 is to_3 and [type(m) for m in encoded] == [AppendEntries]
    assert wire.decode(to_2).msg == encoded[0]
