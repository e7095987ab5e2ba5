"""Replication messages between nodes and the actions the replication cores return.

Like the election messages each is a PeerMessage (the sender's term ``vote_id`` and ``src``) and
says who sends it (``SENDER``), so that election/state.py learns about leaders and acks from them too.
replication/wire.py puts them on the wire (protobuf).
A node hands a replication message to its replication core only when the message's vote_id equals
its own vote_id after the election has seen the message.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from queue_server.election.messages import PeerMessage, Send
from queue_server.protocol.snapshot_frames import Frame
from queue_server.replication.log import Entry

__all__ = [
    "AppendAck",
    "AppendEntries",
    "ApplySnapshot",
    "Commit",
    "Discarded",
    "Forward",
    "ForwardReply",
    "GiveBack",
    "InstallSnapshot",
    "Pull",
    "ReadLog",
    "Recovered",
    "Send",
    "SendChunk",
    "SendSnapshot",
    "SnapshotAck",
    "SnapshotChunk",
    "SnapshotStaged",
    "WriteChunk",
]


# ------------------------------------------------------------------ messages


@dataclass(frozen=True, slots=True)
class AppendEntries(PeerMessage):
    """Leader -> follower: entries that follow (prev_trans_id, prev_vote_id) in the leader's log
    (a push of new entries, or a catch-up batch), and the leader's commit point."""

    SENDER: ClassVar[str] = "leader"
    prev_trans_id: int
    prev_vote_id: int
    entries: tuple[Entry, ...]
    commit_trans_id: int


@dataclass(frozen=True, slots=True)
class AppendAck(PeerMessage):
    """Follower -> leader: the follower's log equals the leader's up to match_trans_id."""

    SENDER: ClassVar[str] = "follower"
    match_trans_id: int


@dataclass(frozen=True, slots=True)
class Pull(PeerMessage):
    """Follower -> leader: send me what follows my entry (last_trans_id, last_vote_id) -- my last
    one, or where a rejected push suggests our logs may still agree. Entries up to
    commit_trans_id are known to be the leader's."""

    SENDER: ClassVar[str] = "follower"
    last_trans_id: int
    last_vote_id: int
    commit_trans_id: int


@dataclass(frozen=True, slots=True)
class InstallSnapshot(PeerMessage):
    """Leader -> follower: the whole state as of (trans_id, trans_vote_id), a committed point.
    `data` is opaque here (the process builds and applies it)."""

    SENDER: ClassVar[str] = "leader"
    trans_id: int
    trans_vote_id: int
    data: object


@dataclass(frozen=True, slots=True)
class SnapshotChunk(PeerMessage):
    """Leader -> follower: `data` is the bytes at `offset` of one file of the leader's snapshot
    on disk as of (trans_id, trans_vote_id), a committed point: part -1 is its manifest, part i
    its i-th part file, `total` that file's size. While the leader decides, `data` is a FileRange
    (what to read); the coordinator reads the bytes when it encodes the message."""

    SENDER: ClassVar[str] = "leader"
    trans_id: int
    trans_vote_id: int
    part: int
    offset: int
    total: int
    data: bytes | FileRange


@dataclass(frozen=True, slots=True)
class SnapshotAck(PeerMessage):
    """Follower -> leader: every chunk of the snapshot at trans_id before (part, offset) is
    written to its disk."""

    SENDER: ClassVar[str] = "follower"
    trans_id: int
    part: int
    offset: int


class FileRange(NamedTuple):
    """`length` bytes at `offset` of the file at `path`: a chunk not read yet."""

    path: str
    offset: int
    length: int


# ------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class Commit:
    """The log is committed up to trans_id; `entries` are the newly committed ones, oldest first
    (taken before the log may drop them). A follower applies them; a leader may now answer the
    clients whose writes are at or below trans_id."""

    trans_id: int
    entries: tuple[Entry, ...] = ()


@dataclass(frozen=True, slots=True)
class SendSnapshot:
    """Leader: follower `to` needs entries the log no longer keeps. Send it an InstallSnapshot
    of the state at a committed point (at or after log.base_trans_id)."""

    to: int


@dataclass(frozen=True, slots=True)
class ReadLog:
    """Leader: follower `to` needs entries after `after` that the log no longer keeps but the
    WAL does. Read at most `limit` of them (and about `max_bytes`, at least one), with the frame
    of `after` itself for its vote_id, and give them to ClusterNode.on_log_read."""

    to: int
    after: int
    limit: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class SendChunk:
    """Leader: send follower `to` the chunk (part, offset, length) of the snapshot being streamed
    to it (replication/transfer.py SnapshotSend has the files)."""

    to: int
    trans_id: int
    part: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class WriteChunk:
    """Follower: write `data` at `offset` of file `part` (-1: the manifest) of the snapshot at
    trans_id being received, before the SnapshotAck that follows leaves."""

    trans_id: int
    part: int
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class SnapshotStaged:
    """Follower: every file of the snapshot at (trans_id, vote_id) is written (`manifest`: the
    leader's). Check and install it; then ClusterNode.on_snapshot_installed."""

    trans_id: int
    vote_id: int
    manifest: dict


@dataclass(frozen=True, slots=True)
class ApplySnapshot:
    """Follower: replace the whole state with the snapshot's data. The log was reset to
    (trans_id, vote_id), which is now committed and applied (no Commit follows for it)."""

    trans_id: int
    vote_id: int
    data: object


@dataclass(frozen=True, slots=True)
class Discarded:
    """Follower: uncommitted entries were dropped from the log because the leader's history
    differs. A node that had already applied them (it was a leader) must rebuild its state."""

    entries: tuple[Entry, ...]


# ------------------------------------------------------------------ forwarding


@dataclass(frozen=True, slots=True)
class Forward(PeerMessage):
    """Follower -> leader: client requests to serve, each (forward id, request, came over UDP)."""

    requests: tuple[tuple[int, bytes, bool], ...]


@dataclass(frozen=True, slots=True)
class ForwardReply(PeerMessage):
    """Leader -> follower: the replies to forwarded requests, by forward id."""

    replies: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class GiveBack(PeerMessage):
    """Follower -> leader: messages of a consume reply that could not be delivered."""

    queue: str
    msg_ids: tuple[int, ...]
    delivery_counts: tuple[int, ...]  # of the undelivered delivery, one per msg_id

    @classmethod
    def of(cls, vote_id: int, src: int, queue: str, given: list[list[int]]) -> "GiveBack":
        """The give-back of `given` ([msg_id, delivery_count] each) of `queue`."""
        return cls(vote_id, src, queue, tuple(m[0] for m in given), tuple(m[1] for m in given))


# ------------------------------------------------------------------ recovery


@dataclass
class Recovered:
    """What a node finds on its disk at start."""

    trans_id: int = 0  # the snapshot's point (0: none)
    vote_id: int = 0
    state: dict = field(default_factory=dict)  # queue name -> queue snapshot (a v1 snapshot, or a test's)
    entries: list[Entry] = field(default_factory=list)  # the log after the snapshot
    vote: tuple[int, int | None] = (0, None)
    manifest: dict | None = None  # the v2 snapshot's manifest (replication/snapshot.py)
    # The v2 snapshot's queue frames (kind, queue name, body), read from its checked parts as
    # they are consumed: once (PartitionService.load_frames).
    frames: Iterable[Frame] | None = None
    parts: tuple[str, ...] = ()  # the v2 snapshot's part files (the workers LOAD them)
