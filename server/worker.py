"""A worker process: receives request batches for the queue partitions it owns, runs them
through its PartitionService, and sends the records and replies of each batch to the coordinator
in one message; the replies that rest on no record (PartitionService.direct) go straight to the
acceptor."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import zmq

from queue_server.server import ipc
from queue_server.protocol import ipc_frames, limits, replies
from queue_server.server.child import start
from queue_server.server.metrics import WorkerMetrics
from queue_server.server.reply_counts import count_replies
from queue_server.server.node_memory import NodeMemory
from queue_server.server.queue_metrics import QueueMetrics
from queue_server.workers import undo
from queue_server.workers.service import PartitionService


class Worker:
    """The I/O around one PartitionService."""

    def __init__(self, service: PartitionService, inbox: zmq.Socket | None, coordinator: Any, log: Any,
                 index: int = 0, metrics: WorkerMetrics | None = None,
                 queue_metrics: QueueMetrics | None = None, memory: NodeMemory | None = None,
                 acceptor: Any = None) -> None:
        """coordinator, acceptor: anything with send_multipart (a ZeroMQ PUSH socket, or a test's
        pipe); with no acceptor every reply goes through the coordinator.
        memory: the node's memory, read every MEMORY_CHECK_INTERVAL to refuse produces past
        max_memory_mb (None: not read)."""
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
        self.undone = 0  # records the last MODE rolled back
        self.rollbacks = 0  # MODEs that rolled records back

    def run(self) -> None:
        """Serve until terminated."""
        service = self.service
        ipc.serve(
            self.inbox,
            lambda frames: self.dispatch(frames, time.time()),
            lambda: service.next_deadline(time.time()) - time.time(),
            self.after,
        )

    def after(self) -> None:
        """Run timers, then send on what the service produced."""
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
            for record in ipc_frames.read_apply(frames):
                service.apply(record)
            if ipc_frames.apply_committed(frames):
                service.trim(service.seq)  # committed: never undone
        elif kind == ipc_frames.COMMITTED:
            epoch, seq = ipc_frames.read_committed(frames)
            if epoch == self.epoch:
                service.trim(seq)
        elif kind == ipc_frames.MODE:
            # What was decided under the old mode leaves stamped with it (the coordinator refuses
            # changes from a mode that is over, and the rollback below undoes them here).
            self.flush()
            accepting, self.epoch, keep_through, _trans_id = ipc_frames.read_mode(frames)
            if keep_through is not None and service.journal is not None:
                self.undone = service.rollback(keep_through)
                self.rollbacks += self.undone > 0
            service.set_mode(accepting)
            self.fences.clear()
            held, self.held = self.held, []
            for message in held:
                self.dispatch(message, now)
        elif kind == ipc_frames.RESET:
            service.load_snapshot(ipc_frames.read_reset(frames))
        elif kind == ipc_frames.DRAIN:
            service.draining = True
        else:
            self.log.warning("unknown message kind %r", kind)

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
            self.coordinator.send_multipart(ipc_frames.fenced_frames(epoch, self.index))

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
        self.coordinator.send_multipart(ipc_frames.batch_frames(changes, header, blob, partials, self.epoch,
                                                                self.index))


def main(argv: list[str] | None = None) -> None:
    """Entry point of a worker process."""
    ctx_info = start("worker", argv)
    cfg = ctx_info.config
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
    )
    ctx = zmq.Context()
    inbox = ipc.inbox(ctx, ctx_info.run_dir, ipc.worker_name(ctx_info.index))
    coordinator = ipc.outbox(ctx, ctx_info.run_dir, "coordinator")
    acceptor = ipc.outbox(ctx, ctx_info.run_dir, "acceptor")
    service.accepting = False  # until the coordinator has restored the queues and leads
    ctx_info.log.info("worker %d ready", ctx_info.index)
    try:
        # Each worker gives its share of queue_metrics_max queues series of their own.
        share = -(-cfg.queue_metrics_max // cfg.workers)
        Worker(service, inbox, coordinator, ctx_info.log, ctx_info.index,
               queue_metrics=QueueMetrics(share),
               memory=NodeMemory(os.getppid()) if cfg.max_memory_mb else None,
               acceptor=acceptor).run()
    except KeyboardInterrupt:
        pass
    finally:
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main(sys.argv[1:])
