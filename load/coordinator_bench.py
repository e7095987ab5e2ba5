"""The coordinator's own Python cost per worker batch, in one process, without the other
processes or ZeroMQ's wake-ups: a real Coordinator (server/coordinator.py) with its Storage in a
temporary data dir, whose sends to the workers and the acceptor go nowhere, is fed the BATCH
messages a real PartitionService makes for produce -> consume -> confirm cycles, and carries each
out (dispatch, then flush: the change log, the WAL, the commit, the replies); with --drain N, N
batches at a time, as the coordinator's loop takes the batches it drains together
(Coordinator.dispatch_batches). A benchmark tool,
not a test: it measures what the machine's noise hides in load/bench.py's CPU us/op.

    python load/coordinator_bench.py                        # 1 message per request, fsync everysec
    python load/coordinator_bench.py --count 100 --rounds 3 # 100 messages per request (batched)
    python load/coordinator_bench.py --requests 16          # 16 requests per worker batch (pipelined)
    python load/coordinator_bench.py --requests 2 --drain 2 # 2 batches taken per wake-up, as at 8 connections
    python load/coordinator_bench.py --profile 20           # and cProfile's top 20 by own time
    PYTHONPATH=/tmp/old-pkg python load/coordinator_bench.py  # another version (a package tree)

Prints microseconds per batch and per request (the median of --rounds), and where the code came from.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0]) == HERE:
    del sys.path[0]  # load/profile.py would stand in for the standard library's (cProfile imports it)
sys.path.append(os.path.dirname(HERE))  # for load/: after PYTHONPATH, which may name another version

import cProfile  # noqa: E402
import gc  # noqa: E402
import logging  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import orjson  # noqa: E402
import zmq  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from load.options import number_options  # noqa: E402
from queue_server.config.loader import parse_config  # noqa: E402
from queue_server.protocol import ipc_frames, replies  # noqa: E402
from queue_server.protocol.origin import Origin  # noqa: E402
from queue_server.replication.storage import Storage  # noqa: E402
from queue_server.server import coordinator as coordinator_module  # noqa: E402
from queue_server.server.coordinator import Coordinator  # noqa: E402
from queue_server.server.metrics import CoordinatorMetrics  # noqa: E402
from queue_server.workers.service import PartitionService  # noqa: E402


class Sink:
    """An outbox that drops what it is given."""

    def send_multipart(self, frames: list[bytes]) -> None:
        pass


def batches(cycles: int, count: int, per_batch: int) -> list[list[bytes]]:
    """The BATCH messages of `cycles` produce -> consume -> confirm cycles of `count` messages
    each (epoch 1), `per_batch` requests of one kind in each batch, as one worker makes them."""
    service = PartitionService(1, 1_000_000)
    service.accepting = True
    data = "x" * 64
    out = []
    now = 1000.0
    lanes = [f"q{i}" for i in range(per_batch)]

    def flush() -> None:
        header, blob = replies.encode(service.replies)
        out.append(ipc_frames.batch_frames(ipc_frames.records_list(service.records), header, blob,
                                           ipc_frames.json_list(service.partials), 1))
        service.replies.clear()
        service.records.clear()
        service.partials.clear()

    conn = 0
    for _ in range(cycles):
        for q in lanes:
            conn += 1
            service.handle({"action": 1, "queue": q, "retry": 30, "data": data if count == 1 else [data] * count},
                           Origin(conn), 1, now)
        flush()
        ids = {}
        for q in lanes:
            service.handle({"action": 2, "queue": q} if count == 1 else {"action": 2, "queue": q, "count": count},
                           Origin(conn), 2, now)
            reply = orjson.loads(service.replies[-1][2]) if isinstance(service.replies[-1][2], bytes) else service.replies[-1][2]
            ids[q] = [m["msg_id"] for m in reply["messages"]] if "messages" in reply else [reply["msg_id"]]
        flush()
        for q in lanes:
            confirm = {"action": 3, "queue": q, "msg_id": ids[q][0]} if count == 1 else \
                {"action": 3, "queue": q, "msg_ids": ids[q]}
            service.handle(confirm, Origin(conn), 3, now)
        flush()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = number_options(__doc__, cycles=(3000, "produce/consume/confirm cycles per round"),
                            count=(1, "messages per request"), requests=(1, "requests per worker batch"),
                            rounds=(5, "rounds, each on a fresh node; the median is printed"),
                            drain=(1, "worker batches taken per wake-up (flush)"))
    parser.add_argument("--fsync", default="everysec", help="the node's fsync (default everysec)")
    parser.add_argument("--in-memory", action="store_true", help="no data dir (no WAL)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N functions by own time")
    args = parser.parse_args(argv)
    # A registry per coordinator: the default one takes each metric once per process.
    coordinator_module.CoordinatorMetrics = lambda **kw: CoordinatorMetrics(CollectorRegistry(), **kw)  # type: ignore[misc]
    import queue_server.server.cluster as cluster
    print(f"code: {os.path.dirname(os.path.dirname(cluster.__file__))}")
    work = batches(args.cycles, args.count, args.requests)
    gc.set_threshold(100_000, 50, 100_000)  # as server/child.py's start sets it in every child
    logging.basicConfig(level=logging.WARNING)
    log = logging.getLogger("coordinator")
    results = []
    profiler = cProfile.Profile() if args.profile else None
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="coord-bench-") as tmp:
            cfg, _ = parse_config(orjson.dumps({"port": 1, "workers": 1, "fsync": args.fsync,
                                                "in_memory": args.in_memory,
                                                "queue_data_dir": os.path.join(tmp, "data")}).decode())
            storage = None if args.in_memory else Storage(cfg.queue_data_dir, cfg.fsync, log=log)
            ctx = zmq.Context()
            try:
                c = Coordinator(cfg, ctx, tmp, log, storage)
                c.workers = [Sink()]
                c.acceptor = Sink()
                node = c.node
                now = time.time()
                node.tick(now)
                c.flush()
                while node.leader is None:  # a single node elects itself on its first timeout
                    now = node.wake_at() + 0.001
                    node.tick(now)
                    c.flush()
                epoch = node.epoch
                # The epoch: the last frame (a BATCH of one group), frame 5 of an older version's.
                at = 5 if len(work[0]) == 7 else len(work[0]) - 1
                msgs = [[*m[:at], b"%d" % epoch, *m[at + 1:]] for m in work]
                if profiler:
                    profiler.enable()
                started = time.process_time()
                for i in range(0, len(msgs), args.drain):
                    drained = msgs[i:i + args.drain]
                    if len(drained) > 1 and hasattr(c, "dispatch_batches"):  # an older version has not
                        c.dispatch_batches(drained, now)
                    else:
                        for m in drained:
                            c.dispatch(m, now)
                    c.flush()
                used = time.process_time() - started
                if profiler:
                    profiler.disable()
                results.append(used / len(msgs))
                pending = getattr(node, "first", node).pending  # its first group's, since the split (issue 28)
                if len(pending):
                    sys.exit(f"coordinator_bench: {len(pending)} reply batches still pending")
            finally:
                ctx.destroy(linger=0)
                if storage is not None:
                    storage.close()
    per_batch = statistics.median(results) * 1e6
    print(f"{len(work)} batches a round, {args.drain} per flush, {args.requests} request(s) of {args.count} message(s) each, "
          f"fsync {'(in memory)' if args.in_memory else args.fsync}")
    print(f"CPU us per batch: median {per_batch:.2f} (rounds: {', '.join(f'{r * 1e6:.2f}' for r in results)}); "
          f"per request {per_batch / args.requests:.2f}")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
