"""Property tests (hypothesis) of a real node's wire: random bytes and random JSON documents sent
over TCP and UDP. Every complete request gets exactly one reply, in order; bad ones get code -1
with a reason; when the TCP framing cannot be recovered the node answers the error and closes the
connection (protocol/framing.py); the node's processes survive every example and keep serving; and
messages stored before the fuzzing are all still there after it. Each test runs against a node
without and with client authentication (auth_token_file: each TCP connection authenticates first,
each datagram carries auth_token, and one that is not a JSON object, and so cannot, gets no
reply); the second with fewer examples, since the request path after the check is the same."""
from __future__ import annotations

import itertools
import re
import socket
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_server.protocol import vocabulary as p
from queue_server.protocol.framing import FrameDecoder, FramingError
from tests.harness import RawTcp, alive
from tests.integration.conftest import AUTH_TOKEN
from tests.unit.test_framing_props import JSON, REQUESTS, SEPARATORS, SOUP

MAX_REQUEST_SIZE = 65536  # the node fixture's config (tests/integration/conftest.py): OVERSIZED
REPLY_TIMEOUT = 10.0
FRAMING_REASONS = ("malformed JSON", "invalid UTF-8", "request exceeds max_request_size")
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
AUTH_SETTINGS = settings(SETTINGS, max_examples=25)
_seq = itertools.count()


class Wire:
    """The node a test talks to, and the client token it needs (None: authentication off)."""

    def __init__(self, node, token: str | None) -> None:
        self.node = node
        self.token = token
        self.settings = AUTH_SETTINGS if token else SETTINGS

    def connect(self) -> RawTcp:
        """A TCP connection, authenticated when the node asks for it."""
        conn = RawTcp(*self.node.address, timeout=REPLY_TIMEOUT)
        if self.token is not None:
            reply = conn.call({"action": "auth", "token": self.token})
            assert reply["code"] == 0, reply
        return conn


@pytest.fixture(params=["auth-off", "auth-on"])
def wire(request) -> Wire:
    if request.param == "auth-on":
        return Wire(request.getfixturevalue("authed_node"), AUTH_TOKEN)
    return Wire(request.getfixturevalue("node"), None)


def _documents(strip_wait: bool, token: str | None) -> st.SearchStrategy[object]:
    """Random request documents (mostly objects, tagged with a unique seq) and other JSON. With a
    token, an auth request among them carries it: a wrong one would close the connection and,
    repeated, throttle this address (that is tests/integration/test_auth.py's business)."""
    def tag(req: dict) -> dict:
        if strip_wait:
            req.pop("wait", None)  # a parked long poll would hold back every later reply
        if token is not None and req.get("action") in (p.AUTH, "auth"):
            req["token"] = token
        req["seq"] = f"s{next(_seq)}"
        return req
    return st.one_of(REQUESTS.map(tag), REQUESTS.map(tag), JSON)


OVERSIZED = st.builds(lambda n: b'{"action":1,"queue":"q1","data":"' + b"x" * n + b'"}',
                      st.integers(MAX_REQUEST_SIZE - 30, MAX_REQUEST_SIZE + 100))


@st.composite
def tcp_streams(draw: st.DrawFn, token: str | None) -> bytes:
    """Random bytes, encoded documents and now and then an oversized request, run together."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["soup", "doc", "doc", "bytes"]))
        if kind == "soup":
            parts.append(draw(SOUP))
        elif kind == "bytes":
            parts.append(draw(st.binary(max_size=300)))
        else:
            parts.append(orjson.dumps(draw(_documents(True, token))) + draw(SEPARATORS))
    if draw(st.integers(0, 9)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), draw(OVERSIZED) + draw(SEPARATORS))
    return b"".join(parts)


# -- the node's health --------------------------------------------------------------------------


class Health:
    """What must hold after every example: the node's processes are the ones it started with,
    alive; it logged no error; it answers a produce and a consume; the messages stored at the
    start are there."""

    def __init__(self, wire: Wire) -> None:
        self.node = node = wire.node
        self.connect = wire.connect
        self.log_from = len(node.log())
        self.pids = sorted(node.child_pids())
        assert len(self.pids) >= 3, self.pids  # coordinator, acceptor, workers
        self.keep = f"keep-{time.monotonic_ns()}"
        self.kept = [f"stored before the fuzzing {i}" for i in range(3)]
        conn = self.connect()
        try:
            r = conn.call({"action": 1, "queue": self.keep, "data": self.kept, "retry": 60})
            assert r["code"] == 0, r
        finally:
            conn.close()

    def check(self) -> None:
        node = self.node
        assert node.proc.poll() is None, f"the node exited ({node.proc.returncode}):\n{node.log()[-3000:]}"
        dead = [pid for pid in self.pids if not alive(pid)]
        assert not dead, f"node processes died: {dead}\n{node.log()[-3000:]}"
        log = node.log()[self.log_from:]
        assert not re.search(r" (ERROR|CRITICAL) |Traceback", log), log[-3000:]
        probe = f"probe-{time.monotonic_ns()}"
        conn = self.connect()
        try:
            assert conn.call({"action": 1, "queue": probe, "data": "p"})["code"] == 0
            r = conn.call({"action": 2, "queue": probe})
            assert (r["code"], r.get("data")) == (0, "p"), r
            m = conn.call({"action": 4, "queue": self.keep})
            assert m["code"] == 0 and m["size"] == len(self.kept), m
        finally:
            conn.close()

    def final_check(self) -> None:
        """The stored messages, read back: every one, with its data."""
        self.check()
        conn = self.connect()
        try:
            r = conn.call({"action": 2, "queue": self.keep, "count": 10})
            assert sorted(m["data"] for m in r["messages"]) == sorted(self.kept), r
            conn.call({"action": 3, "queue": self.keep, "msg_ids": [m["msg_id"] for m in r["messages"]]})
        finally:
            conn.close()


@pytest.fixture
def health(wire):
    return Health(wire)


# -- replies ------------------------------------------------------------------------------------


def _read_replies(sock: socket.socket, end_seq: str) -> tuple[list[dict], bool]:
    """Reply lines until the one echoing end_seq, or until the node closes the connection:
    (replies, closed). Every reply must be one JSON object on one line."""
    deadline = time.monotonic() + REPLY_TIMEOUT
    buf = b""
    replies: list[dict] = []
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            reply = orjson.loads(line)
            assert type(reply) is dict, line
            replies.append(reply)
            if reply.get("seq") == end_seq:
                assert buf == b"", f"bytes after the last reply: {buf[:200]!r}"
                return replies, False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no reply to {end_seq} within {REPLY_TIMEOUT}s; got {replies}")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            assert buf == b"", f"a reply cut short: {buf[:200]!r}"
            return replies, True
        buf += chunk


def _check_reply(reply: dict, request: object) -> None:
    """The reply to one decoded request (a value or a FramingError)."""
    assert reply.get("code") in (p.CODE_OK, p.CODE_ERROR), reply
    if reply["code"] == p.CODE_ERROR:
        assert isinstance(reply.get("reason"), str) and reply["reason"], reply
        assert not reply["reason"].startswith("internal error"), (reply, request)
    if isinstance(request, FramingError):
        assert (reply["code"], reply["reason"]) == (p.CODE_ERROR, request.reason), (reply, request)
    elif type(request) is not dict:
        assert (reply["code"], reply["reason"]) == (p.CODE_ERROR, "request: must be a JSON object")
    else:
        if "seq" in request:
            assert reply.get("seq") == request["seq"], (reply, request)
        action = p.request_action(request)
        if type(action) is str:
            assert (reply["code"], reply["reason"]) == (p.CODE_ERROR, action), (reply, request)


def _exchange_tcp(wire: Wire, payload: bytes) -> None:
    """Send payload then a marker request on one connection (after an auth request when the node
    asks for one), and check the replies against what protocol/framing.py makes of the same bytes."""
    node = wire.node
    end_seq = f"end-{next(_seq)}"
    stream = payload + b"\n" + orjson.dumps({"action": 8, "seq": end_seq}) + b"\n"
    if wire.token is not None:
        stream = orjson.dumps({"action": "auth", "token": wire.token, "seq": f"auth-{end_seq}"}) + b"\n" + stream
    decoder = FrameDecoder(node.config["max_request_size"])
    expected = [value for value, _ in decoder.feed(stream)]
    conn = RawTcp(*node.address, timeout=REPLY_TIMEOUT)
    try:
        conn.sock.sendall(stream)
        replies, closed = _read_replies(conn.sock, end_seq)
    except (BrokenPipeError, ConnectionResetError):
        # The node may close as soon as the framing is lost, before all was sent: then it must
        # have answered up to that error, which the reading below cannot see any more.
        assert decoder.closed, "the node closed a connection whose framing was fine"
        return
    finally:
        conn.close()
    if not closed:  # the marker was answered: every request got its reply, in order
        assert not decoder.closed and len(replies) == len(expected), (replies, expected)
        for reply, request in zip(replies, expected):
            _check_reply(reply, request)
        return
    # Closed: the framing was lost. The last reply is the error that lost it, and every request
    # before it was answered. The node may have given up earlier than the decoder did in one
    # piece (the stream arrived in several reads and a bad value had no newline after it yet).
    assert replies, "the connection closed without the framing error's reply"
    last = replies[-1]
    assert last["code"] == p.CODE_ERROR and last["reason"].startswith(FRAMING_REASONS), last
    n = len(replies)
    assert n <= len(expected), (replies, expected)
    for reply, request in zip(replies[:-1], expected):
        _check_reply(reply, request)
    if decoder.closed and n == len(expected):
        _check_reply(last, expected[-1])


# -- the tests ----------------------------------------------------------------------------------


def test_tcp_random_bytes_and_documents(wire, health) -> None:
    @wire.settings
    @given(tcp_streams(wire.token))
    def run(payload: bytes) -> None:
        _exchange_tcp(wire, payload)
        health.check()

    run()
    health.final_check()


def test_tcp_random_documents_pipelined(wire, health) -> None:
    """Many random requests on one connection, newline-delimited or back to back."""
    @wire.settings
    @given(st.lists(st.tuples(_documents(True, wire.token), SEPARATORS), min_size=1, max_size=20))
    def run(docs: list) -> None:
        payload = b"".join(orjson.dumps(d) + sep for d, sep in docs)
        _exchange_tcp(wire, payload)
        health.check()

    run()
    health.final_check()


def _udp_payloads(token: str | None) -> st.SearchStrategy[bytes]:
    def signed(doc: object) -> object:
        if token is not None and type(doc) is dict:
            doc["auth_token"] = token
        return doc
    docs = _documents(False, token).map(signed).map(orjson.dumps)
    return st.one_of(docs, docs, docs.map(lambda b: b + b"\n"), SOUP, st.binary(max_size=1500))


def _signed_request(payload: bytes, token: str) -> object | None:
    """The request a datagram holds with its valid auth_token removed, or None if it does not
    carry one (then it gets no reply)."""
    try:
        request = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if type(request) is not dict or request.pop("auth_token", None) != token:
        return None
    return request


def test_udp_random_datagrams(wire, health) -> None:
    node, token = wire.node, wire.token
    host, port = node.address
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(REPLY_TIMEOUT)

    def call(data: bytes) -> dict:
        sock.sendto(data, (host, port))
        reply, _ = sock.recvfrom(1 << 16)
        assert reply.endswith(b"\n") and reply.count(b"\n") == 1, reply[:200]
        value = orjson.loads(reply)
        assert type(value) is dict, reply[:200]
        return value

    def no_reply(data: bytes) -> None:
        """The node drops `data`: the next reply is the one to a marker sent after it."""
        end_seq = f"end-{next(_seq)}"
        sock.sendto(data, (host, port))
        assert call(orjson.dumps({"action": 8, "seq": end_seq, "auth_token": token})).get("seq") == end_seq

    @wire.settings
    @given(_udp_payloads(token))
    def run(payload: bytes) -> None:
        if token is not None:
            request = _signed_request(payload, token)
            if request is None:
                no_reply(payload)
            else:
                _check_reply(call(payload), request)
            health.check()
            return
        reply = call(payload)
        try:
            request = orjson.loads(payload)
        except orjson.JSONDecodeError:
            assert reply["code"] == p.CODE_ERROR and reply["reason"].startswith(FRAMING_REASONS), reply
        else:
            _check_reply(reply, request)
        health.check()

    try:
        run()
        # No reply was sent twice: the next datagram is the answer to this one.
        end_seq = f"end-{next(_seq)}"
        assert call(orjson.dumps({"action": 8, "seq": end_seq, **({"auth_token": token} if token else {})})).get("seq") == end_seq
    finally:
        sock.close()
    health.final_check()
