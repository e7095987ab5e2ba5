"""Produce and consume speed of the pure Queue with every body in memory and with every body
overflowed to real segment files (issue 26), in-process (no server). A benchmark, not a test.

    python load/overflow_bench.py                       # 100k messages of 100 B, 3 rounds
    python load/overflow_bench.py --messages 1000000 --payload 1000 --dir /mnt/disk
    python load/overflow_bench.py --messages 1000000 --memory   # bytes a message, not speed

Each round fills a queue with produce_many(1000), consumes half of it one at a time (a FIFO
stream: the overflow reads ahead) and the rest 100 at a time (one read per run of bodies), and
checks every body came back in order. Microseconds of CPU per message (this process: steadier than
wall time on a shared machine; the segment writes and reads are mostly page cache). With
--memory, what a stored message costs the queue instead (tracemalloc growth per message, its body
included when in memory), every body on disk and every body in memory.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from load import queue_memory  # noqa: E402
from queue_server.server.overflow_files import DiskSegments  # noqa: E402
from queue_server.workers.body_budget import BodyBudget  # noqa: E402
from queue_server.workers.overflow import Overflow  # noqa: E402
from queue_server.workers.queue import Queue  # noqa: E402

T0 = 1_700_000_000.0


def one_round(n: int, payload: int, where: str | None) -> tuple[float, float, float]:
    """(produce_many, consume(1), consume(100)) in us per message; `where`: overflow to there."""
    q = Queue("q", 10**9)
    tmp = None
    if where is not None:
        tmp = tempfile.mkdtemp(dir=where)
        q._index.attach(Overflow(BodyBudget(0), DiskSegments(tmp)))
    items = [("x" * max(payload - 10, 0) + f"{i:010d}", T0, T0 + 3600, 0.0, 0) for i in range(n)]
    try:
        started = time.process_time()
        for k in range(0, n, 1000):
            q.produce_many(items[k:k + 1000], T0)
        produce = (time.process_time() - started) / n * 1e6
        got: list[str] = []
        started = time.process_time()
        for _ in range(n // 2):
            got.append(q.consume(T0, 1)[0][0].data)
        single = (time.process_time() - started) / (n // 2) * 1e6
        started = time.process_time()
        while len(got) < n:
            got += [m.data for m in q.consume(T0, 100)[0]]
        batch = (time.process_time() - started) / (n - n // 2) * 1e6
        assert got == [d for d, *_ in items], "a body came back wrong"
        return produce, single, batch
    finally:
        if tmp is not None:
            shutil.rmtree(tmp)


def bytes_per_message(n: int, payload: int, where: str, share: int) -> float:
    """load/queue_memory.py's tracemalloc growth per message of a queue filled with n messages,
    its bodies past `share` bytes overflowed to `where`."""
    tmp = tempfile.mkdtemp(dir=where)

    def overflowing(name: str, size: int) -> Queue:
        q = Queue(name, size)
        q._index.attach(Overflow(BodyBudget(share), DiskSegments(tmp)))
        return q
    try:
        return queue_memory.bytes_per_message(overflowing, n, payload)
    finally:
        shutil.rmtree(tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--payload", type=int, default=100, help="bytes per message")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the segments go")
    ap.add_argument("--memory", action="store_true", help="bytes a stored message, not speed")
    args = ap.parse_args()
    if args.memory:
        for label, share in (("on disk", 0), ("in memory", 1 << 62)):
            print(f"{args.messages:,} messages of {args.payload} B, every body {label}: "
                  f"{bytes_per_message(args.messages, args.payload, args.dir, share):.1f} B a message")
        return
    print(f"{args.messages:,} messages of {args.payload} B; us per message (fastest of {args.rounds})")
    runs: dict[str, list[tuple[float, float, float]]] = {"in memory": [], "overflowed": []}
    for _ in range(args.rounds):  # alternating: a busy moment of the machine hits both
        runs["in memory"].append(one_round(args.messages, args.payload, None))
        runs["overflowed"].append(one_round(args.messages, args.payload, args.dir))
    print(f"{'':12}{'produce_many':>14}{'consume(1)':>12}{'consume(100)':>14}")
    for label, rows in runs.items():
        best = [min(col) for col in zip(*rows)]
        print(f"{label:12}{best[0]:14.2f}{best[1]:12.2f}{best[2]:14.2f}")


if __name__ == "__main__":
    main()
