"""Bytes per message and hot-path speed of the pure Queue, in-process (no server): what a worker
(Queue) holds per stored message (a baseline's StateQueue too, the coordinator's replica until
issue 25 step 6b), by tracemalloc, and
the time of the hot paths (produce, consume, confirm, release, a replica's apply). A benchmark, not
a test.

    python load/queue_memory.py                               # 200k and 1M messages of 100 B
    git show main:workers/queue.py > /tmp/queue_before.py
    python load/queue_memory.py --baseline /tmp/queue_before.py   # the same, before and after
    python load/queue_memory.py --messages --undo             # speed with and without an undo journal

The timings run with the garbage collector's thresholds the server's processes set
(server/child.py), so that young collections are as rare as in a worker. Payload strings are made
inside the measured window, one per message as orjson makes them in a
worker, so a queue that keeps them is charged for them. `--baseline` loads another queue.py (it
must import only modules this checkout has) and measures it alternately with this one.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
import tracemalloc
from collections import deque
from types import ModuleType

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queue_server.server.child import GC_THRESHOLDS  # noqa: E402
from queue_server.workers.service import PartitionService  # noqa: E402

T0 = 1_700_000_000.0
BATCH = 1000


def load(path: str | None) -> ModuleType:
    """workers/queue.py of this checkout, or the queue.py file at `path`."""
    if path is None:
        from queue_server.workers import queue
        return queue
    spec = importlib.util.spec_from_file_location("queue_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def payload(i: int, size: int) -> str:
    return (("%08d" % i) + "x" * size)[:size]


def fill(q, n: int, size: int) -> None:
    for start in range(0, n, BATCH):
        q.produce_many([(payload(i, size), T0, T0 + 3600, 0.0, 0)
                        for i in range(start, min(n, start + BATCH))], T0)


def bytes_per_message(cls, n: int, size: int) -> float:
    """tracemalloc growth per message of a `cls` queue filled with n messages."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    q = cls("q", 10**9)
    fill(q, n, size)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del q
    gc.collect()
    return grown / n


def timings(module: ModuleType, size: int, rounds: int, out: dict[str, list[float]],
            undo: bool = False) -> None:
    """Microseconds per call of the hot paths, one list entry per round, into `out`: CPU time of
    this process, so that other load on a shared machine counts less than in wall time. `undo`:
    each queue keeps an undo journal (workers/undo.py), emptied after every call as a commit
    watermark would."""
    journal: deque = deque()

    def Queue(name: str, max_size: int):  # noqa: N802
        q = module.Queue(name, max_size)
        if undo:
            q.journal = journal
        return q
    items = [(payload(i, size), T0, T0 + 3600, 0.0, 0) for i in range(BATCH)]
    leased_items = [(d, r, t, 30.0, p) for d, r, t, _, p in items]

    def timed(name: str, fn, calls: int) -> None:
        start = time.process_time()
        for _ in range(calls):
            fn()
            journal.clear()
        out.setdefault(name, []).append((time.process_time() - start) / calls * 1e6)

    for _ in range(rounds):
        q = Queue("q", 10**9)
        data = items[0][0]
        timed("produce(1)", lambda: q.produce(data, T0, T0 + 3600, 0.0, 0, T0), 20_000)
        timed("consume(1) at most once", lambda: q.consume(T0, 1), 20_000)
        q = Queue("q", 10**9)
        timed("produce_many(1000)", lambda: q.produce_many(items, T0), 100)
        timed("consume(100) at most once", lambda: q.consume(T0, 100), 500)
        q = Queue("q", 10**9)
        for _ in range(90):
            q.produce_many(leased_items, T0)

        def consume_confirm() -> None:
            msgs, _ = q.consume(T0, 1)
            q.confirm(msgs[0].msg_id)
        timed("consume(1) leased + confirm", consume_confirm, 20_000)

        def consume_confirm_one() -> None:  # as the worker confirms: confirm_many of one
            msgs, _ = q.consume(T0, 1)
            q.confirm_many([(msgs[0].msg_id, None, msgs[0].delivery_count)])
        timed("consume(1) leased + confirm_many(1)", consume_confirm_one, 10_000)

        def consume_confirm_many() -> None:
            msgs, _ = q.consume(T0, 100, lease=30.0)
            q.confirm_many([(m.msg_id, None, None) for m in msgs])
        timed("consume(100, lease) + confirm_many", consume_confirm_many, 300)

        def consume_release() -> None:
            msgs, _ = q.consume(T0, 1, lease=30.0)
            q.release(msgs[0].msg_id, T0)
        timed("consume(1, lease) + release", consume_release, 5_000)

        def consume_release_many() -> None:
            msgs, _ = q.consume(T0, 100, lease=30.0)
            q.release_many([(m.msg_id, None, None) for m in msgs], T0)
        timed("consume(100, lease) + release_many", consume_release_many, 200)

        # A replica (a follower's worker) applying a leader's records: produces, then leased
        # batch consumes and their confirms, committed (an APPLY as a follower's worker gets it:
        # PartitionService.apply_committed, which keeps no undo entries for them).
        leader = Queue("q", 10**9)
        stream = [r for _ in range(10) for r in leader.produce_many(leased_items, T0)]
        for _ in range(100):
            msgs, recs = leader.consume(T0, 100, lease=30.0)
            stream += recs
            stream.append(leader.confirm_many([(m.msg_id, None, None) for m in msgs]))
        replica = PartitionService(1, 10**9, queue_class=module.Queue,
                                   undo_limit=10**6 if undo else None)
        timed("apply(21,000 records) on a replica",
              lambda: replica.apply_committed(stream), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, nargs="*", default=[200_000, 1_000_000],
                    help="queue sizes to measure the memory of (none: only the speed)")
    ap.add_argument("--payload", type=int, default=100, help="bytes per message")
    ap.add_argument("--baseline", help="another queue.py to measure beside this checkout's")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (the median is shown)")
    ap.add_argument("--best", action="store_true",
                    help="show the fastest round, not the median (steadier on a loaded machine)")
    ap.add_argument("--undo", action="store_true",
                    help="time this checkout with an undo journal too (the baseline: without)")
    args = ap.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)
    this = load(None)
    variants = {"baseline": load(args.baseline)} if args.baseline else {}
    if args.undo:
        variants.update({"no journal": this, "undo journal": this})
    else:
        variants["this checkout"] = this
    print(f"payload {args.payload} B, filled {BATCH} per produce_many")
    for n in args.messages:
        for label, module in variants.items():
            if label == "undo journal":
                continue  # the same memory as without
            for cls in (module.Queue, getattr(module, "StateQueue", None)):
                if cls is None:
                    continue
                print(f"{label:14} {cls.__name__:10} {n:>9,} messages: "
                      f"{bytes_per_message(cls, n, args.payload):6.1f} B/msg")
    runs: dict[str, dict[str, list[float]]] = {label: {} for label in variants}
    for _ in range(args.rounds):  # rounds alternate between the variants: a busy moment hits both
        for label, module in variants.items():
            timings(module, args.payload, 1, runs[label], undo=label == "undo journal")
    pick, how = (min, "fastest") if args.best else (statistics.median, "median")
    results = {label: {name: pick(v) for name, v in r.items()} for label, r in runs.items()}
    names = list(next(iter(results.values())))
    labels = list(results)
    print(f"{'us per call (' + how + ' of ' + str(args.rounds) + ')':40}" +
          "".join(f"{label:>16}" for label in labels) +
          "".join(f"{label + ' vs ' + labels[0]:>28}" for label in labels[1:]))
    for name in names:
        row = [results[label][name] for label in labels]
        print(f"{name:40}" + "".join(f"{v:16.1f}" for v in row) +
              "".join(f"{(v / row[0] - 1) * 100:+27.1f}%" for v in row[1:]))


if __name__ == "__main__":
    main()
