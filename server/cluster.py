"""The coordinator's decisions, free of I/O. Each queue group the node is a replica of is a
GroupNode (server/group_node.py: its election, change log, replication, the workers' mode and the
replies waiting for its commit); ClusterNode is the node around them: it routes events to their
group, forwards client requests (server/forwarding.py), merges scattered requests
(server/gather.py), tells the acceptor the node's status, and gathers what every part decided
into one Ready (server/ready.py). The coordinator process (server/coordinator.py) feeds it events
and the time, takes the Ready, persists and sends it, and calls advance.
"""
from __future__ import annotations

import random
from collections import Counter

import orjson

from queue_server.config.loader import NodeConfig
from queue_server.election.messages import Heartbeat, Send
from queue_server.election.state import Election
from queue_server.protocol import ipc_frames, replies
from queue_server.protocol import vocabulary as p
from queue_server.protocol.roles import Role
from queue_server.replication.follower import Follower
from queue_server.replication.log import ChangeLog
from queue_server.replication.messages import (
    Forward,
    ForwardReply,
    GiveBack,
    ReadLog,
    Recovered,
    SnapshotStaged,
)
from queue_server.replication.progress import LeaderReplication
from queue_server.replication.transfer import SnapshotSource
from queue_server.server import gather, node_status
from queue_server.server.forwarding import Deliver, Forwarding, Undeliver, Work
from queue_server.server.group_node import GroupNode
from queue_server.server.ready import Outbox, Ready
from queue_server.server.recovery_count import RECOVERY_ORIGIN
from queue_server.server.remote_group import RemoteGroup
from queue_server.server.reply_counts import count_refused
from queue_server.server.router import Router
from queue_server.server.snapshots import SnapshotCut
from queue_server.server.worker_seqs import WorkerSeqs

# How many undeliverable consume replies a node holds, to give their messages back once a leader
# is known (or its hand-off is over).
HELD_GIVE_BACKS = 10_000
_NEVER = float("inf")


class ClusterNode:
    """One node's coordinator state. Events are methods (tick, on_peer, on_batch, on_batches,
    on_forward_requests, on_undelivered, on_fenced, on_unsent, begin_handoff); what they decide is
    taken as one Ready (ready(), has_ready()), and advance() is told once it is persisted and sent.

    The node's single-group fields (log, election, leader, epoch, cuts, ...) are those of its
    first group (`first`): the lowest it is a replica of, group 0 unless it is none of group 0's
    replicas. A group it is no replica of is a RemoteGroup (server/remote_group.py): its requests
    are passed to that group's leader."""

    def __init__(self, config: NodeConfig, now: float, *, recovered: Recovered | None = None,
                 rng: random.Random | None = None, snapshot_dir: str | None = None,
                 disks: dict[int, tuple[Recovered | None, str | None]] | None = None) -> None:
        """recovered: what the node's disk held of its first queue group (group 0, unless the
        node is no replica of it; None: start empty, as an in-memory node does); snapshot_dir:
        where the workers write that group's snapshot parts (None: no snapshots; on an in-memory
        node only those a follower needs); disks: the same (recovered, snapshot_dir) of each other
        group the node is a replica of (missing: none)."""
        self.config = config
        self.node_id = config.node_id
        self.members = [n.node_id for n in config.cluster_node_list] or [config.node_id]
        self.peers = frozenset(self.members) - {self.node_id}
        self.placement = config.placement()
        rng = rng or random.Random()
        heartbeat = config.heartbeat_ms / 1000
        virtual = [(v.name, v.queue_list) for v in config.virtual_queue_list]
        self.router = Router(config.workers, virtual, config.dead_letter_suffix, first_gather=1,
                             groups=config.queue_groups)
        # What is decided and not yet taken by advance(): the messages here, each group's own
        # parts (its log, vote, snapshot files) in its GroupNode. See Ready (server/ready.py).
        self.out = Outbox()
        self.status: dict | None = None  # what the acceptor was last told (_announce)
        # The workers' replies a group's _refuse replaced, by REFUSALS label, until take_refused().
        self.refused: dict[str, int] = {}
        own = self.placement.groups_of(self.node_id)
        self.first_group = own[0]  # whose parts of a Ready are its own fields (config refuses a node of none)
        disks = {**(disks or {}), self.first_group: (recovered, snapshot_dir)}
        self.groups: dict[int, GroupNode] = {
            g: GroupNode(self, g, config, now, recovered=disks.get(g, (None, None))[0], rng=rng,
                         snapshot_dir=disks.get(g, (None, None))[1])
            for g in own}
        self.first = self.groups[self.first_group]
        self.others = [g for n, g in sorted(self.groups.items()) if n != self.first_group]  # every other group
        # The groups it is no replica of (made last: the groups' elections drew from rng first).
        self.remote: dict[int, RemoteGroup] = {
            g: RemoteGroup(g, self.placement.replicas(g), self.new_forwarding(rng), config.election_timeout_ms / 1000)
            for g in range(self.placement.queue_groups) if g not in self.groups}
        # A node of several queue groups (its log lines and metrics name the group).
        self.grouped = self.placement.queue_groups > 1
        self.gatherer = gather.Gatherer()
        self.clients: dict[int, tuple[str, int]] = {self.node_id: (config.host, config.port)}
        # Each member's http_port as this node knows it (0: no HTTP API known): its own, the
        # cluster_node_list's, then what each peer says of itself (on_peer); the acceptor's HTTP
        # API names the leader's in a 409 (status_fields). Replaced, not changed in place, so that
        # _announce sees a change.
        self.http_ports: dict[int, int] = {n.node_id: n.http_port for n in config.cluster_node_list}
        self.http_ports[self.node_id] = config.http_port
        self.held: list = []  # client requests of this node's acceptor, as on_forward_requests takes them
        self.held_forwards: list[tuple[Forward, int]] = []  # other replicas' requests, and their group
        self.held_undelivered: list[tuple[str, list[list[int]]]] = []  # messages to give back
        self.moves: list[tuple[int, int]] = []  # (group, node): leadership handed to a preferred leader, to log

    def new_forwarding(self, rng: random.Random) -> Forwarding:
        """A group's Forwarding (server/forwarding.py), for a GroupNode or a RemoteGroup."""
        config = self.config
        return Forwarding(self.node_id, (config.host, config.port), self.router, rng, heartbeat=config.heartbeat_ms / 1000,
                          election_timeout=config.election_timeout_ms / 1000, max_wait=config.max_wait)

    # ----------------------------------------------------------------- group 0's fields
    # (the node's own while it has one group; what tests and the coordinator read of it)
    @property
    def log(self) -> ChangeLog:
        return self.first.log

    @property
    def election(self) -> Election:
        return self.first.election

    @property
    def leader(self) -> LeaderReplication | None:
        return self.first.leader

    @property
    def follower(self) -> Follower:
        return self.first.follower

    @property
    def epoch(self) -> int:
        return self.first.epoch

    @property
    def cuts(self) -> SnapshotCut:
        return self.first.cuts

    @property
    def seqs(self) -> WorkerSeqs:
        return self.first.seqs

    @property
    def workers_trans_id(self) -> int:
        return self.first.workers_trans_id

    @property
    def storage_ok(self) -> bool:
        return self.first.storage_ok

    @property
    def role(self) -> Role:
        return self.first.role

    @property
    def forwarding(self) -> Forwarding:
        return self.first.forwarding

    # ----------------------------------------------------------------- status
    def status_fields(self) -> dict:
        """What the acceptor is told of this node (node_status.status_fields)."""
        return node_status.status_fields(self)

    def node_fields(self) -> dict:
        """This node's own fields in a monitor reply (node_status.node_fields)."""
        return node_status.node_fields(self)

    def announced(self, group: int) -> dict:
        """What the acceptor was last told of `group` (its role and epoch; {} before the first status)."""
        status = self.status or {}
        rows = status.get("groups")
        if rows is None:
            return status
        return next((row for row in rows if row["group"] == group), {})

    def _announce(self) -> None:
        status = self.status_fields()
        if status != self.status:
            self.status = status
            self.out.acceptor.append(ipc_frames.status_frames(status))

    # ----------------------------------------------------------------- hand-off
    def begin_handoff(self, now: float, timeout: float) -> bool:
        """Before this node stops: hand the leadership of every group it leads to an up-to-date
        follower (Raft's leadership transfer, GroupNode.begin_handoff). New client requests are
        held from now on and go to the new leader once it is known (or are served here if the
        transfer fails). False if there is nothing to hand over (leading no group, or no live
        follower)."""
        started = [g.begin_handoff(now, timeout) for g in self.groups.values()]
        if not any(started):
            return False
        self._announce()  # the acceptor hears it no longer leads: it fences its own requests
        return True

    def handing_off(self, now: float) -> bool:
        """Whether a hand-off is still under way: requests are being held."""
        return any(g.handing_off(now) for g in self.groups.values())

    def cut_running(self) -> bool:
        """Whether a snapshot cut of any group runs (the node runs one at a time)."""
        return any(g.cuts.running for g in self.groups.values())

    def cut_writing(self) -> bool:
        """Whether a cut whose T is set is being written (see Coordinator._finishing_cut)."""
        return any(g.cuts.writing for g in self.groups.values())

    def on_fenced(self, epoch: int, index: int, now: float, group: int = 0) -> None:
        """Worker `index` has sent every batch of `group`'s mode `epoch` and decides nothing more in it."""
        self.groups[group].on_fenced(epoch, index, now)

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
        for msg, group in forwards:
            self._serve_forwarded(msg, group)
        for queue, given in undelivered:
            self.on_undelivered(queue, given)

    # ----------------------------------------------------------------- Ready / advance
    def has_ready(self) -> bool:
        """Whether ready() has anything to persist or send."""
        return bool(self.out.acceptor) or self._more_than_replies()

    def _more_than_replies(self) -> bool:
        """Whether anything but messages to the acceptor waits for a Ready."""
        out = self.out
        return (bool(out.workers or out.peers) or any(g.has_ready() for g in self.groups.values())
                or any(r.to_peers for r in self.remote.values()))

    def take_replies(self) -> list[list[bytes]]:
        """After advance(): when all that waits is messages to the acceptor (the replies the
        write just released), take them; they may be sent at once, with nothing to persist
        first (has_ready() is False once they are taken). Otherwise nothing: a Ready carries them
        with the rest."""
        out = self.out
        if not out.acceptor or self._more_than_replies():
            return []
        taken, out.acceptor = out.acceptor, []
        return taken

    def ready(self) -> Ready:
        """Everything decided since the last advance(): persist it (log, then vote), send it, then
        call advance(). Taking it changes nothing; an empty Ready when has_ready() is False."""
        out = self.out
        ready = self.first.ready(tuple(out.workers), tuple(out.acceptor), tuple(out.peers))
        if self.others or self.remote:
            ready = ready._replace(parts=tuple(g.part() for g in self.others if g.has_ready()),
                                   remote=tuple((g, to, msg) for g, r in self.remote.items() for to, msg in r.to_peers))
        return ready

    def advance(self, ready: Ready, *, durable_trans_id: int | None = None, log_stored: bool = True,
                parts: dict[int, tuple[int | None, bool]] | None = None) -> None:
        """`ready` is carried out: its messages are sent, its vote stored (or given up on: the
        coordinator then sent no peer message). log_stored: whether its log reached the disk (if
        not, writes are refused until it does, and the next Ready asks again); durable_trans_id:
        how far the log is now safe (None: as before, e.g. a node without a disk). Both are
        group 0's; parts: each other group's (durable_trans_id, log_stored), for ready.parts
        (missing: None, True). Replies that waited for the disk are released into the next Ready."""
        out = self.out
        del out.workers[:len(ready.to_workers)]
        del out.acceptor[:len(ready.to_acceptor)]
        del out.peers[:len(ready.to_peers)]
        self.first.advance(ready, durable_trans_id, log_stored)
        if ready.remote:
            for g, n in Counter(g for g, _, _ in ready.remote).items():
                del self.remote[g].to_peers[:n]
        for part in ready.parts:
            durable, stored = (parts or {}).get(part.group, (None, True))
            self.groups[part.group].advance(part, durable, stored)

    # ----------------------------------------------------------------- inputs
    def tick(self, now: float) -> None:
        """Advance time: elections, heartbeats, catch-up, forwarded requests that timed out."""
        for group in self.groups.values():
            group.tick(now)
        for group in self.groups.values():
            election = group.election
            self.carry(group.forwarding.tick(now, election.leader_id, election.vote_id), group)
        for remote in self.remote.values():
            self.carry(remote.tick(now), remote)
        self._release_held(now)
        self._announce()

    def wake_at(self) -> float:
        """When tick() next has something to do."""
        return min(min(g.wake_at() for g in self.groups.values()),
                   min((r.wake_at() for r in self.remote.values()), default=_NEVER))

    def on_unsent(self, msg: object, now: float, group: int = 0, to: int | None = None) -> None:
        """A message of `group` to peer `to` could not be sent (its link is not up yet, or is too
        far behind). The election and replication resend what matters; forwarded client requests
        are sent again every heartbeat until their leader answers or they time out, and replies
        to a follower's for a while (Forwarding.on_unsent); the messages of a consume reply that
        cannot go back to its follower are then given back."""
        part = self.groups.get(group) or self.remote[group]
        self.carry(part.forwarding.on_unsent(msg, now, to), part)

    def on_peer(self, msg: object, client: tuple[str, int], now: float, http_port: int = 0, group: int = 0) -> None:
        """A message from another node about queue `group`, with the client address (host, port)
        and the http_port it gives for itself (0: none said; what this node knew stays)."""
        src = getattr(msg, "src", None)
        if src not in self.peers:
            return
        if client[1]:
            self.clients[src] = client
        if http_port and self.http_ports.get(src) != http_port:
            self.http_ports = {**self.http_ports, src: http_port}
        kind = type(msg)
        part = self.groups.get(group)  # None: a group this node is no replica of
        if part is None:
            remote = self.remote.get(group)
            if remote is None:
                pass
            elif kind is Heartbeat:  # its leader says so
                remote.on_heartbeat(msg, now)
            elif kind is ForwardReply:
                self.carry(remote.forwarding.on_replies(msg, now, remote.vote_id), remote)
        elif kind is GiveBack:
            if part.leader is not None:  # else the messages stay taken: never handed out twice
                self.on_undelivered(msg.queue, [list(m) for m in zip(msg.msg_ids, msg.delivery_counts)])
        elif kind is Forward:
            if self.handing_off(now):
                self.held_forwards.append((msg, group))
            else:
                self._serve_forwarded(msg, group)
        elif kind is ForwardReply:
            self.carry(part.forwarding.on_replies(msg, now, part.election.vote_id), part)
        else:
            part.on_message(msg, now)
        self._release_held(now)
        self._announce()

    def on_batch(self, records: bytes, header: bytes, blob: bytes, partials: bytes, epoch: int,
                 now: float, index: int = 0, group: int = 0) -> None:
        """Worker `index`'s batch of `group`: its change records, its replies, its parts of
        scattered requests, all decided under that group's workers' mode `epoch`.

        A reply leaves once everything the worker had applied when it made it is committed and on
        disk: its own records, and on a leader every record logged before it (a reply without
        records of its own, such as an idempotent produce's "duplicate", may rest on them)."""
        self.on_batches([(records, header, blob, partials, epoch, index, group)], now)

    def on_batches(self, batches: list[tuple], now: float) -> None:
        """Several workers' batches received together, (records, header, blob, partials, epoch,
        index[, group]) each, in the order they came: as on_batch one after another, with each
        group's new records replicated (and on a node alone, committed) once for all of them."""
        appended: set[int] = set()
        for records, header, blob, partials, epoch, index, *rest in batches:
            g = rest[0] if rest else 0
            if self.groups[g].take_batch(records, header, blob, partials, epoch, index):
                appended.add(g)
        for g in appended:
            self.groups[g].replicate(now)

    def on_forward_requests(self, items: list, now: float) -> None:
        """Client requests this follower's acceptor could not serve ((origin, req_no, request),
        as ipc_frames.read_forward reads them): send them to the leader (held while this node hands over)."""
        if self.handing_off(now):
            self.held.extend(items)
            return
        by_group = {self.first_group: items}
        if self.grouped:  # each to the leader of its queue's group
            by_group = {}
            group_of = self.placement.group_of
            for item in items:
                if len(item) > 3:  # another group's part of a scattered request (Dispatch.route)
                    self._gather_remote(item, now)
                    continue
                request = item[2]
                queue = request.get("queue") if type(request) is dict else None
                by_group.setdefault(group_of(queue) if type(queue) is str else self.first_group, []).append(item)
        for g, some in by_group.items():
            self._pass_on(g, some, now)

    def _pass_on(self, g: int, items: list, now: float, client: bool = True) -> None:
        """Requests of group g: served here when this node leads g, else sent to g's leader (a
        client's is redirected there instead when forward_request is off)."""
        group = self.groups.get(g)
        if group is not None:
            leading, leader, vote_id = group.leader is not None, group.election.leader_id, group.election.vote_id
        else:  # a group this node is no replica of
            group = self.remote[g]
            leading, leader, vote_id = False, group.leader_id, group.vote_id
        redirect = None if self.config.forward_request or not client else node_status.leader_fields(self, group)
        self.carry(group.forwarding.on_requests(items, now, leading=leading, leader=leader, vote_id=vote_id,
                                                redirect=redirect), group)

    def _gather_remote(self, item: tuple, now: float) -> None:
        """A monitor or list of every queue needs group g's part from g's leader: this node's
        own workers when it leads g after all (the acceptor saw it follow), else the leader's,
        which answers for g alone as for any forwarded scattered request. The reply comes back
        as a part (Gatherer.answered)."""
        origin, req_no, request, tag, g = item
        self._pass_on(g, [(self.gatherer.ask(tag), req_no, request)], now, client=False)

    def on_undelivered(self, queue: str, given: list[list[int]]) -> None:
        """The messages of a consume reply that could not be delivered ([msg_id, delivery_count]
        each; the client left, or the reply came too late): the leader's worker gives them back
        (leases released, at-most-once messages restored). A follower passes them to the leader.
        While the workers are fenced (a hand-off), or no leader is known, they are held until
        that is over (at most HELD_GIVE_BACKS: past that they stay taken, never handed out twice)."""
        g = self.placement.group_of(queue)
        group = self.groups.get(g)
        if group is not None and group.undeliver(queue, given):
            return
        remote = self.remote.get(g)
        if remote is not None and remote.leader_id is not None:
            remote.to_peers.append((remote.leader_id, GiveBack.of(remote.vote_id, self.node_id, queue, given)))
            return
        if len(self.held_undelivered) < HELD_GIVE_BACKS:
            self.held_undelivered.append((queue, given))

    # ----------------------------------------------------------------- snapshots (of a group)
    def on_synced(self, epoch: int, cut_id: int, index: int, now: float, group: int = 0) -> None:
        """Worker `index` has handled all it was sent before cut `cut_id`'s SYNC."""
        self.groups[group].on_synced(epoch, cut_id, index, now)

    def on_snapped(self, epoch: int, cut_id: int, index: int, now: float, group: int = 0) -> None:
        """Worker `index` forked the writer of its part of cut `cut_id` (GroupNode.on_snapped)."""
        self.groups[group].on_snapped(epoch, cut_id, index, now)

    def on_part_done(self, cut_id: int, index: int, ok: bool, part: dict | None, now: float,
                     group: int = 0) -> None:
        """Worker `index`'s writer of cut `cut_id` ended: its part is written (ok) or not."""
        self.groups[group].on_part_done(cut_id, index, ok, part, now)

    def on_snapshot_source(self, source: SnapshotSource, now: float, group: int = 0) -> None:
        """A snapshot of `group` is on this node's disk: the one to stream to a follower."""
        self.groups[group].on_snapshot_source(source, now)

    def set_wal_from(self, wal_from: int | None, group: int = 0) -> None:
        """The oldest prev_trans_id a batch can be read from `group`'s WAL with (Storage.wal_from)."""
        self.groups[group].set_wal_from(wal_from)

    def on_snapshot_unreadable(self, trans_id: int, now: float, group: int = 0) -> None:
        """The files of `group`'s snapshot at trans_id cannot be read (GroupNode.on_snapshot_unreadable)."""
        self.groups[group].on_snapshot_unreadable(trans_id, now)

    def streaming(self, group: int = 0) -> list[SnapshotSource]:
        """The snapshots of `group` being streamed to followers (their files must stay readable)."""
        return self.groups[group].streaming()

    def take_log_reads(self, group: int = 0) -> list[ReadLog]:
        """`group`'s WAL reads to carry out (each answered by on_log_read or on_log_unreadable)."""
        return self.groups[group].take_log_reads()

    def on_log_read(self, read: ReadLog, frames: list[tuple[int, int, bytes]], now: float, group: int = 0) -> None:
        """What `group`'s WAL holds for `read` (GroupNode.on_log_read)."""
        self.groups[group].on_log_read(read, frames, now)

    def on_log_unreadable(self, read: ReadLog, now: float, group: int = 0) -> None:
        """`group`'s WAL could not be read for `read`: the follower gets a snapshot instead."""
        self.groups[group].on_log_unreadable(read, now)

    def needs_snapshot(self, trans_id: int, group: int = 0) -> bool:
        """Whether a snapshot of `group` at trans_id streamed from its leader would move it on."""
        return self.groups[group].needs_snapshot(trans_id)

    def on_snapshot_installed(self, staged: SnapshotStaged, parts: list[str], now: float, group: int = 0) -> bool:
        """The snapshot streamed from `group`'s leader is installed as `parts` (GroupNode.on_snapshot_installed)."""
        return self.groups[group].on_snapshot_installed(staged, parts, now)

    def on_whole_snapshot(self, trans_id: int, parts: list[str] | None, group: int = 0) -> None:
        """The whole snapshot an old leader of `group` sent is written as `parts` (GroupNode.on_whole_snapshot)."""
        self.groups[group].on_whole_snapshot(trans_id, parts)

    # ----------------------------------------------------------------- replies
    def take_replayed(self, group: int = 0) -> tuple[int, int, int] | None:
        """Once the workers hold all a recovered node found on `group`'s disk: (queues,
        messages, trans_id) for its recovery line; None before, after it was taken once, and on
        a node without a disk."""
        part = self.groups[group]
        return part.recovery.take(part.log.commit_trans_id)

    def take_moves(self) -> list[tuple[int, int]]:
        """The groups whose leadership this node began to hand to their preferred leader since
        the last call, (group, node) each (election/balance.py)."""
        taken, self.moves = self.moves, []
        return taken

    def take_refused(self) -> dict[str, int]:
        """The workers' replies refused since the last call, by REFUSALS label: for
        queue_server_writes_refused_total."""
        taken, self.refused = self.refused, {}
        return taken

    def gather(self, partials: bytes, group: int = 0) -> None:
        """The workers' parts of scattered requests (a batch's json list, of `group`'s batch): the
        finished ones are answered, through that group's Forwarding (a request another node
        forwarded to this leader of the group goes back to it in that group)."""
        add = self.gatherer.add
        self._finish([done for tag, piece in orjson.loads(partials) if (done := add(tag, piece)) is not None],
                     self.groups[group])

    def _finish(self, gathered: list, via: GroupNode) -> None:
        """Answer the scattered requests whose every part is in (Gatherer.add's), through `via`'s
        Forwarding; a group's recovery count goes to that group instead."""
        finished = []
        gathered = list(gathered)  # grows by the requests a part finishes (below)
        for origin, req_no, request, parts in gathered:
            if origin.node == RECOVERY_ORIGIN.node:  # a group's recovery count: its number is the conn
                merged = gather.merge(request, parts, {})
                counted = self.groups[origin.conn]
                counted.recovery.counted(merged.get("queue_count", 0), merged.get("size", 0),
                                         counted.log.commit_trans_id)
                continue
            if origin.node == gather.GATHER_NODE:  # a group's part of this node's own scattered request
                outer = self.gatherer.answered(origin, gather.merge(request, parts, {}))
                if outer is not None:
                    gathered.append(outer)
                continue
            fields = self.node_fields()
            queue = request.get("queue")
            if self.grouped and type(queue) is str:  # a queue's monitor says its group
                fields["group"] = self.placement.group_of(queue)
            finished.append((origin, req_no, gather.merge(request, parts, fields)))
        if finished:
            self.carry(via.forwarding.release(*replies.encode(finished), via.election.vote_id), via)

    def _gathered_parts(self, header: bytes, blob: bytes) -> tuple[bytes, bytes] | None:
        """Of replies a group's Forwarding delivers: those that are parts of this node's scattered
        requests (_gather_remote) go to the Gatherer; the rest (None if none) to the acceptor."""
        rows = list(replies.decode(header, blob))
        done, rest = self.gatherer.take_answers(rows)
        self._finish(done, self.first)
        return (header, blob) if len(rest) == len(rows) else replies.encode_raw(rest) if rest else None

    def replies_lost(self) -> int:
        """Replies to other nodes' forwarded requests given up on so far (Forwarding.replies_lost)."""
        return sum(g.forwarding.replies_lost for g in self._every_group())

    def take_replied(self) -> dict:
        """The replies the node's Forwardings made themselves since the last call, by (action,
        code): for queue_server_requests_total."""
        replied: dict = {}
        for group in self._every_group():
            for key, n in group.forwarding.take_replied().items():
                replied[key] = replied.get(key, 0) + n
        return replied

    def refuse(self, header: bytes, blob: bytes, reason: str, group: GroupNode) -> None:
        """Answer every request of a batch with an error instead of its reply, and count them by
        `reason` (a key of REFUSALS): the worker counted each request when it replied."""
        rows = [(origin, req_no, p.error_reply(replies.naming(replies.decoded(data)), reason, self.node_id))
                for origin, req_no, data in replies.decode(header, blob)]
        count_refused(self.refused, reason, sum(1 for row in rows if row[1] != p.PUSH_REQ_NO))
        if rows:
            self.carry(group.forwarding.release(*replies.encode(rows), group.election.vote_id), group)

    # ----------------------------------------------------------------- forwarding
    def carry(self, actions: list, group: GroupNode | RemoteGroup) -> None:
        """Carry out what `group`'s Forwarding (server/forwarding.py) decided."""
        out = self.out
        for a in actions:
            kind = type(a)
            if kind is Deliver:
                if a.answers and self.gatherer.asked:
                    rest = self._gathered_parts(a.header, a.blob)
                    if rest is not None:
                        out.acceptor.append(ipc_frames.rep_frames(*rest))
                    continue
                out.acceptor.append(ipc_frames.rep_frames(a.header, a.blob))
            elif kind is Send:
                group.to_peers.append((a.to, a.msg))
            elif kind is Work:
                out.workers.append((a.index, ipc_frames.req_frames([a.item], group.epoch, group.group)))
            elif kind is Undeliver:
                self.on_undelivered(a.queue, a.given)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _serve_forwarded(self, msg: Forward, g: int) -> None:
        group = self.groups[g]
        self.carry(group.forwarding.serve(msg, group.leader is not None, group.election.vote_id), group)

    def _every_group(self) -> list:
        """Every group's GroupNode or RemoteGroup (each has a Forwarding)."""
        return [*self.groups.values(), *self.remote.values()]
