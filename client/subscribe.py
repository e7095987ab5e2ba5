"""QueueClient.subscribe: messages pushed by the leader on a connection of their own, never more
than the credit unconfirmed (protocol action `subscribe`, docs/protocol.md section 5c)."""
from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from . import protocol as p
from . import tls
from .errors import QueueError
from .failover import Reconnect
from .protocol import Message
from queue_server.protocol.vocabulary import SUBSCRIBE, resolve_action

# How long a subscription keeps trying to find the (new) leader after it lost its connection.
RESUBSCRIBE_FOR = 30.0
# How long it waits before subscribing again when its subscription ended or was refused.
AGAIN_PAUSE = 0.1


PUSH, AGAIN, RESEND, OTHER = "push", "again", "resend", "other"


def classify(reply: dict) -> str:
    """What a line read on a subscription's connection is: PUSH (a pushed message), AGAIN (the
    subscription ended, or was refused for now (p.try_again: no leader, not leading, the node's
    mode changed) or because it did not reach the leader: subscribe again, on the leader),
    RESEND (a confirm refused with nothing applied, p.NOT_APPLIED: send it again) or OTHER (the
    answer to our own subscribe or confirm). QueueError for any other refusal."""
    ok = reply.get("code") == p.CODE_OK
    if reply.get("push"):
        return PUSH if ok else AGAIN
    if ok:
        return OTHER
    action = resolve_action(reply.get("action"))
    if action == p.AUTH:
        raise p.error_from_reply(reply)
    if action == SUBSCRIBE:
        if p.try_again(reply) or reply.get("reason") == p.SUBSCRIBE_ON_LEADER:
            return AGAIN
        raise p.error_from_reply(reply)
    if action == p.CONFIRM and reply.get("reason") in p.NOT_APPLIED and _confirmable(reply):
        return RESEND
    return OTHER


def _confirmable(reply: dict) -> bool:
    return isinstance(reply.get("queue"), str) and type(reply.get("msg_id")) is int


def message(push: dict) -> Message:
    """A pushed message as a Message (lease_until None: at most once)."""
    return Message(push["queue"], push["msg_id"], push.get("data", ""), push.get("delivery_count", 1),
                   lease_until=push.get("lease_until"))


def _confirm(queue: str, msg_id: int) -> dict:
    return {"action": p.CONFIRM, "queue": queue, "msg_id": msg_id}


class _SubscriptionState:
    """What both subscriptions share: their requests, where the leader is, when to give up."""

    def __init__(self, client: Any, queues: str | Iterable[str], credit: int) -> None:
        self.client = client
        self.queues = (queues,) if isinstance(queues, str) else tuple(queues)
        self._credit = credit
        self.closed = False
        # Confirms refused with nothing applied, to send again before the next read.
        self._resend: list[dict] = []

    def __getstate__(self) -> dict[str, Any]:
        """Pickled, a subscription is its request: the copy subscribes anew, on a connection of
        its own, where it is first iterated (its client pickles as ClientSettings says)."""
        return {"client": self.client, "queues": self.queues, "credit": self._credit, "closed": self.closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["client"], state["queues"], state["credit"])  # type: ignore[misc]
        self.closed = state["closed"]

    def _requests(self) -> list[dict]:
        auth = [p.auth_request(self.client.token)] if self.client.token is not None else []
        return auth + [{"action": SUBSCRIBE, "queue": q, "credit": self._credit} for q in self.queues]

    def _reconnect(self) -> Reconnect:
        return Reconnect(time.monotonic(), f"subscribe {','.join(self.queues)}", RESUBSCRIBE_FOR)

    def _leader_address(self, reply: dict) -> p.Address:
        return p.redirect_target(reply, self.client.address[0]) or self.client.address

    def _take(self, line: bytes) -> dict | float | None:
        """A line read on the subscription: the push it carries; or, when the subscription has to
        be made again, the seconds to wait first (the connection is dropped); else None (a
        confirm refused unapplied is kept to be sent again: _resend)."""
        kind = classify(reply := p.decode_reply(line))
        if kind == PUSH:
            return reply
        if kind == AGAIN:
            self._drop()
            return AGAIN_PAUSE
        if kind == RESEND:
            self._resend.append(_confirm(reply["queue"], reply["msg_id"]))
        return None

    def _take_resends(self) -> list[dict]:
        """The confirms to send again now (each once: a second refusal keeps it again)."""
        taken, self._resend = self._resend, []
        return taken

    def _drop(self) -> None:  # pragma: no cover - provided
        raise NotImplementedError

    @staticmethod
    def _settle(m: Message) -> tuple[str, int] | None:
        """An at-most-once message's credit is freed (by a confirm) once the caller moves on."""
        return (m.queue, m.msg_id) if m.lease_until is None else None


class Subscription(_SubscriptionState):
    """An iterator over the messages pushed to a subscription to one or more queues (the credit
    holds per queue; each Message names its queue).

    At-least-once messages (`lease_until` set) are confirmed by the caller as after a consume
    (client.confirm, or confirm() here); that frees their credit. At-most-once ones free their
    credit when the caller asks for the next message. When the connection or the leader is lost
    the subscription is made again on the leader (pushed at-least-once messages not confirmed
    come back after their lease; at-most-once ones are never pushed twice).
    """

    def __init__(self, client: Any, queues: str | Iterable[str], credit: int) -> None:
        super().__init__(client, queues, credit)
        self.sock: socket.socket | None = None
        self.buf = b""

    # ------------------------------------------------------------------ public
    def __iter__(self) -> Iterator[Message]:
        settle: tuple[str, int] | None = None
        while not self.closed:
            if settle is not None:
                self._send(_confirm(*settle))
                settle = None
            push = self._next_push()
            if push is None:
                return
            m = message(push)
            settle = self._settle(m)
            yield m

    def credit(self, credit: int) -> None:
        """Change the credit (0 stops the flow until it is raised again)."""
        self._credit = credit
        if self.sock is not None:
            for req in self._requests():
                self._send(req)

    def confirm(self, m: Message) -> None:
        """Confirm a pushed message on the subscription's own connection."""
        self._send(_confirm(m.queue, m.msg_id))

    def close(self) -> None:
        """End the subscription (leased messages not confirmed come back after their lease)."""
        self.closed = True
        sock, self.sock = self.sock, None  # close() may run in another thread than the reader
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ connection
    def _send(self, req: dict) -> None:
        try:
            assert self.sock is not None
            self.sock.sendall(p.encode(req))
        except OSError:
            self._drop()

    def _drop(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        self.buf = b""

    def _open(self) -> None:
        """Connect to the leader and subscribe; retried until RESUBSCRIBE_FOR has passed."""
        reconnect = self._reconnect()
        while True:
            try:
                host, port = self._leader_address(self.client.leader(self.queues[0]))
                sock = socket.create_connection((host, port), timeout=self.client.timeout)
                if self.client._ssl is not None:
                    sock = tls.wrap(sock, self.client._ssl, host)
                sock.settimeout(None)
                self.sock, self.buf = sock, b""
                for req in self._requests():
                    self._send(req)
                if self.sock is None:
                    raise ConnectionError("connection lost while subscribing")
                return
            except (OSError, QueueError) as exc:
                self._drop()
                pause = reconnect.failed(time.monotonic(), exc)
                if isinstance(pause, QueueError):
                    raise pause from None
                time.sleep(pause)

    def _next_push(self) -> dict | None:
        """The next pushed message; None once closed."""
        while not self.closed:
            if self.sock is None:
                self._open()
                if self.closed:  # closed (from another thread) while it connected
                    self._drop()
                    break
            for req in self._take_resends():
                self._send(req)
            line = self._line()
            if line is None:
                self._drop()  # lost: subscribe again, on whichever node leads
                continue
            got = self._take(line)
            if isinstance(got, dict):
                return got
            if got is not None:
                time.sleep(got)
        return None

    def _line(self) -> bytes | None:
        sock = self.sock
        while b"\n" not in self.buf:
            try:
                chunk = sock.recv(1 << 16) if sock is not None else b""
            except OSError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class AsyncSubscription(_SubscriptionState):
    """Subscription for AsyncQueueClient: `async for m in client.subscribe(queue, credit)`."""

    def __init__(self, client: Any, queues: str | Iterable[str], credit: int) -> None:
        super().__init__(client, queues, credit)
        self.reader: Any = None
        self.writer: Any = None

    async def __aiter__(self) -> AsyncIterator[Message]:
        settle: tuple[str, int] | None = None
        while not self.closed:
            if settle is not None:
                await self._send(_confirm(*settle))
                settle = None
            push = await self._next_push()
            if push is None:
                return
            m = message(push)
            settle = self._settle(m)
            yield m

    async def credit(self, credit: int) -> None:
        """Change the credit (0 stops the flow until it is raised again)."""
        self._credit = credit
        if self.writer is not None:
            for req in self._requests():
                await self._send(req)

    async def confirm(self, m: Message) -> None:
        """Confirm a pushed message on the subscription's own connection."""
        await self._send(_confirm(m.queue, m.msg_id))

    async def close(self) -> None:
        """End the subscription (leased messages not confirmed come back after their lease)."""
        self.closed = True
        self._drop()

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _send(self, req: dict) -> None:
        try:
            self.writer.write(p.encode(req))
            await self.writer.drain()
        except (OSError, AttributeError):
            self._drop()

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def _open(self) -> None:
        reconnect = self._reconnect()
        while True:
            try:
                host, port = self._leader_address(await self.client.leader(self.queues[0]))
                self.reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=1 << 24, ssl=self.client._ssl,
                                            server_hostname=host if self.client._ssl is not None else None),
                    self.client.timeout)
                for req in self._requests():
                    await self._send(req)
                if self.writer is None:
                    raise ConnectionError("connection lost while subscribing")
                return
            except (OSError, QueueError, asyncio.TimeoutError) as exc:
                self._drop()
                pause = reconnect.failed(time.monotonic(), exc)
                if isinstance(pause, QueueError):
                    raise pause from None
                await asyncio.sleep(pause)

    async def _next_push(self) -> dict | None:
        while not self.closed:
            if self.reader is None:
                await self._open()
            for req in self._take_resends():
                await self._send(req)
            try:
                line = await self.reader.readline()
            except (OSError, ValueError, AttributeError):
                line = b""
            if not line:
                self._drop()
                continue
            got = self._take(line)
            if isinstance(got, dict):
                return got
            if got is not None:
                await asyncio.sleep(got)
        return None
