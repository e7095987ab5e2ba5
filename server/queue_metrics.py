"""Per-queue Prometheus metrics, labelled `queue`, published by each worker for the queues it
owns (docs/metrics.md, "Per-queue metrics").

Gauges: queue_ready, queue_delayed, queue_leased, queue_dead (messages in the queue's dead-letter
queue). Counters: queue_produced_total, queue_consumed_total, queue_confirmed_total,
queue_expired_total, queue_dead_lettered_total, from the counts each Queue keeps as it applies
records (so a follower counts what it replays, and a restarted node starts again from 0, as
Prometheus counters may).

Label cardinality is capped: the first `limit` queues a worker sees get their own series for the
life of the process; every other queue is summed into queue="_other".
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry

from queue_server.server.metrics import _Metrics

OTHER = "_other"
STATES = ("ready", "delayed", "leased", "dead")
EVENTS = ("produced", "consumed", "confirmed", "expired", "dead_lettered")
_STATE_DOCS = {
    "ready": "Messages a consume could take now, per queue.",
    "delayed": "Messages whose ready time is still ahead, per queue.",
    "leased": "Messages delivered and not yet confirmed (in flight), per queue.",
    "dead": "Messages in the queue's dead-letter queue, per queue.",
}
_EVENT_DOCS = {
    "produced": "Messages stored by produce, per queue.",
    "consumed": "Deliveries (a redelivery counts again), per queue.",
    "confirmed": "Messages confirmed, per queue.",
    "expired": "Messages whose lease outlived their ttl (removed, or moved to the dead-letter queue), plus those removed for max_deliveries without a dead-letter queue, per queue.",
    "dead_lettered": "Messages moved to the queue's dead-letter queue, per queue.",
}

# One row per queue: (name, the Queue object (identity tells a re-created queue), its sizes by
# state, its event counts).
Row = tuple[str, Any, dict, dict]


class QueueMetrics(_Metrics):
    """A worker's per-queue series."""

    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.limit = limit
        self.gauges = {s: self._gauge("queue_" + s, _STATE_DOCS[s], ("queue",)) for s in STATES}
        self.counters = {e: self._counter("queue_" + e, _EVENT_DOCS[e], ("queue",)) for e in EVENTS}
        self.labelled: set[str] = set()  # queues with series of their own
        self.shown: set[str] = set()  # labels whose gauges were set last time
        self.seen: dict[str, tuple[Any, dict]] = {}  # queue -> (its Queue, counts published)
        self.next_fold = 0.0  # monotonic; a fold visits every queue, so it is spaced by its cost

    def label(self, name: str) -> str:
        """The `queue` label of queue `name` (OTHER once the cap is reached)."""
        if name in self.labelled:
            return name
        if len(self.labelled) < self.limit:
            self.labelled.add(name)
            return name
        return OTHER

    def maybe_fold(self, rows: Callable[[], Iterable[Row]]) -> None:
        """fold(rows()) unless metrics are off or the last fold was too recent for its cost
        (at most ~1% of the worker's time, as for the node totals)."""
        started = time.monotonic()
        if not self.active or started < self.next_fold:
            return
        self.fold(rows())
        self.next_fold = started + 100 * (time.monotonic() - started)

    def fold(self, rows: Iterable[Row]) -> None:
        """Publish the queues' current sizes and what they counted since the last fold."""
        if not self.active:
            return
        sizes: dict[str, dict[str, int]] = {}
        increments: dict[str, dict[str, int]] = {}
        seen: dict[str, tuple[Any, dict]] = {}
        for name, queue, state, counts in rows:
            label = self.label(name)
            total = sizes.setdefault(label, dict.fromkeys(STATES, 0))
            for s in STATES:
                total[s] += state.get(s, 0)
            before = self.seen.get(name)
            last = before[1] if before is not None and before[0] is queue else {}
            inc = increments.setdefault(label, dict.fromkeys(EVENTS, 0))
            for e in EVENTS:
                inc[e] += max(0, counts.get(e, 0) - last.get(e, 0))
            seen[name] = (queue, dict(counts))
        self.seen = seen
        for label in self.shown - sizes.keys():  # deleted: multi-process mode cannot unpublish
            sizes[label] = dict.fromkeys(STATES, 0)
        for label, total in sizes.items():
            for s, value in total.items():
                self.gauges[s].labels(queue=label).set(value)
        self.shown = {label for label, total in sizes.items() if any(total.values())}
        for label, inc in increments.items():
            for e, n in inc.items():
                if n:
                    self.counters[e].labels(queue=label).inc(n)
