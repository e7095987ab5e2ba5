"""The HTTP API's pure parts: a route's protocol request, a reply's status, the cluster view, the
OpenAPI document."""
from __future__ import annotations

import pytest

from queue_server.protocol import vocabulary as p
from queue_server.server.http_openapi import openapi
from queue_server.server.http_routes import (AUTH_MISSING, LEADER_HEADER, LEADER_HTTP_HEADER, ROUTES, bearer,
                                             build, cluster_view, leader_headers, leader_http, scalar, status_of)

ROUTE = {(r.method, r.path): r for r in ROUTES}
PRODUCE = ROUTE["POST", "/v1/queues/{queue}/messages"]
CONSUME = ROUTE["GET", "/v1/queues/{queue}/messages"]
CONFIRM = ROUTE["DELETE", "/v1/queues/{queue}/messages/{msg_id}"]


def test_produce_takes_the_body_fields_and_the_queue_from_the_path():
    req = build(PRODUCE, {"queue": "jobs"}, {}, b'{"data": ["a", "b"], "retry": 30, "queue": "other", "action": 3}')
    assert req == {"action": "produce", "queue": "jobs", "data": ["a", "b"], "retry": 30}


def test_query_values_become_json_values_and_bad_ones_stay_strings_for_the_protocol_to_refuse():
    req = build(CONSUME, {"queue": "q"}, {"count": "2", "wait": "1.5", "times": "true", "token": "t/1"}, b"")
    assert req == {"action": "consume", "queue": "q", "count": 2, "wait": 1.5, "times": True, "token": "t/1"}
    assert build(CONSUME, {"queue": "q"}, {"count": "two"}, b"")["count"] == "two"
    assert scalar("[1, 2]") == [1, 2] and scalar("nan") == "nan" and scalar("[x") == "[x"
    deep = "[" * 300 + "]" * 300  # deeper than a node passes on: left a string, for the protocol to refuse
    assert scalar(deep) == deep


def test_msg_id_comes_from_the_path():
    assert build(CONFIRM, {"queue": "q", "msg_id": "17"}, {}, b"") == {"action": "confirm", "queue": "q", "msg_id": 17}


@pytest.mark.parametrize("body, reason", [
    (b"{", "malformed JSON"),
    (b"[1]", "request: must be a JSON object"),
    (b'{"data": "x", "extra": ' + b"[" * 300 + b"]" * 300 + b"}", "malformed JSON: nests deeper than 128 levels"),
])
def test_a_body_that_is_no_object_is_refused(body, reason):
    assert build(PRODUCE, {"queue": "q"}, {}, body).startswith(reason)


def test_a_route_without_body_refuses_one():
    assert build(CONSUME, {"queue": "q"}, {}, b'{"count": 1}').startswith("body: ")


@pytest.mark.parametrize("reply, status", [
    ({"code": 0}, 201),
    ({"code": -2, "leader_host": "h", "leader_port": 1}, 409),
    ({"code": -1, "reason": "no leader"}, 503),
    ({"code": -1, "reason": "queue full"}, 503),
    ({"code": -1, "reason": "forwarded request timed out: the leader did not answer"}, 503),
    ({"code": -1, "reason": "request exceeds max_request_size (1024 bytes)"}, 413),
    ({"code": -1, "reason": AUTH_MISSING}, 401),
    ({"code": -1, "reason": "authentication failed"}, 403),
    ({"code": -1, "reason": "retry: must be >= 0"}, 400),
    ({"code": -1}, 400),
])
def test_status_of_a_reply(reply, status):
    assert status_of(reply, ok=201) == status


@pytest.mark.parametrize("reason", [p.NO_LEADER, p.LEADERSHIP_CHANGED, p.NOT_LEADING, p.NOT_LEADER_RETRY,
                                    p.MODE_CHANGED, p.LEADERSHIP_LOST, p.LEADER_CHANGED, p.FORWARD_TIMED_OUT,
                                    p.STORAGE_UNAVAILABLE, p.QUEUE_FULL])
def test_every_not_now_reason_is_503(reason):
    assert status_of({"code": -1, "reason": reason}) == 503
    assert p.try_again({"code": -1, "reason": reason})
    assert not p.try_again({"code": 0, "reason": reason})


def test_a_redirect_names_the_leader_in_headers():
    redirect = {"code": -2, "leader_node_id": 3, "leader_host": "10.0.0.3", "leader_port": 1113}
    headers = leader_headers(redirect)
    assert headers[LEADER_HEADER] == "10.0.0.3:1113" and LEADER_HTTP_HEADER not in headers
    assert leader_headers({"code": 0}) == {}
    http = leader_http(redirect, {3: 8113})
    assert http == "http://10.0.0.3:8113" and leader_headers(redirect, http)[LEADER_HTTP_HEADER] == http
    assert leader_http(redirect, {1: 8111}) is None  # the list does not name the leader's http_port
    assert leader_http({**redirect, "leader_host": "::1"}, {3: 8113}) == "http://[::1]:8113"
    assert leader_http({"code": 0}, {3: 8113}) is None


def test_bearer():
    assert bearer("Bearer abc ") == "abc" and bearer("bearer abc") == "abc"
    assert bearer(None) is None and bearer("Basic abc") is None


def test_cluster_view_on_a_follower_combines_its_own_and_the_leaders_view():
    local = {"code": 0, "node_id": 2, "role": "follower", "vote_id": 4, "trans_id": 90, "commit_trans_id": 88,
             "leader_node_id": 1}
    leader = {"code": 0, "node_id": 1, "role": "leader", "vote_id": 4, "trans_id": 100, "commit_trans_id": 99,
              "followers": [{"node_id": 2, "match_trans_id": 90, "lag": 10, "client_host": "h", "client_port": 2},
                            {"node_id": 3, "match_trans_id": 100, "lag": 0, "client_host": "", "client_port": 0}]}
    view = cluster_view(local, leader, [1, 2, 3])
    assert view["leader_node_id"] == 1
    rows = {n["node_id"]: n for n in view["nodes"]}
    assert [rows[i]["role"] for i in (1, 2, 3)] == ["leader", "follower", "follower"]
    assert (rows[2]["trans_id"], rows[2]["lag"], rows[2]["commit_trans_id"]) == (90, 10, 88)
    assert (rows[3]["trans_id"], rows[3]["vote_id"], rows[3]["lag"]) == (100, 4, 0)


def test_cluster_view_says_what_the_answering_node_holds_in_memory_and_on_disk():
    local = {"code": 0, "node_id": 2, "role": "leader", "vote_id": 4, "trans_id": 9, "leader_node_id": 2,
             "memory_bytes": 4096, "overflow_bytes": 1 << 20, "followers": []}
    rows = {n["node_id"]: n for n in cluster_view(local, local, [1, 2, 3])["nodes"]}
    assert (rows[2]["memory_bytes"], rows[2]["overflow_bytes"]) == (4096, 1 << 20)
    assert "memory_bytes" not in rows[1]  # another node's is not known here
    without = {k: v for k, v in local.items() if not k.endswith("_bytes")}  # overflow off
    own = next(n for n in cluster_view(without, without, [2])["nodes"])
    assert "memory_bytes" not in own and "overflow_bytes" not in own


def test_cluster_view_without_a_leader_shows_the_others_unknown():
    local = {"code": 0, "node_id": 2, "role": "none", "vote_id": 7, "trans_id": 5, "leader_node_id": 0}
    view = cluster_view(local, {"code": -1, "reason": "no leader"}, [1, 2, 3])
    assert view["leader_node_id"] is None
    assert [n["role"] for n in view["nodes"]] == ["unknown", "none", "unknown"]


def test_cluster_view_with_queue_groups_carries_this_node_s_row_of_each_group():
    rows = [{"group": g, "leader_node_id": g + 1, "role": "leader" if g == 1 else "follower", "trans_id": 10 + g,
             "commit_trans_id": 10 + g, "replicas": [1 + (g + i) % 3 for i in range(3)]} for g in range(3)]
    local = {"code": 0, "node_id": 2, "role": "follower", "vote_id": 4, "trans_id": 10, "leader_node_id": 1,
             "groups": rows}
    assert cluster_view(local, None, [1, 2, 3])["groups"] == rows
    assert "groups" not in cluster_view({k: v for k, v in local.items() if k != "groups"}, None, [1, 2, 3])


def test_openapi_lists_every_route():
    doc = openapi(ROUTES)
    assert doc["openapi"].startswith("3.")
    for route in ROUTES:
        op = doc["paths"][route.path][route.method.lower()]
        assert str(route.ok) in op["responses"] and "409" in op["responses"]
    assert "/v1/cluster" in doc["paths"]


def test_openapi_document_is_valid_openapi_3():
    validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator (the test extra)")
    validator.validate(openapi(ROUTES))
