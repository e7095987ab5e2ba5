"""The TLS part of load/bench.py's security workload: produce -> consume -> confirm cycles, one
request in flight per connection, with the Python QueueClient (load/cbench.c speaks plain TCP
only), plain and over TLS, the same number of connections (one thread each). The Python client
costs more CPU than the node per request, so the ratio is an end-to-end figure for Python
clients, not the node's own TLS cost.

    python load/bench.py --only security --seconds 3
"""
from __future__ import annotations

import ssl
import threading
import time

from load.bench import latency_ms
from queue_server.client import QueueClient


def _cycles(q: QueueClient, queue: str, payload: str, until: float, counts: list[int],
            latencies: list[float], k: int) -> None:
    with q:
        while time.monotonic() < until:
            started = time.perf_counter()
            q.produce(queue, payload, retry=30)
            m = q.consume(queue)
            q.confirm(queue, m.msg_id)
            latencies.append((time.perf_counter() - started) / 3)
            counts[k] += 3


def run(hosts: str, conns: int, seconds: float, payload: int, tls: ssl.SSLContext | None) -> dict:
    """`conns` clients cycling for `seconds` (connected and warmed up first); the figures in
    load/bench.py's row format (latency: a cycle's time / 3)."""
    clients = [QueueClient(hosts, tls=tls) for _ in range(conns)]
    for k, q in enumerate(clients):  # connect (and handshake) before the clock starts
        q.monitor(f"tls-bench{k}")
    counts = [0] * conns
    latencies: list[float] = []
    started = time.monotonic()
    until = started + seconds
    threads = [threading.Thread(target=_cycles, args=(q, f"tls-bench{k}", "x" * payload, until, counts, latencies, k))
               for k, q in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    ops = sum(counts)
    return {"ops": ops, "messages": ops // 3, "seconds": elapsed, "ops_per_s": ops / elapsed,
            "messages_per_s": ops / 3 / elapsed, **latency_ms(latencies)}
