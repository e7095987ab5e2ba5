"""A worker process: receives request batches for the queue partitions it owns, runs them
through the PartitionService of their queue group (one per group the node is a replica of,
each with its own mode), and sends the records and replies of each loop turn to the coordinator
in one message, a part per group; the replies that rest on no record (PartitionService.direct) go
straight to the acceptor. On SNAP it forks the writer of its snapshot part (server/snapshot_child.py)
and says when that is done (PART_DONE)."""
from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq

from queue_server.config.loader import NodeConfig
from queue_server.server import ipc
from queue_server.protocol import ipc_frames, limits, replies
from queue_server.replication.snapshot import iter_frames, read_end
from queue_server.server.child import start
from queue_server.server.router import Router
from queue_server.server.snapshot_child import exit_reason, fork_writer, part_name
from queue_server.server.snapshots import STOP_WAIT
from queue_server.server.metrics import WorkerMetrics
from queue_server.server.reply_counts import count_replies
from queue_server.server.node_memory import HeldMemory, NodeMemory
from queue_server.server.overflow_files import DiskSegments, PartSegments, link_segments, worker_dir
from queue_server.server.queue_metrics import QueueMetrics
from queue_server.workers import undo
from queue_server.workers.body_budget import BodyBudget, worker_share
from queue_server.workers.overflow import Overflow
from queue_server.workers.service import PartitionService


# While a snapshot writer runs, the worker looks whether it has ended at least this often (s).
WRITER_POLL = 0.05
# The inbox messages about one group's queues or mode (the group is their last frame), but REQ.
_OF_A_GROUP = frozenset({ipc_frames.FENCE, ipc_frames.UNDELIVER, ipc_frames.APPLY, ipc_frames.COMMITTED,
                         ipc_frames.MODE, ipc_frames.LOAD})


class Worker:
    """The I/O around the PartitionServices of one worker, one per queue group."""

    def __init__(self, services: dict[int, PartitionService], inbox: zmq.Socket | None, coordinator: Any, log: Any,
                 index: int = 0, metrics: WorkerMetrics | None = None,
                 queue_metrics: QueueMetrics | None = None, memory: NodeMemory | HeldMemory | None = None,
                 acceptor: Any = None, owns: Callable[[str], bool] | None = None,
                 write_inline: Callable[[PartitionService, str, int], None] | None = None) -> None:
        """services: group -> its PartitionService (with one group: {0: service}).
        coordinator, acceptor: anything with send_multipart (a ZeroMQ PUSH socket, or a test's
        pipe); with no acceptor every reply goes through the coordinator.
        memory: what is measured against max_memory_mb (server/node_memory.py), read every
        MEMORY_CHECK_INTERVAL to refuse produces past it (None: no limit).
        owns: whether a queue is this worker's (its Router's say), for LOAD (None: every queue).
        write_inline: writes a snapshot part in this process instead of a forked child
        (snapshot_child.write_part_inline; the node sim), None: fork."""
        self.services = services
        self.groups = tuple(services.items())  # (group, service) pairs: the loops per loop turn walk this
        self.inbox = inbox
        self.coordinator = coordinator
        self.acceptor = acceptor
        self.log = log
        # Per group: the epoch of its last mode change received (see GroupNode.epoch), the
        # messages held until the coordinator's MODE of their epoch comes, and who fenced the
        # current mode (ipc_frames FENCE).
        self.epochs: dict[int, int] = dict.fromkeys(services, 0)
        self.held: dict[int, list[list[bytes]]] = {g: [] for g in services}
        self.fences: dict[int, set[bytes]] = {g: set() for g in services}
        self.unknown_groups: set[int] = set()  # groups of messages dropped (logged once each)
        # A REQ's group frame -> (group, service).
        self.by_frame = {b"%d" % g: (g, service) for g, service in services.items()}
        self.index = index
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.queue_metrics = queue_metrics
        self.memory = memory
        self.next_memory_check = 0.0
        self.overflow_refused: dict[int, str | None] = {}  # per group: its overflow disk's refusal last logged
        self.torn_logged: dict[int, set[int]] = {}  # per group: its overflow segments with unreadable bodies, logged
        self.undone = 0  # records the last MODE rolled back
        self.rollbacks = 0  # MODEs that rolled records back
        self.owns = owns
        # A snapshot cut (ipc_frames SNAP): the writer child (pid, cut id, tmp dir, group), and
        # while the cut holds this worker's output, what it would have sent the coordinator (and
        # the cut's id and group).
        self.writer: tuple[int, int, str, int] | None = None
        self.out_held: list[list[bytes]] | None = None
        self.hold_cut = 0
        self.hold_group = 0
        self.segments: list[list[int]] = []  # the overflow segments the running cut's part refers to
        self.write_inline = write_inline

    def run(self) -> None:
        """Serve until terminated."""
        ipc.serve(
            self.inbox,
            lambda frames: self.dispatch(frames, time.time()),
            self.idle,
            self.after,
        )

    def idle(self) -> float:
        """How long the loop may wait for a message: until the service's next deadline, and
        while a snapshot writer runs, no longer than WRITER_POLL (to reap it)."""
        now = time.time()
        wait = min(service.next_deadline(now) for service in self.services.values()) - now
        return wait if self.writer is None else min(wait, WRITER_POLL)

    def after(self) -> None:
        """Run timers, then send on what the service produced."""
        if self.writer is not None:
            self.reap()
        now = time.time()
        for group, service in self.groups:
            service.tick(now)
            if service.overflow is not None:
                self.check_overflow(group, service)
        self.flush()
        clock = time.monotonic()
        if self.memory is not None and clock >= self.next_memory_check:
            self.next_memory_check = clock + limits.MEMORY_CHECK_INTERVAL
            self.check_memory(clock)
        if self.metrics.due(clock):
            self.fold_metrics(now)

    def fold_metrics(self, now: float) -> None:
        """Hand the services' figures to the metrics (when they are due)."""
        services = self.services.values()
        self.metrics.fold(lambda: self.totals(now), self.limit_refusals())
        if self.queue_metrics is not None:
            self.queue_metrics.maybe_fold(lambda: [row for s in services for row in s.queue_rows(now)])

    def check_memory(self, clock: float) -> None:
        """Refuse produces, in every group, while the memory measured is over max_memory_mb (said
        once per change)."""
        memory = self.memory
        assert memory is not None
        used = memory.used(clock)
        first = self.groups[0][1]  # every service has the node's max_memory_mb
        full = used > memory.limit
        if full != first.memory_full:
            for _, service in self.groups:
                service.memory_full = full
            what = (f"worker {self.index} holds {used >> 20} MiB for its messages, {'over' if full else 'back under'} "
                    f"its share ({memory.limit >> 20} MiB)" if memory.counted else
                    f"node memory {used >> 20} MiB is {'over' if full else 'back under'}")
            self.log.warning("%s of max_memory_mb (%d): produces are %s", what, first.max_memory_mb,
                             "refused" if full else "served again")

    def check_overflow(self, group: int, service: PartitionService) -> None:  # (one with an overflow disk)
        """Say when the overflow disk of `group`'s service refuses writes, and when it takes them
        again; and, once a segment, that one holds bodies that failed their check on read."""
        overflow = service.overflow
        if overflow.refused != self.overflow_refused.get(group):
            self.overflow_refused[group] = overflow.refused
            if overflow.refused is not None:
                self.log.warning("%s: produces that need it are refused until it takes writes again", overflow.refused)
            else:
                self.log.warning("overflow disk %s takes writes again", overflow.files.where)
        logged = self.torn_logged.setdefault(group, set())
        if len(overflow.torn) > len(logged):
            for seg in overflow.torn.keys() - logged:  # one line a segment
                logged.add(seg)
                self.log.error("overflow segment %d in %s holds bodies that fail their check (torn or overwritten): "
                               "their messages go the dead-letter way, reason 'body unreadable'", seg, overflow.files.where)

    def totals(self, now: float) -> dict:
        """The queue totals of every group's service, summed (PartitionService._totals)."""
        if len(self.services) == 1:
            return next(iter(self.services.values()))._totals(now)
        total: dict = {}
        for service in self.services.values():
            for key, value in service._totals(now).items():
                total[key] = total.get(key, 0) + value
        return total

    def limit_refusals(self) -> dict[str, int]:
        """The refusals by limit of every group's service, for the metrics (which empty it)."""
        if len(self.services) == 1:
            return next(iter(self.services.values())).limit_refusals
        merged: dict[str, int] = {}
        for service in self.services.values():
            for limit, count in service.limit_refusals.items():
                merged[limit] = merged.get(limit, 0) + count
            service.limit_refusals.clear()
        return merged

    def service_of(self, frames: list[bytes]) -> tuple[int, PartitionService | None]:
        """The group of a message (ipc_frames.group_of) and its service; None (logged once per
        group) if this worker holds no queues of that group."""
        group = ipc_frames.group_of(frames)
        service = self.services.get(group)
        if service is None and group not in self.unknown_groups:
            self.unknown_groups.add(group)
            self.log.error("dropped a %r message of queue group %d, which this node is no replica of (logged once "
                           "per group)", frames[0], group)
        return group, service

    def dispatch(self, frames: list[bytes], now: float) -> None:
        """Handle one inbox message."""
        kind = frames[0]
        if kind == ipc_frames.REQ:
            found = self.by_frame.get(frames[3])  # the group's frame: no int() per REQ
            group, service = found if found is not None else self.service_of(frames)
            if service is None:
                return
            if ipc_frames.req_epoch(frames) > self.epochs[group]:
                # Sent after a mode change this worker has not received yet (it comes from the
                # coordinator on another pipe): hold it until then.
                self.held[group].append(frames)
                return
            started = time.perf_counter()
            handle = service.handle
            items = ipc_frames.read_req(frames)
            for origin, req_no, req, gather in items:
                if gather is None:
                    handle(req, origin, req_no, now)
                else:
                    service.partial(gather, req, now)
            self.metrics.batch(time.perf_counter() - started, len(items))
        elif kind == ipc_frames.CLOSE:
            conn = ipc_frames.read_close(frames)
            for service in self.services.values():
                service.cancel(conn)
        elif kind in _OF_A_GROUP:
            group, service = self.service_of(frames)
            if service is not None:
                self.dispatch_group(kind, frames, group, service, now)
        elif kind == ipc_frames.SYNC:
            self.send(ipc_frames.synced_frames(*ipc_frames.read_sync(frames), self.index, ipc_frames.group_of(frames)))
        elif kind == ipc_frames.SNAP:
            group, service = self.service_of(frames)
            if service is not None:
                self.snap(*ipc_frames.read_snap(frames), group)
        elif kind == ipc_frames.RELEASE:
            if (ipc_frames.read_release(frames), ipc_frames.group_of(frames)) == (self.hold_cut, self.hold_group):
                self.release()
        elif kind == ipc_frames.DRAIN:
            for service in self.services.values():
                service.draining = True
        else:
            self.log.warning("unknown message kind %r", kind)

    def dispatch_group(self, kind: bytes, frames: list[bytes], group: int, service: PartitionService,
                       now: float) -> None:
        """Handle an inbox message about one group's queues or mode (but a REQ)."""
        if kind == ipc_frames.FENCE:
            epoch, sender = ipc_frames.read_fence(frames)
            if epoch > self.epochs[group]:
                self.held[group].append(frames)  # behind the held requests it fences
            else:
                self.fence(epoch, sender, group)
        elif kind == ipc_frames.UNDELIVER:
            queue, given = ipc_frames.read_undeliver(frames)
            service.undeliver(queue, given, now)
        elif kind == ipc_frames.APPLY:
            records = ipc_frames.read_apply(frames)
            if ipc_frames.apply_committed(frames):
                service.apply_committed(records)  # never undone: no undo entries
            else:
                for record in records:
                    service.apply(record)
        elif kind == ipc_frames.COMMITTED:
            epoch, seq = ipc_frames.read_committed(frames)
            if epoch == self.epochs[group]:
                service.trim(seq)
        elif kind == ipc_frames.MODE:
            # What was decided under the old mode leaves stamped with it (the coordinator refuses
            # changes from a mode that is over, and the rollback below undoes them here).
            self.flush()
            if group == self.hold_group:
                self.release()  # a cut ends with its group's mode
            accepting, self.epochs[group], keep_through, _trans_id = ipc_frames.read_mode(frames)
            if keep_through is not None and service.journal is not None:
                self.undone = service.rollback(keep_through)
                self.rollbacks += self.undone > 0
            service.set_mode(accepting)
            self.fences[group].clear()
            held, self.held[group] = self.held[group], []
            for message in held:
                self.dispatch(message, now)
        elif kind == ipc_frames.LOAD:
            self.load(service, *ipc_frames.read_load(frames), now)

    def load(self, service: PartitionService, trans_id: int, parts: list[str], now: float) -> None:
        """Replace the queues of `service` with those of the snapshot parts at trans_id that this
        worker owns (the messages ready at `now` straight into the ready ordering). A part that
        cannot be read now (it was checked at start) stops the worker, and so the node, in one
        line: the next start checks the parts again and falls back to an older snapshot."""
        started = time.monotonic()
        segments = PartSegments(service.overflow)
        frames = itertools.chain.from_iterable(segments.frames(path, iter_frames(path, trans_id)) for path in parts)
        try:
            service.load_frames(frames, self.owns, now)
            segments.adopt()
        except (OSError, ValueError) as exc:
            self.log.error("cannot load the snapshot at trans_id %d: %s; stopping", trans_id, exc)
            sys.exit(4)
        queues = service.queues
        self.log.info("worker %d loaded %d queues holding %d messages from the snapshot at trans_id %d in %.2f s",
                      self.index, len(queues), sum(map(len, queues.values())), trans_id,
                      time.monotonic() - started)

    def fence(self, epoch: int, sender: bytes, group: int = 0) -> None:
        """A sender of requests sends none more of `group` in its mode `epoch`. Once both have
        said so (the node is handing the group's leadership over), every request of the mode
        has been served: send the batch, decide nothing more in the group (PartitionService.fence:
        no long poll served, no lease swept; the parked ones kept for the next mode) until its
        next mode, and tell the coordinator (FENCED), after the batch on the same pipe."""
        if epoch != self.epochs[group]:
            return  # a mode that is over: its changes were wiped or refused already
        fences = self.fences[group]
        fences.add(sender)
        if fences >= ipc_frames.FENCE_SENDERS:
            self.flush()
            self.services[group].fence()
            self.send(ipc_frames.fenced_frames(epoch, self.index, group))

    def flush(self) -> None:
        """Send what the services produced since the last flush: the replies that rest on no
        record to the acceptor in one REP, the rest to the coordinator in one BATCH with a part
        per group that has something to say."""
        batch = rep = None
        for group, service in self.groups:
            if service.errors:
                for exc in service.errors:
                    self.log.error("request failed: %r", exc, exc_info=exc)
                service.errors.clear()
            if service.direct:
                if self.acceptor is None:
                    service.replies.extend(service.direct)
                else:
                    count_replies(self.metrics.counts, service.direct)
                    frames = ipc_frames.rep_frames(*replies.encode(service.direct))
                    rep = frames if rep is None else ipc_frames.join_reps([rep, frames])
                service.direct.clear()
            if not (service.replies or service.records or service.partials):
                continue
            count_replies(self.metrics.counts, service.replies)
            if service.partials:
                self.metrics.count_partials(service.partials, self.index)
            header, blob = replies.encode(service.replies)
            changes, partials = ipc_frames.records_list(service.records), ipc_frames.json_list(service.partials)
            if batch is None:
                batch = ipc_frames.batch_frames(changes, header, blob, partials, self.epochs[group], self.index, group)
            else:
                ipc_frames.add_batch_part(batch, group, changes, header, blob, partials, self.epochs[group])
            service.replies.clear()
            service.records.clear()
            service.partials.clear()
        if rep is not None:
            self.acceptor.send_multipart(rep)
        if batch is not None:
            self.send(batch)

    def send(self, frames: list[bytes]) -> None:
        """To the coordinator, or into the hold of a snapshot cut."""
        if self.out_held is None:
            self.coordinator.send_multipart(frames)
        else:
            self.out_held.append(frames)

    # ----------------------------------------------------------------- snapshots
    def snap(self, epoch: int, cut_id: int, tmp: str, hold: bool, group: int = 0) -> None:
        """Cut `cut_id` of `group`: send what was decided so far, fork the writer of this worker's
        part of the group into `tmp`, say so (SNAPPED, on the same pipe: every earlier batch is
        ahead of it); with `hold`, keep what is decided from now on until the cut says (RELEASE,
        or the group's MODE). The node runs one cut at a time (ClusterNode.cut_running)."""
        self.flush()
        self.release()
        if self.writer is not None:  # an older cut's writer: that cut is over
            self.end_writer(kill=True)
        service = self.services[group]
        try:  # the part refers to the overflowed bodies in these (linked before anything changes)
            self.segments = link_segments(service.overflow, tmp, part_name(self.index))
        except OSError as exc:
            self.send(ipc_frames.snapped_frames(epoch, cut_id, self.index, group))
            self.send(ipc_frames.part_done_frames(cut_id, self.index, False, {"error": str(exc)}, group))
            return
        if self.write_inline is not None:
            self.send(ipc_frames.snapped_frames(epoch, cut_id, self.index, group))
            try:
                self.write_inline(service, tmp, self.index)
                part = self._part_entry(tmp)
            except (OSError, ValueError) as exc:
                part = {"error": str(exc)}
            self.send(ipc_frames.part_done_frames(cut_id, self.index, "error" not in part, part, group))
            if hold:
                self.out_held, self.hold_cut, self.hold_group = [], cut_id, group
            return
        pid = fork_writer(service, tmp, self.index, close=self._locks())
        self.writer = (pid, cut_id, tmp, group)
        self.send(ipc_frames.snapped_frames(epoch, cut_id, self.index, group))
        if hold:
            self.out_held, self.hold_cut, self.hold_group = [], cut_id, group

    def _locks(self) -> list[int]:
        """The descriptors holding this worker's overflow folders' locks."""
        return [s.overflow.files.lock for s in self.services.values()
                if s.overflow is not None and isinstance(s.overflow.files, DiskSegments)]

    def release(self) -> None:
        """End the hold of a cut: send what it kept, in order."""
        held, self.out_held = self.out_held, None
        for frames in held or ():
            self.coordinator.send_multipart(frames)

    def finish_writer(self, timeout: float) -> bool:
        """On a graceful stop: let a running writer finish its part, for up to `timeout` seconds,
        and send its PART_DONE; not while the cut holds this worker's output (its T is not set,
        so it cannot be published). Whether a PART_DONE went out."""
        if self.writer is None or self.out_held is not None:
            return False
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.writer[0], os.WNOHANG)
            if pid:
                self._part_done(status)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(WRITER_POLL)

    def reap(self) -> None:
        """If the writer child has ended, tell the coordinator how (PART_DONE)."""
        assert self.writer is not None
        pid, status = os.waitpid(self.writer[0], os.WNOHANG)
        if pid:
            self._part_done(status)

    def end_writer(self, kill: bool = False) -> None:
        """Wait for the writer child (after SIGKILL when `kill`), then PART_DONE."""
        assert self.writer is not None
        if kill:
            os.kill(self.writer[0], 9)
        _, status = os.waitpid(self.writer[0], 0)
        self._part_done(status)

    def _part_done(self, status: int) -> None:
        _, cut_id, tmp, group = self.writer  # type: ignore[misc]
        self.writer = None
        code = os.waitstatus_to_exitcode(status)
        if code != 0:  # the coordinator says it in its line on the failed cut
            part = {"error": exit_reason(code)}
        else:
            try:
                part = self._part_entry(tmp)
            except (OSError, ValueError) as exc:
                part = {"error": str(exc)}
        self.send(ipc_frames.part_done_frames(cut_id, self.index, "error" not in part, part, group))

    def _part_entry(self, tmp: str) -> dict:
        """The manifest entry of this worker's part written into `tmp`, with the overflow
        segments it refers to."""
        part = read_end(os.path.join(tmp, part_name(self.index)))
        if self.segments:
            part["segments"] = self.segments
        return part


def main(argv: list[str] | None = None) -> None:
    """Entry point of a worker process."""
    ctx_info = start("worker", argv)
    cfg = ctx_info.config
    # A service per queue group this node is a replica of (with one group: group 0 alone), each
    # with its share of the worker's limits and, with overflow_path, a folder of its own.
    groups = cfg.placement().groups_of(cfg.node_id)
    services = {group: _service(cfg, ctx_info.index, group, len(groups)) for group in groups}
    ctx = zmq.Context()
    inbox = ipc.inbox(ctx, ctx_info.run_dir, ipc.worker_name(ctx_info.index))
    coordinator = ipc.outbox(ctx, ctx_info.run_dir, "coordinator")
    acceptor = ipc.outbox(ctx, ctx_info.run_dir, "acceptor")
    for service in services.values():
        service.accepting = False  # until the coordinator has restored the queues and leads
    router = Router(cfg.workers, [(v.name, v.queue_list) for v in cfg.virtual_queue_list], cfg.dead_letter_suffix,
                    groups=cfg.queue_groups)
    ctx_info.log.info("worker %d ready", ctx_info.index)
    linger = 0
    try:
        # Each worker gives its share of queue_metrics_max queues series of their own.
        share = -(-cfg.queue_metrics_max // cfg.workers)
        worker = Worker(services, inbox, coordinator, ctx_info.log, ctx_info.index,
                        queue_metrics=QueueMetrics(share),
                        memory=_memory(cfg, services),
                        acceptor=acceptor, owns=lambda name: router.worker_for(name) == ctx_info.index)
        try:
            worker.run()
        except SystemExit:  # SIGTERM: a running cut's part is finished first, so it is not lost
            if worker.finish_writer(STOP_WAIT):
                linger = 1000  # the PART_DONE must reach the coordinator
            raise
    except KeyboardInterrupt:
        pass
    finally:
        ctx.destroy(linger=linger)


def _memory(cfg: NodeConfig, services: dict[int, PartitionService]) -> NodeMemory | HeldMemory | None:
    """What this worker measures against max_memory_mb: what it holds for its messages on a node
    with overflow (a count, which falls as messages go), else the node's resident memory."""
    if not cfg.max_memory_mb:
        return None
    if all(service.overflow is not None for service in services.values()):
        return HeldMemory(services.values(), cfg.max_memory_mb, cfg.workers)
    return NodeMemory(os.getppid(), cfg.max_memory_mb)


def _service(cfg: NodeConfig, index: int, group: int, groups: int) -> PartitionService:
    """Worker `index`'s PartitionService for queue `group`, one of the `groups` it serves."""
    overflow = None
    if cfg.overflow_path is not None:
        # The queues are rebuilt from snapshot and log: segments of an earlier run hold nothing.
        folder = worker_dir(cfg.overflow_path, index)
        files = DiskSegments(folder if group == 0 else f"{folder}-group-{group}")
        files.clear()
        overflow = Overflow(BodyBudget(worker_share(cfg.overflow_mb, cfg.workers * groups)), files)
    return PartitionService(
        node_id=cfg.node_id,
        queue_size=cfg.queue_size,
        virtual_queues={v.name: tuple(v.queue_list) for v in cfg.virtual_queue_list},
        max_wait=cfg.max_wait,
        udp_max_response=cfg.udp_max_response,
        max_deliveries=cfg.max_deliveries,
        dead_letter_suffix=cfg.dead_letter_suffix,
        max_queues=cfg.max_queues,
        queue_share=limits.queue_share(cfg.max_queues, cfg.workers * groups),
        max_memory_mb=cfg.max_memory_mb,
        undo_limit=undo.UNDO_LIMIT,
        overflow=overflow,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
