"""Unit tests for client/: request encoding, reply decoding, fail-over, redirects, timeouts,
pipelining, UDP and queue-cli, against small fake servers started in the test."""
from __future__ import annotations

import asyncio
import os
import pickle
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import uvloop

from queue_server.client import AsyncQueueClient, Message, NoServerAvailable, QueueClient, QueueError, QueueTimeout
from queue_server.client import protocol as p
from queue_server.client import tls as client_tls
from queue_server.client.cli import main
from queue_server.protocol import vocabulary as pp

DEADLINE = 5.0  # seconds any condition in these tests may take
CLOSE = object()  # handler result: close the connection without replying

Handler = Callable[[dict, dict], Any]


# ------------------------------------------------------------------ fake servers


class FakeTcpServer:
    """Newline-delimited JSON over TCP, one thread per connection.

    handler(request, conn_state) returns a reply dict, a list of them, raw bytes, None (no
    reply) or CLOSE. `release` is set when the server closes, so handlers may wait on it.
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.requests: list[dict] = []
        self.connections = 0
        self.cond = threading.Condition()
        self.release = threading.Event()
        self._conns: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.cond:
                self.connections += 1
                self._conns.append(conn)
                self.cond.notify_all()
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        state: dict = {}
        reader = conn.makefile("rb")
        try:
            for line in reader:
                req = orjson.loads(line)
                with self.cond:
                    self.requests.append(req)
                    self.cond.notify_all()
                result = self.handler(req, state)
                if result is CLOSE:
                    return
                if result is None:
                    continue
                if isinstance(result, bytes):
                    conn.sendall(result)
                    continue
                replies = result if isinstance(result, list) else [result]
                conn.sendall(b"".join(orjson.dumps(r) + b"\n" for r in replies))
        except OSError:
            pass
        finally:
            reader.close()
            conn.close()

    def wait_for(self, predicate: Callable[[], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, DEADLINE), "condition not met in time"

    def close(self) -> None:
        self.release.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() call
        except OSError:
            pass
        self.listener.close()
        with self.cond:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(DEADLINE)


class FakeUdpServer:
    """One JSON request per datagram; handler(request) returns a list of datagrams (dicts/bytes)."""

    def __init__(self, handler: Callable[[dict], list]) -> None:
        self.handler = handler
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.requests: list[dict] = []
        self.cond = threading.Condition()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            data, peer = self.sock.recvfrom(65536)
            if data == b"stop":
                return
            req = orjson.loads(data)
            with self.cond:
                self.requests.append(req)
                self.cond.notify_all()
            for out in self.handler(req):
                self.sock.sendto(out if isinstance(out, bytes) else orjson.dumps(out), peer)

    def close(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"stop", ("127.0.0.1", self.port))
        self._thread.join(DEADLINE)
        self.sock.close()


def echo(req: dict, **fields: Any) -> dict:
    """A reply the way the server builds one: the request's fields (less bulky ones) plus more."""
    reply = {k: v for k, v in req.items() if k not in ("data", "msg_ids")}
    reply.setdefault("code", 0)
    reply["node_id"] = 1
    reply.update(fields)
    return reply


class FakeQueues:
    """Just enough queue behaviour to give the client realistic replies."""

    VIRTUAL = {"virt": ["real1", "real2"]}

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, dict[int, str]] = {}
        self.leased: dict[str, dict[int, str]] = {}
        self.next_id = 0

    def _store(self, queue: str, data: str) -> int:
        self.next_id += 1
        self.queues.setdefault(queue, {})[self.next_id] = data
        return self.next_id

    def __call__(self, req: dict, state: dict | None = None) -> dict:
        with self.lock:
            return self._handle(req)

    def _handle(self, req: dict) -> dict:
        action, queue = req.get("action"), req.get("queue")
        action = p.ACTION_NAMES.get(action, action) if isinstance(action, str) else action
        if action == p.PRODUCE:
            if not isinstance(queue, str):
                return echo(req, code=-1, reason="queue: missing")
            data = req["data"]
            if queue in self.VIRTUAL:
                ids: dict = {}
                for real in self.VIRTUAL[queue]:
                    ids[real] = [self._store(real, d) for d in data] if isinstance(data, list) else self._store(real, data)
                return echo(req, msg_ids=ids)
            if isinstance(data, list):
                return echo(req, msg_ids=[self._store(queue, d) for d in data])
            return echo(req, msg_id=self._store(queue, data))
        if action == p.CONSUME:
            ready = self.queues.setdefault(queue, {})
            taken = []
            for msg_id in sorted(ready)[: req.get("count", 1)]:
                data = ready.pop(msg_id)
                self.leased.setdefault(queue, {})[msg_id] = data
                taken.append({"msg_id": msg_id, "data": data, "delivery_count": 1})
            if "count" in req:
                return echo(req, messages=taken)
            return echo(req, **taken[0]) if taken else echo(req)
        if action in (p.CONFIRM, p.RELEASE, p.EXTEND):
            ids = req["msg_ids"] if "msg_ids" in req else [req["msg_id"]]
            leased = self.leased.setdefault(queue, {})
            found = [i for i in ids if i in leased]
            if action == p.CONFIRM:
                for i in found:
                    del leased[i]
                return echo(req, confirmed=len(found))
            if action == p.RELEASE:
                for i in found:
                    self.queues[queue][i] = leased.pop(i)
                return echo(req, released=len(found))
            return echo(req, extended=len(found))
        if action in (p.MONITOR, p.LOCAL_MONITOR):
            if queue is None:
                return echo(req, size=sum(map(len, self.queues.values())), queue_count=len(self.queues))
            return echo(req, size=len(self.queues.get(queue, {})), max_size=100, leader_node_id=1)
        if action in (p.LIST, p.LOCAL_LIST):
            names = sorted(q for q in self.queues if req.get("pattern", "") in q)
            return echo(req, queue_list=names, queue_count=len(names))
        if action == p.LEADER:
            return echo(req, leader_node_id=1, leader_host="127.0.0.1", leader_port=1111)
        return echo(req, code=-1, reason="action: unknown")


@pytest.fixture
def servers() -> Iterator[Callable[..., Any]]:
    """Factory of fake servers that are all closed when the test ends."""
    made: list[Any] = []

    def make(handler: Any = None, udp: bool = False) -> Any:
        handler = handler if handler is not None else FakeQueues()
        server = FakeUdpServer(handler) if udp else FakeTcpServer(handler)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A local port nothing listens on (connections to it are refused)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused_addr(kind: int = socket.SOCK_STREAM) -> str:
    return f"127.0.0.1:{free_port(kind)}"


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """Runs a coroutine to completion on a fresh event loop of each kind."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def runner(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(asyncio.wait_for(coro, DEADLINE * 2))

    return runner


# ------------------------------------------------------------------ protocol helpers


def test_parse_hosts_forms() -> None:
    assert p.parse_hosts("h1:1111, h2:1112") == [("h1", 1111), ("h2", 1112)]
    assert p.parse_hosts(["h1", "[::1]:7", ("h3", 9)]) == [("h1", 1111), ("::1", 7), ("h3", 9)]
    assert p.parse_hosts("::1") == [("::1", 1111)]
    assert p.format_address(("::1", 7)) == "[::1]:7"
    for bad in ("", "h:x", "h:0", "h:70000", "[::1", ":5"):
        with pytest.raises(ValueError):
            p.parse_hosts(bad)


def test_request_builders_omit_unset_fields() -> None:
    assert p.produce_request("q", "x") == {"action": 1, "queue": "q", "data": "x", "retry": 0}
    assert p.produce_request("q", ("a", "b"), delay=5, ttl=60.5, retry=None, priority=3) == {
        "action": 1, "queue": "q", "data": ["a", "b"], "delay": 5, "ttl": 60.5, "priority": 3,
    }
    assert p.consume_request("q") == {"action": 2, "queue": "q"}
    assert p.consume_request("q", 10, 1.5) == {"action": 2, "queue": "q", "count": 10, "wait": 1.5}
    assert p.ids_request(3, "q", 7) == {"action": 3, "queue": "q", "msg_id": 7}
    assert p.ids_request(6, "q", iter([1, 2]), retry=9) == {"action": 6, "queue": "q", "msg_ids": [1, 2], "retry": 9}
    assert p.monitor_request() == {"action": 4}
    assert p.monitor_request("q", local=True) == {"action": 104, "queue": "q"}
    assert p.list_request() == {"action": 7}
    assert p.list_request("ab", local=True) == {"action": 107, "pattern": "ab"}
    assert p.encode({"a": "é"}) == '{"a":"é"}\n'.encode()
    with pytest.raises(TypeError):
        p.encode({"data": b"bytes"})


def test_reply_helpers() -> None:
    assert p.reply_wait({"wait": 2}) == 2.0
    assert p.reply_wait({"wait": True}) == 0.0 and p.reply_wait({"wait": "5"}) == 0.0
    assert p.reply_wait({"wait": -1}) == 0.0 and p.reply_wait({}) == 0.0
    assert p.redirect_target({"leader_host": "10.0.0.2", "leader_port": 1112}, "h") == ("10.0.0.2", 1112)
    assert p.redirect_target({"leader_host": "0.0.0.0", "leader_port": 1112}, "h") == ("h", 1112)
    assert p.redirect_target({"leader_host": "", "leader_port": 0}, "h") is None
    with pytest.raises(QueueError, match="not a JSON object"):
        p.decode_reply(b"[1]")
    with pytest.raises(QueueError, match="bad reply"):
        p.decode_reply(b"{nope")
    err = p.error_from_reply({"code": -1, "reason": "queue: missing", "seq": 4})
    assert (err.code, err.reason, err.reply["seq"]) == (-1, "queue: missing", 4)
    assert p.error_from_reply({"reason": "x"}).reason == "bad reply from server: no code"


# ------------------------------------------------------------------ blocking client


def test_sync_api_roundtrip(servers: Any) -> None:
    server = servers()
    with QueueClient(server.addr) as c:
        first = c.produce("q", "hello", delay=1, ttl=120, retry=30, priority=2)
        assert isinstance(first, int)
        sent = server.requests[-1]
        producer = sent.pop("producer")
        assert producer.startswith("client-") and sent == {
            "action": 1, "queue": "q", "data": "hello", "delay": 1, "ttl": 120, "retry": 30, "priority": 2,
            "sequence": 0,
        }
        ids = c.produce_batch("q", ["a", "b"])
        assert ids == [first + 1, first + 2]
        assert c.consume("q") == Message("q", first, "hello", 1)
        assert c.consume_batch("q", 5, wait=0.5) == [Message("q", ids[0], "a", 1), Message("q", ids[1], "b", 1)]
        assert server.requests[-1] == {"action": 2, "queue": "q", "count": 5, "wait": 0.5}
        assert c.consume("q") is None
        assert c.consume_batch("q", 3) == []
        assert c.extend("q", [ids[0], 999], 60) == 1
        assert server.requests[-1] == {"action": 6, "queue": "q", "msg_ids": [ids[0], 999], "retry": 60}
        assert c.release("q", ids[0]) == 1
        assert c.confirm("q", first) is True
        assert c.confirm("q", first) is False
        assert c.consume("q").msg_id == ids[0]
        assert c.confirm_many("q", [ids[0], ids[1], 12345]) == 2
        assert c.monitor("q", local=True)["size"] == 0
        assert server.requests[-1] == {"action": 104, "queue": "q"}
        assert c.monitor()["queue_count"] == 1
        assert c.list_queues() == ["q"]
        assert c.list_queues("x") == []
        assert c.leader()["leader_port"] == 1111
    assert server.connections == 1  # every request went over the same connection


def test_sync_virtual_queue_ids(servers: Any) -> None:
    server = servers()
    with QueueClient(server.addr) as c:
        single = c.produce("virt", "x")
        assert set(single) == {"real1", "real2"} and all(isinstance(v, int) for v in single.values())
        batch = c.produce_batch("virt", ["a", "b"])
        assert [len(v) for v in batch.values()] == [2, 2]


def test_sync_data_types_checked() -> None:
    c = QueueClient("127.0.0.1:1")
    with pytest.raises(TypeError):
        c.produce("q", ["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.produce_batch("q", "ab")
    with pytest.raises(ValueError):
        QueueClient("h:1", transport="sctp")


def test_sync_error_reply_raises_queue_error(servers: Any) -> None:
    server = servers(lambda req, st: echo(req, code=-1, reason="retry: must be >= 0"))
    with QueueClient(server.addr) as c:
        with pytest.raises(QueueError) as info:
            c.request({"action": 1, "queue": "q", "data": "x", "retry": -1, "seq": "s1"})
        assert info.value.code == -1
        assert info.value.reason == "retry: must be >= 0"
        assert info.value.reply["seq"] == "s1"
        assert not isinstance(info.value, (NoServerAvailable, QueueTimeout))
        with pytest.raises(QueueError):  # the connection is still usable
            c.produce("q", "x")
    assert server.connections == 1


def test_sync_raw_request_echoes_seq(servers: Any) -> None:
    server = servers()
    with QueueClient(server.addr) as c:
        reply = c.request({"action": "produce", "queue": "q", "data": "x", "seq": {"any": [1]}})
    assert reply["seq"] == {"any": [1]} and reply["code"] == 0 and "data" not in reply


def redirect_to(port: int, host: str = "127.0.0.1") -> Handler:
    return lambda req, st: echo(req, code=-2, leader_node_id=2, leader_host=host, leader_port=port)


def test_sync_follows_redirect_and_sticks_to_leader(servers: Any) -> None:
    leader = servers()
    follower = servers(redirect_to(leader.port))
    with QueueClient(follower.addr) as c:
        msg_id = c.produce("q", "x")
        assert c.consume("q").msg_id == msg_id
    assert len(follower.requests) == 1  # the second request went straight to the leader
    assert [r["action"] for r in leader.requests] == [1, 2]


def test_sync_redirect_to_wildcard_host_uses_current_host(servers: Any) -> None:
    leader = servers()
    follower = servers(redirect_to(leader.port, host="0.0.0.0"))
    with QueueClient(follower.addr) as c:
        c.produce("q", "x")
    assert len(leader.requests) == 1


def test_sync_redirect_not_followed_or_looping(servers: Any) -> None:
    leader = servers()
    follower = servers(redirect_to(leader.port))
    with QueueClient(follower.addr, follow_redirects=False) as c:
        with pytest.raises(QueueError) as info:
            c.produce("q", "x")
    assert info.value.code == -2 and info.value.reply["leader_port"] == leader.port
    assert leader.requests == []
    looping = servers(lambda req, st: echo(req, code=-2, leader_host="127.0.0.1", leader_port=looping.port))
    with QueueClient(looping.addr, max_redirects=2) as c:
        with pytest.raises(QueueError) as info:
            c.produce("q", "x")
    assert info.value.code == -2 and len(looping.requests) == 3


def refusing_first(reason: str) -> Handler:
    """A node that refuses each request's first sending with `reason` (as one whose mode
    changed under it), then serves it."""
    store = FakeQueues()
    seen: set = set()

    def handle(req: dict, state: dict) -> Any:
        key = (req.get("action"), req.get("data"), req.get("queue"))
        if key not in seen:
            seen.add(key)
            return echo(req, code=-1, reason=reason)
        return store(req, state)
    return handle


@pytest.mark.parametrize("reason", [pp.MODE_CHANGED, pp.LEADERSHIP_CHANGED, pp.NOT_LEADING])
def test_sync_sends_a_request_refused_unapplied_again_to_its_one_host(servers: Any, reason: str) -> None:
    """A hand-off that failed refuses the late batches of the mode it ended with nothing
    applied: the client sends the request again, on the same connection."""
    server = servers(refusing_first(reason))
    with QueueClient(server.addr) as c:
        msg_id = c.produce("q", "x")
        m = c.consume("q")
        assert (m.msg_id, m.data) == (msg_id, "x")
    assert [r["action"] for r in server.requests] == [1, 1, 2, 2]
    assert server.connections == 1


def test_async_sends_a_request_refused_unapplied_again_to_its_one_host(servers: Any, run: Any) -> None:
    server = servers(refusing_first(pp.MODE_CHANGED))

    async def go() -> None:
        async with AsyncQueueClient(server.addr) as c:
            ids = await asyncio.gather(*(c.produce("q", str(i)) for i in range(5)))
            assert len(set(ids)) == 5
            assert (await c.consume("q", wait=1)).data == "0"

    run(go())
    assert len(server.requests) == 12


def test_sync_fails_over_when_connection_refused(servers: Any) -> None:
    good = servers()
    dead = refused_addr()
    with QueueClient([dead, good.addr]) as c:
        c.produce("q", "x")
        assert c.address == ("127.0.0.1", good.port)  # stays on the host that worked
        c.produce("q", "y")
    # (a client of several hosts first asks where queue groups' leaders are: action 8)
    assert [r["action"] for r in good.requests] == [p.LEADER, p.PRODUCE, p.PRODUCE]


def test_sync_no_server_available(servers: Any) -> None:
    hosts = f"{refused_addr()},{refused_addr()}"
    with QueueClient(hosts) as c:
        with pytest.raises(NoServerAvailable) as info:
            c.leader()
    assert info.value.code == -1 and info.value.reason.count("refused") == 2


def test_sync_timeout_raises_queue_timeout(servers: Any) -> None:
    silent = servers(lambda req, st: None)
    with QueueClient(silent.addr, timeout=0.2) as c:
        start = time.monotonic()
        with pytest.raises(QueueTimeout):
            c.leader()
        assert 0.2 <= time.monotonic() - start < DEADLINE


def test_sync_timeout_fails_over_and_may_duplicate(servers: Any) -> None:
    silent_store = FakeQueues()
    # stores, never answers (but for the client's first question, where queue groups' leaders are)
    silent = servers(lambda req, st: silent_store(req) if req.get("action") == p.LEADER else silent_store(req) and None)
    good = servers()
    with QueueClient([silent.addr, good.addr], timeout=0.2) as c:
        assert isinstance(c.produce("q", "x"), int)
    assert silent_store.queues["q"] and good.requests[0]["data"] == "x"  # stored twice


def test_sync_long_poll_extends_timeout(servers: Any) -> None:
    store = FakeQueues()

    def slow_consume(req: dict, st: dict) -> dict:
        if req.get("wait"):
            server.release.wait(0.5)  # the server holding a long poll past the client's timeout
        return store(req)

    server = servers(slow_consume)
    with QueueClient(server.addr, timeout=0.2) as c:
        assert c.consume("q", wait=2.0) is None
        with pytest.raises(QueueTimeout):
            c.request({"action": 2, "queue": "q", "wait": 0.01})


def test_sync_reconnects_once_when_kept_connection_was_closed(servers: Any) -> None:
    store = FakeQueues()

    def one_reply_per_connection(req: dict, st: dict) -> Any:
        if st.get("answered"):
            return CLOSE
        st["answered"] = True
        return store(req)

    server = servers(one_reply_per_connection)
    with QueueClient(server.addr) as c:
        c.produce("q", "a")
        c.produce("q", "b")  # the kept connection is dead: one fresh connection to the same host
        c.produce("q", "c")
    assert server.connections == 3
    assert len(store.queues["q"]) == 3


def test_sync_connection_closed_without_reply(servers: Any) -> None:
    server = servers(lambda req, st: CLOSE)
    with QueueClient(server.addr) as c:
        with pytest.raises(NoServerAvailable, match="closed"):
            c.leader()
    assert server.connections == 1  # a fresh connection gets no second try


def test_sync_bad_reply_line(servers: Any) -> None:
    store = FakeQueues()
    server = servers(lambda req, st: b"not json\n" if req.get("queue") == "bad" else store(req))
    with QueueClient(server.addr) as c:
        with pytest.raises(QueueError, match="bad reply"):
            c.consume("bad")
        c.produce("q", "x")
    assert server.connections == 2


def test_sync_reply_split_across_segments(servers: Any) -> None:
    big = "x" * 300_000
    server = servers(lambda req, st: (orjson.dumps(echo(req, msg_id=1, data=big)) + b"\n"))
    with QueueClient(server.addr) as c:
        assert c.consume("q").data == big


def test_sync_client_pickles_without_its_connection(servers: Any) -> None:
    server = servers()
    c = QueueClient([server.addr, ("127.0.0.1", 1)], timeout=2, max_redirects=1)
    c.produce("q", "x")
    copy = pickle.loads(pickle.dumps(c))
    assert (copy.hosts, copy.timeout, copy.max_redirects) == (c.hosts, 2.0, 1)
    assert copy.produce("q", "y") == 2
    assert server.connections == 2
    c.close()
    copy.close()


def test_sync_client_pickles_with_its_token_tls_and_idempotence() -> None:
    c = QueueClient("h:1", token="secret", tls=True, idempotent=False)
    copy = pickle.loads(pickle.dumps(c))
    assert (copy.token, copy.tls, copy._ssl is not None, copy._producer) == ("secret", True, True, None)
    assert pickle.loads(pickle.dumps(QueueClient("h:1")))._producer is not None


def test_a_client_pickles_a_token_file_and_tls_files_as_their_paths(tmp_path: Any) -> None:
    """Where that is how they were given, a pickled client carries file paths, not the token or
    the keys; its copy reads them again."""
    from queue_server.client.credentials import TokenFile
    from tests.tls_certs import make_tls_files

    certs = make_tls_files(str(tmp_path))
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    files = client_tls.TlsFiles(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)
    for make in (QueueClient, AsyncQueueClient):
        c = make("h:1", token=TokenFile(str(token_file)), tls=files)
        assert c.token == "s3cret-token" and c._ssl is not None
        blob = pickle.dumps(c)
        assert b"s3cret-token" not in blob and b"PRIVATE KEY" not in blob
        copy = pickle.loads(blob)
        assert (type(copy), copy.token, copy.tls, copy._token_option) == (make, "s3cret-token", files, TokenFile(str(token_file)))
        issuers = [dict(rdn[0] for rdn in cert["subject"]).get("commonName") for cert in copy._ssl.get_ca_certs()]
        assert issuers == ["queue-server test CA"]  # the CA file loaded again (not the system's CAs)


def test_a_client_made_with_an_ssl_context_says_how_to_make_one_that_pickles() -> None:
    for make in (QueueClient, AsyncQueueClient):
        with pytest.raises(TypeError, match=r"tls=TlsFiles\("):
            pickle.dumps(make("h:1", tls=ssl.create_default_context()))


def test_an_async_client_pickles_its_own_settings_too(servers: Any, run: Any) -> None:
    server = servers()

    async def go() -> AsyncQueueClient:
        c = AsyncQueueClient(server.addr, timeout=2, linger_ms=0.5, max_idle_wait_connections=2,
                             max_request_size=1 << 16, idempotent=False)
        await c.produce("q", "x")  # connected: the connection does not travel
        copy = pickle.loads(pickle.dumps(c))
        await c.close()
        assert (copy.timeout, copy.linger_ms, copy.max_idle_wait_connections, copy.max_request_size,
                copy._producer) == (2.0, 0.5, 2, 1 << 16, None)
        assert await copy.produce("q", "y") == 2
        await copy.close()
        return copy

    run(go())
    assert server.connections == 2


def test_a_subscription_pickles_as_its_request_and_subscribes_anew(servers: Any) -> None:
    def handle(req: dict, state: dict) -> Any:
        if req.get("action") == p.LEADER:
            return echo(req, leader_node_id=1, leader_host="127.0.0.1", leader_port=server.port)
        if req.get("action") == pp.SUBSCRIBE:
            return [echo(req, subscribed=req["credit"]), {
                "action": pp.SUBSCRIBE, "queue": "q", "code": 0, "node_id": 1, "push": True, "msg_id": server.connections,
                "data": "pushed", "delivery_count": 1, "lease_until": 1e10}]
        return None

    server = servers(handle)
    with QueueClient(server.addr) as c, c.subscribe(["q"], credit=3) as sub:
        assert next(iter(sub)).data == "pushed"  # its connection is open
        copy = pickle.loads(pickle.dumps(sub))
        assert (copy.queues, copy._credit, copy.closed, copy.sock) == (("q",), 3, False, None)
        with copy:
            assert next(iter(copy)).data == "pushed"
    subscribes = [r for r in server.requests if r.get("action") == pp.SUBSCRIBE]
    assert len(subscribes) == 2


@pytest.mark.filterwarnings("ignore:.*fork:DeprecationWarning")  # 3.12+ warns on fork with threads
def test_sync_forked_child_does_not_share_the_connection(servers: Any) -> None:
    server = servers()
    with QueueClient(server.addr) as c:
        c.produce("q", "parent")
        pid = os.fork()
        if pid == 0:  # the child: its own connection, then leave without running any cleanup
            ok = c.produce("q", "child") == 2
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert c.produce("q", "parent again") == 3
    assert server.connections == 2


# ------------------------------------------------------------------ UDP, blocking


def udp_queue_handler(store: FakeQueues) -> Callable[[dict], list]:
    return lambda req: [store(req)]


def test_sync_udp_roundtrip_and_seq(servers: Any) -> None:
    server = servers(udp_queue_handler(FakeQueues()), udp=True)
    with QueueClient(server.addr, transport="udp") as c:
        msg_id = c.produce("q", "hi", retry=5)
        assert c.consume("q") == Message("q", msg_id, "hi", 1)
        reply = c.request({"action": 8, "seq": "mine"})
        assert reply["seq"] == "mine"
        assert "seq" not in c.request({"action": 8})
    assert server.requests[0]["seq"] == 1 and server.requests[2]["seq"] == [3, "mine"]


def test_sync_udp_ignores_stale_datagrams(servers: Any) -> None:
    def handler(req: dict) -> list:
        stale = echo(req, msg_id=-1)
        stale["seq"] = req["seq"] + 1000
        return [b"garbage", stale, echo(req, msg_id=7)]

    server = servers(handler, udp=True)
    with QueueClient(server.addr, transport="udp") as c:
        assert c.produce("q", "x") == 7


def test_sync_udp_too_large(servers: Any) -> None:
    server = servers(lambda req: [{"code": -1, "reason": "response too large for UDP, use TCP"}], udp=True)
    with QueueClient(server.addr, transport="udp") as c:
        with pytest.raises(QueueError, match="response too large"):
            c.consume_batch("q", 1000)
        with pytest.raises(QueueError, match="request too large for UDP"):
            c.produce("q", "x" * 70_000)
    assert len(server.requests) == 1


def test_sync_udp_fails_over_on_refused_port(servers: Any) -> None:
    server = servers(udp_queue_handler(FakeQueues()), udp=True)
    with QueueClient([refused_addr(socket.SOCK_DGRAM), server.addr], transport="udp", timeout=2) as c:
        assert c.leader()["leader_port"] == 1111
    assert len(server.requests) == 1


def test_sync_udp_timeout(servers: Any) -> None:
    server = servers(lambda req: [], udp=True)
    with QueueClient(server.addr, transport="udp", timeout=0.2) as c:
        with pytest.raises(QueueTimeout):
            c.leader()


# ------------------------------------------------------------------ asyncio client


def test_async_pipelines_100_calls_on_one_connection(servers: Any, run: Any) -> None:
    def answer_when_all_arrived(req: dict, st: dict) -> list | None:
        st.setdefault("held", []).append(req)
        if len(st["held"]) < 100:
            return None
        held, st["held"] = st["held"], []
        return [echo(r, msg_id=r["seq"] * 10) for r in held]

    server = servers(answer_when_all_arrived)

    async def go() -> list[dict]:
        async with AsyncQueueClient(server.addr) as c:
            return await asyncio.gather(
                *(c.request({"action": 1, "queue": "q", "data": str(i), "seq": i}) for i in range(100))
            )

    replies = run(go())
    assert [r["seq"] for r in replies] == list(range(100))
    assert [r["msg_id"] for r in replies] == [i * 10 for i in range(100)]
    assert server.connections == 1


def test_async_replies_matched_in_order_out_of_order_completion(servers: Any, run: Any) -> None:
    store = FakeQueues()
    server = servers(store)

    async def go() -> None:
        async with AsyncQueueClient(server.addr) as c:
            ids = await asyncio.gather(*(c.produce(f"q{i % 3}", f"d{i}") for i in range(60)))
            assert sorted(ids) == list(range(1, 61))
            got = await asyncio.gather(*(c.consume(f"q{i % 3}") for i in range(60)))
            assert sorted(m.data for m in got) == sorted(f"d{i}" for i in range(60))
            for m in got:
                assert m.queue == f"q{int(m.data[1:]) % 3}"

    run(go())
    assert server.connections == 1


def test_async_abandoned_call_does_not_shift_replies(servers: Any, run: Any) -> None:
    store = FakeQueues()
    slow = threading.Event()

    def handler(req: dict, st: dict) -> dict:
        if req.get("queue") == "slow":
            slow.wait(DEADLINE)
        return store(req)

    server = servers(handler)

    async def go() -> None:
        async with AsyncQueueClient(server.addr) as c:
            abandoned = asyncio.ensure_future(c.consume("slow"))
            await asyncio.to_thread(server.wait_for, lambda: len(server.requests) == 1)
            abandoned.cancel()
            following = asyncio.ensure_future(c.produce("q", "x"))
            slow.set()
            assert await following == 1  # its own reply, not the abandoned consume's
            assert abandoned.cancelled()

    run(go())
    assert server.connections == 1


def test_async_api_roundtrip(servers: Any, run: Any) -> None:
    server = servers()

    async def go() -> None:
        async with AsyncQueueClient(server.addr) as c:
            first = await c.produce("q", "hello", priority=1)
            ids = await c.produce_batch("q", ["a", "b"])
            assert ids == [first + 1, first + 2]
            assert await c.consume("q") == Message("q", first, "hello", 1)
            assert len(await c.consume_batch("q", 10)) == 2
            assert await c.consume("q") is None
            assert await c.extend("q", ids, 30) == 2
            assert await c.release("q", ids[0]) == 1
            assert await c.confirm("q", first) is True
            assert await c.confirm_many("q", [ids[1]]) == 1
            assert (await c.monitor("q"))["size"] == 1
            assert await c.list_queues("q", local=True) == ["q"]
            assert (await c.leader())["leader_node_id"] == 1
            assert set(await c.produce("virt", "v")) == {"real1", "real2"}
            with pytest.raises(QueueError, match="queue: missing"):
                await c.request({"action": 1, "data": "x"})

    run(go())


def test_async_redirect_and_failover(servers: Any, run: Any) -> None:
    leader = servers()
    follower = servers(redirect_to(leader.port))

    async def go() -> None:
        async with AsyncQueueClient([refused_addr(), follower.addr]) as c:
            ids = await asyncio.gather(*(c.produce("q", str(i)) for i in range(20)))
            assert len(set(ids)) == 20
            assert c.address == ("127.0.0.1", leader.port)
        async with AsyncQueueClient([refused_addr(), refused_addr()]) as c:
            with pytest.raises(NoServerAvailable):
                await c.leader()
        async with AsyncQueueClient(follower.addr, follow_redirects=False) as c:
            with pytest.raises(QueueError) as info:
                await c.leader()
            assert info.value.code == -2

    run(go())
    # (first the cluster is asked where the leaders of its queue groups are: it has none)
    assert [r["action"] for r in leader.requests] == [p.LEADER] + [p.PRODUCE] * 20


def test_async_timeout_and_failover_on_timeout(servers: Any, run: Any) -> None:
    silent = servers(lambda req, st: None)
    good = servers()

    async def go() -> None:
        async with AsyncQueueClient(silent.addr, timeout=0.2) as c:
            with pytest.raises(QueueTimeout):
                await c.leader()
        async with AsyncQueueClient([silent.addr, good.addr], timeout=0.2) as c:
            results = await asyncio.gather(*(c.produce("q", str(i)) for i in range(5)))
            assert len(set(results)) == 5

    run(go())
    assert [r["action"] for r in good.requests] == [p.LEADER] + [p.PRODUCE] * 5


def test_async_long_poll_uses_its_own_connection(servers: Any, run: Any) -> None:
    store = FakeQueues()
    wake = threading.Event()

    def handler(req: dict, st: dict) -> dict:
        if req.get("wait"):
            wake.wait(DEADLINE)  # a long poll that ends when the test says so
        return store(req)

    server = servers(handler)

    async def go() -> None:
        async with AsyncQueueClient(server.addr, timeout=0.5) as c:
            polls = [asyncio.ensure_future(c.consume("q", wait=5)) for _ in range(2)]
            await asyncio.to_thread(server.wait_for, lambda: len(server.requests) == 2)
            msg_id = await c.produce("q", "x")  # not held back by the waiting consumes
            assert not any(t.done() for t in polls)
            wake.set()
            got = await asyncio.gather(*polls)
            assert [m.msg_id for m in got if m] == [msg_id]
            assert await c.consume("q", wait=1) is None  # an idle long-poll connection is reused

    run(go())
    assert server.connections == 3


def test_async_connection_lost_retries_on_next_host(servers: Any, run: Any) -> None:
    good = servers()

    def drop_after_all_arrived(req: dict, st: dict) -> Any:
        st["n"] = st.get("n", 0) + (req.get("action") == p.PRODUCE)
        return CLOSE if st["n"] == 10 else None

    dropping = servers(drop_after_all_arrived)

    async def go() -> None:
        async with AsyncQueueClient([dropping.addr, good.addr]) as c:
            ids = await asyncio.gather(*(c.produce("q", str(i)) for i in range(10)))
            assert len(set(ids)) == 10

    run(go())
    assert sorted(r["data"] for r in good.requests if r["action"] == p.PRODUCE) == sorted(str(i) for i in range(10))


def test_async_close_fails_pending_calls(servers: Any, run: Any) -> None:
    server = servers(lambda req, st: None)

    async def go() -> None:
        c = AsyncQueueClient(server.addr)
        pending = asyncio.ensure_future(c.leader())
        await asyncio.to_thread(server.wait_for, lambda: len(server.requests) == 1)
        await c.close()
        with pytest.raises(QueueError, match="client closed"):
            await pending

    run(go())


def test_async_udp_matches_replies_by_seq(servers: Any, run: Any) -> None:
    store = FakeQueues()
    held: list[dict] = []

    def reverse_order(req: dict) -> list:
        if len(server.requests) > 20:
            return [store(req)]
        held.append(store(req))
        return held[::-1] if len(held) == 20 else []

    server = servers(reverse_order, udp=True)

    async def go() -> None:
        async with AsyncQueueClient(server.addr, transport="udp") as c:
            replies = await asyncio.gather(
                *(c.request({"action": 1, "queue": "q", "data": str(i), "seq": f"s{i}"}) for i in range(20))
            )
            assert [r["seq"] for r in replies] == [f"s{i}" for i in range(20)]
            assert len({r["msg_id"] for r in replies}) == 20
            assert await c.produce("q", "plain") == 21

    run(go())


def test_async_udp_failover_and_timeout(servers: Any, run: Any) -> None:
    good = servers(udp_queue_handler(FakeQueues()), udp=True)
    silent = servers(lambda req: [], udp=True)

    async def go() -> None:
        async with AsyncQueueClient([refused_addr(socket.SOCK_DGRAM), good.addr], transport="udp") as c:
            assert (await c.leader())["code"] == 0
        async with AsyncQueueClient(silent.addr, transport="udp", timeout=0.2) as c:
            with pytest.raises(QueueTimeout):
                await c.leader()

    run(go())


# ------------------------------------------------------------------ queue-cli


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """queue-cli with --json (the output scripts parse); its exit status, stdout and stderr."""
    code = main(["--json", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [["--timeout", "abc", "list"], ["produce", "q", "x", "--delay", "abc"],
                                  ["consume", "q", "--wait", "nan"], ["extend", "q", "1", "--retry", "inf"]])
def test_cli_a_flag_that_is_not_a_number_says_so(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = cli(capsys, *argv)
    assert code == 2
    flag, value = next((a, b) for a, b in zip(argv, argv[1:]) if a.startswith("--"))
    assert err.splitlines()[-1].endswith(f"error: argument {flag}: expected a number, got '{value}'")


def test_cli_a_tls_file_that_cannot_be_read_is_named(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "ca.pem")
    code, _, err = cli(capsys, "--tls-ca", missing, "list")
    assert code == 2
    assert err == f"queue-cli: --tls-ca/--tls-cert/--tls-key: cannot load {missing}: No such file or directory\n"


def test_cli_of_several_tls_files_names_the_one_that_is_bad(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.tls_certs import make_tls_files

    certs = make_tls_files(str(tmp_path))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    code, _, err = cli(capsys, "--tls-ca", certs.ca, "--tls-cert", str(garbage), "--tls-key", certs.client_key, "list")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"queue-cli: --tls-ca/--tls-cert/--tls-key: cannot load {garbage}: not a PEM certificate ")
    with pytest.raises(client_tls.TlsFileError) as exc:
        client_tls.TlsFiles(True, str(garbage)).context()
    assert (exc.value.field, exc.value.path, exc.value.what) == ("ca_file", str(garbage), "a PEM file of CA certificates")


@pytest.mark.parametrize("code, hint", [(62, "connect with a name the certificate was made for, or make it for this one"),
                                        (64, "connect with a name the certificate was made for, or make it for this one"),
                                        (18, "give the CA with tls_ca / --tls-ca")])
def test_an_untrusted_certificate_says_what_to_change(code: int, hint: str) -> None:
    exc = ssl.SSLCertVerificationError(1, "certificate verify failed")
    exc.verify_code, exc.verify_message = code, "what OpenSSL says"
    assert client_tls.describe(exc) == f"TLS: the node's certificate is not trusted: what OpenSSL says ({hint})"


def test_cli_produce_consume_confirm(servers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = servers()
    h = ("--hosts", server.addr)
    code, out, err = cli(capsys, *h, "produce", "q", "hello", "--retry", "30", "--priority", "2")
    assert code == 0 and err == "" and out.count("\n") == 1
    msg_id = orjson.loads(out)["msg_id"]
    assert server.requests[-1] == {"action": 1, "queue": "q", "data": "hello", "retry": 30, "priority": 2}
    assert type(server.requests[-1]["retry"]) is int
    code, out, _ = cli(capsys, "produce", "q", "a", "b", "--delay", "0", *h)  # options after the command
    assert code == 0 and orjson.loads(out)["msg_ids"] == [msg_id + 1, msg_id + 2]
    code, out, _ = cli(capsys, *h, "consume", "q")
    assert orjson.loads(out)["data"] == "hello"
    code, out, _ = cli(capsys, *h, "consume", "q", "--count", "5", "--wait", "0.1")
    assert [m["data"] for m in orjson.loads(out)["messages"]] == ["a", "b"]
    assert server.requests[-1] == {"action": 2, "queue": "q", "count": 5, "wait": 0.1}
    code, out, _ = cli(capsys, *h, "extend", "q", str(msg_id + 1), "--retry", "60")
    assert orjson.loads(out)["extended"] == 1 and server.requests[-1]["msg_id"] == msg_id + 1
    code, out, _ = cli(capsys, *h, "release", "q", str(msg_id + 1))
    assert orjson.loads(out)["released"] == 1
    code, out, _ = cli(capsys, *h, "confirm", "q", str(msg_id), str(msg_id + 2))
    assert orjson.loads(out)["confirmed"] == 2 and server.requests[-1]["msg_ids"] == [msg_id, msg_id + 2]


def test_cli_monitor_list_leader(servers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    store = FakeQueues()
    store({"action": 1, "queue": "jobs", "data": "x"})
    server = servers(store)
    code, out, _ = cli(capsys, "--hosts", server.addr, "monitor", "jobs", "--local")
    assert code == 0 and orjson.loads(out)["size"] == 1 and server.requests[-1] == {"action": 104, "queue": "jobs"}
    code, out, _ = cli(capsys, "--hosts", server.addr, "monitor")
    assert orjson.loads(out)["queue_count"] == 1
    code, out, _ = cli(capsys, "--hosts", server.addr, "list", "jo")
    assert orjson.loads(out)["queue_list"] == ["jobs"] and server.requests[-1] == {"action": 7, "pattern": "jo"}
    code, out, _ = cli(capsys, "--hosts", server.addr, "list", "--local")
    assert server.requests[-1] == {"action": 107}
    code, out, _ = cli(capsys, "--hosts", server.addr, "leader")
    assert orjson.loads(out)["leader_port"] == 1111


def test_cli_udp(servers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = servers(udp_queue_handler(FakeQueues()), udp=True)
    code, out, _ = cli(capsys, "--udp", "--hosts", server.addr, "produce", "q", "x")
    assert code == 0 and orjson.loads(out)["msg_id"] == 1 and "seq" not in orjson.loads(out)


def test_cli_error_reply_exits_1(servers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    asked = []

    def no_leader(req: Any, st: Any) -> Any:
        asked.append(req)
        return echo(req, code=-1, reason="no leader")
    server = servers(no_leader)
    code, out, err = cli(capsys, "--hosts", server.addr, "--timeout", "0.5", "produce", "q", "x")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert len(asked) >= 3  # asked again while its timeout lasted: an election may be on
    assert orjson.loads(err) == {"action": 1, "queue": "q", "code": -1, "reason": "no leader", "node_id": 1}


def test_cli_unreachable_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "--hosts", refused_addr(), "--timeout", "1", "leader")
    assert code == 2 and out == "" and "no server available" in orjson.loads(err)["reason"]


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "extend", "q", "1")[0] == 2  # --retry is required
    assert cli(capsys, "--hosts", "h:notaport", "leader")[0] == 2
    assert cli(capsys, "confirm", "q", "abc")[0] == 2
    assert cli(capsys)[0] == 2
    assert cli(capsys, "--help")[0] == 0


def test_retry_elsewhere_only_where_sending_again_is_safe() -> None:
    changed = {"code": -1, "reason": "leader changed: the request may or may not have been applied"}
    idem = p.produce_request("q", "x", producer="p1", sequence=7)
    assert p.retry_elsewhere(idem, changed)
    assert not p.retry_elsewhere(p.produce_request("q", "x"), changed)  # could be stored twice
    assert not p.retry_elsewhere(p.consume_request("q"), changed)  # could lose an at-most-once message
    assert p.retry_elsewhere(p.consume_request("q"), {"code": -1, "reason": "no leader"})
    assert not p.retry_elsewhere(idem, {"code": -1, "reason": "queue full"})
    # refused unapplied by a node that stopped leading: safe for any request
    assert p.retry_elsewhere(p.consume_request("q"), {"code": -1, "reason": p.LEADERSHIP_CHANGED})


def test_every_refusal_a_node_makes_for_a_change_of_leader_or_mode_is_classified() -> None:
    """The coordinator's refusals of a worker's replies (REFUSALS), the worker's own and the
    acceptor's: each is sent again by the clients (NOT_APPLIED, or UNKNOWN_OUTCOME for an
    idempotent produce), or is one the caller waits out (storage), and HTTP answers 503."""
    from queue_server.server.http_routes import status_of
    from queue_server.server.reply_counts import REFUSALS

    made = set(REFUSALS) | {pp.NOT_LEADING, pp.NO_LEADER, pp.LEADER_CHANGED, pp.FORWARD_TIMED_OUT}
    assert made - (pp.NOT_APPLIED | pp.UNKNOWN_OUTCOME) == {pp.STORAGE_UNAVAILABLE}
    assert pp.ASK_ANOTHER_NODE <= pp.NOT_APPLIED | pp.UNKNOWN_OUTCOME
    for reason in made:
        assert pp.try_again({"code": -1, "reason": reason}) and status_of({"code": -1, "reason": reason}) == 503


@pytest.mark.parametrize("reason", sorted(p.NOT_APPLIED))
def test_every_reply_that_applied_nothing_is_tried_on_the_next_host(reason: str) -> None:
    assert p.retry_elsewhere(p.consume_request("q"), {"code": -1, "reason": reason})
    assert not p.retry_elsewhere(p.consume_request("q"), {"code": 0, "reason": reason})


@pytest.mark.parametrize("reason", sorted(p.UNKNOWN_OUTCOME))
def test_a_reply_of_unknown_outcome_is_tried_again_only_for_an_idempotent_produce(reason: str) -> None:
    idem = p.produce_request("q", "x", producer="p1", sequence=7)
    assert p.retry_elsewhere(idem, {"code": -1, "reason": reason})
    assert not p.retry_elsewhere(p.produce_request("q", "x"), {"code": -1, "reason": reason})
    assert not p.retry_elsewhere(p.consume_request("q"), {"code": -1, "reason": reason})


@pytest.mark.parametrize("reason", [pp.STORAGE_UNAVAILABLE, pp.QUEUE_FULL, "queue: missing", ["no leader"], None])
def test_a_reply_that_is_no_fail_over_is_not_tried_again(reason: object) -> None:
    idem = p.produce_request("q", "x", producer="p1", sequence=7)
    assert not p.retry_elsewhere(p.consume_request("q"), {"code": -1, "reason": reason})
    assert not p.retry_elsewhere(idem, {"code": -1, "reason": reason})


# ------------------------------------------------------------------ subscriptions


@pytest.mark.parametrize("reason", [pp.MODE_CHANGED, pp.NOT_LEADING, pp.LEADERSHIP_CHANGED, pp.NO_LEADER,
                                    pp.SUBSCRIBE_ON_LEADER])
def test_a_subscribe_refused_for_now_or_off_the_leader_is_made_again(reason: str) -> None:
    from queue_server.client.subscribe import AGAIN, classify

    assert classify({"action": "subscribe", "queue": "q", "code": -1, "reason": reason}) == AGAIN


def test_a_subscription_sends_a_confirm_refused_unapplied_again_and_raises_on_bad_input() -> None:
    from queue_server.client.subscribe import OTHER, PUSH, RESEND, classify

    refused = {"action": p.CONFIRM, "queue": "q", "msg_id": 7, "code": -1, "reason": pp.MODE_CHANGED}
    assert classify(refused) == RESEND
    assert classify({**refused, "reason": "msg_id: must be an integer"}) == OTHER
    assert classify({**refused, "code": 0, "confirmed": 1}) == OTHER
    assert classify({"push": True, "code": 0, "queue": "q", "msg_id": 1}) == PUSH
    with pytest.raises(QueueError):
        classify({"action": "subscribe", "queue": "q", "code": -1, "reason": "credit: missing"})


def test_a_subscription_resends_a_refused_confirm_on_its_connection(servers: Any) -> None:
    """Its pushes' confirms go on the subscription's own connection; one refused unapplied (a
    mode change under the leader) is sent again before the next read."""
    refused: list[dict] = []

    def handle(req: dict, state: dict) -> Any:
        action = req.get("action")
        if action == p.LEADER:
            return echo(req, leader_node_id=1, leader_host="127.0.0.1", leader_port=server.port)
        if action == pp.SUBSCRIBE:
            return [echo(req, subscribed=req["credit"]), push(1)]
        if action == p.CONFIRM:
            if not refused:
                refused.append(req)
                return [echo(req, code=-1, reason=pp.MODE_CHANGED), push(2)]
            return echo(req, confirmed=0)
        return None

    def push(msg_id: int) -> dict:
        return {"action": pp.SUBSCRIBE, "queue": "q", "credit": 2, "code": 0, "node_id": 1, "push": True,
                "msg_id": msg_id, "data": str(msg_id), "delivery_count": 1, "lease_until": None}

    def confirms() -> list:
        return [r.get("msg_id") for r in server.requests if r.get("action") == p.CONFIRM]

    server = servers(handle)
    with QueueClient(server.addr) as c, c.subscribe("q", credit=2) as sub:
        got = iter(sub)
        assert next(got).msg_id == 1
        assert next(got).msg_id == 2  # read after the refusal of the first one's confirm, sent again
        waiting = threading.Thread(target=lambda: next(got, None), daemon=True)
        waiting.start()  # confirms the second, then waits for more
        server.wait_for(lambda: confirms() == [1, 1, 2])
    waiting.join(DEADLINE)


def _two_group_nodes(servers: Any) -> tuple[list[Any], str, str]:
    """Two fake nodes of a cluster with two groups, node 1 leading group 0 and node 2 group 1
    (action 8 says so), each serving any queue; and a queue of each group."""
    from queue_server.protocol.placement import Placement
    placement = Placement([1, 2], 2, group_replicas=1)
    q0, q1 = (next(f"q{i}" for i in range(100) if placement.group_of(f"q{i}") == g) for g in (0, 1))
    stores = [FakeQueues(), FakeQueues()]
    made: list[Any] = []

    def node(i: int) -> Callable[[dict, Any], dict]:
        def handle(req: dict, state: Any) -> dict:
            if req.get("action") == p.LEADER:
                rows = [{"group": g, "leader_node_id": g + 1, "leader_host": "127.0.0.1", "leader_port": made[g].port}
                        for g in (0, 1)]
                return echo(req, leader_node_id=1, leader_host="127.0.0.1", leader_port=made[0].port, groups=rows,
                            placement=placement.as_dict())
            return stores[i](req)
        return handle
    made += [servers(node(0)), servers(node(1))]
    return made, q0, q1


def _asked(server: Any) -> list[tuple[Any, Any]]:
    return [(r["action"], r.get("queue")) for r in server.requests]


def test_with_queue_groups_the_sync_client_sends_a_queue_s_requests_to_its_group_s_leader(servers: Any) -> None:
    """After one action 8, each request about a queue goes to its group's leader, on a
    connection of its own; when that leader is gone, the request goes to the other node (which
    would forward it)."""
    made, q0, q1 = _two_group_nodes(servers)
    with QueueClient([made[0].addr, made[1].addr]) as c:
        c.produce(q0, "a")
        c.produce(q1, "b")
        c.produce(q1, "c")
        assert _asked(made[0]) == [(p.LEADER, None), (p.PRODUCE, q0)]
        assert _asked(made[1]) == [(p.PRODUCE, q1), (p.PRODUCE, q1)]
        assert made[1].connections == 1  # kept open beside node 0's
        made[1].close()
        c.produce(q1, "d")  # its leader is gone: through node 0
        assert made[0].requests[-1]["queue"] == q1


def test_with_queue_groups_the_async_client_sends_a_queue_s_requests_to_its_group_s_leader(
        servers: Any, run: Any) -> None:
    """As the sync client: one action 8 however many calls start at once, then each request
    about a queue (a long poll too, on a connection of its own) to its group's leader, the
    others through the route's node; when that leader is gone, through the other node."""
    made, q0, q1 = _two_group_nodes(servers)

    async def go() -> None:
        async with AsyncQueueClient([made[0].addr, made[1].addr]) as c:
            await asyncio.gather(*(c.produce(q, str(i)) for i in range(5) for q in (q0, q1)))
            assert sorted(_asked(made[0]), key=str) == sorted([(p.LEADER, None)] + [(p.PRODUCE, q0)] * 5, key=str)
            assert _asked(made[1]) == [(p.PRODUCE, q1)] * 5
            assert made[1].connections == 1  # one pipelined connection to the leader of group 1
            got = await c.consume(q1, wait=1)
            assert got is not None and _asked(made[1])[-1] == (p.CONSUME, q1) and made[1].connections == 2
            await c.leader()  # about no queue: the route's node
            assert _asked(made[0])[-1] == (p.LEADER, None)
            made[1].close()
            await c.produce(q1, "gone")  # its leader is gone: through node 0
            assert _asked(made[0])[-1] == (p.PRODUCE, q1)
    run(go())
