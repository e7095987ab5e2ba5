"""The peer wire codec: every peer message survives protobuf encoding; garbage is a ValueError."""
from __future__ import annotations

import pytest

from queue_server.election.messages import Heartbeat, HeartbeatAck, TimeoutNow, VoteReply, VoteRequest
from queue_server.replication import messages, wire
from queue_server.replication.log import Entry
from queue_server.replication.messages import AppendAck, AppendEntries, InstallSnapshot, Pull
from queue_server.protocol.records import Produce, encode

MESSAGES = [
    VoteRequest(3, 1, 10, 2, True),
    VoteRequest(4, 2, 10, 3, False, True),
    TimeoutNow(3, 1),
    VoteReply(3, 2, True),
    Heartbeat(3, 1, 5, 2, 9, 3),
    HeartbeatAck(3, 2, 4, 1),
    AppendEntries(3, 1, 4, 2, (Entry(5, 3, Produce(queue="q", msg_id=1, ready=1.0, ttl=2.0, retry=0.0, priority=0, data="é",
                                             delivery_count=0)),), 4),
    AppendAck(3, 2, 5),
    Pull(3, 2, 4, 2, 3),
    InstallSnapshot(3, 1, 9, 3, {"q": {"next_id": 2, "messages": [[1, "x"]]}}),
    messages.Forward(3, 2, ((1, b'{"action":1}', False), (2, b"{}", True))),
    messages.GiveBack(3, 2, "q", (1, 5, 2**63 - 1), (1, 2, 3)),
    messages.ForwardReply(3, 1, ((1, b'{"code":0}\n'),)),
    messages.SnapshotChunk(3, 1, 9, 3, -1, 0, 100, b"\x00\xff{"),
    messages.SnapshotChunk(3, 1, 9, 3, 2, 1 << 40, 1 << 41, b"x" * 1000),
    messages.SnapshotAck(3, 2, 9, -1, 0),
    messages.SnapshotAck(3, 2, 9, 1, 1 << 20),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    env = wire.decode(wire.encode(msg, "10.0.0.1", 1111))
    assert env.msg == msg
    assert (env.client_host, env.client_port) == ("10.0.0.1", 1111)


def test_the_envelope_carries_the_senders_http_port():
    env = wire.decode(wire.encode(Heartbeat(3, 1, 5, 2, 9, 3), "10.0.0.1", 1111, 10, 8111))
    assert (env.cluster_id, env.http_port) == (10, 8111)
    assert wire.decode(wire.encode(Heartbeat(3, 1, 5, 2, 9, 3))).http_port == 0  # none said


@pytest.mark.parametrize("data", [b"", b"\xff\xff\xff", b"not protobuf at all"])
def test_garbage_is_a_value_error(data):
    with pytest.raises(ValueError):
        wire.decode(data)


def test_a_chunk_travels_as_its_bytes_and_must_be_read_first():
    chunk = messages.SnapshotChunk(3, 1, 9, 3, 0, 0, 4, b"\x00\x01\x02\x03")
    assert b"\x00\x01\x02\x03" in wire.encode(chunk)  # raw, not JSON
    with pytest.raises(TypeError):
        wire.encode(messages.SnapshotChunk(3, 1, 9, 3, 0, 0, 4, messages.FileRange("/p", 0, 4)))


def test_not_a_peer_message():
    with pytest.raises(TypeError):
        wire.encode(object())


def test_entries_travel_as_the_bytes_they_came_with():
    """An entry's data (the worker's bytes) is sent as it is, the same bytes the record encodes
    to, and a follower's entries keep what they came in (for its WAL)."""
    record = Produce(queue="q", msg_id=1, ready=1.0, ttl=2.0, retry=0.0, priority=0, data="é", delivery_count=0)
    data = encode(record)
    bare = AppendEntries(3, 1, 4, 2, (Entry(5, 3, record), Entry(6, 3, record)), 4)
    carried = AppendEntries(3, 1, 4, 2, (Entry(5, 3, record, data), Entry(6, 3, record, data)), 4)
    assert wire.encode(carried) == wire.encode(bare)
    got = wire.decode(wire.encode(carried)).msg
    assert got == bare and [bytes(e.data) for e in got.entries] == [data, data]
    # The bytes go as they are, not encoded again from the record.
    marked = AppendEntries(3, 1, 4, 2, (Entry(5, 3, record, data.replace(b'"q"', b'"r"')),), 4)
    assert wire.decode(wire.encode(marked)).msg.entries[0].record.queue == "r"


# The bytes of these messages before the envelope had a group and a placement hash (encoded by
# the wire.py and peer_pb2.py of 7674546): with one group and the default placement, a node
# sends exactly these.
TODAYS_BYTES = [
    ((Heartbeat(3, 1, 5, 2, 9, 3), "127.0.0.1", 1101, 10, 8111),
     "080310011a093132372e302e302e3120cd08280a30af3f62080805100218092003"),
    ((AppendAck(7, 2, 12345), "127.0.0.1", 1102, 10, 0), "080710021a093132372e302e302e3120ce08280a7a0308b960"),
]


@pytest.mark.parametrize("args, hex_bytes", TODAYS_BYTES, ids=["Heartbeat", "AppendAck"])
def test_group_0_and_the_default_placement_send_todays_bytes(args, hex_bytes):
    assert wire.encode(*args).hex() == hex_bytes
    assert wire.encode(*args, 0, 0).hex() == hex_bytes
    env = wire.decode(bytes.fromhex(hex_bytes))
    assert (env.group, env.placement_hash) == (0, 0)


def test_the_envelope_carries_the_group_and_the_placement_hash():
    msg = Heartbeat(3, 1, 5, 2, 9, 3)
    data = wire.encode(msg, "10.0.0.1", 1111, 10, 8111, 0xFFFFFFFF, 1023)
    env = wire.decode(data)
    assert (env.msg, env.placement_hash, env.group) == (msg, 0xFFFFFFFF, 1023)
    # A fixed32 is 4 bytes (and its tag one): a nonzero placement always costs 5 bytes.
    assert len(data) - len(wire.encode(msg, "10.0.0.1", 1111, 10, 8111, 0, 1023)) == 5
