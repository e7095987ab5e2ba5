"""The asyncio client: pipelined requests on one TCP connection (and, with queue groups, one to
each group leader it goes to straight), or UDP datagrams matched by seq."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from . import linger as linger_
from . import protocol as p
from . import tls as tls_
from .aio_conn import Conn, Udp, exchange
from .calls import AsyncActions
from .credentials import TokenOption
from .errors import ConnectTimeout, QueueError
from .failover import DONE, NEXT, Drop, Failover, Lost
from .group_leaders import GroupLeaders, LeaderLookup
from .protocol import Address
from .settings import ClientSettings
from .subscribe import AsyncSubscription


def _waiting(fut: asyncio.Future[Any]) -> bool:
    """Whether a caller still waits for its reply (not cancelled, not timed out)."""
    return not fut.done()


# The most connections kept open to group leaders (queue groups), the least recently used closed first.
MAX_DIRECT_CONNECTIONS = 16
# The epoch of a connection to a group's leader: it serves that leader, whatever the route does.
DIRECT_EPOCH = -1


class _Moved(Exception):
    """Another call switched hosts while this one was connecting: start over on the new host."""


class AsyncQueueClient(ClientSettings, AsyncActions):
    """An asyncio client for one queue-server cluster; use it from one event loop.

    Concurrent calls share one TCP connection (pipelined; replies come back in request order).
    A consume with `wait` uses a connection of its own, because the server answers a
    connection's requests in order and a waiting consume would hold back everything after it.
    Fail-over, redirects and idempotent produces are as in QueueClient.

    With `linger_ms` > 0 (at most 1), produces, consumes (without wait) and confirms issued
    within that time on the same queue with the same options go out as one batch request
    (client/linger.py); every caller still gets the reply its own request would have had.
    """

    def __init__(self, hosts: str | Sequence[str | Address] = "127.0.0.1:1111", *, transport: str = "tcp",
                 timeout: float = 5.0, follow_redirects: bool = True, max_redirects: int = 3,
                 max_idle_wait_connections: int = 8, idempotent: bool = True, token: TokenOption = None,
                 tls: tls_.TlsOption = None, linger_ms: float = 0.0,
                 max_request_size: int = p.DEFAULT_MAX_REQUEST_SIZE) -> None:
        """The settings of QueueClient; max_idle_wait_connections: how many idle connections
        of consumes with `wait` are kept for the next ones; linger_ms: how long a produce,
        consume or confirm waits for others to share its request (0: off, at most 1.0; TCP only);
        max_request_size: the nodes' setting of that name, if below its default (1 MiB), so that
        a batch of linger_ms stays within it."""
        self._settle(hosts, transport, timeout, follow_redirects, max_redirects, idempotent, token, tls)
        if not 0 <= linger_ms <= linger_.MAX_LINGER * 1000:
            raise ValueError(f"linger_ms must be 0..{linger_.MAX_LINGER * 1000:g}")
        if linger_ms and self._udp:
            raise ValueError("linger_ms needs transport='tcp' (a batch may not fit a datagram)")
        if type(max_request_size) is not int or max_request_size < 1:
            raise ValueError("max_request_size must be a positive number of bytes")
        self.linger_ms = linger_ms
        self.max_request_size = max_request_size
        self._batcher: linger_.Batcher[asyncio.Future[dict[str, Any]]] | None = (
            linger_.Batcher(linger_ms / 1000, max_bytes=linger_.max_batch_bytes(max_request_size))
            if linger_ms else None)
        self._linger_timer: asyncio.TimerHandle | None = None
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self.max_idle_wait_connections = max_idle_wait_connections
        self._close_gen = 0
        self._conn: Conn | None = None
        self._wait_idle: list[Conn] = []
        self._wait_busy: set[Conn] = set()
        self._udp_ep: Udp | None = None
        self._connect_lock: asyncio.Lock | None = None
        # With queue groups: when to ask where each group's leader is, and a connection to each
        # leader a request went to straight (the last used last). Over UDP the one endpoint
        # follows the route: requests go the way any request goes.
        self._lookup = LeaderLookup(0 if self._udp else len(self.hosts))
        self._direct: dict[Address, Conn] = {}
        self._direct_locks: dict[Address, asyncio.Lock] = {}
        self._asking: asyncio.Future[None] | None = None  # the ask under way

    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "max_idle_wait_connections": self.max_idle_wait_connections,
                "linger_ms": self.linger_ms, "max_request_size": self.max_request_size}

    # ------------------------------------------------------------------ raw requests

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its reply if code is 0, else QueueError (redirects are followed).
        With linger_ms, a request that can share a batch waits up to that long for others."""
        if self._batcher is not None:
            key = linger_.batch_key(req, self._producer.producer if self._producer is not None else None)
            if key is not None:
                return await self._join(key, req)
        return await self._send(req)

    # ------------------------------------------------------------------ batches (linger_ms)

    async def _join(self, key: linger_.Key, req: dict[str, Any]) -> dict[str, Any]:
        assert self._batcher is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._launch(self._batcher.add(key, fut, req, loop.time()))
        self._arm(loop)
        return await fut

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep one timer, at the deadline of the batch that falls due first."""
        assert self._batcher is not None
        deadline = self._batcher.next_deadline()
        timer = self._linger_timer
        if timer is not None and (deadline is None or timer.when() > deadline):
            timer.cancel()
            timer = self._linger_timer = None
        if timer is None and deadline is not None:
            self._linger_timer = loop.call_at(deadline, self._linger_due, loop)

    def _linger_due(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._batcher is not None
        self._linger_timer = None
        self._launch(self._batcher.due(loop.time()))
        self._arm(loop)

    def _launch(self, batches: list[linger_.Batch[asyncio.Future[dict[str, Any]]]]) -> None:
        for batch in batches:
            batch = batch.keep(_waiting)
            if batch.callers:
                task = asyncio.ensure_future(self._send_batch(batch))
                self._batch_tasks.add(task)
                task.add_done_callback(self._batch_tasks.discard)

    async def _send_batch(self, batch: linger_.Batch[asyncio.Future[dict[str, Any]]]) -> None:
        try:
            replies = linger_.split_reply(batch, await self._send(linger_.batch_request(batch, self._producer)))
        except Exception as exc:  # QueueError, or the TypeError of a request that is not JSON
            for fut in batch.callers:
                if not fut.done():
                    fut.set_exception(exc)
            return
        orphans = []
        for fut, reply in zip(batch.callers, replies):
            if not fut.done():
                fut.set_result(reply)
            elif batch.key.action == p.CONSUME and linger_.consumed(reply):
                orphans.append(reply)
        if orphans:
            await self._rehome(batch.key, orphans)

    async def _rehome(self, key: linger_.Key, orphans: list[dict[str, Any]]) -> None:
        """Messages consumed for callers that left: to consumes still waiting for their batch,
        the rest released (ready again at once)."""
        assert self._batcher is not None
        takers = self._batcher.take(key, len(orphans), _waiting)
        for (fut, req), reply in zip(takers, orphans):
            fut.set_result(linger_.as_reply_to(req, reply))
        release = linger_.release_request(key.queue, orphans[len(takers):])
        if release is not None:
            with contextlib.suppress(QueueError):  # unreleased, the lease runs out by itself
                await self._send(release)

    def _fail_waiting_batches(self) -> None:
        if self._batcher is None:
            return
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        for batch in self._batcher.take_all():
            for fut in batch.callers:
                if not fut.done():
                    fut.set_exception(QueueError(p.CODE_ERROR, "client closed"))

    # ------------------------------------------------------------------ one request

    async def _send(self, req: dict[str, Any], patience: float | None = None) -> dict[str, Any]:
        """Send `req` as it is: its reply if code is 0, else QueueError. While the cluster is
        between two leaders, it goes round the hosts again for `patience` seconds (None: the
        client's timeout)."""
        loop = asyncio.get_running_loop()
        asking = self._asking
        if asking is None and self._lookup.due(req, self._route.groups, loop.time()):
            asking = self._asking = asyncio.ensure_future(self._ask_groups())
        if asking is not None and type(req.get("queue")) is str:  # calls made meanwhile wait for the answer too
            await asyncio.shield(asking)
        f = Failover(self._route, req, self.timeout, self.follow_redirects, self.max_redirects,
                     patience=self.timeout if patience is None else patience, now=loop.time())
        payload = None if self._udp else p.encode(req)
        gen = self._close_gen
        while True:
            attempt = f.next(loop.time())
            if isinstance(attempt, QueueError):
                raise attempt
            if type(attempt) is float:  # the cluster is between two leaders: round again
                await asyncio.sleep(attempt)
                if gen != self._close_gen:
                    raise QueueError(p.CODE_ERROR, "client closed") from None
                continue
            if attempt.drop:
                self._drop_connections(abort=attempt.drop is Drop.CLOSE)
            addr, epoch = attempt.addr, attempt.epoch
            # To its group's leader on the pipelined connection to it (a long poll has its own).
            direct = payload is not None and f.wait <= 0 and addr != self._route.address
            try:
                if payload is None:
                    reply = await self._udp_roundtrip(addr, epoch, req, f.wait)
                elif f.wait > 0:
                    reply = await self._wait_roundtrip(addr, epoch, payload, f.wait)
                elif direct:
                    reply = await self._direct_roundtrip(addr, payload)
                else:
                    reply = await self._roundtrip(addr, epoch, payload)
            except _Moved:
                continue
            except (Lost, OSError) as exc:  # TimeoutError among them
                if gen != self._close_gen:
                    raise QueueError(p.CODE_ERROR, "client closed") from None
                if direct:
                    self._drop_direct(addr)
                verdict = f.failed(attempt, exc)
            else:
                verdict = f.replied(attempt, reply)
                if verdict is DONE:
                    return reply
                if verdict is NEXT and gen != self._close_gen:
                    raise QueueError(p.CODE_ERROR, "client closed") from None
            if isinstance(verdict, QueueError):
                raise verdict

    async def _ask_groups(self) -> None:
        """Ask the cluster where each queue group's leader is (action 8 without a queue)."""
        try:
            reply = await self._send({"action": p.LEADER}, 0.0)  # once round the hosts: no wait for an election
        except (QueueError, OSError):
            self._lookup.unanswered(asyncio.get_running_loop().time())
            return
        else:
            self._route.groups = GroupLeaders.from_reply(reply, self._route.address[0])
        finally:
            self._asking = None

    async def _direct_roundtrip(self, addr: Address, payload: bytes) -> dict[str, Any]:
        """One request on the connection to a group's leader at `addr` (opened if need be)."""
        conn = self._direct.pop(addr, None)
        reused = conn is not None and not conn.closed
        if not reused:
            lock = self._direct_locks.setdefault(addr, asyncio.Lock())
            async with lock:  # one connect at a time to one leader
                conn = self._direct.pop(addr, None)
                if conn is None or conn.closed:
                    conn = await self._open(addr, DIRECT_EPOCH)
        assert conn is not None
        self._direct[addr] = conn  # the last used last
        while len(self._direct) > MAX_DIRECT_CONNECTIONS:
            self._direct.pop(next(iter(self._direct))).retire()
        return await exchange(conn, payload, self.timeout, reused)

    def _drop_direct(self, addr: Address) -> None:
        """A request straight to the leader at `addr` failed: close its connection now (calls
        waiting on it go the way any request goes)."""
        conn = self._direct.pop(addr, None)
        if conn is not None:
            conn.abort()

    def _drop_connections(self, abort: bool) -> None:
        """The route moved on: close the old host's connections now, or once their replies came."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort() if abort else conn.retire()
        for idle in self._wait_idle:
            idle.close()
        self._wait_idle.clear()
        ep, self._udp_ep = self._udp_ep, None
        if ep is not None:
            ep.close() if abort else ep.retire()

    async def _open(self, addr: Address, epoch: int) -> Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_connection(
                    lambda: Conn(loop, addr, epoch), addr[0], addr[1], ssl=self._ssl,
                    server_hostname=addr[0] if self._ssl is not None else None)
        except TimeoutError:
            raise ConnectTimeout(f"connect timed out after {self.timeout:g} s") from None
        if self.token is not None:
            try:
                p.check_auth_reply(await conn.send(p.encode(p.auth_request(self.token)), self.timeout))
            except BaseException:
                conn.close()
                raise
        return conn

    @contextlib.asynccontextmanager
    async def _connecting(self, epoch: int) -> AsyncIterator[None]:
        """One connect at a time, for the host of `epoch`; _Moved if the route moved on from it."""
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if epoch != self._route.epoch:
                raise _Moved
            yield

    async def _main_conn(self, addr: Address, epoch: int) -> tuple[Conn, bool]:
        conn = self._conn
        if conn is not None and not conn.closed and conn.epoch == epoch:
            return conn, True
        async with self._connecting(epoch):
            conn = self._conn
            if conn is not None and not conn.closed and conn.epoch == epoch:
                return conn, False
            conn = await self._open(addr, epoch)
            if epoch != self._route.epoch:
                conn.close()
                raise _Moved
            self._conn = conn
            return conn, False

    async def _roundtrip(self, addr: Address, epoch: int, payload: bytes) -> dict[str, Any]:
        conn, reused = await self._main_conn(addr, epoch)
        return await exchange(conn, payload, self.timeout, reused)

    async def _wait_roundtrip(self, addr: Address, epoch: int, payload: bytes, wait: float) -> dict[str, Any]:
        conn = None
        reused = False
        idle_conns = self._wait_idle
        for i in range(len(idle_conns) - 1, -1, -1):  # the last kept first
            idle = idle_conns[i]
            if idle.closed or idle.epoch != epoch:
                del idle_conns[i]
                idle.close()
            elif idle.addr == addr:  # (with queue groups, idle ones to several leaders)
                conn, reused = idle_conns.pop(i), True
                break
        if conn is None:
            conn = await self._open(addr, epoch)
        self._wait_busy.add(conn)
        try:
            return await exchange(conn, payload, self.timeout + wait, reused)
        finally:
            self._wait_busy.discard(conn)
            if (
                conn.closed
                or conn.pending
                or conn.epoch != self._route.epoch
                or len(self._wait_idle) >= self.max_idle_wait_connections
            ):
                conn.close()
            else:
                self._wait_idle.append(conn)

    async def _udp_endpoint(self, addr: Address, epoch: int) -> Udp:
        async with self._connecting(epoch):
            ep = self._udp_ep
            if ep is not None and not ep.closed and ep.epoch == epoch:
                return ep
            loop = asyncio.get_running_loop()
            _, ep = await loop.create_datagram_endpoint(lambda: Udp(addr, epoch), remote_addr=addr)
            self._udp_ep = ep
            return ep

    async def _udp_roundtrip(self, addr: Address, epoch: int, req: dict[str, Any], wait: float) -> dict[str, Any]:
        ep = self._udp_ep
        if ep is None or ep.closed or ep.epoch != epoch:
            ep = await self._udp_endpoint(addr, epoch)
        seq = self._next_udp_seq()
        data = p.udp_datagram(req, seq, self.token)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        ep.pending[seq] = fut
        try:
            assert ep.transport is not None
            ep.transport.sendto(data)
            async with asyncio.timeout(self.timeout + wait):
                reply = await fut
        finally:
            ep.forget(seq)
        return p.udp_reply(reply, req)

    async def close(self) -> None:
        """Close every connection; calls still waiting fail with QueueError("client closed")."""
        self._close_gen += 1
        self._fail_waiting_batches()
        self._route.renew()
        self._drop_connections(abort=True)
        for conn in self._direct.values():
            conn.abort()
        self._direct.clear()
        for conn in list(self._wait_busy):
            conn.abort()
        self._wait_busy.clear()

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def subscribe(self, queues: str | list[str], credit: int = 100) -> AsyncSubscription:
        """An AsyncSubscription: `async for m in client.subscribe(queues, credit)`."""
        return AsyncSubscription(self, queues, credit)
