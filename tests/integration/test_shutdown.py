"""Graceful shutdown: on SIGTERM a node stops taking connections, answers pending long polls at
once with an empty result, gives every connection the replies it is owed, and exits 0 within
shutdown_grace."""
from __future__ import annotations

import signal
import time

from queue_server.client import QueueClient
from tests.harness import NodeProcess, RawTcp, wait_for


def test_sigterm_answers_a_pending_long_poll_and_exits_0(tmp_path):
    node = NodeProcess(str(tmp_path), {"shutdown_grace": 5, "max_wait": 60}).start()
    try:
        conn = RawTcp(*node.address, timeout=20)
        conn.send({"action": 2, "queue": "jobs", "wait": 30, "seq": 1})
        wait_for(lambda: node_waiters(node) == 1, 10, "the long poll to be parked")
        started = time.monotonic()
        node.signal(signal.SIGTERM)
        reply = conn.recv()
        answered = time.monotonic() - started
        assert reply["code"] == 0 and reply["seq"] == 1 and "msg_id" not in reply
        assert conn.sock.recv(1) == b""  # then the node closes the connection
        assert node.proc.wait(10) == 0
        exited = time.monotonic() - started
        print(f"long poll answered {answered * 1000:.0f} ms after SIGTERM; node exited after {exited:.2f} s")
        assert answered < 5, "the long poll was held to its end, not answered at SIGTERM"
        assert "drained" in node.log()
        conn.close()
    finally:
        node.stop()


def node_waiters(node: NodeProcess) -> int:
    with QueueClient(node.hosts) as q:
        return q.monitor()["waiters"]


def test_requests_read_before_sigterm_are_answered_and_stored(tmp_path):
    node = NodeProcess(str(tmp_path), {"shutdown_grace": 5}).start()
    data_dir = node.config.get("queue_data_dir")
    try:
        conn = RawTcp(*node.address, timeout=20)
        n = 300
        conn.send(b"".join(b'{"action":1,"queue":"q","data":"m%d","seq":%d}\n' % (i, i) for i in range(n)))
        conn.recv()  # the node is reading them
        node.signal(signal.SIGTERM)
        acked = 1
        try:
            while True:
                reply = conn.recv()
                assert reply["code"] == 0, reply
                acked += 1
        except (ValueError, OSError, ConnectionError):
            pass  # closed: nothing more is owed
        assert node.proc.wait(10) == 0
        conn.close()
    finally:
        node.stop()
    restarted = NodeProcess(str(tmp_path), {"queue_data_dir": data_dir, "port": node.config["port"]}).start()
    try:
        with QueueClient(restarted.hosts) as q:
            assert q.monitor("q")["size"] == acked  # every acknowledged produce was kept
    finally:
        restarted.stop()


def test_a_reply_that_never_comes_holds_the_drain_for_shutdown_grace_and_the_log_names_it(tmp_path):
    """A worker that does not answer (stopped here) holds its connection's replies: the drain
    gives up after shutdown_grace and its log line says which request of which connection was
    still unanswered, so that the cause can be found."""
    node = NodeProcess(str(tmp_path), {"shutdown_grace": 1, "workers": 1}).start()
    try:
        conn = RawTcp(*node.address, timeout=20)
        with node.child_stopped("worker"):
            conn.send(b'{"action":1,"queue":"q","data":"a","seq":1}\n{"action":1,"queue":"q","data":"b","seq":2}\n')
            node.signal(signal.SIGTERM)
            wait_for(lambda: "still owed replies" in node.log(), 15, "the drain to give up")
        assert node.proc.wait(15) is not None
        line = next(x for x in node.log().splitlines() if "still owed replies" in x)
        assert "1 connections still owed replies after 1 s" in line, line
        assert "request #0 of 2 unanswered, 0 replies behind it" in line, line
        conn.close()
    finally:
        node.stop()
