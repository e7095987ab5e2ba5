"""A workload that records its history, and a checker in the style of Jepsen's total-queue:
every acknowledged produce of an at-least-once message is consumed at least once, nothing is
consumed that was never produced, and no at-most-once message is delivered twice."""
from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from datetime import datetime

from queue_server.client import QueueClient, QueueError
from tests.harness import wait_for

AT_LEAST_ONCE = "alo"
AT_MOST_ONCE = "amo"


class History:
    """What clients attempted, what was acknowledged, and what was delivered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempted: set[str] = set()
        self.acked: dict[str, set[str]] = {AT_LEAST_ONCE: set(), AT_MOST_ONCE: set()}
        self.delivered: dict[str, list[str]] = {AT_LEAST_ONCE: [], AT_MOST_ONCE: []}
        self.errors: Counter = Counter()  # the client errors seen, by the start of their reason
        self.error_texts: list[str] = []  # the first few in full, with when they came

    def error(self, exc: QueueError) -> None:
        """Count a client error (the caller holds the lock)."""
        self.errors[exc.reason.split(":")[0]] += 1
        if len(self.error_texts) < 10:
            self.error_texts.append(f"{datetime.now():%H:%M:%S.%f} {exc.reason}")

    def acked_count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def check(self) -> None:
        """Raise AssertionError naming what the history violates."""
        lost = self.acked[AT_LEAST_ONCE] - set(self.delivered[AT_LEAST_ONCE])
        assert not lost, f"{len(lost)} acknowledged at-least-once messages never delivered: {_names(lost)}"
        for queue in (AT_LEAST_ONCE, AT_MOST_ONCE):
            phantom = set(self.delivered[queue]) - self.attempted
            assert not phantom, f"delivered but never produced: {_names(phantom)}"
        twice = [d for d, n in Counter(self.delivered[AT_MOST_ONCE]).items() if n > 1]
        assert not twice, f"at-most-once messages delivered twice: {_names(twice)}"


def wait_acks(history: History, n: int, timeout: float = 30.0) -> None:
    """Wait until `n` more produces are acknowledged than now."""
    start = history.acked_count()
    wait_for(lambda: history.acked_count() >= start + n, timeout, f"{n} more acknowledged produces")


def _names(bodies) -> list[str]:
    """The first ten of `bodies` by name, without their padding (Workload's pad)."""
    return [d.rstrip(".") for d in sorted(bodies)[:10]]


class Workload:
    """Producers and a consumer running against a cluster's host list until stopped.
    pad: characters added to each body (a message is its name, then the padding); consumer
    False: only produce (the queues fill up)."""

    def __init__(self, hosts: str, history: History, producers: int = 2, prefix: str = "w",
                 pad: int = 0, consumer: bool = True) -> None:
        self.hosts = hosts
        self.history = history
        self.stopping = threading.Event()
        self.counter = itertools.count()
        self.prefix = prefix
        self.padding = "." * pad
        self.threads = [threading.Thread(target=self._produce, daemon=True) for _ in range(producers)]
        if consumer:
            self.threads.append(threading.Thread(target=self._consume, daemon=True))

    def start(self) -> "Workload":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def _produce(self) -> None:
        h = self.history
        client = QueueClient(self.hosts, timeout=2.0)
        try:
            while not self.stopping.is_set():
                n = next(self.counter)
                queue = AT_MOST_ONCE if n % 3 == 0 else AT_LEAST_ONCE
                data = f"{self.prefix}{n}{self.padding}"
                with h.lock:
                    h.attempted.add(data)
                try:
                    client.produce(queue, data, retry=0 if queue == AT_MOST_ONCE else 1)
                except QueueError as exc:
                    with h.lock:
                        h.error(exc)
                    time.sleep(0.01)
                    continue
                with h.lock:
                    h.acked[queue].add(data)
        finally:
            client.close()

    def _consume(self) -> None:
        client = QueueClient(self.hosts, timeout=2.0)
        try:
            while not self.stopping.is_set():
                consumed = False
                for queue in (AT_LEAST_ONCE, AT_MOST_ONCE):
                    consumed |= consume_one(client, queue, self.history)
                if not consumed:
                    time.sleep(0.005)
        finally:
            client.close()


def consume_one(client: QueueClient, queue: str, history: History) -> bool:
    """Consume (and confirm) one message, recording it; False if none or on an error."""
    try:
        m = client.consume(queue)
    except QueueError as exc:
        with history.lock:
            history.error(exc)
        return False
    if m is None:
        return False
    with history.lock:
        history.delivered[queue].append(m.data)
    if queue == AT_LEAST_ONCE:
        try:
            client.confirm(queue, m.msg_id)
        except QueueError:
            pass  # it comes back after its lease
    return True


def drain(hosts: str, history: History, timeout: float = 30.0) -> None:
    """Consume everything left (waiting out leases) until both queues are empty."""
    client = QueueClient(hosts, timeout=2.0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            got = False
            for queue in (AT_LEAST_ONCE, AT_MOST_ONCE):
                while consume_one(client, queue, history):
                    got = True
            if got:
                continue
            try:
                sizes = [client.monitor(q)["size"] for q in (AT_LEAST_ONCE, AT_MOST_ONCE)]
            except QueueError:
                time.sleep(0.05)
                continue
            if sum(sizes) == 0:
                return
            time.sleep(0.05)
        raise AssertionError("the queues did not drain")
    finally:
        client.close()
