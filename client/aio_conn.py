"""The asyncio client's transports (client/aio.py): a TCP connection whose requests are
pipelined and whose replies are matched in order, and a connected UDP endpoint whose replies are
matched by seq."""
from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

from . import protocol as p
from . import tls as tls_
from .errors import QueueError
from .failover import Lost
from .protocol import Address


class Conn(asyncio.Protocol):
    """One TCP connection: requests are written in order and replies matched to a FIFO of futures.

    Writes made in one event-loop turn go out in one send. Each request carries a deadline; one
    timer per connection fails the oldest unanswered request with TimeoutError once it passes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, addr: Address, epoch: int) -> None:
        self.loop = loop
        self.addr = addr
        self.epoch = epoch
        self.pending: deque[tuple[asyncio.Future[dict[str, Any]], float]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._retiring = False
        self._parts: list[bytes] = []
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._heard = False  # any byte from the server yet
        self._tls = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        self._tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass

    def data_received(self, data: bytes) -> None:
        self._heard = True
        if b"\n" not in data:
            self._parts.append(data)
            return
        if self._parts:
            self._parts.append(data)
            data = b"".join(self._parts)
            self._parts.clear()
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            self._parts.append(tail)
        pending = self.pending
        for line in lines:
            if not line or line.isspace():
                continue
            if not pending:
                self.abort()  # a reply nobody asked for: the stream is out of step
                return
            fut = pending.popleft()[0]
            if fut.done():  # its caller gave up (timeout or cancel)
                continue
            try:
                fut.set_result(p.decode_reply(line))
            except QueueError as exc:
                fut.set_exception(exc)
                self.abort()
                return
        if self._retiring and not pending:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        detail = (f"connection lost: {exc}" if exc else
                  "connection closed by the server" if self._heard else tls_.closed_before_reply(self._tls))
        while self.pending:
            fut = self.pending.popleft()[0]
            if not fut.done():
                fut.set_exception(Lost(detail))
        self._wake_writers()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()

    def _wake_writers(self) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    def send(self, payload: bytes, timeout: float) -> asyncio.Future[dict[str, Any]]:
        """Queue one request for writing; the future gets its reply, or TimeoutError."""
        if self.closed or self._retiring or self.transport is None or self.transport.is_closing():
            raise Lost("connection closed")
        loop = self.loop
        fut = loop.create_future()
        deadline = loop.time() + timeout
        self.pending.append((fut, deadline))
        self._out.append(payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check_deadlines)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.closed and self.transport is not None:
            out = self._out
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def _check_deadlines(self) -> None:
        self._timer = None
        now = self.loop.time()
        for fut, deadline in self.pending:
            if fut.done():
                continue
            if deadline > now:
                self._timer = self.loop.call_at(deadline, self._check_deadlines)
                return
            fut.set_exception(TimeoutError(f"no reply within {deadline - now:.3g} s"))

    @property
    def busy(self) -> bool:
        """Whether the socket's send buffer is full (callers should wait on drain())."""
        return self._paused and not self.closed

    async def drain(self) -> None:
        """Wait while the socket's send buffer is full."""
        if self._paused and not self.closed:
            waiter = self.loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def retire(self) -> None:
        """Close once the replies already asked for have arrived."""
        self._retiring = True
        if not self.pending:
            self.close()

    def close(self) -> None:
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class Udp(asyncio.DatagramProtocol):
    """A connected UDP endpoint; replies are matched to requests by the seq the client sets."""

    def __init__(self, addr: Address, epoch: int) -> None:
        self.addr = addr
        self.epoch = epoch
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.closed = False
        self._retiring = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            reply = p.decode_reply(data)
        except QueueError:
            return
        key = p.udp_reply_seq(reply)
        if key is None:
            if "seq" in reply or len(self.pending) != 1:
                return
            key = next(iter(self.pending))  # a reply without seq can only be matched when alone
        fut = self.pending.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def error_received(self, exc: Exception) -> None:
        # On a connected socket this is the ICMP "port unreachable" of a host that is down.
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self.pending.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(Lost("endpoint closed"))
        self.pending.clear()

    def forget(self, seq: int) -> None:
        """Stop waiting for the reply to `seq`."""
        self.pending.pop(seq, None)
        if self._retiring and not self.pending:
            self.close()

    def retire(self) -> None:
        """Close once no request is waiting for its reply."""
        self._retiring = True
        if not self.pending:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def exchange(conn: Conn, payload: bytes, timeout: float, reused: bool) -> dict[str, Any]:
    """One request on `conn`, its reply; Lost says whether the connection was `reused`."""
    try:
        fut = conn.send(payload, timeout)
        if conn.busy:
            await conn.drain()
        return await fut
    except Lost as exc:
        raise Lost(str(exc), reused) from None
