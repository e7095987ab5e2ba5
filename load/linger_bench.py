"""AsyncQueueClient's linger_ms: produces/s from 64 coroutines sharing one client, each with one
produce in flight, linger off against on, on a node of its own (in memory, loopback), and the
node's CPU time per 1000 produces (only when the script starts the node).

    python load/linger_bench.py                     # 64 coroutines, 5 s per setting
    python load/linger_bench.py --hosts 127.0.0.1:1111 --coroutines 64 --seconds 5 --linger 0 1
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from queue_server.client import AsyncQueueClient  # noqa: E402
from load.procs import own_node, tree_cpu_seconds  # noqa: E402


async def produces_per_s(hosts: str, linger_ms: float, coroutines: int,
                         seconds: float) -> tuple[float, float, int]:
    """Produces/s, the median produce latency (ms) and the produces made by `coroutines`
    closed-loop producers."""
    queue = f"linger-bench-{linger_ms:g}-{os.getpid()}"
    latencies: list[float] = []
    counts = [0] * coroutines
    async with AsyncQueueClient(hosts, linger_ms=linger_ms, timeout=30) as q:
        await q.produce(queue, "warm")
        await q.purge(queue)
        until = time.monotonic() + seconds

        async def producer(k: int) -> None:
            while time.monotonic() < until:
                started = time.perf_counter()
                await q.produce(queue, "x" * 100)
                latencies.append(time.perf_counter() - started)
                counts[k] += 1

        started = time.monotonic()
        await asyncio.gather(*(producer(k) for k in range(coroutines)))
        elapsed = time.monotonic() - started
        await q.purge(queue)
    latencies.sort()
    return sum(counts) / elapsed, latencies[len(latencies) // 2] * 1000, sum(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", help="a running node (default: start one)")
    ap.add_argument("--coroutines", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--linger", type=float, nargs="+", default=[0.0, 1.0], help="linger_ms settings to compare")
    args = ap.parse_args()
    with own_node(args.hosts, {"queue_size": 1_000_000}) as (hosts, pid):
        print(f"{args.coroutines} coroutines on one AsyncQueueClient, {args.seconds:g} s each, {hosts}")
        for linger_ms in args.linger:
            cpu = tree_cpu_seconds(pid) if pid else 0.0
            rate, p50, n = asyncio.run(produces_per_s(hosts, linger_ms, args.coroutines, args.seconds))
            node = f"   node CPU {(tree_cpu_seconds(pid) - cpu) / n * 1e6:6.1f} ms/1000 produces" if pid else ""
            print(f"linger_ms={linger_ms:<4g} {rate:>10,.0f} produces/s   p50 {p50:6.2f} ms{node}")


if __name__ == "__main__":
    main()
