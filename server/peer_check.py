"""Whether a peer message may be acted on: its `src` is another configured node, the node that
authenticated the connection (CURVE, server/peer_keys.py) is that node, it comes from this
cluster (node_type), and its sender places the queue groups as this node does; and the names of every reason a peer is refused for. Pure: the caller drops
what this refuses and counts it by reason."""
from __future__ import annotations

from collections.abc import Collection

UNKNOWN_SRC = "unknown_src"
NOT_SENDER = "src_not_sender"
OTHER_CLUSTER = "other_cluster"
OTHER_PLACEMENT = "other_placement"
REASONS = (UNKNOWN_SRC, NOT_SENDER, OTHER_CLUSTER, OTHER_PLACEMENT)
BAD_KEY = "bad_key"  # a peer connection refused by CURVE: not a cluster key (server/peer_keys.py)
REJECTIONS = (*REASONS, BAD_KEY)  # every reason counted in queue_server_peer_rejected_total


def peer_rejection(src: int, sender: int | None, cluster_id: int, *, peers: Collection[int],
                   my_cluster: int, authenticated: bool, placement_hash: int = 0,
                   my_placement: int = 0) -> str | None:
    """Why a message claiming to come from node `src` is refused (one of REASONS), or None.

    sender: the node whose key authenticated the connection (None: unknown). With
    `authenticated` (the peer wire runs CURVE) a message passes only if sender is src; without
    it (insecure_peers, or a loopback cluster without a secret) the sender is not checked.
    placement_hash, my_placement: the sender's and this node's `Placement.wire_hash`
    (protocol/placement.py): nodes that put queues in different groups cannot replicate them."""
    if src not in peers:
        return UNKNOWN_SRC
    if authenticated and sender != src:
        return NOT_SENDER
    if cluster_id != my_cluster:
        return OTHER_CLUSTER
    if placement_hash != my_placement:
        return OTHER_PLACEMENT
    return None
