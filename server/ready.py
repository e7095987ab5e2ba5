"""Ready: everything ClusterNode (server/cluster.py) decided since the coordinator last carried
out its decisions, as one value, in the spirit of etcd raft's Ready/Advance. The coordinator
persists first (the log, then the vote), then sends, then calls ClusterNode.advance: nothing that
depends on a record leaves before the record is on disk, and replies that waited for the disk
come in the next Ready."""
from __future__ import annotations

from typing import NamedTuple

from queue_server.election.messages import HeartbeatAck
from queue_server.replication.messages import AppendAck
from queue_server.protocol.roles import Role

# Peer messages that tell the leader how far this node's log reaches: not sent while the disk
# refuses the log.
CLAIMS_LOG = (AppendAck, HeartbeatAck)


class Outbox:
    """The messages a node and its groups decided to send, in the order decided, until a Ready
    takes them (ClusterNode.ready) and advance drops what it carried."""

    __slots__ = ("workers", "acceptor", "peers")

    def __init__(self) -> None:
        self.workers: list[tuple[int, list[bytes]]] = []  # (worker index, frames)
        self.acceptor: list[list[bytes]] = []  # frames
        self.peers: list[tuple[int, object]] = []  # (node id, peer message)


def peer_messages(to_peers: tuple[tuple[int, object], ...], log_stored: bool,
                  vote_stored: bool) -> tuple[tuple[int, object], ...]:
    """The peer messages that may go once persisting is done: none if the vote could not be
    stored (a vote not on disk must not be acted on), and none that claim the log if it could
    not be written."""
    if not vote_stored:
        return ()
    if not log_stored:
        return tuple((to, m) for to, m in to_peers if type(m) not in CLAIMS_LOG)
    return to_peers


class GroupPart(NamedTuple):
    """A queue group's part of a Ready (a group other than 0): its log, vote, role and snapshot
    files, and its peer messages (sent with the group on the wire); fields as in Ready."""

    group: int
    log_through: int
    truncate_after: int | None
    vote: tuple[int, int | None] | None
    to_peers: tuple[tuple[int, object], ...]
    role: Role | None
    snapshots: tuple
    chunk_writes: tuple
    staged: tuple

    def peer_messages(self, log_stored: bool, vote_stored: bool) -> tuple[tuple[int, object], ...]:
        """As Ready.peer_messages."""
        return peer_messages(self.to_peers, log_stored, vote_stored)


class Ready(NamedTuple):
    """What to persist and send, in that order. (A NamedTuple, not a frozen dataclass: one is
    made per flush, and a frozen dataclass's __init__ cost 2.3 us of it.)"""

    log_through: int  # the log must be on disk up to this trans_id ...
    truncate_after: int | None  # ... after dropping what follows this one (-1: restart after a snapshot)
    vote: tuple[int, int | None] | None  # (vote_id, voted_for) to store before any peer message
    to_workers: tuple[tuple[int, list[bytes]], ...]  # (worker index, frames), in order
    to_acceptor: tuple[list[bytes], ...]  # frames, in order
    to_peers: tuple[tuple[int, object], ...]  # (node id, peer message)
    role: Role | None  # the node's role when it changed since the last Ready, else None
    snapshots: tuple = ()  # server/snapshots.py Publish / Failed / Clear: cuts to publish or clear away
    # A snapshot streamed from the leader: WriteChunks to write before the SnapshotAcks in
    # to_peers leave, then SnapshotStaged (every file written) to check and install; or an old
    # leader's whole snapshot (ApplySnapshot) to write as files, then load.
    chunk_writes: tuple = ()
    staged: tuple = ()
    # The same of every other queue group that has something (GroupPart each): the fields
    # above are group 0's, as its files are the data dir's own and its messages the wire's default.
    parts: tuple = ()
    # The messages of the groups this node is no replica of (server/remote_group.py): (group,
    # node id, peer message) each; nothing to persist before them.
    remote: tuple = ()

    def needs_write(self, written_through: int | None) -> bool:
        """Whether carrying it out must write to disk, after this flush wrote the log up to
        written_through (None: nothing written yet, and the log may be due for an fsync). A Ready
        that only sends what the last write released needs none."""
        return (written_through is None or self.log_through != written_through or self.vote is not None
                or self.truncate_after is not None)

    def peer_messages(self, log_stored: bool, vote_stored: bool) -> tuple[tuple[int, object], ...]:
        """The peer messages that may go once persisting is done (see peer_messages)."""
        return peer_messages(self.to_peers, log_stored, vote_stored)
