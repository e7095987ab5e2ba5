"""Limits on a real node, each reached while the node keeps serving its existing clients and
loses nothing stored: max_connections (TCP and HTTP, one budget), idle_timeout (TCP and HTTP),
max_pending_requests, max_queues, max_memory_mb."""
from __future__ import annotations

import http.client
import json
import threading

import orjson
import pytest

from queue_server.server.node_memory import NodeMemory
from tests.harness import NodeProcess, RawTcp, free_port, metric, wait_for


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    node = NodeProcess(str(tmp_path_factory.mktemp("limits")), {
        "in_memory": True, "metrics_port": free_port(), "http_port": free_port(), "max_connections": 3,
        "idle_timeout": 2, "max_pending_requests": 16}).start()
    yield node
    node.stop()


def refusals(node: NodeProcess, limit: str) -> float:
    return metric(node.config["metrics_port"], "queue_server_limit_refusals_total", limit=limit)


def test_a_connection_past_max_connections_is_told_why_and_closed(limited):
    first, second = RawTcp(*limited.address), RawTcp(*limited.address)
    try:
        assert first.call({"action": 1, "queue": "conns", "data": "a"})["code"] == 0
        assert second.call({"action": 1, "queue": "conns", "data": "b"})["code"] == 0
        third = RawTcp(*limited.address)  # with the harness's probes, the node may hold one more
        fourth = RawTcp(*limited.address)
        refused = []
        for conn in (third, fourth):
            conn.send({"action": 4, "queue": "conns"})
            reply = conn.recv()
            if reply["code"] == -1:
                refused.append(conn)
                assert reply["reason"].startswith("too many connections: this node's max_connections (3) is reached")
        assert refused and refused[0].closed_by_peer()
        for conn in (third, fourth):
            conn.close()
        # the existing clients are served, nothing stored is lost
        assert first.call({"action": 2, "queue": "conns"})["data"] == "a"
        assert second.call({"action": 2, "queue": "conns"})["data"] == "b"
        wait_for(lambda: refusals(limited, "max_connections") >= 1, 10, "the refusal counted")
    finally:
        first.close()
        second.close()


def http_get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict]:
    """status and body; the server's `Connection: close` is in the body as `_closes`."""
    conn.request("GET", path)
    response = conn.getresponse()
    body = json.loads(response.read())
    body["_closes"] = response.getheader("Connection") == "close"
    return response.status, body


def http_closed(conn: http.client.HTTPConnection) -> bool:
    assert conn.sock is not None
    conn.sock.settimeout(10)
    return conn.sock.recv(1) == b""


def test_http_connections_count_in_max_connections(limited):
    port = limited.config["http_port"]
    first, second = RawTcp(*limited.address), RawTcp(*limited.address)
    webs = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(3)]
    try:
        assert first.call({"action": 1, "queue": "web", "data": "a"})["code"] == 0
        assert second.call({"action": 4, "queue": "web"})["code"] == 0
        # two TCP connections of 3: one HTTP connection may be served, the next is past the limit
        answers = [http_get(w, "/v1/queues/web") for w in webs[:2]]
        assert 503 in [status for status, _ in answers]
        assert all(body["_closes"] for status, body in answers if status == 503)
        status, body = http_get(webs[2], "/healthz")  # past the limit too, but health is answered
        assert status == 200
        status, body = http_get(webs[2], "/v1/queues/web")
        assert status == 503 and body["reason"].startswith("too many connections: this node's max_connections (3)")
        assert body["_closes"]
        # HTTP connections count against TCP ones too
        third = RawTcp(*limited.address)
        try:
            assert third.call({"action": 4, "queue": "web"})["reason"].startswith("too many connections")
        finally:
            third.close()
        for w in webs:
            w.close()
        # once HTTP connections close, the budget is back: existing and new clients are served
        assert first.call({"action": 2, "queue": "web"})["data"] == "a"
        again = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            wait_for(lambda: http_get(again, "/v1/queues/web")[0] == 200, 10, "an HTTP connection served again")
        finally:
            again.close()
    finally:
        first.close()
        second.close()
        for w in webs:
            w.close()


def test_an_idle_http_connection_is_closed_a_long_poll_is_not(limited):
    port = limited.config["http_port"]
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    polling = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    polled: list = []
    poller = threading.Thread(target=lambda: polled.append(http_get(polling, "/v1/queues/webpoll/messages?wait=6")))
    try:
        assert http_get(idle, "/v1/queues/webidle")[0] == 200
        poller.start()
        assert http_closed(idle)  # after idle_timeout (2 s)
        tcp_idle = RawTcp(*limited.address)  # the TCP idle check goes on beside the HTTP long poll
        try:
            assert tcp_idle.call({"action": 4, "queue": "webidle"})["code"] == 0
            assert tcp_idle.closed_by_peer()
        finally:
            tcp_idle.close()
        producer = RawTcp(*limited.address)
        try:
            assert producer.call({"action": 1, "queue": "webpoll", "data": "x"})["code"] == 0
        finally:
            producer.close()
        poller.join(15)
        assert polled and polled[0][0] == 200 and polled[0][1]["data"] == "x"  # outlived idle_timeout
    finally:
        idle.close()
        polling.close()


def test_an_idle_connection_is_closed_a_long_poll_is_not(limited):
    idle, polling = RawTcp(*limited.address), RawTcp(*limited.address)
    try:
        assert idle.call({"action": 1, "queue": "idle", "data": "kept", "delay": 3600})["code"] == 0
        polling.send({"action": 2, "queue": "later", "wait": 8})
        assert idle.closed_by_peer()  # after idle_timeout (2 s)
        producer = RawTcp(*limited.address)
        try:
            assert producer.call({"action": 1, "queue": "later", "data": "x"})["code"] == 0
            assert producer.call({"action": 4, "queue": "idle"})["delayed"] == 1  # nothing stored lost
        finally:
            producer.close()
        assert polling.recv()["data"] == "x"  # the long poll outlived idle_timeout
        wait_for(lambda: refusals(limited, "idle_timeout") >= 1, 10, "the idle close counted")
    finally:
        idle.close()
        polling.close()


def test_pending_requests_past_the_cap_pause_reading_and_are_all_answered(limited):
    conn = RawTcp(*limited.address)
    try:
        n = 2000
        conn.sock.sendall(b"".join(orjson.dumps({"action": 1, "queue": "pipelined", "data": str(i)}) + b"\n"
                                   for i in range(n)))
        replies = [conn.recv() for _ in range(n)]
        assert all(r["code"] == 0 for r in replies)
        assert conn.call({"action": 4, "queue": "pipelined"})["ready"] == n
        wait_for(lambda: refusals(limited, "max_pending_requests") >= 1, 10, "the pause counted")
    finally:
        conn.close()


def test_a_produce_creating_a_queue_past_max_queues_is_refused_existing_queues_work(tmp_path):
    node = NodeProcess(str(tmp_path), {"in_memory": True, "metrics_port": free_port(), "max_queues": 4,
                                       "dead_letter_suffix": ""}).start()
    conn = RawTcp(*node.address)
    try:
        created, refused = [], None
        for i in range(40):  # 2 workers, a share of 2 each: at most 4 queues, whatever the hashing
            reply = conn.call({"action": 1, "queue": f"q{i}", "data": f"m{i}"})
            if reply["code"] == 0:
                created.append(i)
            else:
                refused = reply
        assert refused is not None and refused["reason"].startswith("too many queues: this node's max_queues (4)")
        assert 2 <= len(created) <= 4
        for i in created:  # existing queues keep working; nothing stored is lost
            assert conn.call({"action": 1, "queue": f"q{i}", "data": "more"})["code"] == 0
            assert conn.call({"action": 2, "queue": f"q{i}"})["data"] == f"m{i}"
        assert sorted(conn.call({"action": 7})["queue_list"]) == sorted(f"q{i}" for i in created)
        wait_for(lambda: refusals(node, "max_queues") >= 1, 10, "the refusal counted")
    finally:
        conn.close()
        node.stop()


def node_resident_mb(node: NodeProcess) -> float:
    assert node.proc is not None
    return NodeMemory(node.proc.pid, 0).used(0.0) / (1 << 20)


def test_produce_past_max_memory_mb_is_refused_consume_confirm_purge_work(tmp_path):
    probe = NodeProcess(str(tmp_path), {"in_memory": True}, name="probe").start()
    try:
        baseline = node_resident_mb(probe)
    finally:
        probe.stop()
    limit = int(baseline) + 48
    node = NodeProcess(str(tmp_path), {"in_memory": True, "metrics_port": free_port(),
                                       "max_memory_mb": limit}).start()
    conn = RawTcp(*node.address)
    try:
        block = "x" * (256 << 10)
        stored, refused = 0, None
        for i in range(4000):  # 1 GB of data: far past the limit
            reply = conn.call({"action": 1, "queue": "big", "data": f"{i}:{block}", "retry": 30})
            if reply["code"] != 0:
                refused = reply
                break
            stored += 1
        assert refused is not None, f"never refused ({node_resident_mb(node):.0f} MiB, limit {limit})"
        assert refused["reason"].startswith(f"node memory limit reached: this node's processes use more than max_memory_mb ({limit})")
        assert node_resident_mb(node) < limit + 200  # refused long before the memory ran away
        assert conn.call({"action": 4, "queue": "big"})["ready"] == stored  # nothing stored lost
        got = conn.call({"action": 2, "queue": "big"})
        assert got["code"] == 0 and got["data"].startswith("0:")
        assert conn.call({"action": 3, "queue": "big", "msg_id": got["msg_id"]})["code"] == 0
        assert conn.call({"action": 1, "queue": "big", "data": "small"})["code"] == -1  # still over
        assert conn.call({"action": 21, "queue": "big"})["code"] == 0  # purge
        assert conn.call({"action": 4, "queue": "big"})["size"] == 0
        wait_for(lambda: refusals(node, "max_memory_mb") >= 1, 10, "the refusal counted")
    finally:
        conn.close()
        node.stop()


def test_with_overflow_max_memory_mb_counts_what_the_node_holds_and_a_purge_ends_the_refusal(tmp_path):
    """A node on disk counts what its workers hold for their messages (bodies in memory and their
    bookkeeping, memory_bytes), not RSS: produces are refused past it, and a purge ends the
    refusal at once (RSS would stay up: the allocator keeps freed memory)."""
    node = NodeProcess(str(tmp_path), {"workers": 1, "overflow_mb": 1, "max_memory_mb": 4,
                                       "metrics_port": free_port()}).start()
    conn = RawTcp(*node.address)
    try:
        batch = ["x" * 100] * 1000
        stored, refused = 0, None
        for _ in range(200):  # 200k messages: 85 B each alone is past 4 MiB
            reply = conn.call({"action": 1, "queue": "big", "data": batch})
            if reply["code"] != 0:
                refused = reply
                break
            stored += len(batch)
        assert refused is not None, "never refused"
        assert refused["reason"].startswith("node memory limit reached: this node holds more for its messages "
                                            "than max_memory_mb (4)"), refused
        monitor = conn.call({"action": 4})
        assert monitor["size"] == stored and monitor["overflowed"] > 0
        # read every 0.5 s: past it by what came meanwhile (up to ~4 MiB more on a quiet machine)
        assert 4 << 20 < monitor["memory_bytes"] < 16 << 20
        assert conn.call({"action": 21, "queue": "big"})["code"] == 0  # purge
        wait_for(lambda: conn.call({"action": 1, "queue": "big", "data": "small"})["code"] == 0, 10,
                 "produces served again once the purge freed what the node held")
        wait_for(lambda: refusals(node, "max_memory_mb") >= 1, 10, "the refusal counted")
        wait_for(lambda: "worker 0 holds" in node.log() and "back under its share" in node.log(), 10,
                 "the refusal and its end logged")
    finally:
        conn.close()
        node.stop()
