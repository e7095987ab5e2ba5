"""The streaming queue source: spark.readStream.format("queue").

At-least-once although consuming changes the queue (offsets: see spark/offsets.py):

* latestOffset(start) plans the next round from the queues' ready counts (monitor): how many
  messages each queue gives, capped by maxMessages per partition, maxMessagesPerTrigger and,
  under Trigger.AvailableNow, by what was ready when the query started. Nothing ready: it
  returns `start`, which Spark takes as "no new data".
* Executors lease the planned messages under lease tokens named after the round
  (read_partition in spark/source.py). A task that dies leaves its messages leased; its retry
  (same tokens) gets the same messages back; if nothing retries, they are ready again once the
  lease ends.
* Messages are confirmed (token_prefix of the round) only after Spark committed the round:
  in commit(end), and -- because Spark calls commit(end) only while planning the *next* batch,
  which never comes for an idle stream or after the last Trigger.AvailableNow batch -- also in
  latestOffset(start): Spark calls it only once the batch ending at `start` is in its commit
  log, so that batch is safe to confirm. A restarted driver therefore confirms the last
  committed round the first time it plans.
* A micro-batch replayed after a driver restart uses the tokens of its offset and yields the
  same messages, as long as their leases held: while a round is planned but not confirmed, a
  daemon thread of the driver extends its leases every leaseSeconds/3 (a slow batch keeps its
  messages).

Pitfalls handled: offsets are JSON dicts (Offset.to_json); the reader Spark pickles for read()
is made before partitions() runs, so executors get everything from the partition; the driver
state (clients, the lease keeper) is made lazily and never pickled.
"""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from queue_server.client import QueueClient
from queue_server.client import protocol as p

from .offsets import Offset, plan, round_prefix, split
from .options import ReadOptions, tls_context
from .source import QueuePartition, read_partition

log = logging.getLogger("queue.spark.stream")


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader of one or more queues (see the module docstring)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._driver: _Driver | None = None

    def __getstate__(self) -> dict:
        return {"opts": self.opts, "_driver": None}

    @property
    def driver(self) -> _Driver:
        """The driver-side state, made on first use (never on executors)."""
        if self._driver is None:
            self._driver = _Driver(self.opts)
        return self._driver

    # ------------------------------------------------------------------ planning (driver)

    def initialOffset(self) -> dict:
        d = self.driver
        if d.stream_id is None:
            d.stream_id = uuid.uuid4().hex[:16]
        return Offset(d.stream_id, 0, {}, self.opts.partitions_per_queue, self.opts.chunk).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self.driver.start_available_now()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = Offset.from_json(start)
        d = self.driver
        d.confirm_through(begin)
        o = self.opts
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        take = plan(d.ready_counts(), o.partitions_per_queue * o.max_messages, rows,
                    d.available_now_remaining(begin.round + 1))
        if not take:
            return start
        end = begin.next(take, o.partitions_per_queue, o.chunk)
        d.planned(end)
        return end.to_json()

    def partitions(self, start: dict, end: dict) -> list[QueuePartition]:
        first, last = Offset.from_json(start), Offset.from_json(end)
        if last.round == first.round:
            return []
        if last.round != first.round + 1:
            log.warning("queue source: batch spans rounds %d..%d; reading round %d only",
                        first.round + 1, last.round, last.round)
        self.driver.in_flight(last)
        o = self.opts
        parts = []
        for queue, n in last.take.items():
            for i, count in enumerate(split(n, last.parts)):
                if count:
                    parts.append(QueuePartition(
                        o.hosts, queue, f"{last.prefix}{i}", count, o.lease, last.chunk, o.timeout,
                        exact=True, confirm=False, auth_token=o.auth_token, tls=o.tls))
        return parts

    def commit(self, end: dict) -> None:
        self.driver.confirm_through(Offset.from_json(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()

    # ------------------------------------------------------------------ reading (executors)

    def read(self, partition: QueuePartition) -> Iterator:
        return read_partition(partition)


class _Driver:
    """What the driver keeps between calls: planned rounds not yet confirmed, the AvailableNow
    target, and the thread that keeps their leases alive."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.stream_id: str | None = None
        self.client = QueueClient(opts.hosts, timeout=opts.timeout, token=opts.auth_token,
                                  tls=tls_context(opts.tls))
        self.lock = threading.Lock()
        self.rounds: dict[int, Offset] = {}  # planned or running, not confirmed yet
        self.confirmed_upto = -1  # every round <= this one is confirmed (as far as we know)
        self.target: dict[str, int] | None = None  # AvailableNow: ready counts at the start
        self.taken: dict[int, dict[str, int]] = {}  # AvailableNow: what each round planned
        self.extensions = 0  # lease-keeper passes done (for tests and logs)
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    # -------------------------------------------------------------- queue state
    def ready_counts(self) -> dict[str, int]:
        """Each queue's ready messages now."""
        return {q: int(self.client.monitor(q).get("ready", 0)) for q in self.opts.queues}

    def start_available_now(self) -> None:
        self.target = self.ready_counts()
        self.taken.clear()

    def available_now_remaining(self, rnd: int) -> dict[str, int] | None:
        if self.target is None:
            return None
        used: dict[str, int] = {}
        for r, take in self.taken.items():
            if r != rnd:  # a round planned again replaces its earlier plan
                for q, n in take.items():
                    used[q] = used.get(q, 0) + n
        return {q: n - used.get(q, 0) for q, n in self.target.items()}

    def planned(self, end: Offset) -> None:
        if self.target is not None:
            self.taken[end.round] = dict(end.take)

    # -------------------------------------------------------------- leases
    def in_flight(self, end: Offset) -> None:
        """A round is about to be read: keep its leases alive until it is confirmed."""
        with self.lock:
            if end.round > self.confirmed_upto:
                self.rounds[end.round] = end
        if self._keeper is None:
            self._keeper = threading.Thread(target=self._keep_leases, name="queue-lease-keeper",
                                            daemon=True)
            self._keeper.start()

    def confirm_through(self, offset: Offset) -> None:
        """Confirm every round up to `offset`'s: Spark has committed them."""
        with self.lock:
            if offset.round <= self.confirmed_upto:
                return
            due = [o for r, o in sorted(self.rounds.items()) if r <= offset.round]
            if offset.round > 0 and offset.round not in self.rounds:
                due.append(offset)  # planned by an earlier driver (restart): confirm it anyway
        for o in due:
            for queue in o.take:
                self.client.request(p.ids_request(p.CONFIRM, queue, None, token_prefix=o.prefix))
        with self.lock:
            for o in due:
                self.rounds.pop(o.round, None)
            self.confirmed_upto = max(self.confirmed_upto, offset.round)

    def _keep_leases(self) -> None:
        client = QueueClient(self.opts.hosts, timeout=self.opts.timeout, token=self.opts.auth_token,
                             tls=tls_context(self.opts.tls))
        interval = self.opts.lease / 3
        try:
            while not self._stop.wait(interval):
                with self.lock:
                    live = list(self.rounds.values())
                try:
                    for o in live:
                        for queue in o.take:
                            client.request(p.ids_request(p.EXTEND, queue, None, retry=self.opts.lease,
                                                         token_prefix=round_prefix(o.stream, o.round)))
                    self.extensions += 1
                except Exception as exc:  # noqa: BLE001 -- keep trying: a missed pass only shortens the lease
                    log.warning("queue source: extending leases failed: %s", exc)
        finally:
            client.close()

    def close(self) -> None:
        """Stop the lease keeper (leases are left as they are: a restart replays them)."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=self.opts.timeout)
        self.client.close()
