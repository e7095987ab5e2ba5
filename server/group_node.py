"""One queue group's replicated log on this node, free of I/O: its election, change log,
replication to and from its peers, which of its replies may go out (a write is answered once
committed), what the workers must replay of it, their mode (epoch), the hand-off barrier and its
snapshots. ClusterNode (server/cluster.py) holds one per group the node is a replica of, and
routes events to it; what it decides goes into the node's Outbox (server/ready.py) and the parts
of the node's Ready that are the group's own (log, vote, snapshot files).

One file, over 600 lines, because a role change, a commit or a refused batch touches the
election, the log, the replication progress, the workers' mode and the replies waiting for a
commit together: each handler leaves all of them agreeing.
"""
from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING

from queue_server.config.loader import NodeConfig
from queue_server.election.messages import (
    BecomeCandidate, BecomeFollower, BecomeLeader, PersistVote, Send, TransferAborted,
)
from queue_server.election.balance import Balance
from queue_server.election.state import Election
from queue_server.protocol import ipc_frames
from queue_server.protocol import vocabulary as p
from queue_server.protocol.records import Noop, Record, decode_many, each_encoded
from queue_server.protocol.roles import Role
from queue_server.replication.follower import Follower
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import (
    ApplySnapshot, Commit, Discarded, GiveBack, ReadLog, Recovered, SendSnapshot, SnapshotStaged, WriteChunk,
)
from queue_server.replication.progress import Flow, LeaderReplication
from queue_server.replication.transfer import SnapshotSource
from queue_server.server.ready import GroupPart, Outbox, Ready
from queue_server.server.recovery_count import RecoveryCount, recovery_origin
from queue_server.server.snapshots import SnapshotCut
from queue_server.server.worker_seqs import WorkerSeqs

if TYPE_CHECKING:
    from queue_server.server.cluster import ClusterNode

NOOP = Noop()
LEADER, FOLLOWER, NONE = Role.LEADER, Role.FOLLOWER, Role.NONE


class GroupNode:
    """One group's replicated log on this node and the workers' state of it. Its inputs come
    through ClusterNode; what it sends goes into the node's Outbox; the node's Forwarding,
    Router, refusal counts and client addresses are the node's (`host`)."""

    def __init__(self, host: ClusterNode, group: int, config: NodeConfig, now: float, *,
                 recovered: Recovered | None, rng: random.Random, snapshot_dir: str | None) -> None:
        self.host = host
        self.group = group
        self.out: Outbox = host.out
        # The node's first group's peer messages are the node's (Ready.to_peers); another
        # group's, its part's.
        self.to_peers: list[tuple[int, object]] = host.out.peers if group == host.first_group else []
        self.config = config
        self.node_id = config.node_id
        self.members = list(host.placement.replicas(group))  # its replica set (group 0: every node)
        # The other nodes, to which its leader says it leads (_tell_others): they pass the group's
        # requests to it (server/remote_group.py).
        self.others = [n for n in host.members if n not in self.members]
        self._told_at = 0.0  # when the leader last told them
        self._flow = Flow(max_batch=5000, sync_rate=config.queue_sync_rate)
        self.quorum_writes = config.replication == "quorum"
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
        # Counts changes of the workers' mode (MODE messages). The acceptor stamps requests with
        # the epoch it last heard of, so a worker holds a request until it has the same mode.
        self.epoch = 0
        # This group's parts of a Ready (server/ready.py), not yet taken by advance().
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
        # The vote_id the hand-off started in: a node that steps down in that same term lost its
        # quorum rather than being deposed, and nobody is about to lead (handing_off).
        self.handoff_vote = 0
        # The hand-off's barrier: the mode whose workers were fenced, and which of them have
        # answered FENCED (sent every batch of that mode, decide nothing more in it).
        self.fence_epoch = -1
        self.fenced: set[int] = set()
        # Snapshots made by the workers (server/snapshots.py).
        self.cuts = SnapshotCut(config.workers, config.snapshot_every if recovered is not None else None,
                                snapshot_dir, last=found.trans_id, group=group)
        if found.parts:  # each worker reads the snapshot's parts itself
            for index in range(config.workers):
                self.out.workers.append((index, ipc_frames.load_frames(found.trans_id, list(found.parts), group)))
        # The recovery line's counts (None: no disk), asked of the workers in _count_if_replayed.
        self.recovery = RecoveryCount(None if recovered is None else self.log.last_trans_id)
        self._count_if_replayed()
        # When to hand the group to its preferred leader (only with queue groups: one group has
        # no preferred leader, and leads wherever it was elected, as always).
        placement = host.placement
        self.balance = Balance(self.node_id, placement.preferred_leader(group) if placement.queue_groups > 1 else None)
        # The client requests forwarded to this group's leader, or served for other replicas
        # (made last: the election drew from rng first, as it always did).
        self.forwarding = host.new_forwarding(rng)

    # ----------------------------------------------------------------- roles
    @property
    def role(self) -> Role:
        if self.leader is not None:
            return LEADER
        return FOLLOWER if self.election.leader_id is not None else NONE

    # ----------------------------------------------------------------- hand-off
    def begin_handoff(self, now: float, timeout: float, target: int | None = None) -> bool:
        """Hand this group's leadership to `target`, or to the most up-to-date live follower
        (Raft's leadership transfer);
        its workers are fenced (_fence_workers): TimeoutNow goes out once every worker has
        answered FENCED, so that every record decided while leading is in the log, and once the
        target holds all of it, committed. False if there is nothing to hand over (not leading,
        or no live follower)."""
        if self.leader is None:
            return False
        self._run(self.election.transfer_leadership(now, timeout, self._matches(), target, settled=False), now)
        if self.election.transfer_target is None:
            return False
        self.handoff_until = now + timeout
        self.handoff_vote = self.election.vote_id
        self._fence_workers()
        return True

    def handing_off(self, now: float) -> bool:
        """Whether a hand-off is still under way: requests are being held."""
        if self.leader is not None:  # until TimeoutNow deposes this node, or the transfer aborts
            return self.election.transfer_target is not None
        # stepped down; the new leader not heard yet
        if self.handoff_until is None or now >= self.handoff_until or self.election.leader_id is not None:
            return False
        # Deposed by a newer term (the target's campaign, or another's): a leader is on its way.
        # In its own term, this node stepped down because no quorum answered it for an election
        # timeout (its followers are stopping too, or it is cut off): waiting brings no leader.
        return self.election.vote_id != self.handoff_vote

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
        view = self.host.announced(self.group)
        acceptor_routes = view.get("role") == LEADER and view.get("epoch") == self.epoch
        for index in range(self.config.workers):
            self.out.workers.append((index, ipc_frames.fence_frames(self.epoch, ipc_frames.FROM_COORDINATOR, self.group)))
            if not acceptor_routes:
                self.out.workers.append((index, ipc_frames.fence_frames(self.epoch, ipc_frames.FROM_ACCEPTOR, self.group)))

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
        if self.leader is not None and self.election.transfer_target is not None:
            matches = self._matches()
            self.election.retarget_transfer(now, matches)
            if self._workers_fenced():
                self._run(self.election.on_progress(now, matches), now)

    def _resume_leading(self) -> None:
        """A hand-off that did not happen: the workers accept requests again, in a new mode.
        A fenced worker's state is the log's: it goes on with it, and with the long polls and
        subscriptions it kept parked (it undoes nothing). One that never answered FENCED may
        still be deciding under the old mode: it rolls back to what it logged (its late batches
        are refused)."""
        if self.leader is None:
            return
        self._set_mode(True, list(self.seqs.counts))

    # ----------------------------------------------------------------- Ready / advance
    def has_ready(self) -> bool:
        """Whether this group has a part of its own for a Ready (the log, the vote, the role,
        snapshot files; another group than 0: its peer messages)."""
        return bool(self._vote is not None or self.cuts.done or self._chunk_writes or self._staged
                    or (self.group != 0 and self.to_peers)
                    or self._truncate_after is not None
                    or self.log.last_trans_id != self._stable_through or self.role != self._reported_role)

    def _tell_others(self, now: float) -> None:
        """On the leader, each heartbeat: tell the nodes that are no replicas of the group that
        it leads, with a Heartbeat (a non-replica answers none)."""
        self._told_at = now
        told = self.election.heartbeat()
        self.to_peers.extend((node, told) for node in self.others)

    def ready(self, to_workers: tuple, to_acceptor: tuple, to_peers: tuple) -> Ready:
        """This group's parts of a Ready, with the node's messages."""
        role = self.role
        return Ready(
            log_through=self.log.last_trans_id, truncate_after=self._truncate_after, vote=self._vote,
            to_workers=to_workers, to_acceptor=to_acceptor,
            to_peers=to_peers, role=role if role != self._reported_role else None,
            snapshots=tuple(self.cuts.done),
            chunk_writes=tuple(self._chunk_writes), staged=tuple(self._staged))

    def part(self) -> GroupPart:
        """This group's part of a Ready (a group other than the node's first)."""
        role = self.role
        return GroupPart(self.group, self.log.last_trans_id, self._truncate_after, self._vote, tuple(self.to_peers),
                         role if role != self._reported_role else None, tuple(self.cuts.done),
                         tuple(self._chunk_writes), tuple(self._staged))

    def advance(self, ready: Ready | GroupPart, durable_trans_id: int | None, log_stored: bool) -> None:
        """This group's parts of `ready` are carried out (see ClusterNode.advance)."""
        if type(ready) is GroupPart:
            del self.to_peers[:len(ready.to_peers)]
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
        """Advance time: elections, heartbeats, catch-up, the hand-off, snapshots."""
        self._run(self.election.tick(now), now)
        if self.leader is not None:
            self._run(self.leader.tick(now), now)
            self._send_committed(now)
            if self.others and now >= self._told_at + self.election.heartbeat_interval:
                self._tell_others(now)
        self._handoff_progress(now)
        self._balance_progress(now)
        self._snapshot_progress(now)

    def _balance_progress(self, now: float) -> None:
        """Hand the group to its preferred leader once that node has kept up for a while
        (election/balance.py), as a stopping node hands its groups over; one move at a time. (A
        leader ticks every heartbeat: wake_at needs no time of its own for this.)"""
        election = self.election
        preferred = self.balance.preferred
        leading = self.leader is not None and election.transfer_target is None
        target = self.balance.check(now, leading, self.log.last_trans_id, self._matches() if leading else {},
                                    leading and preferred is not None and election.live(now, preferred),
                                    self.host.handing_off(now))
        if target is not None and self.begin_handoff(now, 2 * self.config.election_timeout_ms / 1000, target):
            self.host.moves.append((self.group, target))

    def wake_at(self) -> float:
        """When tick() (or its Forwarding's) next has something to do: the election's and the
        hand-off's timers, the running cut's hold, forwarded requests, and the next cut once it
        is due (a follower's election timer never fires while its leader is heard)."""
        wake = self.election.wake_at
        if self.handoff_until is not None:
            wake = min(wake, self.handoff_until)
        if self._may_start_cut():
            wake = min(wake, self.cuts.due_at(self.log.commit_trans_id))
        return min(wake, self.cuts.wake_at(), self.forwarding.wake_at())

    def on_message(self, msg: object, now: float) -> None:
        """An election or replication message from a peer (ClusterNode.on_peer checked its src)."""
        self._run(self.election.on_message(msg, now), now)
        if msg.vote_id == self.election.vote_id:  # type: ignore[attr-defined]
            if self.leader is not None:
                self._run(self.leader.on_message(msg, now), now)
            elif type(msg).SENDER == "leader" and self.election.leader_id == msg.src:  # type: ignore[attr-defined]
                self._run(self.follower.on_message(msg, now), now)
        self._handoff_progress(now)

    def replicate(self, now: float) -> None:
        """Send the records appended since (on a node alone: commit them)."""
        if self.leader is not None:
            self._run(self.leader.replicate(now), now)

    def take_batch(self, records: bytes, header: bytes, blob: bytes, partials: bytes, epoch: int,
                   index: int) -> bool:
        """ClusterNode.on_batch but the replication of its records; whether it appended any to
        the log."""
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
            self.host.gather(partials, self.group)
        return appended

    def undeliver(self, queue: str, given: list[list[int]]) -> bool:
        """Give back the messages of a consume reply that could not be delivered (see
        ClusterNode.on_undelivered): the leader's worker takes them, a follower passes them to
        the leader. False while they must be held (the workers fenced, or no leader known)."""
        if self.leader is not None and self.fence_epoch != self.epoch:
            self.out.workers.append((self.host.router.worker_for(queue), ipc_frames.undeliver_frames(queue, given, self.group)))
        elif self.leader is None and self.election.leader_id is not None:
            self.to_peers.append((self.election.leader_id, GiveBack.of(self.election.vote_id, self.node_id, queue, given)))
        else:
            return False
        return True

    # ----------------------------------------------------------------- election and replication
    def _run(self, actions: list, now: float) -> None:
        for a in actions:
            kind = type(a)
            if kind is Send:
                self.to_peers.append((a.to, a.msg))
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
                self.out.workers.extend(self.cuts.abort("a snapshot was installed"))
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
        if self.others:
            self._tell_others(now)

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
        self.recovery.note(self.log.commit_trans_id)
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
        split = self.recovery.ends_inside(entries[0].trans_id, entries[-1].trans_id)
        if split is not None:  # the recovered log ends inside: count there
            self._apply_to_workers(entries[:split], committed)
            entries = entries[split:]
        per_worker: dict[int, tuple[list[Record], list[int]]] = {}
        worker_for = self.host.router.worker_for
        for e in entries:
            record = e.record
            if type(record) is not Noop:
                records, trans_ids = per_worker.setdefault(worker_for(record.queue), ([], []))
                records.append(record)
                trans_ids.append(e.trans_id)
        out = self.out.workers if self._awaiting_load is None else self._awaiting_load
        for index, (records, trans_ids) in per_worker.items():
            out.append((index, ipc_frames.apply_frames(records, committed, self.group)))
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
                self.out.workers.append((index, ipc_frames.committed_frames(self.epoch, seq, self.group)))

    def _set_mode(self, accepting: bool, keep: list[int] | None = None) -> None:
        """Start a new mode of the workers: whether they accept queue requests; `keep`: each
        worker first undoes its records after that number (None: it keeps all)."""
        self.out.workers.extend(self.cuts.abort("the workers' mode changed"))
        self.epoch += 1
        self._committed_seqs = [0] * self.config.workers
        for index in range(self.config.workers):
            self.out.workers.append((index, ipc_frames.mode_frames(
                accepting, self.epoch, None if keep is None else keep[index], self.workers_trans_id, self.group)))
        if accepting and self.election.transfer_target is not None:
            self._fence_workers()  # a new mode during a hand-off is fenced too

    # ----------------------------------------------------------------- snapshots
    def on_synced(self, epoch: int, cut_id: int, index: int, now: float) -> None:
        """Worker `index` has handled all it was sent before cut `cut_id`'s SYNC."""
        self.out.workers.extend(self.cuts.on_synced(epoch, cut_id, index, now))

    def on_snapped(self, epoch: int, cut_id: int, index: int, now: float) -> None:
        """Worker `index` forked the writer of its part of cut `cut_id` in mode `epoch`; every batch
        it decided before is logged (the pipe is FIFO), and it holds the later ones (SnapshotCut)."""
        self.out.workers.extend(self.cuts.on_snapped(epoch, cut_id, index, self.log.last_trans_id,
                                                     self.log.term_at, now))
        self._snapshot_progress(now)

    def on_part_done(self, cut_id: int, index: int, ok: bool, part: dict | None, now: float) -> None:
        """Worker `index`'s writer of cut `cut_id` ended: its part is written (ok) or not."""
        self.out.workers.extend(self.cuts.on_part_done(cut_id, index, ok, part))
        self._snapshot_progress(now)

    def _snapshot_progress(self, now: float | None) -> None:
        """Move the running cut on (None: the time has not moved), or start one when due: on a
        node whose disk takes the log, not while a hand-off fences the workers, nor while another
        group's cut runs (a worker writes one part at a time)."""
        cuts = self.cuts
        commit = self.log.commit_trans_id
        if cuts.running:
            self.out.workers.extend(cuts.poll(now, commit, self.log.term_at))
        elif now is not None and cuts.due(commit, now) and self._may_start_cut():
            leading = self.leader is not None
            point = self.log.last_trans_id if leading else self.workers_trans_id
            self.out.workers.extend(cuts.start(self.epoch, now, min(commit, point), hold=leading, point=point,
                                               term_at=self.log.term_at))

    def _may_start_cut(self) -> bool:
        """Whether a due cut may start now: the disk takes the log, no hand-off fences the
        workers, and no other group's cut runs (a worker writes one part at a time)."""
        return self.storage_ok and self.fence_epoch != self.epoch and not self.host.cut_running()

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
        """The oldest prev_trans_id a batch can be read from this group's WAL with
        (Storage.wal_from; it moves on as segments are removed)."""
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
        """Whether a snapshot at trans_id streamed from the leader would move this group on."""
        return self.leader is None and trans_id > self.log.commit_trans_id

    def on_snapshot_installed(self, staged: SnapshotStaged, parts: list[str], now: float) -> bool:
        """The snapshot streamed from the leader is checked and installed on disk as `parts`: the
        workers (LOAD) and the log restart from it, and the leader hears so. False if this group
        no longer needs it."""
        if not self.needs_snapshot(staged.trans_id):
            return False
        self.out.workers.extend(self.cuts.abort("a snapshot was installed"))
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
        self.out.workers.extend(held)

    def _load_workers(self, trans_id: int, parts: list[str]) -> None:
        """Every worker replaces its queues of this group with those of the snapshot `parts` it
        owns (LOAD): their record counts start again."""
        for index in range(self.config.workers):
            self.out.workers.append((index, ipc_frames.load_frames(trans_id, parts, self.group)))
        self.seqs.reset()
        self._count_if_replayed()

    # ----------------------------------------------------------------- replies
    def _release(self, header: bytes, blob: bytes) -> None:
        """Send replies on: to the acceptor, or back to the follower that forwarded them."""
        self.host.carry(self.forwarding.release(header, blob, self.election.vote_id), self)

    def _refuse(self, header: bytes, blob: bytes, reason: str) -> None:
        """Answer every request of a batch with an error instead of its reply (ClusterNode.refuse)."""
        self.host.refuse(header, blob, reason, self)

    def _count_if_replayed(self) -> None:
        """Once the workers were sent all the log recovered from disk: ask them what they hold
        (a monitor gathered from every worker, behind what they were sent on the same pipe)."""
        if not self.recovery.ask(self.workers_trans_id):
            return
        items = self.host.router.plan(p.MONITOR, {"action": p.MONITOR}, recovery_origin(self.group), 0)
        assert not isinstance(items, str)
        for index, item in items:
            self.out.workers.append((index, ipc_frames.req_frames([item], self.epoch, self.group)))
