"""The coordinator's decisions, free of I/O: the election, the change log, replication to and from
peers, which replies may go out (a write is answered once committed), forwarding of client
requests between followers and the leader, and what the workers must replay. The coordinator
process (server/coordinator.py) feeds it messages and the time and moves its outputs as bytes.
"""
from __future__ import annotations

import random
from collections import OrderedDict, deque
from typing import Any

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
    InstallSnapshot,
    Recovered,
    SendSnapshot,
)
from queue_server.replication.progress import LeaderReplication
from queue_server.server import gather, ipc_frames, replies
from queue_server.server.origin import Origin
from queue_server.server.records import Noop, Record, decode_many
from queue_server.server import protocol as p
from queue_server.server.router import SCATTER_ACTIONS, Router
from queue_server.workers.queue import StateQueue
from queue_server.workers.service import PartitionService

NOOP = Noop()
_NEVER = float("inf")
LEADER, FOLLOWER, NONE = "leader", "follower", "none"
# A forwarded request not answered this long after its own wait is failed (the leader is gone).
FORWARD_GRACE = 10.0
# How many given-up forwards are remembered, so that a reply still on its way is given back.
ABANDONED_KEPT = 65536
LEADER_CHANGED = "leader changed: the request may or may not have been applied"
_NOT_APPLIED = p.LEADERSHIP_CHANGED.encode()
_DUMPS = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE


class ClusterNode:
    """One node's coordinator state. Inputs are methods; outputs accumulate in `to_peers`
    ((node_id, message)), `to_acceptor` (multipart frames), `to_workers` ((index, frames)) and
    `persist` ((vote_id, voted_for) to store before sending anything)."""

    def __init__(self, config: NodeConfig, now: float, *, recovered: Recovered | None = None,
                 rng: random.Random | None = None) -> None:
        """recovered: what the node's disk held (None: start empty, as an in-memory node does)."""
        self.config = config
        self.node_id = config.node_id
        self.members = [n.node_id for n in config.cluster_node_list] or [config.node_id]
        self.quorum_writes = config.replication == "quorum"
        rng = rng or random.Random()
        found = recovered or Recovered()
        self.log = ChangeLog(config.queue_log_size, found.trans_id, found.vote_id)
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
        self.router = Router(config.workers, virtual, config.dead_letter_suffix)
        # The committed state, replayed from the log: what a follower's snapshot is made of and
        # what the workers are reset to when this node stops leading.
        self.state = PartitionService(self.node_id, config.queue_size, dict((n, tuple(m)) for n, m in virtual),
                                      queue_class=StateQueue)
        self.state_trans_id = found.trans_id
        self.workers_trans_id = found.trans_id  # the workers reflect the log up to here
        # Replies wait until their records are on disk (process-crash safe) as well as committed.
        self.durable_trans_id = float("inf") if recovered is None else self.log.last_trans_id
        self.storage_ok = True
        self.truncated_to: int | None = None  # the log on disk must drop what follows this
        self.snapshot_now = False  # a snapshot must be written at once (the log was replaced)
        self.pending: deque[tuple[int, bytes, bytes]] = deque()  # (needs trans_id, header, blob)
        self.gatherer = gather.Gatherer()
        self.next_gather = 1  # odd: the acceptor numbers its gathers even
        # forward_id -> (conn, req_no, deadline, the request's echoed fields for an error reply)
        # forward_id -> (conn, req_no, deadline, the request's echoed fields for an error reply,
        # the request, came over UDP, how long it may take): what is needed to send it again
        self.forwards: dict[int, tuple[Origin, int, float, dict, bytes, bool, float]] = {}
        # Forwards sent to a leader that is no longer the leader: failed as "leader changed" if
        # that node does not answer within an election timeout.
        self.orphaned: set[int] = set()
        # Whether this leader has served requests other nodes forwarded (their replies go back
        # over the peer wire): until then a reply batch is passed on without being read.
        self.served_forwarded = False
        # Forward ids start at random, so that a leader's late reply to a request this node
        # forwarded before it restarted cannot be taken for the reply to a new one.
        self.next_forward = rng.getrandbits(40) << 20
        self.forwards_due = _NEVER  # no forward times out before this
        self.unsent: list[Forward] = []  # forwards the coordinator could not send yet
        # Forwards given up on (timed out, or failed by a change of leader), whose replies may
        # still come: a consume's messages are then given back.
        self.abandoned: OrderedDict[int, bool] = OrderedDict()
        self.resend_at = _NEVER
        self.clients: dict[int, tuple[str, int]] = {self.node_id: (config.host, config.port)}
        self.status: dict | None = None
        # Counts changes of the workers' mode (MODE messages). The acceptor stamps requests with
        # the epoch it last heard of, so a worker holds a request until it has the same mode.
        self.epoch = 0
        self.to_peers: list[tuple[int, object]] = []
        self.to_acceptor: list[list[bytes]] = []
        self.to_workers: list[tuple[int, list[bytes]]] = []
        self.persist: tuple[int, int | None] | None = None
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
        if found.state:
            self.state.load_snapshot(found.state)
            self._reset_workers()

    # ----------------------------------------------------------------- roles
    @property
    def role(self) -> str:
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
                "epoch": self.epoch}

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
            self.to_workers.append((index, ipc_frames.fence_frames(self.epoch, ipc_frames.FROM_COORDINATOR)))
            if not acceptor_routes:
                self.to_workers.append((index, ipc_frames.fence_frames(self.epoch, ipc_frames.FROM_ACCEPTOR)))

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
        """A hand-off that did not happen: the workers accept requests again, in a new mode. If
        all of them were fenced, their state is the log's; otherwise some may still be deciding
        under the old mode, so they start over from the log (their late batches are refused)."""
        if self.leader is None:
            return
        if self._workers_fenced():
            self._set_mode(True)
        else:
            self._reset_workers()

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
            self._serve_forwarded(msg, now)
        for queue, given in undelivered:
            self.on_undelivered(queue, given)

    def _announce(self) -> None:
        status = self.status_fields()
        if status != self.status:
            self.status = status
            self.to_acceptor.append(ipc_frames.status_frames(status))

    # ----------------------------------------------------------------- inputs
    def tick(self, now: float) -> None:
        """Advance time: elections, heartbeats, catch-up, forwarded requests that timed out."""
        self._run(self.election.tick(now), now)
        if self.leader is not None:
            self._run(self.leader.tick(now), now)
        self._handoff_progress(now)
        if self.unsent and now >= self.resend_at:
            self._resend_forwards(now)
        if self.forwards and now >= self.forwards_due:
            expired = [fid for fid, f in self.forwards.items() if f[2] <= now]
            orphaned = [fid for fid in expired if fid in self.orphaned]
            if orphaned:
                self._fail_forwards(orphaned, LEADER_CHANGED)
            if len(orphaned) < len(expired):
                self._fail_forwards(expired, "forwarded request timed out: the leader did not answer")
            self.forwards_due = min((f[2] for f in self.forwards.values()), default=_NEVER)
        self._release_held(now)
        self._announce()

    def wake_at(self) -> float:
        """When tick() next has something to do."""
        wake = self.election.wake_at
        if self.handoff_until is not None:
            wake = min(wake, self.handoff_until)
        if self.forwards:
            wake = min(wake, self.forwards_due)
        if self.unsent:
            wake = min(wake, self.resend_at)
        return wake

    def on_unsent(self, msg: object, now: float) -> None:
        """A message to a peer could not be sent (its link is not up yet, or is too far behind).
        The election and replication resend what matters; forwarded client requests are sent
        again every heartbeat until their leader answers or they time out."""
        if type(msg) is Forward:
            if not self.unsent:
                self.resend_at = now + self.config.heartbeat_ms / 1000
            self.unsent.append(msg)

    def _resend_forwards(self, now: float) -> None:
        leader = self.election.leader_id
        if leader is None:  # kept until a leader is known (or they time out)
            self.resend_at = now + self.config.heartbeat_ms / 1000
            return
        # by forward id: a request both unsent and then refused is in here twice, and must be
        # served once
        waiting = tuple({r[0]: r for msg in self.unsent for r in msg.requests if r[0] in self.forwards}.values())
        self.unsent.clear()
        if not waiting:
            return
        if leader != self.node_id:
            self.to_peers.append((leader, Forward(self.election.vote_id, self.node_id, waiting)))
            return
        for fid, raw, _ in waiting:  # this node leads now: serve them here
            where, req_no = self.forwards.pop(fid)[:2]
            self.orphaned.discard(fid)
            self._route(where, req_no, replies.decoded(raw))

    def on_peer(self, msg: object, client: tuple[str, int], now: float) -> None:
        """A message from another node."""
        src = getattr(msg, "src", None)
        if src not in self.election.peers:
            return
        if client[1]:
            self.clients[src] = client
        kind = type(msg)
        if kind is Forward:
            if self.handing_off(now):
                self.held_forwards.append(msg)
            else:
                self._serve_forwarded(msg, now)
        elif kind is ForwardReply:
            self._forward_replies(msg, now)
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
                 now: float) -> None:
        """A worker's batch: its change records, its replies, its parts of scattered requests,
        all decided under the workers' mode `epoch`.

        A reply leaves once everything the worker had applied when it made it is committed and on
        disk: its own records, and on a leader every record logged before it (a reply without
        records of its own, such as an idempotent produce's "duplicate", may rest on them)."""
        if epoch != self.epoch:
            # Decided under a mode that is over: since then this node stopped leading (and
            # maybe leads again), or its workers were reset. The reset that ended that mode
            # wiped those changes in the worker, so they must not enter the log, and no reply
            # may promise what they did.
            if header != ipc_frames.EMPTY_LIST:
                self._refuse(header, blob, p.LEADERSHIP_CHANGED
                             if self.leader is None else "not applied: the node changed mode; retry")
            header = ipc_frames.EMPTY_LIST
        elif records != ipc_frames.EMPTY_LIST:
            if self.leader is None or not self.storage_ok:
                self._refuse(header, blob, "storage unavailable" if self.leader else "not leader: retry")
                if self.leader is not None:
                    self._reset_workers()  # undo the changes in the workers too
                header = ipc_frames.EMPTY_LIST
            else:
                _, last = self.log.append(self.election.vote_id, decode_many(records))
                self.workers_trans_id = last
                self._run(self.leader.replicate(now), now)
        if header != ipc_frames.EMPTY_LIST:
            need = self.log.last_trans_id if self.leader is not None else 0
            if need > self._releasable():
                self.pending.append((need, header, blob))
            else:
                self._release(header, blob)
        if partials != ipc_frames.EMPTY_LIST:
            self._gather(orjson.loads(partials))

    def on_forward_requests(self, items: list, now: float) -> None:
        """Client requests this follower's acceptor could not serve ((origin, req_no, request),
        as ipc_frames.read_forward reads them): send them to the leader (held while this node hands over)."""
        if self.handing_off(now):
            self.held.extend(items)
            return
        leader = self.election.leader_id
        if self.leader is not None:
            for origin, req_no, request in items:
                self._route(origin, req_no, request)
            return
        if leader is None:
            self._reply_now([(origin, req_no, p.error_reply(request, "no leader", self.node_id))
                             for origin, req_no, request in items])
            return
        if not self.config.forward_request:  # held while this node handed over: to the new leader
            fields = {k: v for k, v in self.status_fields().items() if k.startswith("leader_")}
            self._reply_now([(origin, req_no, p.redirect_reply(request, self.node_id, fields))
                             for origin, req_no, request in items])
            return
        batch = []
        for origin, req_no, request in items:
            fid = self.next_forward
            self.next_forward += 1
            wait = request.get("wait") if type(request) is dict else None
            grace = FORWARD_GRACE + (min(wait, self.config.max_wait) if isinstance(wait, (int, float)) and wait > 0 else 0)
            where = origin
            raw = _DUMPS(request)
            self.forwards[fid] = (where, req_no, now + grace, p.echo(request), raw, where.udp, grace)
            self.forwards_due = min(self.forwards_due, now + grace)
            batch.append((fid, raw, where.udp))
        self.to_peers.append((leader, Forward(self.election.vote_id, self.node_id, tuple(batch))))

    def on_undelivered(self, queue: str, given: list[list[int]]) -> None:
        """The messages of a consume reply that could not be delivered ([msg_id, delivery_count]
        each; the client left, or the reply came too late): the leader's worker gives them back
        (leases released, at-most-once messages restored). A follower passes them to the leader.
        While the workers are fenced (a hand-off) they are held until it is over."""
        if self.leader is not None and self.fence_epoch == self.epoch:
            self.held_undelivered.append((queue, given))
        elif self.leader is not None:
            self.to_workers.append((self.router.worker_for(queue), ipc_frames.undeliver_frames(queue, given)))
        elif self.election.leader_id is not None:
            self.to_peers.append((self.election.leader_id, GiveBack(
                self.election.vote_id, self.node_id, queue, tuple(m[0] for m in given), tuple(m[1] for m in given))))

    # ----------------------------------------------------------------- election and replication
    def _run(self, actions: list, now: float) -> None:
        for a in actions:
            kind = type(a)
            if kind is Send:
                self.to_peers.append((a.to, a.msg))
            elif kind is Commit:
                self._commit(a)
            elif kind is PersistVote:
                self.persist = (a.vote_id, a.voted_for)
            elif kind is BecomeLeader:
                self._lead(a.vote_id, now)
            elif kind is BecomeFollower or kind is BecomeCandidate:
                self._stop_leading(now)
                if kind is BecomeFollower and a.leader_id is not None:
                    self._run(self.follower.pull(a.leader_id, a.vote_id, now), now)
            elif kind is SendSnapshot:
                self.to_peers.append((a.to, InstallSnapshot(
                    self.election.vote_id, self.node_id, self.state_trans_id,
                    self.log.term_at(self.state_trans_id) or 0, self.state.snapshot())))
            elif kind is ApplySnapshot:
                self.state.load_snapshot(a.data)
                self.state.replies.clear()
                self.state_trans_id = self.workers_trans_id = a.trans_id
                self._reset_workers()
                self.truncated_to = -1  # the log on disk restarts after the snapshot
                self.snapshot_now = True
            elif kind is TransferAborted:
                self._resume_leading()  # held requests are then served here (_release_held)
            elif kind is Discarded:
                # Never applied (followers apply committed entries only; a leader resets its
                # workers when it stops leading), but the disk must forget them too.
                if a.entries:
                    cut = a.entries[0].trans_id - 1
                    self.truncated_to = cut if self.truncated_to is None else min(self.truncated_to, cut)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _lead(self, vote_id: int, now: float) -> None:
        """This node won: bring the workers up to the whole log (entries of earlier terms will be
        committed with this term's first), then let them accept writes."""
        self.follower.reset()
        self._orphan_forwards(now)
        self.leader = LeaderReplication(
            self.node_id, self.members, self.log, vote_id, now,
            sync_rate=self.config.queue_sync_rate, max_batch=5000,
        )
        self._apply_to_workers(self.log.entries_after(self.workers_trans_id, 1 << 62) or [])
        self.log.append(vote_id, [NOOP])
        self.workers_trans_id = self.log.last_trans_id
        self._set_mode(True)
        self._run(self.leader.replicate(now), now)

    def _stop_leading(self, now: float) -> None:
        """Whatever the reason: stop accepting writes; the workers go back to the committed
        state; writes waiting for a commit are answered with an error."""
        self.follower.reset()
        self._orphan_forwards(now)
        if self.leader is None:
            return
        self.leader = None
        self._set_mode(False)
        while self.pending:
            _, header, blob = self.pending.popleft()
            self._refuse(header, blob, "not leader: leadership lost before the write was committed; it may or may not take effect")
        self._reset_workers()

    def _orphan_forwards(self, now: float) -> None:
        """The leader changed: requests forwarded to the old one wait an election timeout for its
        answer (a leader that handed over answers them, or refuses them as not applied: they are
        then sent to the new leader, or served here) before they fail as "leader changed"."""
        if not self.forwards:
            return
        due = now + self.config.election_timeout_ms / 1000
        for fid, f in self.forwards.items():
            if f[2] > due:
                self.forwards[fid] = (*f[:2], due, *f[3:])
            self.orphaned.add(fid)
        self.forwards_due = min(self.forwards_due, due)

    def _commit(self, c: Commit) -> None:
        """Entries are committed: replay them into the committed state (and on a follower into
        the workers); release the replies that waited for them."""
        apply = self.state.apply
        fresh = [e for e in c.entries if e.trans_id > self.state_trans_id]
        for e in fresh:
            apply(e.record)
        if fresh:
            self.state_trans_id = fresh[-1].trans_id
        if self.leader is None:
            self._apply_to_workers([e for e in fresh if e.trans_id > self.workers_trans_id])
        self._release_pending()

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

    def set_durable(self, trans_id: int) -> None:
        """The log is on disk up to trans_id: replies waiting only for that may go."""
        self.durable_trans_id = trans_id
        self.storage_ok = True
        self._release_pending()

    def _apply_to_workers(self, entries: list[Entry]) -> None:
        if not entries:
            return
        per_worker: dict[int, list[Record]] = {}
        worker_for = self.router.worker_for
        for e in entries:
            record = e.record
            if type(record) is not Noop:
                per_worker.setdefault(worker_for(record.queue), []).append(record)
        for index, records in per_worker.items():
            self.to_workers.append((index, ipc_frames.apply_frames(records)))
        self.workers_trans_id = max(self.workers_trans_id, entries[-1].trans_id)

    def _reset_workers(self) -> None:
        """Replace every worker's queues with the committed state and, on a leader, the log after
        it. A leader's workers then start a new mode (epoch), so that batches they made before
        the reset, on the state it wiped, are refused (on_batch)."""
        parts: list[dict] = [{} for _ in range(self.config.workers)]
        for name, snap in self.state.snapshot().items():
            parts[self.router.worker_for(name)][name] = snap
        for index, part in enumerate(parts):
            self.to_workers.append((index, ipc_frames.reset_frames(part)))
        self.workers_trans_id = self.state_trans_id
        if self.leader is not None:
            self._apply_to_workers(self.log.entries_after(self.state_trans_id, 1 << 62) or [])
            self._set_mode(True)

    def _set_mode(self, accepting: bool) -> None:
        """Start a new mode of the workers: whether they accept queue requests."""
        self.epoch += 1
        for index in range(self.config.workers):
            self.to_workers.append((index, ipc_frames.mode_frames(accepting, self.epoch)))
        if accepting and self.election.transfer_target is not None:
            self._fence_workers()  # reset during a hand-off: the new mode is fenced too

    # ----------------------------------------------------------------- replies
    def _release(self, header: bytes, blob: bytes) -> None:
        """Send replies on: to the acceptor, or back to the follower that forwarded them."""
        if not self.served_forwarded:
            self.to_acceptor.append(ipc_frames.rep_frames(header, blob))
            return
        local = []
        remote: dict[int, list[tuple[int, bytes]]] = {}
        for origin, req_no, data in replies.decode(header, blob):
            if origin.node:
                remote.setdefault(origin.node, []).append((origin.conn, data))
            else:
                local.append((origin, req_no, data))
        if local:
            self.to_acceptor.append(ipc_frames.rep_frames(*replies.encode_raw(local)))
        for node, items in remote.items():
            self.to_peers.append((node, ForwardReply(self.election.vote_id, self.node_id, tuple(items))))

    def _reply_now(self, items: list[tuple[Origin, int, dict]]) -> None:
        if items:
            self._release(*replies.encode(items))

    def _refuse(self, header: bytes, blob: bytes, reason: str) -> None:
        """Answer every request of a batch with an error instead of its reply."""
        self._reply_now([(origin, req_no, p.error_reply(replies.naming(replies.decoded(data)), reason, self.node_id))
                         for origin, req_no, data in replies.decode(header, blob)])

    def _gather(self, partials: list) -> None:
        finished = []
        for tag, part in partials:
            done = self.gatherer.add(tag, part)
            if done is not None:
                origin, req_no, request, parts = done
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
    def _route(self, origin: Origin, req_no: int, request: Any) -> None:
        """Serve a request on this (leading) node's workers."""
        action = p.request_action(request)
        if type(action) is str:
            self._reply_now([(origin, req_no, p.error_reply(request, action, self.node_id))])
            return
        if action == p.LEADER:
            reply = p.echo(request)
            reply.update(code=p.CODE_OK, node_id=self.node_id,
                         **{k: v for k, v in self.status_fields().items() if k.startswith("leader_")})
            self._reply_now([(origin, req_no, reply)])
            return
        gather_id = 0
        if action in SCATTER_ACTIONS:
            gather_id = self.next_gather
            self.next_gather += 2
        plan = self.router.plan(action, request, origin, req_no, gather_id)
        if type(plan) is str:
            self._reply_now([(origin, req_no, p.error_reply(request, plan, self.node_id))])
            return
        for index, item in plan:
            self.to_workers.append((index, ipc_frames.req_frames([item], self.epoch)))

    def _serve_forwarded(self, msg: Forward, now: float) -> None:
        """A follower's clients' requests: serve them here (each keeps its transport's rules), or
        say there is no leader here."""
        if self.leader is None:
            refused = tuple((fid, _DUMPS(p.error_reply(replies.decoded(raw), p.LEADERSHIP_CHANGED,
                                                       self.node_id), option=_NEWLINE))
                            for fid, raw, _ in msg.requests)
            self.to_peers.append((msg.src, ForwardReply(self.election.vote_id, self.node_id, refused)))
            return
        self.served_forwarded = True
        for fid, raw, udp in msg.requests:
            self._route(Origin(fid, udp, msg.src), 0, replies.decoded(raw))

    def _forward_replies(self, msg: ForwardReply, now: float) -> None:
        """The leader's replies to requests this node forwarded: to their clients. A consume reply
        whose request was already given up on (timed out, or failed by a change of leader) is
        given back, never dropped with its messages. A request the node refused because it no
        longer leads was not applied: it goes to the current leader."""
        rows = []
        for fid, reply in msg.replies:
            target = self.forwards.pop(fid, None)
            if target is None:
                if self.abandoned.pop(fid, False):  # not a second copy of a delivered reply
                    self._give_back(reply)
                continue
            if _NOT_APPLIED in reply and replies.decoded(reply).get("reason") == p.LEADERSHIP_CHANGED:
                self._send_again(fid, target, now)
                continue
            self.orphaned.discard(fid)
            rows.append((target[0], target[1], reply))
        if rows:
            self.to_acceptor.append(ipc_frames.rep_frames(*replies.encode_raw(rows)))

    def _send_again(self, fid: int, target: tuple, now: float) -> None:
        """Forward a request again (to whoever leads by the next heartbeat), with its full time."""
        self.orphaned.discard(fid)
        where, req_no, _, echo, raw, udp, grace = target
        self.forwards[fid] = (where, req_no, now + grace, echo, raw, udp, grace)
        self.on_unsent(Forward(self.election.vote_id, self.node_id, ((fid, raw, udp),)), now)

    def _give_back(self, reply: bytes) -> None:
        """If `reply` is a successful consume reply, give its messages back (on_undelivered)."""
        given = p.delivered(replies.decoded(reply))
        if given is not None:
            self.on_undelivered(*given)

    def _fail_forwards(self, fids: list[int], reason: str) -> None:
        failed = []
        for fid in fids:
            target = self.forwards.pop(fid, None)
            self.orphaned.discard(fid)
            if target is not None:
                failed.append((target[0], target[1], p.error_reply(target[3], reason, self.node_id)))
                self.abandoned[fid] = True
                if len(self.abandoned) > ABANDONED_KEPT:
                    self.abandoned.popitem(last=False)
        if failed:
            self.to_acceptor.append(ipc_frames.rep_frames(*replies.encode(failed)))
