"""The /metrics endpoint of a real node: Prometheus text format, counters that move with traffic,
queue sizes, latency samples, and a clean start failure when metrics_port is taken."""
from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from queue_server.protocol import limits
from queue_server.protocol import vocabulary as p
from tests.harness import Cluster, NodeProcess, RawTcp, free_port, http, udp_call, wait_for

Samples = dict[tuple[str, frozenset], float]


def scrape(port: int) -> Samples:
    """Every sample of http://127.0.0.1:port/metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("metrics"))
    node = NodeProcess(workdir, {"metrics_port": free_port(), "workers": 2}).start()
    wait_for(lambda: _reachable(node.config["metrics_port"]), 10, "the metrics endpoint")
    yield node
    node.stop()


def _reachable(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


def test_counters_move_after_traffic(metered):
    port = metered.config["metrics_port"]
    host, client_port = metered.address
    before = scrape(port)
    tcp = RawTcp(host, client_port)
    try:
        for i in range(5):
            assert tcp.call({"action": 1, "queue": "m-a", "data": f"t{i}", "retry": 30})["code"] == 0
        first = tcp.call({"action": 2, "queue": "m-a"})
        tcp.call({"action": "consume", "queue": "m-a"})
        assert tcp.call({"action": 3, "queue": "m-a", "msg_id": first["msg_id"]})["confirmed"] == 1
        assert tcp.call({"action": 1, "queue": "m-b", "data": "later", "delay": 3600})["code"] == 0
        assert tcp.call({"action": 99, "queue": "m-a"})["code"] == -1
        assert tcp.call({"action": 1, "queue": "m-a", "data": 5})["code"] == -1
        tcp.call({"action": 8})
        tcp.call({"action": 4})
        tcp.call({"action": 7})
    finally:
        tcp.close()
    for i in range(3):
        assert udp_call(host, client_port, {"action": 1, "queue": "m-a", "data": f"u{i}", "retry": 30})["code"] == 0

    expected = {
        ("queue_server_requests_total", (("action", "produce"), ("code", "0"))): 9,
        ("queue_server_requests_total", (("action", "produce"), ("code", "-1"))): 1,
        ("queue_server_requests_total", (("action", "consume"), ("code", "0"))): 2,
        ("queue_server_requests_total", (("action", "confirm"), ("code", "0"))): 1,
        ("queue_server_requests_total", (("action", "unknown"), ("code", "-1"))): 1,
        ("queue_server_requests_total", (("action", "leader"), ("code", "0"))): 1,
        ("queue_server_requests_total", (("action", "monitor"), ("code", "0"))): 1,
        ("queue_server_requests_total", (("action", "list"), ("code", "0"))): 1,
        ("queue_server_received_requests_total", (("transport", "tcp"),)): 14,
        ("queue_server_received_requests_total", (("transport", "udp"),)): 3,
        ("queue_server_tcp_connections_opened_total", ()): 1,
    }

    def moved() -> Samples | None:
        now = scrape(port)
        for (name, labels), delta in expected.items():
            if value(now, name, **dict(labels)) - value(before, name, **dict(labels)) < delta:
                return None
        return now

    after = wait_for(moved, 10, "the request counters to move")
    assert value(after, "queue_server_request_latency_seconds_count", action="produce") > value(
        before, "queue_server_request_latency_seconds_count", action="produce")
    assert value(after, "queue_server_worker_batch_requests_count") > value(before, "queue_server_worker_batch_requests_count")
    assert value(after, "queue_server_node_info", node_id="1", node_type="10") == 1
    for process in ("acceptor", "coordinator", "worker-0", "worker-1"):
        assert value(after, "queue_server_process_resident_memory_bytes", process=process) > 0


def test_queue_sizes(metered):
    port = metered.config["metrics_port"]
    tcp = RawTcp(*metered.address)
    try:
        for i in range(4):
            tcp.call({"action": 1, "queue": "sizes", "data": str(i), "retry": 30})
        tcp.call({"action": 1, "queue": "sizes", "data": "d", "delay": 3600})
        tcp.call({"action": 2, "queue": "sizes"})
        totals = tcp.call({"action": 4})
    finally:
        tcp.close()
    # The gauges sum every worker's queues; the node-wide monitor reply is the reference.
    want = {state: totals[state] for state in ("ready", "delayed", "in_flight")}
    assert want["in_flight"] >= 1 and want["delayed"] >= 1

    def settled() -> bool:
        s = scrape(port)
        got = {state: value(s, "queue_server_messages", state=state) for state in want}
        return got == want and value(s, "queue_server_queues") == totals["queue_count"]

    wait_for(settled, 10, f"queue gauges to read {want}")


def test_series_of_known_label_values_are_there_before_any_count(metered):
    s = scrape(metered.config["metrics_port"])
    for limit in limits.LIMITS:
        assert s[("queue_server_limit_refusals_total", frozenset({("limit", limit)}))] == 0
    for outcome in ("failed", "throttled"):
        assert s[("queue_server_auth_failures_total", frozenset({("outcome", outcome)}))] == 0
    for reason in ("unknown_src", "src_not_sender", "other_cluster", "other_placement", "bad_key"):
        assert s[("queue_server_peer_rejected_total", frozenset({("reason", reason)}))] == 0
    for reason in ("leadership_lost", "leadership_changed", "mode_changed", "storage_unavailable", "not_leader"):
        assert s[("queue_server_writes_refused_total", frozenset({("reason", reason)}))] == 0
    for transport in ("tcp", "udp", "http"):
        assert ("queue_server_received_requests_total", frozenset({("transport", transport)})) in s
    for action in p.ACTION_NAMES:
        for code in ("0", "-1"):
            assert ("queue_server_requests_total", frozenset({("action", action), ("code", code)})) in s


def test_http_requests_are_counted_as_http_and_the_tcp_counts_stay_tcps(tmp_path):
    """A node that no TCP client sends a request to: its HTTP requests, whatever they ask, are
    HTTP's in every count (requests, connections, statuses), none TCP's."""
    node = NodeProcess(str(tmp_path), {"metrics_port": free_port(), "http_port": free_port()}).start()
    try:  # start() made one TCP connection (it waits until the node accepts one), and no request
        port, web = node.config["metrics_port"], node.config["http_port"]
        assert http(web, "POST", "/v1/queues/hm/messages", {"data": "x"})[0] == 201
        assert http(web, "GET", "/v1/queues/hm/messages")[0] == 200
        assert http(web, "GET", "/v1/nope")[0] == 404
        assert http(web, "GET", "/healthz")[0] == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/", timeout=5) as page:  # the status page
            assert page.status == 200

        def counted() -> Samples | None:
            s = scrape(port)
            return s if value(s, "queue_server_received_requests_total", transport="http") == 5 else None
        s = wait_for(counted, 10, "the HTTP requests to be counted")
        assert {status: value(s, "queue_server_http_requests_total", status=status) for status in ("200", "201", "404")} \
            == {"200": 3, "201": 1, "404": 1}
        assert value(s, "queue_server_http_connections_opened_total") == 5
        assert value(s, "queue_server_received_requests_total", transport="tcp") == 0
        assert value(s, "queue_server_tcp_connections_opened_total") == 1
        assert value(s, "queue_server_requests_total", action="produce", code="0") == 1  # every transport's
    finally:
        node.stop()


def test_prometheus_text_format_is_well_formed(metered):
    with urllib.request.urlopen(f"http://127.0.0.1:{metered.config['metrics_port']}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "# TYPE queue_server_requests_total counter" in text
    assert "# TYPE queue_server_request_latency_seconds histogram" in text
    assert re.search(r'^queue_server_request_latency_seconds_bucket\{action="produce",le="\+Inf"\} \d', text, re.M)


def test_a_taken_metrics_port_stops_the_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node = NodeProcess(str(tmp_path), {"metrics_port": taken.getsockname()[1]})
        node.start(wait=False)
        try:
            assert node.proc.wait(15) == 1
        finally:
            node.stop()
    assert "metrics_port" in node.log()


def test_metrics_are_off_by_default(tmp_path):
    from queue_server.config.loader import load_config

    config, _ = load_config(None, {})
    assert config.metrics_port == 0
    node = NodeProcess(str(tmp_path)).start()
    try:
        run_dir = re.search(r"run dir (\S+)\)", wait_for(lambda: "run dir" in node.log() and node.log(), 10, "log")).group(1)
        assert not os.path.exists(os.path.join(run_dir, "metrics"))
        assert "metrics on" not in node.log()
    finally:
        node.stop()


def test_coordinator_figures(metered):
    port = metered.config["metrics_port"]
    tcp = RawTcp(*metered.address)
    try:
        tcp.call({"action": 1, "queue": "coord", "data": "x"})
        trans_id = tcp.call({"action": 4})["trans_id"]
    finally:
        tcp.close()

    def published() -> bool:
        s = scrape(port)
        return (value(s, "queue_server_trans_id") >= trans_id
                and value(s, "queue_server_role", role="leader") == 1
                and value(s, "queue_server_term") >= 1)
    wait_for(published, 10, "the coordinator's trans_id, role and term")


def get(port: int, path: str) -> tuple[int, dict]:
    """(status, JSON body) of GET http://127.0.0.1:port/path, error statuses included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_health_endpoints_and_404(metered):
    port = metered.config["metrics_port"]
    assert get(port, "/healthz") == (200, {"healthy": True})
    assert wait_for(lambda: get(port, "/readyz")[0] == 200 and get(port, "/readyz"), 10,
                    "a single node to be ready") == (200, {"ready": True, "role": "leader"})
    status, body = get(port, "/nope")
    assert status == 404 and "/readyz" in body["reason"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/", timeout=5) as r:
        assert r.status == 200 and b"queue_server_role" in r.read()


def test_readyz_waits_for_a_leader(tmp_path):
    """A lone node of a 3-node config is alive but not ready; once a second node joins and a
    leader is elected, it is ready."""
    c = Cluster(str(tmp_path), 3)
    port = free_port()
    c.nodes[1].config["metrics_port"] = port
    try:
        c.nodes[1].start(wait=False)
        wait_for(lambda: _get_or_none(port, "/healthz") == (200, {"healthy": True}), 15, "/healthz")
        status, body = wait_for(lambda: (r := get(port, "/readyz"))[1]["role"] and r, 10,
                                "the coordinator to report its role")
        assert status == 503 and body["ready"] is False and "majority" in body["reason"]
        assert body["role"] == "candidate"
        # ...and says, every 10 s, which peers it cannot reach
        line = wait_for(lambda: next((l for l in c.nodes[1].log().splitlines() if "no leader for" in l), None),
                        20, "the no-leader report")
        assert "1 of 3 nodes reachable, a majority is 2" in line and "node 2 (" in line and "node 3 (" in line
        c.nodes[2].start(wait=False)
        _, body = wait_for(lambda: (r := _get_or_none(port, "/readyz")) and r[0] == 200 and r, 30,
                           "node 1 to be ready once it has a majority")
        assert body["role"] in ("leader", "follower")
    finally:
        c.stop()


def _get_or_none(port: int, path: str) -> tuple[int, dict] | None:
    try:
        return get(port, path)
    except OSError:
        return None

