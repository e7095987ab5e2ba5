"""What a node last heard from each peer, and the line it logs every REPORT_EVERY seconds while
it knows no leader (it cannot reach a majority, or an election keeps failing), naming the peers
it does not hear. Pure: the time comes in as an argument."""
from __future__ import annotations

from queue_server.election.membership import majority

REPORT_EVERY = 10.0
QUIET_AFTER = 1.0  # a peer not heard from for this long counts as unreachable in the report


class Reachability:
    """Last contact per peer, for the operator."""

    def __init__(self, peers: dict[int, str], started: float) -> None:
        """peers: node id -> its internal address, as configured."""
        self.peers = peers
        self.last: dict[int, tuple[float, str]] = {}  # node id -> (when, message kind)
        self.no_leader_since: float | None = started
        self.next_report = started + REPORT_EVERY

    def heard(self, src: int, kind: str, now: float) -> None:
        if src in self.peers:
            self.last[src] = (now, kind)

    def report(self, leader_known: bool, now: float) -> str | None:
        """The line to log now, if any: every REPORT_EVERY seconds without a leader."""
        if leader_known:
            self.no_leader_since = None
            return None
        if self.no_leader_since is None:
            self.no_leader_since = now
            self.next_report = now + REPORT_EVERY
        if now < self.next_report:
            return None
        self.next_report = now + REPORT_EVERY
        parts = []
        for node_id, address in sorted(self.peers.items()):
            seen = self.last.get(node_id)
            if seen is None:
                parts.append(f"node {node_id} ({address}) never heard from")
            elif now - seen[0] > QUIET_AFTER:
                parts.append(f"node {node_id} ({address}) last heard {now - seen[0]:.1f} s ago ({seen[1]})")
        reachable = len(self.peers) - len(parts)
        unreachable = "; ".join(parts) if parts else "every peer answers (an election is under way)"
        return (f"no leader for {now - self.no_leader_since:.0f} s: {reachable + 1} of "
                f"{len(self.peers) + 1} nodes reachable, a majority is {majority(len(self.peers) + 1)}; "
                f"{unreachable}")
