"""The coordinator process: the node's serialization point and its link to the other nodes. It
moves bytes between the workers, the acceptor, the peers' coordinators (ZeroMQ over TCP, protobuf
messages: replication/peer.proto) and the ClusterNode that decides everything (server/cluster.py).
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import time

import zmq

from queue_server.config.loader import NodeConfig
from queue_server.replication import group_marker, wire
from queue_server.replication.datadir import DamagedVoteState, DataDirLocked
from queue_server.replication.messages import SnapshotAck
from queue_server.replication.storage import Storage
from queue_server.replication.wal import CorruptLog
from queue_server.server import batching, ipc, peer_keys
from queue_server.protocol import ipc_frames
from queue_server.server.child import HANDOFF_DONE, start
from queue_server.protocol.roles import SERVING, Role
from queue_server.server.cluster import ClusterNode
from queue_server.server.forwarding import REPLY_RETRY
from queue_server.server.metrics import CoordinatorMetrics
from queue_server.server.peer_check import BAD_KEY, peer_rejection
from queue_server.server.ready import Ready
from queue_server.server.snapshots import STOP_WAIT
from queue_server.server.reachability import Reachability
from queue_server.server.group_disks import GroupDisks, of_group

# Messages queued for a peer that is not answering are dropped past this many: the election and
# replication resend what matters.
PEER_HWM = 10000
# How often the node's figures are handed to the metrics (they are published once a second).
OBSERVE_INTERVAL = 0.2


class Coordinator:
    """The I/O around one ClusterNode."""

    def __init__(self, config: NodeConfig, ctx: zmq.Context, run_dir: str, log, storage: Storage | None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.ctx = ctx
        self.waker: zmq.Socket | None = None  # a node alone's PUSH to its own inbox, for _wake
        self.handoff_asked = False  # SIGUSR1: the node is stopping, hand leadership over
        # SIGTERM: leave the loop between two iterations. Exiting from inside the handler could
        # interrupt a write to the log after the OS took the bytes but before the writer counted
        # them; closing the log then wrote those records a second time (a corrupt log).
        self.stop_asked = False
        self.stop_by: float | None = None  # after SIGTERM: until when a running cut may finish
        self.handoff_started: float | None = None
        # Each group's node the hand-off was last said to go to (None: no hand-off under way).
        self.handoff_target: dict[int, int] | None = None
        self.log = log
        started = time.monotonic()
        # Each queue group's disk (group 0's is `storage`, which holds the data dir's lock) and
        # what it held; then the snapshots streamed to and from peers, per group.
        self.disks, found = GroupDisks.open(config, storage, run_dir, log)
        first = min(found)
        recovered = found.pop(first)
        self.node = ClusterNode(config, time.time(), recovered=recovered, snapshot_dir=self.disks.snapshot_dirs[first],
                                disks={g: (r, self.disks.snapshot_dirs[g]) for g, r in found.items()})
        self.disks.attach(self.node)
        self.storage = storage
        self.transfers = self.disks.transfers[first]
        # Until each group's recovery line is logged (_log_recovery): when recovery began, and what
        # the disk held (None: every line is logged, or the node has no disk).
        self.recovery = None if recovered is None else {
            g: (started, r.trans_id, len(r.entries)) for g, r in {first: recovered, **found}.items() if r is not None}
        self.inbox = ipc.inbox(ctx, run_dir, "coordinator")
        self.acceptor = ipc.outbox(ctx, run_dir, "acceptor")
        self.workers = [ipc.outbox(ctx, run_dir, ipc.worker_name(i)) for i in range(config.workers)]
        self.peers: dict[int, peer_keys.PeerLink] = {}
        self.router: zmq.Socket | None = None
        self.zap: peer_keys.PeerAuthenticator | None = None
        me = config.self_node if config.is_cluster else None
        secrets = peer_keys.read_secrets(config.cluster_secret_file) if config.cluster_secret_file else None
        self.peer_ids = frozenset(n.node_id for n in config.peers)
        if me is not None:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.setsockopt(zmq.RCVHWM, 0)
            if secrets is not None:
                self.zap = peer_keys.PeerAuthenticator(ctx, peer_keys.public_keys(secrets, sorted(self.peer_ids)))
                self.zap.start()
                peer_keys.serve_curve(self.router, secrets[0], config.node_id)
            self.router.bind(f"tcp://{socket.gethostbyname(me.host)}:{me.port}")
            for node in config.cluster_node_list:
                if node.node_id == config.node_id:
                    continue
                sockets = []
                for secret in secrets or [None]:  # one connection per secret: see PeerLink
                    sock = ctx.socket(zmq.DEALER)
                    if secret is not None:
                        peer_keys.connect_curve(sock, secrets[0], config.node_id, secret, node.node_id)
                    sock.setsockopt(zmq.IDENTITY, str(config.node_id).encode())
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.SNDHWM, PEER_HWM)
                    sock.setsockopt(zmq.IMMEDIATE, 1)
                    sock.setsockopt(zmq.RECONNECT_IVL, 50)
                    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
                    sock.connect(f"tcp://{node.host}:{node.port}")
                    sockets.append(sock)
                self.peers[node.node_id] = peer_keys.PeerLink(sockets)
        self.placement_hash = config.placement().wire_hash  # 0: the default placement
        # Several messages to one peer go as the frames of one send only with queue groups: a node
        # of the default placement sends one message a send, as every earlier version reads them.
        self.multipart = self.placement_hash != 0
        # wire.encode's envelope, but for the queue group
        self.client = (config.host, config.port, config.node_type, config.http_port, self.placement_hash)
        self.rejections_logged: set[str] = set()
        self.zap_refused = 0
        self.metrics = CoordinatorMetrics(grouped=self.node.grouped)
        self.next_observe = 0.0
        self.last_election_role: dict[int, Role] = {}  # by queue group
        self.reachability = Reachability(
            {n.node_id: f"{n.host}:{n.port}" for n in config.cluster_node_list if n.node_id != config.node_id},
            time.time()) if config.is_cluster else None

    def run(self) -> None:
        """Serve until SIGTERM."""
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        inbox_poller = ipc.poller_of(self.inbox)
        router_poller = ipc.poller_of(self.router) if self.router is not None else None
        # SIGUSR1 (the supervisor got SIGTERM: hand over) and SIGTERM (stop) only set flags.
        # A node alone waits in a receive on its inbox (ipc.Waiter: fewer system calls per
        # wake-up than a poll), which a signal's handler ends with a WAKE of its own (_wake);
        # a node of a cluster polls its inbox and its peers' socket, and this pipe that
        # the signals write to.
        wait = ipc.Waiter(self.inbox) if self.router is None else None
        wake_r = None
        if wait is None:
            wake_r, wake_w = os.pipe()
            os.set_blocking(wake_r, False)
            os.set_blocking(wake_w, False)
            signal.set_wakeup_fd(wake_w)
            poller.register(wake_r, zmq.POLLIN)
            poller.register(self.router, zmq.POLLIN)
        else:
            self.waker = ipc.outbox(self.ctx, self.run_dir, "coordinator")
        signal.signal(signal.SIGUSR1, self._ask_handoff)
        signal.signal(signal.SIGTERM, self._ask_stop)
        node = self.node
        # The first Ready holds the workers' LOAD: out before the first tick, which may commit (a
        # single node elects itself at once) and so send the log after the snapshot behind it.
        self.flush()
        node.tick(time.time())
        self.flush()
        while not self.stop_asked or self._finishing_cut():
            wake = node.wake_at()
            sync_at = self.disks.sync_deadline()
            if sync_at is not None:
                wake = min(wake, sync_at)
            timeout = max(0.0, min(wake - time.time(), 1.0))
            first = None
            if wait is not None:
                first = wait(timeout)
                events = {}
            else:
                events = dict(poller.poll(timeout * 1000 + 0.5))
            if wake_r is not None and wake_r in events:
                while True:
                    try:
                        if not os.read(wake_r, 64):
                            break
                    except BlockingIOError:
                        break
            if self.handoff_asked:
                self.hand_off(time.time())
            # Peers first: elections are the most sensitive to delay. The time is read per
            # message, and timers run between messages, so that a long backlog never makes a
            # leader's messages look late or hides a heartbeat that is due.
            if self.router is not None and self.router in events:
                for frames in ipc.drain(self.router, router_poller, copy=False):
                    # The ROUTER's identity of the peer, then one frame per peer message: a
                    # peer sends all of one Ready's messages to this node in one send.
                    for frame in frames[1:]:
                        self.on_peer_frame(frame)
            if first is not None or self.inbox in events:
                # The workers' batches that come one after another are taken together
                # (ClusterNode.on_batches: their records replicated, and committed, once).
                batches: list[list[bytes]] = []
                for frames in ipc.drain(self.inbox, inbox_poller, first=first):
                    if frames[0] == ipc_frames.BATCH:
                        batches.append(frames)
                        continue
                    now = time.time()
                    if batches:
                        self.dispatch_batches(batches, now)
                        batches = []
                    self.dispatch(frames, now)
                    if now >= node.wake_at():
                        node.tick(now)
                        self.flush()
                if batches:
                    now = time.time()
                    self.dispatch_batches(batches, now)
                    if now >= node.wake_at():
                        node.tick(now)
                        self.flush()
            now = time.time()
            if now >= node.wake_at():
                node.tick(now)
            self.flush()
            if self.reachability is not None:
                line = self.reachability.report(node.election.leader_id is not None, now)
                if line is not None:
                    self.log.warning("%s", line)

    def on_peer_frame(self, frame: zmq.Frame) -> None:
        """Hand one peer message to the node, unless it is not one or is not admitted."""
        node = self.node
        try:
            env = wire.decode(frame.bytes)
        except ValueError as exc:
            self.log.warning("dropped a bad peer message: %s", exc)
            return
        if not self.admitted(env, frame):
            return
        now = time.time()
        if self.reachability is not None:
            self.reachability.heard(env.msg.src, type(env.msg).__name__, now)  # type: ignore[attr-defined]
        node.on_peer(env.msg, (env.client_host, env.client_port), now, env.http_port, env.group)
        if now >= node.wake_at():
            node.tick(now)
            self.flush()

    def admitted(self, env: wire.Envelope, frame: zmq.Frame) -> bool:
        """Whether a peer message may be acted on (server/peer_check.py); a refused one is
        counted and, the first time for each reason, logged."""
        src = env.msg.src  # type: ignore[attr-defined]
        sender = None
        if self.zap is not None:
            user = frame.get("User-Id")
            sender = int(user) if user and user.isdigit() else None
        reason = peer_rejection(src, sender, env.cluster_id, peers=self.peer_ids,
                                my_cluster=self.config.node_type, authenticated=self.zap is not None,
                                placement_hash=env.placement_hash, my_placement=self.placement_hash)
        if reason is None:
            return True
        self.metrics.peer_rejected(reason)
        if reason not in self.rejections_logged:
            self.rejections_logged.add(reason)
            self.log.warning("dropped a peer message (%s): src %d, authenticated as %s, cluster id %d, placement "
                             "hash %08x (this node's: %08x; set queue_groups, group_replicas, queue_group_list and "
                             "cluster_node_list alike on every node) (logged once per reason; see the "
                             "peer_rejected metric)", reason, src, sender, env.cluster_id, env.placement_hash,
                             self.placement_hash)
        return False

    def _ask_handoff(self, signum: int, frame: object) -> None:
        self.handoff_asked = True
        self._wake()

    def _ask_stop(self, signum: int, frame: object) -> None:
        self.stop_asked = True
        self._wake()

    def _wake(self) -> None:
        """End the loop's wait on the inbox (a node alone; see run): a signal interrupts the
        receive, but its retry would go on waiting."""
        if self.waker is not None:
            try:
                self.waker.send_multipart(ipc_frames.WAKE_FRAMES, zmq.NOBLOCK)
            except zmq.ZMQError:  # the wait ends within a second anyway
                pass

    def _finishing_cut(self) -> bool:
        """After SIGTERM: whether to go on serving, so that a cut whose T is set is published
        rather than lost; for at most STOP_WAIT (the workers let their writers finish as long)."""
        if self.stop_by is None:
            self.stop_by = time.monotonic() + STOP_WAIT
        return self.node.cut_writing() and time.monotonic() < self.stop_by

    def hand_off(self, now: float) -> None:
        """The node is stopping: hand the leadership of each group it leads to an up-to-date
        follower (for up to half of shutdown_grace), then tell the supervisor (HANDOFF_DONE)."""
        node = self.node
        groups = node.groups
        if self.handoff_started is None:
            self.handoff_started = now
            if node.begin_handoff(now, self.config.shutdown_grace / 2):
                self.handoff_target = self._handoff_targets()
                for g, target in sorted(self.handoff_target.items()):
                    self.log.info("%sstopping: handing leadership to node %d", of_group(g, node.grouped), target)
                self.flush()
                return
        elif node.handing_off(now):
            targets = self._handoff_targets()
            for g, target in sorted(targets.items()):
                before = self.handoff_target.get(g)
                if target != before:
                    self.log.info("%sstopping: node %s did not answer for an election timeout; handing leadership "
                                  "to node %d instead", of_group(g, node.grouped), before, target)
            self.handoff_target.update(targets)
            return
        else:
            took = now - self.handoff_started
            for g in sorted(self.handoff_target or ()):
                group = groups[g]
                if group.leader is not None:
                    self.log.warning("%sstopping: no follower took over within %.1f s; leading until the end",
                                     of_group(g, node.grouped), took)
                elif group.election.leader_id is None:
                    self.log.info("%sstopping: hand-off over after %.0f ms with no leader known (the followers may "
                                  "be stopping too)", of_group(g, node.grouped), took * 1000)
                else:
                    self.log.info("%sstopping: node %s leads now (hand-off took %.0f ms)", of_group(g, node.grouped),
                                  group.election.leader_id, took * 1000)
        self.handoff_asked = False
        self.handoff_started = self.handoff_target = None  # another SIGUSR1 hands over afresh
        with open(os.path.join(self.run_dir, HANDOFF_DONE), "w"):
            pass

    def _handoff_targets(self) -> dict[int, int]:
        """Each group whose leadership this node is handing over, and to which node."""
        return {g: group.election.transfer_target for g, group in self.node.groups.items()
                if group.election.transfer_target is not None}

    def dispatch_batches(self, batches: list[list[bytes]], now: float) -> None:
        """Handle BATCH messages from the workers that came one after another: each group's part
        of each, to that group's GroupNode."""
        read, index_of = ipc_frames.read_batch, ipc_frames.batch_index
        self.node.on_batches([(*part[1:], index_of(frames), part[0]) for frames in batches for part in read(frames)],
                             now)

    def dispatch(self, frames: list[bytes], now: float) -> None:
        """Handle one message from the acceptor or a worker."""
        kind = frames[0]
        if kind == ipc_frames.BATCH:
            self.dispatch_batches([frames], now)
        elif kind == ipc_frames.FORWARD:
            self.node.on_forward_requests(ipc_frames.read_forward(frames), now)
        elif kind == ipc_frames.UNDELIVER:
            self.node.on_undelivered(*ipc_frames.read_undeliver(frames))
        elif kind == ipc_frames.FENCED:
            self.node.on_fenced(*ipc_frames.read_fenced(frames), now, ipc_frames.group_of(frames))
        elif kind == ipc_frames.SYNCED:
            self.node.on_synced(*ipc_frames.read_synced(frames), now, ipc_frames.group_of(frames))
        elif kind == ipc_frames.SNAPPED:
            self.node.on_snapped(*ipc_frames.read_snapped(frames), now, ipc_frames.group_of(frames))
        elif kind == ipc_frames.PART_DONE:
            self.node.on_part_done(*ipc_frames.read_part_done(frames), now, ipc_frames.group_of(frames))
        elif kind == ipc_frames.WAKE:
            pass  # it has ended the wait: the loop reads the flags the signal set
        else:
            self.log.warning("unknown message kind %r", kind)

    def flush(self) -> None:
        """Carry out what the node decided, one Ready at a time, until it has nothing more, or the
        disk refused the log. The replies a write to disk released go out right after it when
        they are all that waits (take_replies), else in the next Ready.
        The first Ready is carried out even if empty: the log may be due for an fsync."""
        node = self.node
        written = None  # the log_through of the last Ready written to disk
        while True:
            ready = node.ready()
            if not self.carry_out(ready, ready.needs_write(written)):
                break
            released = node.take_replies()  # the common case: no second Ready just for them
            if released:  # they were all that waited
                for message in batching.for_acceptor(released):
                    self.acceptor.send_multipart(message)
                break
            if not node.has_ready():
                break
            written = ready.log_through
        if time.monotonic() >= self.next_observe:
            self.next_observe = time.monotonic() + OBSERVE_INTERVAL
            self.observe()

    def carry_out(self, ready: Ready, write: bool) -> bool:
        """Write each queue group's log and vote to disk (group 0's unless told there is nothing
        to write), then send: nothing that depends on a record leaves before the record is on
        disk. Then advance the node. Whether group 0's log was stored."""
        node = self.node
        # The node's first group's part is the Ready's own fields; every other group's is a GroupPart.
        first = node.first_group
        pieces = [(first, ready, write), *((part.group, part, True) for part in ready.parts)]
        stored: dict[int, tuple[int | None, bool]] = {}
        sent: dict[int, bytes] = {}  # id of a message -> its bytes: one batch for several followers
        # Each peer's messages of every group, in order, go as the frames of one send (one wake
        # of the peer), or one a send (self.multipart): (frames, [(group, message)]).
        to_peer: dict[int, tuple[list[bytes], list[tuple[int, object]]]] = {}
        for g, piece, must_write in pieces:
            durable, log_stored, vote_stored = self.disks.persist(node.groups[g], piece, must_write)
            stored[g] = (durable, log_stored)
            transfers = self.disks.transfers[g]
            chunks_written = transfers.write(piece.chunk_writes) if piece.chunk_writes else True
            for target, msg in piece.peer_messages(log_stored, vote_stored):
                if target not in self.peers or (not chunks_written and type(msg) is SnapshotAck):
                    continue
                data = sent.get(id(msg))
                if data is None:
                    filled = transfers.filled(msg, time.time())
                    if filled is None:
                        continue
                    data = sent[id(msg)] = wire.encode(filled, *self.client, g)
                frames_msgs = to_peer.get(target)
                if frames_msgs is None:
                    frames_msgs = to_peer[target] = ([], [])
                frames_msgs[0].append(data)
                frames_msgs[1].append((g, msg))
        for g, target, msg in ready.remote:  # of groups this node is no replica of: nothing to persist
            if target in self.peers:
                frames_msgs = to_peer.get(target)
                if frames_msgs is None:
                    frames_msgs = to_peer[target] = ([], [])
                frames_msgs[0].append(wire.encode(msg, *self.client, g))
                frames_msgs[1].append((g, msg))
        if ready.to_workers:
            for index, message in batching.for_workers(ready.to_workers):
                self.workers[index].send_multipart(message)
        if ready.to_acceptor:
            for message in batching.for_acceptor(ready.to_acceptor):
                self.acceptor.send_multipart(message)
        unsent = []
        for target, (frames, msgs) in to_peer.items():
            link = self.peers[target]
            sends = [(frames, msgs)] if self.multipart else [([f], [m]) for f, m in zip(frames, msgs)]
            for part, part_msgs in sends:
                try:
                    link.send(part)
                except zmq.Again:  # not connected yet, or too far behind
                    unsent.extend((target, g, m) for g, m in part_msgs)
        durable, log_stored = stored[first]
        node.advance(ready, durable_trans_id=durable, log_stored=log_stored,
                     parts={g: got for g, got in stored.items() if g != first})
        if self.recovery is not None:
            self._log_recovery()
        if unsent:
            lost = node.replies_lost()
            for target, g, msg in unsent:
                node.on_unsent(msg, time.time(), group=g, to=target)
            if node.replies_lost() > lost:
                self.log.warning("could not send another node the replies to %d requests it forwarded for %g s (not "
                                 "connected, or too far behind): they time out there, and the messages of consumes "
                                 "among them are given back", node.replies_lost() - lost, REPLY_RETRY)
        self.disks.read_logs(node)
        for g, piece, _ in pieces:
            if piece.staged or piece.snapshots:
                self.disks.carry_files(node, g, piece, self.metrics)
            if piece.role is not None:
                election = node.groups[g].election
                self.log.info("%srole: %s (vote_id %d, leader %s, trans_id %d)", of_group(g, node.grouped),
                              piece.role, election.vote_id, election.leader_id, piece.log_through)
        for g, target in node.take_moves():
            self.log.info("group %d: handing leadership to node %d, its preferred leader", g, target)
        return log_stored

    def _log_recovery(self) -> None:
        """Once the committed state holds what the disk held (the log after the snapshot is
        replayed as it commits: at once on a single node, when the leader says so on a follower),
        log what the node holds, how long that took, and where it came from."""
        recovery = self.recovery
        assert recovery is not None
        for g in list(recovery):
            replayed = self.node.take_replayed(g)
            if replayed is None:
                continue
            started, snapshot_trans_id, records = recovery.pop(g)
            queues, messages, trans_id = replayed
            source = (f"a snapshot at trans_id {snapshot_trans_id} and {_count(records, 'log record')} after it"
                      if snapshot_trans_id else f"{_count(records, 'log record')} (no snapshot)")
            self.log.info("%srecovered in %.2f s: %s holding %s at trans_id %d, from %s",
                          of_group(g, self.node.grouped), time.monotonic() - started, _count(queues, "queue"),
                          _count(messages, "message"), trans_id, source)
        if not recovery:
            self.recovery = None

    def observe(self) -> None:
        """Hand the node's figures to the metrics (published about once a second)."""
        node, m = self.node, self.metrics
        for g, group in node.groups.items():
            log, election = group.log, group.election
            m.set_trans_id(log.last_trans_id, log.commit_trans_id, g)
            role = election.role
            if role is not self.last_election_role.get(g):
                if role is Role.CANDIDATE:
                    m.election_started()
                if role is not Role.LEADER and group.leader is None:
                    for peer in election.peers:
                        m.forget_follower(peer, g)
                self.last_election_role[g] = role
            m.set_role(group.role.value if group.role in SERVING else Role.CANDIDATE.value, election.vote_id, g)
            if group.leader is not None:
                for peer in election.peers:
                    m.set_follower_lag(peer, log.last_trans_id - group.leader.match_of(peer), g)
        if self.zap is not None and self.zap.refused != self.zap_refused:
            m.peer_rejected(BAD_KEY, self.zap.refused - self.zap_refused)
            self.zap_refused = self.zap.refused
        m.replied(node.take_replied())
        m.refused(node.take_refused())
        if self.storage is not None and self.storage.last_fsync is not None:
            m.observe_fsync(self.storage.last_fsync)
            self.storage.last_fsync = None
        m.maybe_fold()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def main(argv: list[str] | None = None) -> None:
    """Entry point of the coordinator process."""
    info = start("coordinator", argv)
    cfg = info.config
    storage = None
    if not cfg.in_memory:
        try:
            storage = Storage(cfg.queue_data_dir, cfg.fsync, repair=cfg.repair, log=info.log,
                              segment_bytes=cfg.wal_segment_bytes)
        except DataDirLocked as exc:
            info.log.error("%s", exc)
            sys.exit(3)
        # (the supervisor's preflight checked it already; here it is done under the data dir's lock)
        reason = group_marker.settle(cfg.queue_data_dir, cfg.placement())
        if reason is not None:
            info.log.error("%s", reason)
            storage.close()
            sys.exit(3)
    ctx = zmq.Context()
    coordinator = None
    try:
        coordinator = Coordinator(cfg, ctx, info.run_dir, info.log, storage)
        info.log.info("coordinator ready")
        coordinator.run()
    except DamagedVoteState as exc:
        # Forgetting the vote could let this node vote twice in one term: a person decides.
        info.log.error("%s; restore it, or delete it if the node may forget its vote (a single node, or one whose "
                       "cluster elects without it)", exc)
        sys.exit(4)
    except CorruptLog as exc:
        info.log.error("%s; start with --repair to cut the log there (losing what follows)", exc)
        sys.exit(4)
    except KeyboardInterrupt:
        pass
    finally:
        if coordinator is not None and coordinator.zap is not None:
            coordinator.zap.stop()
        if coordinator is not None:
            coordinator.disks.close()
        ctx.destroy(linger=0)
        if storage is not None:
            storage.close()


if __name__ == "__main__":
    main(sys.argv[1:])
