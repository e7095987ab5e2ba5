"""What a node says of itself, free of I/O: the status its coordinator tells the acceptor (each
group's role, leader and workers' mode: where the acceptor sends a request) and the node's fields
in a monitor reply (its log, election, followers and groups). Read from a ClusterNode
(server/cluster.py), which sends them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from queue_server.server.group_node import FOLLOWER, LEADER, NONE, GroupNode

if TYPE_CHECKING:
    from queue_server.server.cluster import ClusterNode
    from queue_server.server.remote_group import RemoteGroup


def status_fields(node: ClusterNode) -> dict:
    """The role and the leader's client address (of the node's first group), as the acceptor
    needs them; with queue groups, each group's too (`groups`: [{"group", role, leader_*, epoch}])."""
    fields = {**view(node, node.first), "http_ports": node.http_ports}
    if node.grouped:
        fields["groups"] = [{"group": g, **view(node, group)}
                            for g, group in sorted({**node.groups, **node.remote}.items())]
    return fields


def view(node: ClusterNode, group: GroupNode | RemoteGroup) -> dict:
    """`group`'s role, leader and its client address, and its workers' mode. While this leader
    hands over, and after it stepped down until the new leader is heard, its acceptor sees a
    follower of this node: it passes every request here (held until the new leader is known)
    instead of to the workers, and answers no "no leader" meanwhile. A group the node is no
    replica of is followed: its requests go to its leader."""
    role = group.role
    if type(group) is GroupNode:
        leader = group.election.leader_id
        if (role == LEADER and group.election.transfer_target is not None) or (
                role == NONE and group.handoff_until is not None):
            role, leader = FOLLOWER, node.node_id
        epoch = group.epoch
    else:
        leader, epoch = group.leader_id, 0
    host, port = node.clients.get(leader, ("", 0)) if leader is not None else ("", 0)
    return {"role": role, "leader_node_id": leader or 0, "leader_host": host, "leader_port": port, "epoch": epoch}


def leader_fields(node: ClusterNode, group: GroupNode | RemoteGroup) -> dict:
    """The leader_* fields of a reply that points at `group`'s leader."""
    return {k: v for k, v in view(node, group).items() if k.startswith("leader_")}


def node_fields(node: ClusterNode) -> dict:
    """This node's own fields in a monitor reply (of its first group's log and election)."""
    group = node.first
    return {
        "node_id": node.node_id,
        "leader_node_id": group.election.leader_id or 0,
        "trans_id": group.log.last_trans_id,
        "commit_trans_id": group.log.commit_trans_id,
        "log_size": len(group.log),
        "max_log_size": node.config.queue_log_size,
        "role": group.role,
        "vote_id": group.election.vote_id,
        **_followers(node),
        **_group_rows(node),
    }


def _group_rows(node: ClusterNode) -> dict:
    """With queue groups: {"groups": [{group, leader_node_id, role, trans_id, commit_trans_id,
    replicas}, ...]}, one row per group (role "none", and no log, for a group this node is no
    replica of); nothing with one group."""
    if not node.grouped:
        return {}
    rows = [{"group": g, "leader_node_id": group.election.leader_id or 0, "role": group.role,
             "trans_id": group.log.last_trans_id, "commit_trans_id": group.log.commit_trans_id,
             "replicas": list(group.members)} for g, group in node.groups.items()]
    rows += [{"group": g, "leader_node_id": remote.leader_id or 0, "role": NONE, "trans_id": 0,
              "commit_trans_id": 0, "replicas": list(remote.members)} for g, remote in node.remote.items()]
    return {"groups": sorted(rows, key=lambda row: row["group"])}


def _followers(node: ClusterNode) -> dict:
    """On a leader (of the node's first group), each follower's replication state:
    {"followers": [{node_id, match_trans_id, lag, client_host, client_port}, ...]}; nothing on
    other nodes."""
    group = node.first
    if group.leader is None:
        return {}
    last = group.log.last_trans_id
    rows = []
    clients = node.clients
    for peer in sorted(group.election.peers):
        match = group.leader.match_of(peer)
        host, port = clients.get(peer, ("", 0))
        rows.append({"node_id": peer, "match_trans_id": match, "lag": max(0, last - match),
                     "client_host": host, "client_port": port})
    return {"followers": rows}
