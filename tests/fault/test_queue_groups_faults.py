"""Fault tests of queue groups (issue 28) on a real 3-node cluster with `queue_groups` 3, every
group on every node (and on 6 nodes, 6 groups of 3 replicas): leaders spread one per node, kill -9 of a node that leads a group under
load (its group gets a new leader, nothing acknowledged is lost, no at-most-once message is
delivered twice, and once it is back the leaders spread again), and a graceful stop that hands
the group over. Each checks the workload's history (tests/fault/history.py); the workload's two
queues are in groups 0 and 2."""
from __future__ import annotations

import signal
import time

import pytest

from queue_server.protocol.placement import Placement
from tests.fault.history import AT_LEAST_ONCE, AT_MOST_ONCE, History, Workload, drain, wait_acks
from tests.harness import Cluster, wait_for

GROUPS = 3
BALANCED = [1, 2, 3]  # group g's preferred leader is node g + 1 (the default placement)
PLACEMENT = Placement([1, 2, 3], GROUPS)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), 3, queue_groups=GROUPS)
    try:
        yield c.start()
    finally:
        c.stop()


def _leaders(c: Cluster, node_id: int) -> list[int] | None:
    """Each group's leader as node_id names it (action 8), or None if it does not answer."""
    reply = c.ask(node_id, {"action": 8})
    if not reply or reply.get("code") != 0 or "groups" not in reply:
        return None
    return [row["leader_node_id"] for row in reply["groups"]]


def _wait_balanced(c: Cluster, among: list[int], timeout: float, balanced: list[int] = BALANCED) -> float:
    """Wait until every node in `among` names the balanced leaders; the seconds it took."""
    started = time.monotonic()
    wait_for(lambda: all(_leaders(c, i) == balanced for i in among), timeout,
             f"each node to lead its own group ({balanced}); now {[_leaders(c, i) for i in among]}")
    return time.monotonic() - started


def test_kill_of_a_group_leader_under_load_moves_its_group_and_the_leaders_spread_again(cluster):
    _kill_a_group_leader_under_load(cluster, PLACEMENT, BALANCED)


def test_six_nodes_of_three_replicas_a_killed_group_leader_is_replaced_and_no_node_loses_its_way(tmp_path):
    """6 nodes, 6 groups of 3 replicas: the killed node leads one group and holds two more; the
    nodes that hold no copy of its group follow the group to its new leader."""
    c = Cluster(str(tmp_path), 6, queue_groups=6, group_replicas=3, workers=1)
    try:
        c.start()
        _kill_a_group_leader_under_load(c, Placement(list(range(1, 7)), 6, group_replicas=3), [1, 2, 3, 4, 5, 6])
    finally:
        c.stop()


def _kill_a_group_leader_under_load(c: Cluster, placement: Placement, balanced: list[int]) -> None:
    print(f"leaders spread {_wait_balanced(c, list(c.nodes), 40, balanced):.1f} s after the start")
    victim = balanced[placement.group_of(AT_LEAST_ONCE)]
    assert balanced[placement.group_of(AT_MOST_ONCE)] != victim  # the other queue's group stays put
    history = History()
    work = Workload(c.hosts, history).start()
    try:
        wait_acks(history, 200)
        c.nodes[victim].signal_all(signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = [i for i in c.nodes if i != victim]
        led = [g for g, node in enumerate(balanced) if node == victim]

        def moved() -> bool:
            views = [_leaders(c, i) for i in survivors]
            return all(v is not None and all(v[g] not in (0, victim) for g in led) and v == views[0] for v in views)
        wait_for(moved, 15, f"groups {led} to elect a leader among nodes {survivors}")
        print(f"groups {led} have a new leader {time.monotonic() - killed_at:.2f} s after kill -9 of node {victim}")
        wait_acks(history, 200)  # writes go on, to both queues' groups
        c.nodes[victim].start()
        print(f"leaders spread again {_wait_balanced(c, list(c.nodes), 30, balanced):.1f} s after node {victim} restarted")
        wait_acks(history, 100)
    finally:
        work.stop()
    drain(c.hosts, history)
    history.check()
    assert history.acked[AT_LEAST_ONCE] and history.acked[AT_MOST_ONCE]


def test_a_node_stopped_gracefully_hands_its_group_over_and_gets_it_back_when_it_returns(cluster):
    c = cluster
    _wait_balanced(c, list(c.nodes), 40)
    stopping = BALANCED[PLACEMENT.group_of(AT_MOST_ONCE)]
    history = History()
    work = Workload(c.hosts, history).start()
    try:
        wait_acks(history, 100)
        node = c.nodes[stopping]
        node.stop()
        log = node.log()
        group = PLACEMENT.group_of(AT_MOST_ONCE)
        assert f"group {group}: stopping: handing leadership to node" in log, log[-2000:]
        assert "leads now (hand-off took" in log, log[-2000:]
        others = [i for i in c.nodes if i != stopping]
        wait_for(lambda: all((v := _leaders(c, i)) is not None and v[group] in others for i in others), 5,
                 f"group {group} to be led by one of {others}")
        wait_acks(history, 100)
        node.start()
        _wait_balanced(c, list(c.nodes), 30)
        wait_acks(history, 100)
    finally:
        work.stop()
    drain(c.hosts, history)
    history.check()
