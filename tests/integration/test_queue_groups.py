"""Queue groups on a real 3-node cluster (issue 28, docs/architecture.md): with `queue_groups` 3
and every group on every node, each group elects a leader of its own; any node serves a request
of any group (its own workers when it leads the group, else forwarded to the group's leader);
action 8 and monitor say which node leads which group; each group keeps its own log and
snapshots in the data dir, and a restart of every node brings every group's messages back."""
from __future__ import annotations

import asyncio
import glob
import os
import re
import threading

from queue_server.client import AsyncQueueClient, QueueClient
from queue_server.protocol.placement import Placement
from tests.harness import Cluster, wait_for

GROUPS = 3
QUEUES = [f"orders-{i}" for i in range(30)]


def _leaders(cluster: Cluster, node_id: int) -> dict[int, int] | None:
    """Each group's leader as node_id names it (action 8 without a queue), once it knows all."""
    reply = cluster.ask(node_id, {"action": 8})
    if not reply or reply.get("code") != 0 or "groups" not in reply:
        return None
    leaders = {row["group"]: row["leader_node_id"] for row in reply["groups"]}
    return leaders if all(leaders.values()) and len(leaders) == GROUPS else None


def _agreed_leaders(cluster: Cluster) -> dict[int, int]:
    """Each group's leader, once every node names the same ones."""
    def agreed() -> dict[int, int] | None:
        views = [_leaders(cluster, i) for i in cluster.nodes]
        return views[0] if views[0] is not None and all(v == views[0] for v in views) else None
    return wait_for(agreed, 30, "every node to know every group's leader")  # type: ignore[return-value]


def test_three_groups_elect_serve_through_any_node_snapshot_and_recover(tmp_path) -> None:
    cluster = Cluster(str(tmp_path), 3, queue_groups=GROUPS, snapshot_every=40)
    placement = Placement([1, 2, 3], GROUPS)
    group_of = {q: placement.group_of(q) for q in QUEUES}
    assert set(group_of.values()) == set(range(GROUPS))
    try:
        cluster.start()
        leaders = _agreed_leaders(cluster)
        # Through every node, to queues of every group: each message produced through one node,
        # consumed through the next and confirmed through the third.
        for i, q in enumerate(QUEUES):
            reply = cluster.ask(1 + i % 3, {"action": 1, "queue": q, "data": f"first {q}", "retry": 60})
            assert reply is not None and reply["code"] == 0, (q, reply)
        for i, q in enumerate(QUEUES):
            got = cluster.ask(1 + (i + 1) % 3, {"action": 2, "queue": q})
            assert got is not None and got["code"] == 0 and got["data"] == f"first {q}", (q, got)
            done = cluster.ask(1 + (i + 2) % 3, {"action": 3, "queue": q, "msg_id": got["msg_id"]})
            assert done is not None and done["code"] == 0, (q, done)
        # Action 8 with a queue names the leader of its group, from any node.
        for q in QUEUES[:6]:
            for node_id in cluster.nodes:
                reply = cluster.ask(node_id, {"action": 8, "queue": q})
                assert reply is not None and reply["leader_node_id"] == leaders[group_of[q]], (q, node_id, reply)
        # Monitor: one row per group, with its replica set (preferred leader first) and log.
        monitor = cluster.ask(2, {"action": 4})
        assert monitor is not None and monitor["code"] == 0
        rows = monitor["groups"]
        assert [row["group"] for row in rows] == list(range(GROUPS))
        assert [row["replicas"] for row in rows] == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
        assert all(row["commit_trans_id"] > 0 for row in rows), rows
        assert {row["group"]: row["leader_node_id"] for row in rows} == leaders
        assert [row["role"] == "leader" for row in rows] == [leaders[g] == 2 for g in range(GROUPS)]
        for q in QUEUES[:6]:  # a queue's monitor names its group, through any node
            reply = cluster.ask(1 + QUEUES.index(q) % 3, {"action": 4, "queue": q})
            assert reply is not None and reply["code"] == 0 and reply["group"] == group_of[q], (q, reply)
        # A subscription goes to the leader of its queue's group (action 8 with the queue), which
        # may not be group 0's leader: a queue of each group, through node 1.
        for g in range(GROUPS):
            q = next(name for name in QUEUES if group_of[name] == g)
            got: list = []

            def subscribe() -> None:
                with QueueClient(cluster.nodes[1].hosts, timeout=5) as client, client.subscribe(q, credit=1) as sub:
                    message = next(iter(sub))
                    sub.confirm(message)
                    got.append(message.data)
            with QueueClient(cluster.nodes[1].hosts, timeout=5) as client:
                client.produce(q, f"pushed {q}", retry=60)
            subscriber = threading.Thread(target=subscribe, daemon=True)
            subscriber.start()
            wait_for(lambda: got, 20, f"the push of {q} (group {g}) to a subscription made through node 1")
            subscriber.join(5)
            assert got == [f"pushed {q}"]
        listed = cluster.ask(3, {"action": 7})
        assert listed is not None and listed["code"] == 0
        assert sorted(listed["queue_list"]) == sorted(QUEUES)

        async def through_async_client() -> list:  # straight to each group's leader (client/aio.py)
            async with AsyncQueueClient(cluster.hosts, timeout=5) as client:
                await asyncio.gather(*(client.produce(q, f"async {q}", retry=60) for q in QUEUES[:6]))
                got = await asyncio.gather(*(client.consume(q) for q in QUEUES[:6]))
                await asyncio.gather(*(client.confirm(q, m.msg_id) for q, m in zip(QUEUES[:6], got) if m))
                return [m.data if m else None for m in got]
        assert asyncio.run(through_async_client()) == [f"async {q}" for q in QUEUES[:6]]
        # Enough records in every group for its own snapshots (snapshot_every 40), then more after.
        for round_ in range(3):
            for q in QUEUES:
                reply = cluster.ask(1, {"action": 1, "queue": q, "data": f"{q} {round_}", "retry": 60})
                assert reply is not None and reply["code"] == 0, (q, reply)
        for node_id, node in cluster.nodes.items():
            data_dir = node.config["queue_data_dir"]
            for g in range(GROUPS):
                folder = data_dir if g == 0 else os.path.join(data_dir, f"group-{g}")
                wait_for(lambda: glob.glob(os.path.join(folder, "snapshots", "snapshot-*.snap")), 30,
                         f"node {node_id} to write a snapshot of group {g}")
                assert glob.glob(os.path.join(folder, "wal", "*")), (node_id, g)
        # Every node stopped and started again: every group's messages come back, in order.
        for node in cluster.nodes.values():
            node.stop()
        for node in cluster.nodes.values():
            node.start(wait=False)
        for node in cluster.nodes.values():
            node.wait_ready()
        _agreed_leaders(cluster)
        for node in cluster.nodes.values():  # one recovery line per group and start, counting its own queues
            for g in range(GROUPS):
                pattern = f"INFO group {g}: " + r"recovered in [\d.]+ s: (\d+) queues?"
                lines = wait_for(lambda: (found := re.findall(pattern, node.log())) and len(found) == 2 and found, 20,
                                 f"{node.name}'s recovery line of group {g}")
                assert int(lines[-1]) == sum(1 for q in QUEUES if group_of[q] == g), (node.name, g, lines)
        for i, q in enumerate(QUEUES):
            for round_ in range(3):
                got = cluster.ask(1 + i % 3, {"action": 2, "queue": q})
                assert got is not None and got["code"] == 0 and got["data"] == f"{q} {round_}", (q, round_, got)
            empty = cluster.ask(1 + i % 3, {"action": 2, "queue": q})
            assert empty is not None and empty.get("data") is None, (q, empty)
    finally:
        for node in cluster.nodes.values():
            node.stop()


def test_six_nodes_with_three_replicas_per_group_serve_every_group_through_every_node(tmp_path) -> None:
    """6 nodes, 6 groups of 3 replicas: each node holds 3 groups and no copy of the others, whose
    requests (and its part of a list or monitor of every queue) it asks of their leaders."""
    nodes, groups = 6, 6
    cluster = Cluster(str(tmp_path), nodes, queue_groups=groups, group_replicas=3, workers=1)
    placement = Placement(list(range(1, nodes + 1)), groups, group_replicas=3)
    queues = [f"q{i}" for i in range(24)]
    group_of = {q: placement.group_of(q) for q in queues}
    assert set(group_of.values()) == set(range(groups))
    try:
        cluster.start()

        def agreed() -> dict[int, int] | None:
            views = []
            for node_id in cluster.nodes:
                reply = cluster.ask(node_id, {"action": 8})
                rows = (reply or {}).get("groups") or []
                views.append({row["group"]: row["leader_node_id"] for row in rows})
            first = views[0]
            return first if len(first) == groups and all(first.values()) and all(v == first for v in views) else None
        leaders = wait_for(agreed, 60, "every node to know every group's leader")
        assert all(leader in placement.replicas(g) for g, leader in leaders.items())
        for i, q in enumerate(queues):  # produced through one node, consumed through another, confirmed through a third
            for n in range(2):
                reply = cluster.ask(1 + i % nodes, {"action": 1, "queue": q, "data": f"{q} {n}", "retry": 60})
                assert reply is not None and reply["code"] == 0, (q, reply)
        for i, q in enumerate(queues):
            got = cluster.ask(1 + (i + 1) % nodes, {"action": 2, "queue": q})
            assert got is not None and got["code"] == 0 and got["data"] == f"{q} 0", (q, got)
            done = cluster.ask(1 + (i + 3) % nodes, {"action": 3, "queue": q, "msg_id": got["msg_id"]})
            assert done is not None and done["code"] == 0, (q, done)
        for node_id in cluster.nodes:
            listed = cluster.ask(node_id, {"action": 7})
            assert listed is not None and listed["code"] == 0 and sorted(listed["queue_list"]) == sorted(queues), node_id
            # (a node's own copy of a group it follows may trail the group's leader for a moment)
            monitor = wait_for(lambda: (m := cluster.ask(node_id, {"action": 4})) and m.get("size") == len(queues) and m,
                               10, f"node {node_id}'s monitor to count the {len(queues)} messages left")
            rows = {row["group"]: row for row in monitor["groups"]}
            mine = set(placement.groups_of(node_id))
            assert {g for g, row in rows.items() if row["role"] != "none"} == mine, (node_id, rows)
            assert all(rows[g]["leader_node_id"] == leaders[g] for g in range(groups))
            # this node's own copy: its groups' queues only (a group it follows, once its copy caught up)
            own = sorted(q for q in queues if group_of[q] in mine)
            wait_for(lambda: (local := cluster.ask(node_id, {"action": 107})) is not None
                     and sorted(local["queue_list"]) == own, 10, f"node {node_id}'s own copy to list {own}")
            data_dir = cluster.nodes[node_id].config["queue_data_dir"]
            held = {g for g in range(1, groups) if os.path.isdir(os.path.join(data_dir, f"group-{g}"))}
            assert held == mine - {0}, (node_id, held)
    finally:
        for node in cluster.nodes.values():
            node.stop()
