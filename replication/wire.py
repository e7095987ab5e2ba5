"""The peer wire: election and replication messages (and forwarded client requests) to and from
protobuf bytes (replication/peer.proto). Records and InstallSnapshot's state travel as their JSON
inside it, a SnapshotChunk's bytes as they are."""
from __future__ import annotations

from dataclasses import dataclass, fields

import orjson

from queue_server.election.messages import (
    Heartbeat, HeartbeatAck, PeerMessage, TimeoutNow, VoteReply, VoteRequest,
)
from queue_server.replication import peer_pb2 as pb
from queue_server.replication.log import Entry
from queue_server.protocol.records import decode_many, each_encoded, join_encoded
from queue_server.replication.messages import (
    AppendAck, AppendEntries, Forward, ForwardReply, GiveBack, InstallSnapshot, Pull, SnapshotAck, SnapshotChunk,
)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded peer message with its sender's client address, cluster id (node_type),
    http_port (0: HTTP off, or not said), placement hash (protocol/placement.py
    `Placement.wire_hash`; 0: the default placement) and the queue group it is about."""

    msg: object
    client_host: str
    client_port: int
    cluster_id: int = 0
    http_port: int = 0
    placement_hash: int = 0
    group: int = 0


# Each message class and its field in the protobuf pb.PeerMessage's `body` oneof.
_BODIES: dict[type, str] = {
    VoteRequest: "vote_request",
    VoteReply: "vote_reply",
    Heartbeat: "heartbeat",
    HeartbeatAck: "heartbeat_ack",
    AppendEntries: "append_entries",
    AppendAck: "append_ack",
    Pull: "pull",
    InstallSnapshot: "install_snapshot",
    Forward: "forward",
    ForwardReply: "forward_reply",
    GiveBack: "give_back",
    TimeoutNow: "timeout_now",
    SnapshotChunk: "snapshot_chunk",
    SnapshotAck: "snapshot_ack",
}
_CLASSES = {name: cls for cls, name in _BODIES.items()}
# The fields of each class but PeerMessage's, which the envelope carries.
_FIELDS = {cls: [f.name for f in fields(cls)][len(fields(PeerMessage)):] for cls in _BODIES}


def encode(msg: object, client_host: str = "", client_port: int = 0, cluster_id: int = 0, http_port: int = 0,
           placement_hash: int = 0, group: int = 0) -> bytes:
    """The protobuf bytes of a peer message about queue group `group` from a node of cluster
    `cluster_id` (node_type) with placement `placement_hash`, whose clients reach it on
    client_host:client_port, and its HTTP API on http_port. Zeros are left off the wire."""
    name = _BODIES.get(type(msg))
    if name is None:
        raise TypeError(f"not a peer message: {type(msg).__name__}")
    out = pb.PeerMessage(vote_id=msg.vote_id, src=msg.src, client_host=client_host, client_port=client_port,
                         cluster_id=cluster_id, http_port=http_port, group=group, placement_hash=placement_hash)
    body = getattr(out, name)
    body.SetInParent()
    dumps = orjson.dumps
    for field in _FIELDS[type(msg)]:
        value = getattr(msg, field)
        if field == "entries":
            body.vote_ids.extend([e.vote_id for e in value])
            body.records = join_encoded([e.encoded() for e in value])
        elif field == "data":
            body.data = value if type(msg) is SnapshotChunk else dumps(value)
        elif field == "requests":
            body.requests.extend(pb.ForwardedRequest(forward_id=i, request=r, udp=u) for i, r, u in value)
        elif field == "replies":
            body.replies.extend(pb.ForwardedReply(forward_id=i, reply=r) for i, r in value)
        elif field in ("msg_ids", "delivery_counts"):
            getattr(body, field).extend(value)
        else:
            setattr(body, field, value)
    return out.SerializeToString()


def decode(data: bytes) -> Envelope:
    """The peer message in `data`. Raises ValueError if it is not one."""
    m = pb.PeerMessage()
    try:
        m.ParseFromString(data)
        name = m.WhichOneof("body")
        cls = _CLASSES[name]
        body = getattr(m, name)
        loads = orjson.loads
        values = []
        for field in _FIELDS[cls]:
            value = getattr(body, field, None)
            if field == "entries":
                records = decode_many(body.records) if body.records else []
                if len(records) != len(body.vote_ids):
                    raise ValueError("entries: records and vote_ids differ in length")
                first = body.prev_trans_id + 1
                value = tuple(map(Entry, range(first, first + len(records)), body.vote_ids, records,
                                  each_encoded(body.records) if records else ()))
            elif field == "data":
                value = value if cls is SnapshotChunk else loads(value)
            elif field == "requests":
                value = tuple((r.forward_id, r.request, r.udp) for r in value)
            elif field == "replies":
                value = tuple((r.forward_id, r.reply) for r in value)
            elif field in ("msg_ids", "delivery_counts"):
                value = tuple(value)
            values.append(value)
        msg = cls(m.vote_id, m.src, *values)
    except Exception as exc:  # protobuf's DecodeError, a missing body, bad JSON inside
        raise ValueError(f"bad peer message: {exc!r}") from None
    return Envelope(msg, m.client_host, m.client_port, m.cluster_id, m.http_port, m.placement_hash, m.group)
