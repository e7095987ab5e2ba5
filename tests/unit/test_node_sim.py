"""A deterministic randomized simulation of whole nodes: the real ClusterNode (server/cluster.py)
as the coordinator, the real Worker and PartitionService (workers/) as the workers, a model of
the acceptor's decisions (server/dispatch.py: routing by role and epoch, forwarding, the fence),
the acceptor's give-back of undelivered replies,
and clients that produce and consume at-most-once and at-least-once messages the way
QueueClient and the fault tests' workload do: one request at a time per connection, a timeout
after which the connection is closed and another node is tried, confirm after an at-least-once
consume, long polls now and then.

Inside a node every pipe (acceptor -> worker, worker -> coordinator, coordinator -> worker,
coordinator -> acceptor, acceptor -> coordinator) is FIFO with its own random delays, and now
and then a long stall (a process descheduled under CPU load): the orders in which a node's
processes see each other's messages are those ZeroMQ allows. Between nodes the network delays,
loses, duplicates and reorders every message (through the protobuf codec), and is partitioned.
Nodes crash (keeping their log, snapshots and vote, as on disk) and pause (SIGSTOP: every process
stops, its inputs pile up, and on SIGCONT each process resumes at its own moment). Each node's
disk is a directory of its own: its workers write snapshot parts there (inline, where a node
forks a writer), published as the coordinator does; a follower behind the leader's log gets the
leader's snapshot files in chunks, and a restart loads the newest snapshot and the log after it.

Checked on every seed:
* no at-most-once message is delivered twice;
* nothing is delivered that was never produced;
* every acknowledged produce of an at-least-once message is delivered (after the faults heal,
  the consumers drain the queues);
* every request a node took gets exactly one reply, however late (a long poll of a connection
  that closed may be dropped); a message to a node that is down fails to send at once, as
  ZeroMQ's does, and the sender handles it as unsent;
* every node commits the same entry at each trans_id;
* after every MODE that undid records, the worker holds exactly the committed log replayed (an
  oracle the test keeps) plus the node's log up to the MODE's trans_id;
* the nodes converge: one leader, every node committed all of its log, and every node's workers
  hold exactly the committed log replayed.

GroupSim runs the same with three queue groups on every node (issue 28): each group's
election, log, commit, snapshots and workers' modes, checked per group as above, with the
leaders spreading by election/balance.py under the faults.

SIM_SEEDS=<n> runs more seeds; a failing seed is printed with its first violation and can be
rerun alone: `python -m tests.unit.test_node_sim 3 <seed>`.
"""
from __future__ import annotations

import heapq
import logging
import os
import random
import shutil
import tempfile
from collections import Counter
from typing import Any, Callable

import orjson
from prometheus_client import CollectorRegistry

from queue_server.config.loader import parse_config
from queue_server.replication import wire
from tests.unit import simulation
from queue_server.replication.log import Entry
from queue_server.replication.messages import Forward, GiveBack, Recovered, SnapshotAck
from queue_server.replication.snapshot import clean, latest_manifest, manifest_files, publish, snapshot_name
from queue_server.replication.transfer import SnapshotSource
from queue_server.protocol import ipc_frames, replies
from queue_server.protocol.origin import Origin
from queue_server.client import protocol as p
from queue_server.protocol import vocabulary as sp
from queue_server.server.cluster import ClusterNode
from queue_server.server import batching
from queue_server.server.metrics import WorkerMetrics
from queue_server.server.dispatch import TO_COORDINATOR, Dispatch
from queue_server.server.forwarding import FORWARD_GRACE
from queue_server.server.snapshot_child import write_part_inline
from queue_server.server.snapshots import Clear, Publish
from queue_server.server.transfers import Transfers
from queue_server.server.router import Router
from queue_server.workers.service import PartitionService
from queue_server.workers.undo import UNDO_LIMIT
from queue_server.server.worker import Worker

SEEDS = int(os.environ.get("SIM_SEEDS", "60"))
GROUP_SEEDS = int(os.environ.get("SIM_SEEDS", "20"))  # GroupSim's: each seed runs three groups
IDEMPOTENT_PRODUCE = os.environ.get("SIM_PLAIN_PRODUCE") is None

CHAOS = 6.0  # seconds of faults
WRITES_UNTIL = CHAOS + 0.5  # producers stop here; consumers go on draining
# After the faults heal, the consumers must keep delivering at-least-once messages not seen before
# (a slow seed drains a long queue at its own pace) until every acknowledged one is delivered;
# STALL seconds without such a delivery, or DRAIN_CAP in all, is a violation.
STALL = 10.0
ONCE = (Forward, GiveBack)  # the peer messages the sim's network never duplicates (Sim.net)
DRAIN_CAP = 120.0
CLIENT_TIMEOUT = 1.0
TICK = 0.005
ALO, AMO = "alo", "amo"
# The admin client's queue and what it does to it: dead letters (max_deliveries 1, never
# confirmed), pause/resume, purge, delete and replay, all of which must converge like the rest.
ADM = "adm"
ADMIN_REQUESTS = [
    p.produce_request(ADM, "x", retry=0.05, max_deliveries=1),
    p.produce_request(ADM, ["y", "z"], retry=0.05),
    p.consume_request(ADM, 2),
    {"action": sp.PAUSE, "queue": ADM},
    {"action": sp.RESUME, "queue": ADM},
    {"action": sp.PURGE, "queue": ADM},
    {"action": sp.DELETE_QUEUE, "queue": ADM},
    {"action": sp.DLQ_REPLAY, "queue": ADM},
    {"action": sp.PEEK, "queue": ADM, "state": "dead"},
    {"action": sp.LOCAL_PEEK, "queue": ADM},
]
ALO_RETRY = 0.3  # the lease of an at-least-once delivery
ABANDON = 0.05  # share of consumes whose client closes the connection before the reply
WORKERS = 2
HANDOFF_TIMEOUT = 1.0  # a leader's hand-off before a graceful stop (shutdown_grace's share)
DRAIN = 0.05  # the acceptor's drain after the hand-off, before the node stops
COORD, ACCEPTOR = "coordinator", "acceptor"


class Violation(AssertionError):
    pass


def _worker_proc(index: int) -> str:
    return f"worker-{index}"


# ------------------------------------------------------------------------------------------ node


class SimAcceptor(Dispatch):
    """The acceptor's own decisions (server/dispatch.py Dispatch: routing by role and epoch,
    forwarding, the fence) and its give-back of undelivered replies, over sim pipes."""

    def __init__(self, node: "SimNode") -> None:
        self.node = node
        cfg = node.config
        Dispatch.__init__(self, Router(cfg.workers, [(v.name, v.queue_list) for v in cfg.virtual_queue_list],
                                       cfg.dead_letter_suffix, groups=cfg.queue_groups), node.node_id,
                          cfg.forward_request,
                          {"leader_node_id": node.node_id, "leader_host": cfg.host, "leader_port": cfg.port},
                          cfg.placement())
        self.conns: dict[int, "SimClient"] = {}
        self.next_conn = 1
        # Requests taken and not yet answered, (conn, req_no) -> (when, request): each must get
        # exactly one reply, whether its client is still there or not; but a long poll of a
        # connection that closed may be dropped unanswered (PartitionService.cancel), and moves to
        # `dropped` then.
        self.unanswered: dict[tuple[int, int], tuple[float, dict]] = {}
        self.dropped: set[tuple[int, int]] = set()

    def connect(self, client: "SimClient") -> int:
        conn = self.next_conn
        self.next_conn += 1
        self.conns[conn] = client
        return conn

    def close(self, conn: int) -> None:
        polls = [key for key, (_, req) in self.unanswered.items() if key[0] == conn and req.get("wait")]
        for key in polls:
            del self.unanswered[key]
        self.dropped.update(polls)
        self.forget(conn)  # as server/acceptor.py unregister does
        if self.conns.pop(conn, None) is not None:
            for i in range(self.node.config.workers):
                self.node.pipe(ACCEPTOR, _worker_proc(i), ipc_frames.close_frames(conn))

    def on_request(self, conn: int, req_no: int, value: dict) -> None:
        if conn in self.conns:
            self.unanswered[(conn, req_no)] = (self.node.sim.now, value)
            self.submit(Origin(conn), req_no, value)

    def schedule_requests(self) -> None:
        self.flush_requests()  # one request per sim event: its loop turn ends with it

    def send(self, index: int, frames: list[bytes]) -> None:
        self.node.pipe(ACCEPTOR, COORD if index == TO_COORDINATOR else _worker_proc(index), frames)

    def reply(self, origin: Origin, req_no: int, reply: dict) -> None:
        self.deliver(origin, req_no, orjson.dumps(reply))

    def deliver(self, origin: Origin, req_no: int, data: bytes) -> None:
        key = (origin.conn, req_no)
        if self.unanswered.pop(key, None) is None and key not in self.dropped:
            raise Violation(f"node {self.node.node_id}: a reply to request {req_no} of connection {origin.conn}, "
                            f"which was not owed one (a second reply?): {data[:200]!r}")
        self.dropped.discard(key)
        client = self.conns.get(origin.conn)
        if client is not None and (self.polls or self.ended) and not self.owed(origin, req_no):
            client = None  # answered here already (end_forwarded_polls): given back, as server/acceptor.py does
        if client is None:
            given = sp.delivered(orjson.loads(data))
            if given is not None:
                self.node.sim.undelivered += len(given[1])
                self.node.pipe(ACCEPTOR, COORD, ipc_frames.undeliver_frames(*given))
            return
        self.node.sim.to_client(client, origin.conn, req_no, orjson.loads(data))

    def on_inbox(self, frames: list[bytes]) -> None:
        if frames[0] == ipc_frames.REP:
            for header, blob in ipc_frames.read_rep(frames):
                for origin, req_no, data in replies.decode(header, blob):
                    self.deliver(origin, req_no, data)
        elif frames[0] == ipc_frames.STATUS:
            self.on_status(ipc_frames.read_status(frames))


class _Pipe:
    """A worker's PUSH socket to the coordinator or the acceptor."""

    def __init__(self, node: "SimNode", src: str, dst: str) -> None:
        self.node, self.src, self.dst = node, src, dst

    def send_multipart(self, frames: list[bytes]) -> None:
        self.node.pipe(self.src, self.dst, list(frames))


class _Quiet:
    def error(self, *a: Any, **k: Any) -> None:
        raise Violation(f"worker error: {a}")

    warning = error

    def info(self, *a: Any, **k: Any) -> None:
        pass


_SIM_LOG = logging.getLogger("node_sim")


class SimDisk:
    """A node's disk, kept across its crashes: the vote, the log as written (replication/storage.py
    Storage.write's rules, as a dict), and real snapshot files in a directory of its own, published
    as Storage.finish_snapshot does (what Transfers and the coordinator ask of a Storage)."""

    def __init__(self, directory: str) -> None:
        self.snapshot_dir = directory
        os.makedirs(directory)
        self.vote: tuple[int, int | None] = (0, None)
        self.log: dict[int, Entry] = {}
        self.base = 0  # the log on disk starts after this trans_id
        self.valid_at = 0  # the newest published snapshot

    def write(self, log, truncate_after: int | None, through: int) -> None:
        disk = self.log
        last = max(disk) if disk else self.base
        if truncate_after is not None:
            if truncate_after < log.base_trans_id or log.last_trans_id < truncate_after:
                disk.clear()
                self.base = last = log.base_trans_id
            elif truncate_after < last:
                for t in range(truncate_after + 1, last + 1):
                    disk.pop(t, None)
                last = truncate_after
        if through > last:
            entries = log.entries_after(last, through - last)
            if entries is None:
                disk.clear()
                self.base = last = log.base_trans_id
                entries = log.entries_after(last, through - last) or []
            for e in entries:
                disk[e.trans_id] = e

    def finish_snapshot(self, trans_id: int, vote_id: int, tmp: str, parts: list[dict], how: str = "") -> None:
        publish(self.snapshot_dir, tmp, trans_id, vote_id, parts, keep_from=self.valid_at)
        self.valid_at = trans_id

    def abort_snapshot(self, tmp: str) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def snapshot_source(self) -> SnapshotSource | None:
        if not self.valid_at:
            return None
        return SnapshotSource(*manifest_files(os.path.join(self.snapshot_dir, snapshot_name(self.valid_at))))

    def recover(self) -> Recovered:
        """What a restart finds: the newest snapshot (its parts checked) and the log after it."""
        clean(self.snapshot_dir)
        found = Recovered(vote=self.vote)
        latest = latest_manifest(self.snapshot_dir, warn=_fail)
        if latest is not None:
            found.trans_id, found.vote_id, found.parts = latest.trans_id, latest.vote_id, latest.parts
        t = found.trans_id
        while t + 1 in self.log:
            t += 1
            found.entries.append(self.log[t])
        self.valid_at = found.trans_id
        return found


def _fail(line: str) -> None:
    raise Violation(line)


class SimNode:
    """One node's processes, each fed by the simulation's event loop."""

    def __init__(self, sim: "Sim", node_id: int, disk: dict[int, SimDisk]) -> None:
        """disk: the node's disk of each queue group."""
        self.sim = sim
        self.node_id = node_id
        self.config = sim.configs[node_id]
        self.incarnation = sim.incarnation[node_id]
        self.paused: set[str] = set()  # processes stopped (SIGSTOP, or descheduled under load)
        self.backlog: dict[str, list] = {}
        self.disk = disk
        found = {g: d.recover() for g, d in disk.items()}
        first = min(disk)  # the node's first group (group 0, unless it is no replica of it)
        self.cn = ClusterNode(self.config, sim.now, recovered=found[first],
                              rng=random.Random(sim.seed * 7919 + node_id * 101 + self.incarnation),
                              snapshot_dir=disk[first].snapshot_dir,
                              disks={g: (found[g], disk[g].snapshot_dir) for g in found if g != first})
        self.watch_commits()
        self.transfers = {g: Transfers(self.cn.groups[g], d, d.snapshot_dir, _SIM_LOG)  # type: ignore[arg-type]
                          for g, d in disk.items()}
        self.workers = []
        for i in range(self.config.workers):
            services = {g: PartitionService(node_id, self.config.queue_size, {}, max_wait=self.config.max_wait,
                                            max_deliveries=self.config.max_deliveries,
                                            dead_letter_suffix=self.config.dead_letter_suffix,
                                            undo_limit=UNDO_LIMIT) for g in disk}
            for service in services.values():
                service.accepting = False
            self.workers.append(Worker(services, None, _Pipe(self, _worker_proc(i), COORD), _Quiet(), i,
                                       metrics=WorkerMetrics(CollectorRegistry()),
                                       acceptor=_Pipe(self, _worker_proc(i), ACCEPTOR),
                                       owns=lambda q, i=i: self.cn.router.worker_for(q) == i,
                                       write_inline=write_part_inline))
        for i, w in enumerate(self.workers):
            for g, service in w.services.items():
                service.rollback = self.checked_rollback(i, g)  # type: ignore[method-assign]
        self.acceptor = SimAcceptor(self)
        # The oracle of rollbacks, per queue group: what each worker must hold after the MODE of
        # an epoch, built from the committed log (this node's replay of it: `oracle`, at
        # oracle_trans_id) and this node's log up to the trans_id the MODE names.
        self.expected: dict[tuple[int, int, int], tuple[int, bytes]] = {}
        self.oracle = {g: sim.replay_to(found[g].trans_id, g) for g in disk}
        self.oracle_trans_id = {g: found[g].trans_id for g in disk}
        self.coord_flush()

    def watch_commits(self) -> None:
        """Every committed entry the node sees goes into the sim's history of the committed log
        (checked to agree across nodes) and into this node's oracle."""
        for g, group in self.cn.groups.items():
            self._watch(g, group)

    def _watch(self, g: int, group) -> None:
        commit = group._commit

        def watched(c) -> None:
            self.sim.record_committed(c.entries, g)
            fresh = [e for e in c.entries if e.trans_id > self.oracle_trans_id[g]]
            if fresh and fresh[0].trans_id != self.oracle_trans_id[g] + 1:  # an installed snapshot in between
                self.oracle[g] = self.sim.replay_to(fresh[0].trans_id - 1, g)
            for e in fresh:
                self.oracle[g].apply(e.record)
            if fresh:
                self.oracle_trans_id[g] = fresh[-1].trans_id
            commit(c)
        group._commit = watched  # type: ignore[method-assign]

    # pipes and processes
    def pipe(self, src: str, dst: str, frames: list[bytes]) -> None:
        self.sim.pipe(self, src, dst, frames)

    def handle(self, proc: str, frames: list[bytes]) -> None:
        now = self.sim.now
        if proc == COORD:
            kind = frames[0]
            if kind == ipc_frames.BATCH:
                for group, *batch in ipc_frames.read_batch(frames):
                    self.cn.on_batch(*batch, now, ipc_frames.batch_index(frames), group)
            elif kind == ipc_frames.FORWARD:
                self.cn.on_forward_requests(ipc_frames.read_forward(frames), now)
            elif kind == ipc_frames.UNDELIVER:
                self.cn.on_undelivered(*ipc_frames.read_undeliver(frames))
            elif kind == ipc_frames.FENCED:
                self.cn.on_fenced(*ipc_frames.read_fenced(frames), now, ipc_frames.group_of(frames))
            elif kind == ipc_frames.SYNCED:
                self.cn.on_synced(*ipc_frames.read_synced(frames), now, ipc_frames.group_of(frames))
            elif kind == ipc_frames.SNAPPED:
                self.cn.on_snapped(*ipc_frames.read_snapped(frames), now, ipc_frames.group_of(frames))
            elif kind == ipc_frames.PART_DONE:
                self.cn.on_part_done(*ipc_frames.read_part_done(frames), now, ipc_frames.group_of(frames))
            else:
                raise Violation(f"coordinator got {kind!r}")
            self.coord_timer()
        elif proc == ACCEPTOR:
            self.acceptor.on_inbox(frames)
        else:
            index = int(proc.rsplit("-", 1)[1])
            w = self.workers[index]
            w.dispatch(frames, now)
            self.worker_after(w)

    def expect(self, index: int, frames: list[bytes]) -> None:
        """A MODE leaves for worker `index`: note what the worker must then hold."""
        _accepting, epoch, keep_through, trans_id = ipc_frames.read_mode(frames)
        g = ipc_frames.group_of(frames)
        log = self.cn.groups[g].log
        if keep_through is None or trans_id is None or self.oracle_trans_id[g] > trans_id:
            return
        if log.base_trans_id > self.oracle_trans_id[g]:  # a snapshot was installed since the last commit
            self.oracle[g] = self.sim.replay_to(log.base_trans_id, g)
            self.oracle_trans_id[g] = log.base_trans_id
        entries = log.entries_after(self.oracle_trans_id[g], 1 << 62)
        if entries is None:
            raise Violation(f"node {self.node_id}'s log of group {g} lost entries after its commit point")
        replay = self.sim.service()
        replay.load_snapshot(orjson.loads(orjson.dumps(self.oracle[g].snapshot())))
        for e in entries:
            if e.trans_id <= trans_id:
                replay.apply(e.record)
        worker_for = self.cn.router.worker_for
        part = {name: snap for name, snap in replay.snapshot().items() if worker_for(name) == index}
        self.expected[(g, index, epoch)] = (trans_id, orjson.dumps(part, option=orjson.OPT_SORT_KEYS))

    def checked_rollback(self, index: int, g: int) -> Callable[[int], int]:
        """Worker `index`'s PartitionService.rollback of group g, checked against the oracle as
        soon as it returns (before the requests the MODE held are served)."""
        w = self.workers[index]
        rollback = w.services[g].rollback

        def checked(keep_through: int) -> int:
            undone = rollback(keep_through)
            self.check_rollback(index, g, w, keep_through, undone)
            return undone
        return checked

    def check_rollback(self, index: int, g: int, w: Worker, keep_through: int, undone: int) -> None:
        epoch = w.epochs[g]
        trans_id, expected = self.expected.pop((g, index, epoch), (None, None))
        if w.services[g].seq != keep_through:
            raise Violation(f"node {self.node_id} worker {index}: seq {w.services[g].seq} of group {g} after a MODE "
                            f"that keeps through {keep_through}")
        if not undone:
            return
        self.sim.rollbacks += 1
        if expected is None:
            return
        got = orjson.dumps(orjson.loads(orjson.dumps(w.services[g].snapshot())), option=orjson.OPT_SORT_KEYS)
        if got != expected:
            raise Violation(f"node {self.node_id} worker {index}: after rolling back {undone} records "
                            f"(group {g}, epoch {epoch}) its queues differ from the log through trans_id {trans_id}")
        self.sim.rollbacks_checked += 1

    def worker_after(self, w: Worker) -> None:
        for service in w.services.values():
            service.tick(self.sim.now)
        w.flush()

    def on_peer(self, data: bytes) -> None:
        env = wire.decode(data)
        now = self.sim.now
        self.cn.on_peer(env.msg, (env.client_host, env.client_port), now, env.http_port, env.group)
        self.coord_timer()

    def coord_timer(self) -> None:
        now = self.sim.now
        if now >= self.cn.wake_at():
            self.cn.tick(now)
        self.coord_flush()

    def unsent(self, msgs: list) -> None:
        """server/coordinator.py flush: the messages whose send failed, after advance."""
        for target, g, msg in msgs:
            self.sim.unsent += 1
            self.cn.on_unsent(msg, self.sim.now, group=g, to=target)

    def coord_flush(self) -> None:
        """server/coordinator.py flush: each Ready's logs and votes (each group's) to 'disk', then
        everything it holds sent, then advance, until the node has nothing more."""
        cn = self.cn
        sim = self.sim
        sim.on_role(self)
        while cn.has_ready():
            ready = cn.ready()
            first = cn.first_group
            pieces = [(first, ready), *((part.group, part) for part in ready.parts)]
            stored: dict[int, bool] = {}
            chunks_written: dict[int, bool] = {}
            for g, piece in pieces:
                # Now and then the disk refuses the log (then writes are refused and undone in
                # the workers, and the next flush tries again).
                stored[g] = ok = not (sim.faults and piece.log_through != cn.groups[g]._stable_through
                                      and sim.disk_rng.random() < sim.disk_fail)
                if ok:
                    self.disk[g].write(cn.groups[g].log, piece.truncate_after, piece.log_through)
                if piece.vote is not None:
                    self.disk[g].vote = piece.vote
                chunks_written[g] = self.transfers[g].write(piece.chunk_writes) if piece.chunk_writes else True
            for index, message in batching.for_workers(ready.to_workers):
                if message[0] == ipc_frames.MODE:
                    self.expect(index, message)
                self.pipe(COORD, _worker_proc(index), message)
            for message in batching.for_acceptor(ready.to_acceptor):
                self.pipe(COORD, ACCEPTOR, message)
            unsent = []
            for g, piece in pieces:
                for target, msg in piece.peer_messages(stored[g], True):
                    if not chunks_written[g] and type(msg) is SnapshotAck:
                        continue
                    filled = self.transfers[g].filled(msg, sim.now)  # a chunk's bytes read from the snapshot files
                    if filled is None:  # unreadable: its transfers start again from the newest snapshot
                        sim.unreadable_chunks += 1
                        continue
                    if sim.nodes.get(target) is None:  # down: the link's send fails at once (zmq.Again)
                        unsent.append((target, g, msg))
                        continue
                    data = wire.encode(filled, "127.0.0.1", self.config.port, self.config.node_type,
                                       self.config.http_port, 0, g)
                    self.sim.net(self.node_id, target, data, once=type(msg) in ONCE)
            for g, target, msg in ready.remote:  # of groups this node is no replica of
                if sim.nodes.get(target) is None:
                    unsent.append((target, g, msg))
                    continue
                data = wire.encode(msg, "127.0.0.1", self.config.port, self.config.node_type,
                                   self.config.http_port, 0, g)
                self.sim.net(self.node_id, target, data, once=type(msg) in ONCE)
            cn.advance(ready, durable_trans_id=ready.log_through if stored[first] else None, log_stored=stored[first],
                       parts={g: (piece.log_through if stored[g] else None, stored[g]) for g, piece in pieces
                              if g != first})
            self.unsent(unsent)
            if not all(stored.values()):
                sim.disk_refusals += 1
                break
            for g, piece in pieces:
                for staged in piece.staged:
                    self.transfers[g].install(staged, sim.now)
                    sim.installs += 1
                for cut in piece.snapshots:  # server/group_disks.py carry_files
                    if type(cut) is Publish:
                        self.disk[g].finish_snapshot(cut.trans_id, cut.vote_id, cut.tmp, list(cut.parts))
                        self.transfers[g].source_changed(sim.now)
                        sim.snapshots += 1
                    else:
                        self.disk[g].abort_snapshot(cut.tmp)
                        sim.failed_cuts += type(cut) is not Clear

    def workers_state(self, g: int = 0) -> dict:
        merged: dict = {}
        for w in self.workers:
            merged.update(w.services[g].snapshot())
        return orjson.loads(orjson.dumps(merged))


# ------------------------------------------------------------------------------------------ clients


class SimClient:
    """QueueClient's behaviour over the sim: one request in flight on one connection; after a
    timeout or a closed connection, or a "no leader" answer, the same request goes to the next
    host (each host once per call); any other error goes to the caller. The workload on top is
    tests/fault/history.py's: producers of fresh messages, consumers that confirm at-least-once
    deliveries."""

    def __init__(self, sim: "Sim", name: str, kind: str, rng: random.Random) -> None:
        self.sim, self.name, self.kind, self.rng = sim, name, kind, rng
        self.hosts = list(sim.members)
        rng.shuffle(self.hosts)
        self.index = 0
        self.conn: int | None = None
        self.conn_node: SimNode | None = None
        self.req_no = 0
        self.call: dict | None = None  # the request being made, until answered or given up
        self.failed: set[int] = set()
        self.next_confirm: tuple[str, int] | None = None
        self.producer = p.ProducerSequence(f"sim-{name}") if IDEMPOTENT_PRODUCE else None

    @property
    def node_id(self) -> int:
        return self.hosts[self.index]

    def start(self) -> None:
        self.sim.at(self.sim.now + self.rng.uniform(0, 0.05), self.step)

    def close(self) -> None:
        node, conn = self.conn_node, self.conn
        if conn is not None and node is not None and self.sim.nodes.get(node.node_id) is node:
            self.sim.post(node, ACCEPTOR, lambda: node.acceptor.close(conn), delay=0.0005)
        self.conn = self.conn_node = None

    def step(self) -> None:
        """The workload: the next call."""
        if self.call is not None or self.sim.settling:
            return
        sim = self.sim
        if self.kind == "producer":
            if sim.now >= WRITES_UNTIL:
                return
            n = sim.next_data()
            queue = AMO if n % 3 == 0 else ALO
            data = f"d{n}"
            sim.attempted.add(data)
            identity = self.producer.next() if self.producer is not None else (None, None)
            req = p.produce_request(queue, data, retry=0 if queue == AMO else ALO_RETRY,
                                    producer=identity[0], sequence=identity[1])
        elif self.kind == "admin":
            if sim.now >= WRITES_UNTIL:
                return
            req = self.rng.choice(sim.ADMIN)
        elif self.next_confirm is not None:
            req = p.ids_request(p.CONFIRM, self.next_confirm[0], [self.next_confirm[1]])
        else:
            if sim.drained():  # look again later: a late acknowledgement may still come
                sim.at(sim.now + 0.1, self.step)
                return
            req = p.consume_request(self.rng.choice((ALO, AMO)), wait=0.2 if self.rng.random() < 0.2 else None)
        self.call = req
        self.failed = set()
        self.attempt()

    def attempt(self) -> None:
        sim = self.sim
        req = self.call
        assert req is not None
        node = sim.nodes.get(self.node_id)
        if node is None:  # connection refused
            self.try_next("refused")
            return
        if self.conn is None or self.conn_node is not node:
            self.close()
            self.conn = node.acceptor.connect(self)
            self.conn_node = node
        self.req_no += 1
        req_no, conn = self.req_no, self.conn
        sent = dict(req, seq=req_no)
        sim.post(node, ACCEPTOR, lambda: node.acceptor.on_request(conn, req_no, sent), delay=sim.client_delay())
        if req["action"] == p.CONSUME and self.rng.random() < ABANDON:
            # The client goes away before the reply: the node must give the message back.
            self.req_no += 1
            self.close()
            self.give_up("abandoned")
            return
        timeout = CLIENT_TIMEOUT + (req.get("wait") or 0)
        sim.at(sim.now + timeout, lambda: self.timed_out(req_no))

    def try_next(self, why: str) -> None:
        """This host failed the call: the next one, or give the call up when all have."""
        self.failed.add(self.node_id)
        self.close()
        self.index = (self.index + 1) % len(self.hosts)
        if len(self.failed) >= len(self.hosts):
            self.give_up(why)
        else:
            self.sim.at(self.sim.now + 0.001, self.attempt)

    def give_up(self, why: str) -> None:
        self.sim.errors[why] += 1
        if self.call is not None and self.call["action"] == p.CONFIRM:
            self.next_confirm = None  # it comes back after its lease
        self.call = None
        self.sim.at(self.sim.now + 0.01, self.step)

    def timed_out(self, req_no: int) -> None:
        if self.call is not None and self.req_no == req_no:
            self.sim.timeouts += 1
            self.req_no += 1  # a late reply is for a request given up on
            self.try_next("timeout")

    def on_reply(self, conn: int, req_no: int, reply: dict) -> None:
        if conn != self.conn or req_no != self.req_no or self.call is None:
            return  # for a request given up on
        sim = self.sim
        req = self.call
        if reply.get("seq") != req_no:
            raise Violation(f"reply {reply} to request {req_no} ({req})")
        self.req_no += 1  # answered: its timeout must not fire
        code = reply.get("code")
        if code != 0:
            if p.retry_elsewhere(req, reply):
                self.try_next("no leader")
            else:
                self.give_up(reply.get("reason", "?").split(":")[0])
            return
        self.call = None
        action = req["action"]
        if self.kind == "admin":  # its queue is checked by convergence only
            sim.admin_done[sp.resolve_action(action)] += 1
        elif action == p.PRODUCE:
            sim.acked[req["queue"]].add(req["data"])
        elif action == p.CONSUME and "data" in reply:
            sim.deliver(req["queue"], reply["data"])
            if req["queue"] == ALO:
                self.next_confirm = (ALO, reply["msg_id"])
        elif action == p.CONFIRM:
            self.next_confirm = None
        sim.at(sim.now + self.rng.uniform(0.0, 0.01), self.step)


# ------------------------------------------------------------------------------------------ sim


class Sim:
    GROUPS = 1  # queue groups, each on every node (GroupSim: 3)
    REPLICAS = 0  # nodes per group (0: every node; ReplicaSim: 3 of 5)
    ADMIN = ADMIN_REQUESTS  # what the admin client asks

    def __init__(self, seed: int, n: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.members = list(range(1, n + 1))
        self.now = 0.0
        self.events: list = []
        self.seq = 0
        nodes = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i} for i in self.members]
        capacity = self.rng.choice([50, 5000])
        snapshot_every = random.Random(seed + 4_000_037).choice([50, 200, 100_000])  # 100k: cuts on demand only
        log_bytes = 4096 if seed % 3 == 1 else 8 << 20  # (not drawn from rng: seeds replay as before)
        self.configs = {}
        self.groups = list(range(self.GROUPS))
        # With queue groups, the admin client's queue is placed by a rule in a group of its own.
        placement = {"queue_groups": self.GROUPS, "queue_group_list": [{"pattern": ADM + "*", "group": 1}]}
        for i in self.members:
            cfg, _ = parse_config(orjson.dumps({
                "node_id": i, "port": 1110 + i, "workers": WORKERS, "queue_log_size": capacity,
                "queue_log_bytes": log_bytes,
                "cluster_node_list": nodes if n > 1 else [], "election_timeout_ms": 300,
                "heartbeat_ms": 50, "forward_request": 1, "queue_sync_rate": 2000,
                "snapshot_every": snapshot_every, **(placement if self.GROUPS > 1 else {}),
                **({"group_replicas": self.REPLICAS} if self.REPLICAS else {}),
            }).decode())
            self.configs[i] = cfg
        self.incarnation = {i: 0 for i in self.members}
        self.root = tempfile.mkdtemp(prefix="node-sim-")
        self.disk = {i: {g: SimDisk(os.path.join(self.root, f"node-{i}" + (f"-group-{g}" if g else "")))
                         for g in self.configs[i].placement().groups_of(i)} for i in self.members}
        # Each group's committed log as the nodes saw it (every node must agree), and a replay of it.
        self.committed: dict[int, dict[int, Entry]] = {g: {} for g in self.groups}
        self.oracle = {g: self.service() for g in self.groups}
        self.oracle_trans_id = dict.fromkeys(self.groups, 0)
        self.snapshots = self.failed_cuts = self.installs = self.unreadable_chunks = 0
        self.nodes: dict[int, SimNode | None] = {}
        self.pipe_clock: dict[tuple, float] = {}
        self.cut: set[tuple[int, int]] = set()
        self.loss = self.rng.choice([0.0, 0.02, 0.1])
        self.max_delay = self.rng.choice([0.001, 0.005, 0.02])
        self.ipc_delay = self.rng.choice([0.00005, 0.0005, 0.002])
        self.stall = self.rng.choice([0.0, 0.01, 0.03])  # chance that a process stalls
        self.faults = True
        self.settling = False  # the run is over: no new calls (settle)
        # history
        self.counter = 0
        self.attempted: set[str] = set()
        self.acked: dict[str, set[str]] = {ALO: set(), AMO: set()}
        self.delivered: dict[str, list[str]] = {ALO: [], AMO: []}
        self.delivered_set: set[str] = set()
        self.progress_at = 0.0  # when an at-least-once message was last delivered the first time
        self.errors: Counter = Counter()
        self.admin_done: Counter = Counter()  # successful admin client calls by action
        self.timeouts = 0
        self.undelivered = 0
        self.unsent = 0  # peer messages to a node that was down (ClusterNode.on_unsent)
        self.leaders: dict[tuple[int, int], int] = {}  # (group, vote_id) -> its leader
        self.handoffs = 0  # graceful stops of a leader
        self.rollbacks = 0  # MODEs that undid records in a worker
        # The disk refuses a write of the log now and then (its own stream: the others' draws
        # stay as they were).
        self.disk_rng = random.Random(seed + 3_000_017)
        self.disk_fail = self.disk_rng.choice([0.0, 0.01, 0.05])
        self.disk_refusals = 0
        self.rollbacks_checked = 0  # ... whose result the oracle compared with the log
        self.transfers = 0  # ... after which another node led without an election timeout
        for i in self.members:
            self.start(i)
        crng = random.Random(seed + 1_000_003)
        self.clients = [SimClient(self, f"p{k}", "producer", random.Random(crng.random())) for k in range(3)]
        self.clients += [SimClient(self, f"c{k}", "consumer", random.Random(crng.random())) for k in range(2)]
        self.clients.append(SimClient(self, "a0", "admin", random.Random(seed + 2_000_003)))

    # ---------------------------------------------------------------- events
    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, None, 0, "", fn))

    def post(self, node: SimNode, proc: str, fn: Callable[[], None], delay: float = 0.0) -> None:
        """Run fn as process `proc` of `node` (dropped if that incarnation died; held while paused)."""
        self.seq += 1
        heapq.heappush(self.events, (self.now + delay, self.seq, node.node_id, node.incarnation, proc, fn))

    def pipe(self, node: SimNode, src: str, dst: str, frames: list[bytes]) -> None:
        key = (node.node_id, node.incarnation, src, dst)
        delay = self.ipc_delay * (0.5 + self.rng.random())
        if self.faults and self.rng.random() < self.stall:
            delay += self.rng.uniform(0.01, 0.25)
        t = max(self.pipe_clock.get(key, 0.0), self.now + delay)
        self.pipe_clock[key] = t
        self.post(node, dst, lambda: node.handle(dst, frames), delay=t - self.now)

    def net(self, src: int, dst: int, data: bytes, once: bool = False) -> None:
        if (src, dst) in self.cut:
            return
        copies = 1
        if self.faults:
            if self.rng.random() < self.loss:
                return
            # ZeroMQ over TCP never delivers a message twice; the election and replication are
            # made to survive it anyway, so their messages are duplicated now and then. Not the
            # ONCE kinds, which are not made to: a forwarded request would be served twice, and a
            # give-back applied twice can restore an at-most-once message delivered in between.
            if not once and self.rng.random() < 0.01:
                copies = 2
        for _ in range(copies):
            delay = 0.0003 + self.rng.random() * self.max_delay

            def arrive() -> None:
                node = self.nodes.get(dst)
                if node is not None:
                    self.post(node, COORD, lambda: node.on_peer(data))
            self.at(self.now + delay, arrive)

    def client_delay(self) -> float:
        return 0.0002 + self.rng.random() * 0.001

    def to_client(self, client: SimClient, conn: int, req_no: int, reply: dict) -> None:
        self.at(self.now + self.client_delay(), lambda: client.on_reply(conn, req_no, reply))

    # ---------------------------------------------------------------- nodes
    def start(self, i: int) -> None:
        self.incarnation[i] += 1
        node = SimNode(self, i, self.disk[i])
        self.nodes[i] = node
        self.post(node, COORD, lambda: self._coord_tick(node))
        for w in range(self.configs[i].workers):
            self.post(node, _worker_proc(w), lambda w=w: self._worker_tick(node, w))

    def on_role(self, node: SimNode) -> None:
        for g, group in node.cn.groups.items():
            if group.leader is not None:
                other = self.leaders.setdefault((g, group.election.vote_id), node.node_id)
                if other != node.node_id:
                    raise Violation(f"two leaders of group {g} in vote_id {group.election.vote_id}")

    def _coord_tick(self, node: SimNode) -> None:
        node.coord_timer()
        self.post(node, COORD, lambda: self._coord_tick(node), delay=TICK)

    def _worker_tick(self, node: SimNode, w: int) -> None:
        node.worker_after(node.workers[w])
        self.post(node, _worker_proc(w), lambda: self._worker_tick(node, w), delay=TICK * 2)

    def crash(self, i: int) -> None:
        node = self.nodes.get(i)
        if node is not None:
            for transfers in node.transfers.values():
                transfers.close()
            self.nodes[i] = None

    # ---------------------------------------------------------------- the committed log
    def service(self) -> PartitionService:
        cfg = self.configs[self.members[0]]
        return PartitionService(0, cfg.queue_size, {}, dead_letter_suffix=cfg.dead_letter_suffix)

    def record_committed(self, entries, g: int = 0) -> None:
        """Entries a node committed in group g: the same trans_id must hold the same record on
        every node."""
        committed = self.committed[g]
        for e in entries:
            seen = committed.get(e.trans_id)
            if seen is None:
                committed[e.trans_id] = e
            elif seen.vote_id != e.vote_id or seen.record != e.record:
                raise Violation(f"two different entries committed in group {g} at trans_id {e.trans_id}: {seen} and {e}")

    def replay_to(self, trans_id: int, g: int = 0) -> PartitionService:
        """A fresh replay of group g's committed log up to trans_id."""
        replay = self.service()
        for t in range(1, trans_id + 1):
            e = self.committed[g].get(t)
            if e is None:
                raise Violation(f"no node committed trans_id {t} of group {g}, yet a snapshot holds it")
            replay.apply(e.record)
        return replay

    def advance_oracle(self, trans_id: int, g: int = 0) -> PartitionService:
        """The replay of group g's committed log, brought up to trans_id."""
        while self.oracle_trans_id[g] < trans_id:
            e = self.committed[g].get(self.oracle_trans_id[g] + 1)
            if e is None:
                raise Violation(f"no node committed trans_id {self.oracle_trans_id[g] + 1} of group {g}")
            self.oracle[g].apply(e.record)
            self.oracle_trans_id[g] += 1
        return self.oracle[g]

    def pause(self, i: int, dur: float, procs: set[str] | None = None) -> None:
        """Stop some (by default all) of node i's processes for about dur seconds; each wakes at
        its own moment, as after a SIGCONT."""
        node = self.nodes.get(i)
        if node is None:
            return
        every = {COORD, ACCEPTOR} | {_worker_proc(w) for w in range(node.config.workers)}
        for proc in sorted((procs or every) - node.paused):
            node.paused.add(proc)
            self.at(self.now + dur + self.rng.uniform(0, 0.03), lambda proc=proc: self.resume(node, {proc}))

    def resume(self, node: SimNode, procs: set[str] | None = None) -> None:
        """Wake paused processes: each first handles, in order, what arrived while it slept."""
        if self.nodes.get(node.node_id) is not node:
            return
        procs = set(node.paused) if procs is None else procs & node.paused
        node.paused -= procs
        for proc in sorted(procs):
            for k, fn in enumerate(node.backlog.pop(proc, [])):
                self.post(node, proc, fn, delay=(k + 1) * 1e-9)

    # ---------------------------------------------------------------- history
    def next_data(self) -> int:
        self.counter += 1
        return self.counter

    def deliver(self, queue: str, data: str) -> None:
        if queue == ALO and data not in self.delivered_set:
            self.delivered_set.add(data)
            self.progress_at = self.now
        self.delivered[queue].append(data)
        if data not in self.attempted:
            raise Violation(f"delivered {data!r}, never produced")
        if queue == AMO and self.delivered[AMO].count(data) > 1:
            raise Violation(f"at-most-once message {data!r} delivered twice")

    def drained(self) -> bool:
        """Writes are over (no produce still being retried) and every acknowledged at-least-once
        message was delivered."""
        return (self.now >= WRITES_UNTIL
                and all(c.call is None for c in self.clients if c.kind == "producer")
                and not (self.acked[ALO] - self.delivered_set))

    # ---------------------------------------------------------------- faults
    def schedule_faults(self) -> None:
        rng = self.rng
        t = 0.4
        while t < CHAOS:
            t += rng.expovariate(1.2)
            kind = rng.choice(["crash", "crash_leader", "pause", "pause_leader", "partition", "isolate",
                               "isolate_leader", "stall", "stall_leader", "graceful_leader"])
            dur = rng.uniform(0.1, 2.0)
            self.at(t, lambda kind=kind, dur=dur: self.fault(kind, dur))

    def fault(self, kind: str, dur: float) -> None:
        if not self.faults:
            return
        rng = self.rng
        live = [i for i, n in self.nodes.items() if n is not None]
        leaders = [i for i in live if any(g.leader is not None for g in self.nodes[i].cn.groups.values())]
        pool = leaders if kind.endswith("_leader") and leaders else live
        if kind.startswith("crash") and pool:
            i = rng.choice(pool)
            self.crash(i)
            self.at(self.now + dur, lambda: self.restart(i))
        elif kind.startswith("graceful") and pool:
            self.graceful_restart(rng.choice(pool), dur)
        elif kind.startswith("pause") and pool:
            self.pause(rng.choice(pool), dur)
        elif kind.startswith("stall") and pool:
            # One process descheduled (a CPU hog): the others go on without it.
            i = rng.choice(pool)
            self.pause(i, dur, {rng.choice([COORD, ACCEPTOR] + [_worker_proc(w) for w in range(WORKERS)])})
        elif len(self.members) > 1:
            if kind == "partition":
                side = set(rng.sample(self.members, rng.randint(1, len(self.members) // 2)))
                pairs = {(a, b) for a in self.members for b in self.members if (a in side) != (b in side)}
            else:
                a = rng.choice(pool) if pool else rng.choice(self.members)
                pairs = {(a, b) for b in self.members if b != a} | {(b, a) for b in self.members if b != a}
            new = pairs - self.cut
            self.cut |= new
            self.at(self.now + dur, lambda: self.cut.difference_update(new))

    def graceful_restart(self, i: int, dur: float) -> None:
        """SIGTERM: node i hands leadership over (if it leads), drains, stops; starts after dur."""
        node = self.nodes.get(i)
        if node is None or node.paused:
            return
        led = node.cn.begin_handoff(self.now, HANDOFF_TIMEOUT)
        self.handoffs += led
        node.coord_flush()
        self.at(self.now + TICK, lambda: self._stop_when_handed_off(node, dur, led))

    def _stop_when_handed_off(self, node: SimNode, dur: float, led: bool) -> None:
        i = node.node_id
        if self.nodes.get(i) is not node:
            return
        if node.cn.handing_off(self.now):
            self.at(self.now + TICK, lambda: self._stop_when_handed_off(node, dur, led))
            return
        if led and node.cn.leader is None and node.cn.election.leader_id not in (None, i):
            self.transfers += 1

        def stop() -> None:
            if self.nodes.get(i) is node:
                self.crash(i)
                self.at(self.now + dur, lambda: self.restart(i))
        self.at(self.now + DRAIN, stop)

    def restart(self, i: int) -> None:
        if self.nodes.get(i) is None:
            self.start(i)

    def heal(self) -> None:
        self.faults = False
        self.cut.clear()
        for i in self.members:
            node = self.nodes.get(i)
            if node is None:
                self.start(i)
            elif node.paused:
                self.resume(node)

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        try:
            self._run()
        finally:
            for node in self.nodes.values():
                if node is not None:
                    for transfers in node.transfers.values():
                        transfers.close()
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self) -> None:
        self.schedule_faults()
        for c in self.clients:
            c.start()
        self.at(CHAOS, self.heal)
        end = CHAOS + DRAIN_CAP
        while self.events:
            t = self.events[0][0]
            if t > end:
                break
            if t > CHAOS and t - max(self.progress_at, CHAOS) > STALL:
                break
            self._next_event()
            if self.now > WRITES_UNTIL and self.drained() and self.converged() is None:
                break
        self.check_end()
        self.settle()

    def _next_event(self) -> None:
        t, _, node_id, incarnation, proc, fn = heapq.heappop(self.events)
        self.now = t
        if node_id is not None:
            node = self.nodes.get(node_id)
            if node is None or node.incarnation != incarnation:
                return
            if proc in node.paused:
                node.backlog.setdefault(proc, []).append(fn)
                return
        fn()

    def _owed(self) -> list[tuple[int, int, int, float, dict]]:
        """Requests the live nodes took and have not answered: (node, conn, req_no, since, request)."""
        return [(node.node_id, conn, req_no, since, req) for node in self.nodes.values() if node is not None
                for (conn, req_no), (since, req) in node.acceptor.unanswered.items()]

    def settle(self) -> None:
        """After the checks: no new calls; time goes on until every live node has answered every
        request it took, however late (a forward nobody answers fails after FORWARD_GRACE), and
        one that is still unanswered then is a violation: every request gets exactly one reply."""
        self.settling = True
        end = self.now + FORWARD_GRACE + 1.0
        while self.events and self.events[0][0] <= end and self._owed():
            self._next_event()
        unanswered = self._owed()
        if unanswered:
            node_id, conn, req_no, since, req = min(unanswered, key=lambda u: u[3])
            raise Violation(f"{len(unanswered)} requests never answered, the oldest on node {node_id} since "
                            f"t={since:.3f} (connection {conn}, request {req_no}): {req}")

    def converged(self) -> str | None:
        down = [i for i in self.members if self.nodes.get(i) is None]
        if down:  # stopped by a graceful restart begun before the faults ended: it starts again
            return f"node {down[0]} is down"
        every = [self.nodes[i] for i in self.members]
        for g in self.groups:  # each group: one leader, followed and committed by every replica
            of = f" of group {g}" if g else ""
            nodes = [n for n in every if g in n.cn.groups]
            leaders = [n.cn.groups[g] for n in nodes if n.cn.groups[g].leader is not None]
            if len(leaders) != 1:
                return f"{len(leaders)} leaders{of}"
            lead = leaders[0]
            for n in nodes:
                group = n.cn.groups[g]
                if group.election.leader_id != lead.node_id or group.log.commit_trans_id != lead.log.last_trans_id:
                    return f"node {n.node_id} follows {group.election.leader_id}{of}, committed {group.log.commit_trans_id}"
            for n in every:  # ... and known to the other nodes
                if g in n.cn.remote and n.cn.remote[g].leader_id != lead.node_id:
                    return f"node {n.node_id} (no replica{of}) takes {n.cn.remote[g].leader_id} for its leader"
            # Every node's workers hold exactly the committed log replayed (the oracle), so the same.
            if self.oracle_trans_id[g] > lead.log.commit_trans_id:
                return f"the oracle{of} is past the commit point {lead.log.commit_trans_id}"
            oracle = self.advance_oracle(lead.log.commit_trans_id, g)
            want = orjson.dumps(orjson.loads(orjson.dumps(oracle.snapshot())), option=orjson.OPT_SORT_KEYS)
            for n in nodes:
                if orjson.dumps(n.workers_state(g), option=orjson.OPT_SORT_KEYS) != want:
                    return f"node {n.node_id}'s workers{of} differ from the committed log replayed"
        return None

    def check_end(self) -> None:
        lost = self.acked[ALO] - self.delivered_set
        if lost:
            raise Violation(f"{len(lost)} acknowledged at-least-once messages never delivered "
                            f"(none new for {self.now - max(self.progress_at, CHAOS):.1f} s at "
                            f"t={self.now:.1f}): {sorted(lost)[:5]}")
        problem = self.converged()
        if problem is not None:
            raise Violation(f"not converged at t={self.now:.1f}, {self.now - CHAOS:.1f} s after the faults: {problem}")
        twice = [d for d, k in Counter(self.delivered[AMO]).items() if k > 1]
        if twice:
            raise Violation(f"at-most-once delivered twice: {twice[:5]}")


def run_seed(n: int, seed: int) -> Sim:
    sim = Sim(seed, n)
    sim.run()
    return sim


def test_node_sim_three_nodes():
    simulation.assert_seeds_pass(Sim, 3, range(SEEDS))


def test_node_sim_makes_progress():
    """The checks are not vacuous: messages of both kinds are acknowledged and delivered, leaders
    change, and clients meet timeouts and errors."""
    sim = run_seed(3, 1)
    assert len(sim.acked[ALO]) > 50 and len(sim.acked[AMO]) > 20
    assert len(sim.delivered[AMO]) > 20
    assert len(sim.leaders) >= 2
    assert sim.rollbacks > 0 and sim.rollbacks_checked > 0
    assert sim.snapshots > 0 and sim.installs > 0  # worker-made snapshots published, and streamed to a follower
    assert sim.unsent > 0  # messages to a node that was down, which the sender handled as unsent
    # every administration action was carried out at least once under the faults
    assert {sp.PAUSE, sp.RESUME, sp.PURGE, sp.DELETE_QUEUE, sp.DLQ_REPLAY, sp.PEEK, sp.LOCAL_PEEK} <= set(sim.admin_done)


class GroupSim(Sim):
    """The same nodes with three queue groups, each on every node: the workload's queues are in
    groups 2 (at-least-once) and 0 (at-most-once), the admin client's in group 1 (a
    queue_group_list rule). Every group has its election, log, commit, snapshots and workers'
    modes; each is checked as the one group is, and leaders spread (election/balance.py) under
    the faults."""

    GROUPS = 3
    # ... and the monitors of its queue and of every queue, which a node gathers from the
    # workers of the queue's group (forwarded to its leader) or from every group's leader.
    ADMIN = ADMIN_REQUESTS + [{"action": sp.MONITOR, "queue": ADM}, {"action": sp.MONITOR},
                              {"action": sp.LIST}]


def test_node_sim_three_groups_on_three_nodes():
    simulation.assert_seeds_pass(GroupSim, 3, range(GROUP_SEEDS))


class ReplicaSim(GroupSim):
    """Five nodes with five queue groups of three replicas each: a node holds three groups, and
    passes the requests of the other two (and asks their leaders for their parts of a monitor or
    list of every queue) to their leaders, which it knows from their heartbeats."""

    GROUPS = 5
    REPLICAS = 3


def test_node_sim_five_groups_of_three_replicas_on_five_nodes():
    simulation.assert_seeds_pass(ReplicaSim, 5, range(GROUP_SEEDS))


def test_replica_sim_makes_progress_in_every_group_and_nodes_hold_only_their_groups():
    # (seed 2's network loses nothing: on a lossy one, a monitor or list of every queue waits for
    # a lost part until its forward times out, longer than the admin client waits)
    sim = ReplicaSim(2, 5)
    sim.run()
    assert len(sim.acked[ALO]) > 50 and len(sim.acked[AMO]) > 20 and len(sim.delivered[AMO]) > 20
    assert {g for g, _ in sim.leaders} == set(range(5))
    placement = sim.configs[1].placement()
    busy = {placement.group_of(ALO), placement.group_of(AMO), placement.group_of(ADM)}
    assert len(busy) == 3 and all(len(sim.committed[g]) > 10 for g in busy)
    assert all(len(node.cn.groups) == 3 and len(node.cn.remote) == 2 for node in sim.nodes.values() if node)
    assert {sp.MONITOR, sp.LIST} <= set(sim.admin_done)


def test_group_sim_makes_progress_in_every_group():
    # (seed 2: on seed 1 the admin client spends its time on monitors of every queue, which need
    # the leader of every group, while partitions cut it off: each waits out its timeout)
    sim = GroupSim(2, 3)
    sim.run()
    assert len(sim.acked[ALO]) > 50 and len(sim.acked[AMO]) > 20 and len(sim.delivered[AMO]) > 20
    assert {g for g, _ in sim.leaders} == {0, 1, 2}  # every group elected
    assert all(len(sim.committed[g]) > 10 for g in sim.groups)
    assert sim.snapshots > 0 and sim.rollbacks > 0
    assert {sp.MONITOR, sp.LIST} <= set(sim.admin_done)


class RollingRestart(Sim):
    """No faults but a rolling restart: each node in turn stops gracefully (handing leadership
    over when it leads) and starts again, on a network that loses nothing."""

    def __init__(self, seed: int, n: int) -> None:
        super().__init__(seed, n)
        self.loss, self.stall = 0.0, 0.0

    def schedule_faults(self) -> None:
        self.faults = False  # no loss, no stalls, no duplicates
        self.at(0.7, self.warmed_up)
        order = sorted(self.members, key=lambda i: self.rng.random())
        for k, i in enumerate(order):
            self.at(0.8 + 1.6 * k, lambda i=i: self.graceful_restart(i, 0.4))
        # the leader once more, wherever leadership went
        self.at(0.8 + 1.6 * len(order), lambda: [self.graceful_restart(i, 0.4) for i in self.members
                                                 if self.nodes.get(i) is not None and self.nodes[i].cn.leader is not None])

    def warmed_up(self) -> None:
        """The first election is over: from now on clients must see no error."""
        assert self.leaders, "no leader after 0.7 s"
        self.errors.clear()


def test_rolling_restart_hands_over_and_clients_see_no_error():
    """Clients only see what they retry: no error reaches the caller, no at-most-once message is
    delivered twice, nothing acknowledged is lost (check_end), and every leader stopped handed
    leadership over instead of leaving the cluster to an election timeout."""
    for seed in range(5):
        sim = RollingRestart(seed, 3)
        sim.run()
        given_up = {why: k for why, k in sim.errors.items() if why != "abandoned"}  # the client left
        assert not given_up, f"seed {seed}: {given_up}"
        assert sim.handoffs >= 1 and sim.transfers == sim.handoffs, (seed, sim.handoffs, sim.transfers)
        assert len(sim.acked[ALO]) > 50


if __name__ == "__main__":
    import sys
    import time as _time
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    if len(sys.argv) > 2:
        started = _time.time()
        sim = run_seed(n, int(sys.argv[2]))
        print(f"ok in {_time.time() - started:.1f} s: acked {len(sim.acked[ALO])}+{len(sim.acked[AMO])}, "
              f"delivered {len(sim.delivered[ALO])}+{len(sim.delivered[AMO])}, leaders {len(sim.leaders)}, "
              f"timeouts {sim.timeouts}, undelivered {sim.undelivered}, errors {dict(sim.errors)}, "
              f"graceful leader stops {sim.handoffs} (handed over {sim.transfers})")
    else:
        fails = simulation.run_seeds(Sim, n, range(SEEDS))
        print("\n".join(fails) or "ok")
