"""Where a queue lives: its routing key, its queue group, the group's replica set and preferred
leader, and the worker that holds it on each replica. The same on every node and in the clients
(they learn the parameters from the node), so every one of them computes the same answer.

A queue's routing key is the name it shares with the queues it must stay with: the members of a
virtual queue share the key of the union's smallest name, and a dead-letter queue `<q><suffix>`
has the key of `<q>`, so that a virtual produce and a move into or out of a dead-letter queue are
one worker's one write in one group. With one group (the default) every queue is in group 0 on
every node, and a queue's worker is what it always was.
"""
from __future__ import annotations

import fnmatch
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Queue names whose group was computed, kept per Placement (a bound on memory, not on correctness).
_CACHE_LIMIT = 1_000_000


@dataclass(frozen=True)
class GroupRule:
    """One entry of config `queue_group_list`: queues whose name matches `pattern` (fnmatch,
    case-sensitive; None: no queue) are in `group`; `nodes` (empty: the default replica set)
    are the group's replicas, its preferred leader first."""

    group: int
    pattern: str | None = None
    nodes: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        """The rule as config `queue_group_list` gives it."""
        return {"group": self.group, **({"pattern": self.pattern} if self.pattern is not None else {}),
                **({"nodes": list(self.nodes)} if self.nodes else {})}


class RoutingKeys:
    """Queue name -> routing key, and the key's hash that places it."""

    def __init__(self, virtual_queues: Iterable[tuple[str, Iterable[str]]] = (),
                 dead_letter_suffix: str = "") -> None:
        self.suffix = dead_letter_suffix
        self._union: dict[str, str] = _union_keys(virtual_queues)

    def base(self, queue: str) -> str:
        """The queue a dead-letter queue holds the dead letters of; any other queue itself."""
        suffix = self.suffix
        if suffix and queue.endswith(suffix) and queue != suffix:
            return queue[:-len(suffix)]
        return queue

    def key(self, queue: str) -> str:
        """The name `queue` is placed by."""
        base = self.base(queue)
        return self._union.get(base, base)

    def hash(self, queue: str) -> int:
        """crc32 of the routing key (UTF-8, lone surrogates kept): the number that places it.
        Not cached: its callers cache what they derive from it (Router.worker_for, group_of)."""
        return zlib.crc32(self.key(queue).encode("utf-8", "surrogatepass"))

    def unions(self) -> list[list[str]]:
        """The names bound together by virtual queues, one list per union (sorted)."""
        by_key: dict[str, list[str]] = {}
        for name, key in self._union.items():
            by_key.setdefault(key, []).append(name)
        return [sorted(names) for _, names in sorted(by_key.items())]


class Placement:
    """The queue groups of a cluster: which group a queue is in, and which nodes replicate it."""

    def __init__(self, members: Sequence[int], queue_groups: int = 1, group_replicas: int = 0,
                 rules: Sequence[GroupRule] = (), keys: RoutingKeys | None = None) -> None:
        """members: the node ids in `cluster_node_list` order ([] or one id: a single node);
        group_replicas: nodes per group (0: every node)."""
        if queue_groups < 1:
            raise ValueError("queue_groups must be >= 1")
        self.members = tuple(members)
        self.queue_groups = queue_groups
        n = len(self.members)
        self.group_replicas = group_replicas or n
        self.rules = tuple(rules)
        self.keys = keys or RoutingKeys()
        self._patterns = [(r.pattern, r.group) for r in self.rules if r.pattern is not None]
        self._groups: dict[str, int] = {}
        named = {r.group: r.nodes for r in self.rules if r.nodes}
        self._replicas = tuple(
            named.get(g) or tuple(self.members[(g + i) % n] for i in range(min(self.group_replicas, n)))
            for g in range(queue_groups))
        self.wire_hash = self._wire_hash()

    @property
    def is_default(self) -> bool:
        """One group on every node, placed by no rule: the node as it was before queue groups."""
        return self.queue_groups == 1 and self.group_replicas == len(self.members) and not self.rules

    def _wire_hash(self) -> int:
        """The placement's fingerprint that peer messages carry (PeerMessage.placement_hash, a
        fixed32): a crc32 of queue_groups, group_replicas, the rules and the node ids in list
        order (their addresses place nothing). 0 for the default placement, which proto3 leaves
        off the wire, so that a node of one group sends today's bytes; never 0 otherwise. Of
        their JSON (ASCII-escaped, compact), which any client can compute as well."""
        if self.is_default:
            return 0
        rules = [[r.group, r.pattern, list(r.nodes)] for r in self.rules]
        text = json.dumps([self.queue_groups, self.group_replicas, rules, list(self.members)], separators=(",", ":"))
        return zlib.crc32(text.encode()) or 1

    def as_dict(self) -> dict:
        """The parameters a client needs to compute the same placement (from_dict), as action 8
        gives them: JSON-able."""
        return {"queue_groups": self.queue_groups, "group_replicas": self.group_replicas,
                "queue_group_list": [rule.as_dict() for rule in self.rules], "nodes": list(self.members),
                "virtual_queues": self.keys.unions(), "dead_letter_suffix": self.keys.suffix}

    @classmethod
    def from_dict(cls, d: dict) -> "Placement":
        """The placement as_dict describes (ValueError if it is not one)."""
        try:
            rules = [GroupRule(int(r["group"]), r.get("pattern"), tuple(int(n) for n in r.get("nodes", ())))
                     for r in d.get("queue_group_list", ())]
            unions = [(str(names[0]), [str(n) for n in names[1:]]) for names in d.get("virtual_queues", ()) if names]
            return cls([int(n) for n in d["nodes"]], int(d["queue_groups"]), int(d.get("group_replicas", 0)), rules,
                       RoutingKeys(unions, str(d.get("dead_letter_suffix", ""))))
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"not a placement: {exc!r}") from None

    def group_of(self, queue: str) -> int:
        """The group of `queue`: the first rule whose pattern matches its name (a dead-letter
        queue's: the name of the queue it serves), else its routing key's hash mod the groups."""
        if self.queue_groups == 1:
            return 0
        group = self._groups.get(queue)
        if group is None:
            group = self._place(queue)
            if len(self._groups) < _CACHE_LIMIT:
                self._groups[queue] = group
        return group

    def _place(self, queue: str) -> int:
        base = self.keys.base(queue)
        for pattern, group in self._patterns:
            if fnmatch.fnmatchcase(base, pattern):
                return group
        return self.keys.hash(queue) % self.queue_groups

    def replicas(self, group: int) -> tuple[int, ...]:
        """The node ids that replicate `group`, its preferred leader first."""
        return self._replicas[group]

    def preferred_leader(self, group: int) -> int | None:
        """The node that should lead `group` when it is up and caught up (None: no members)."""
        replicas = self._replicas[group]
        return replicas[0] if replicas else None

    def groups_of(self, node_id: int) -> tuple[int, ...]:
        """The groups `node_id` is a replica of."""
        return tuple(g for g, nodes in enumerate(self._replicas) if node_id in nodes)

    def split_virtual_queue(self) -> tuple[list[str], tuple[int, int]] | None:
        """A union of virtual-queue names that `queue_group_list` puts in two groups (the
        names, and two of the groups), or None when every union is whole."""
        for names in self.keys.unions():
            groups = sorted({self.group_of(name) for name in names})
            if len(groups) > 1:
                return names, (groups[0], groups[1])
        return None


def _union_keys(virtual_queues: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """Union the names of each virtual queue with its members; each name maps to its union's
    smallest name."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name, members in virtual_queues:
        root = find(name)
        for member in members:
            other = find(member)
            if other != root:
                low, high = sorted((root, other))
                parent[high] = low
                root = low
    return {name: find(name) for name in list(parent)}
