"""Replies that rest on no record leave the worker straight for the acceptor (issue 12): with the
node's coordinator stopped (SIGSTOP), an empty consume and a refused field are still answered,
while a produce waits until it is resumed; and a connection's replies still leave in request
order."""
from __future__ import annotations

import orjson

from tests.harness import RawTcp, wait_for


def _nothing_yet(conn: RawTcp) -> bool:
    """Whether no reply has reached `conn` so far (read without waiting)."""
    if conn.buf:
        return False
    timeout = conn.sock.gettimeout()
    conn.sock.setblocking(False)
    try:
        conn.buf += conn.sock.recv(1 << 16)
    except BlockingIOError:
        pass
    finally:
        conn.sock.settimeout(timeout)
    return not conn.buf


def test_an_empty_consume_and_a_refusal_are_answered_while_the_coordinator_is_stopped(node, qname):
    producer = RawTcp(*node.address)
    reader = RawTcp(*node.address)
    try:
        with node.child_stopped("coordinator"):
            producer.send({"action": 1, "queue": qname, "data": "a", "seq": "p"})
            got = reader.call({"action": 2, "queue": qname + "-empty", "seq": "e"})
            assert (got["code"], got["seq"]) == (0, "e") and "msg_id" not in got
            got = reader.call({"action": 2, "queue": qname, "count": 0, "seq": "bad"})
            assert (got["code"], got["seq"]) == (-1, "bad") and got["reason"].startswith("count: ")
            assert _nothing_yet(producer), "a produce was answered without the coordinator"
        got = producer.recv()
        assert (got["code"], got["seq"]) == (0, "p")
        assert reader.call({"action": 2, "queue": qname})["data"] == "a"
    finally:
        producer.close()
        reader.close()


def test_a_read_answered_first_waits_behind_an_earlier_write_of_its_connection(node, qname):
    """One connection sends a produce, then an empty consume: the consume's reply reaches the
    acceptor first (straight from its worker) but leaves after the produce's."""
    writer = RawTcp(*node.address)
    other = RawTcp(*node.address)
    empty = qname + "-empty"
    try:
        with node.child_stopped("coordinator"):
            writer.send(orjson.dumps({"action": 1, "queue": qname, "data": "a", "seq": 1}) + b"\n"
                        + orjson.dumps({"action": 2, "queue": empty, "seq": 2}) + b"\n")
            port = writer.sock.getsockname()[1]
            # sent on loopback, the bytes wait in the node's receive queue until the acceptor reads them
            wait_for(lambda: (node.server_side(port) or (0, 1))[1] == 0, 5, "the acceptor to read both requests")
            # The acceptor has passed both on; this consume goes to the same worker after the
            # first, and its reply comes back on the same pipe after the first's.
            got = other.call({"action": 2, "queue": empty, "seq": 3})
            assert (got["code"], got["seq"]) == (0, 3)
            assert _nothing_yet(writer), "a reply overtook the produce's of its connection"
        assert [writer.recv()["seq"], writer.recv()["seq"]] == [1, 2]
    finally:
        writer.close()
        other.close()
