"""Latency of requests that change nothing, one at a time on one connection (QueueClient): an
empty consume, a monitor of one queue and a refused field, on a node of its own (in memory,
loopback). Each row: the median and p90 latency in microseconds of `--requests` requests.

    python load/read_latency.py                      # 2,000 requests of each kind
    python load/read_latency.py --hosts 127.0.0.1:1111 --requests 2000 --repeat 3
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from queue_server.client import QueueClient  # noqa: E402
from queue_server.client.errors import QueueError  # noqa: E402
from load.options import number_options  # noqa: E402
from load.procs import own_node  # noqa: E402


def _refused(q: QueueClient, queue: str) -> None:
    with contextlib.suppress(QueueError):
        q.request({"action": "consume", "queue": queue, "count": 0})


KINDS: dict[str, Callable[[QueueClient, str], object]] = {
    "empty consume": lambda q, queue: q.consume(queue),
    "monitor": lambda q, queue: q.monitor(queue),
    "refused field": _refused,
}


def latencies_us(q: QueueClient, call: Callable[[QueueClient, str], object], queue: str, n: int) -> list[float]:
    """The latency of each of `n` calls, one at a time, in microseconds."""
    for _ in range(100):  # warm up
        call(q, queue)
    out = []
    for _ in range(n):
        started = time.perf_counter()
        call(q, queue)
        out.append((time.perf_counter() - started) * 1e6)
    return out


def main() -> None:
    parser = number_options(__doc__, requests=2000, repeat=(1, "rounds; each row reports the median of the rounds"))
    parser.add_argument("--hosts", help="a running node (default: start one, in memory)")
    args = parser.parse_args()
    queue = f"read-latency-{os.getpid()}"
    rounds: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    with own_node(args.hosts) as (hosts, _pid), QueueClient(hosts) as q:
        for _ in range(args.repeat):
            for kind, call in KINDS.items():
                got = sorted(latencies_us(q, call, queue, args.requests))
                rounds[kind].append((got[len(got) // 2], got[len(got) * 9 // 10]))
    for kind, results in rounds.items():
        p50 = statistics.median(r[0] for r in results)
        p90 = statistics.median(r[1] for r in results)
        print(f"{kind:15s} p50 {p50:7.1f} us  p90 {p90:7.1f} us  ({args.repeat} x {args.requests})")


if __name__ == "__main__":
    main()
