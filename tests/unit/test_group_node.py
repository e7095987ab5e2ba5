"""Several queue groups in one ClusterNode (server/cluster.py, server/group_node.py), without
sockets or processes: three nodes, each a replica of three groups (group_replicas = every node),
whose peer messages travel with their group as the wire carries it (group 0's in Ready.to_peers,
another group's in its GroupPart). Each group elects its own leader, and a batch of one group is
logged, replicated and committed in that group only."""
from __future__ import annotations

import dataclasses
import random

import orjson

from queue_server.config.loader import parse_config
from queue_server.protocol import ipc_frames, replies
from queue_server.protocol.origin import Origin
from queue_server.replication.messages import Forward, Recovered
from queue_server.election.balance import BALANCE_SETTLE
from queue_server.server.cluster import ClusterNode

T0 = 1_000_000.0
GROUPS = 3
PRODUCE = {"op": "produce", "queue": "q", "msg_id": 1, "ready": T0, "ttl": T0 + 60, "retry": 0,
           "priority": 0, "data": "x", "delivery_count": 0}


def _config(node_id: int):
    nodes = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i} for i in (1, 2, 3)]
    cfg, _ = parse_config(orjson.dumps({"node_id": node_id, "workers": 2, "cluster_node_list": nodes,
                                        "election_timeout_ms": 300, "heartbeat_ms": 50}).decode())
    return dataclasses.replace(cfg, queue_groups=GROUPS)  # past the start-up check: not built yet


class Net:
    """Three nodes whose Readies are carried out at once, every peer message delivered in order,
    every worker answering a FENCE at once."""

    def __init__(self) -> None:
        self.nodes = {i: ClusterNode(_config(i), T0, recovered=Recovered(), rng=random.Random(i),
                                     disks={g: (Recovered(), None) for g in range(1, GROUPS)})
                      for i in (1, 2, 3)}
        self.now = T0
        self.sent_groups: set[int] = set()
        self.forwards: list[tuple[int, int, int]] = []  # (group, from, to) of each Forward sent

    def flush(self) -> None:
        moved = True
        while moved:
            moved = False
            for node in self.nodes.values():
                while node.has_ready():
                    ready = node.ready()
                    node.advance(ready, durable_trans_id=ready.log_through,
                                 parts={part.group: (part.log_through, True) for part in ready.parts})
                    for index, frames in ready.to_workers:  # each worker answers its coordinator's FENCE
                        if frames[0] == ipc_frames.FENCE and ipc_frames.read_fence(frames)[1] == ipc_frames.FROM_COORDINATOR:
                            node.on_fenced(ipc_frames.read_fence(frames)[0], index, self.now, ipc_frames.group_of(frames))
                            moved = True
                    mail = [(0, to, m) for to, m in ready.peer_messages(True, True)]
                    mail += [(part.group, to, m) for part in ready.parts for to, m in part.to_peers]
                    for group, to, msg in mail:
                        self.sent_groups.add(group)
                        if type(msg) is Forward:
                            self.forwards.append((group, msg.src, to))
                        if to not in self.nodes:  # stopped
                            continue
                        self.nodes[to].on_peer(msg, ("127.0.0.1", 2000 + to), self.now, 0, group)
                        moved = True

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.01
            for node in self.nodes.values():
                if self.now >= node.wake_at():
                    node.tick(self.now)
            self.flush()

    def leaders(self, group: int) -> list[int]:
        return [i for i, n in self.nodes.items() if n.groups[group].leader is not None]


def test_every_node_holds_every_group_and_each_group_elects_its_own_leader():
    net = Net()
    assert all(sorted(n.groups) == [0, 1, 2] for n in net.nodes.values())
    net.run(3.0)
    assert net.sent_groups == {0, 1, 2}
    for g in range(GROUPS):
        (leader,) = net.leaders(g)
        terms = {n.groups[g].election.vote_id for n in net.nodes.values()}
        assert len(terms) == 1  # every replica follows it in the same term
        assert all(n.groups[g].election.leader_id == leader for n in net.nodes.values())


def test_a_batch_of_one_group_is_logged_and_committed_in_that_group_only():
    net = Net()
    net.run(3.0)
    (leader,) = net.leaders(1)
    node = net.nodes[leader]
    before = {g: [n.groups[g].log.last_trans_id for n in net.nodes.values()] for g in range(GROUPS)}
    header, blob = replies.encode([(Origin(7), 1, {"action": 1, "queue": "q", "seq": 1, "code": 0})])
    node.on_batch(orjson.dumps([PRODUCE]), header, blob, ipc_frames.EMPTY_LIST, node.groups[1].epoch, net.now,
                  0, 1)
    net.run(0.5)
    after = {g: [n.groups[g].log.last_trans_id for n in net.nodes.values()] for g in range(GROUPS)}
    assert after[1] == [b + 1 for b in before[1]]  # on every replica of group 1
    assert all(n.groups[1].log.commit_trans_id == after[1][0] for n in net.nodes.values())
    assert after[0] == before[0] and after[2] == before[2]


def test_a_stopped_leader_of_one_group_is_replaced_in_that_group():
    net = Net()
    net.run(3.0)
    (old,) = net.leaders(2)
    others = {g: net.leaders(g) for g in (0, 1)}
    gone = net.nodes.pop(old)  # it stops: messages to it are lost
    net.run(3.0)
    (new,) = net.leaders(2)
    assert new != old
    assert gone.groups[2].leader is not None  # it never heard of it
    for g, leaders in others.items():  # a group the stopped node did not lead keeps its leader
        if leaders != [old]:
            assert net.leaders(g) == leaders


def test_a_request_is_forwarded_to_the_leader_of_its_queue_s_group():
    net = Net()
    net.run(3.0)
    placement = net.nodes[1].placement
    names = {placement.group_of(f"q{i}"): f"q{i}" for i in range(100)}
    assert sorted(names) == [0, 1, 2]
    for g, queue in sorted(names.items()):
        (leader,) = net.leaders(g)
        follower = next(i for i in net.nodes if i != leader)
        net.forwards.clear()
        net.nodes[follower].on_forward_requests([(Origin(5), 1, {"action": 1, "queue": queue, "data": "x"})], net.now)
        net.flush()
        assert net.forwards == [(g, follower, leader)]


def test_a_node_cuts_one_group_at_a_time_and_wakes_for_the_next_once_the_first_is_published():
    cfg, _ = parse_config(orjson.dumps({"node_id": 1, "workers": 2, "snapshot_every": 1}).decode())
    cfg = dataclasses.replace(cfg, queue_groups=GROUPS)
    node = ClusterNode(cfg, T0, recovered=Recovered(), rng=random.Random(1), snapshot_dir="/snaps/0",
                       disks={g: (Recovered(), f"/snaps/{g}") for g in range(1, GROUPS)})
    now = T0
    while any(group.leader is None for group in node.groups.values()):  # alone: it leads every group
        now += 0.05
        node.tick(now)
        _carry(node)
    while node.wake_at() <= now or node.cut_running():  # each group's cut of its first (empty) entry
        node.tick(now)
        _carry(node)
        for g, group in node.groups.items():
            if group.cuts.running:
                _finish_cut(node, g, now)
        _carry(node)
    header, blob = replies.encode([])
    for g in (1, 2):
        node.on_batch(orjson.dumps([PRODUCE]), header, blob, ipc_frames.EMPTY_LIST, node.groups[g].epoch, now, 0, g)
    _carry(node)
    assert node.wake_at() <= now  # a cut is due
    node.tick(now)
    first = [g for g, group in node.groups.items() if group.cuts.running]
    assert len(first) == 1 and first[0] in (1, 2)
    assert node.wake_at() > now + 0.01  # the other group's cut waits, without a busy wake
    for g in first:
        _finish_cut(node, g, now)
    published = [(part.group, type(cut).__name__) for part in node.ready().parts for cut in part.snapshots]
    assert published == [(first[0], "Publish")]
    _carry(node)
    assert node.wake_at() <= now  # the other group's turn
    node.tick(now)
    assert [g for g, group in node.groups.items() if group.cuts.running] == [3 - first[0]]


def _carry(node: ClusterNode) -> None:
    """Carry out every Ready, as a coordinator whose disk takes every write."""
    while node.has_ready():
        ready = node.ready()
        node.advance(ready, durable_trans_id=ready.log_through,
                     parts={part.group: (part.log_through, True) for part in ready.parts})


def _finish_cut(node: ClusterNode, g: int, now: float) -> None:
    """Every worker answers group g's cut at once: SYNCED, SNAPPED, PART_DONE."""
    cut = node.groups[g].cuts
    for i in range(2):
        node.on_synced(cut.epoch, cut.cut_id, i, now, g)
    for i in range(2):
        node.on_snapped(cut.epoch, cut.cut_id, i, now, g)
    for i in range(2):
        node.on_part_done(cut.cut_id, i, True, {"file": f"part-{i}.qsp", "bytes": 1, "queues": 1, "messages": 1},
                          now, g)


def test_each_group_moves_to_its_preferred_leader_and_stays_there():
    net = Net()
    net.run(3.0)
    net.run(BALANCE_SETTLE + 3.0)
    assert [net.leaders(g) for g in range(GROUPS)] == [[1], [2], [3]]  # replicas(g)[0]: node g + 1
    for g in range(GROUPS):
        assert len({n.groups[g].election.vote_id for n in net.nodes.values()}) == 1
    moved = [m for n in net.nodes.values() for m in n.take_moves()]
    assert all(net.nodes[target].placement.preferred_leader(g) == target for g, target in moved)
    net.run(BALANCE_SETTLE * 2)
    assert [net.leaders(g) for g in range(GROUPS)] == [[1], [2], [3]]
    assert [m for n in net.nodes.values() for m in n.take_moves()] == []  # no more moves


def test_a_node_that_comes_back_gets_its_group_back_once_it_has_kept_up():
    net = Net()
    net.run(3.0 + BALANCE_SETTLE + 3.0)
    gone = net.nodes.pop(2)  # node 2, group 1's preferred leader, stops
    net.run(3.0)
    assert net.leaders(1) and net.leaders(1) != [2]
    net.nodes[2] = gone  # back (its state as it was: a pause)
    net.run(BALANCE_SETTLE + 3.0)
    assert [net.leaders(g) for g in range(GROUPS)] == [[1], [2], [3]]


def test_a_hand_off_of_one_group_reads_that_group_s_mode_in_the_acceptor_not_group_0_s():
    """The acceptor routes group g's requests when it heard this node leads g in its current mode:
    then only it may say it sends no more (its FENCE behind them), never the coordinator for it."""
    net = Net()
    net.run(3.0 + BALANCE_SETTLE + 3.0)
    node = net.nodes[2]  # leads group 1 only (the preferred leaders: node g + 1)
    assert [g for g, part in node.groups.items() if part.leader is not None] == [1]
    assert node.announced(1)["role"] == "leader" and node.announced(0)["role"] == "follower"
    assert node.groups[1].begin_handoff(net.now, 1.0)
    fences = [ipc_frames.read_fence(frames) for _, frames in node.ready().to_workers
              if frames[0] == ipc_frames.FENCE and ipc_frames.group_of(frames) == 1]
    assert sorted(fences) == [(node.groups[1].epoch, ipc_frames.FROM_COORDINATOR)] * 2
