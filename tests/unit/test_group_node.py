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


def _config(node_id: int, nodes: int = 3, groups: int = GROUPS, replicas: int = 0):
    members = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i} for i in range(1, nodes + 1)]
    cfg, _ = parse_config(orjson.dumps({"node_id": node_id, "workers": 2, "cluster_node_list": members,
                                        "election_timeout_ms": 300, "heartbeat_ms": 50, "queue_groups": groups,
                                        "group_replicas": replicas}).decode())
    return cfg


class Net:
    """Nodes (three, each a replica of three groups, unless told) whose Readies are carried out at
    once, every peer message delivered in order, every worker answering a FENCE at once and a
    list with the queues `queues` says it holds (by node and group); what each node's acceptor
    is sent is kept in `delivered`."""

    def __init__(self, nodes: int = 3, groups: int = GROUPS, replicas: int = 0) -> None:
        self.nodes = {}
        for i in range(1, nodes + 1):
            cfg = _config(i, nodes, groups, replicas)
            own = cfg.placement().groups_of(i)
            self.nodes[i] = ClusterNode(cfg, T0, recovered=Recovered(), rng=random.Random(i),
                                        disks={g: (Recovered(), None) for g in own[1:]})
        self.now = T0
        self.sent_groups: set[int] = set()
        self.forwards: list[tuple[int, int, int]] = []  # (group, from, to) of each Forward sent
        self.queues: dict[tuple[int, int], list[str]] = {}  # (node, group) -> the queues its workers hold
        self.delivered: dict[int, list[dict]] = {i: [] for i in self.nodes}  # node -> replies to its acceptor

    def flush(self) -> None:
        moved = True
        while moved:
            moved = False
            for i, node in list(self.nodes.items()):
                while node.has_ready():
                    ready = node.ready()
                    node.advance(ready, durable_trans_id=ready.log_through,
                                 parts={part.group: (part.log_through, True) for part in ready.parts})
                    for index, frames in ready.to_workers:  # each worker answers its coordinator's FENCE
                        if frames[0] == ipc_frames.FENCE and ipc_frames.read_fence(frames)[1] == ipc_frames.FROM_COORDINATOR:
                            node.on_fenced(ipc_frames.read_fence(frames)[0], index, self.now, ipc_frames.group_of(frames))
                            moved = True
                        elif frames[0] == ipc_frames.REQ:
                            moved |= self._serve(i, node, index, frames)
                    for frames in ready.to_acceptor:
                        if frames[0] == ipc_frames.REP:
                            self.delivered[i] += [orjson.loads(data) for _, _, data in replies.decode(frames[1], frames[2])]
                    mail = [(node.first_group, to, m) for to, m in ready.peer_messages(True, True)]
                    mail += [(part.group, to, m) for part in ready.parts for to, m in part.to_peers]
                    mail += list(ready.remote)
                    for group, to, msg in mail:
                        self.sent_groups.add(group)
                        if type(msg) is Forward:
                            self.forwards.append((group, msg.src, to))
                        if to not in self.nodes:  # stopped
                            continue
                        self.nodes[to].on_peer(msg, ("127.0.0.1", 2000 + to), self.now, 0, group)
                        moved = True

    def _serve(self, i: int, node: ClusterNode, index: int, frames: list[bytes]) -> bool:
        """Worker `index` of node i answers the lists of a REQ (its part: the queues it holds
        of the REQ's group, all of them on worker 0); True if it answered any."""
        group = ipc_frames.group_of(frames)
        parts = [[tag, {"queue_list": self.queues.get((i, group), []) if index == 0 else []}]
                 for _, _, request, tag in ipc_frames.read_req(frames) if tag is not None and request.get("action") == 7]
        if parts:
            node.gather(orjson.dumps(parts), group)
        return bool(parts)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.01
            for node in self.nodes.values():
                if self.now >= node.wake_at():
                    node.tick(self.now)
            self.flush()

    def leaders(self, group: int) -> list[int]:
        return [i for i, n in self.nodes.items() if group in n.groups and n.groups[group].leader is not None]


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



# ----------------------------------------------------------------- groups on fewer nodes (issue 28 step 5)
def _six_nodes_and_a_queue_node_1_holds_no_copy_of() -> tuple[Net, ClusterNode, str, int, int]:
    """6 nodes with 6 groups of 3 replicas, once leaders are elected: (net, node 1, a queue of a
    group node 1 is no replica of, that group, its leader)."""
    net = Net(nodes=6, groups=6, replicas=3)
    net.run(3.0)
    node = net.nodes[1]
    g = next(g for g in node.remote)
    queue = next(f"q{n}" for n in range(1000) if node.placement.group_of(f"q{n}") == g)
    (leader,) = net.leaders(g)
    return net, node, queue, g, leader


def test_six_nodes_each_a_replica_of_three_groups_and_every_node_knows_every_leader():
    net = Net(nodes=6, groups=6, replicas=3)
    for i, node in net.nodes.items():
        assert len(node.groups) == 3 and len(node.remote) == 3
        assert all(i in node.placement.replicas(g) for g in node.groups)
    net.run(3.0 + BALANCE_SETTLE + 3.0)
    for g in range(6):
        (leader,) = net.leaders(g)
        assert leader == net.nodes[1].placement.preferred_leader(g)
        for node in net.nodes.values():  # a replica follows it; any other node knows it
            known = node.groups[g].election.leader_id if g in node.groups else node.remote[g].leader_id
            assert known == leader
    status = net.nodes[1].status_fields()["groups"]  # the acceptor passes a non-replica's requests on
    assert [row["role"] for row in status] == ["leader"] + ["follower"] * 5
    assert status[2]["leader_node_id"] == 3
    rows = net.nodes[1].node_fields()["groups"]
    assert [row["role"] for row in rows] == ["leader", "none", "none", "none", "follower", "follower"]
    assert rows[2]["replicas"] == [3, 4, 5] and rows[2]["leader_node_id"] == 3


def test_a_non_replica_passes_a_request_to_its_group_s_leader_and_the_reply_comes_back():
    net, node, queue, g, leader = _six_nodes_and_a_queue_node_1_holds_no_copy_of()
    node.on_forward_requests([(Origin(5), 1, {"action": 8, "queue": queue})], net.now)  # answered by the leader itself
    net.flush()
    assert net.forwards == [(g, 1, leader)]
    assert net.delivered[1][-1]["leader_node_id"] == leader and net.delivered[1][-1]["code"] == 0


def test_a_non_replica_follows_a_group_to_its_new_leader_when_the_old_one_stops():
    net = Net(nodes=6, groups=6, replicas=3)
    net.run(3.0 + BALANCE_SETTLE + 3.0)
    node = net.nodes[1]
    g = 2  # replicas 3, 4, 5; led by node 3
    assert node.remote[g].leader_id == 3
    net.nodes.pop(3)
    net.run(3.0)
    (new,) = net.leaders(g)
    assert new in (4, 5) and node.remote[g].leader_id == new
    queue = next(f"q{n}" for n in range(1000) if node.placement.group_of(f"q{n}") == g)
    net.forwards.clear()
    node.on_forward_requests([(Origin(5), 1, {"action": 8, "queue": queue})], net.now)
    net.flush()
    assert net.forwards == [(g, 1, new)]


def test_a_list_of_every_queue_on_a_non_replica_merges_its_own_groups_and_the_other_leaders_parts():
    net = Net(nodes=6, groups=6, replicas=3)
    net.run(3.0 + BALANCE_SETTLE + 3.0)
    for i in net.nodes:
        for g in range(6):
            net.queues[(i, g)] = [f"g{g}"]  # every replica of g holds g's one queue
    node = net.nodes[1]
    # as Dispatch.route sends it: a part from each worker of each own group, one per other group
    tag = [1, Origin(9).wire(), 4, 2 * 3 + 3, {"action": 7}]
    node.on_forward_requests([(Origin(9), 4, {"action": 7}, tag, g) for g in sorted(node.remote)], net.now)
    for g in sorted(node.groups):
        for index in range(2):
            net._serve(1, node, index, ipc_frames.req_frames([[Origin(9).wire(), 4, {"action": 7}, tag]], 0, g))
    net.flush()
    (reply,) = [r for r in net.delivered[1] if r.get("queue_list") is not None]
    assert reply["queue_list"] == [f"g{g}" for g in range(6)] and reply["code"] == 0
    assert not node.gatherer.asked and len(node.gatherer) == 0


def test_a_list_fails_in_one_line_when_another_group_has_no_leader():
    net = Net(nodes=6, groups=6, replicas=3)
    node = net.nodes[1]  # before any election: no leader of any group is known
    tag = [1, Origin(9).wire(), 4, 3, {"action": 7}]
    node.on_forward_requests([(Origin(9), 4, {"action": 7}, tag, g) for g in sorted(node.remote)], net.now)
    net.flush()
    (reply,) = net.delivered[1]
    assert reply["code"] == -1 and reply["reason"] == "no leader"


def test_a_non_replica_gives_an_undelivered_consume_back_to_the_group_s_leader():
    net, node, queue, g, leader = _six_nodes_and_a_queue_node_1_holds_no_copy_of()
    node.on_undelivered(queue, [[7, 1]])
    (give_back,) = [(to, m) for gg, to, m in node.ready().remote if type(m).__name__ == "GiveBack"]
    assert give_back[0] == leader and give_back[1].msg_ids == (7,)
