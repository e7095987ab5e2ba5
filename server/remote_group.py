"""A queue group this node is no replica of, free of I/O: who leads it, as its leader's
heartbeats say (a leader sends them to the non-replicas of its group as to its followers), and
the client requests this node forwarded there. ClusterNode (server/cluster.py) holds one per such
group; its requests go to the group's leader through the Forwarding here, as a follower's do."""
from __future__ import annotations

from queue_server.election.messages import Heartbeat
from queue_server.protocol.roles import Role
from queue_server.server.forwarding import Forwarding

# A leader not heard from for this many election timeouts is no longer taken for the leader:
# requests of its group are then answered "no leader" until a leader is heard.
LEADER_HEARD_FOR = 3
_NEVER = float("inf")


class RemoteGroup:
    """Group `group`, replicated on `members` (this node not among them)."""

    def __init__(self, group: int, members: tuple[int, ...], forwarding: Forwarding, election_timeout: float) -> None:
        self.group = group
        self.members = members
        self.forwarding = forwarding
        self.leader_id: int | None = None
        self.vote_id = 0  # the term of the leader last heard
        self.heard_until = _NEVER
        self.leader_for = LEADER_HEARD_FOR * election_timeout
        self.to_peers: list[tuple[int, object]] = []  # (node id, message), taken by the node's Ready

    @property
    def role(self) -> Role:
        """What a non-replica is to the group: it passes requests on (FOLLOWER) while it knows
        the leader, as a follower does; NONE otherwise."""
        return Role.FOLLOWER if self.leader_id is not None else Role.NONE

    def on_heartbeat(self, msg: Heartbeat, now: float) -> None:
        """The group's leader in msg.vote_id says it is alive. A leader of an older term than the
        one last heard is not taken; a new leader's arrival sends it what waited for the old."""
        if msg.vote_id < self.vote_id or msg.src not in self.members:
            return
        changed = msg.src != self.leader_id
        self.leader_id, self.vote_id = msg.src, msg.vote_id
        self.heard_until = now + self.leader_for
        if changed:
            self.forwarding.orphan(now)

    def tick(self, now: float) -> list:
        """Forget a leader not heard from; what the Forwarding has to do now (server/forwarding.py)."""
        if self.leader_id is not None and now >= self.heard_until:
            self.leader_id, self.heard_until = None, _NEVER
        return self.forwarding.tick(now, self.leader_id, self.vote_id)

    def wake_at(self) -> float:
        """When tick() next has something to do."""
        return min(self.heard_until, self.forwarding.wake_at())
