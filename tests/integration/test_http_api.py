"""The HTTP API (docs/http.md) over real sockets on a 3-node cluster: every route on the leader
and on a follower, with and without a token, every error status, a long poll that returns when a
message arrives."""
from __future__ import annotations

import threading
import time
from urllib.parse import quote

import pytest

from tests.harness import Cluster, http, wait_for

TOKEN = "s3cret-token"


def http_port(cluster: Cluster, node_id: int) -> int:
    return cluster.nodes[node_id].config["http_port"]


def http_leader(cluster: Cluster) -> int | None:
    """The leader every node names in GET /v1/cluster, once they agree and it says it leads."""
    views = set()
    for node_id in cluster.nodes:
        try:
            status, _, body = http(http_port(cluster, node_id), "GET", "/v1/cluster", token=TOKEN, timeout=2)
        except OSError:
            return None
        roles = {n["node_id"]: n["role"] for n in body.get("nodes", ())}
        views.add(body.get("leader_node_id") if status == 200 and roles.get(body.get("leader_node_id")) == "leader" else None)
    return views.pop() if len(views) == 1 else None


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A cluster with auth_token_file (followers forward): (cluster, leader, follower)."""
    workdir = tmp_path_factory.mktemp("http-secured")
    (workdir / "token").write_text(TOKEN + "\n")
    cluster = Cluster(str(workdir), 3, http=True, workers=1, max_request_size=4096, max_wait=10,
                      auth_token_file=str(workdir / "token")).start()
    try:
        leader = wait_for(lambda: http_leader(cluster), 20, "the nodes to agree on a leader over HTTP")
        follower = next(i for i in cluster.nodes if i != leader)

        def relays() -> bool:
            status, _, body = http(http_port(cluster, follower), "GET", "/v1/queues/probe", token=TOKEN)
            return status == 200 and body["node_id"] == leader
        wait_for(relays, 15, "the follower to relay HTTP requests to the leader")
        yield cluster, leader, follower
    finally:
        cluster.stop()


@pytest.fixture(params=["leader", "follower"])
def port(request, secured) -> int:
    cluster, leader, follower = secured
    return http_port(cluster, leader if request.param == "leader" else follower)


def call(port: int, method: str, path: str, body=None) -> tuple[int, dict, dict]:
    return http(port, method, path, body, token=TOKEN)


def test_produce_consume_confirm(port, qname):
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "hello", "retry": 30})
    assert (status, body["code"]) == (201, 0) and body["msg_id"] == 1
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages", {"data": ["a", "b"], "priority": -1})
    assert (status, body["msg_ids"]) == (201, [2, 3])
    status, _, body = call(port, "GET", f"/v1/queues/{qname}/messages")
    assert (status, body["msg_id"], body["data"], body["delivery_count"]) == (200, 1, "hello", 1)
    status, _, body = call(port, "DELETE", f"/v1/queues/{qname}/messages/1")
    assert (status, body["confirmed"]) == (200, 1)
    status, _, body = call(port, "GET", f"/v1/queues/{qname}/messages?count=5")
    assert status == 200 and [m["data"] for m in body["messages"]] == ["a", "b"]
    status, _, body = call(port, "GET", f"/v1/queues/{qname}/messages")
    assert status == 200 and "msg_id" not in body  # nothing ready: code 0, no message


def test_release_and_extend(port, qname):
    call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "x", "retry": 60})
    msg_id = call(port, "GET", f"/v1/queues/{qname}/messages")[2]["msg_id"]
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages/{msg_id}/extend", {"retry": 120})
    assert (status, body["extended"]) == (200, 1)
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages/{msg_id}/extend?retry=90")
    assert (status, body["extended"]) == (200, 1)
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages/{msg_id}/release")
    assert (status, body["released"]) == (200, 1)
    assert call(port, "GET", f"/v1/queues/{qname}/messages")[2]["delivery_count"] == 2


def test_list_monitor_peek_pause_purge_delete(port, qname):
    call(port, "POST", f"/v1/queues/{qname}/messages", {"data": ["a", "b", "c"]})
    call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "later", "delay": 600})
    status, _, body = call(port, "GET", f"/v1/queues?pattern={qname}")
    assert (status, body["queue_list"]) == (200, [qname])
    status, _, body = call(port, "GET", f"/v1/queues/{qname}")
    assert status == 200 and (body["ready"], body["delayed"], body["in_flight"], body["dead"]) == (3, 1, 0, 0)
    assert body["produced"] == 4
    status, _, body = call(port, "GET", f"/v1/queues/{qname}/peek?count=2")
    assert status == 200 and [m["data"] for m in body["messages"]] == ["a", "b"]
    cursor = quote(str(body["cursor"]).replace(" ", ""))
    status, _, body = call(port, "GET", f"/v1/queues/{qname}/peek?count=2&after={cursor}")
    assert status == 200 and [m["data"] for m in body["messages"]] == ["c"]
    assert call(port, "POST", f"/v1/queues/{qname}/pause")[2]["paused"] is True
    assert "msg_id" not in call(port, "GET", f"/v1/queues/{qname}/messages")[2]
    assert call(port, "POST", f"/v1/queues/{qname}/resume")[2]["changed"] == 1
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/purge")
    assert (status, body["purged"]) == (200, 4)
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/dlq_replay")
    assert (status, body["moved"]) == (200, 0)
    status, _, body = call(port, "DELETE", f"/v1/queues/{qname}")
    assert (status, body["deleted"]) == (200, 1)
    assert call(port, "GET", f"/v1/queues?pattern={qname}")[2]["queue_list"] == []


def test_cluster_names_every_node_and_its_role(secured, port):
    cluster, leader, follower = secured
    status, _, body = call(port, "GET", "/v1/cluster")
    assert status == 200 and body["leader_node_id"] == leader
    roles = {n["node_id"]: n["role"] for n in body["nodes"]}
    assert roles == {i: "leader" if i == leader else "follower" for i in cluster.nodes}
    assert all(n["trans_id"] is not None and n["vote_id"] >= 1 and n["lag"] >= 0 for n in body["nodes"])


def test_long_poll_returns_when_a_message_arrives(port, qname):
    result: dict = {}

    def consume() -> None:
        started = time.monotonic()
        result["reply"] = call(port, "GET", f"/v1/queues/{qname}/messages?wait=8")
        result["took"] = time.monotonic() - started
    waiter = threading.Thread(target=consume)
    waiter.start()
    wait_for(lambda: call(port, "GET", f"/v1/queues/{qname}")[2]["waiters"] == 1, 5, "the long poll to park")
    call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "wake"})
    waiter.join(10)
    status, _, body = result["reply"]
    assert (status, body["data"]) == (200, "wake") and result["took"] < 6


def test_without_a_token_401_with_a_wrong_one_403(port, qname):
    status, _, body = http(port, "POST", f"/v1/queues/{qname}/messages", {"data": "x"})
    assert (status, body["code"]) == (401, -1) and "Bearer" in body["reason"]
    status, _, body = http(port, "GET", "/v1/cluster", token="wrong")
    assert (status, body["reason"]) == (403, "authentication failed")
    # the page, the API document and the health endpoints need no token
    assert http(port, "GET", "/v1/openapi.json")[0] == 200
    assert http(port, "GET", "/readyz")[0] == 200 and http(port, "GET", "/healthz")[0] == 200


def test_bad_input_400_unknown_route_404_wrong_method_405_too_large_413(port, qname):
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "x", "retry": -1})
    assert (status, body["reason"]) == (400, "retry: must be >= 0")
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages", b"{not json")
    assert status == 400 and body["reason"].startswith("malformed JSON")
    status, _, body = call(port, "GET", f"/v1/queues/{qname}/messages?count=0")
    assert (status, body["reason"]) == (400, "count: must be 1..1000")
    status, _, body = call(port, "GET", "/v1/nothing")
    assert (status, body["reason"]) == (404, "route: no GET /v1/nothing (GET /v1/openapi.json lists the routes)")
    status, headers, body = call(port, "PUT", f"/v1/queues/{qname}/messages")
    assert (status, body["reason"]) == (405, f"route: no PUT /v1/queues/{qname}/messages; it takes GET, POST")
    assert headers["Allow"] == "GET, POST"
    status, _, body = call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "x" * 5000})
    assert status == 413 and body["reason"].startswith("request exceeds max_request_size")


@pytest.fixture(scope="module")
def redirecting(tmp_path_factory):
    """A cluster without a token whose followers redirect (forward_request 0)."""
    cluster = Cluster(str(tmp_path_factory.mktemp("http-redirect")), 3, http=True, workers=1,
                      forward_request=0).start()
    try:
        yield cluster, cluster.wait_leader()
    finally:
        cluster.stop()


def test_a_follower_that_redirects_answers_409_naming_the_leader(redirecting, qname):
    cluster, leader = redirecting
    follower = next(i for i in cluster.nodes if i != leader)
    status, headers, body = http(http_port(cluster, follower), "POST", f"/v1/queues/{qname}/messages", {"data": "x"})
    host, port = cluster.nodes[leader].address
    assert (status, body["code"], body["leader_node_id"]) == (409, -2, leader)
    assert headers["X-Queue-Leader"] == f"{host}:{port}" and headers["X-Queue-Leader-Node"] == str(leader)
    leader_http = f"http://{host}:{http_port(cluster, leader)}"  # cluster_node_list names each http_port
    assert headers["X-Queue-Leader-Http"] == leader_http and body["leader_http"] == leader_http
    # without auth_token_file no token is needed; the leader serves it
    status, _, body = http(http_port(cluster, leader), "POST", f"/v1/queues/{qname}/messages", {"data": "x"})
    assert (status, body["msg_id"]) == (201, 1)
    # a follower answers its own view of the cluster
    assert http(http_port(cluster, follower), "GET", "/v1/cluster")[2]["leader_node_id"] == leader


def test_no_leader_503(redirecting, qname):
    """Runs last in this module: it stops two nodes of the cluster."""
    cluster, leader = redirecting
    survivor = next(i for i in cluster.nodes if i != leader)
    for node_id, node in cluster.nodes.items():
        if node_id != survivor:
            node.stop()

    # While the two stop one after the other, the survivor may briefly lead or follow a new leader
    # (two of three can elect one): wait for the end state, no leader.
    def refused() -> bool:
        status, _, body = http(http_port(cluster, survivor), "POST", f"/v1/queues/{qname}/messages", {"data": "x"})
        return (status, body.get("reason")) == (503, "no leader")
    wait_for(refused, 20, "the survivor to answer 503 no leader")
    status, _, body = http(http_port(cluster, survivor), "GET", "/readyz")
    assert (status, body["ready"]) == (503, False)


def test_a_client_that_leaves_a_long_poll_loses_no_message(secured, port, qname):
    """On the leader the parked consume is dropped at once; a follower's forwarded one stays parked
    on the leader, and the message its reply brings back to nobody is given back (as over TCP)."""
    import socket
    cluster, leader, _ = secured
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"GET /v1/queues/{qname}/messages?wait=8 HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    wait_for(lambda: call(port, "GET", f"/v1/queues/{qname}")[2]["waiters"] == 1, 5, "the long poll to park")
    sock.close()
    if port == http_port(cluster, leader):
        wait_for(lambda: call(port, "GET", f"/v1/queues/{qname}")[2]["waiters"] == 0, 5, "the long poll to be dropped")
    call(port, "POST", f"/v1/queues/{qname}/messages", {"data": "kept"})
    wait_for(lambda: call(port, "GET", f"/v1/queues/{qname}/messages")[2].get("data") == "kept", 10,
             "the message to be consumable")


def test_sigterm_answers_an_http_long_poll_and_exits_0(tmp_path):
    import signal

    from tests.harness import NodeProcess, free_port
    node = NodeProcess(str(tmp_path), {"shutdown_grace": 5, "max_wait": 60, "http_port": free_port()}).start()
    port = node.config["http_port"]
    try:
        result: dict = {}

        def consume() -> None:
            result["reply"] = http(port, "GET", "/v1/queues/jobs/messages?wait=30", timeout=20)
            result["at"] = time.monotonic()
        waiter = threading.Thread(target=consume)
        waiter.start()
        wait_for(lambda: http(port, "GET", "/v1/queues/jobs")[2]["waiters"] == 1, 10, "the long poll to park")
        started = time.monotonic()
        node.signal(signal.SIGTERM)
        waiter.join(15)
        status, _, body = result["reply"]
        assert (status, body["code"]) == (200, 0) and "msg_id" not in body
        assert result["at"] - started < 5, "the long poll was held to its end, not answered at SIGTERM"
        assert node.proc.wait(15) == 0
    finally:
        node.stop()


def test_a_queue_name_with_reserved_characters_is_percent_encoded(port, qname):
    name = f"{qname}/été q"
    path = f"/v1/queues/{quote(name, safe='')}"
    status, _, body = call(port, "POST", f"{path}/messages", {"data": "x"})
    assert (status, body["queue"]) == (201, name)
    assert call(port, "GET", path)[2]["ready"] == 1
