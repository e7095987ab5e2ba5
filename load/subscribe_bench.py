"""The subscribe workload of load/bench.py: consumed messages/s with push subscriptions (credit)
against a consume + confirm loop, the same Python client and the same number of connections, on
a queue filled beforehand with at-least-once messages. Each consumer confirms every message
(subscribe: on its subscription's connection, without waiting for the answer; consume: one
round trip each for consume and confirm). Latency: a consume's and a confirm's round trip (half
a pair's time), or with subscribe the wait for each next message.

    python load/bench.py --only subscribe --seconds 5
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from load.bench import latency_ms
from queue_server.client import QueueClient

FILL = 90_000  # below the default queue_size (100,000)
CREDIT = 100


def fill_queue(hosts: str, mode: str, n: int = FILL) -> None:
    """Put `n` messages in the queue of `mode` (before the clock starts)."""
    with QueueClient(hosts, timeout=30) as q:
        for i in range(0, n, 1000):
            q.produce_batch(f"bench-{mode}", [f"m{j:07d}" for j in range(i, min(n, i + 1000))], retry=60)


def _consume_loop(hosts: str, queue: str, until: float, counts: list[int], k: int, latencies: list[float]) -> None:
    with QueueClient(hosts) as q:
        while time.monotonic() < until:
            started = time.perf_counter()
            m = q.consume(queue)
            if m is None:
                return
            q.confirm(queue, m.msg_id)
            latencies.append((time.perf_counter() - started) / 2)
            counts[k] += 1


def _subscribed(hosts: str, queue: str, until: float, counts: list[int], k: int, latencies: list[float]) -> None:
    with QueueClient(hosts) as q, q.subscribe(queue, credit=CREDIT) as sub:
        stopper = threading.Timer(max(0.0, until - time.monotonic()), sub.close)  # an idle queue
        stopper.start()
        try:
            waited = time.perf_counter()
            for m in sub:
                latencies.append(time.perf_counter() - waited)
                sub.confirm(m)
                counts[k] += 1
                if time.monotonic() >= until:
                    return
                waited = time.perf_counter()
        finally:
            stopper.cancel()


def run(hosts: str, conns: int, seconds: float, mode: str, fill: int = FILL) -> dict:
    """Put `fill` messages in a queue (0: fill_queue() did), then consume it for `seconds` (or until it
    is empty) with `conns` consumers in `mode` ("consume" or "subscribe"); the figures in
    load/bench.py's row format."""
    queue = f"bench-{mode}"
    if fill:
        fill_queue(hosts, mode, fill)
    body: Callable[..., None] = _subscribed if mode == "subscribe" else _consume_loop
    counts = [0] * conns
    latencies: list[float] = []
    started = time.monotonic()
    until = started + seconds
    threads = [threading.Thread(target=body, args=(hosts, queue, until, counts, k, latencies), daemon=True)
               for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    elapsed = time.monotonic() - started
    n = sum(counts)
    return {"ops": n, "messages": n, "ops_per_s": n / elapsed, "messages_per_s": n / elapsed,
            **latency_ms(latencies), "seconds": elapsed}
