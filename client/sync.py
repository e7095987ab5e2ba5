"""The blocking client: one socket, one request at a time, fail-over and redirects."""
from __future__ import annotations

import os
import socket
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from . import protocol as p
from . import tls as tls_
from .admin import AdminMethods
from .errors import ConnectTimeout, QueueError
from .failover import DONE, Failover, Lost, Route
from .protocol import Address, Message

_NO_SEQ = object()

# Every live client, so that a forked child (Spark's Python workers are forked) drops the
# connections it inherited instead of reading replies meant for its parent.
_clients: weakref.WeakSet[QueueClient] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    for client in list(_clients):
        client._close()
        if client._producer is not None:  # the parent goes on producing under its own id
            client._producer = p.ProducerSequence()


os.register_at_fork(after_in_child=_forget_inherited_connections)


class QueueClient(AdminMethods):
    """A blocking client for one queue-server cluster.

    Use it from one thread at a time (give each thread its own client). It keeps one connection
    to the current host; on a connect error, closed connection or timeout it tries the next host
    (each host at most once per call) and raises NoServerAvailable or QueueTimeout when all
    failed. A request retried after a timeout or lost connection may have been carried out
    already; a produce is stored once all the same, since every produce carries this client's
    (producer, sequence) and the queue remembers the last 10,000 of them (idempotent=False
    turns that off: a retried produce may then be stored twice).
    """

    def __init__(
        self,
        hosts: str | Sequence[str | Address] = "127.0.0.1:1111",
        *,
        transport: str = "tcp",
        timeout: float = 5.0,
        follow_redirects: bool = True,
        max_redirects: int = 3,
        idempotent: bool = True,
        token: str | None = None,
        tls: tls_.TlsOption = None,
    ) -> None:
        """token: the cluster's client token (auth_token_file), presented on every new
        connection (TCP) or datagram (UDP). tls: True (verify the nodes' certificates against
        the system's CAs) or an ssl.SSLContext (your CA, a client certificate) for nodes with
        tls_cert_file; TCP only."""
        self.hosts: list[Address]
        self.hosts, self.transport, self.timeout = p.client_settings(hosts, transport, timeout)
        self.follow_redirects = follow_redirects
        self.max_redirects = max_redirects
        # Gives every produce a (producer, sequence): a retried produce is stored once.
        self._producer = p.ProducerSequence() if idempotent else None
        self._udp = transport == "udp"
        self._route = Route(self.hosts)
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._sock_addr: Address | None = None
        self._sock_timeout: float | None = None
        self._udp_seq = 0
        self.token = token
        self.tls = tls
        self._ssl = tls_.context(tls)
        _clients.add(self)

    # ------------------------------------------------------------------ raw requests

    @property
    def address(self) -> Address:
        """The host the next request goes to."""
        return self._route.address

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its reply if code is 0, else QueueError (redirects are followed)."""
        f = Failover(self._route, req, self.timeout, self.follow_redirects, self.max_redirects)
        payload = None if self._udp else p.encode(req)
        while True:
            attempt = f.next()
            if isinstance(attempt, QueueError):
                raise attempt
            try:
                if payload is None:
                    reply = self._udp_roundtrip(attempt.addr, req, f.timeout)
                else:
                    reply = self._tcp_roundtrip(attempt.addr, payload, f.timeout)
            except Lost as exc:
                verdict = f.failed(attempt, exc)
            except OSError as exc:  # TimeoutError among them
                self._close()
                verdict = f.failed(attempt, exc)
            else:
                verdict = f.replied(attempt, reply)
                if verdict is DONE:
                    return reply
            if isinstance(verdict, QueueError):
                raise verdict

    def _tcp_roundtrip(self, addr: Address, payload: bytes, timeout: float) -> dict[str, Any]:
        sock = self._sock
        reused = sock is not None and self._sock_addr == addr
        if not reused:
            self._close()
            try:
                sock = socket.create_connection(addr, timeout=self.timeout)
            except TimeoutError:
                raise ConnectTimeout(f"connect timed out after {self.timeout:g} s") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = tls_.wrap(sock, self._ssl, addr[0])
            self._sock, self._sock_addr, self._sock_timeout = sock, addr, self.timeout
            self._file = sock.makefile("rb", buffering=65536)
            if self.token is not None:
                try:
                    sock.sendall(p.encode(p.auth_request(self.token)))
                    line = self._file.readline()
                except (ConnectionError, ValueError) as exc:
                    self._close()
                    raise Lost(_describe(exc)) from exc
                if not line:
                    self._close()
                    raise Lost(tls_.closed_before_reply(self._ssl is not None))
                try:
                    p.check_auth_reply(p.decode_reply(line))
                except QueueError:
                    self._close()
                    raise
        assert sock is not None
        if self._sock_timeout != timeout:
            sock.settimeout(timeout)
            self._sock_timeout = timeout
        try:
            sock.sendall(payload)
            line = self._file.readline()
        except (ConnectionError, ValueError) as exc:  # ValueError: file of a timed-out socket
            self._close()
            raise Lost(_describe(exc), reused) from exc
        if not line.endswith(b"\n"):
            self._close()
            raise Lost("connection closed by the server" if reused or line
                       else tls_.closed_before_reply(self._ssl is not None), reused)
        try:
            return p.decode_reply(line)
        except QueueError:
            self._close()  # the stream can no longer be trusted
            raise

    def _udp_roundtrip(self, addr: Address, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        sock = self._sock
        if sock is None or self._sock_addr != addr:
            self._close()
            family, kind, proto, _, sockaddr = socket.getaddrinfo(addr[0], addr[1], 0, socket.SOCK_DGRAM)[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.connect(sockaddr)  # connected: stray senders are filtered, ICMP errors reported
            except OSError:
                sock.close()
                raise
            self._sock, self._sock_addr = sock, addr
        self._udp_seq = seq = (self._udp_seq + 1) & 0x7FFFFFFF
        wire = dict(req)
        user_seq = wire.get("seq", _NO_SEQ)
        wire["seq"] = seq if user_seq is _NO_SEQ else [seq, user_seq]
        if self.token is not None:
            wire["auth_token"] = self.token
        data = orjson.dumps(wire)
        if len(data) > p.MAX_DATAGRAM:
            raise QueueError(p.CODE_ERROR, "request too large for UDP, use TCP")
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
            got = reply.get("seq", _NO_SEQ)
            if got is _NO_SEQ:  # e.g. an error reply to a request it could not parse
                return reply
            if user_seq is _NO_SEQ:
                if type(got) is int and got == seq:
                    del reply["seq"]
                    return reply
            elif type(got) is list and len(got) == 2 and type(got[0]) is int and got[0] == seq:
                reply["seq"] = user_seq
                return reply
            # otherwise a late reply to an earlier request that timed out: drop it

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._sock_addr = None
        self._sock_timeout = None

    def close(self) -> None:
        """Close the connection (a later request opens a new one)."""
        self._close()

    def __getstate__(self) -> dict[str, Any]:
        """The settings only: a pickled client (e.g. shipped to Spark executors) reconnects."""
        return {
            "hosts": self.hosts,
            "transport": self.transport,
            "timeout": self.timeout,
            "follow_redirects": self.follow_redirects,
            "max_redirects": self.max_redirects,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        hosts = state.pop("hosts")
        self.__init__(hosts, **state)  # type: ignore[misc]

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ actions

    def produce(
        self,
        queue: str,
        data: str,
        *,
        delay: float | None = None,
        ttl: float | None = None,
        retry: float | None = 0,
        priority: int | None = None,
        producer: str | None = None,
        sequence: int | None = None,
        max_deliveries: int | None = None,
    ) -> int | dict[str, int]:
        """Store one message; its msg_id (a virtual queue: {real queue: msg_id}).

        With `producer` and `sequence` the produce is idempotent: a retry the queue still
        remembers stores nothing and returns the original id(s). Without them the client gives
        every produce its own (producer, sequence) unless it was made with idempotent=False.
        """
        if not isinstance(data, str):
            raise TypeError("data must be a str (use produce_batch for several)")
        if producer is None and sequence is None and self._producer is not None:
            producer, sequence = self._producer.next()
        req = p.produce_request(queue, data, delay, ttl, retry, priority, producer, sequence, max_deliveries)
        return p.produced_ids(self.request(req))

    def produce_batch(
        self,
        queue: str,
        data: Sequence[str],
        *,
        delay: float | None = None,
        ttl: float | None = None,
        retry: float | None = 0,
        priority: int | None = None,
        producer: str | None = None,
        sequence: int | None = None,
        max_deliveries: int | None = None,
    ) -> list[int] | dict[str, list[int]]:
        """Store several messages, all or none; their msg_ids in order (virtual: per real queue).

        `producer` and `sequence` make it idempotent, as for produce().
        """
        if isinstance(data, str):
            raise TypeError("data must be a sequence of str")
        if producer is None and sequence is None and self._producer is not None:
            producer, sequence = self._producer.next()
        req = p.produce_request(queue, data, delay, ttl, retry, priority, producer, sequence, max_deliveries)
        return p.produced_ids(self.request(req))

    def consume(
        self,
        queue: str,
        *,
        wait: float | None = None,
        lease: float | None = None,
        token: str | None = None,
        times: bool = False,
    ) -> Message | None:
        """The next ready message, or None (after up to `wait` seconds of long poll over TCP).

        `lease` leases it for that many seconds whatever its retry; `token` binds the lease to
        a name, so that a retry with the same token returns the same message; `times` fills in
        the message's ready, ttl and lease_until.
        """
        req = p.consume_request(queue, None, wait, lease, token, times)
        return p.message_from_reply(queue, self.request(req))

    def consume_batch(
        self,
        queue: str,
        count: int,
        *,
        wait: float | None = None,
        lease: float | None = None,
        token: str | None = None,
        times: bool = False,
    ) -> list[Message]:
        """Up to `count` (1..1000) ready messages, possibly none (`lease`, `token`, `times` as
        for consume())."""
        req = p.consume_request(queue, count, wait, lease, token, times)
        return p.messages_from_reply(queue, self.request(req))

    def confirm(
        self, queue: str, msg_id: int, *, token: str | None = None, delivery_count: int | None = None
    ) -> bool:
        """Delete a consumed message; False if it was no longer there (or, with `token` or
        `delivery_count`, no longer leased under that token / delivered again since)."""
        req = p.ids_request(p.CONFIRM, queue, msg_id, token=token, delivery_count=delivery_count)
        reply = self.request(req)
        return bool(reply.get("confirmed", 1))  # the original server sends no count

    def confirm_many(
        self,
        queue: str,
        msg_ids: Iterable[int] | None = None,
        *,
        token: str | None = None,
        tokens: Iterable[str] | None = None,
        token_prefix: str | None = None,
        delivery_counts: Iterable[int] | None = None,
    ) -> int:
        """Delete consumed messages, by id and/or by lease token; how many were deleted."""
        req = p.ids_request(p.CONFIRM, queue, None if msg_ids is None else list(msg_ids), token=token,
                            tokens=tokens, token_prefix=token_prefix, delivery_counts=delivery_counts)
        return p.count_from_reply(self.request(req), "confirmed")

    def release(
        self,
        queue: str,
        msg_ids: int | Iterable[int] | None = None,
        *,
        token: str | None = None,
        tokens: Iterable[str] | None = None,
        token_prefix: str | None = None,
        delivery_counts: Iterable[int] | None = None,
    ) -> int:
        """Give leases back (the messages are ready again at once), by id and/or token; how
        many were leased."""
        req = p.ids_request(p.RELEASE, queue, msg_ids, token=token, tokens=tokens,
                            token_prefix=token_prefix, delivery_counts=delivery_counts)
        return p.count_from_reply(self.request(req), "released")

    def extend(
        self,
        queue: str,
        msg_ids: int | Iterable[int] | None,
        retry: float,
        *,
        token: str | None = None,
        tokens: Iterable[str] | None = None,
        token_prefix: str | None = None,
        delivery_counts: Iterable[int] | None = None,
    ) -> int:
        """Make leases end `retry` seconds from now, by id and/or token; how many were leased."""
        req = p.ids_request(p.EXTEND, queue, msg_ids, retry=retry, token=token, tokens=tokens,
                            token_prefix=token_prefix, delivery_counts=delivery_counts)
        return p.count_from_reply(self.request(req), "extended")

    def monitor(self, queue: str | None = None, *, local: bool = False) -> dict[str, Any]:
        """Statistics of one queue, or of the node; `local` asks the answering node itself."""
        return self.request(p.monitor_request(queue, local))

    def list_queues(self, pattern: str = "", *, local: bool = False) -> list[str]:
        """Names of the queues containing `pattern`."""
        return list(self.request(p.list_request(pattern, local)).get("queue_list") or [])

    def leader(self) -> dict[str, Any]:
        """The leader's node id and client address (leader_node_id, leader_host, leader_port)."""
        return self.request(p.leader_request())

    def __repr__(self) -> str:
        hosts = ",".join(p.format_address(a) for a in self.hosts)
        return f"QueueClient({hosts!r}, transport={self.transport!r})"


def _describe(exc: BaseException) -> str:
    return p.describe_failure(exc, Lost)
