"""protocol/placement.py: routing keys, queue groups, replica sets and preferred leaders."""
from __future__ import annotations

import zlib

from hypothesis import given, strategies as st

from queue_server.protocol.placement import GroupRule, Placement, RoutingKeys
from queue_server.server.router import Router

names = st.text(st.characters(blacklist_categories=("Cc",)), min_size=1, max_size=20)


def test_routing_key_binds_virtual_queues_and_dead_letters() -> None:
    keys = RoutingKeys([("v", ["b", "c"]), ("w", ["c", "d"])], ".dlq")
    assert {keys.key(q) for q in ("v", "b", "c", "w", "d")} == {"b"}  # the union's smallest name
    assert keys.key("b.dlq") == "b" and keys.key("x.dlq") == "x" and keys.key(".dlq") == ".dlq"
    assert keys.hash("x") == zlib.crc32(b"x") and keys.hash("x.dlq") == keys.hash("x")
    assert keys.unions() == [["b", "c", "d", "v", "w"]]
    assert RoutingKeys((), "").key("x.dlq") == "x.dlq"  # no dead-letter queues


@given(names, st.integers(1, 64))
def test_the_worker_of_a_queue_is_unchanged_by_the_move_to_placement(queue: str, workers: int) -> None:
    """Router.worker_for stays what it was before RoutingKeys (the crc32 of the key), so a node
    upgraded in place puts every queue on the worker it was on."""
    key = queue[:-4] if queue.endswith(".dlq") and queue != ".dlq" else queue
    assert Router(workers, (), ".dlq").worker_for(queue) == zlib.crc32(key.encode("utf-8", "surrogatepass")) % workers


@given(names, st.integers(1, 12))
def test_group_of_is_stable_and_in_range(queue: str, groups: int) -> None:
    placement = Placement([1, 2, 3], groups)
    group = placement.group_of(queue)
    assert 0 <= group < groups
    assert Placement([1, 2, 3], groups).group_of(queue) == group  # the same on every node
    if groups == 1:
        assert group == 0


def test_dead_letter_queue_shares_its_queue_group() -> None:
    placement = Placement([1, 2, 3], 7, keys=RoutingKeys((), ".dlq"))
    for i in range(200):
        assert placement.group_of(f"q{i}.dlq") == placement.group_of(f"q{i}")


def test_rules_first_match_wins_and_match_the_served_queue_name() -> None:
    rules = [GroupRule(2, "orders.*"), GroupRule(1, "orders.eu"), GroupRule(1, "*.audit")]
    placement = Placement([1, 2, 3], 3, rules=rules, keys=RoutingKeys((), ".dlq"))
    assert placement.group_of("orders.eu") == 2  # the first rule, though the second matches too
    assert placement.group_of("orders.eu.dlq") == 2  # a dead-letter queue goes with its queue
    assert placement.group_of("x.audit") == 1
    assert placement.group_of("Orders.eu") == placement.keys.hash("Orders.eu") % 3  # case-sensitive


def test_default_replica_sets_walk_the_node_list() -> None:
    placement = Placement([11, 12, 13, 14, 15, 16], 6, group_replicas=3)
    assert [placement.replicas(g) for g in range(6)] == [
        (11, 12, 13), (12, 13, 14), (13, 14, 15), (14, 15, 16), (15, 16, 11), (16, 11, 12)]
    assert [placement.preferred_leader(g) for g in range(6)] == [11, 12, 13, 14, 15, 16]
    assert [len(placement.groups_of(n)) for n in (11, 12, 13, 14, 15, 16)] == [3] * 6
    assert Placement([1, 2, 3], 2).replicas(1) == (2, 3, 1)  # every node, led from the next by default


@given(st.integers(1, 7).map(lambda n: 2 * n - 1), st.integers(1, 30), st.data())
def test_every_node_is_preferred_for_its_fair_share(nodes: int, groups: int, data: st.DataObject) -> None:
    replicas = data.draw(st.integers(1, nodes).filter(lambda r: r % 2 == 1))
    placement = Placement(list(range(1, nodes + 1)), groups, group_replicas=replicas)
    for g in range(groups):
        assert len(set(placement.replicas(g))) == replicas
    leads = [sum(1 for g in range(groups) if placement.preferred_leader(g) == n) for n in range(1, nodes + 1)]
    assert min(leads) >= groups // nodes and max(leads) <= -(-groups // nodes)


def test_named_replica_sets_override_the_default() -> None:
    placement = Placement([1, 2, 3, 4, 5], 3, group_replicas=3, rules=[GroupRule(2, None, (5, 1, 4))])
    assert placement.replicas(2) == (5, 1, 4) and placement.preferred_leader(2) == 5
    assert placement.replicas(1) == (2, 3, 4)
    assert placement.groups_of(5) == (2,)


def test_split_virtual_queue_names_the_union() -> None:
    keys = RoutingKeys([("all", ["orders.eu", "audit"])])
    assert Placement([1], 3, keys=keys).split_virtual_queue() is None  # hashed by one key: whole
    split = Placement([1], 3, rules=[GroupRule(2, "orders.*")], keys=keys).split_virtual_queue()
    assert split is not None and split[0] == ["all", "audit", "orders.eu"] and 2 in split[1]
    whole = Placement([1], 3, rules=[GroupRule(1, "orders.*"), GroupRule(1, "a*")], keys=keys)
    assert whole.split_virtual_queue() is None


def test_wire_hash_is_zero_for_the_default_placement_only() -> None:
    """Peer messages carry it (0 is left off the wire): the default placement sends today's
    bytes; any other placement a nonzero hash that changes with each of its parts."""
    assert Placement([1, 2, 3]).wire_hash == Placement([1, 2, 3], 1, 3).wire_hash == 0
    assert Placement([7]).wire_hash == 0
    others = [Placement([1, 2, 3], 3), Placement([1, 2, 3, 4, 5], 1, 3), Placement([1, 2, 3], 1, rules=[GroupRule(0, "a*")]),
              Placement([1, 2, 3], 3, rules=[GroupRule(2, "a*")]), Placement([1, 2, 3], 3, rules=[GroupRule(2, "b*")]),
              Placement([1, 2, 3], 3, rules=[GroupRule(2, None, (3, 2, 1))]), Placement([2, 1, 3], 3),
              Placement([1, 2, 4], 3), Placement([1, 2, 3, 4, 5], 3, 3), Placement([1, 2, 3], 4)]
    hashes = [p.wire_hash for p in others]
    assert all(0 < h < 2**32 for h in hashes) and len(set(hashes)) == len(hashes)
    assert Placement([1, 2, 3], 3, rules=[GroupRule(2, "a*")]).wire_hash == hashes[3]  # every node computes the same


@given(st.lists(names, min_size=1, max_size=30), st.integers(1, 9), st.sampled_from(["", ".dlq"]))
def test_a_client_computes_the_same_group_from_the_placement_action_8_gives(queues: list[str], groups: int,
                                                                           suffix: str) -> None:
    """as_dict crosses the wire as JSON; from_dict's Placement places every queue as the node's does."""
    import json
    node = Placement([1, 2, 3, 4, 5], groups, 3, [GroupRule(groups - 1, "orders.*", (5, 1, 2))],
                     RoutingKeys([("v", ["b", "c"]), ("w", ["c", "d"])], suffix))
    client = Placement.from_dict(json.loads(json.dumps(node.as_dict())))
    for queue in [*queues, "orders.x", "v", "d", "b" + suffix]:
        assert client.group_of(queue) == node.group_of(queue), queue
    assert [client.replicas(g) for g in range(groups)] == [node.replicas(g) for g in range(groups)]
    assert client.wire_hash == node.wire_hash


def test_a_placement_that_is_not_one_is_a_value_error() -> None:
    import pytest
    for bad in [{}, {"nodes": [1], "queue_groups": "x"}, {"nodes": 3, "queue_groups": 2},
                {"nodes": [1], "queue_groups": 2, "queue_group_list": [{}]}]:
        with pytest.raises(ValueError):
            Placement.from_dict(bad)
