"""The blocking client: one request at a time, fail-over and redirects; a TCP connection per node
it talks to (with queue groups, to each group's leader)."""
from __future__ import annotations

import os
import socket
import time
import weakref
from collections.abc import Sequence
from typing import Any

from . import protocol as p
from . import tls as tls_
from .calls import BlockingActions
from .credentials import TokenOption
from .errors import ConnectTimeout, QueueError
from .failover import DONE, Failover, Lost, describe
from .group_leaders import GroupLeaders, LeaderLookup
from .protocol import Address
from .settings import ClientSettings
from .subscribe import Subscription

# The most TCP connections a client keeps open (one per node it talked to; the least recently
# used is closed past this).
MAX_CONNECTIONS = 16

# Every live client, so that a forked child (Spark's Python workers are forked) drops the
# connections it inherited instead of reading replies meant for its parent.
_clients: weakref.WeakSet[QueueClient] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    for client in list(_clients):
        client._close()
        if client._producer is not None:  # the parent goes on producing under its own id
            client._producer = p.ProducerSequence()


os.register_at_fork(after_in_child=_forget_inherited_connections)


class QueueClient(ClientSettings, BlockingActions):
    """A blocking client for one queue-server cluster.

    Use it from one thread at a time (give each thread its own client). It keeps one connection
    to the current host; on a connect error, closed connection or timeout it tries the next host
    (each host at most once per round; a call goes round again while the cluster is between two
    leaders, for up to `timeout` seconds) and raises NoServerAvailable or QueueTimeout when all
    failed. A request retried after a timeout or lost connection may have been carried out
    already; a produce is stored once all the same, since every produce carries this client's
    (producer, sequence) and the queue remembers the last 10,000 of them (idempotent=False
    turns that off: a retried produce may then be stored twice).
    """

    def __init__(self, hosts: str | Sequence[str | Address] = "127.0.0.1:1111", *, transport: str = "tcp",
                 timeout: float = 5.0, follow_redirects: bool = True, max_redirects: int = 3,
                 idempotent: bool = True, token: TokenOption = None, tls: tls_.TlsOption = None) -> None:
        """token: the cluster's client token (auth_token_file), presented on every new
        connection (TCP) or datagram (UDP); or TokenFile(path), the file holding it. tls: True
        (verify the nodes' certificates against the system's CAs), TlsFiles(ca_file, cert_file,
        key_file) (your CA, a client certificate) or an ssl.SSLContext, for nodes with
        tls_cert_file; TCP only. Pickled, the client keeps these (ClientSettings), an
        SSLContext excepted: give TlsFiles to a client that travels."""
        self._settle(hosts, transport, timeout, follow_redirects, max_redirects, idempotent, token, tls)
        # TCP: a connection per node (socket, its reader, its timeout), the last used last.
        self._conns: dict[Address, tuple[socket.socket, Any, float]] = {}
        self._udp_sock: socket.socket | None = None
        self._udp_addr: Address | None = None
        # With queue groups: when to ask the cluster where each group's leader is.
        self._lookup = LeaderLookup(len(self.hosts))
        _clients.add(self)

    # ------------------------------------------------------------------ raw requests

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its reply if code is 0, else QueueError (redirects are followed)."""
        if self._lookup.due(req, self._route.groups, time.monotonic()):
            self._ask_groups()
        return self._request(req, self.timeout)

    def _request(self, req: dict[str, Any], patience: float) -> dict[str, Any]:
        """request(), going round the hosts again for `patience` seconds while the cluster is
        between two leaders."""
        f = Failover(self._route, req, self.timeout, self.follow_redirects, self.max_redirects,
                     patience=patience, now=time.monotonic())
        payload = None if self._udp else p.encode(req)
        while True:
            attempt = f.next(time.monotonic())
            if isinstance(attempt, QueueError):
                raise attempt
            if type(attempt) is float:  # the cluster is between two leaders: round again
                time.sleep(attempt)
                continue
            try:
                if payload is None:
                    reply = self._udp_roundtrip(attempt.addr, req, f.timeout)
                else:
                    reply = self._tcp_roundtrip(attempt.addr, payload, f.timeout)
            except Lost as exc:
                verdict = f.failed(attempt, exc)
            except OSError as exc:  # TimeoutError among them (a TCP connection is closed by then)
                if payload is None:
                    self._close()
                verdict = f.failed(attempt, exc)
            else:
                verdict = f.replied(attempt, reply)
                if verdict is DONE:
                    return reply
            if isinstance(verdict, QueueError):
                raise verdict

    def _ask_groups(self) -> None:
        """Ask the cluster where each queue group's leader is (action 8 without a queue)."""
        try:
            reply = self._request({"action": p.LEADER}, 0.0)  # once round the hosts: no wait for an election
        except (QueueError, OSError):
            self._lookup.unanswered(time.monotonic())
            return
        self._route.groups = GroupLeaders.from_reply(reply, self._route.address[0])

    def _tcp_roundtrip(self, addr: Address, payload: bytes, timeout: float) -> dict[str, Any]:
        conn = self._conns.pop(addr, None)
        reused = conn is not None
        if conn is None:
            conn = self._connect(addr)
        sock, file, sock_timeout = conn
        if sock_timeout != timeout:
            sock.settimeout(timeout)
        try:
            sock.sendall(payload)
            line = file.readline()
        except (ConnectionError, ValueError) as exc:  # ValueError: file of a timed-out socket
            _shut(sock, file)
            raise Lost(describe(exc), reused) from exc
        except OSError:  # a timeout among them: the caller gives up on this node
            _shut(sock, file)
            raise
        if not line.endswith(b"\n"):
            _shut(sock, file)
            raise Lost("connection closed by the server" if reused or line
                       else tls_.closed_before_reply(self._ssl is not None), reused)
        try:
            reply = p.decode_reply(line)
        except QueueError:
            _shut(sock, file)  # the stream can no longer be trusted
            raise
        self._conns[addr] = (sock, file, timeout)  # the last used last
        while len(self._conns) > MAX_CONNECTIONS:
            _shut(*self._conns.pop(next(iter(self._conns)))[:2])
        return reply

    def _connect(self, addr: Address) -> tuple[socket.socket, Any, float]:
        """A new connection to `addr` (authenticated when the client has a token)."""
        try:
            sock = socket.create_connection(addr, timeout=self.timeout)
        except TimeoutError:
            raise ConnectTimeout(f"connect timed out after {self.timeout:g} s") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            sock = tls_.wrap(sock, self._ssl, addr[0])
        file = sock.makefile("rb", buffering=65536)
        if self.token is not None:
            try:
                sock.sendall(p.encode(p.auth_request(self.token)))
                line = file.readline()
            except (ConnectionError, ValueError) as exc:
                _shut(sock, file)
                raise Lost(describe(exc)) from exc
            except OSError:
                _shut(sock, file)
                raise
            if not line:
                _shut(sock, file)
                raise Lost(tls_.closed_before_reply(self._ssl is not None))
            try:
                p.check_auth_reply(p.decode_reply(line))
            except QueueError:
                _shut(sock, file)
                raise
        return sock, file, self.timeout

    def _udp_roundtrip(self, addr: Address, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        sock = self._udp_sock
        if sock is None or self._udp_addr != addr:
            self._close()
            family, kind, proto, _, sockaddr = socket.getaddrinfo(addr[0], addr[1], 0, socket.SOCK_DGRAM)[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.connect(sockaddr)  # connected: stray senders are filtered, ICMP errors reported
            except OSError:
                sock.close()
                raise
            self._udp_sock, self._udp_addr = sock, addr
        seq = self._next_udp_seq()
        data = p.udp_datagram(req, seq, self.token)
        deadline = time.monotonic() + timeout
        sock.settimeout(timeout)
        sock.send(data)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(remaining)
            packet = sock.recv(65536)
            try:
                reply = p.decode_reply(packet)
            except QueueError:
                continue
            # No seq: e.g. an error reply to a request it could not parse. Another seq: a late
            # reply to an earlier request that timed out; dropped.
            if "seq" not in reply or p.udp_reply_seq(reply) == seq:
                return p.udp_reply(reply, req)

    def _close(self) -> None:
        conns, self._conns = self._conns, {}
        for sock, file, _ in conns.values():
            _shut(sock, file)
        if self._udp_sock is not None:
            self._udp_sock.close()
            self._udp_sock = self._udp_addr = None

    def close(self) -> None:
        """Close the connections (a later request opens new ones)."""
        self._close()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def subscribe(self, queues: str | list[str], credit: int = 100) -> Subscription:
        """A Subscription to one queue or a list of them: iterate it for the messages the leader
        pushes, never more than `credit` unconfirmed per queue (see client/subscribe.py)."""
        return Subscription(self, queues, credit)


def _shut(sock: socket.socket, file: Any) -> None:
    """Close a connection and its reader."""
    try:
        file.close()
    except OSError:
        pass
    sock.close()
