"""A reply that cannot be delivered never costs a message, and a client that half-closes gets
every reply it is owed (issue 10, cases 2 and 4)."""
from __future__ import annotations

import asyncio
import logging
import socket
import struct

import orjson
import pytest
import zmq
from prometheus_client import CollectorRegistry

import queue_server.server.acceptor as acceptor_module
from queue_server.config.loader import parse_config
from queue_server.server import ipc
from queue_server.protocol import ipc_frames
from queue_server.server.acceptor import Acceptor
from queue_server.protocol.origin import Origin
from queue_server.server.metrics import AcceptorMetrics
from tests.harness import RawTcp, udp_call, wait_for

TOO_LARGE = "response too large for UDP, use TCP"


# ------------------------------------------------------------------- UDP reply too large


@pytest.mark.parametrize("retry", [0, 30], ids=["at-most-once", "at-least-once"])
@pytest.mark.parametrize("batch", [False, True], ids=["single", "count"])
def test_oversize_udp_consume_takes_nothing(node, qname, retry, batch):
    """A UDP consume whose reply would exceed udp_max_response is refused and takes nothing:
    a TCP consume right after gets the same messages, delivered for the first time."""
    host, port = node.address
    limit = node.config["udp_max_response"]
    datas = [f"{i}" + "x" * (limit // 3) for i in range(4)] if batch else ["y" * (limit + 500)]
    tcp = RawTcp(host, port)
    try:
        produced = tcp.call({"action": 1, "queue": qname, "data": datas if batch else datas[0], "retry": retry})
        assert produced["code"] == 0
        consume: dict = {"action": 2, "queue": qname, "seq": 17}
        if batch:
            consume["count"] = len(datas)
        refused = udp_call(host, port, consume)
        assert refused["code"] == -1 and refused["reason"] == TOO_LARGE
        assert refused["seq"] == 17 and refused["queue"] == qname
        stats = tcp.call({"action": 4, "queue": qname})
        assert (stats["ready"], stats["in_flight"], stats["size"]) == (len(datas), 0, len(datas))
        got = tcp.call(consume)
        assert got["code"] == 0
        messages = got["messages"] if batch else [got]
        assert [m["data"] for m in messages] == datas
        assert [m["delivery_count"] for m in messages] == [1] * len(datas)
    finally:
        tcp.close()


def test_udp_consume_that_fits_still_answers_over_udp(node, qname):
    host, port = node.address
    limit = node.config["udp_max_response"]
    tcp = RawTcp(host, port)
    try:
        tcp.call({"action": 1, "queue": qname, "data": ["a" * (limit // 4), "b" * (limit // 4), "c" * (limit + 500)],
                  "retry": 30})
    finally:
        tcp.close()
    got = udp_call(host, port, {"action": 2, "queue": qname, "count": 2})
    assert got["code"] == 0 and [m["data"][0] for m in got["messages"]] == ["a", "b"]
    assert udp_call(host, port, {"action": 2, "queue": qname})["reason"] == TOO_LARGE


class _Datagrams:
    """Stands in for the acceptor's UDP transport: keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    def sendto(self, data: bytes, addr: object) -> None:
        self.sent.append((bytes(data), addr))


@pytest.mark.parametrize("batch", [False, True], ids=["single", "count"])
def test_acceptor_last_resort_guard_gives_the_messages_back(tmp_path, monkeypatch, batch):
    """Should an oversize consume reply reach the acceptor anyway, the client gets the size
    error and the messages go back (the undeliver path: to the coordinator, which has the
    leader's worker give them back), not lost."""
    # An acceptor in this process: its metrics go to a registry of its own, not the global one.
    monkeypatch.setattr(acceptor_module, "AcceptorMetrics", lambda: AcceptorMetrics(CollectorRegistry()))
    config, _ = parse_config('{"workers": 2, "udp_max_response": 600}')
    ctx = zmq.Context()
    loop = asyncio.new_event_loop()
    try:
        run_dir = str(tmp_path)
        coordinator = ipc.inbox(ctx, run_dir, "coordinator")
        acceptor = Acceptor(config, ctx, run_dir, logging.getLogger("test"), loop)
        transport = acceptor.udp_transport = _Datagrams()  # type: ignore[assignment]
        queue = "guarded"
        if batch:
            reply = {"action": 2, "queue": queue, "count": 2, "seq": 5, "code": 0, "node_id": 1,
                     "messages": [{"msg_id": 3, "data": "x" * 400, "delivery_count": 1},
                                  {"msg_id": 4, "data": "x" * 400, "delivery_count": 1}]}
        else:
            reply = {"action": 2, "queue": queue, "seq": 5, "code": 0, "node_id": 1,
                     "msg_id": 3, "data": "x" * 800, "delivery_count": 1}
        slot = acceptor.udp_register(("127.0.0.1", 9))
        acceptor.deliver(Origin(slot, True), 0, orjson.dumps(reply, option=orjson.OPT_APPEND_NEWLINE))

        (data, addr), = transport.sent
        sent = orjson.loads(data)
        assert addr == ("127.0.0.1", 9)
        assert sent["code"] == -1 and sent["reason"] == TOO_LARGE and sent["seq"] == 5
        assert coordinator.poll(5000), "no undeliver reached the coordinator"
        frames = coordinator.recv_multipart()
        assert frames[0] == ipc_frames.UNDELIVER
        assert ipc_frames.read_undeliver(frames) == (queue, [[3, 1], [4, 1]] if batch else [[3, 1]])
        # A reply that is not a consume's gives nothing back.
        slot = acceptor.udp_register(("127.0.0.1", 9))
        acceptor.deliver(Origin(slot, True), 0, orjson.dumps({"action": 7, "code": 0, "queue_list": ["q" * 700]}))
        assert orjson.loads(transport.sent[-1][0])["reason"] == TOO_LARGE
        assert not coordinator.poll(0)
    finally:
        loop.close()
        ctx.destroy(linger=0)


# ------------------------------------------------------------------- half-closed TCP


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's timeout is the deadline)."""
    chunks = []
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _half_closed_exchange(address: tuple[str, int], payload: bytes) -> list[dict]:
    """Send payload, shut the write side, return every reply line read until EOF. The end of
    the payload and the FIN leave together (TCP_CORK), so the server sees the EOF before it can
    have answered: the replies are all owed to a half-closed connection."""
    with socket.create_connection(address, timeout=15) as s:
        if hasattr(socket, "TCP_CORK"):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = _read_to_eof(s)
    assert data == b"" or data.endswith(b"\n")
    return [orjson.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize("n", [1, 10, 1000])
def test_half_closed_connection_gets_every_reply_in_order(node, qname, n):
    """Pipelined produces and consumes, then shutdown(SHUT_WR): every reply comes back, in
    order, then the server closes."""
    reqs = []
    for i in range(n):
        if i % 3 == 2:
            reqs.append({"action": 2, "queue": qname, "seq": i})
        else:
            reqs.append({"action": 1, "queue": qname, "data": f"m{i}", "seq": i})
    replies = _half_closed_exchange(node.address, b"".join(orjson.dumps(r) + b"\n" for r in reqs))
    assert [r["seq"] for r in replies] == list(range(n))
    assert all(r["code"] == 0 for r in replies)
    produced = [r["data"] for r in reqs if r["action"] == 1]
    consumed = [rep["data"] for req, rep in zip(reqs, replies) if req["action"] == 2]
    assert consumed == produced[: len(consumed)]


def test_half_closed_readme_example_and_a_request_cut_by_the_eof(node, qname):
    """The README's `printf ... | nc -q1` example, bare objects with no final newline, and a
    request the stream ends in the middle of (it gets its error reply too)."""
    q = qname.encode()
    first = _half_closed_exchange(
        node.address, b'{"action":1,"queue":"%s","data":"hello"}\n{"action":2,"queue":"%s"}\n' % (q, q))
    assert [(r["action"], r["code"]) for r in first] == [(1, 0), (2, 0)] and first[1]["data"] == "hello"
    bare = _half_closed_exchange(
        node.address, b'{"action":1,"queue":"%s","data":"a"}{"action":2,"queue":"%s"}' % (q, q))
    assert [r["code"] for r in bare] == [0, 0] and bare[1]["data"] == "a"
    cut = _half_closed_exchange(node.address, b'{"action":4,"queue":"%s"}\n{"action":1,"que' % q)
    assert [r["code"] for r in cut] == [0, -1] and "malformed JSON" in cut[1]["reason"]
    assert _half_closed_exchange(node.address, b"") == []


def test_half_closed_long_poll_is_still_answered(node, qname):
    """A long poll parked on a connection whose client half-closed is answered by a later
    produce, then the connection closes."""
    with socket.create_connection(node.address, timeout=15) as poller:
        poller.sendall(orjson.dumps({"action": 2, "queue": qname, "wait": 5, "seq": 1}) + b"\n")
        poller.shutdown(socket.SHUT_WR)
        probe = RawTcp(*node.address)
        try:
            wait_for(lambda: probe.call({"action": 4, "queue": qname})["waiters"] == 1, 5, "the poll to park")
            assert probe.call({"action": 1, "queue": qname, "data": "late"})["code"] == 0
        finally:
            probe.close()
        replies = [orjson.loads(line) for line in _read_to_eof(poller).splitlines()]
    assert [(r["seq"], r["code"], r.get("data")) for r in replies] == [(1, 0, "late")]


@pytest.mark.parametrize("retry", [0, 30], ids=["at-most-once", "at-least-once"])
def test_reset_connection_gives_back_a_consume_reply_held_behind_a_long_poll(node, qname, retry):
    """A connection closed outright (RST, not a half-close) while a consume reply waits behind
    its parked long poll: the poll is dropped and the consumed message comes back."""
    polled = qname + "-poll"
    probe = RawTcp(*node.address)
    try:
        probe.call({"action": 1, "queue": qname, "data": "held", "retry": retry})
        client = socket.create_connection(node.address, timeout=15)
        client.sendall(orjson.dumps({"action": 2, "queue": polled, "wait": 5}) + b"\n"
                       + orjson.dumps({"action": 2, "queue": qname}) + b"\n")

        def parked_and_taken() -> bool:
            stats = probe.call({"action": 4, "queue": qname})
            taken = stats["in_flight"] == 1 if retry else stats["size"] == 0
            return taken and probe.call({"action": 4, "queue": polled})["waiters"] == 1
        wait_for(parked_and_taken, 5, "the poll to park and the message to be taken")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # linger 0: an RST, not a FIN
        wait_for(lambda: probe.call({"action": 4, "queue": qname})["ready"] == 1, 5, "the message to come back")
        assert probe.call({"action": 4, "queue": polled})["waiters"] == 0
        assert probe.call({"action": 2, "queue": qname})["data"] == "held"
    finally:
        probe.close()
