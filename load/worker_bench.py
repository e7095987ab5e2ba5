"""A worker's own Python cost per request, in one process, without the other processes or
ZeroMQ's wake-ups: a real Worker (server/worker.py) around a real PartitionService, whose sends to
the coordinator and the acceptor go nowhere, is fed the REQ messages the acceptor makes for
produce -> consume -> confirm cycles on one queue per connection, and handles each as its loop
does (dispatch, then after: timers, metrics, the flush of one BATCH). A benchmark tool, not a
test: it measures what the machine's noise hides in load/bench.py's CPU us/op.

    python load/worker_bench.py                        # 8 connections: 8 requests per REQ
    python load/worker_bench.py --conns 1              # one request per REQ (one per wake-up)
    python load/worker_bench.py --profile 25           # and cProfile's top 25 by own time
    PYTHONPATH=/tmp/old-pkg python load/worker_bench.py  # another version (see coordinator_bench.py)

Prints CPU microseconds per request (the median of --rounds, each on a fresh worker).
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
import time  # noqa: E402

import orjson  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from load.options import number_options  # noqa: E402
from queue_server.protocol import ipc_frames, replies  # noqa: E402
from queue_server.protocol.origin import Origin  # noqa: E402
from queue_server.server.child import GC_THRESHOLDS  # noqa: E402
from queue_server.server.metrics import WorkerMetrics  # noqa: E402
from queue_server.server.worker import Worker  # noqa: E402
from queue_server.workers import undo  # noqa: E402
from queue_server.workers.service import PartitionService  # noqa: E402

PAYLOAD = "0123456789abcdef" * 4  # load/bench.py's 64 bytes


class Sink:
    """An outbox that keeps only the last message it is given."""

    def __init__(self) -> None:
        self.last: list[bytes] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.last = frames


def round_of(conns: int, cycles: int, profiler: cProfile.Profile | None) -> float:
    """CPU seconds per request of `cycles` cycles on a fresh leading worker."""
    service = PartitionService(node_id=1, queue_size=1_000_000, undo_limit=undo.UNDO_LIMIT)
    coordinator = Sink()
    services = {0: service} if hasattr(Worker, "service_of") else service  # an older version took one service
    worker = Worker(services, None, coordinator, logging.getLogger("worker"),
                    metrics=WorkerMetrics(CollectorRegistry()), acceptor=Sink())
    worker.dispatch(ipc_frames.mode_frames(True, 1), time.time())
    queues = [f"bench{i}" for i in range(conns)]
    req_no = 0
    ids: list[int] = []
    used = 0.0
    for cycle in range(cycles):
        if cycle % 100 == 0:  # as the coordinator's COMMITTED: the undo journal forgets
            worker.dispatch(ipc_frames.committed_frames(1, service.seq), time.time())
        for action in (1, 2, 3):
            requests = [{"action": 1, "queue": q, "retry": 30, "data": PAYLOAD} if action == 1 else
                        {"action": 2, "queue": q} if action == 2 else
                        {"action": 3, "queue": q, "msg_id": ids[i]} for i, q in enumerate(queues)]
            frames = ipc_frames.req_frames([ipc_frames.req_item(Origin(i + 1), req_no, r)
                                            for i, r in enumerate(requests)], 1)
            req_no += 1
            if profiler:
                profiler.enable()
            started = time.process_time()
            worker.dispatch(frames, time.time())
            worker.after()
            used += time.process_time() - started
            if profiler:
                profiler.disable()
            if action == 2:
                batch = ipc_frames.read_batch(coordinator.last)  # (group, records, header, ...) parts now
                _, header, blob, *_ = batch[0][1:] if isinstance(batch, list) else batch
                ids = [orjson.loads(data)["msg_id"] for _, _, data in replies.decode(header, blob)]
    return used / (cycles * 3 * conns)


def main(argv: list[str] | None = None) -> None:
    parser = number_options(__doc__, conns=(8, "connections: requests per REQ, each on its own queue"),
                            cycles=(2000, "produce/consume/confirm cycles per round"),
                            rounds=(5, "rounds, each on a fresh worker; the median is printed"))
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N functions by own time")
    args = parser.parse_args(argv)
    import queue_server.server.worker as worker_module
    print(f"code: {os.path.dirname(os.path.dirname(worker_module.__file__))}")
    gc.set_threshold(*GC_THRESHOLDS)  # as every child of the node sets it
    profiler = cProfile.Profile() if args.profile else None
    results = [round_of(args.conns, args.cycles, profiler) for _ in range(args.rounds)]
    print(f"{args.conns} request(s) per REQ, {args.cycles} cycles a round")
    print(f"CPU us per request: median {statistics.median(results) * 1e6:.2f} "
          f"(rounds: {', '.join(f'{r * 1e6:.2f}' for r in results)})")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
