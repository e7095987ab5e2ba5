"""The coordinator's decisions, free of I/O: the election, the change log, replication to and from
peers, which replies may go out (a write is answered once committed), forwarding of client
requests between followers and the leader, and what the workers must replay. The coordinator
process (server/coordinator.py) feeds it messages and the time and moves its outputs as bytes.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any

import orjson

from config.loader import NodeConfig
from election.messages import (
    BecomeCandidate,
    BecomeFollower,
    BecomeLeader,
    PersistVote,
    Send,
)
from election.state import Election
from replication.follower import Follower
from replication.log import ChangeLog, Entry
from replication.messages import (
    ApplySnapshot,
    Commit,
    Discarded,
    InstallSnapshot,
    SendSnapshot,
)
from replication.progress import LeaderReplication
from replication.storage import Recovered
from replication.wire import Forward, ForwardReply
from server import gather, ipc
from server import protocol as p
from server.router import SCATTER_ACTIONS, Router
from workers.queue import StateQueue
from workers.service import PartitionService

NOOP = {"op": "noop"}
LEADER, FOLLOWER, NONE = "leader", "follower", "none"
# A forwarded request not answered this long after its own wait is failed (the leader is gone).
FORWARD_GRACE = 10.0
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
        found = recovered or Recovered()
        self.log = ChangeLog(config.queue_log_size, found.trans_id, found.vote_id)
        if found.entries:
            self.log.accept(found.trans_id, found.vote_id, found.entries)
        vote = found.vote
        heartbeat = config.heartbeat_ms / 1000
        self.election = Election(
            self.node_id, self.members, self.log, rng or random.Random(), now,
            election_timeout=config.election_timeout_ms / 1000, heartbeat_interval=heartbeat,
            vote_id=vote[0], voted_for=vote[1],
        )
        self.follower = Follower(self.node_id, self.log, pull_interval=heartbeat)
        self.leader: LeaderReplication | None = None
        virtual = [(v.name, v.queue_list) for v in config.virtual_queue_list]
        self.router = Router(config.workers, virtual)
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
        self.forwards: dict[int, tuple[int, int, float]] = {}  # forward_id -> (conn, req_no, deadline)
        self.next_forward = 1
        self.clients: dict[int, tuple[str, int]] = {self.node_id: (config.host, config.port)}
        self.status: dict | None = None
        # Counts changes of the workers' mode (MODE messages). The acceptor stamps requests with
        # the epoch it last heard of, so a worker holds a request until it has the same mode.
        self.epoch = 0
        self.to_peers: list[tuple[int, object]] = []
        self.to_acceptor: list[list[bytes]] = []
        self.to_workers: list[tuple[int, list[bytes]]] = []
        self.persist: tuple[int, int | None] | None = None
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
        """The role and the leader's client address, as the acceptor needs them."""
        leader = self.election.leader_id
        host, port = self.clients.get(leader, ("", 0)) if leader is not None else ("", 0)
        return {"role": self.role, "leader_node_id": leader or 0, "leader_host": host, "leader_port": port,
                "epoch": self.epoch}

    def _announce(self) -> None:
        status = self.status_fields()
        if status != self.status:
            self.status = status
            self.to_acceptor.append([ipc.STATUS, _DUMPS(status)])

    # ----------------------------------------------------------------- inputs
    def tick(self, now: float) -> None:
        """Advance time: elections, heartbeats, catch-up, forwarded requests that timed out."""
        self._run(self.election.tick(now), now)
        if self.leader is not None:
            self._run(self.leader.tick(now), now)
        if self.forwards:
            expired = [fid for fid, (_, _, deadline) in self.forwards.items() if deadline <= now]
            if expired:
                self._fail_forwards(expired, "forwarded request timed out: the leader did not answer")
        self._announce()

    def wake_at(self) -> float:
        """When tick() next has something to do."""
        return self.election.wake_at

    def on_peer(self, msg: object, client: tuple[str, int], now: float) -> None:
        """A message from another node."""
        src = getattr(msg, "src", None)
        if src not in self.election.peers:
            return
        if client[1]:
            self.clients[src] = client
        kind = type(msg)
        if kind is Forward:
            self._serve_forwarded(msg, now)
        elif kind is ForwardReply:
            self._forward_replies(msg)
        else:
            self._run(self.election.on_message(msg, now), now)
            if msg.vote_id == self.election.vote_id:
                if self.leader is not None:
                    self._run(self.leader.on_message(msg, now), now)
                elif type(msg).SENDER == "leader" and self.election.leader_id == src:
                    self._run(self.follower.on_message(msg, now), now)
        self._announce()

    def on_batch(self, records: bytes, header: bytes, blob: bytes, partials: bytes, now: float) -> None:
        """A worker's batch: its change records, its replies, its parts of scattered requests."""
        if records != ipc.EMPTY_LIST:
            if self.leader is None or not self.storage_ok:
                # The worker changed its queues just before it learnt we stopped leading, or the
                # disk refuses writes: undo its changes and say why.
                if self.leader is not None:
                    self._refuse(header, blob, "storage unavailable")
                    self._reset_workers()
                else:
                    # The worker made these changes before it read the mode change that stopped
                    # it; the reset sent with that change follows them, and this one makes sure.
                    self._refuse(header, blob, "not leader: leadership changed; retry")
                    self._reset_workers()
                header = ipc.EMPTY_LIST
            else:
                _, last = self.log.append(self.election.vote_id, orjson.loads(records))
                self.workers_trans_id = last
                self._run(self.leader.replicate(now), now)
                if header != ipc.EMPTY_LIST:
                    if last > self._releasable():
                        self.pending.append((last, header, blob))
                    else:
                        self._release(header, blob)
                header = ipc.EMPTY_LIST
        if header != ipc.EMPTY_LIST:
            self._release(header, blob)
        if partials != ipc.EMPTY_LIST:
            self._gather(orjson.loads(partials))

    def on_forward_requests(self, items: list, now: float) -> None:
        """Client requests this follower's acceptor could not serve: send them to the leader."""
        leader = self.election.leader_id
        if self.leader is not None:
            for conn, req_no, request in items:
                self._route(conn, req_no, request)
            return
        if leader is None:
            self._reply_now([(conn, req_no, p.error_reply(request, "no leader", self.node_id))
                             for conn, req_no, request in items])
            return
        batch = []
        for conn, req_no, request in items:
            fid = self.next_forward
            self.next_forward += 1
            wait = request.get("wait") if type(request) is dict else None
            grace = FORWARD_GRACE + (min(wait, self.config.max_wait) if isinstance(wait, (int, float)) and wait > 0 else 0)
            self.forwards[fid] = (conn, req_no, now + grace)
            batch.append((fid, _DUMPS(request)))
        self.to_peers.append((leader, Forward(self.election.vote_id, self.node_id, tuple(batch))))

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
                self._stop_leading()
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
        self._fail_forwards(list(self.forwards), "leader changed: the request may or may not have been applied")
        self.epoch += 1
        self.leader = LeaderReplication(
            self.node_id, self.members, self.log, vote_id, now,
            sync_rate=self.config.queue_sync_rate, max_batch=5000,
        )
        self._apply_to_workers(self.log.entries_after(self.workers_trans_id, 1 << 62) or [])
        self.log.append(vote_id, [NOOP])
        self.workers_trans_id = self.log.last_trans_id
        for index in range(self.config.workers):
            self.to_workers.append((index, [ipc.MODE, _DUMPS([True, self.epoch])]))
        self._run(self.leader.replicate(now), now)

    def _stop_leading(self) -> None:
        """Whatever the reason: stop accepting writes; the workers go back to the committed
        state; writes waiting for a commit are answered with an error."""
        self.follower.reset()
        if self.forwards:
            self._fail_forwards(list(self.forwards), "leader changed: the request may or may not have been applied")
        if self.leader is None:
            return
        self.leader = None
        self.epoch += 1
        for index in range(self.config.workers):
            self.to_workers.append((index, [ipc.MODE, _DUMPS([False, self.epoch])]))
        while self.pending:
            _, header, blob = self.pending.popleft()
            self._refuse(header, blob, "not leader: leadership lost before the write was committed; it may or may not take effect")
        self._reset_workers()

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
        per_worker: dict[int, list[dict]] = {}
        worker_for = self.router.worker_for
        for e in entries:
            record = e.record
            if record["op"] != "noop":
                per_worker.setdefault(worker_for(record["queue"]), []).append(record)
        for index, records in per_worker.items():
            self.to_workers.append((index, [ipc.APPLY, _DUMPS(records)]))
        self.workers_trans_id = max(self.workers_trans_id, entries[-1].trans_id)

    def _reset_workers(self) -> None:
        """Replace every worker's queues with the committed state."""
        parts: list[dict] = [{} for _ in range(self.config.workers)]
        for name, snap in self.state.snapshot().items():
            parts[self.router.worker_for(name)][name] = snap
        for index, part in enumerate(parts):
            self.to_workers.append((index, [ipc.RESET, _DUMPS(part)]))
        self.workers_trans_id = self.state_trans_id

    # ----------------------------------------------------------------- replies
    def _release(self, header: bytes, blob: bytes) -> None:
        """Send replies on: to the acceptor, or back to the follower that forwarded them."""
        if b"-" not in header:  # connection ids are negative only for forwarded requests
            self.to_acceptor.append([ipc.REP, header, blob])
            return
        local = []
        remote: dict[int, list[tuple[int, bytes]]] = {}
        start = 0
        chunks = []
        for conn, req_no, end in orjson.loads(header):
            if conn < 0:
                remote.setdefault(-conn, []).append((req_no, blob[start:end]))
            else:
                chunks.append(blob[start:end])
                local.append((conn, req_no, sum(len(c) for c in chunks)))
            start = end
        if local:
            self.to_acceptor.append([ipc.REP, _DUMPS(local), b"".join(chunks)])
        for node, replies in remote.items():
            self.to_peers.append((node, ForwardReply(self.election.vote_id, self.node_id, tuple(replies))))

    def _reply_now(self, replies: list[tuple[int, int, dict]]) -> None:
        if replies:
            self._release(*ipc.encode_replies(replies))

    def _refuse(self, header: bytes, blob: bytes, reason: str) -> None:
        """Answer every request of a batch with an error instead of its reply."""
        out = []
        start = 0
        for conn, req_no, end in orjson.loads(header):
            try:
                original = orjson.loads(blob[start:end])
            except orjson.JSONDecodeError:
                original = {}
            start = end
            out.append((conn, req_no, p.error_reply({k: original[k] for k in ("action", "queue", "seq") if k in original},
                                                     reason, self.node_id)))
        self._reply_now(out)

    def _gather(self, partials: list) -> None:
        finished = []
        for tag, part in partials:
            done = self.gatherer.add(tag, part)
            if done is not None:
                conn, req_no, request, parts = done
                finished.append((conn, req_no, gather.merge(request, parts, self.node_fields())))
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
        }

    # ----------------------------------------------------------------- forwarding
    def _route(self, conn: int, req_no: int, request: Any) -> None:
        """Serve a request on this (leading) node's workers."""
        action = p.request_action(request)
        if type(action) is str:
            self._reply_now([(conn, req_no, p.error_reply(request, action, self.node_id))])
            return
        if action == p.LEADER:
            reply = p.echo(request)
            reply.update(code=p.CODE_OK, node_id=self.node_id,
                         **{k: v for k, v in self.status_fields().items() if k.startswith("leader_")})
            self._reply_now([(conn, req_no, reply)])
            return
        gather_id = 0
        if action in SCATTER_ACTIONS:
            gather_id = self.next_gather
            self.next_gather += 2
        plan = self.router.plan(action, request, conn, req_no, gather_id)
        if type(plan) is str:
            self._reply_now([(conn, req_no, p.error_reply(request, plan, self.node_id))])
            return
        for index, item in plan:
            self.to_workers.append((index, [ipc.REQ, _DUMPS([item]), b"%d" % self.epoch]))

    def _serve_forwarded(self, msg: Forward, now: float) -> None:
        """A follower's clients' requests: serve them here, or say there is no leader here."""
        if self.leader is None:
            replies = tuple((fid, _DUMPS(p.error_reply(None, "not leader: leadership changed; retry", self.node_id),
                                         option=_NEWLINE)) for fid, _ in msg.requests)
            self.to_peers.append((msg.src, ForwardReply(self.election.vote_id, self.node_id, replies)))
            return
        for fid, raw in msg.requests:
            try:
                request = orjson.loads(raw)
            except orjson.JSONDecodeError:
                request = None
            self._route(-msg.src, fid, request)

    def _forward_replies(self, msg: ForwardReply) -> None:
        header = []
        chunks = []
        end = 0
        for fid, reply in msg.replies:
            target = self.forwards.pop(fid, None)
            if target is None:
                continue  # already failed by a timeout or a leader change
            end += len(reply)
            chunks.append(reply)
            header.append((target[0], target[1], end))
        if header:
            self.to_acceptor.append([ipc.REP, _DUMPS(header), b"".join(chunks)])

    def _fail_forwards(self, fids: list[int], reason: str) -> None:
        replies = []
        for fid in fids:
            target = self.forwards.pop(fid, None)
            if target is not None:
                replies.append((target[0], target[1], p.error_reply(None, reason, self.node_id)))
        if replies:
            header, blob = ipc.encode_replies(replies)
            self.to_acceptor.append([ipc.REP, header, blob])
