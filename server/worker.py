"""A worker process: receives request batches for the queue partitions it owns, runs them
through its PartitionService, and sends the records and replies of each batch to the coordinator
in one message; the replies that rest on no record (PartitionService.direct) go straight to the
acceptor. On SNAP it forks the writer of its snapshot part (server/snapshot_child.py) and says
when that is done (PART_DONE)."""
from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq

from queue_server.server import ipc
from queue_server.protocol import ipc_frames, limits, replies
from queue_server.replication.snapshot import iter_frames, read_end
from queue_server.server.child import start
from queue_server.server.router import Router
from queue_server.server.snapshot_child import exit_reason, fork_writer, part_name
from queue_server.server.snapshots import STOP_WAIT
from queue_server.server.metrics import WorkerMetrics
from queue_server.server.reply_counts import count_replies
from queue_server.server.node_memory import NodeMemory
from queue_server.server.overflow_files import DiskSegments, PartSegments, link_segments, worker_dir
from queue_server.server.queue_metrics import QueueMetrics
from queue_server.workers import undo
from queue_server.workers.body_budget import BodyBudget, worker_share
from queue_server.workers.overflow import Overflow
from queue_server.workers.service import PartitionService


# While a snapshot writer runs, the worker looks whether it has ended at least this often (s).
WRITER_POLL = 0.05


class Worker:
    """The I/O around one PartitionService."""

    def __init__(self, service: PartitionService, inbox: zmq.Socket | None, coordinator: Any, log: Any,
                 index: int = 0, metrics: WorkerMetrics | None = None,
                 queue_metrics: QueueMetrics | None = None, memory: NodeMemory | None = None,
                 acceptor: Any = None, owns: Callable[[str], bool] | None = None,
                 write_inline: Callable[[PartitionService, str, int], None] | None = None) -> None:
        """coordinator, acceptor: anything with send_multipart (a ZeroMQ PUSH socket, or a test's
        pipe); with no acceptor every reply goes through the coordinator.
        memory: the node's memory, read every MEMORY_CHECK_INTERVAL to refuse produces past
        max_memory_mb (None: not read).
        owns: whether a queue is this worker's (its Router's say), for LOAD (None: every queue).
        write_inline: writes a snapshot part in this process instead of a forked child
        (snapshot_child.write_part_inline; the node sim), None: fork."""
        self.service = service
        self.inbox = inbox
        self.coordinator = coordinator
        self.acceptor = acceptor
        self.log = log
        self.epoch = 0  # of the last mode change received (see ClusterNode.epoch)
        self.held: list[list[bytes]] = []
        self.fences: set[bytes] = set()  # who fenced the current mode (ipc_frames FENCE)
        self.index = index
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.queue_metrics = queue_metrics
        self.memory = memory
        self.next_memory_check = 0.0
        self.overflow_refused: str | None = None  # the overflow disk's refusal last logged
        self.torn_logged: set[int] = set()  # overflow segments with unreadable bodies, logged
        self.undone = 0  # records the last MODE rolled back
        self.rollbacks = 0  # MODEs that rolled records back
        self.owns = owns
        # A snapshot cut (ipc_frames SNAP): the writer child (pid, cut id, tmp dir), and while the
        # cut holds this worker's output, what it would have sent the coordinator.
        self.writer: tuple[int, int, str] | None = None
        self.out_held: list[list[bytes]] | None = None
        self.hold_cut = 0
        self.segments: list[list[int]] = []  # the overflow segments the running cut's part refers to
        self.write_inline = write_inline

    def run(self) -> None:
        """Serve until terminated."""
        service = self.service
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
        wait = self.service.next_deadline(now) - now
        return wait if self.writer is None else min(wait, WRITER_POLL)

    def after(self) -> None:
        """Run timers, then send on what the service produced."""
        if self.writer is not None:
            self.reap()
        now = time.time()
        self.service.tick(now)
        self.flush()
        clock = time.monotonic()
        if self.memory is not None and clock >= self.next_memory_check:
            self.next_memory_check = clock + limits.MEMORY_CHECK_INTERVAL
            resident = self.memory.resident_bytes(clock)
            full = limits.over_memory(resident, self.service.max_memory_mb)
            if full != self.service.memory_full:
                self.service.memory_full = full
                self.log.warning("node memory %d MiB is %s max_memory_mb (%d): produces are %s",
                                 resident >> 20, "over" if full else "back under",
                                 self.service.max_memory_mb, "refused" if full else "served again")
        overflow = self.service.overflow
        if overflow is not None and overflow.refused != self.overflow_refused:
            self.overflow_refused = overflow.refused
            if overflow.refused is not None:
                self.log.warning("%s: produces that need it are refused until it takes writes again", overflow.refused)
            else:
                self.log.warning("overflow disk %s takes writes again", overflow.files.where)
        if overflow is not None and len(overflow.torn) > len(self.torn_logged):
            for seg in overflow.torn.keys() - self.torn_logged:  # one line a segment
                self.torn_logged.add(seg)
                self.log.error("overflow segment %d in %s holds bodies that fail their check (torn or overwritten): "
                               "their messages go the dead-letter way, reason 'body unreadable'", seg, overflow.files.where)
        if self.metrics.due(clock):
            self.metrics.fold(lambda: self.service._totals(now), self.service.limit_refusals)
            if self.queue_metrics is not None:
                self.queue_metrics.maybe_fold(lambda: self.service.queue_rows(now))

    def dispatch(self, frames: list[bytes], now: float) -> None:
        """Handle one inbox message."""
        kind = frames[0]
        service = self.service
        if kind == ipc_frames.REQ:
            if ipc_frames.req_epoch(frames) > self.epoch:
                # Sent after a mode change this worker has not received yet (it comes from the
                # coordinator on another pipe): hold it until then.
                self.held.append(frames)
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
        elif kind == ipc_frames.FENCE:
            epoch, sender = ipc_frames.read_fence(frames)
            if epoch > self.epoch:
                self.held.append(frames)  # behind the held requests it fences
            else:
                self.fence(epoch, sender)
        elif kind == ipc_frames.CLOSE:
            service.cancel(ipc_frames.read_close(frames))
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
            if epoch == self.epoch:
                service.trim(seq)
        elif kind == ipc_frames.MODE:
            # What was decided under the old mode leaves stamped with it (the coordinator refuses
            # changes from a mode that is over, and the rollback below undoes them here).
            self.flush()
            self.release()  # a cut ends with the mode
            accepting, self.epoch, keep_through, _trans_id = ipc_frames.read_mode(frames)
            if keep_through is not None and service.journal is not None:
                self.undone = service.rollback(keep_through)
                self.rollbacks += self.undone > 0
            service.set_mode(accepting)
            self.fences.clear()
            held, self.held = self.held, []
            for message in held:
                self.dispatch(message, now)
        elif kind == ipc_frames.SYNC:
            self.send(ipc_frames.synced_frames(*ipc_frames.read_sync(frames), self.index))
        elif kind == ipc_frames.SNAP:
            self.snap(*ipc_frames.read_snap(frames))
        elif kind == ipc_frames.RELEASE:
            if ipc_frames.read_release(frames) == self.hold_cut:
                self.release()
        elif kind == ipc_frames.LOAD:
            self.load(*ipc_frames.read_load(frames))
        elif kind == ipc_frames.DRAIN:
            service.draining = True
        else:
            self.log.warning("unknown message kind %r", kind)

    def load(self, trans_id: int, parts: list[str]) -> None:
        """Replace the queues with those of the snapshot parts at trans_id that this worker owns.
        A part that cannot be read now (it was checked at start) stops the worker, and so the node,
        in one line: the next start checks the parts again and falls back to an older snapshot."""
        started = time.monotonic()
        segments = PartSegments(self.service.overflow)
        frames = itertools.chain.from_iterable(segments.frames(path, iter_frames(path, trans_id)) for path in parts)
        try:
            self.service.load_frames(frames, self.owns)
            segments.adopt()
        except (OSError, ValueError) as exc:
            self.log.error("cannot load the snapshot at trans_id %d: %s; stopping", trans_id, exc)
            sys.exit(4)
        queues = self.service.queues
        self.log.info("worker %d loaded %d queues holding %d messages from the snapshot at trans_id %d in %.2f s",
                      self.index, len(queues), sum(map(len, queues.values())), trans_id,
                      time.monotonic() - started)

    def fence(self, epoch: int, sender: bytes) -> None:
        """A sender of requests sends none more in mode `epoch`. Once both have said so (the
        node is handing leadership over), every request of the mode has been served: send the
        batch, decide nothing more (PartitionService.fence: no long poll served, no lease swept;
        the parked ones kept for the next mode) until the next mode, and tell the coordinator
        (FENCED), after the batch on the same pipe."""
        if epoch != self.epoch:
            return  # a mode that is over: its changes were wiped or refused already
        self.fences.add(sender)
        if self.fences >= ipc_frames.FENCE_SENDERS:
            self.flush()
            self.service.fence()
            self.send(ipc_frames.fenced_frames(epoch, self.index))

    def flush(self) -> None:
        """Send what the service produced since the last flush: the replies that rest on no
        record to the acceptor in one REP, the rest to the coordinator in one BATCH."""
        service = self.service
        for exc in service.errors:
            self.log.error("request failed: %r", exc, exc_info=exc)
        service.errors.clear()
        if service.direct:
            if self.acceptor is None:
                service.replies.extend(service.direct)
            else:
                count_replies(self.metrics.counts, service.direct)
                self.acceptor.send_multipart(ipc_frames.rep_frames(*replies.encode(service.direct)))
            service.direct.clear()
        if not (service.replies or service.records or service.partials):
            return
        count_replies(self.metrics.counts, service.replies)
        if service.partials:
            self.metrics.count_partials(service.partials, self.index)
        header, blob = replies.encode(service.replies)
        changes = ipc_frames.records_list(service.records)
        partials = ipc_frames.json_list(service.partials)
        service.replies.clear()
        service.records.clear()
        service.partials.clear()
        self.send(ipc_frames.batch_frames(changes, header, blob, partials, self.epoch, self.index))

    def send(self, frames: list[bytes]) -> None:
        """To the coordinator, or into the hold of a snapshot cut."""
        if self.out_held is None:
            self.coordinator.send_multipart(frames)
        else:
            self.out_held.append(frames)

    # ----------------------------------------------------------------- snapshots
    def snap(self, epoch: int, cut_id: int, tmp: str, hold: bool) -> None:
        """Snapshot cut `cut_id`: send what was decided so far, fork the writer of this worker's
        part into `tmp`, say so (SNAPPED, on the same pipe: every earlier batch is ahead of it);
        with `hold`, keep what is decided from now on until the cut says (RELEASE, or MODE)."""
        self.flush()
        self.release()
        if self.writer is not None:  # an older cut's writer: that cut is over (one runs at a time)
            self.end_writer(kill=True)
        try:  # the part refers to the overflowed bodies in these (linked before anything changes)
            self.segments = link_segments(self.service.overflow, tmp, part_name(self.index))
        except OSError as exc:
            self.send(ipc_frames.snapped_frames(epoch, cut_id, self.index))
            self.send(ipc_frames.part_done_frames(cut_id, self.index, False, {"error": str(exc)}))
            return
        if self.write_inline is not None:
            self.send(ipc_frames.snapped_frames(epoch, cut_id, self.index))
            try:
                self.write_inline(self.service, tmp, self.index)
                part = self._part_entry(tmp)
            except (OSError, ValueError) as exc:
                part = {"error": str(exc)}
            self.send(ipc_frames.part_done_frames(cut_id, self.index, "error" not in part, part))
            if hold:
                self.out_held, self.hold_cut = [], cut_id
            return
        pid = fork_writer(self.service, tmp, self.index)
        self.writer = (pid, cut_id, tmp)
        self.send(ipc_frames.snapped_frames(epoch, cut_id, self.index))
        if hold:
            self.out_held, self.hold_cut = [], cut_id

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
        _, cut_id, tmp = self.writer  # type: ignore[misc]
        self.writer = None
        code = os.waitstatus_to_exitcode(status)
        if code != 0:  # the coordinator says it in its line on the failed cut
            part = {"error": exit_reason(code)}
        else:
            try:
                part = self._part_entry(tmp)
            except (OSError, ValueError) as exc:
                part = {"error": str(exc)}
        self.send(ipc_frames.part_done_frames(cut_id, self.index, "error" not in part, part))

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
    overflow = None
    if cfg.overflow_path is not None:
        # The queues are rebuilt from snapshot and log: segments of an earlier run hold nothing.
        files = DiskSegments(worker_dir(cfg.overflow_path, ctx_info.index))
        files.clear()
        overflow = Overflow(BodyBudget(worker_share(cfg.overflow_mb, cfg.workers)), files)
    service = PartitionService(
        node_id=cfg.node_id,
        queue_size=cfg.queue_size,
        virtual_queues={v.name: tuple(v.queue_list) for v in cfg.virtual_queue_list},
        max_wait=cfg.max_wait,
        udp_max_response=cfg.udp_max_response,
        max_deliveries=cfg.max_deliveries,
        dead_letter_suffix=cfg.dead_letter_suffix,
        max_queues=cfg.max_queues,
        queue_share=limits.queue_share(cfg.max_queues, cfg.workers),
        max_memory_mb=cfg.max_memory_mb,
        undo_limit=undo.UNDO_LIMIT,
        overflow=overflow,
    )
    ctx = zmq.Context()
    inbox = ipc.inbox(ctx, ctx_info.run_dir, ipc.worker_name(ctx_info.index))
    coordinator = ipc.outbox(ctx, ctx_info.run_dir, "coordinator")
    acceptor = ipc.outbox(ctx, ctx_info.run_dir, "acceptor")
    service.accepting = False  # until the coordinator has restored the queues and leads
    router = Router(cfg.workers, [(v.name, v.queue_list) for v in cfg.virtual_queue_list], cfg.dead_letter_suffix)
    ctx_info.log.info("worker %d ready", ctx_info.index)
    linger = 0
    try:
        # Each worker gives its share of queue_metrics_max queues series of their own.
        share = -(-cfg.queue_metrics_max // cfg.workers)
        worker = Worker(service, inbox, coordinator, ctx_info.log, ctx_info.index,
                        queue_metrics=QueueMetrics(share),
                        memory=NodeMemory(os.getppid()) if cfg.max_memory_mb else None,
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


if __name__ == "__main__":
    main(sys.argv[1:])
