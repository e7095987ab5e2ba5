"""ClusterNode (server/cluster.py) without sockets or processes, driven only through its events
and ready()/advance(): the Ready contract (persist before send, storage failures), what it
decides for worker batches from an old mode, resets of a leader's workers, forwarding and giving
messages back."""
from __future__ import annotations

import random

import orjson
import pytest

from queue_server.config.loader import parse_config
from queue_server.election.messages import Heartbeat, HeartbeatAck, TimeoutNow, VoteReply, VoteRequest
from queue_server.replication.log import Entry
from queue_server.replication.messages import AppendAck, AppendEntries, Recovered
from queue_server.replication.messages import FileRange, InstallSnapshot, Pull, SnapshotAck, SnapshotChunk
from queue_server.replication.snapshot import write_part
from queue_server.replication.transfer import SnapshotSource
from queue_server.replication.messages import Forward, ForwardReply, GiveBack
from queue_server.protocol import vocabulary as p
from queue_server.protocol import ipc_frames, replies
from queue_server.server.cluster import ClusterNode
from queue_server.server.forwarding import FORWARD_GRACE
from queue_server.protocol.origin import Origin
from queue_server.protocol.records import decode, encode
from queue_server.server.ready import Ready
from queue_server.server.snapshots import RETRY_AFTER, SNAP_HOLD_TIMEOUT, Clear, Failed, Publish
from prometheus_client import CollectorRegistry

from queue_server.server.metrics import WorkerMetrics
from queue_server.server.worker import Worker
from queue_server.workers.service import PartitionService

T0 = 1_000_000.0
NODE2 = ("127.0.0.1", 2222)  # node 2's client address, as its peer messages carry it


def _config(n: int, node_id: int = 1, **extra):
    nodes = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i} for i in range(1, n + 1)]
    cfg, _ = parse_config(orjson.dumps({
        "node_id": node_id, "workers": 2, "cluster_node_list": nodes if n > 1 else [],
        "election_timeout_ms": 300, "heartbeat_ms": 50, **extra}).decode())
    return cfg


def _leader() -> ClusterNode:
    """A single node that has elected itself."""
    node = ClusterNode(_config(1), T0, recovered=Recovered(), rng=random.Random(1))
    node.tick(T0 + 1)
    assert node.role == "leader"
    _drain(node)
    return node


def _leader_of_three() -> ClusterNode:
    """Node 1 of three, elected with node 2's votes (node 3 never answers)."""
    return _elected(_config(3))[0]


def _elected(config) -> tuple[ClusterNode, float]:
    """Node 1 of three elected with node 2's votes, and the time it won."""
    node = ClusterNode(config, T0, recovered=Recovered(), rng=random.Random(1))
    now = T0
    while node.role != "leader":
        now += 0.05
        node.tick(now)
        for to, msg in _drain(node)[2]:
            if type(msg) is VoteRequest and to == 2:
                node.on_peer(VoteReply(msg.vote_id, 2, True, msg.pre_vote), NODE2, now)
    _drain(node)
    return node, now


def _follower() -> ClusterNode:
    """Node 1 of three, following node 2."""
    node = ClusterNode(_config(3), T0, recovered=Recovered(), rng=random.Random(1))
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), ("127.0.0.1", 2222), T0)
    assert node.role == "follower"
    _drain(node)
    return node


def _drain(node: ClusterNode) -> tuple[list, list, list]:
    """Carry out every Ready as the coordinator does with a disk that takes every write: the
    (to_acceptor, to_workers, to_peers) sent."""
    out: tuple[list, list, list] = ([], [], [])
    while node.has_ready():
        ready = node.ready()
        out[0].extend(ready.to_acceptor)
        out[1].extend(ready.to_workers)
        out[2].extend(ready.peer_messages(True, True))
        node.advance(ready, durable_trans_id=ready.log_through)
    return out


def _disk_refuses(node: ClusterNode) -> Ready:
    """Carry out one Ready whose log the disk refused to write."""
    ready = node.ready()
    node.advance(ready, log_stored=False)
    return ready


def _replies(to_acceptor: list) -> list[tuple[Origin, int, dict]]:
    return [(o, n, orjson.loads(bytes(d))) for kind, *rest in to_acceptor if kind == ipc_frames.REP
            for o, n, d in replies.decode(*rest)]


def _batch(node: ClusterNode, epoch: int, records: list[dict], seq: int = 1, index: int = 0):
    header, blob = replies.encode([(Origin(7), seq, {"action": 1, "queue": "q", "seq": seq, "code": 0, "msg_id": 1})])
    node.on_batch(orjson.dumps(records), header, blob, ipc_frames.EMPTY_LIST, epoch, T0 + 2, index)


PRODUCE = {"op": "produce", "queue": "q", "msg_id": 1, "ready": T0, "ttl": T0 + 60, "retry": 0,
           "priority": 0, "data": "x", "delivery_count": 0}


def test_a_batch_from_the_current_mode_is_logged_and_answered():
    node = _leader()
    last = node.log.last_trans_id
    _batch(node, node.epoch, [PRODUCE])
    assert node.log.last_trans_id == last + 1
    (origin, seq, reply), = _replies(_drain(node)[0])
    assert (origin, seq, reply["code"]) == (Origin(7), 1, 0)


def test_the_log_window_keeps_what_the_disk_has_not_taken():
    """Entries fall off the log's window only once committed and on disk: while the disk refuses
    the log, a single node's committed entries all stay (the WAL must still get them)."""
    node = ClusterNode(_config(1, queue_log_size=2), T0, recovered=Recovered(), rng=random.Random(1))
    node.tick(T0 + 1)
    _drain(node)
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=i) for i in range(1, 6)])
    assert node.log.commit_trans_id == node.log.last_trans_id == 6  # the noop, then 5
    _disk_refuses(node)
    assert (len(node.log), node.log.first_trans_id) == (5, 2)  # only the noop was on disk
    _drain(node)  # the disk takes it
    assert (len(node.log), node.log.first_trans_id) == (2, 5)


def test_a_batch_s_records_are_logged_as_the_bytes_the_worker_sent():
    """The log (and so the WAL and the peers) gets each record's bytes from the worker's array,
    not the record encoded again (which here would write "retry":0.0 for the worker's 0)."""
    node = _leader()
    node.on_batch(b'[ %s ]' % orjson.dumps(PRODUCE), *replies.encode([]), ipc_frames.EMPTY_LIST, node.epoch, T0 + 2)
    entry = node.log.entry_at(node.log.last_trans_id)
    assert bytes(entry.encoded()) == orjson.dumps(PRODUCE) != encode(entry.record)


def test_batches_taken_together_are_logged_in_order_replicated_once_and_answered_in_order():
    """on_batches: as on_batch one after another (an old mode's batch among them is refused on
    its own), with one AppendEntries per follower for all the new records."""
    node, now = _elected(_config(3))
    last = node.log.last_trans_id
    node.on_peer(AppendAck(node.election.vote_id, 2, last), NODE2, now)  # node 2 has the log so far
    _drain(node)

    def batch(seq: int, epoch: int, index: int) -> tuple:
        header, blob = replies.encode([(Origin(7), seq, {"action": 1, "queue": "q", "seq": seq, "code": 0})])
        return orjson.dumps([dict(PRODUCE, msg_id=seq)]), header, blob, ipc_frames.EMPTY_LIST, epoch, index

    node.on_batches([batch(1, node.epoch, 0), batch(2, node.epoch - 1, 1), batch(3, node.epoch, 1)], now + 0.01)
    assert [node.log.entry_at(t).record.msg_id for t in (last + 1, last + 2)] == [1, 3]
    assert node.log.last_trans_id == last + 2
    to_acceptor, _, to_peers = _drain(node)
    assert [(n, r["code"]) for _, n, r in _replies(to_acceptor)] == [(2, -1)]  # the old mode's, at once
    pushed = [m for to, m in to_peers if to == 2 and type(m) is AppendEntries]
    assert len(pushed) == 1 and [e.trans_id for e in pushed[0].entries] == [last + 1, last + 2]
    node.on_peer(AppendAck(node.election.vote_id, 2, last + 2), NODE2, now + 0.02)
    assert [(n, r["code"]) for _, n, r in _replies(_drain(node)[0])] == [(1, 0), (3, 0)]


def test_a_batch_from_an_old_mode_is_refused_and_not_logged():
    """A worker's changes made before a step-down and re-election (or a reset) were wiped in the
    worker by that reset: logging them would promise what no state holds."""
    node = _leader()
    last = node.log.last_trans_id
    _batch(node, node.epoch - 1, [PRODUCE], seq=4)
    assert node.log.last_trans_id == last
    (origin, seq, reply), = _replies(_drain(node)[0])
    assert (origin, seq, reply["code"], reply["seq"]) == (Origin(7), 4, -1, 4)
    assert "retry" in reply["reason"]


def test_a_disk_refusal_rolls_the_workers_back_to_what_they_logged_in_a_new_mode():
    node = _leader_of_three()
    _batch(node, node.epoch, [PRODUCE], index=1)  # logged, not yet on disk: not committed
    _disk_refuses(node)
    epoch = node.epoch
    _batch(node, epoch, [dict(PRODUCE, msg_id=2)], seq=2, index=1)  # refused: undone in the worker
    _, to_workers, _ = _drain(node)
    assert [f[0] for _, f in to_workers] == [ipc_frames.MODE, ipc_frames.MODE]  # no RESET, no APPLY
    assert node.epoch == epoch + 1
    last = node.log.last_trans_id
    # each worker keeps the records it logged: worker 1 its first produce, worker 0 none
    assert {i: orjson.loads(f[1]) for i, f in to_workers} == {0: [True, epoch + 1, 0, last],
                                                              1: [True, epoch + 1, 1, last]}


def test_a_follower_forwards_with_the_transport_and_echoes_failures():
    node = _follower()
    node.on_forward_requests([[Origin(3, True), 0, {"action": 2, "queue": "q", "wait": 5, "seq": 9}]], T0)
    _, _, to_peers = _drain(node)
    (to, msg), = to_peers
    assert to == 2 and type(msg) is Forward and msg.requests[0][2] is True  # came over UDP
    node.tick(T0 + FORWARD_GRACE + 5 + 0.1)
    (origin, _, reply), = _replies(_drain(node)[0])
    assert origin == Origin(3, True) and reply["code"] == -1 and reply["seq"] == 9


def test_forwards_expire_while_the_leader_is_heard():
    node = _follower()
    node.on_forward_requests([[Origin(3, False), 1, {"action": 1, "queue": "q", "data": "x"}]], T0)
    _drain(node)
    assert node.wake_at() <= T0 + FORWARD_GRACE
    now = T0
    while now < T0 + FORWARD_GRACE + 1:  # heartbeats keep coming: the election never wakes it
        now += 0.05
        node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), ("127.0.0.1", 2222), now)
        if now >= node.wake_at():
            node.tick(now)
    (_, _, reply), = _replies(_drain(node)[0])
    assert reply["code"] == -1 and "timed out" in reply["reason"]


def test_a_forward_that_could_not_be_sent_is_sent_again():
    node = _follower()
    node.on_forward_requests([[Origin(3, False), 1, {"action": 1, "queue": "q", "data": "x"}]], T0)
    _, _, to_peers = _drain(node)
    node.on_unsent(to_peers[0][1], T0)  # the link to the leader is not up yet
    assert node.wake_at() <= T0 + 0.05
    node.tick(T0 + 0.06)
    _, _, again = _drain(node)
    assert [(to, type(m), m.requests) for to, m in again] == [(2, Forward, to_peers[0][1].requests)]


def test_a_late_forward_reply_gives_its_messages_back_to_the_leader():
    node = _follower()
    node.on_forward_requests([[Origin(3, False), 1, {"action": 2, "queue": "q"}]], T0)
    (_, fwd), = _drain(node)[2]
    node.tick(T0 + FORWARD_GRACE + 1)  # given up on
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), ("127.0.0.1", 2222), T0 + 12)  # node 2 still leads
    _drain(node)
    late = orjson.dumps({"action": 2, "queue": "q", "code": 0, "msg_id": 5, "data": "x", "delivery_count": 1})
    node.on_peer(ForwardReply(1, 2, ((fwd.requests[0][0], late),)), ("127.0.0.1", 2222), T0 + 12)
    to_acceptor, _, to_peers = _drain(node)
    assert _replies(to_acceptor) == []
    (to, msg), = to_peers
    assert to == 2 and msg == GiveBack(1, 1, "q", (5,), (1,))


def test_the_leader_gives_back_what_a_follower_could_not_deliver():
    node = _leader()
    node.on_peer(GiveBack(node.election.vote_id, 2, "q", (5, 6), (1, 2)), ("", 0), T0 + 2)  # not a member: dropped
    assert _drain(node)[1] == []
    node.on_undelivered("q", [[5, 1], [6, 2]])
    (index, frames), = _drain(node)[1]
    assert frames == [ipc_frames.UNDELIVER, orjson.dumps(["q", [[5, 1], [6, 2]]]), b"0"]  # group 0
    assert index == node.router.worker_for("q")


def test_a_give_back_while_no_leader_is_known_waits_for_one():
    """The leader's worker restores what the give-back names from the consume record it
    replayed, whichever node led when the message was consumed: so the give-back waits for a
    leader rather than being dropped."""
    node = ClusterNode(_config(3), T0, recovered=Recovered(), rng=random.Random(1))
    node.on_undelivered("q", [[5, 1]])
    assert _drain(node)[2] == []
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0 + 0.01)
    gives = [(to, m) for to, m in _drain(node)[2] if type(m) is GiveBack]
    assert gives == [(2, GiveBack(1, 1, "q", (5,), (1,)))]


def test_a_forwarded_consume_reply_that_cannot_be_sent_is_given_back_by_the_leader():
    node = _leader()
    reply = {"action": p.CONSUME, "queue": "q", "code": 0, "msg_id": 5, "data": "x", "delivery_count": 1}
    node.on_unsent(ForwardReply(node.election.vote_id, 1, ((42, orjson.dumps(reply)),)), T0 + 2)
    (index, frames), = _drain(node)[1]
    assert frames == [ipc_frames.UNDELIVER, orjson.dumps(["q", [[5, 1]]]), b"0"]
    assert index == node.router.worker_for("q")


def test_forwarded_replies_go_back_to_their_node():
    node = _leader()
    node.forwarding.served = True
    header, blob = replies.encode([(Origin(7), 1, {"code": 0, "seq": 1}), (Origin(42, True, 3), 0, {"code": 0})])
    node.on_batch(ipc_frames.EMPTY_LIST, header, blob, ipc_frames.EMPTY_LIST, node.epoch, T0 + 2)
    to_acceptor, _, to_peers = _drain(node)
    assert [(o, n) for o, n, _ in _replies(to_acceptor)] == [(Origin(7), 1)]
    assert [(to, type(m), m.replies[0][0]) for to, m in to_peers] == [(3, ForwardReply, 42)]


def test_a_reply_without_records_waits_for_what_was_logged_before_it():
    """An idempotent produce's "duplicate" reply (no record of its own) rests on the original
    produce: it must not leave before that is committed, nor if it never is."""
    node = _leader_of_three()
    _batch(node, node.epoch, [PRODUCE], seq=1)
    header, blob = replies.encode([(Origin(8), 2, {"action": 1, "seq": 2, "code": 0, "msg_id": 1, "duplicate": True})])
    node.on_batch(ipc_frames.EMPTY_LIST, header, blob, ipc_frames.EMPTY_LIST, node.epoch, T0 + 2)
    assert _replies(_drain(node)[0]) == []  # node 2 has not acknowledged the produce yet
    node.on_peer(Heartbeat(node.election.vote_id + 1, 2, 0, 0, 0, 0), ("127.0.0.1", 2222), T0 + 3)
    assert node.role == "follower"
    answered = {n: r for _, n, r in _replies(_drain(node)[0])}
    assert answered[1]["code"] == -1 and answered[2]["code"] == -1 and "duplicate" not in answered[2]


# ------------------------------------------------------------------ hand-off (leadership transfer)


def _handing_over(**extra) -> tuple[ClusterNode, float]:
    """Node 1 leading three, node 2 holding its whole log, committed; then begin_handoff."""
    node, now = _elected(_config(3, **extra))
    node.on_peer(AppendAck(node.election.vote_id, 2, node.log.last_trans_id), NODE2, now)
    assert node.log.commit_trans_id == node.log.last_trans_id
    _drain(node)
    assert node.begin_handoff(now, 1.0)
    assert node.election.transfer_target == 2
    return node, now


def _timeout_nows(to_peers: list) -> list:
    return [(to, m) for to, m in to_peers if type(m) is TimeoutNow]


def _statuses(to_acceptor: list) -> list[dict]:
    return [ipc_frames.read_status(f) for f in to_acceptor if f[0] == ipc_frames.STATUS]


def test_a_follower_tells_its_acceptor_the_http_port_the_leader_gives():
    """The peers carry their http_port (cluster_node_list need not name it): a follower's status
    gives its acceptor the leader's, which the HTTP API names in a 409 (docs/http.md)."""
    node = ClusterNode(_config(3, http_port=9001), T0, recovered=Recovered(), rng=random.Random(1))
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0, 9002)
    status = _statuses(_drain(node)[0])[-1]
    assert (status["role"], status["leader_node_id"]) == ("follower", 2)
    assert status["http_ports"] == {1: 9001, 2: 9002, 3: 0}
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0 + 0.01, 0)  # says none: what was heard stays
    assert _statuses(_drain(node)[0]) == []
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0 + 0.02, 9012)  # restarted on another port
    assert _statuses(_drain(node)[0])[-1]["http_ports"][2] == 9012


def test_the_http_ports_cluster_node_list_names_stand_until_a_peer_says_its_own():
    nodes = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i, "http_port": 8110 + i} for i in (1, 2, 3)]
    node = ClusterNode(_config(3, cluster_node_list=nodes, http_port=0), T0, recovered=Recovered(),
                       rng=random.Random(1))
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0)  # a node that says no http_port
    assert _statuses(_drain(node)[0])[-1]["http_ports"] == {1: 0, 2: 8112, 3: 8113}  # its own: off


def test_a_hand_off_sends_timeout_now_only_once_every_worker_is_fenced():
    """The target holds the whole log at once, but a worker may still be sending a batch it
    decided while this node led: TimeoutNow waits for FENCED from every worker."""
    node, now = _handing_over()
    to_acceptor, to_workers, to_peers = _drain(node)
    assert _timeout_nows(to_peers) == []
    # the acceptor, told it leads in this mode, fences its own requests when told it no longer does
    assert [s["role"] for s in _statuses(to_acceptor)] == ["follower"]
    assert sorted((i, ipc_frames.read_fence(f)) for i, f in to_workers if f[0] == ipc_frames.FENCE) == [
        (0, (node.epoch, ipc_frames.FROM_COORDINATOR)), (1, (node.epoch, ipc_frames.FROM_COORDINATOR))]
    node.on_fenced(node.epoch, 0, now + 0.01)
    node.on_fenced(node.epoch - 1, 1, now + 0.01)  # of a mode that is over: not this barrier
    node.tick(now + 0.2)  # no time makes up for a missing fence
    assert _timeout_nows(_drain(node)[2]) == []
    node.on_fenced(node.epoch, 1, now + 0.21)
    assert _timeout_nows(_drain(node)[2]) == [(2, TimeoutNow(node.election.vote_id, 1))]


def test_a_batch_that_arrives_before_the_fence_is_logged_and_replicated_before_timeout_now():
    node, now = _handing_over()
    _drain(node)
    last = node.log.last_trans_id
    header, blob = replies.encode([(Origin(7), 1, {"action": 1, "queue": "q", "seq": 1, "code": 0, "msg_id": 1})])
    node.on_batch(orjson.dumps([PRODUCE]), header, blob, ipc_frames.EMPTY_LIST, node.epoch, now + 0.01)
    assert node.log.last_trans_id == last + 1
    node.on_fenced(node.epoch, 0, now + 0.02)
    node.on_fenced(node.epoch, 1, now + 0.02)
    to_acceptor, _, to_peers = _drain(node)
    assert _timeout_nows(to_peers) == []  # node 2 does not have the produce yet
    assert _replies(to_acceptor) == []  # nor is it committed
    pushed = [m for to, m in to_peers if to == 2 and type(m) is AppendEntries]
    assert pushed and pushed[-1].entries[-1].trans_id == last + 1
    node.on_peer(AppendAck(node.election.vote_id, 2, last + 1), NODE2, now + 0.03)
    to_acceptor, _, to_peers = _drain(node)
    assert [(o, r["code"]) for o, _, r in _replies(to_acceptor)] == [(Origin(7), 0)]  # answered, and then
    assert _timeout_nows(to_peers) == [(2, TimeoutNow(node.election.vote_id, 1))]


def test_a_hand_off_that_times_out_leads_on_and_serves_what_it_held():
    node, now = _handing_over(forward_request=0)
    node.on_fenced(node.epoch, 0, now)
    node.on_fenced(node.epoch, 1, now)
    to_peers = _drain(node)[2]
    assert _timeout_nows(to_peers)  # sent, but node 2 never takes over
    epoch = node.epoch
    node.on_forward_requests([[Origin(3, False), 1, {"action": 1, "queue": "q", "data": "x", "seq": 1}]], now)
    node.on_undelivered("q", [[5, 1]])
    to_acceptor, to_workers, _ = _drain(node)
    assert to_acceptor == [] and to_workers == []  # held
    t = now
    while t < now + 1.1:  # node 2 answers heartbeats but never campaigns
        t += 0.05
        node.on_peer(HeartbeatAck(node.election.vote_id, 2, node.log.last_trans_id, node.election.vote_id), NODE2, t)
        node.tick(t)
    assert node.role == "leader" and node.election.transfer_target is None
    to_acceptor, to_workers, _ = _drain(node)
    assert _statuses(to_acceptor)[-1]["role"] == "leader"
    kinds = [(i, f[0]) for i, f in to_workers]
    # the workers accept again (a new mode, nothing rolled back: fenced, each logged all it
    # decided); then the held request and the messages to give back reach them
    assert ipc_frames.LOAD not in [k for _, k in kinds]
    assert [orjson.loads(f[1]) for _, f in to_workers if f[0] == ipc_frames.MODE] == [
        [True, epoch + 1, node.seqs.counts[i], node.log.last_trans_id] for i in (0, 1)]
    worker = node.router.worker_for("q")
    mine = [f for i, f in to_workers if i == worker]
    assert [f[0] for f in mine] == [ipc_frames.MODE, ipc_frames.REQ, ipc_frames.UNDELIVER]
    assert mine[1][2] == b"%d" % (epoch + 1)


def test_a_hand_off_that_times_out_before_every_fence_rolls_the_workers_back_to_what_they_logged():
    """A worker that never answered FENCED may still be deciding under the old mode: its new
    mode rolls it back to the records it logged, so that its late batch is refused with nothing
    applied. A fenced one logged all it decided: it undoes nothing, so the long polls and
    subscriptions it kept parked through the fence are served again."""
    node, now = _handing_over()
    _drain(node)  # the fences
    node.on_fenced(node.epoch, 0, now)
    t = now
    while t < now + 1.1:
        t += 0.05
        node.on_peer(HeartbeatAck(node.election.vote_id, 2, node.log.last_trans_id, node.election.vote_id), NODE2, t)
        node.tick(t)
    assert node.role == "leader"
    to_workers = _drain(node)[1]
    assert [f[0] for i, f in to_workers] == [ipc_frames.MODE, ipc_frames.MODE]
    assert [orjson.loads(f[1])[2] for i, f in to_workers] == node.seqs.counts
    epoch = node.epoch
    _batch(node, epoch - 1, [PRODUCE], seq=3)  # worker 1's late batch of the mode that ended
    [(_, _, reply)] = _replies(_drain(node)[0])
    assert reply["reason"] == p.MODE_CHANGED and reply["reason"] in p.NOT_APPLIED


@pytest.mark.parametrize("told", [False, True], ids=["before TimeoutNow", "after TimeoutNow"])
def test_a_hand_off_ends_when_the_leader_loses_its_quorum(told):
    """The whole cluster stopping: the followers stop answering, the target before or after it
    was told to campaign. The leader steps down in its own term; no one is about to lead, so it
    stops holding requests at once instead of for the rest of the hand-off's time. Deposed by a
    newer term, it would wait for the new leader (test_in_redirect_mode_...)."""
    node, now = _handing_over()
    if told:
        node.on_fenced(node.epoch, 0, now)
        node.on_fenced(node.epoch, 1, now)
    assert bool(_timeout_nows(_drain(node)[2])) is told
    node.on_forward_requests([[Origin(3, False), 1, {"action": 1, "queue": "q", "data": "x", "seq": 1}]], now)
    t = now
    while node.role == "leader":
        t += 0.05
        node.tick(t)
    assert t < now + 0.5 and node.election.leader_id is None
    assert not node.handing_off(t)
    (origin, seq, reply), = _replies(_drain(node)[0])  # refused, not held to the end of the hand-off
    assert (origin, reply["code"]) == (Origin(3), -1) and reply["reason"] in p.NOT_APPLIED


def test_in_redirect_mode_requests_held_during_a_hand_off_are_redirected_to_the_new_leader():
    """forward_request 0: the acceptor of a node handing over passes requests to its
    coordinator (its status names itself as leader) rather than redirecting clients to itself;
    once the new leader is known they are redirected there."""
    assert p.passes_to_coordinator(False, 1, 1) and p.passes_to_coordinator(True, 2, 1)
    assert not p.passes_to_coordinator(False, 2, 1)
    node, now = _handing_over(forward_request=0)
    status = _statuses(_drain(node)[0])[-1]
    assert (status["role"], status["leader_node_id"]) == ("follower", 1)
    node.on_fenced(node.epoch, 0, now)
    node.on_fenced(node.epoch, 1, now)
    (_, timeout_now), = _timeout_nows(_drain(node)[2])
    node.on_forward_requests([[Origin(3, False), 1, {"action": 1, "queue": "q", "data": "x", "seq": 1}]], now)
    term = timeout_now.vote_id + 1  # node 2 campaigns at once, and wins
    node.on_peer(VoteRequest(term, 2, node.log.last_trans_id, node.election.vote_id, transfer=True), NODE2, now + 0.01)
    to_acceptor = _drain(node)[0]
    assert node.role == "none" and _replies(to_acceptor) == []  # still held: the leader is not known
    # and its acceptor goes on passing requests here instead of answering "no leader"
    assert all((s["role"], s["leader_node_id"]) == ("follower", 1) for s in _statuses(to_acceptor))
    last, vote = node.log.last_trans_id, node.log.last_vote_id
    node.on_peer(Heartbeat(term, 2, last, vote, last, vote),
                 NODE2, now + 0.02)
    to_acceptor = _drain(node)[0]
    assert (_statuses(to_acceptor)[-1]["role"], _statuses(to_acceptor)[-1]["leader_node_id"]) == ("follower", 2)
    (origin, seq, reply), = _replies(to_acceptor)
    assert (origin, seq, reply["seq"]) == (Origin(3), 1, 1)
    assert (reply["code"], reply["leader_node_id"], reply["leader_host"], reply["leader_port"]) == (
        p.CODE_REDIRECT, 2, "127.0.0.1", 2222)


# ------------------------------------------------------------------ the Ready / advance contract
def test_ready_changes_nothing_and_advance_takes_exactly_it():
    node = _leader()
    assert not node.has_ready()
    empty = node.ready()
    assert (empty.to_workers, empty.to_acceptor, empty.to_peers, empty.vote, empty.role) == ((), (), (), None, None)
    _batch(node, node.epoch, [PRODUCE])
    assert node.has_ready()
    first = node.ready()
    assert node.ready() == first  # taking it twice changes nothing
    node.advance(first, durable_trans_id=first.log_through)
    assert node.ready() != first


def test_a_reply_leaves_in_the_ready_after_the_one_that_persists_its_record():
    """Nothing that depends on a record leaves before the record is on disk: the Ready that asks
    for the produce to be persisted does not hold its reply; the one after advance does."""
    node = _leader()
    _batch(node, node.epoch, [PRODUCE])
    persist = node.ready()
    assert persist.log_through == node.log.last_trans_id and _replies(persist.to_acceptor) == []
    node.advance(persist, durable_trans_id=persist.log_through - 1)  # not all of it is durable yet
    assert not node.has_ready()
    node.advance(node.ready(), durable_trans_id=persist.log_through)
    assert node.has_ready()
    reply = node.ready()
    assert [(o, r["code"]) for o, _, r in _replies(reply.to_acceptor)] == [(Origin(7), 0)]
    node.advance(reply, durable_trans_id=persist.log_through)
    assert not node.has_ready()


def test_replies_a_write_released_are_taken_without_a_second_ready():
    """take_replies hands over what advance released when nothing else waits (no Ready made
    for them), and nothing while anything else waits: that goes in a Ready with the rest."""
    node = _leader()
    assert node.take_replies() == []
    _batch(node, node.epoch, [PRODUCE])
    persist = node.ready()
    assert node.take_replies() == []  # the record is not on disk yet
    node.advance(persist, durable_trans_id=persist.log_through)
    taken = node.take_replies()
    assert [(o, r["code"]) for o, _, r in _replies(tuple(taken))] == [(Origin(7), 0)]
    assert not node.has_ready() and node.take_replies() == []
    _batch(node, node.epoch, [{**PRODUCE, "msg_id": 2}])
    persist = node.ready()
    node.advance(persist, durable_trans_id=persist.log_through)
    node.on_undelivered("q", [[1, 1]])  # something for a worker waits too
    assert node.take_replies() == [] and _replies(node.ready().to_acceptor) != []


def test_only_the_ready_after_a_write_that_just_sends_its_replies_needs_no_write():
    """The coordinator writes the first Ready of a flush (an fsync may be due) and any Ready with
    a log, a truncation or a vote to store; the one carrying the replies the write released
    needs no second write."""
    node = _leader()
    assert node.ready().needs_write(None)
    _batch(node, node.epoch, [PRODUCE])
    persist = node.ready()
    assert persist.needs_write(None) and persist.needs_write(persist.log_through - 1)
    node.advance(persist, durable_trans_id=persist.log_through)
    reply = node.ready()
    assert _replies(reply.to_acceptor) and not reply.needs_write(persist.log_through)
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=2)], seq=2)
    assert node.ready().needs_write(persist.log_through)


def test_a_log_the_disk_refused_claims_nothing_and_is_asked_for_again():
    node = _follower()
    node.on_peer(AppendEntries(1, 2, 0, 0, (Entry(1, 1, PRODUCE),), 0), NODE2, T0 + 0.01)
    refused = _disk_refuses(node)
    assert any(type(m) is AppendAck for _, m in refused.to_peers)
    assert [m for _, m in refused.peer_messages(False, True) if type(m) in (AppendAck, HeartbeatAck)] == []
    assert node.has_ready() and not node.storage_ok
    again = node.ready()
    assert again.log_through == refused.log_through  # still to be written
    node.advance(again, durable_trans_id=again.log_through)
    assert node.storage_ok and not node.has_ready()


def test_a_vote_not_stored_lets_no_peer_message_go():
    node = ClusterNode(_config(3), T0, recovered=Recovered(), rng=random.Random(1))
    now = T0
    while node.ready().vote is None:
        now += 0.05
        node.tick(now)
        for to, msg in node.ready().to_peers:
            if type(msg) is VoteRequest and msg.pre_vote and to == 2:
                node.on_peer(VoteReply(msg.vote_id, 2, True, True), NODE2, now)
    ready = node.ready()
    assert ready.vote == (node.election.vote_id, 1)
    assert any(type(m) is VoteRequest and not m.pre_vote for _, m in ready.peer_messages(True, True))
    assert ready.peer_messages(True, False) == ()
    node.advance(ready, durable_trans_id=ready.log_through)
    assert node.ready().vote is None


def test_a_change_of_role_is_in_one_ready():
    node = ClusterNode(_config(1), T0, recovered=Recovered(), rng=random.Random(1))
    assert node.ready().role == "none"
    node.advance(node.ready())
    node.tick(T0 + 1)
    assert node.ready().role == "leader"
    node.advance(node.ready())
    assert node.ready().role is None


def test_the_coordinators_scatter_requests_are_numbered_odd():
    """The acceptor numbers its own gathers even (from 0): the two never share a gather id."""
    node = _leader()
    plans = [node.router.plan(p.LIST, {"action": p.LIST}, Origin(1), n) for n in range(2)]
    ids = [plan[0][1][3][0] for plan in plans]
    assert ids[0] % 2 == 1 and ids[1] == ids[0] + 2  # (its recovery line's monitor took one before)


# ------------------------------------------------------------------ refused replies, counted


def _deposed(node: ClusterNode) -> None:
    """A leader of three hears a newer term's leader, node 2."""
    node.on_peer(Heartbeat(node.election.vote_id + 1, 2, 0, 0, 0, 0), NODE2, T0 + 3)
    assert node.role == "follower"


def _mode_changed() -> ClusterNode:
    node = _leader()
    _batch(node, node.epoch - 1, [PRODUCE])
    return node


def _leadership_changed() -> ClusterNode:
    node = _leader_of_three()
    epoch = node.epoch
    _deposed(node)
    _batch(node, epoch, [PRODUCE])
    return node


def _leadership_lost() -> ClusterNode:
    node = _leader_of_three()
    _batch(node, node.epoch, [PRODUCE])  # logged; node 2 has not acknowledged it
    _deposed(node)
    return node


def _storage_unavailable() -> ClusterNode:
    node = _leader()
    _batch(node, node.epoch, [PRODUCE])
    _disk_refuses(node)
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=2)], seq=2)
    return node


def _not_leader() -> ClusterNode:
    node = _follower()
    _batch(node, node.epoch, [PRODUCE])
    return node


@pytest.mark.parametrize("refused, reason, label", [
    (_mode_changed, p.MODE_CHANGED, "mode_changed"),
    (_leadership_changed, p.LEADERSHIP_CHANGED, "leadership_changed"),
    (_leadership_lost, p.LEADERSHIP_LOST, "leadership_lost"),
    (_storage_unavailable, p.STORAGE_UNAVAILABLE, "storage_unavailable"),
    (_not_leader, p.NOT_LEADER_RETRY, "not_leader"),
])
def test_a_refused_reply_is_counted_by_reason_and_not_as_a_request_again(refused, reason, label):
    """The worker counted the request when it replied: the error that replaces its reply is a
    refusal, not a second request."""
    node = refused()
    assert [r["reason"] for _, _, r in _replies(_drain(node)[0]) if r["code"] == -1] == [reason]
    assert node.take_refused() == {label: 1}
    assert node.take_refused() == {}  # taken once
    assert node.forwarding.take_replied() == {}


def test_a_refused_batch_counts_its_replies_and_not_a_subscriptions_push():
    node = _leader()
    header, blob = replies.encode([(Origin(7), 1, {"action": 1, "seq": 1, "code": 0}),
                                   (Origin(7), p.PUSH_REQ_NO, {"action": p.SUBSCRIBE, "code": 0}),
                                   (Origin(8), 4, {"action": 3, "seq": 4, "code": 0})])
    node.on_batch(orjson.dumps([PRODUCE]), header, blob, ipc_frames.EMPTY_LIST, node.epoch - 1, T0 + 2)
    assert node.take_refused() == {"mode_changed": 2}


def _recovered_log(*queues: str) -> Recovered:
    """What a disk holds after produces to `queues` (one each, in that order) and no snapshot."""
    entries = [Entry(i, 1, decode(orjson.dumps(dict(PRODUCE, queue=name, msg_id=i))))
               for i, name in enumerate(queues, 1)]
    return Recovered(trans_id=0, vote_id=0, entries=entries, vote=(1, 1))


class _Pipe(list):
    def send_multipart(self, frames: list[bytes]) -> None:
        self.append(list(frames))


def _workers(node: ClusterNode) -> list[Worker]:
    """Real workers for `node` (each keeping the queues its Router gives it), whose output is
    taken by _serve."""
    workers = []
    for i in range(node.config.workers):
        w = Worker({0: PartitionService(1, 100)}, None, _Pipe(), _Quiet(), i,
                   metrics=WorkerMetrics(CollectorRegistry()), owns=lambda q, i=i: node.router.worker_for(q) == i)
        workers.append(w)
    return workers


class _Quiet:
    def error(self, *a, **k) -> None:
        raise AssertionError(a)

    warning = error

    def info(self, *a, **k) -> None:
        pass


def _serve(node: ClusterNode, workers: list[Worker], now: float) -> None:
    """Carry out every Ready, the workers handling what it sends them and their batches going
    back to the node, until nothing is left."""
    while True:
        to_workers = _drain(node)[1]
        for index, frames in to_workers:
            workers[index].dispatch(frames, now)
        sent = False
        for w in workers:
            w.flush()
            for frames in w.coordinator:
                for _group, *batch in ipc_frames.read_batch(frames):
                    node.on_batch(*batch, now, ipc_frames.batch_index(frames))
                sent = True
            w.coordinator.clear()
        if not sent and not node.has_ready():
            return


def test_the_recovery_counts_what_the_log_after_the_snapshot_held_once_replayed():
    node = ClusterNode(_config(1), T0, recovered=_recovered_log("a", "a", "b"), rng=random.Random(1))
    workers = _workers(node)
    assert node.take_replayed() is None  # the log is not replayed before it commits
    node.tick(T0 + 1)
    _serve(node, workers, T0 + 1)
    assert node.log.commit_trans_id == 4  # with the new leader's first entry
    assert node.take_replayed() == (2, 3, 3)  # counted where the recovered log ends
    assert node.take_replayed() is None  # once


def test_a_recovery_count_and_a_client_s_monitor_finished_by_one_batch_are_both_answered():
    # The recovery count's group once took the name of the batch's group in ClusterNode.gather,
    # and the client's monitor then crashed the coordinator (a KeyError: found by CI, a follower
    # installing a snapshot while a test polled its local monitor).
    node = ClusterNode(_config(1), T0, recovered=_recovered_log("a", "a", "b"), rng=random.Random(1))
    workers = _workers(node)
    node.tick(T0 + 1)
    monitor = dict(node.router.plan(p.LOCAL_MONITOR, {"action": p.LOCAL_MONITOR}, Origin(5), 0))
    to_workers = []
    for index, frames in _drain(node)[1]:
        to_workers.append((index, frames))
        if frames[0] == ipc_frames.REQ:  # the recovery count's monitor: the client's right behind it
            to_workers.append((index, ipc_frames.req_frames([monitor[index]], ipc_frames.req_epoch(frames))))
    for index, frames in to_workers:
        workers[index].dispatch(frames, T0 + 1)
    for w in workers:  # each worker's batch holds both parts: the last one finishes both gathers
        w.flush()
        for frames in w.coordinator:
            for _group, *batch in ipc_frames.read_batch(frames):
                node.on_batch(*batch, T0 + 1, ipc_frames.batch_index(frames))
        w.coordinator.clear()
    answered = [(origin, req_no) for frames in _drain(node)[0] for header, blob in ipc_frames.read_rep(frames)
                for origin, req_no, _ in replies.decode(header, blob)]
    assert answered == [(Origin(5), 0)]
    _serve(node, workers, T0 + 1)
    assert node.take_replayed() == (2, 3, 3)


def test_the_recovery_counts_come_from_the_workers_once_the_point_is_committed():
    node = ClusterNode(_config(1), T0, recovered=_recovered_log("a", "a", "b"), rng=random.Random(1))
    node.tick(T0 + 1)
    monitors = [(i, f) for i, f in _drain(node)[1] if f[0] == ipc_frames.REQ]
    # one monitor to each worker, after the log's APPLY on the same pipe, gathered by the node itself
    assert [i for i, _ in monitors] == [0, 1]
    assert all(ipc_frames.read_req(f)[0][3] is not None for _, f in monitors)
    assert node.take_replayed() is None  # not before the workers answered


def test_a_recovered_follower_counts_its_log_once_the_leader_commits_it():
    node = ClusterNode(_config(3), T0, recovered=_recovered_log("a", "b"), rng=random.Random(1))
    workers = _workers(node)
    node.on_peer(Heartbeat(2, 2, 0, 0, 2, 1), NODE2, T0)
    _serve(node, workers, T0)
    assert node.take_replayed() is None
    node.on_peer(AppendEntries(2, 2, 2, 1, (Entry(3, 2, decode(orjson.dumps(dict(PRODUCE, queue="c", msg_id=3)))),),
                               3), NODE2, T0 + 0.05)
    _serve(node, workers, T0 + 0.05)
    assert node.workers_trans_id == 3
    assert node.take_replayed() == (2, 2, 2)  # what the disk held, not the entry the leader added
    assert sum(len(w.services[0].queues) for w in workers) == 3  # the workers went on past it


def _snapshot_part(tmp_path, trans_id: int) -> str:
    """A snapshot part of queues a (one message) and b (two), written at trans_id."""
    s = PartitionService(1, 100)
    for n, queue in enumerate("abb", 1):
        s.handle({"action": 1, "queue": queue, "data": "x"}, Origin(7), n, T0)
    part = str(tmp_path / "part-0.qsp")
    write_part(part, s.snapshot_frames(), trans_id)
    return part


def test_a_recovered_snapshot_alone_is_counted_at_once(tmp_path):
    part = _snapshot_part(tmp_path, 4)
    node = ClusterNode(_config(3), T0, recovered=Recovered(trans_id=4, vote_id=1, parts=(part,)), rng=random.Random(1))
    workers = _workers(node)
    _serve(node, workers, T0)
    assert node.take_replayed() == (2, 3, 4)


def test_a_recovered_v2_snapshot_is_loaded_by_the_workers():
    node = ClusterNode(_config(3), T0, recovered=Recovered(trans_id=4, vote_id=1, parts=("/d/p0", "/d/p1")),
                       rng=random.Random(1))
    # Each worker reads the parts itself (keeping the queues its Router gives it), then is asked
    # what it holds (the recovery line); the coordinator holds no copy.
    assert [(i, f[0]) for i, f in node.ready().to_workers] == [
        (0, ipc_frames.LOAD), (1, ipc_frames.LOAD), (0, ipc_frames.REQ), (1, ipc_frames.REQ)]
    assert [ipc_frames.read_load(f) for _, f in node.ready().to_workers[:2]] == [(4, ["/d/p0", "/d/p1"])] * 2
    assert not hasattr(node, "state")


def test_a_recovered_snapshot_and_the_log_after_it_are_counted_where_that_log_ends(tmp_path):
    part = _snapshot_part(tmp_path, 4)
    entries = [Entry(5, 1, decode(orjson.dumps(dict(PRODUCE, queue="c", msg_id=1))))]
    node = ClusterNode(_config(1), T0, recovered=Recovered(trans_id=4, vote_id=1, parts=(part,), entries=entries),
                       rng=random.Random(1))
    workers = _workers(node)
    node.tick(T0 + 1)
    _serve(node, workers, T0 + 1)
    assert node.take_replayed() == (3, 4, 5)
    assert sorted(q for w in workers for q in w.services[0].queues) == ["a", "b", "c"]


def test_a_node_without_a_disk_reports_no_recovery():
    node = ClusterNode(_config(1), T0, recovered=None, rng=random.Random(1))
    node.tick(T0 + 1)
    _drain(node)
    assert node.role == "leader" and node.take_replayed() is None


def test_a_leader_that_steps_down_rolls_each_worker_back_to_its_last_committed_record():
    node, now = _elected(_config(3))
    _batch(node, node.epoch, [PRODUCE, dict(PRODUCE, msg_id=2)], index=1)  # worker 1: records 1, 2
    committed = node.log.last_trans_id
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=3)], seq=2, index=1)  # record 3: never committed
    _batch(node, node.epoch, [dict(PRODUCE, queue="r")], seq=3, index=0)  # worker 0: record 1
    _drain(node)
    node.on_peer(AppendAck(node.election.vote_id, 2, committed), NODE2, now + 0.01)
    assert node.log.commit_trans_id == committed
    node.tick(now + 0.2)  # the commit watermark: worker 1's records through 2
    committed_frames = [(i, f) for i, f in _drain(node)[1] if f[0] == ipc_frames.COMMITTED]
    assert committed_frames == [(1, ipc_frames.committed_frames(node.epoch, 2))]
    epoch = node.epoch
    node.on_peer(Heartbeat(node.election.vote_id + 1, 2, 0, 0, 0, 0), NODE2, now + 0.3)  # a newer term
    assert node.role == "follower"
    modes = {i: orjson.loads(f[1]) for i, f in _drain(node)[1] if f[0] == ipc_frames.MODE}
    assert modes == {0: [False, epoch + 1, 0, committed], 1: [False, epoch + 1, 2, committed]}
    assert node.seqs.counts == [0, 2] and node.workers_trans_id == committed


# ---------------------------------------------------------------------- snapshots made by the workers
SNAPS = "/data/snapshots"
PART = {"file": "part-0.qsp", "bytes": 100, "queues": 1, "messages": 1}


def _cutting(node: ClusterNode, now: float) -> tuple[int, int, str, list]:
    """Tick the node into a cut, every worker answering a leader's SYNC at once: (epoch, cut id,
    tmp dir, the SNAPs' hold flags)."""
    node.tick(now)
    sent = _drain(node)[1]
    for i, f in sent:
        if f[0] == ipc_frames.SYNC:
            node.on_synced(*ipc_frames.read_sync(f), i, now)
            sent += _drain(node)[1]
    snaps = [(i, ipc_frames.read_snap(f)) for i, f in sent if f[0] == ipc_frames.SNAP]
    assert [i for i, _ in snaps] == [0, 1]
    epoch, cut_id, tmp, _ = snaps[0][1]
    assert tmp.startswith(SNAPS + "/tmp-")
    return epoch, cut_id, tmp, [s[3] for _, s in snaps]


def _kinds(to_workers: list) -> list[tuple[int, bytes]]:
    return [(i, f[0]) for i, f in to_workers]


def _single_leader_with_disk() -> ClusterNode:
    node = ClusterNode(_config(1, snapshot_every=2), T0, recovered=Recovered(), rng=random.Random(1),
                       snapshot_dir=SNAPS)
    node.tick(T0 + 1)
    _drain(node)
    return node


def test_a_leader_s_cut_holds_the_snapped_workers_and_takes_t_at_the_last_snapped():
    node = _single_leader_with_disk()
    _batch(node, node.epoch, [PRODUCE])
    _drain(node)
    epoch, cut_id, tmp, holds = _cutting(node, T0 + 2)
    assert holds == [True, True]  # the workers decide meanwhile: each holds its output once forked
    node.on_snapped(epoch, cut_id, 0, T0 + 2)
    # Worker 1's batch, decided before its fork (ahead of its SNAPPED on its pipe): inside the cut.
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=2)], seq=2)
    assert not [k for k in _kinds(_drain(node)[1]) if k[1] == ipc_frames.RELEASE]
    last = node.log.last_trans_id
    node.on_snapped(epoch, cut_id, 1, T0 + 2.01)
    assert _kinds(_drain(node)[1]) == [(0, ipc_frames.RELEASE), (1, ipc_frames.RELEASE)]
    assert node.cuts.trans_id == last
    node.on_part_done(cut_id, 1, True, dict(PART, file="part-1.qsp"), T0 + 5)
    assert node.ready().snapshots == ()  # worker 0's part is not written yet
    node.on_part_done(cut_id, 0, True, PART, T0 + 5)
    ready = node.ready()
    (published,) = ready.snapshots
    assert published[:4] == (last, node.log.term_at(last), tmp, (PART, dict(PART, file="part-1.qsp")))
    assert (published.held, published.took) == pytest.approx((0.01, 3.0))  # from the SNAPs to T, to now
    node.advance(ready, durable_trans_id=ready.log_through)
    assert node.ready().snapshots == () and not node.cuts.running
    node.tick(T0 + 3)  # the next cut waits for snapshot_every more committed records
    assert not node.cuts.running


def test_a_cut_whose_workers_do_not_all_fork_in_time_is_abandoned_and_releases_the_others():
    node = _single_leader_with_disk()
    for n in range(2):
        _batch(node, node.epoch, [dict(PRODUCE, msg_id=n + 1)], seq=n)
    _drain(node)
    epoch, cut_id, tmp, _ = _cutting(node, T0 + 2)
    node.on_snapped(epoch, cut_id, 0, T0 + 2)
    node.tick(T0 + 2 + SNAP_HOLD_TIMEOUT / 2)
    assert node.cuts.running
    node.tick(T0 + 2 + SNAP_HOLD_TIMEOUT)
    ready = node.ready()
    assert _kinds(ready.to_workers) == [(0, ipc_frames.RELEASE), (1, ipc_frames.RELEASE)]
    (failed,) = ready.snapshots
    assert (type(failed), failed.trans_id, failed.tmp) == (Failed, None, tmp)
    assert "within 0.5 s" in failed.reason
    node.advance(ready, durable_trans_id=ready.log_through)
    node.on_snapped(epoch, cut_id, 1, T0 + 2.8)  # too late: that cut is over
    node.on_part_done(cut_id, 0, True, PART, T0 + 2.9)
    ready = node.ready()
    assert (ready.to_workers, ready.snapshots) == ((), (Clear(tmp),))  # what it wrote goes, nothing else
    node.advance(ready, durable_trans_id=ready.log_through)
    node.tick(T0 + 3)  # the workers were busy: the next try comes RETRY_AFTER after the timeout
    assert not node.cuts.running
    node.tick(T0 + 2 + SNAP_HOLD_TIMEOUT + RETRY_AFTER)
    assert node.cuts.running


def test_a_cut_ends_at_a_mode_change_and_publishes_only_what_is_committed():
    node, now = _elected(_config(3, snapshot_every=1))
    node.cuts.snapshot_dir = SNAPS
    # Committed: one produce, acknowledged by node 2.
    _batch(node, node.epoch, [PRODUCE])
    _drain(node)
    node.on_peer(AppendAck(node.election.vote_id, 2, node.log.last_trans_id), NODE2, now)
    _drain(node)
    epoch, cut_id, tmp, _ = _cutting(node, now + 0.01)
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=2)], seq=2)  # logged before the forks, not committed
    for i in range(2):
        node.on_snapped(epoch, cut_id, i, now + 0.01)
        node.on_part_done(cut_id, i, True, PART, now + 0.01)
    _drain(node)
    t = node.cuts.trans_id
    assert t == node.log.last_trans_id > node.log.commit_trans_id and node.cuts.running  # waits for the commit
    node.on_peer(AppendAck(node.election.vote_id, 2, t), NODE2, now + 0.02)
    (published,) = node.ready().snapshots
    assert (type(published), published.trans_id) == (Publish, t)
    _drain(node)
    # The next cut; a newer term deposes the leader before its T is committed: never published.
    _batch(node, node.epoch, [dict(PRODUCE, msg_id=3)], seq=3)
    _drain(node)
    node.on_peer(AppendAck(node.election.vote_id, 2, node.log.last_trans_id), NODE2, now + 0.03)
    _drain(node)
    epoch, cut_id, tmp, _ = _cutting(node, now + 0.04)
    for i in range(2):
        node.on_snapped(epoch, cut_id, i, now + 0.04)
    node.on_peer(Heartbeat(node.election.vote_id + 1, 2, 0, 0, 0, 0), NODE2, now + 0.05)
    ready = node.ready()
    (failed,) = ready.snapshots
    assert (type(failed), failed.tmp, failed.reason) == (Failed, tmp, "the workers' mode changed")
    node.advance(ready)
    node.on_part_done(cut_id, 0, True, PART, now + 0.06)
    node.on_part_done(cut_id, 1, True, PART, now + 0.06)
    assert node.ready().snapshots == (Clear(tmp), Clear(tmp))  # never published: deleted


def test_a_follower_s_cut_holds_nothing_and_its_t_is_what_its_workers_were_sent():
    node = ClusterNode(_config(3, snapshot_every=1), T0, recovered=Recovered(), rng=random.Random(1),
                       snapshot_dir=SNAPS)
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0)
    node.on_peer(AppendEntries(1, 2, 0, 0, (Entry(1, 1, decode(orjson.dumps(PRODUCE))),), 1), NODE2, T0 + 0.01)
    _, to_workers, _ = _drain(node)
    assert ipc_frames.APPLY in [f[0] for _, f in to_workers]
    epoch, cut_id, tmp, holds = _cutting(node, T0 + 0.02)
    assert holds == [False, False] and node.cuts.trans_id == node.workers_trans_id == 1
    node.on_part_done(cut_id, 0, True, PART, T0 + 5)
    node.on_part_done(cut_id, 1, False, {"error": "No space left on device"}, T0 + 5)  # the cut fails
    (failed,) = node.ready().snapshots
    assert (type(failed), failed.trans_id) == (Failed, 1)
    assert failed.reason == "worker 1 could not write its part: No space left on device"


def test_a_follower_whose_commits_reach_snapshot_every_asks_to_be_woken_for_its_cut():
    # A follower's election timer never fires while its leader is heard: the coordinator ticks it
    # when wake_at says, so the cut that is due must say so itself.
    node = ClusterNode(_config(3, snapshot_every=2), T0, recovered=Recovered(), rng=random.Random(1),
                       snapshot_dir=SNAPS)
    node.on_peer(Heartbeat(1, 2, 0, 0, 0, 0), NODE2, T0)
    node.on_peer(AppendEntries(1, 2, 0, 0, (Entry(1, 1, decode(orjson.dumps(PRODUCE))),), 1), NODE2, T0 + 0.01)
    _drain(node)
    assert node.wake_at() > T0 + 0.15  # one record committed: nothing due before the election timer
    node.on_peer(AppendEntries(1, 2, 1, 1, (Entry(2, 1, decode(orjson.dumps(PRODUCE))),), 2), NODE2, T0 + 0.02)
    _drain(node)
    assert node.wake_at() <= T0 + 0.02  # two: the cut is due now
    epoch, cut_id, tmp, holds = _cutting(node, T0 + 0.02)
    assert holds == [False, False] and node.cuts.trans_id == 2
    assert node.wake_at() > T0 + 0.15  # running: no busy wake for it
    node.on_part_done(cut_id, 0, True, PART, T0 + 0.1)
    node.on_part_done(cut_id, 1, True, PART, T0 + 0.1)
    (published,) = node.ready().snapshots
    assert (type(published), published.trans_id) == (Publish, 2)
    _drain(node)
    assert node.wake_at() > T0 + 0.15  # the next one waits for two more committed records


def test_a_node_without_a_disk_makes_no_cuts():
    node = ClusterNode(_config(1, snapshot_every=1), T0, recovered=None, rng=random.Random(1))
    node.tick(T0 + 1)
    for n in range(3):
        _batch(node, node.epoch, [dict(PRODUCE, msg_id=n + 1)], seq=n)
    node.tick(T0 + 3)
    assert ipc_frames.SNAP not in [f[0] for _, f in _drain(node)[1]]


# ---------------------------------------------------------------------- snapshots streamed to a follower
def _leader_with_node_3_behind(snapshot_dir: str | None, wal_from: int | None = None) -> tuple[ClusterNode, float]:
    """Node 1 of three, leading; node 2 holds its log, node 3 asks for what follows trans_id 0,
    which the log no longer keeps (but the WAL does from wal_from on)."""
    node, now = _elected(_config(3, queue_log_size=2, snapshot_every=1_000_000))
    node.cuts.snapshot_dir = snapshot_dir
    node.set_wal_from(wal_from)
    vote = node.election.vote_id
    for n in range(5):
        _batch(node, node.epoch, [dict(PRODUCE, msg_id=n + 1)], seq=n)
        _drain(node)
        node.on_peer(AppendAck(vote, 2, node.log.last_trans_id), NODE2, now)
        _drain(node)
    assert node.log.base_trans_id > 0
    node.on_peer(Pull(vote, 3, 0, 0, 0), ("127.0.0.1", 3333), now + 1)  # after the probe's resend interval
    return node, now


def test_a_leader_with_a_disk_streams_a_follower_behind_its_log_the_snapshot_it_cuts():
    node, now = _leader_with_node_3_behind(SNAPS)
    vote = node.election.vote_id
    assert not [m for _, m in _drain(node)[2] if type(m) in (InstallSnapshot, SnapshotChunk)]  # none in memory
    _cutting(node, now + 1.01)  # a cut starts at once
    t = node.log.commit_trans_id
    source = SnapshotSource(t, vote, ((SNAPS + "/m", 10), (SNAPS + "/p0", 5)))
    node.on_snapshot_source(source, now + 1.5)  # published
    chunks = [(to, m) for to, m in _drain(node)[2] if type(m) is SnapshotChunk]
    assert [(to, m.trans_id, m.part, m.data) for to, m in chunks] == [
        (3, t, -1, FileRange(SNAPS + "/m", 0, 10)), (3, t, 0, FileRange(SNAPS + "/p0", 0, 5))]


def test_a_leader_feeds_a_follower_behind_its_log_from_the_wal_as_the_bytes_it_read():
    """Within the WAL (wal_from) the follower gets ordinary AppendEntries of the bytes the disk
    gave, decoded nowhere on the way, and no snapshot is cut; a read that fails falls back to
    one."""
    node, now = _leader_with_node_3_behind(SNAPS, wal_from=0)
    vote = node.election.vote_id
    assert node.log.base_trans_id > 3
    assert not [m for _, m in _drain(node)[2] if type(m) in (InstallSnapshot, SnapshotChunk, AppendEntries)]
    (read,) = node.take_log_reads()
    assert (read.to, read.after, read.max_bytes) == (3, 0, 1 << 20) and node.take_log_reads() == []
    wal = [(1, vote, encode(decode(b'{"op":"noop"}')))] + [
        (t, vote, orjson.dumps(dict(PRODUCE, msg_id=t - 1))) for t in range(2, 7)]
    node.on_log_read(read, wal, now + 1)
    (batch,) = [m for to, m in _drain(node)[2] if to == 3 and type(m) is AppendEntries]
    assert (batch.prev_trans_id, batch.prev_vote_id) == (0, 0)
    assert [(e.trans_id, e.vote_id, e.data) for e in batch.entries] == wal
    assert all(e._record is None for e in batch.entries)  # not decoded by the leader
    assert not node.cuts.urgent
    # the follower asks from 3 again; the disk fails this time: a snapshot is cut for it
    node.on_peer(Pull(vote, 3, 3, vote, 0), ("127.0.0.1", 3333), now + 3)
    _drain(node)
    (read,) = node.take_log_reads()
    assert read.after == 3
    node.on_log_unreadable(read, now + 3)
    assert node.cuts.urgent


def test_a_node_without_a_snapshot_dir_has_no_snapshot_to_send():
    node, now = _leader_with_node_3_behind(None)
    node.tick(now + 1.01)
    sent = _drain(node)
    assert not [m for _, m in sent[2] if type(m) in (InstallSnapshot, SnapshotChunk)]  # no copy in memory
    assert ipc_frames.SNAP not in [f[0] for _, f in sent[1]]  # and nowhere to cut one


def test_a_follower_writes_the_streamed_chunks_then_installs_and_loads_the_snapshot(tmp_path):
    node = _follower()
    frames = list(_service_frames())
    part = str(tmp_path / "part-0.qsp")
    entry = write_part(part, frames, 9)
    manifest = orjson.dumps({"format": 2, "trans_id": 9, "vote_id": 1, "parts": [entry]})
    data = open(part, "rb").read()
    node.on_peer(SnapshotChunk(1, 2, 9, 1, -1, 0, len(manifest), manifest), NODE2, T0 + 0.1)
    node.on_peer(SnapshotChunk(1, 2, 9, 1, 0, 0, len(data), data), NODE2, T0 + 0.1)
    ready = node.ready()
    assert [(w.part, w.offset) for w in ready.chunk_writes] == [(-1, 0), (0, 0)]
    assert [m for _, m in ready.to_peers] == [SnapshotAck(1, 1, 9, 0, 0), SnapshotAck(1, 1, 9, 1, 0)]
    (staged,) = ready.staged
    node.advance(ready, durable_trans_id=ready.log_through)
    assert node.needs_snapshot(9) and node.log.last_trans_id == 0  # nothing replaced before it is installed
    assert node.on_snapshot_installed(staged, [part], T0 + 0.2)
    ready = node.ready()
    assert ready.truncate_after == -1
    assert [(i, f) for i, f in ready.to_workers if f[0] == ipc_frames.LOAD] == [
        (i, ipc_frames.load_frames(9, [part])) for i in range(2)]
    assert [m for _, m in ready.to_peers] == [AppendAck(1, 1, 9)]
    assert (node.log.base_trans_id, node.log.commit_trans_id, node.workers_trans_id) == (9, 9, 9)
    assert not node.needs_snapshot(9)


def _service_frames():
    """The snapshot frames of two queues of one message each."""
    s = PartitionService(1, 100)
    s.handle({"action": 1, "queue": "a", "data": "x"}, Origin(7), 1, T0)
    s.handle({"action": 1, "queue": "b", "data": "y"}, Origin(7), 2, T0)
    return s.snapshot_frames()


def test_an_in_memory_node_cuts_a_snapshot_only_when_a_follower_needs_one():
    node = ClusterNode(_config(1, snapshot_every=1), T0, recovered=None, rng=random.Random(1), snapshot_dir=SNAPS)
    node.tick(T0 + 1)
    for n in range(3):
        _batch(node, node.epoch, [dict(PRODUCE, msg_id=n + 1)], seq=n)
    node.tick(T0 + 3)
    assert ipc_frames.SNAP not in [f[0] for _, f in _drain(node)[1]]
    node.cuts.want()  # what SendSnapshot does
    _cutting(node, T0 + 4)
