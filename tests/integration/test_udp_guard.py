"""The UDP amplification guard on a node whose UDP port others can reach (host 0.0.0.0): a
reply to an unauthenticated datagram is at most udp_amplification_limit times its size; past
that the consume is refused before anything is taken. Padding the request, or authenticating,
gets the whole reply."""
from __future__ import annotations

import socket

import orjson
import pytest

from tests.harness import NodeProcess, RawTcp, free_port, metric, udp_call, wait_for

BODY = "x" * 500
TOKEN = "udp guard token"


@pytest.fixture(scope="module")
def exposed(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("udpguard")
    node = NodeProcess(str(workdir), {"host": "0.0.0.0", "in_memory": True, "metrics_port": free_port()}).start()
    yield node
    node.stop()


def produce(node: NodeProcess, queue: str) -> None:
    conn = RawTcp("127.0.0.1", node.config["port"])
    try:
        assert conn.call({"action": 1, "queue": queue, "data": BODY})["code"] == 0
    finally:
        conn.close()


def ready(node: NodeProcess, queue: str) -> int:
    conn = RawTcp("127.0.0.1", node.config["port"])
    try:
        return conn.call({"action": 4, "queue": queue})["ready"]
    finally:
        conn.close()


def test_a_small_request_gets_no_large_reply_and_nothing_is_taken(exposed):
    produce(exposed, "amp")
    request = {"action": 2, "queue": "amp", "seq": 1, "pad": "p" * 10}
    size = len(orjson.dumps(request))
    reply = udp_call("127.0.0.1", exposed.config["port"], request)
    assert (reply["code"], reply["reason"], reply["seq"]) == (-1, "response too large for UDP, use TCP", 1)
    assert len(orjson.dumps(reply)) + 1 <= 3 * size
    assert ready(exposed, "amp") == 1  # refused before taking
    wait_for(lambda: metric(exposed.config["metrics_port"], "queue_server_limit_refusals_total",
                            limit="udp_amplification_limit") >= 1, 10, "the refusal counted")


def test_a_padded_request_gets_the_message(exposed):
    produce(exposed, "padded")
    reply = udp_call("127.0.0.1", exposed.config["port"], {"action": 2, "queue": "padded", "pad": "p" * 250})
    assert reply["code"] == 0 and reply["data"] == BODY


def test_a_request_smaller_than_the_refusal_gets_no_reply(exposed):
    produce(exposed, "tiny")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(10)
        s.sendto(b'{"action":2,"queue":"tiny"}', ("127.0.0.1", exposed.config["port"]))
        # The same queue's next request is served after it: its reply is the first to arrive.
        s.sendto(orjson.dumps({"action": 20, "queue": "tiny", "seq": 2, "pad": "p" * 300}),
                 ("127.0.0.1", exposed.config["port"]))
        reply = orjson.loads(s.recvfrom(1 << 16)[0])
    assert reply["seq"] == 2 and reply["code"] == 0 and len(reply["messages"]) == 1, reply
    assert ready(exposed, "tiny") == 1


def test_authenticated_datagrams_are_not_limited(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    node = NodeProcess(str(tmp_path), {"host": "0.0.0.0", "in_memory": True,
                                       "auth_token_file": str(tmp_path / "token")}).start()
    try:
        conn = RawTcp("127.0.0.1", node.config["port"])
        try:
            assert conn.call({"action": "auth", "token": TOKEN})["code"] == 0
            assert conn.call({"action": 1, "queue": "q", "data": BODY})["code"] == 0
        finally:
            conn.close()
        reply = udp_call("127.0.0.1", node.config["port"], {"action": 2, "queue": "q", "auth_token": TOKEN})
        assert reply["code"] == 0 and reply["data"] == BODY
    finally:
        node.stop()
