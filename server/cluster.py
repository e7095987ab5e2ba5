"""The coordinator's decisions, free of I/O: the election, the change log, replication to and from
peers, which replies may go out (a write is answered once committed), and what the workers must
replay; forwarding of client requests is server/forwarding.py's. The coordinator process
(server/coordinator.py) feeds it events and the time, takes what it decided as one Ready
(server/ready.py), persists and sends that, and calls advance.

One file, over 600 lines, because ClusterNode is one state machine: a role change, a commit or a
refused batch touches the election, the log, the replication progress, the workers' mode (epoch)
and the replies waiting for a commit together, and each handler must leave all of them agreeing.
What stands alone is apart already: election/, replication/, server/forwarding.py,
server/gather.py, server/ready.py.
"""
from __future__ import annotations

import random
from collections import deque

import orjson

from queue_server.config.loader import NodeConfig
from queue_server.election.messages import (
    BecomeCandidate,
    BecomeFollower,
    BecomeLeader,
    PersistVote,
    Send,
    TransferAborted,
)
from queue_server.election.state import Election
from queue_server.replication.follower import Follower
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import (
    ApplySnapshot,
    Commit,
    Discarded,
    Forward,
    ForwardReply,
    GiveBack,
    ReadLog,
    Recovered,
    SendSnapshot,
    SnapshotStaged,
    WriteChunk,
)
from queue_server.replication.progress import Flow, LeaderReplication
from queue_server.replication.transfer import SnapshotSource
from queue_server.server import gather
from queue_server.protocol import ipc_frames, replies
from queue_server.server.forwarding import Deliver, Forwarding, Undeliver, Work
from queue_server.protocol.origin import Origin
from queue_server.server.ready import Ready
from queue_server.server.reply_counts import count_refused
from queue_server.protocol.roles import Role
from queue_server.protocol.records import Noop, Record, decode_many, each_encoded
from queue_server.protocol import vocabulary as p
from queue_server.server.router import Router
from queue_server.server.snapshots import SnapshotCut
from queue_server.server.worker_seqs import WorkerSeqs

NOOP = Noop()
# How many undeliverable consume replies a node holds, to give their messages back once a leader
# is known (or its hand-off is over).
HELD_GIVE_BACKS = 10_000
LEADER, FOLLOWER, NONE = Role.LEADER, Role.FOLLOWER, Role.NONE
# The origin of the monitor a recovered node gathers from its workers for its recovery line
# (no client's: node -1 is no node).
RECOVERY_ORIGIN = Origin(0, False, -1)


class ClusterNode:
    """One node's coordinator state. Events are methods (tick, on_peer, on_batch, on_batches,
    on_forward_requests, on_undelivered, on_fenced, on_unsent, begin_handoff); what they decide is
    taken as one Ready (ready(), has_ready()), and advance() is told once it is persisted and sent."""

    def __init__(self, config: NodeConfig, now: float, *, recovered: Recovered | None = None,
                 rng: random.Random | None = None, snapshot_dir: str | None = None) -> None:
        """recovered: what the node's disk held (None: start empty, as an in-memory node does);
        snapshot_dir: where the workers write snapshot parts (None: no snapshots; on an
        in-memory node only those a follower needs)."""
        self.config = config
        self.node_id = config.node_id
        self.members = [n.node_id for n in config.cluster_node_list] or [config.node_id]
        self._flow = Flow(max_batch=5000, sync_rate=config.queue_sync_rate)
        self.quorum_writes = config.replication == "quorum"
        rng = rng or random.Random()
        found = recovered or Recovered()
        # Entries fall off the log only once they are on disk too (advance: mark_stable).
        self.log = ChangeLog(config.queue_log_size, found.trans_id, found.vote_id,
                             max_bytes=config.queue_log_bytes, stable_trans_id=found.trans_id)
        if found.entries:
            self.log.accept(found.trans_id, found.vote_id, found.entries)
        vote = found.vote
        heartbeat = config.heartbeat_ms / 1000
        self.election = Election(
            self.node_id, self.members, self.log, rng, now,
            election_timeout=config.election_timeout_ms / 1000, heartbeat_interval=heartbeat,
            vote_id=vote[0], voted_for=vote[1],
        )
        self.follower = Follower(self.node_id, self.log, pull_interval=heartbeat)
        self.leader: LeaderReplication | None = None
        virtual = [(v.name, v.queue_list) for v in config.virtual_queue_list]
        self.router = Router(config.workers, virtual, config.dead_letter_suffix, first_gather=1)
        self.workers_trans_id = found.trans_id  # the workers reflect the log up to here
        # Each worker's count of the records it applied, and where its uncommitted ones are in
        # the log: a mode change rolls a worker back to a record of its own (workers/undo.py).
        self.seqs = WorkerSeqs(config.workers)
        self._committed_seqs = [0] * config.workers  # the last COMMITTED sent to each worker
        self._committed_at = now  # when COMMITTED may next be sent (once per heartbeat)
        # Replies wait until their records are on disk (process-crash safe) as well as committed.
        self.durable_trans_id = float("inf") if recovered is None else self.log.last_trans_id
        self.storage_ok = True
        self.pending: deque[tuple[int, bytes, bytes]] = deque()  # (needs trans_id, header, blob)
        self.gatherer = gather.Gatherer()
        self.forwarding = Forwarding(self.node_id, (config.host, config.port), self.router, rng, heartbeat=heartbeat,
                                     election_timeout=config.election_timeout_ms / 1000, max_wait=config.max_wait)
        self.clients: dict[int, tuple[str, int]] = {self.node_id: (config.host, config.port)}
        # Each member's http_port as this node knows it (0: no HTTP API known): its own, the
        # cluster_node_list's, then what each peer says of itself (on_peer); the acceptor's HTTP
        # API names the leader's in a 409 (status_fields). Replaced, not changed in place, so that
        # _announce sees a change.
        self.http_ports: dict[int, int] = {n.node_id: n.http_port for n in config.cluster_node_list}
        self.http_ports[self.node_id] = config.http_port
        self.status: dict | None = None
        # Counts changes of the workers' mode (MODE messages). The acceptor stamps requests with
        # the epoch it last heard of, so a worker holds a request until it has the same mode.
        self.epoch = 0
        # What is decided and not yet taken by advance(): see Ready (server/ready.py).
        self._to_peers: list[tuple[int, object]] = []
        self._to_acceptor: list[list[bytes]] = []
        self._to_workers: list[tuple[int, list[bytes]]] = []
        self._vote: tuple[int, int | None] | None = None
        self._truncate_after: int | None = None  # the log on disk must drop what follows this
        # An old leader's InstallSnapshot (ApplySnapshot) waits for its files (on_whole_snapshot):
        # until then the APPLY frames of later commits are kept here, to follow the workers' LOAD.
        self._awaiting_load: list[tuple[int, list[bytes]]] | None = None
        # A snapshot streamed from the leader: chunks to write, then the whole to check and install
        # (on_snapshot_installed). And the newest snapshot on this node's disk, to stream to followers.
        self._chunk_writes: list[WriteChunk] = []
        self._staged: list[SnapshotStaged] = []
        self.snapshot_source: SnapshotSource | None = None
        # WAL reads for followers the log left behind (ReadLog, see on_log_read), and the oldest
        # prev_trans_id they can start from (None: no WAL): set_wal_from.
        self._log_reads: list[ReadLog] = []
        self.wal_from: int | None = None
        self._stable_through = self.log.last_trans_id  # the log up to here is on disk
        self.log.mark_stable(self._stable_through)
        self._reported_role: Role | None = None  # the role the last Ready carried
        # A hand-off of leadership (begin_handoff) holds client requests until this time, or
        # until the node knows where they can go.
        self.handoff_until: float | None = None
        # The hand-off's barrier: the mode whose workers were fenced, and which of them have
        # answered FENCED (sent every batch of that mode, decide nothing more in it).
        self.fence_epoch = -1
        self.fenced: set[int] = set()
        self.held: list = []  # client requests of this node's acceptor, as on_forward_requests takes them
        self.held_forwards: list[Forward] = []  # other followers' requests
        self.held_undelivered: list[tuple[str, list[list[int]]]] = []  # messages to give back
        # The workers' replies _refuse replaced, by REFUSALS label, until take_refused().
        self.refused: dict[str, int] = {}
        # Snapshots made by the workers (server/snapshots.py).
        self.cuts = SnapshotCut(config.workers, config.snapshot_every if recovered is not None else None,
                                snapshot_dir, last=found.trans_id)
        if found.parts:  # each worker reads the snapshot's parts itself
            for index in range(config.workers):
                self._to_workers.append((index, ipc_frames.load_frames(found.trans_id, list(found.parts))))
        # The recovery line: once the workers were sent the log recovered from disk, up to here
        # (None: counted, or no disk), they are asked what they hold (an internal monitor
        # gathered from every worker, RECOVERY_ORIGIN); the counts wait in _replayed until that
        # point is committed, for take_replayed.
        self._replay_through: int | None = None if recovered is None else self.log.last_trans_id
        self._count_at: int | None = None  # where the workers were asked
        self._counted: tuple[int, int, int] | None = None  # (queues, messages, trans_id) gathered
        self._replayed: tuple[int, int, int] | None = None
        self._count_if_replayed()

    # ----------------------------------------------------------------- roles
    @property
    def role(self) -> Role:
        if self.leader is not None:
            return LEADER
        return FOLLOWER if self.election.leader_id is not None else NONE

    def status_fields(self) -> dict:
        """The role and the leader's client address, as the acceptor needs them. While this
        leader hands over, and after it stepped down until the new leader is heard, its
        acceptor sees a follower of this node: it passes every request here (held until the new
        leader is known) instead of to the workers, and answers no "no leader" meanwhile."""
        leader = self.election.leader_id
        role = self.role
        if (role == LEADER and self.election.transfer_target is not None) or (
                role == NONE and self.handoff_until is not None):
            role, leader = FOLLOWER, self.node_id
        host, port = self.clients.get(leader, ("", 0)) if leader is not None else ("", 0)
        return {"role": role, "leader_node_id": leader or 0, "leader_host": host, "leader_port": port,
                "epoch": self.epoch, "http_ports": self.http_ports}

    # ----------------------------------------------------------------- hand-off
    def begin_handoff(self, now: float, timeout: float) -> bool:
        """Before this node stops: hand leadership to an up-to-date follower (Raft's leadership
        transfer). New client requests are held from now on and go to the new leader once it is
        known (or are served here if the transfer fails). The workers are fenced
        (_fence_workers): TimeoutNow goes out once every worker has answered FENCED, so that
        every record decided while leading is in the log, and once the target holds all of it,
        committed. False if there is nothing to hand over (not leading, or no live follower)."""
        if self.leader is None:
            return False
        self._run(self.election.transfer_leadership(now, timeout, self._matches(), settled=False), now)
        if self.election.transfer_target is None:
            return False
        self.handoff_until = now + timeout
        self._fence_workers()
        self._announce()  # the acceptor hears it no longer leads: it fences its own requests
        return True

    def handing_off(self, now: float) -> bool:
        """Whether a hand-off is still under way: requests are being held."""
        if self.leader is not None:  # until TimeoutNow deposes this node, or the transfer aborts
            return self.election.transfer_target is not None
        # stepped down; the new leader not heard yet
        return self.handoff_until is not None and now < self.handoff_until and self.election.leader_id is None

    def on_fenced(self, epoch: int, index: int, now: float) -> None:
        """Worker `index` has sent every batch of mode `epoch` and decides nothing more in it."""
        if epoch == self.fence_epoch == self.epoch:
            self.fenced.add(index)
            self._handoff_progress(now)

    def _fence_workers(self) -> None:
        """Close the hand-off's barrier in the workers: a FENCE from this coordinator behind the
        requests it sent them, and one from the acceptor behind its own (it sends that when it
        hears it no longer leads; sent from here if it never heard that it leads in this mode,
        in which case it has routed no request of the mode)."""
        self.fence_epoch = self.epoch
        self.fenced = set()
        status = self.status or {}
        acceptor_routes = status.get("role") == LEADER and status.get("epoch") == self.epoch
        for index in range(self.config.workers):
            self._to_workers.append((index, ipc_frames.fence_frames(self.epoch, ipc_frames.FROM_COORDINATOR)))
            if not acceptor_routes:
                self._to_workers.append((index, ipc_frames.fence_frames(self.epoch, ipc_frames.FROM_ACCEPTOR)))

    def _workers_fenced(self) -> bool:
        """Whether every record the workers decided in this mode is in the log, and they decide
        no more."""
        return self.fence_epoch == self.epoch and len(self.fenced) == self.config.workers

    def _matches(self) -> dict[int, int]:
        leader = self.leader
        return {peer: leader.match_of(peer) for peer in self.election.peers} if leader is not None else {}

    def _handoff_progress(self, now: float) -> None:
        if self.handoff_until is not None and now >= self.handoff_until:
            self.handoff_until = None  # over, whatever came of it
        if self.leader is not None and self.election.transfer_target is not None and self._workers_fenced():
            self._run(self.election.on_progress(now, self._matches()), now)

    def _resume_leading(self) -> None:
        """A hand-off that did not happen: the workers accept requests again, in a new mode.
        A fenced worker's state is the log's: it goes on with it, and with the long polls and
        subscriptions it kept parked (it undoes nothing). One that never answered FENCED may
        still be deciding under the old mode: it rolls back to what it logged (its late batches
        are refused)."""
        if self.leader is None:
            return
        self._set_mode(True, list(self.seqs.counts))

    def _release_held(self, now: float) -> None:
        """After a hand-off: the held requests go to the new leader (or are served here if this
        node still leads); other followers' requests are refused as not applied, so that they
        send them to the new leader; messages to give back go to whoever leads."""
        if not (self.held or self.held_forwards or self.held_undelivered) or self.handing_off(now):
            return
        held, self.held = self.held, []
        forwards, self.held_forwards = self.held_forwards, []
        undelivered, self.held_undelivered = self.held_undelivered, []
        if held:
            self.on_forward_requests(held, now)
        for msg in forwards:
            self._serve_forwarded(msg)
        for queue, given in undelivered:
            self.on_undelivered(queue, given)

    def _announce(self) -> None:
        status = self.status_fields()
        if status != self.status:
            self.status = status
            self._to_acceptor.append(ipc_frames.status_frames(status))

    # ----------------------------------------------------------------- Ready / advance
    def has_ready(self) -> bool:
        """Whether ready() has anything to persist or send."""
        return bool(self._to_acceptor) or self._more_than_replies()

    def _more_than_replies(self) -> bool:
        """Whether anything but messages to the acceptor waits for a Ready."""
        return bool(self._to_workers or self._to_peers or self._vote is not None or self.cuts.done
                    or self._chunk_writes or self._staged
                    or self._truncate_after is not None
                    or self.log.last_trans_id != self._stable_through or self.role != self._reported_role)

    def take_replies(self) -> list[list[bytes]]:
        """After advance(): when all that waits is messages to the acceptor (the replies the
        write just released), take them; they may be sent at once, with nothing to persist
        first (has_ready() is False once they are taken). Otherwise nothing: a Ready carries them
        with the rest."""
        if not self._to_acceptor or self._more_than_replies():
            return []
        taken, self._to_acceptor = self._to_acceptor, []
        return taken

    def ready(self) -> Ready:
        """Everything decided since the last advance(): persist it (log, then vote), send it, then
        call advance(). Taking it changes nothing; an empty Ready when has_ready() is False."""
        role = self.role
        return Ready(
            log_through=self.log.last_trans_id, truncate_after=self._truncate_after, vote=self._vote,
            to_workers=tuple(self._to_workers), to_acceptor=tuple(self._to_acceptor),
            to_peers=tuple(self._to_peers), role=role if role != self._reported_role else None,
            snapshots=tuple(self.cuts.done),
            chunk_writes=tuple(self._chunk_writes), staged=tuple(self._staged))

    def advance(self, ready: Ready, *, durable_trans_id: int | None = None, log_stored: bool = True) -> None:
        """`ready` is carried out: its messages are sent, its vote stored (or given up on: the
        coordinator then sent no peer message). log_stored: whether its log reached the disk (if
        not, writes are refused until it does, and the next Ready asks again); durable_trans_id:
        how far the log is now safe (None: as before, e.g. a node without a disk). Replies that
        waited for the disk are released into the next Ready."""
        del self._to_workers[:len(ready.to_workers)]
        del self._to_acceptor[:len(ready.to_acceptor)]
        del self._to_peers[:len(ready.to_peers)]
        del self.cuts.done[:len(ready.snapshots)]
        del self._chunk_writes[:len(ready.chunk_writes)]
        del self._staged[:len(ready.staged)]
        if self._vote == ready.vote:
            self._vote = None
        if ready.role is not None:
            self._reported_role = ready.role
        if not log_stored:
            self.storage_ok = False
            return
        if self._truncate_after == ready.truncate_after:
            self._truncate_after = None
        self._stable_through = ready.log_through
        self.log.mark_stable(ready.log_through)
        if durable_trans_id is not None:
            self.durable_trans_id = durable_trans_id
            self.storage_ok = True
            self._release_pending()

    # ----------------------------------------------------------------- inputs
    def tick(self, now: float) -> None:
        """Advance time: elections, heartbeats, catch-up, forwarded requests that timed out."""
        self._run(self.election.tick(now), now)
        if self.leader is not None:
            self._run(self.leader.tick(now), now)
            self._send_committed(now)
        self._handoff_progress(now)
        self._snapshot_progress(now)
        self._carry(self.forwarding.tick(now, self.election.leader_id, self.election.vote_id))
        self._release_held(now)
        self._announce()

    def wake_at(self) -> float:
        """When tick() next has something to do."""
        wake = self.election.wake_at
        if self.handoff_until is not None:
            wake = min(wake, self.handoff_until)
        return min(wake, self.forwarding.wake_at(), self.cuts.wake_at())

    def on_unsent(self, msg: object, now: float) -> None:
        """A message to a peer could not be sent (its link is not up yet, or is too far behind).
        The election and replication resend what matters; forwarded client requests are sent
        again every heartbeat until their leader answers or they time out; the messages of a
        consume reply that cannot go back to its follower are given back."""
        self._carry(self.forwarding.on_unsent(msg, now))

    def on_peer(self, msg: object, client: tuple[str, int], now: float, http_port: int = 0) -> None:
        """A message from another node, with the client address (host, port) and the http_port it
        gives for itself (0: none said; what this node knew stays)."""
        src = getattr(msg, "src", None)
        if src not in self.election.peers:
            return
        if client[1]:
            self.clients[src] = client
        if http_port and self.http_ports.get(src) != http_port:
            self.http_ports = {**self.http_ports, src: http_port}
        kind = type(msg)
        if kind is Forward:
            if self.handing_off(now):
                self.held_forwards.append(msg)
            else:
                self._serve_forwarded(msg)
        elif kind is ForwardReply:
            self._carry(self.forwarding.on_replies(msg, now, self.election.vote_id))
        elif kind is GiveBack:
            if self.leader is not None:  # else the messages stay taken: never handed out twice
                self.on_undelivered(msg.queue, [list(m) for m in zip(msg.msg_ids, msg.delivery_counts)])
        else:
            self._run(self.election.on_message(msg, now), now)
            if msg.vote_id == self.election.vote_id:
                if self.leader is not None:
                    self._run(self.leader.on_message(msg, now), now)
                elif type(msg).SENDER == "leader" and self.election.leader_id == src:
                    self._run(self.follower.on_message(msg, now), now)
            self._handoff_progress(now)
        self._release_held(now)
        self._announce()

    def on_batch(self, records: bytes, header: bytes, blob: bytes, partials: bytes, epoch: int,
                 now: float, index: int = 0) -> None:
        """Worker `index`'s batch: its change records, its replies, its parts of scattered
        requests, all decided under the workers' mode `epoch`.

        A reply leaves once everything the worker had applied when it made it is committed and on
        disk: its own records, and on a leader every record logged before it (a reply without
        records of its own, such as an idempotent produce's "duplicate", may rest on them)."""
        self.on_batches([(records, header, blob, partials, epoch, index)], now)

    def on_batches(self, batches: list[tuple[bytes, bytes, bytes, bytes, int, int]], now: float) -> None:
        """Several workers' batches received together, (records, header, blob, partials, epoch,
        index) each, in the order they came: as on_batch one after another, with the new
        records replicated (and on a node alone, committed) once for all of them."""
        appended = False
        for records, header, blob, partials, epoch, index in batches:
            appended = self._take_batch(records, header, blob, partials, epoch, index) or appended
        if appended and self.leader is not None:
            self._run(self.leader.replicate(now), now)

    def _take_batch(self, records: bytes, header: bytes, blob: bytes, partials: bytes, epoch: int,
                    index: int) -> bool:
        """on_batch but the replication of its records; whether it appended any to the log."""
        appended = False
        if epoch != self.epoch:
            # Decided under a mode that is over: since then this node stopped leading (and
            # maybe leads again), or its workers were rolled back or loaded a snapshot. What
            # ended that mode undid those changes in the worker, so they must not enter the
            # log, and no reply may promise what they did.
            if header != ipc_frames.EMPTY_LIST:
                self._refuse(header, blob, p.LEADERSHIP_CHANGED
                             if self.leader is None else p.MODE_CHANGED)
            header = ipc_frames.EMPTY_LIST
        elif records != ipc_frames.EMPTY_LIST:
            if self.leader is None or not self.storage_ok:
                self._refuse(header, blob, p.STORAGE_UNAVAILABLE if self.leader else p.NOT_LEADER_RETRY)
                if self.leader is not None:
                    # Undo the changes in the workers too: each keeps the records it logged.
                    self._set_mode(True, list(self.seqs.counts))
                header = ipc_frames.EMPTY_LIST
            else:
                first, last = self.log.append(self.election.vote_id, decode_many(records), each_encoded(records))
                self.seqs.logged(index, first, last - first + 1)
                self.workers_trans_id = last
                appended = True
        if header != ipc_frames.EMPTY_LIST:
            need = self.log.last_trans_id if self.leader is not None else 0
            if need > self._releasable():
                self.pending.append((need, header, blob))
            else:
                self._release(header, blob)
        if partials != ipc_frames.EMPTY_LIST:
            self._gather(orjson.loads(partials))
        return appended

    def on_forward_requests(self, items: list, now: float) -> None:
        """Client requests this follower's acceptor could not serve ((origin, req_no, request),
        as ipc_frames.read_forward reads them): send them to the leader (held while this node hands over)."""
        if self.handing_off(now):
            self.held.extend(items)
            return
        redirect = None if self.config.forward_request else self._leader_fields()
        self._carry(self.forwarding.on_requests(items, now, leading=self.leader is not None,
                                                leader=self.election.leader_id, vote_id=self.election.vote_id,
                                                redirect=redirect))

    def on_undelivered(self, queue: str, given: list[list[int]]) -> None:
        """The messages of a consume reply that could not be delivered ([msg_id, delivery_count]
        each; the client left, or the reply came too late): the leader's worker gives them back
        (leases released, at-most-once messages restored). A follower passes them to the leader.
        While the workers are fenced (a hand-off), or no leader is known, they are held until
        that is over (at most HELD_GIVE_BACKS: past that they stay taken, never handed out twice)."""
        if self.leader is not None and self.fence_epoch != self.epoch:
            self._to_workers.append((self.router.worker_for(queue), ipc_frames.undeliver_frames(queue, given)))
        elif self.leader is None and self.election.leader_id is not None:
            self._to_peers.append((self.election.leader_id, GiveBack(
                self.election.vote_id, self.node_id, queue, tuple(m[0] for m in given), tuple(m[1] for m in given))))
        elif len(self.held_undelivered) < HELD_GIVE_BACKS:
            self.held_undelivered.append((queue, given))

    # ----------------------------------------------------------------- election and replication
    def _run(self, actions: list, now: float) -> None:
        for a in actions:
            kind = type(a)
            if kind is Send:
                self._to_peers.append((a.to, a.msg))
            elif kind is Commit:
                self._commit(a)
            elif kind is PersistVote:
                self._vote = (a.vote_id, a.voted_for)
            elif kind is BecomeLeader:
                self._lead(a.vote_id, now)
            elif kind is BecomeFollower or kind is BecomeCandidate:
                self._stop_leading(now)
                if kind is BecomeFollower and a.leader_id is not None:
                    self._run(self.follower.pull(a.leader_id, a.vote_id, now), now)
            elif kind is WriteChunk:
                self._chunk_writes.append(a)
            elif kind is SnapshotStaged:
                self._staged.append(a)
            elif kind is ReadLog:
                self._log_reads.append(a)
            elif kind is SendSnapshot:
                # Streamed once the workers' cut is on disk (on_snapshot_source); a node with no
                # snapshot_dir has none to give.
                self.cuts.want()
            elif kind is ApplySnapshot:
                # An old leader's whole snapshot (InstallSnapshot): the log was reset to it; the
                # coordinator writes it as files (Transfers), then on_whole_snapshot LOADs them.
                self._to_workers.extend(self.cuts.abort("a snapshot was installed"))
                self.workers_trans_id = a.trans_id
                self.seqs.reset()
                self.cuts.last = a.trans_id
                self._truncate_after = -1  # the log on disk restarts after the snapshot
                self._awaiting_load = []
                self._staged.append(a)
            elif kind is TransferAborted:
                self._resume_leading()  # held requests are then served here (_release_held)
            elif kind is Discarded:
                # Never applied (followers apply committed entries only; a leader resets its
                # workers when it stops leading), but the disk must forget them too.
                if a.entries:
                    cut = a.entries[0].trans_id - 1
                    self._truncate_after = cut if self._truncate_after is None else min(self._truncate_after, cut)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _lead(self, vote_id: int, now: float) -> None:
        """This node won: bring the workers up to the whole log (entries of earlier terms will be
        committed with this term's first), then let them accept writes."""
        self.follower.reset()
        self.forwarding.orphan(now)
        self.leader = LeaderReplication(self.node_id, self.members, self.log, vote_id, now, self._flow,
                                        self.snapshot_source, self.wal_from)
        self._apply_to_workers(self.log.entries_after(self.workers_trans_id, 1 << 62) or [],
                               committed=False)
        self.log.append(vote_id, [NOOP])
        self.workers_trans_id = self.log.last_trans_id
        self._set_mode(True, list(self.seqs.counts))
        self._run(self.leader.replicate(now), now)

    def _stop_leading(self, now: float) -> None:
        """Whatever the reason: stop accepting writes; the workers roll back to the committed
        state (each to its last committed record); writes waiting for a commit are answered
        with an error."""
        self.follower.reset()
        self.forwarding.orphan(now)
        if self.leader is None:
            return
        self.leader = None
        commit = self.log.commit_trans_id
        self.workers_trans_id = commit
        self._set_mode(False, self.seqs.keep(commit))
        while self.pending:
            _, header, blob = self.pending.popleft()
            self._refuse(header, blob, p.LEADERSHIP_LOST)

    def _commit(self, c: Commit) -> None:
        """Entries are committed: on a follower the workers replay them; the replies that waited
        for them are released."""
        if self.leader is None:
            self._apply_to_workers([e for e in c.entries if e.trans_id > self.workers_trans_id], committed=True)
        self._note_replayed()
        self._release_pending()
        if self.cuts.running:
            self._snapshot_progress(None)  # a cut may wait for this commit

    def _releasable(self) -> float:
        """Writes up to here may be answered: on disk, and (in quorum mode) committed."""
        if self.quorum_writes:
            return min(self.log.commit_trans_id, self.durable_trans_id)
        return self.durable_trans_id

    def _release_pending(self) -> None:
        limit = self._releasable()
        pending = self.pending
        while pending and pending[0][0] <= limit:
            _, header, blob = pending.popleft()
            self._release(header, blob)

    def _apply_to_workers(self, entries: list[Entry], committed: bool = False) -> None:
        """Have the workers replay `entries` (`committed`: they keep no undo for them)."""
        if not entries:
            return
        through = self._replay_through
        if through is not None and self._counted is None and entries[0].trans_id <= through < entries[-1].trans_id:
            split = through - entries[0].trans_id + 1  # the recovered log ends inside: count there
            self._apply_to_workers(entries[:split], committed)
            entries = entries[split:]
        per_worker: dict[int, tuple[list[Record], list[int]]] = {}
        worker_for = self.router.worker_for
        for e in entries:
            record = e.record
            if type(record) is not Noop:
                records, trans_ids = per_worker.setdefault(worker_for(record.queue), ([], []))
                records.append(record)
                trans_ids.append(e.trans_id)
        out = self._to_workers if self._awaiting_load is None else self._awaiting_load
        for index, (records, trans_ids) in per_worker.items():
            out.append((index, ipc_frames.apply_frames(records, committed)))
            self.seqs.applied(index, trans_ids, committed)
        self.workers_trans_id = max(self.workers_trans_id, entries[-1].trans_id)
        self._count_if_replayed()

    def _send_committed(self, now: float) -> None:
        """At most once a heartbeat, tell each leading worker how far its records are committed
        (COMMITTED), so that its undo journal forgets them."""
        if now < self._committed_at:
            return
        self._committed_at = now + self.config.heartbeat_ms / 1000
        sent = self._committed_seqs
        for index, seq in enumerate(self.seqs.commit(self.log.commit_trans_id)):
            if seq > sent[index]:
                sent[index] = seq
                self._to_workers.append((index, ipc_frames.committed_frames(self.epoch, seq)))

    def _set_mode(self, accepting: bool, keep: list[int] | None = None) -> None:
        """Start a new mode of the workers: whether they accept queue requests; `keep`: each
        worker first undoes its records after that number (None: it keeps all)."""
        self._to_workers.extend(self.cuts.abort("the workers' mode changed"))
        self.epoch += 1
        self._committed_seqs = [0] * self.config.workers
        for index in range(self.config.workers):
            self._to_workers.append((index, ipc_frames.mode_frames(
                accepting, self.epoch, None if keep is None else keep[index], self.workers_trans_id)))
        if accepting and self.election.transfer_target is not None:
            self._fence_workers()  # a new mode during a hand-off is fenced too

    # ----------------------------------------------------------------- snapshots
    def on_synced(self, epoch: int, cut_id: int, index: int, now: float) -> None:
        """Worker `index` has handled all it was sent before cut `cut_id`'s SYNC."""
        self._to_workers.extend(self.cuts.on_synced(epoch, cut_id, index, now))

    def on_snapped(self, epoch: int, cut_id: int, index: int, now: float) -> None:
        """Worker `index` forked the writer of its part of cut `cut_id` in mode `epoch`; every batch
        it decided before is logged (the pipe is FIFO), and it holds the later ones (SnapshotCut)."""
        self._to_workers.extend(self.cuts.on_snapped(epoch, cut_id, index, self.log.last_trans_id, self.log.term_at, now))
        self._snapshot_progress(now)

    def on_part_done(self, cut_id: int, index: int, ok: bool, part: dict | None, now: float) -> None:
        """Worker `index`'s writer of cut `cut_id` ended: its part is written (ok) or not."""
        self._to_workers.extend(self.cuts.on_part_done(cut_id, index, ok, part))
        self._snapshot_progress(now)

    def _snapshot_progress(self, now: float | None) -> None:
        """Move the running cut on (None: the time has not moved), or start one when due: on a
        node whose disk takes the log, not while a hand-off fences the workers."""
        cuts = self.cuts
        commit = self.log.commit_trans_id
        if cuts.running:
            self._to_workers.extend(cuts.poll(now, commit, self.log.term_at))
        elif now is not None and self.storage_ok and cuts.due(commit, now) and self.fence_epoch != self.epoch:
            leading = self.leader is not None
            point = self.log.last_trans_id if leading else self.workers_trans_id
            self._to_workers.extend(cuts.start(self.epoch, now, min(commit, point), hold=leading, point=point,
                                               term_at=self.log.term_at))

    def on_snapshot_source(self, source: SnapshotSource, now: float) -> None:
        """A snapshot is on this node's disk (found at start, written, or received): the one to
        stream to a follower that needs one."""
        self.snapshot_source = source
        if self.leader is not None:
            self._run(self.leader.set_source(source, now), now)

    def on_snapshot_unreadable(self, trans_id: int, now: float) -> None:
        """The files of the snapshot at trans_id cannot be read: its transfers start again from
        the newest snapshot (a new cut if it was that one)."""
        if self.snapshot_source is not None and self.snapshot_source.trans_id == trans_id:
            self.snapshot_source = None
        if self.leader is not None:
            self._run(self.leader.on_snapshot_unreadable(trans_id, now), now)

    def streaming(self) -> list[SnapshotSource]:
        """The snapshots being streamed to followers (their files must stay readable)."""
        return self.leader.streaming() if self.leader is not None else []

    def set_wal_from(self, wal_from: int | None) -> None:
        """The oldest prev_trans_id a batch can be read from this node's WAL with (Storage.wal_from;
        it moves on as segments are removed)."""
        self.wal_from = wal_from
        if self.leader is not None:
            self.leader.wal_from = wal_from

    def take_log_reads(self) -> list[ReadLog]:
        """The WAL reads to carry out (each answered by on_log_read or on_log_unreadable)."""
        taken, self._log_reads = self._log_reads, []
        return taken

    def on_log_read(self, read: ReadLog, frames: list[tuple[int, int, bytes]], now: float) -> None:
        """What the WAL holds for `read` (Storage.read_log): sent to the follower as an ordinary
        AppendEntries, its records as they are (the leader decodes none of them)."""
        if self.leader is not None:
            self._run(self.leader.on_log_read(read.to, read.after, frames, now), now)

    def on_log_unreadable(self, read: ReadLog, now: float) -> None:
        """The WAL could not be read for `read`: the follower gets a snapshot instead."""
        if self.leader is not None:
            self._run(self.leader.on_log_unreadable(read.to, now), now)

    def needs_snapshot(self, trans_id: int) -> bool:
        """Whether a snapshot at trans_id streamed from the leader would move this node on."""
        return self.leader is None and trans_id > self.log.commit_trans_id

    def on_snapshot_installed(self, staged: SnapshotStaged, parts: list[str], now: float) -> bool:
        """The snapshot streamed from the leader is checked and installed on disk as `parts`: the
        workers (LOAD) and the log restart from it, and the leader hears so. False if this node
        no longer needs it."""
        if not self.needs_snapshot(staged.trans_id):
            return False
        self._to_workers.extend(self.cuts.abort("a snapshot was installed"))
        self.workers_trans_id = staged.trans_id
        self._load_workers(staged.trans_id, parts)
        self.cuts.last = staged.trans_id
        self._truncate_after = -1  # the log on disk restarts after the snapshot
        self._run(self.follower.installed(staged.trans_id, staged.vote_id, self.election.leader_id,
                                          self.election.vote_id), now)
        return True

    def on_whole_snapshot(self, trans_id: int, parts: list[str] | None) -> None:
        """The whole snapshot an old leader sent (ApplySnapshot) is written as `parts` (None: it
        could not be; the node stops rather than go on with workers that lack it): the workers
        LOAD them, then replay what was committed since."""
        held, self._awaiting_load = self._awaiting_load or [], None
        if parts is None:
            raise SystemExit(f"cannot write the snapshot at trans_id {trans_id} the leader sent")
        self._load_workers(trans_id, parts)
        self._to_workers.extend(held)

    def _load_workers(self, trans_id: int, parts: list[str]) -> None:
        """Every worker replaces its queues with those of the snapshot `parts` it owns (LOAD):
        their record counts start again."""
        for index in range(self.config.workers):
            self._to_workers.append((index, ipc_frames.load_frames(trans_id, parts)))
        self.seqs.reset()
        self._count_if_replayed()

    # ----------------------------------------------------------------- replies
    def _release(self, header: bytes, blob: bytes) -> None:
        """Send replies on: to the acceptor, or back to the follower that forwarded them."""
        self._carry(self.forwarding.release(header, blob, self.election.vote_id))

    def _reply_now(self, items: list[tuple[Origin, int, dict]]) -> None:
        if items:
            self._release(*replies.encode(items))

    def _refuse(self, header: bytes, blob: bytes, reason: str) -> None:
        """Answer every request of a batch with an error instead of its reply, and count them by
        `reason` (a key of REFUSALS): the worker counted each request when it replied."""
        rows = [(origin, req_no, p.error_reply(replies.naming(replies.decoded(data)), reason, self.node_id))
                for origin, req_no, data in replies.decode(header, blob)]
        count_refused(self.refused, reason, sum(1 for row in rows if row[1] != p.PUSH_REQ_NO))
        self._reply_now(rows)

    def _count_if_replayed(self) -> None:
        """Once the workers were sent all the log recovered from disk: ask them what they hold
        (a monitor gathered from every worker, behind what they were sent on the same pipe)."""
        through = self._replay_through
        if through is None or self._count_at is not None or self.workers_trans_id < through:
            return
        self._count_at = self.workers_trans_id
        items = self.router.plan(p.MONITOR, {"action": p.MONITOR}, RECOVERY_ORIGIN, 0)
        assert not isinstance(items, str)
        for index, item in items:
            self._to_workers.append((index, ipc_frames.req_frames([item], self.epoch)))

    def _note_replayed(self) -> None:
        counted = self._counted
        if counted is not None and self.log.commit_trans_id >= counted[2]:
            self._replay_through = self._counted = None
            self._replayed = counted

    def take_replayed(self) -> tuple[int, int, int] | None:
        """Once the workers hold all a recovered node found on its disk (the snapshot and the
        log after it, replayed as it commits) and have said what that is: (queues, messages,
        trans_id) at the end of that log, for the recovery line. None before, after it was taken
        once, and on a node without a disk."""
        self._note_replayed()
        taken, self._replayed = self._replayed, None
        return taken

    def take_refused(self) -> dict[str, int]:
        """The workers' replies refused since the last call, by REFUSALS label: for
        queue_server_writes_refused_total."""
        taken, self.refused = self.refused, {}
        return taken

    def _gather(self, partials: list) -> None:
        finished = []
        for tag, part in partials:
            done = self.gatherer.add(tag, part)
            if done is not None:
                origin, req_no, request, parts = done
                if origin == RECOVERY_ORIGIN:
                    merged = gather.merge(request, parts, {})
                    self._counted = (merged.get("queue_count", 0), merged.get("size", 0), self._count_at or 0)
                    self._note_replayed()
                    continue
                finished.append((origin, req_no, gather.merge(request, parts, self.node_fields())))
        self._reply_now(finished)

    def node_fields(self) -> dict:
        """This node's own fields in a monitor reply."""
        return {
            "node_id": self.node_id,
            "leader_node_id": self.election.leader_id or 0,
            "trans_id": self.log.last_trans_id,
            "commit_trans_id": self.log.commit_trans_id,
            "log_size": len(self.log),
            "max_log_size": self.config.queue_log_size,
            "role": self.role,
            "vote_id": self.election.vote_id,
            **self._followers(),
        }

    def _followers(self) -> dict:
        """On a leader, each follower's replication state: {"followers": [{node_id, match_trans_id,
        lag, client_host, client_port}, ...]}; nothing on other nodes."""
        if self.leader is None:
            return {}
        last = self.log.last_trans_id
        rows = []
        for peer in sorted(self.election.peers):
            match = self.leader.match_of(peer)
            host, port = self.clients.get(peer, ("", 0))
            rows.append({"node_id": peer, "match_trans_id": match, "lag": max(0, last - match),
                         "client_host": host, "client_port": port})
        return {"followers": rows}

    # ----------------------------------------------------------------- forwarding
    def _carry(self, actions: list) -> None:
        """Carry out what server/forwarding.py decided."""
        for a in actions:
            kind = type(a)
            if kind is Deliver:
                self._to_acceptor.append(ipc_frames.rep_frames(a.header, a.blob))
            elif kind is Send:
                self._to_peers.append((a.to, a.msg))
            elif kind is Work:
                self._to_workers.append((a.index, ipc_frames.req_frames([a.item], self.epoch)))
            elif kind is Undeliver:
                self.on_undelivered(a.queue, a.given)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _serve_forwarded(self, msg: Forward) -> None:
        self._carry(self.forwarding.serve(msg, self.leader is not None, self.election.vote_id))

    def _leader_fields(self) -> dict:
        """The leader_* fields of a reply that points at the leader."""
        return {k: v for k, v in self.status_fields().items() if k.startswith("leader_")}
