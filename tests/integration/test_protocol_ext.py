"""The protocol extensions over a real node: lease tokens, guards, idempotent produce, times."""
from __future__ import annotations

import pytest

from queue_server.client import QueueClient
from tests.harness import RawTcp, udp_call, wait_for


@pytest.fixture
def tcp(node):
    conn = RawTcp(*node.address)
    yield conn
    conn.close()


def test_token_consume_is_retried_not_repeated_and_confirmed_by_token(tcp, qname):
    tcp.call({"action": 1, "queue": qname, "data": [f"m{i}" for i in range(5)]})
    req = {"action": 2, "queue": qname, "count": 3, "token": "r/0", "lease": 30, "times": True}
    first = tcp.call(req)
    again = tcp.call(req)
    assert [m["msg_id"] for m in again["messages"]] == [m["msg_id"] for m in first["messages"]]
    assert again["replayed"] is True and "replayed" not in first
    assert all(m["lease_until"] > m["ready"] and m["ttl"] > m["ready"] for m in first["messages"])
    mon = tcp.call({"action": 4, "queue": qname})
    assert (mon["in_flight"], mon["ready"]) == (3, 2)
    r = tcp.call({"action": 3, "queue": qname, "tokens": ["r/0", "unknown"]})
    assert r["confirmed"] == 3 and "tokens" not in r
    assert tcp.call({"action": 4, "queue": qname})["size"] == 2


def test_token_over_udp(node, qname):
    host, port = node.address
    udp_call(host, port, {"action": 1, "queue": qname, "data": "u"})
    a = udp_call(host, port, {"action": 2, "queue": qname, "token": "t", "lease": 30})
    b = udp_call(host, port, {"action": 2, "queue": qname, "token": "t", "lease": 30})
    assert a["msg_id"] == b["msg_id"] and b["replayed"] is True
    assert udp_call(host, port, {"action": 3, "queue": qname, "token": "t"})["confirmed"] == 1


def test_stale_lease_holder_cannot_touch_the_next_delivery(tcp, qname):
    tcp.call({"action": 1, "queue": qname, "data": "x"})
    stale = tcp.call({"action": 2, "queue": qname, "token": "A", "lease": 0.2})

    def take_as_b() -> dict | None:
        r = tcp.call({"action": 2, "queue": qname, "token": "B", "lease": 60})
        return r if "msg_id" in r else None

    fresh = wait_for(take_as_b, 5, "the lease to end and B to get the message")
    assert fresh["msg_id"] == stale["msg_id"] and fresh["delivery_count"] == 2
    mid = stale["msg_id"]
    assert tcp.call({"action": 3, "queue": qname, "token": "A"})["confirmed"] == 0
    assert tcp.call({"action": 3, "queue": qname, "msg_id": mid, "token": "A"})["confirmed"] == 0
    assert tcp.call({"action": 6, "queue": qname, "msg_id": mid, "delivery_count": 1, "retry": 5})["extended"] == 0
    assert tcp.call({"action": 5, "queue": qname, "msg_ids": [mid], "delivery_counts": [1]})["released"] == 0
    assert tcp.call({"action": 3, "queue": qname, "msg_id": mid, "token": "B"})["confirmed"] == 1


def test_idempotent_produce_over_a_real_node(tcp, qname):
    req = {"action": 1, "queue": qname, "data": ["a", "b"], "producer": "w/1", "sequence": 0}
    first = tcp.call(req)
    again = tcp.call(req)
    assert again["msg_ids"] == first["msg_ids"] and again["duplicate"] is True
    assert tcp.call({"action": 4, "queue": qname})["size"] == 2
    bad = tcp.call(dict(req, data=["a"]))
    assert bad["code"] == -1 and bad["reason"].startswith("sequence:")


def test_idempotent_produce_to_a_virtual_queue(node):
    with QueueClient(node.hosts) as c:
        before = {q: c.monitor(q)["size"] for q in ("fan_a", "fan_b")}
        ids = c.produce_batch("fan", ["x", "y"], producer="app-7", sequence=1)
        assert c.produce_batch("fan", ["x", "y"], producer="app-7", sequence=1) == ids
        assert {q: c.monitor(q)["size"] - before[q] for q in ("fan_a", "fan_b")} == {"fan_a": 2, "fan_b": 2}
        for q in ("fan_a", "fan_b"):
            c.confirm_many(q, ids[q])


def test_extension_errors_name_the_field(tcp, qname):
    for req, field in (
        ({"action": 2, "queue": qname, "lease": -1}, "lease"),
        ({"action": 2, "queue": qname, "token": ""}, "token"),
        ({"action": 3, "queue": qname, "tokens": [1]}, "tokens"),
        ({"action": 1, "queue": qname, "data": "x", "producer": "p"}, "sequence"),
    ):
        r = tcp.call(req)
        assert r["code"] == -1 and r["reason"].startswith(field + ":"), r
