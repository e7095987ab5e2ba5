"""Which node leads each queue group, as a client knows it (issue 28): learnt from action 8
without a queue (the cluster's placement and each group's leader), moved by redirects, and
forgotten for a group whose leader failed until the client asks again. A request about a queue
then goes straight to its group's leader instead of through a node that forwards it.

Pure: replies in, addresses out; the clients ask and connect (client/sync.py, client/failover.py).
"""
from __future__ import annotations

from typing import Any

from queue_server.protocol.placement import Placement

from . import protocol as p
from .protocol import Address

# After a group's leader failed, the client asks the cluster again this long after (meanwhile its
# requests go to any node, which forwards them).
REFRESH_AFTER = 1.0


class GroupLeaders:
    """The placement of queues in groups, and the leader of each group that is known."""

    def __init__(self, placement: Placement, leaders: dict[int, Address]) -> None:
        self.placement = placement
        self.leaders = leaders
        self.refresh_at: float | None = None  # when to ask again (a leader was forgotten)

    @classmethod
    def from_reply(cls, reply: dict[str, Any], current_host: str) -> GroupLeaders | None:
        """From action 8's reply (without a queue); None when the cluster has one group (no
        `placement`) or says nothing usable. A leader listening on every interface is taken
        at the address of the node that answered (`current_host`), as a redirect is."""
        described, rows = reply.get("placement"), reply.get("groups")
        if not isinstance(described, dict) or not isinstance(rows, list):
            return None
        try:
            placement = Placement.from_dict(described)
        except ValueError:
            return None
        if placement.queue_groups < 2:
            return None
        leaders: dict[int, Address] = {}
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("group"), int) and row.get("leader_node_id"):
                target = p.redirect_target(row, current_host)
                if target is not None:
                    leaders[row["group"]] = target
        return cls(placement, leaders)

    def leader_of(self, req: dict[str, Any]) -> Address | None:
        """Where a request about one queue goes: its group's leader, if known."""
        queue = req.get("queue")
        if type(queue) is not str:
            return None
        return self.leaders.get(self.placement.group_of(queue))

    def moved(self, req: dict[str, Any], target: Address) -> None:
        """A redirect for this request named its group's leader."""
        self.leaders[self.placement.group_of(req["queue"])] = target

    def failed(self, req: dict[str, Any], addr: Address, now: float) -> None:
        """The leader this request was sent to failed it (unreachable, or no longer leading):
        forget it; ask again after REFRESH_AFTER."""
        group = self.placement.group_of(req["queue"])
        if self.leaders.get(group) == addr:
            del self.leaders[group]
        if self.refresh_at is None:
            self.refresh_at = now + REFRESH_AFTER

    def due(self, now: float) -> bool:
        """Whether to ask the cluster again (a leader was forgotten a while ago)."""
        return self.refresh_at is not None and now >= self.refresh_at


class LeaderLookup:
    """When a client asks the cluster where each group's leader is (action 8 without a queue):
    before its first request about a queue, and again REFRESH_AFTER a leader was forgotten. A
    client of one host sends everything there and never asks; nor does one that found the
    cluster has one group. One ask at a time (the async client's calls made meanwhile wait for
    its answer)."""

    def __init__(self, hosts: int) -> None:
        self.ask_at = 0.0 if hosts > 1 else float("inf")

    def due(self, req: dict[str, Any], groups: GroupLeaders | None, now: float) -> bool:
        """Whether to ask now, before sending `req`; if so the ask has begun: its reply makes the
        route's GroupLeaders (from_reply), or no node answered (unanswered)."""
        if type(req.get("queue")) is not str:
            return False
        if now < self.ask_at and (groups is None or not groups.due(now)):
            return False
        self.ask_at = float("inf")
        if groups is not None:
            groups.refresh_at = None
        return True

    def unanswered(self, now: float) -> None:
        """No node answered the ask: again after REFRESH_AFTER (the request about the queue
        finds out why)."""
        self.ask_at = now + REFRESH_AFTER
