"""A node's Prometheus metrics (prometheus_client in its multi-process mode).

With config ``metrics_port`` set (default 0: off), the supervisor makes ``<run dir>/metrics``,
passes it to every child as PROMETHEUS_MULTIPROC_DIR, and serves ``GET /metrics`` on
``host:metrics_port`` from a registry that merges what every child wrote there (server/metrics_http.py).

The hot paths never touch prometheus_client. Each process counts in plain Python (dict counters,
:class:`LocalHistogram`) and :meth:`fold`\\ s those counts into the shared metrics about once a
second; with metrics off the folds only empty the local counts, and the counting costs a dict
update per reply in the workers and an integer compare per reply in the acceptor.

A labelled series appears once it is first counted, so the series of the label values known in
advance (transports, auth outcomes, limits, each action's codes 0 and -1; peer rejections,
refused writes' reasons) are published at 0 when the acceptor (the coordinator) starts, once per
node: a rate() then reads 0, not "no data", before the first count.

Who owns what:

* :class:`AcceptorMetrics` -- server/acceptor.py: requests received per transport (TCP, UDP,
  HTTP: each counted once, under its own), TCP and HTTP connections, HTTP responses by status
  (server/http_api.py), replies the acceptor makes itself (errors it catches, ``leader``), and
  request latency sampled by following one request at a time through the node.
* :class:`WorkerMetrics` -- server/worker.py: replies per action and code, the time a worker
  spends on one request batch and the batch sizes, and queue sizes (ready, delayed, in flight).
* :class:`CoordinatorMetrics` -- server/coordinator.py: replies the coordinator makes itself
  (server/forwarding.py counts them), workers' replies it refused (server/cluster.py), trans_id,
  role and term, elections, replication lag per follower, change-log fsync time, peer messages
  and connections refused.
* :func:`registry_for` -- server/main.py: the node's identity and each child's CPU time and
  memory, served with the health endpoints by server/metrics_http.py.
"""
from __future__ import annotations

import itertools
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from queue_server.protocol import vocabulary as p
from queue_server.protocol.limits import LIMITS
from queue_server.protocol.roles import METRIC_ROLES
from queue_server.server.peer_check import REJECTIONS
from queue_server.server.reply_counts import REFUSAL_LABELS

ENV = "PROMETHEUS_MULTIPROC_DIR"
FOLD_INTERVAL = 1.0  # seconds between folds of local counts into the shared metrics
PROBE_GIVE_UP = 10.0  # a sampled request still unanswered after this long stops being followed
PREFIX = "queue_server_"
SNAPSHOT_RESULTS = ("written", "failed")  # the labels of snapshots_total

# Seconds. Fine at the low end: a request through an idle node takes ~100-300 us.
LATENCY_BUCKETS = (
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)
BATCH_SECONDS_BUCKETS = (
    0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5,
)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
FSYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)
ROLES = tuple(r.value for r in METRIC_ROLES)
TRANSPORTS = ("tcp", "udp", "http")  # received_requests: client TCP and UDP port, http_port
AUTH_OUTCOMES = ("failed", "throttled")
CODES_AT_ZERO = (str(p.CODE_OK), str(p.CODE_ERROR))  # requests' codes published at 0 for every action

_ACTION_BY_NUMBER = {number: name for name, number in p.ACTION_NAMES.items()}


def enabled() -> bool:
    """Whether this process writes metrics for a scraper (the supervisor set ENV)."""
    return bool(os.environ.get(ENV))


def action_label(action: Any) -> str:
    """A request's `action` value (number or name, as the client sent it) as a label."""
    if type(action) is int:
        return _ACTION_BY_NUMBER.get(action, "unknown")
    if type(action) is str:
        return action if action in p.ACTION_NAMES else "unknown"
    return "missing" if action is None else "unknown"


def code_label(code: Any) -> str:
    """A reply's `code` as a label."""
    return str(code) if type(code) is int else "none"


class LocalHistogram:
    """Observations bucketed in this process, added to a prometheus Histogram now and then.

    `bounds` must be the buckets of the Histogram it is drained into.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def drain_into(self, child: Any) -> None:
        """Add the observations to `child` (a labelled Histogram) and start again from zero."""
        counts = self.counts
        if not any(counts):
            return
        # Histogram has no public "add n observations"; its per-bucket values (non-cumulative,
        # one per bound plus +Inf) and its sum are what observe() increments.
        buckets = child._buckets
        for i, n in enumerate(counts):
            if n:
                buckets[i].inc(n)
        child._sum.inc(self.total)
        self.counts = [0] * len(counts)
        self.total = 0.0


def _fold_counts(counts: dict, counter: Counter) -> None:
    """Add {(action, code): n} to `counter` (labels action, code) and clear `counts`."""
    if not counts:
        return
    folded: dict[tuple[str, str], int] = {}
    for (action, code), n in counts.items():
        key = (action_label(action), code_label(code))
        folded[key] = folded.get(key, 0) + n
    counts.clear()
    for (action, code), n in folded.items():
        counter.labels(action=action, code=code).inc(n)


def _limit_counter(m: "_Metrics") -> Counter:
    return m._counter("limit_refusals", "Requests and connections refused or cut by a resource limit "
                      f"({', '.join(LIMITS)}), by limit.", ("limit",))


def _fold_labelled(counts: dict[str, int], counter: Counter) -> None:
    """Add {label value: n} to `counter` (one label: a limit, a reason) and clear `counts`."""
    for value, n in counts.items():
        counter.labels(value).inc(n)
    counts.clear()


def _add(counts: dict, more: Mapping[Any, int]) -> None:
    """Add the counts of `more` to `counts`, key by key."""
    for key, n in more.items():
        counts[key] = counts.get(key, 0) + n


def count_limit(counts: dict[str, int], limit: str) -> None:
    """A limit refused one more request or connection."""
    counts[limit] = counts.get(limit, 0) + 1


# ----------------------------------------------------------------------------- metric factories


class _Metrics:
    """The prometheus metrics of one kind of process, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        from prometheus_client import REGISTRY

        self.registry = registry if registry is not None else REGISTRY
        # Inactive (metrics off), folds still run, to empty the local counts: their keys come
        # from clients (an echoed unknown action), so they must not pile up.
        self.active = enabled() or registry is not None
        self.next_fold = time.monotonic() + FOLD_INTERVAL

    def _counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(PREFIX + name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Sequence[str] = (), mode: str = "livesum") -> Gauge:
        return Gauge(PREFIX + name, doc, labels, registry=self.registry, multiprocess_mode=mode)  # type: ignore[arg-type]

    def _histogram(self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()) -> Histogram:
        return Histogram(PREFIX + name, doc, labels, registry=self.registry, buckets=buckets)

    def _at_zero(self, counter: Counter, *label_values: Iterable[str]) -> None:
        """Publish `counter` at 0 for every combination of `label_values` (one iterable per
        label, in the counter's label order), if metrics are on."""
        if self.active:
            for labels in itertools.product(*label_values):
                counter.labels(*labels)

    def due(self, now: float) -> bool:
        """Whether a fold is due at monotonic time `now` (and schedule the next one)."""
        if now < self.next_fold:
            return False
        self.next_fold = now + FOLD_INTERVAL
        return True


def _requests_counter(m: _Metrics) -> Counter:
    return m._counter("requests", "Requests answered, by action and reply code (0 ok, -1 error, -2 redirect).", ("action", "code"))


class AcceptorMetrics(_Metrics):
    """The acceptor's metrics (server/acceptor.py).

    Latency is sampled: one request at a time is followed from the moment the acceptor decoded
    it to the moment its reply came back to the acceptor (queueing, worker, coordinator and
    ZeroMQ hops included; writing to the socket not). Under load that is about one request per
    round trip through the node; long polls (`wait`) are never sampled.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.counts: dict[tuple[Any, Any], int] = {}
        self.latency: dict[str, LocalHistogram] = {}
        self.requests = _requests_counter(self)
        self.latency_seconds = self._histogram(
            "request_latency_seconds",
            "Time from a request decoded by the acceptor to its reply back in the acceptor (sampled: one request in flight at a time; long polls excluded).",
            LATENCY_BUCKETS, ("action",),
        )
        self.received = self._counter("received_requests", "Requests received, by transport.", ("transport",))
        self.connections = self._gauge("tcp_connections", "Open client TCP connections.")
        self.http_connections = self._gauge("http_connections", "Open HTTP connections (http_port).")
        self.connections_opened = self._counter("tcp_connections_opened", "Client TCP connections accepted.")
        self.http_connections_opened = self._counter("http_connections_opened", "HTTP connections accepted (http_port).")
        self.http_statuses: dict[str, int] = {}  # HTTP responses by status, until the next fold
        self.http_requests = self._counter("http_requests", "HTTP requests answered (http_port), by response status.",
                                           ("status",))
        self.auth_failures = self._counter(
            "auth_failures", "Client requests refused for missing or wrong credentials (auth_token_file), "
            "and attempts refused unchecked after too many failures from one address.", ("outcome",))
        self._sent = {"tcp": 0, "udp": 0, "http": 0, "opened": 0, "http_opened": 0, "failed": 0, "throttled": 0}
        self.limits: dict[str, int] = {}
        self.limit_counter = _limit_counter(self)
        # One acceptor per node: its series at 0 stand for the node's (the scrape sums processes).
        self._at_zero(self.requests, p.ACTION_NAMES, CODES_AT_ZERO)
        self._at_zero(self.received, TRANSPORTS)
        self._at_zero(self.auth_failures, AUTH_OUTCOMES)
        self._at_zero(self.limit_counter, LIMITS)
        self.probe_conn = -1
        self.probe_no = -1
        self.probe_action = ""
        self.probe_started = 0.0

    def start_probe(self, item: Sequence[Any]) -> None:
        """Follow request `item` ((origin, req_no, request) as queued for a worker) if nothing is
        being followed and it is not a long poll."""
        if len(item) != 3:
            return
        request = item[2]
        if type(request) is not dict or request.get("wait"):
            return
        self.probe_conn = item[0][0]
        self.probe_no = item[1]
        self.probe_action = action_label(request.get("action"))
        self.probe_started = time.perf_counter()

    def end_probe(self, conn_id: int) -> None:
        """The reply to request number `probe_no` came back; if it belongs to `conn_id`, it is the
        followed request."""
        if conn_id != self.probe_conn:
            return
        elapsed = time.perf_counter() - self.probe_started
        hist = self.latency.get(self.probe_action)
        if hist is None:
            hist = self.latency[self.probe_action] = LocalHistogram(LATENCY_BUCKETS)
        hist.observe(elapsed)
        self.probe_no = -1

    def drop_probe(self, conn_id: int) -> None:
        """Connection `conn_id` closed: its followed request, if any, will never be answered."""
        if conn_id == self.probe_conn:
            self.probe_no = -1

    def http_answered(self, status: int) -> None:
        """One HTTP request was answered with `status`."""
        key = str(status)
        self.http_statuses[key] = self.http_statuses.get(key, 0) + 1

    def fold(self, open_connections: int, tcp_requests: int, udp_requests: int, connections_opened: int,
             auth_failed: int = 0, auth_throttled: int = 0, http_connections: int = 0, http_requests: int = 0,
             http_connections_opened: int = 0) -> None:
        """Add what was counted since the last fold to the shared metrics. The arguments are the
        acceptor's running totals: each transport's requests and connections are its own."""
        if self.probe_no >= 0 and time.perf_counter() - self.probe_started > PROBE_GIVE_UP:
            self.probe_no = -1
        if not self.active:
            self.counts.clear()
            self.latency.clear()
            self.limits.clear()
            self.http_statuses.clear()
            return
        _fold_counts(self.counts, self.requests)
        for action, hist in self.latency.items():
            hist.drain_into(self.latency_seconds.labels(action=action))
        for label, total in (("tcp", tcp_requests), ("udp", udp_requests), ("http", http_requests)):
            self._catch_up(self.received.labels(transport=label), label, total)
        self._catch_up(self.connections_opened, "opened", connections_opened)
        self._catch_up(self.http_connections_opened, "http_opened", http_connections_opened)
        for label, total in (("failed", auth_failed), ("throttled", auth_throttled)):
            self._catch_up(self.auth_failures.labels(outcome=label), label, total)
        self.connections.set(open_connections)
        self.http_connections.set(http_connections)
        _fold_labelled(self.limits, self.limit_counter)
        _fold_labelled(self.http_statuses, self.http_requests)

    def _catch_up(self, counter: Any, key: str, total: int) -> None:
        """Bring `counter` (a counter or a labelled child) up to running total `total`, what
        `key` of _sent says it has been given so far."""
        given = self._sent[key]
        if total > given:
            counter.inc(total - given)
            self._sent[key] = total


class WorkerMetrics(_Metrics):
    """A worker's metrics (server/worker.py): replies per action and code, batch time and size,
    and the sizes of the queues it owns."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.counts: dict[tuple[Any, Any], int] = {}
        self.batch_time = LocalHistogram(BATCH_SECONDS_BUCKETS)
        self.batch_size = LocalHistogram(BATCH_SIZE_BUCKETS)
        self.requests = _requests_counter(self)
        self.batch_seconds = self._histogram(
            "worker_batch_seconds", "Time a worker spends serving one batch of requests from the acceptor.", BATCH_SECONDS_BUCKETS)
        self.batch_requests = self._histogram(
            "worker_batch_requests", "Requests per batch a worker receives from the acceptor.", BATCH_SIZE_BUCKETS)
        self.messages = self._gauge("messages", "Stored messages, by state (ready, delayed, in_flight).", ("state",))
        self.queues = self._gauge("queues", "Queues that exist.")
        self.waiters = self._gauge("long_poll_waiters", "Consume requests parked in a long poll.")
        self.overflowed = self._gauge("overflowed_messages", "Stored messages whose body is on disk (overflow_mb).")
        self.overflow_bytes = self._gauge("overflow_bytes", "Bytes of the bodies on disk that stored messages need.")
        self.memory_bytes = self._gauge("memory_bytes", "What the workers hold for their messages, an estimate "
                                        "(bodies in memory plus their metadata); with overflow on.")
        self.limit_counter = _limit_counter(self)
        self.next_sizes = 0.0

    def batch(self, seconds: float, requests: int) -> None:
        """One request batch was served in `seconds`."""
        self.batch_time.observe(seconds)
        self.batch_size.observe(requests)

    def count_partials(self, partials: Iterable[Sequence[Any]], index: int) -> None:
        """Count scattered monitor/list requests once per node: the worker that got the request
        alone counts it, or worker 0 when every worker got it."""
        counts = self.counts
        for tag, part in partials:
            if tag[3] == 1 or index == 0:
                request = tag[4]
                key = (request.get("action") if type(request.get("action")) in (int, str) else "unknown",
                       p.CODE_ERROR if "error" in part else p.CODE_OK)
                counts[key] = counts.get(key, 0) + 1

    def fold(self, totals: Callable[[], Mapping[str, int]], limits: dict[str, int] | None = None) -> None:
        """Add what was counted since the last fold. `totals()` returns the worker's queue totals
        (ready, delayed, in_flight, queue_count, waiters); it visits every queue, so it is called
        less often when it is slow (at most ~1% of the worker's time). `limits`: refusals by
        limit (the service's count, emptied here)."""
        if not self.active:
            if limits:
                limits.clear()
            self.counts.clear()
            self.batch_time = LocalHistogram(BATCH_SECONDS_BUCKETS)
            self.batch_size = LocalHistogram(BATCH_SIZE_BUCKETS)
            return
        _fold_counts(self.counts, self.requests)
        if limits:
            _fold_labelled(limits, self.limit_counter)
        self.batch_time.drain_into(self.batch_seconds)
        self.batch_size.drain_into(self.batch_requests)
        started = time.monotonic()
        if started < self.next_sizes:
            return
        sizes = totals()
        self.next_sizes = started + 100 * (time.monotonic() - started)
        for state in ("ready", "delayed", "in_flight"):
            self.messages.labels(state=state).set(sizes.get(state, 0))
        self.queues.set(sizes.get("queue_count", 0))
        self.waiters.set(sizes.get("waiters", 0))
        self.overflowed.set(sizes.get("overflowed", 0))
        self.overflow_bytes.set(sizes.get("overflow_bytes", 0))
        self.memory_bytes.set(sizes.get("memory_bytes", 0))


class CoordinatorMetrics(_Metrics):
    """The coordinator's metrics (server/coordinator.py, one per coordinator process): the
    replies it made itself (a forward that failed, "no leader", ...) and the workers' replies it
    refused, by reason; the change log's last and committed trans_id, this node's role and term,
    the elections it started, each follower's replication lag while it leads, change-log fsync
    times, the peer messages and connections it refused, by reason, and the snapshots the
    workers made, written or failed.

    With queue groups (`grouped`), the log, role, term and lag series carry a `group` label, one
    series per queue group this node is a replica of; with one group they have none, as before.

    The setters only store numbers (the coordinator hands them over in its `observe`); :meth:`fold`
    publishes them about once a second.
    """

    def __init__(self, registry: CollectorRegistry | None = None, grouped: bool = False) -> None:
        super().__init__(registry)
        self.grouped = grouped
        # By queue group (0 alone without queue groups):
        self.trans_ids: dict[int, tuple[int, int | None]] = {}  # (last, committed)
        self.roles: dict[int, tuple[str, int | None]] = {}  # (role, term)
        self.elections = 0
        self.lag: dict[tuple[int, int], int] = {}  # (group, follower) -> records
        self._forgotten: set[tuple[int, int]] = set()
        self.fsync = LocalHistogram(FSYNC_BUCKETS)
        self._elections_sent = 0
        self.counts: dict[tuple[Any, Any], int] = {}
        self.requests = _requests_counter(self)
        group = ("group",) if grouped else ()
        self.trans_id_gauge = self._gauge("trans_id", "Last trans_id appended to the change log.", group, mode="livemax")
        self.commit_gauge = self._gauge("commit_trans_id", "Last trans_id known committed (replicated to a quorum).", group, mode="livemax")
        self.role_gauge = self._gauge("role", "1 for this node's current role (leader, follower, candidate), 0 for the others.", ("role", *group), mode="livemax")
        self.term_gauge = self._gauge("term", "Current election term (vote_id).", group, mode="livemax")
        self.elections_counter = self._counter("elections", "Elections this node started (as a candidate).")
        self.lag_gauge = self._gauge("replication_lag_records", "Records the leader has that a follower has not acknowledged, per follower node_id.", ("follower", *group), mode="livemax")
        self.fsync_seconds = self._histogram("log_fsync_seconds", "Time of one fsync of the change log.", FSYNC_BUCKETS)
        self.peer_rejects: dict[str, int] = {}
        self.peer_rejected_counter = self._counter(
            "peer_rejected", "Peer messages dropped (unknown src, src not the authenticated node, other cluster, "
            "other placement of the queue groups) "
            "and peer connections refused (bad_key: not a cluster key), by reason.", ("reason",))
        self._at_zero(self.peer_rejected_counter, REJECTIONS)
        self.refusals: dict[str, int] = {}
        self.writes_refused_counter = self._counter(
            "writes_refused", "Writes a worker had answered that the coordinator refused before they were committed "
            "or logged (the node stopped leading, its mode changed, storage unavailable), by reason; "
            "requests_total counts them under the worker's code.", ("reason",))
        self._at_zero(self.writes_refused_counter, REFUSAL_LABELS)
        self.snapshot_results: dict[str, int] = {}
        self.snapshots_counter = self._counter(
            "snapshots", "Snapshots the workers made, by result: written (published), failed (a part not "
            "written, a worker that did not fork within the hold, a mode change, ...).", ("result",))
        self._at_zero(self.snapshots_counter, SNAPSHOT_RESULTS)

    def set_trans_id(self, last: int, committed: int | None = None, group: int = 0) -> None:
        """The log's last trans_id (and the last committed one, if known), of queue group `group`."""
        if committed is None:
            committed = self.trans_ids.get(group, (0, None))[1]
        self.trans_ids[group] = (last, committed)

    def set_role(self, role: str, term: int | None = None, group: int = 0) -> None:
        """This node's role in queue group `group`: one of ROLES; and the term it is in."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        self.roles[group] = (role, term if term is not None else self.roles.get(group, ("", None))[1])

    def election_started(self) -> None:
        """This node became a candidate."""
        self.elections += 1

    def set_follower_lag(self, node_id: int, records: int, group: int = 0) -> None:
        """How many records follower `node_id` is behind this leader of queue group `group`."""
        self.lag[(group, node_id)] = max(0, records)
        self._forgotten.discard((group, node_id))

    def forget_follower(self, node_id: int, group: int = 0) -> None:
        """Follower `node_id` no longer has a lag to report in `group` (this node stopped leading
        it); it then reads 0."""
        if self.lag.pop((group, node_id), None) is not None:
            self._forgotten.add((group, node_id))

    def _of(self, gauge: Gauge, group: int, **labels: str) -> Any:
        """The gauge's series for `group` (with the `group` label only when grouped)."""
        if self.grouped:
            labels["group"] = str(group)
        return gauge.labels(**labels) if labels else gauge

    def observe_fsync(self, seconds: float) -> None:
        """One fsync of the change log took `seconds`."""
        self.fsync.observe(seconds)

    def peer_rejected(self, reason: str, count: int = 1) -> None:
        """A peer message (or connection) was refused for `reason`."""
        self.peer_rejects[reason] = self.peer_rejects.get(reason, 0) + count

    def replied(self, counts: Mapping[tuple[Any, Any], int]) -> None:
        """Replies the coordinator made itself (no worker did), by (action, code)."""
        _add(self.counts, counts)

    def refused(self, counts: Mapping[str, int]) -> None:
        """Workers' replies the coordinator replaced with an error, by reason (REFUSAL_LABELS)."""
        _add(self.refusals, counts)

    def snapshot(self, result: str) -> None:
        """A snapshot cut ended: one of SNAPSHOT_RESULTS."""
        self.snapshot_results[result] = self.snapshot_results.get(result, 0) + 1

    def maybe_fold(self) -> None:
        """Fold if a fold is due; for the process loop."""
        if self.due(time.monotonic()):
            self.fold()

    def fold(self) -> None:
        """Publish the current values."""
        if not self.active:
            self.counts.clear()
            self.peer_rejects.clear()
            self.refusals.clear()
            self.snapshot_results.clear()
            self.fsync = LocalHistogram(FSYNC_BUCKETS)
            return
        of = self._of
        for group, (last, committed) in self.trans_ids.items():
            of(self.trans_id_gauge, group).set(last)
            of(self.commit_gauge, group).set(committed or 0)
        for group, (current, term) in self.roles.items():
            of(self.term_gauge, group).set(term or 0)
            for role in ROLES:
                of(self.role_gauge, group, role=role).set(1 if role == current else 0)
        if self.elections > self._elections_sent:
            self.elections_counter.inc(self.elections - self._elections_sent)
            self._elections_sent = self.elections
        for (group, node_id), records in self.lag.items():
            of(self.lag_gauge, group, follower=str(node_id)).set(records)
        for group, node_id in self._forgotten:  # multi-process mode cannot unpublish a label: it reads 0
            of(self.lag_gauge, group, follower=str(node_id)).set(0)
        self._forgotten.clear()
        self.fsync.drain_into(self.fsync_seconds)
        _fold_counts(self.counts, self.requests)
        _fold_labelled(self.peer_rejects, self.peer_rejected_counter)
        _fold_labelled(self.refusals, self.writes_refused_counter)
        _fold_labelled(self.snapshot_results, self.snapshots_counter)


# ----------------------------------------------------------------------------- the supervisor


def multiproc_dir(run_dir: str) -> str:
    """Where a node's processes write their metrics."""
    return os.path.join(run_dir, "metrics")


def child_env(run_dir: str) -> dict[str, str]:
    """The environment for a node's children with metrics on (makes the directory)."""
    directory = multiproc_dir(run_dir)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    env = dict(os.environ)
    env[ENV] = directory
    return env


class _NodeCollector:
    """The supervisor's own samples: the node's identity and each child's CPU time and memory."""

    def __init__(self, node_id: int, node_type: int, children: Callable[[], Mapping[str, int]]) -> None:
        self.node_id = str(node_id)
        self.node_type = str(node_type)
        self.children = children
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")

    def collect(self) -> Iterable[Any]:
        info = GaugeMetricFamily(PREFIX + "node_info", "This node's identity (value 1).", labels=("node_id", "node_type"))
        info.add_metric((self.node_id, self.node_type), 1)
        yield info
        cpu = CounterMetricFamily(PREFIX + "process_cpu_seconds", "CPU time (user + system) of each process of the node.", labels=("process",))
        rss = GaugeMetricFamily(PREFIX + "process_resident_memory_bytes", "Resident memory of each process of the node.", labels=("process",))
        for name, pid in sorted(self.children().items()):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            cpu.add_metric((name,), (int(fields[11]) + int(fields[12])) / self.tick)
            rss.add_metric((name,), int(fields[21]) * self.page)
        yield cpu
        yield rss


def registry_for(directory: str, node_id: int, node_type: int, children: Callable[[], Mapping[str, int]]) -> CollectorRegistry:
    """The registry the supervisor serves: every child's metrics merged, plus its own."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    registry.register(_NodeCollector(node_id, node_type, children))  # type: ignore[arg-type]
    return registry
