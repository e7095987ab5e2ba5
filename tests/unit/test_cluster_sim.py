"""A deterministic randomized simulation of a cluster built from the pure cores.

Nodes = Election + ChangeLog + Follower + LeaderReplication, wired the way a coordinator process
should wire them (SimNode below). The network delays, loses, duplicates and reorders messages and
is partitioned; nodes crash and restart keeping only their durable state (vote_id, voted_for and
the change log, as if written to disk before being acted on). Clients append at whichever node
believes it leads.

Checked on every seed:
* at most one leader per vote_id, ever;
* a committed entry never changes: every node commits the same (vote_id, record) at a trans_id,
  applies committed entries in trans_id order without gaps, and every new leader's log holds every
  entry committed so far (committed entries survive leader changes);
* after the faults heal: a leader exists, every node has the same log end, commit point and
  applied state, and every write a leader acknowledged is in it at its trans_id.

On half the seeds (2 and 3 mod 4) a leader answers SendSnapshot by "cutting" its applied prefix
into files of a shared fake disk and streaming them in small chunks (replication/transfer.py),
as a node does; on the others it sends one InstallSnapshot, as a ClusterNode with no snapshot
dir does.

SIM_SEEDS=<n> runs more seeds; a failing seed is printed with its first violation.
"""

from __future__ import annotations

from queue_server.replication import wire
from tests.unit import simulation

import heapq
import os
import pickle
import random
from dataclasses import dataclass, field, replace

import orjson

from queue_server.election.messages import (
    BecomeCandidate,
    BecomeFollower,
    BecomeLeader,
    HeartbeatAck,
    PersistVote,
    Send,
)
from queue_server.election.state import Election
from queue_server.replication.follower import Follower
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import (
    AppendAck,
    AppendEntries,
    ApplySnapshot,
    Commit,
    Discarded,
    FileRange,
    InstallSnapshot,
    Pull,
    SendSnapshot,
    SnapshotAck,
    SnapshotChunk,
    SnapshotStaged,
    WriteChunk,
)
from queue_server.replication.progress import Flow, LeaderReplication
from queue_server.replication.transfer import MANIFEST, SnapshotSource
from queue_server.protocol.records import Confirm, Noop

SEEDS = int(os.environ.get("SIM_SEEDS", "200"))

ELECTION_TIMEOUT = 0.3
HEARTBEAT = 0.05
TICK = 0.02
CHAOS = 5.0  # seconds of faults
WRITES_UNTIL = CHAOS + 1.0  # clients keep writing a little after the faults stop
HEAL_CAP = 15.0  # the cluster must have converged this long after the faults stopped
LOG_CAPACITIES = (40, 1000)  # small: followers often need snapshots; large: they never do
NOOP = Noop()


def _rid(record: Confirm | Noop) -> int | None:
    """The id of the client write a log record stands for (None: a leader's noop)."""
    return getattr(record, "msg_id", None)

REPLICATION_TYPES = (AppendEntries, AppendAck, Pull, InstallSnapshot, SnapshotChunk, SnapshotAck, HeartbeatAck)


class Violation(AssertionError):
    pass


@dataclass
class Durable:
    """What survives a crash."""

    vote_id: int = 0
    voted_for: int | None = None
    base: tuple[int, int] = (0, 0)
    entries: list[Entry] = field(default_factory=list)
    applied: list[tuple[int, int, object]] = field(default_factory=list)  # up to base


class SimNode:
    """One node: the cores wired together, applying committed entries to a list."""

    def __init__(self, sim: Sim, node_id: int, members: list[int], now: float, durable: Durable,
                 rng: random.Random) -> None:
        self.sim = sim
        self.node_id = node_id
        self.members = members
        self.durable = durable
        self.log = ChangeLog(sim.capacity, *durable.base)
        self.log.accept(durable.base[0], durable.base[1], durable.entries)
        self.applied = list(durable.applied)  # [(trans_id, vote_id, record id)] from 1
        assert len(self.applied) == durable.base[0]
        self.election = Election(node_id, members, self.log, rng, now,
                                 election_timeout=ELECTION_TIMEOUT, heartbeat_interval=HEARTBEAT,
                                 vote_id=durable.vote_id, voted_for=durable.voted_for)
        self.follower = Follower(node_id, self.log, pull_interval=HEARTBEAT)
        self.leader: LeaderReplication | None = None
        self.pending_writes: dict[int, int] = {}  # trans_id -> record id, awaiting commit
        self.staging: dict[int, bytearray] = {}  # part -> bytes of a snapshot being received

    # ------------------------------------------------------------- inputs

    def tick(self, now: float) -> None:
        self.run(self.election.tick(now), now)
        if self.leader is not None:
            self.run(self.leader.tick(now), now)

    def receive(self, msg: object, now: float) -> None:
        self.run(self.election.on_message(msg, now), now)
        if msg.vote_id != self.election.vote_id:
            return
        if self.leader is not None:
            self.run(self.leader.on_message(msg, now), now)
        elif type(msg).SENDER == "leader" and self.election.leader_id == msg.src:
            self.run(self.follower.on_message(msg, now), now)

    def client_write(self, rids: list[int], now: float) -> bool:
        """A batch of writes, appended together (as the coordinator does with a worker's batch)."""
        if self.leader is None:
            return False
        first, last = self.log.append(self.election.vote_id, [Confirm(queue="q", msg_id=rid) for rid in rids])
        for tid, rid in zip(range(first, last + 1), rids):
            self.pending_writes[tid] = rid
        self.run(self.leader.replicate(now), now)
        return True

    # ------------------------------------------------------------- actions

    def run(self, actions: list, now: float) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.sim.send(self.node_id, a.to, a.msg, now)
            elif isinstance(a, PersistVote):
                self.durable.vote_id, self.durable.voted_for = a.vote_id, a.voted_for
            elif isinstance(a, BecomeLeader):
                self.sim.on_leader(self, a.vote_id)
                self.follower.reset()
                self.leader = LeaderReplication(self.node_id, self.members, self.log, a.vote_id, now,
                                                Flow(max_batch=8, max_inflight=4, sync_rate=400,
                                                     resend_interval=2 * HEARTBEAT, snapshot_timeout=0.5,
                                                     chunk_bytes=512, chunk_window=3, chunk_resend=2 * HEARTBEAT))
                self.log.append(a.vote_id, [NOOP])
                self.run(self.leader.replicate(now), now)
            elif isinstance(a, (BecomeFollower, BecomeCandidate)):
                self.leader = None
                self.pending_writes.clear()
                self.follower.reset()
            elif isinstance(a, Commit):
                self.apply(a)
            elif isinstance(a, SendSnapshot) and self.sim.chunked:
                tid = len(self.applied)
                self.run(self.leader.set_source(self.sim.publish(tid, self.log.term_at(tid), self.applied), now), now)
            elif isinstance(a, WriteChunk):
                if (a.part, a.offset) == (MANIFEST, 0):
                    self.staging = {}
                buf = self.staging.setdefault(a.part, bytearray())
                if a.offset != len(buf):
                    raise Violation(f"node {self.node_id} writes chunk {a.part}@{a.offset} after {len(buf)} bytes")
                buf += a.data
            elif isinstance(a, SnapshotStaged):
                data = pickle.loads(bytes(self.staging[0]))
                self.sim.check_prefix(self, data)
                if a.trans_id > self.log.commit_trans_id:
                    self.applied = list(data)
                    assert len(self.applied) == a.trans_id
                self.run(self.follower.installed(a.trans_id, a.vote_id, self.election.leader_id,
                                                 self.election.vote_id), now)
            elif isinstance(a, SendSnapshot):
                tid = len(self.applied)
                snap = InstallSnapshot(self.election.vote_id, self.node_id, tid, self.log.term_at(tid),
                                       tuple(self.applied))
                self.sim.send(self.node_id, a.to, snap, now)
            elif isinstance(a, ApplySnapshot):
                self.sim.check_prefix(self, a.data)
                self.applied = list(a.data)
                assert len(self.applied) == a.trans_id
            elif isinstance(a, Discarded):
                for e in a.entries:
                    if self.sim.committed.get(e.trans_id) == (e.vote_id, _rid(e.record)):
                        raise Violation(f"node {self.node_id} discarded committed entry {e.trans_id}")
            else:
                raise TypeError(f"unknown action {a!r}")

    def apply(self, c: Commit) -> None:
        for e in c.entries:
            if e.trans_id <= len(self.applied):
                continue
            if e.trans_id != len(self.applied) + 1:
                raise Violation(f"node {self.node_id} applies {e.trans_id} after {len(self.applied)}")
            item = (e.trans_id, e.vote_id, _rid(e.record))
            self.sim.record_commit(self, item)
            self.applied.append(item)
        if len(self.applied) < c.trans_id:
            raise Violation(f"node {self.node_id} committed to {c.trans_id} but applied {len(self.applied)}")
        if self.leader is not None:
            for tid in [t for t in self.pending_writes if t <= c.trans_id]:
                self.sim.acked[self.pending_writes.pop(tid)] = tid

    def save(self) -> Durable:
        """What is left after a crash."""
        d = self.durable
        d.base = (self.log.base_trans_id, self.log.base_vote_id)
        d.entries = [Entry(e.trans_id, e.vote_id, e.record) for e in
                     (self.log.entries_after(self.log.base_trans_id, len(self.log)) or [])]
        d.applied = self.applied[:self.log.base_trans_id]
        return d


class Sim:
    def __init__(self, seed: int, n: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.members = list(range(1, n + 1))
        self.now = 0.0
        self.events: list = []
        self.seq = 0
        self.nodes: dict[int, SimNode | None] = {}
        self.durable: dict[int, Durable] = {i: Durable() for i in self.members}
        self.incarnation = {i: 0 for i in self.members}
        self.leaders: dict[int, int] = {}  # vote_id -> node_id
        self.committed: dict[int, tuple[int, object]] = {}  # trans_id -> (vote_id, rid)
        self.acked: dict[int, int] = {}  # rid -> trans_id
        self.cut: set[tuple[int, int]] = set()
        self.chunked = seed % 4 >= 2  # half of the seeds of each log capacity
        self.disk: dict[str, bytes] = {}  # the snapshot files leaders "cut" (chunked seeds)
        self.loss = self.rng.choice([0.0, 0.05, 0.2])
        self.dup = 0.02
        self.max_delay = self.rng.choice([0.002, 0.01, 0.04])
        self.capacity = LOG_CAPACITIES[seed % len(LOG_CAPACITIES)]
        self.faults = True
        self.next_rid = 1
        for i in self.members:
            self.start(i)

    # ------------------------------------------------------------- plumbing

    def at(self, t: float, kind: str, *args) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, args))

    def start(self, i: int) -> None:
        self.incarnation[i] += 1
        rng = random.Random(self.seed * 7919 + i * 101 + self.incarnation[i])
        self.nodes[i] = SimNode(self, i, self.members, self.now, self.durable[i], rng)

    def crash(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            self.durable[i] = node.save()
            self.nodes[i] = None

    def publish(self, trans_id: int, vote_id: int, applied: list) -> SnapshotSource:
        """A snapshot of `applied` as files: its manifest and one part."""
        part = pickle.dumps(tuple(applied))
        manifest = orjson.dumps({"trans_id": trans_id, "vote_id": vote_id, "parts": [{"bytes": len(part)}]})
        name = f"snap-{len(self.disk)}"
        self.disk[name + "/manifest"], self.disk[name + "/part-0"] = manifest, part
        return SnapshotSource(trans_id, vote_id, ((name + "/manifest", len(manifest)), (name + "/part-0", len(part))))

    def send(self, src: int, dst: int, msg: object, now: float) -> None:
        if isinstance(msg, SnapshotChunk) and isinstance(msg.data, FileRange):  # read as the coordinator does
            r = msg.data
            msg = replace(msg, data=self.disk[r.path][r.offset:r.offset + r.length])
        assert wire.decode(wire.encode(msg)).msg == msg or isinstance(msg, InstallSnapshot)
        if (src, dst) in self.cut:
            return
        copies = 1
        if self.faults:
            if self.rng.random() < self.loss:
                return
            if self.rng.random() < self.dup:
                copies = 2
        for _ in range(copies):
            self.at(now + 0.0005 + self.rng.random() * self.max_delay, "deliver", dst, msg)

    # ------------------------------------------------------------- checks

    def on_leader(self, node: SimNode, vote_id: int) -> None:
        other = self.leaders.setdefault(vote_id, node.node_id)
        if other != node.node_id:
            raise Violation(f"two leaders in vote_id {vote_id}: {other} and {node.node_id}")
        # Leader completeness: every committed entry is in the new leader's log (or its state).
        log = node.log
        for tid, (vid, rid) in self.committed.items():
            if tid <= log.base_trans_id:
                if node.applied[tid - 1][1:] != (vid, rid):
                    raise Violation(f"leader {node.node_id} (vote_id {vote_id}) lacks committed {tid}")
            else:
                e = log.entry_at(tid)
                if e is None or (e.vote_id, _rid(e.record)) != (vid, rid):
                    raise Violation(f"leader {node.node_id} (vote_id {vote_id}) lacks committed {tid}")

    def record_commit(self, node: SimNode, item: tuple[int, int, object]) -> None:
        tid, vid, rid = item
        have = self.committed.setdefault(tid, (vid, rid))
        if have != (vid, rid):
            raise Violation(f"node {node.node_id} commits {tid}={(vid, rid)} but {have} was committed")

    def check_prefix(self, node: SimNode, applied: tuple) -> None:
        for tid, vid, rid in applied:
            self.record_commit(node, (tid, vid, rid))

    # ------------------------------------------------------------- run

    def schedule_faults(self) -> None:
        rng = self.rng
        t = 0.3
        while t < CHAOS:
            t += rng.expovariate(1.5)
            kind = rng.choice(["crash", "crash_leader", "partition", "isolate", "oneway"])
            dur = rng.uniform(0.1, 2.5)
            self.at(t, kind, dur)
        for i in range(3):
            self.at(rng.uniform(0.2, CHAOS), "simultaneous", None)

    def fault(self, kind: str, dur: float) -> None:
        rng = self.rng
        if kind in ("crash", "crash_leader"):
            if kind == "crash_leader":
                live = [i for i, n in self.nodes.items() if n is not None and n.leader is not None]
            else:
                live = [i for i, n in self.nodes.items() if n is not None]
            if live:
                i = rng.choice(live)
                self.crash(i)
                self.at(self.now + dur, "restart", i)
        elif kind == "simultaneous":
            # Everyone restarts at the same moment (like a simultaneous cluster start).
            for i in self.members:
                self.crash(i)
            for i in self.members:
                self.start(i)
        elif len(self.members) > 1:
            if kind == "partition":
                side = set(rng.sample(self.members, rng.randint(1, len(self.members) // 2)))
                pairs = {(a, b) for a in self.members for b in self.members
                         if (a in side) != (b in side)}
            elif kind == "isolate":
                a = rng.choice(self.members)
                pairs = {(a, b) for b in self.members if b != a} | {(b, a) for b in self.members if b != a}
            else:
                a, b = rng.sample(self.members, 2)
                pairs = {(a, b)}
            new = pairs - self.cut
            self.cut |= new
            self.at(self.now + dur, "mend", frozenset(new))

    def run(self) -> None:
        self.schedule_faults()
        self.at(0.0, "tick", None)
        t = 0.05
        while t < WRITES_UNTIL:
            self.at(t, "client", None)
            t += self.rng.uniform(0.01, 0.08)
        self.at(CHAOS, "heal", None)
        self.at(WRITES_UNTIL + 0.5, "check", None)
        while self.events:
            t, _, kind, args = heapq.heappop(self.events)
            self.now = t
            if kind == "deliver":
                dst, msg = args
                node = self.nodes.get(dst)
                if node is not None:
                    node.receive(msg, t)
            elif kind == "tick":
                for node in list(self.nodes.values()):
                    if node is not None:
                        node.tick(t)
                self.at(t + TICK, "tick", None)
            elif kind == "client":
                leaders = [n for n in self.nodes.values() if n is not None and n.leader is not None]
                if leaders:
                    k = self.rng.choice([1, 1, 1, 2, 5, 20])
                    self.rng.choice(leaders).client_write(list(range(self.next_rid, self.next_rid + k)), t)
                    self.next_rid += k
            elif kind == "restart":
                (i,) = args
                if self.nodes[i] is None:
                    self.start(i)
            elif kind == "mend":
                (pairs,) = args
                self.cut -= pairs
            elif kind == "heal":
                self.faults = False
                self.cut.clear()
                for i in self.members:
                    if self.nodes[i] is None:
                        self.start(i)
            elif kind == "check":
                problem = self.divergence()
                if problem is None:
                    break
                if t >= CHAOS + HEAL_CAP:
                    raise Violation(f"not converged {HEAL_CAP} s after healing: {problem}")
                self.at(t + 0.25, "check", None)
            elif self.faults:
                self.fault(kind, *args)
        self.healed_after = self.now - CHAOS
        self.check_end()

    def divergence(self) -> str | None:
        """None once there is one leader that every node follows, with the same log, commit point
        and applied state; else what differs."""
        nodes = [self.nodes[i] for i in self.members]
        leaders = [n for n in nodes if n.leader is not None]
        if len(leaders) != 1:
            return f"{len(leaders)} leaders"
        lead = leaders[0]
        for n in nodes:
            if n.election.vote_id != lead.election.vote_id or n.election.leader_id != lead.node_id:
                return (f"node {n.node_id} is at vote_id {n.election.vote_id} following "
                        f"{n.election.leader_id}; leader {lead.node_id} at {lead.election.vote_id}")
            if (n.log.last_trans_id, n.log.last_vote_id, n.log.commit_trans_id) != \
                    (lead.log.last_trans_id, lead.log.last_vote_id, lead.log.last_trans_id):
                return (f"node {n.node_id} log ends ({n.log.last_trans_id}, {n.log.last_vote_id}) "
                        f"commit {n.log.commit_trans_id}; leader's ({lead.log.last_trans_id}, "
                        f"{lead.log.last_vote_id}) commit {lead.log.commit_trans_id}")
            if n.applied != lead.applied:
                return f"node {n.node_id} applied state differs from the leader's"
        return None

    def check_end(self) -> None:
        lead = next(n for n in self.nodes.values() if n.leader is not None)
        by_tid = {tid: rid for tid, _, rid in lead.applied}
        for rid, tid in self.acked.items():
            if by_tid.get(tid) != rid:
                raise Violation(f"acknowledged write {rid} at trans_id {tid} is lost")
        rids = [rid for _, _, rid in lead.applied if rid is not None]
        if len(rids) != len(set(rids)):
            raise Violation("a record is applied twice")
        self.stats = (lead.log.last_trans_id, len(self.acked), max(self.leaders, default=0))


def test_sim_three_nodes():
    simulation.assert_seeds_pass(Sim, 3, range(SEEDS))


def test_sim_five_nodes():
    simulation.assert_seeds_pass(Sim, 5, range(SEEDS))


def test_sim_makes_progress():
    """The checks are not vacuous: writes get acknowledged and leaders change."""
    sim = Sim(1, 3)
    sim.run()
    last, acked, terms = sim.stats
    assert acked > 20 and last > acked and terms >= 2


def test_sim_single_node():
    sim = Sim(3, 1)
    sim.run()
    assert sim.stats[1] > 20


if __name__ == "__main__":
    import sys
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    count = int(sys.argv[2]) if len(sys.argv) > 2 else SEEDS
    fails = simulation.run_seeds(Sim, n, range(count))
    print("\n".join(fails) or "ok")
