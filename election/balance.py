"""Leaders spread over the nodes: each queue group has a preferred leader (the first of its replica
set, protocol/placement.py), and the default placement makes every node the preferred leader of
its fair share of groups. Whoever wins a group's election leads it first; once the preferred
leader is up and has kept up with the group's log for BALANCE_SETTLE seconds, the leader hands it
the leadership (the hand-off of a stopping node: server/group_node.py begin_handoff), so that the
group is never without a leader. Pure: the caller gives the time and the followers' progress."""
from __future__ import annotations

from collections.abc import Mapping

# How long the preferred leader must have been caught up before leadership moves to it: a node
# just back replays and catches up first, and a flapping one never gets a group.
BALANCE_SETTLE = 5.0
# How far behind the leader's log the preferred leader may be and still count as caught up (the
# transfer itself waits until its log equals the leader's, with new writes held meanwhile).
BALANCE_LAG = 1000


class Balance:
    """Decides when this node, leading one group, should hand it to the group's preferred leader."""

    def __init__(self, node_id: int, preferred: int | None, settle: float = BALANCE_SETTLE,
                 lag: int = BALANCE_LAG) -> None:
        """preferred: the group's preferred leader (None: the group has none)."""
        self.node_id = node_id
        self.preferred = preferred
        self.settle = settle
        self.lag = lag
        self.caught_up_since: float | None = None  # since when the preferred leader has kept up

    def check(self, now: float, leading: bool, last_trans_id: int, matches: Mapping[int, int],
              live: bool, busy: bool) -> int | None:
        """The node to hand this group's leadership to now, or None. leading: this node leads the
        group; matches: each follower's acknowledged log position; live: the preferred leader
        answered within an election timeout; busy: a hand-off (of any group of this node) is
        under way, and the node moves one group at a time."""
        preferred = self.preferred
        if not leading or preferred is None or preferred == self.node_id:
            self.caught_up_since = None
            return None
        if not live or matches.get(preferred, 0) < last_trans_id - self.lag:
            self.caught_up_since = None
            return None
        if self.caught_up_since is None:
            self.caught_up_since = now
        if busy or now - self.caught_up_since < self.settle:
            return None
        self.caught_up_since = None
        return preferred
