"""Who is in the cluster and how many of it make a majority."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Membership(NamedTuple):
    """One node's view of the cluster: every node_id sorted (its own included), the others, and
    the quorum (a majority of the whole cluster)."""

    members: tuple[int, ...]
    peers: tuple[int, ...]
    quorum: int


def majority(size: int) -> int:
    """How many nodes of a cluster of `size` make a majority."""
    return size // 2 + 1


def membership(node_id: int, members: Iterable[int]) -> Membership:
    """The cluster of `members` with node_id in it, as node_id sees it."""
    everyone = tuple(sorted(set(members) | {node_id}))
    return Membership(everyone, tuple(m for m in everyone if m != node_id), majority(len(everyone)))
