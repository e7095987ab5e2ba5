"""A node's role: one type for the election, the node's status, the acceptor and the metrics.

The election moves a node between FOLLOWER, PRE_CANDIDATE, CANDIDATE and LEADER. What a node
reports of itself (its STATUS to the acceptor, `monitor`, /readyz) is LEADER, FOLLOWER (of a
leader it knows) or NONE (it knows of no leader: it is campaigning, or lost its leader). The
values are the strings that cross the wire; a Role compares equal to its string.
"""
from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """A role, as the election holds it and as the node reports it."""

    LEADER = "leader"
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    NONE = "none"  # reported only: no leader known

    def __str__(self) -> str:
        return self.value


# The roles a node reports (ClusterNode.role, STATUS): a node that serves or forwards, or NONE.
SERVING = (Role.LEADER, Role.FOLLOWER)
# The roles the metrics publish (queue_server_role), one gauge each.
METRIC_ROLES = (Role.LEADER, Role.FOLLOWER, Role.CANDIDATE)
