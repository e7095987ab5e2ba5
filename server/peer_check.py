"""Whether a peer message may be acted on: its `src` is another configured node, the node that
authenticated the connection (CURVE, server/peer_keys.py) is that node, and it comes from this
cluster (node_type); and the names of every reason a peer is refused for. Pure: the caller drops
what this refuses and counts it by reason."""
from __future__ import annotations

from collections.abc import Collection

UNKNOWN_SRC = "unknown_src"
NOT_SENDER = "src_not_sender"
OTHER_CLUSTER = "other_cluster"
REASONS = (UNKNOWN_SRC, NOT_SENDER, OTHER_CLUSTER)
BAD_KEY = "bad_key"  # a peer connection refused by CURVE: not a cluster key (server/peer_keys.py)
REJECTIONS = (*REASONS, BAD_KEY)  # every reason counted in queue_server_peer_rejected_total


def peer_rejection(src: int, sender: int | None, cluster_id: int, *, peers: Collection[int],
                   my_cluster: int, authenticated: bool) -> str | None:
    """Why a message claiming to come from node `src` is refused (one of REASONS), or None.

    sender: the node whose key authenticated the connection (None: unknown). With
    `authenticated` (the peer wire runs CURVE) a message passes only if sender is src; without
    it (insecure_peers, or a loopback cluster without a secret) the sender is not checked."""
    if src not in peers:
        return UNKNOWN_SRC
    if authenticated and sender != src:
        return NOT_SENDER
    if cluster_id != my_cluster:
        return OTHER_CLUSTER
    return None
