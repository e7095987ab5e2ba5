"""Election messages between nodes, and the actions election/state.py returns.

Every peer message is a PeerMessage: it carries the sender's ``vote_id`` (the term) and ``src``
(its node_id). Each election and replication message class says who sends it (``SENDER``):
"vote" for election traffic, "leader" for messages only a leader sends, "follower" for replies to
a leader. election/state.py uses that to learn about leaders and acks from any message,
replication ones included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# ------------------------------------------------------------------ messages


@dataclass(frozen=True, slots=True)
class PeerMessage:
    """What every message between nodes carries (replication/wire.py puts it in the envelope)."""

    vote_id: int  # the sender's term
    src: int  # the sender's node_id


@dataclass(frozen=True, slots=True)
class VoteRequest(PeerMessage):
    """A candidate asks for a vote in term vote_id; its log ends at (last_vote_id, last_trans_id).

    With pre_vote, vote_id is the term the sender WOULD start; nobody changes term for it."""

    SENDER: ClassVar[str] = "vote"
    last_trans_id: int
    last_vote_id: int
    pre_vote: bool = False
    # Asked for by the leader (TimeoutNow): voters grant it even while they hear from that
    # leader (its lease), since the leader is handing over.
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class VoteReply(PeerMessage):
    """A vote (granted or not). vote_id is the request's term when granted, else the voter's."""

    SENDER: ClassVar[str] = "vote"
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class Heartbeat(PeerMessage):
    """The leader is alive. Its log ends at (last_trans_id, last_vote_id) and is committed up to
    commit_trans_id, whose entry has commit_vote_id (a follower holding that same entry may commit
    up to it)."""

    SENDER: ClassVar[str] = "leader"
    commit_trans_id: int
    commit_vote_id: int
    last_trans_id: int
    last_vote_id: int


@dataclass(frozen=True, slots=True)
class HeartbeatAck(PeerMessage):
    """A follower's answer to a heartbeat (or to any message from a stale leader), with where its
    log ends."""

    SENDER: ClassVar[str] = "follower"
    last_trans_id: int
    last_vote_id: int


@dataclass(frozen=True, slots=True)
class TimeoutNow(PeerMessage):
    """Leader -> the follower it hands leadership to (whose log equals the leader's): start an
    election at once, without pre-vote, in the term after vote_id."""

    SENDER: ClassVar[str] = "vote"


# ------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class Send:
    """Send msg to node `to`."""

    to: int
    msg: object


@dataclass(frozen=True, slots=True)
class PersistVote:
    """The durable election state changed: store it before sending any later message."""

    vote_id: int
    voted_for: int | None


@dataclass(frozen=True, slots=True)
class BecomeLeader:
    """This node leads term vote_id: it may accept writes (append to the log)."""

    vote_id: int


@dataclass(frozen=True, slots=True)
class BecomeFollower:
    """This node is not (or no longer) the leader: stop accepting writes. leader_id is the
    current leader if known."""

    vote_id: int
    leader_id: int | None


@dataclass(frozen=True, slots=True)
class TransferAborted:
    """A leadership transfer to `target` did not finish by its deadline: this node still leads
    and may accept writes again."""

    target: int


@dataclass(frozen=True, slots=True)
class BecomeCandidate:
    """This node started an election for term vote_id (pre_vote: only probing); it knows no
    leader and accepts no writes."""

    vote_id: int
    pre_vote: bool
