"""A real single node over TCP and UDP: every action and extension, framing styles, pipelining,
long polls, and the bad-input battery."""
from __future__ import annotations

import socket
import struct
import threading
import time

import orjson
import pytest

from tests.harness import RawTcp, udp_call, wait_for
from tests.integration.conftest import AUTH_TOKEN


@pytest.fixture
def tcp(node):
    conn = RawTcp(*node.address)
    yield conn
    conn.close()


def test_produce_consume_confirm_over_tcp(tcp, qname):
    r = tcp.call({"action": 1, "queue": qname, "data": "hello", "retry": 30, "seq": 1})
    assert r["code"] == 0 and r["seq"] == 1 and isinstance(r["msg_id"], int)
    got = tcp.call({"action": 2, "queue": qname})
    assert (got["msg_id"], got["data"], got["delivery_count"]) == (r["msg_id"], "hello", 1)
    assert tcp.call({"action": 3, "queue": qname, "msg_id": r["msg_id"]})["confirmed"] == 1
    assert "msg_id" not in tcp.call({"action": 2, "queue": qname})


def test_actions_by_name_and_over_udp(node, qname):
    host, port = node.address
    r = udp_call(host, port, {"action": "produce", "queue": qname, "data": "u"})
    assert r["code"] == 0
    got = udp_call(host, port, {"action": "consume", "queue": qname})
    assert got["data"] == "u" and got["msg_id"] == r["msg_id"]
    assert udp_call(host, port, {"action": "leader"})["leader_port"] == port


def test_at_most_once_is_deleted_on_consume(tcp, qname):
    tcp.call({"action": 1, "queue": qname, "data": "once"})
    assert tcp.call({"action": 2, "queue": qname})["data"] == "once"
    assert "msg_id" not in tcp.call({"action": 2, "queue": qname})


def test_at_least_once_redelivered_after_retry(tcp, qname):
    """An unconfirmed at-least-once message comes back -- the same message, counted as delivered
    twice -- once its retry interval has passed, and not before."""
    retry = 1.0
    produced = tcp.call({"action": 1, "queue": qname, "data": "again", "retry": retry})
    leased_at = time.monotonic()  # the lease starts after this: when the worker takes the consume
    first = tcp.call({"action": 2, "queue": qname})
    assert (first["msg_id"], first["data"], first["delivery_count"]) == (produced["msg_id"], "again", 1)

    def redelivered() -> dict | None:
        reply = tcp.call({"action": 2, "queue": qname})
        return reply if "msg_id" in reply else None
    # polled from right after the first delivery: an early redelivery is seen early
    second = wait_for(redelivered, retry + 10, "the redelivery")
    elapsed = time.monotonic() - leased_at
    assert (second["msg_id"], second["data"], second["delivery_count"]) == (produced["msg_id"], "again", 2)
    assert elapsed >= retry, f"redelivered {elapsed:.3f} s after the consume, before its {retry} s retry"
    assert "msg_id" not in tcp.call({"action": 2, "queue": qname})  # leased again: not a third time


def test_delay_and_priority(tcp, qname):
    tcp.call({"action": 1, "queue": qname, "data": "later", "delay": 0.4})
    tcp.call({"action": 1, "queue": qname, "data": "low"})
    tcp.call({"action": 1, "queue": qname, "data": "high", "priority": 5})
    assert tcp.call({"action": 2, "queue": qname})["data"] == "high"
    assert tcp.call({"action": 2, "queue": qname})["data"] == "low"
    assert "msg_id" not in tcp.call({"action": 2, "queue": qname})
    got = tcp.call({"action": 2, "queue": qname, "wait": 3})
    assert got["data"] == "later"


def test_batches(tcp, qname):
    r = tcp.call({"action": 1, "queue": qname, "data": [f"m{i}" for i in range(250)], "retry": 60})
    ids = r["msg_ids"]
    assert len(ids) == 250 and ids == sorted(ids)
    got = tcp.call({"action": 2, "queue": qname, "count": 1000})["messages"]
    assert [m["data"] for m in got] == [f"m{i}" for i in range(250)]
    assert all(m["delivery_count"] == 1 for m in got)
    assert tcp.call({"action": 3, "queue": qname, "msg_ids": ids})["confirmed"] == 250
    mon = tcp.call({"action": 4, "queue": qname})
    assert mon["size"] == 0 and mon["max_id"] == ids[-1]


def test_release_and_extend(tcp, qname):
    tcp.call({"action": 1, "queue": qname, "data": "x", "retry": 60})
    m = tcp.call({"action": 2, "queue": qname})
    assert tcp.call({"action": "extend", "queue": qname, "msg_id": m["msg_id"], "retry": 120})["extended"] == 1
    assert tcp.call({"action": "release", "queue": qname, "msg_id": m["msg_id"]})["released"] == 1
    assert tcp.call({"action": 2, "queue": qname})["delivery_count"] == 2


def test_virtual_queue_produce(tcp):
    r = tcp.call({"action": 1, "queue": "fan", "data": "both"})
    assert set(r["msg_ids"]) == {"fan_a", "fan_b"}
    assert tcp.call({"action": 2, "queue": "fan_a"})["data"] == "both"
    assert tcp.call({"action": 2, "queue": "fan_b"})["data"] == "both"
    assert tcp.call({"action": 2, "queue": "fan"})["code"] == -1


def test_monitor_list_leader(node, tcp, qname):
    tcp.call({"action": 1, "queue": qname, "data": "a"})
    tcp.call({"action": 1, "queue": qname, "data": "b", "delay": 60})
    for action in (4, 104):
        mon = tcp.call({"action": action, "queue": qname})
        assert (mon["code"], mon["size"], mon["ready"], mon["delayed"], mon["max_size"]) == (0, 2, 1, 1, 1000)
        assert mon["node_id"] == 1 and mon["leader_node_id"] == 1 and mon["trans_id"] >= 2
    total = tcp.call({"action": 4})
    assert total["size"] >= 2 and total["queue_count"] >= 1
    for action in (7, 107):
        lst = tcp.call({"action": action, "pattern": qname[:30]})
        assert qname in lst["queue_list"] and lst["queue_count"] == len(lst["queue_list"])
    leader = tcp.call({"action": 8})
    assert (leader["leader_node_id"], leader["leader_host"], leader["leader_port"]) == (1, *node.address)


def test_long_poll_served_by_a_produce_on_another_connection(node, tcp, qname):
    tcp.send({"action": 2, "queue": qname, "wait": 5, "seq": "lp"})
    other = RawTcp(*node.address)
    try:
        wait_for(lambda: other.call({"action": 4, "queue": qname})["waiters"] == 1, 5, "the poll to park")
        other.call({"action": 1, "queue": qname, "data": "wake"})
    finally:
        other.close()
    r = tcp.recv()
    assert r["seq"] == "lp" and r["data"] == "wake"


def test_long_poll_times_out_empty(tcp, qname):
    start = time.monotonic()
    r = tcp.call({"action": 2, "queue": qname, "wait": 0.3})
    assert r["code"] == 0 and "msg_id" not in r and time.monotonic() - start >= 0.25


def test_closed_connection_drops_its_long_poll(node, qname):
    """Closing a connection cancels its parked poll: a later produce is not handed to it."""
    poller = RawTcp(*node.address)
    poller.send({"action": 2, "queue": qname, "wait": 5})
    probe = RawTcp(*node.address)
    try:
        wait_for(lambda: probe.call({"action": 4, "queue": qname})["waiters"] == 1, 5, "the poll to park")
        poller.close()
        wait_for(lambda: probe.call({"action": 4, "queue": qname})["waiters"] == 0, 5, "the poll to be cancelled")
        probe.call({"action": 1, "queue": qname, "data": "kept"})
        assert probe.call({"action": 2, "queue": qname})["data"] == "kept"
    finally:
        probe.close()


@pytest.mark.parametrize("retry", [0, 60], ids=["at-most-once", "at-least-once"])
def test_consume_reply_for_a_connection_gone_gives_the_message_back(node, qname, retry):
    """A consume reply that reaches the acceptor after its connection is gone goes back to the
    worker (acceptor `deliver` -> `undeliver`, worker `undeliver`): an at-most-once message is
    restored, an at-least-once lease released, and the next consumer gets it -- once.

    Made deterministic by pausing the acceptor (SIGSTOP) while a produce arrives on one
    connection and, after it, an RST on the connection whose long poll the produce will serve.
    Resumed, the acceptor reads both in one poll: it sends the produce to the worker, then
    (connection lost) the cancel of that connection's polls, in this order on the same pipe. So
    the worker serves the parked poll before it hears of the close, and the reply comes back to
    an acceptor that has already forgotten the connection.
    """
    gone = socket.create_connection(node.address, timeout=10)
    other = RawTcp(*node.address)
    producer = RawTcp(*node.address)
    probe = RawTcp(*node.address)
    gone_port = gone.getsockname()[1]
    try:
        gone.sendall(orjson.dumps({"action": 2, "queue": qname, "wait": 5, "seq": "gone"}) + b"\n")
        wait_for(lambda: probe.call({"action": 4, "queue": qname})["waiters"] == 1, 5, "the first poll to park")
        other.send({"action": 2, "queue": qname, "wait": 5, "seq": "other"})
        wait_for(lambda: probe.call({"action": 4, "queue": qname})["waiters"] == 2, 5, "the second poll to park")

        with node.child_stopped("acceptor"):
            producer.send({"action": 1, "queue": qname, "data": "kept", "retry": retry})
            producer_port = producer.sock.getsockname()[1]
            wait_for(lambda: (node.server_side(producer_port) or (0, 0))[1] > 0, 5, "the produce to arrive")
            gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            gone.close()  # linger 0: an RST
            wait_for(lambda: node.server_side(gone_port) is None, 5, "the RST to close the node's end")

        got = other.recv()
        assert got["seq"] == "other" and "msg_id" in got, f"the message was not given back: {got}"
        produced = producer.recv()
        # the message itself (not a copy), counted as never delivered (at most once: restored)
        # or as delivered once before (at least once: its lease was released)
        assert (got["msg_id"], got["data"], got["delivery_count"]) == (produced["msg_id"], "kept", 2 if retry else 1)
        assert "msg_id" not in probe.call({"action": 2, "queue": qname}), "delivered twice"
        stats = probe.call({"action": 4, "queue": qname})
        assert (stats["size"], stats["in_flight"], stats["waiters"]) == ((1, 1, 0) if retry else (0, 0, 0))
    finally:
        for conn in (other, producer, probe):
            conn.close()
        gone.close()


def test_pipelining_keeps_reply_order_across_workers(tcp, qname):
    reqs = []
    for i in range(300):
        reqs.append({"action": 1, "queue": f"{qname}-{i % 7}", "data": str(i), "seq": i})
    tcp.send(b"".join(orjson.dumps(r) + b"\n" for r in reqs))
    seqs = [tcp.recv()["seq"] for _ in reqs]
    assert seqs == list(range(300))


def test_original_client_style_bare_objects_back_to_back(node, qname):
    """Like the original's PHP client: bare JSON, absolute timestamps, no newline."""
    now = int(time.time())
    s = socket.create_connection(node.address, timeout=5)
    try:
        payload = b"".join(
            orjson.dumps({"action": 1, "queue": qname, "data": f"php{i}", "delay": now, "ttl": now + 300, "retry": 1})
            for i in range(3)
        )
        s.sendall(payload)
        buf = b""
        while buf.count(b"\n") < 3:
            buf += s.recv(65536)
        ids = [orjson.loads(line)["msg_id"] for line in buf.split(b"\n")[:3]]
        s.sendall(orjson.dumps({"action": 2, "queue": qname}))
        buf = b""
        while b"\n" not in buf:
            buf += s.recv(65536)
        first = orjson.loads(buf)
        assert first["msg_id"] == ids[0] and first["data"] == "php0"
    finally:
        s.close()
    # unconfirmed at-least-once message comes back after its retry interval
    tcp = RawTcp(*node.address)
    try:
        tcp.call({"action": 2, "queue": qname})
        tcp.call({"action": 2, "queue": qname})
        again = wait_for(lambda: tcp.call({"action": 2, "queue": qname}).get("msg_id"), 5, "redelivery")
        assert again == ids[0]
    finally:
        tcp.close()


def test_udp_reply_too_large(node, qname):
    host, port = node.address
    udp_call(host, port, {"action": 1, "queue": qname, "data": "x" * 3000})
    udp_call(host, port, {"action": 1, "queue": qname, "data": "y" * 3000})
    r = udp_call(host, port, {"action": 2, "queue": qname, "count": 2})
    assert r["code"] == -1 and "too large" in r["reason"]


BAD = [
    (b"{not json}\n", "malformed"),
    (b"[1, 2]\n", "request"),
    (b"42\n", "request"),
    (b'{"queue": "q"}\n', "action"),
    (b'{"action": 77, "queue": "q"}\n', "action"),
    (b'{"action": "fly", "queue": "q"}\n', "action"),
    (b'{"action": 1, "data": "x"}\n', "queue"),
    (b'{"action": 1, "queue": 5, "data": "x"}\n', "queue"),
    (b'{"action": 1, "queue": "q", "data": {"a": 1}}\n', "data"),
    (b'{"action": 1, "queue": "q", "data": ["a", 2]}\n', "data"),
    (b'{"action": 1, "queue": "q", "data": "x", "delay": "1"}\n', "delay"),
    (b'{"action": 1, "queue": "q", "data": "x", "ttl": "1"}\n', "ttl"),
    (b'{"action": 1, "queue": "q", "data": "x", "retry": "1"}\n', "retry"),
    (b'{"action": 1, "queue": "q", "data": "x", "retry": -5}\n', "retry"),
    (b'{"action": 1, "queue": "q", "data": "x", "delay": 100, "ttl": 50}\n', "ttl"),
    (b'{"action": 2, "queue": "q", "count": 0}\n', "count"),
    (b'{"action": 2, "queue": "q", "count": 5000}\n', "count"),
    (b'{"action": 2, "queue": "q", "wait": "x"}\n', "wait"),
    (b'{"action": 1, "queue": "' + b"x" * 300 + b'", "data": "x"}\n', "queue"),
    (b'{"action": 1, "queue": "a\\u0001b", "data": "x"}\n', "queue"),
    (b'{"action": 1, "queue": "q", "data": "\xff\xfe"}\n', "invalid UTF-8"),
    (b"[" * 5000 + b"]" * 5000 + b"\n", ""),
]


def with_auth_token(datagram: bytes) -> bytes:
    """The datagram with AUTH_TOKEN as its first field, when it is a JSON object."""
    if not datagram.startswith(b"{"):
        return datagram
    return b'{"auth_token": "' + AUTH_TOKEN.encode() + b'", ' + datagram[1:]


def parses_as_object(datagram: bytes) -> bool:
    try:
        return type(orjson.loads(datagram)) is dict
    except orjson.JSONDecodeError:
        return False


def assert_no_reply(host: str, port: int, datagram: bytes) -> None:
    """The node drops `datagram`: the first reply on the socket is the one to a valid probe sent
    after it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(datagram, (host, port))
        s.sendto(orjson.dumps({"action": 8, "seq": "probe", "auth_token": AUTH_TOKEN}), (host, port))
        reply = orjson.loads(s.recvfrom(1 << 16)[0])
    assert reply.get("seq") == "probe", (datagram[:60], reply)


@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])
def test_bad_input_battery_one_error_each_and_connection_stays_usable(request, auth, qname):
    """Every bad request gets one error naming its field, over TCP and UDP; with auth on (the
    connection authenticated first, datagrams carrying auth_token) the same, except that a
    datagram that is not a JSON object cannot carry a token: it gets no reply at all."""
    node = request.getfixturevalue("authed_node" if auth else "node")
    host, port = node.address
    tcp = RawTcp(host, port)
    try:
        if auth:
            assert tcp.call({"action": "auth", "token": AUTH_TOKEN})["code"] == 0
        kept = tcp.call({"action": 1, "queue": qname, "data": "precious", "retry": 60})
        for raw, field in BAD:
            tcp.send(raw)
            r = tcp.recv()
            assert r["code"] == -1, raw[:60]
            assert field.lower() in r["reason"].lower(), (raw[:60], r)
            datagram = with_auth_token(raw.rstrip(b"\n")) if auth else raw.rstrip(b"\n")
            if auth and not parses_as_object(datagram):
                assert_no_reply(host, port, datagram)
                continue
            u = udp_call(host, port, datagram)
            assert u["code"] == -1, raw[:60]
            assert field.lower() in u["reason"].lower(), (raw[:60], u)
        assert tcp.call({"action": 4, "queue": qname})["size"] == 1
        got = tcp.call({"action": 2, "queue": qname})
        assert got["msg_id"] == kept["msg_id"] and got["data"] == "precious"
    finally:
        tcp.close()


def test_oversized_request_gets_a_reply_then_the_connection_closes(node, qname):
    tcp = RawTcp(*node.address)
    try:
        tcp.send(b'{"action": 1, "queue": "q", "data": "' + b"z" * 70000 + b'"}\n')
        r = tcp.recv()
        assert r["code"] == -1 and "max_request_size" in r["reason"]
        assert wait_for(tcp.closed_by_peer, 5, "the connection to close")
    finally:
        tcp.close()
    fresh = RawTcp(*node.address)
    assert fresh.call({"action": 1, "queue": qname, "data": "after"})["code"] == 0
    fresh.close()


def test_lost_framing_replies_then_closes_only_that_connection(node, qname):
    bad = RawTcp(*node.address)
    good = RawTcp(*node.address)
    try:
        bad.send(b'{"action": 1 "queue": }')
        r = bad.recv()
        assert r["code"] == -1 and "malformed" in r["reason"]
        assert wait_for(bad.closed_by_peer, 5, "the connection to close")
        assert good.call({"action": 1, "queue": qname, "data": "fine"})["code"] == 0
    finally:
        bad.close()
        good.close()


def test_many_concurrent_clients(node, qname):
    errors = []

    def client(i: int) -> None:
        try:
            c = RawTcp(*node.address)
            for j in range(50):
                assert c.call({"action": 1, "queue": qname, "data": f"{i}-{j}"})["code"] == 0
            c.close()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    tcp = RawTcp(*node.address)
    assert tcp.call({"action": 4, "queue": qname})["size"] == 400
    tcp.close()
