"""server/metrics.py without processes: local counts folded into a private registry."""
from __future__ import annotations

import ast
from pathlib import Path

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram

from queue_server import server, workers
from queue_server.protocol import limits
from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.replication.messages import Recovered
from queue_server.server import metrics as m
from queue_server.server.cluster import ClusterNode
from queue_server.server.coordinator import Coordinator
from queue_server.server.reply_counts import REFUSAL_LABELS, REFUSALS, count_replies
from tests.unit.test_cluster_node import PRODUCE, T0, _batch, _config, _drain


def test_local_histogram_drains_like_direct_observations():
    values = [0.00005, 0.0001, 0.0003, 0.002, 0.002, 0.7, 9.0]
    registry = CollectorRegistry()
    direct = Histogram("direct", "d", buckets=m.LATENCY_BUCKETS, registry=registry)
    folded = Histogram("folded", "f", buckets=m.LATENCY_BUCKETS, registry=registry)
    local = m.LocalHistogram(m.LATENCY_BUCKETS)
    for v in values:
        direct.observe(v)
        local.observe(v)
    local.drain_into(folded)
    local.drain_into(folded)  # drained: adds nothing more
    for bound in [*m.LATENCY_BUCKETS, float("inf")]:
        le = "+Inf" if bound == float("inf") else str(float(bound))
        assert registry.get_sample_value("folded_bucket", {"le": le}) == registry.get_sample_value("direct_bucket", {"le": le})
    assert registry.get_sample_value("folded_count") == len(values)
    assert registry.get_sample_value("folded_sum") == pytest.approx(sum(values))


def test_reply_counts_fold_by_action_name_and_code():
    registry = CollectorRegistry()
    wm = m.WorkerMetrics(registry)
    replies = [
        (1, 0, {"action": 1, "code": 0}),
        (1, 1, {"action": "produce", "code": 0}),
        (1, 2, {"action": 2, "code": 0}),
        (1, 3, {"action": [1], "code": -1}),  # unhashable, echoed from a bad request
        (1, 4, {"action": 77, "code": -1}),
        (1, 5, {"code": -1}),
    ]
    count_replies(wm.counts, replies)
    wm.fold(lambda: {"ready": 3, "delayed": 2, "in_flight": 1, "queue_count": 4, "waiters": 5})
    get = registry.get_sample_value
    assert get("queue_server_requests_total", {"action": "produce", "code": "0"}) == 2
    assert get("queue_server_requests_total", {"action": "consume", "code": "0"}) == 1
    assert get("queue_server_requests_total", {"action": "unknown", "code": "-1"}) == 2
    assert get("queue_server_requests_total", {"action": "missing", "code": "-1"}) == 1
    assert get("queue_server_messages", {"state": "ready"}) == 3
    assert get("queue_server_messages", {"state": "in_flight"}) == 1
    assert get("queue_server_queues") == 4
    assert get("queue_server_long_poll_waiters") == 5
    assert wm.counts == {}


def test_scattered_requests_count_once_per_node():
    workers = [m.WorkerMetrics(CollectorRegistry()) for _ in range(3)]
    everywhere = [7, 1, 1, 3, {"action": 7}]  # gather tag: [gather_id, conn, req_no, targets, request]
    one_worker = [8, 1, 2, 1, {"action": 4, "queue": "q"}]
    for index, wm in enumerate(workers):
        wm.count_partials([(everywhere, {"queue_list": []})], index)
    workers[2].count_partials([(one_worker, {"error": "queue: bad"})], 2)
    totals: dict = {}
    for wm in workers:
        for key, n in wm.counts.items():
            totals[key] = totals.get(key, 0) + n
    assert totals == {(7, 0): 1, (4, -1): 1}


def test_acceptor_probe_follows_one_request_at_a_time():
    registry = CollectorRegistry()
    am = m.AcceptorMetrics(registry)
    am.start_probe(([3, False, 0], 10, {"action": 2, "queue": "q", "wait": 5}))
    assert am.probe_no == -1  # long polls are not sampled
    am.start_probe(([3, False, 0], 11, {"action": "produce", "queue": "q"}))
    assert (am.probe_conn, am.probe_no) == (3, 11)
    am.end_probe(4)  # the same req_no on another connection
    assert am.probe_no == 11
    am.end_probe(3)
    assert am.probe_no == -1
    am.start_probe(([5, False, 0], 1, {"action": 3}))
    am.drop_probe(5)
    assert am.probe_no == -1
    am.fold(open_connections=2, tcp_requests=7, udp_requests=4, connections_opened=3)
    am.fold(open_connections=1, tcp_requests=9, udp_requests=4, connections_opened=3)
    get = registry.get_sample_value
    assert get("queue_server_request_latency_seconds_count", {"action": "produce"}) == 1
    assert get("queue_server_received_requests_total", {"transport": "tcp"}) == 9
    assert get("queue_server_received_requests_total", {"transport": "udp"}) == 4
    assert get("queue_server_tcp_connections_opened_total") == 3
    assert get("queue_server_tcp_connections") == 1


def test_coordinator_metrics_publish_on_fold():
    registry = CollectorRegistry()
    cm = m.CoordinatorMetrics(registry)
    cm.set_trans_id(120, committed=118)
    cm.set_role("leader", term=4)
    cm.election_started()
    cm.set_follower_lag(2, 5)
    cm.set_follower_lag(3, 0)
    cm.observe_fsync(0.003)
    cm.replied({(1, -1): 2, ("produce", -1): 1, ("bogus", -1): 1})
    cm.refused({"leadership_lost": 3})
    cm.refused({"leadership_lost": 1, "mode_changed": 2})
    cm.snapshot("written")
    cm.snapshot("failed")
    cm.snapshot("written")
    cm.fold()
    get = registry.get_sample_value
    assert get("queue_server_trans_id") == 120
    assert get("queue_server_commit_trans_id") == 118
    assert get("queue_server_role", {"role": "leader"}) == 1
    assert get("queue_server_role", {"role": "follower"}) == 0
    assert get("queue_server_term") == 4
    assert get("queue_server_elections_total") == 1
    assert get("queue_server_replication_lag_records", {"follower": "2"}) == 5
    assert get("queue_server_log_fsync_seconds_count") == 1
    assert get("queue_server_requests_total", {"action": "produce", "code": "-1"}) == 3
    assert get("queue_server_requests_total", {"action": "unknown", "code": "-1"}) == 1
    assert get("queue_server_writes_refused_total", {"reason": "leadership_lost"}) == 4
    assert get("queue_server_writes_refused_total", {"reason": "mode_changed"}) == 2
    assert get("queue_server_snapshots_total", {"result": "written"}) == 2
    assert get("queue_server_snapshots_total", {"result": "failed"}) == 1
    cm.set_role("follower")
    cm.forget_follower(2)
    cm.fold()
    assert get("queue_server_role", {"role": "follower"}) == 1
    assert get("queue_server_replication_lag_records", {"follower": "2"}) == 0
    assert get("queue_server_elections_total") == 1
    with pytest.raises(ValueError):
        cm.set_role("king")


def test_with_queue_groups_the_log_role_term_and_lag_series_carry_the_group():
    registry = CollectorRegistry()
    cm = m.CoordinatorMetrics(registry, grouped=True)
    cm.set_trans_id(120, committed=118, group=0)
    cm.set_trans_id(7, committed=7, group=2)
    cm.set_role("leader", term=4, group=0)
    cm.set_role("follower", term=9, group=2)
    cm.set_follower_lag(3, 5, group=0)
    cm.fold()
    get = registry.get_sample_value
    assert (get("queue_server_trans_id", {"group": "0"}), get("queue_server_trans_id", {"group": "2"})) == (120, 7)
    assert get("queue_server_commit_trans_id", {"group": "0"}) == 118
    assert get("queue_server_role", {"role": "leader", "group": "0"}) == 1
    assert get("queue_server_role", {"role": "follower", "group": "2"}) == 1
    assert (get("queue_server_term", {"group": "0"}), get("queue_server_term", {"group": "2"})) == (4, 9)
    assert get("queue_server_replication_lag_records", {"follower": "3", "group": "0"}) == 5
    assert get("queue_server_trans_id") is None  # no series without the label
    cm.forget_follower(3, group=0)
    cm.fold()
    assert get("queue_server_replication_lag_records", {"follower": "3", "group": "0"}) == 0


def _observed(node: ClusterNode) -> CollectorRegistry:
    """What a coordinator around `node` publishes once it has handed the node's figures over."""
    coordinator = Coordinator.__new__(Coordinator)  # its I/O is not used here
    coordinator.node, coordinator.storage, coordinator.zap, coordinator.last_election_role = node, None, None, {}
    registry = CollectorRegistry()
    coordinator.metrics = m.CoordinatorMetrics(registry)
    coordinator.observe()
    coordinator.metrics.fold()
    return registry


def test_the_coordinator_publishes_the_replies_it_made_itself():
    node = ClusterNode(_config(3), T0, recovered=Recovered(), rng=random.Random(1))  # no leader known
    node.on_forward_requests([(Origin(3), 0, {"action": p.PRODUCE, "queue": "q"}),
                              (Origin(3), 1, {"action": "consume", "queue": "q"})], T0)
    _drain(node)
    registry = _observed(node)
    assert samples(registry, "queue_server_requests_total") == {("produce", "-1"): 1, ("consume", "-1"): 1}
    assert samples(_observed(node), "queue_server_requests_total") == {}  # handed over once


def test_the_coordinator_publishes_the_workers_replies_it_refused_as_refusals_not_requests():
    node = ClusterNode(_config(1), T0, recovered=Recovered(), rng=random.Random(1))
    node.tick(T0 + 1)  # leads
    _batch(node, node.epoch - 1, [PRODUCE])
    _drain(node)
    registry = _observed(node)
    assert samples(registry, "queue_server_writes_refused_total") == {
        (label,): 1 if label == "mode_changed" else 0 for label in REFUSAL_LABELS}
    assert samples(registry, "queue_server_requests_total") == {}  # the worker counted it


def test_labels():
    assert m.action_label(1) == "produce"
    assert m.action_label("local_monitor") == "local_monitor"
    assert m.action_label(55) == "unknown"
    assert m.action_label(None) == "missing"
    assert m.code_label(-2) == "-2"
    assert m.code_label(None) == "none"


def test_with_metrics_off_local_counts_do_not_pile_up(monkeypatch):
    monkeypatch.delenv(m.ENV, raising=False)
    wm = m.WorkerMetrics(CollectorRegistry())
    wm.active = False  # as in a node without metrics_port
    count_replies(wm.counts, [(1, i, {"action": f"bogus-{i}", "code": -1}) for i in range(1000)])
    assert len(wm.counts) == 1000
    wm.fold(lambda: pytest.fail("queue totals are not computed with metrics off"))
    assert wm.counts == {}


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    """The values of `name`'s samples in `registry`, by their label values."""
    return {tuple(s.labels.values()): s.value
            for family in registry.collect() for s in family.samples if s.name == name}


def test_series_of_known_label_values_start_at_zero():
    registry, coordinator = CollectorRegistry(), CollectorRegistry()
    m.AcceptorMetrics(registry)
    m.CoordinatorMetrics(coordinator)
    assert samples(registry, "queue_server_requests_total") == {(action, code): 0 for action in p.ACTION_NAMES for code in ("0", "-1")}
    assert samples(registry, "queue_server_received_requests_total") == {("tcp",): 0, ("udp",): 0, ("http",): 0}
    assert samples(registry, "queue_server_auth_failures_total") == {("failed",): 0, ("throttled",): 0}
    assert samples(registry, "queue_server_limit_refusals_total") == {(limit,): 0 for limit in limits.LIMITS}
    assert samples(coordinator, "queue_server_peer_rejected_total") == {
        (reason,): 0 for reason in ("unknown_src", "src_not_sender", "other_cluster", "other_placement", "bad_key")}
    assert samples(coordinator, "queue_server_writes_refused_total") == {
        (reason,): 0 for reason in ("leadership_lost", "leadership_changed", "mode_changed", "storage_unavailable",
                                    "not_leader")}


def test_only_the_acceptor_starts_the_node_wide_series():
    registry = CollectorRegistry()
    m.WorkerMetrics(registry)
    assert samples(registry, "queue_server_requests_total") == {}
    assert samples(registry, "queue_server_limit_refusals_total") == {}


def test_folds_count_no_label_value_beyond_those_at_zero():
    registry = CollectorRegistry()
    am = m.AcceptorMetrics(registry)
    am.fold(open_connections=1, tcp_requests=5, udp_requests=2, connections_opened=1, auth_failed=3, auth_throttled=1)
    assert samples(registry, "queue_server_received_requests_total") == {("tcp",): 5, ("udp",): 2, ("http",): 0}
    assert samples(registry, "queue_server_auth_failures_total") == {("failed",): 3, ("throttled",): 1}


def test_http_requests_are_counted_apart_from_tcp():
    registry = CollectorRegistry()
    am = m.AcceptorMetrics(registry)
    for status in (200, 200, 404):
        am.http_answered(status)
    am.fold(open_connections=0, tcp_requests=5, udp_requests=0, connections_opened=1, http_connections=1,
            http_requests=3, http_connections_opened=2)
    assert samples(registry, "queue_server_received_requests_total") == {("tcp",): 5, ("udp",): 0, ("http",): 3}
    assert samples(registry, "queue_server_http_requests_total") == {("200",): 2, ("404",): 1}
    assert samples(registry, "queue_server_http_connections_opened_total") == {(): 2}
    assert samples(registry, "queue_server_tcp_connections_opened_total") == {(): 1}
    am.http_answered(503)
    am.fold(open_connections=0, tcp_requests=5, udp_requests=0, connections_opened=1, http_requests=4,
            http_connections_opened=2)  # running totals: only what is new is added
    assert samples(registry, "queue_server_received_requests_total")[("http",)] == 4
    assert samples(registry, "queue_server_http_requests_total") == {("200",): 2, ("404",): 1, ("503",): 1}


def _limit_counted(call: ast.Call) -> str | None:
    """The limit a call of count_limit(counts, limit) or _refused(limit) counts, if it is one."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name not in ("count_limit", "_refused"):
        return None
    arg = call.args[-1]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "limits":
        return getattr(limits, arg.attr)
    return f"<{ast.unparse(arg)}: not a name of protocol/limits.py>"


def test_every_limit_counted_is_one_of_the_limits():
    counted: dict[str, list[str]] = {}
    for package in (server, workers):
        for path in Path(package.__file__).parent.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                limit = _limit_counted(node) if isinstance(node, ast.Call) else None
                if limit is not None:
                    counted.setdefault(limit, []).append(f"{path.name}:{node.lineno}")
    unknown = {limit: where for limit, where in counted.items() if limit not in limits.LIMITS}
    assert not unknown, f"limits counted but missing from protocol/limits.py LIMITS: {unknown}"
    assert set(counted) == set(limits.LIMITS), "a name in LIMITS that nothing counts"



def test_every_reason_the_coordinator_refuses_for_has_a_label():
    """GroupNode._refuse (and ClusterNode's) count by REFUSALS[reason]: a reason without a label
    would be counted only as "other"."""
    reasons = set()
    for name in ("cluster.py", "group_node.py"):
        path = Path(server.__file__).parent / name
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_refuse":
                reasons |= {getattr(p, n.attr) for n in ast.walk(node.args[-1])
                            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "p"}
    assert reasons == set(REFUSALS)
