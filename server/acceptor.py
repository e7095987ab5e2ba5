"""The acceptor process: the node's TCP and UDP front door. It splits streams into requests, routes
each to the worker owning its queue (batched per event-loop turn, one ZeroMQ message per worker),
and writes the replies that come back to the right connection, in request order."""
from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from typing import Any

import orjson
import uvloop
import zmq

from queue_server.config.loader import NodeConfig
from queue_server.server import ipc, tls, udp_guard
from queue_server.protocol import ipc_frames, limits, replies
from queue_server.protocol import vocabulary as p
from queue_server.server.auth import AUTH_REQUIRED, Authenticator, read_token_file
from queue_server.server.child import start
from queue_server.server.dispatch import TO_COORDINATOR, Dispatch, ReplyOrder
from queue_server.server.http_routes import url
from queue_server.protocol.framing import TOO_DEEP, FrameDecoder, FramingError, too_deep
from queue_server.protocol.origin import Origin
from queue_server.server.metrics import AcceptorMetrics, FOLD_INTERVAL, count_limit
from queue_server.server.reply_counts import count_one
from queue_server.server.preflight import is_loopback
from queue_server.server.router import Router

_DUMPS = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
_LOADS = orjson.loads
# Most messages on_inbox takes from the inbox in one loop turn before it lets the loop run on.
MAX_DRAIN = 512
UDP_TOO_LARGE = "response too large for UDP, use TCP"
_TOO_LARGE = UDP_TOO_LARGE.encode()
_SUBSCRIBE = (p.SUBSCRIBE, "subscribe")
_AUTH = (p.AUTH, "auth")
_NOT_AN_OBJECT = object()  # the action of a request that is not a JSON object
LINGER = 2.0  # seconds a closing connection's late input is read and dropped (see Connection._close)


class Connection(ReplyOrder, asyncio.Protocol):
    """One client TCP connection: a frame decoder in, replies out in request order (ReplyOrder)."""

    def __init__(self, acceptor: "Acceptor") -> None:
        ReplyOrder.__init__(self)
        self.acceptor = acceptor
        self.decoder = FrameDecoder(acceptor.config.max_request_size)
        self.conn_id = 0
        self.origin = Origin(0)
        self.transport: asyncio.Transport | None = None
        self.next_no = 0  # req_no of the next request read
        self.close_after: int | None = None
        self.read_paused = False
        self.write_paused = False
        self.long_polls = False
        self.authed = not acceptor.auth.required
        self.peer: Any = None
        self.peer_eof = False  # the client shut its write side
        self.subscribed = False
        self.last_read = acceptor.loop.time()
        self.high_water = acceptor.config.max_pending_requests
        self.low_water = self.high_water // 4
        self.lingering = False  # replies all sent, FIN sent; input read and dropped until close

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.conn_id = self.acceptor.register(self)
        self.origin = Origin(self.conn_id)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else peer
        self.acceptor.tcp_connections += 1
        self.acceptor.tcp_opened += 1
        limit = self.acceptor.config.max_connections
        if limits.over_connection_limit(self.acceptor.open_connections(), limit):
            count_limit(self.acceptor.metrics.limits, limits.MAX_CONNECTIONS)
            transport.write(_DUMPS(p.error_reply(None, limits.too_many_connections(limit),
                                                 self.acceptor.config.node_id), option=_NEWLINE))
            self.close_after = -1
            self._close(transport)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # after the last reply: dropped, so that closing does not reset the connection
        self.last_read = self.acceptor.loop.time()
        self._submit(self.decoder.feed(data))
        if self.decoder.closed:
            self.close_after = self.next_no - 1
            self._pause()
        elif self.next_no - self.next_out >= self.high_water:
            # Back-pressure: the client waits for replies before the node reads more of it.
            count_limit(self.acceptor.metrics.limits, limits.MAX_PENDING_REQUESTS)
            self._pause()

    def eof_received(self) -> bool:
        """The client shut its write side (a half-close): answer every request it sent, in
        order, then close. Returns True: the transport stays open for those replies."""
        self.peer_eof = True
        if self.lingering:
            return False  # the client saw our FIN and closed: done
        self._submit(self.decoder.finish())  # a request the stream ended without a newline
        if self.close_after is None:
            self.close_after = self.next_no - 1
        self.flush()  # closes at once when nothing is owed
        return True

    def _close(self, transport: asyncio.Transport) -> None:
        """Close once every reply is written. Closing a socket with unread input makes the
        kernel answer with a reset, which can destroy replies the client has not read yet (the
        one saying why it is closed): unless the client has already shut its side, send FIN
        after the replies and drop what still comes in, for at most LINGER seconds."""
        if self.peer_eof or not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        transport.write_eof()
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()
        self.acceptor.loop.call_later(LINGER, transport.close)

    def finish(self) -> None:
        """The node is shutting down: read nothing more, answer what was read, then close."""
        if self.close_after is None:
            self.close_after = self.next_no - 1
        self._pause()
        self.flush()  # closes at once when nothing is owed

    def _submit(self, items: list[tuple[object, bytes]]) -> None:
        """Number the decoded requests and hand them to the acceptor."""
        submit = self.acceptor.submit
        origin = self.origin
        for value, _raw in items:
            if self.close_after is not None and self.close_after < self.next_no:
                return  # refused (authentication): nothing after it is read
            req_no = self.next_no
            self.next_no = req_no + 1
            action = value.get("action") if type(value) is dict else _NOT_AN_OBJECT
            if not self.authed or action in _AUTH:
                self._authenticate(req_no, value)
                continue
            if action in _SUBSCRIBE or (action is not _NOT_AN_OBJECT and value.get("wait")):
                self.long_polls = True  # the workers must hear when it closes
                self.subscribed = self.subscribed or action in _SUBSCRIBE
            submit(origin, req_no, value)

    def _authenticate(self, req_no: int, value: Any) -> None:
        """Answer an auth request (or a request that came before one); on failure the
        connection closes once that answer is written."""
        acceptor = self.acceptor
        named = {k: v for k, v in value.items() if k != "token"} if type(value) is dict else None
        if named is None or value.get("action") not in _AUTH:
            acceptor.auth.failed_total += 1
            reason: str | None = AUTH_REQUIRED
        else:
            reason = acceptor.auth.attempt(self.peer, value.get("token"), time.monotonic())
        if reason is None:
            self.authed = True
            reply = p.echo(named)
            reply.update(code=p.CODE_OK, node_id=acceptor.config.node_id)
            acceptor.reply(self.origin, req_no, reply)
            return
        self.authed = False
        self.close_after = req_no
        self._pause()
        acceptor.reply(self.origin, req_no, p.error_reply(named, reason, acceptor.config.node_id))

    def connection_lost(self, exc: Exception | None) -> None:
        self.acceptor.tcp_connections -= 1
        self.acceptor.unregister(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._maybe_resume()

    def _pause(self) -> None:
        if not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def _maybe_resume(self) -> None:
        if (
            self.read_paused
            and not self.write_paused
            and self.close_after is None
            and self.next_no - self.next_out <= self.low_water
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self.read_paused = False
            self.transport.resume_reading()

    def flush(self) -> None:
        """Write what is queued, then close if the connection is ending (framing lost, or the
        client half-closed) and all is answered."""
        transport = self.transport
        if self.out and transport is not None and not transport.is_closing():
            # (a closing transport would drop them: they stay queued, and are given back when
            # the connection is lost)
            out = self.out
            transport.write(out[0] if len(out) == 1 else b"".join(out))  # one reply: as it came
            out.clear()
        if self.close_after is not None and self.next_out > self.close_after:
            if transport is not None and not self.lingering:
                self._close(transport)
        elif self.read_paused:
            self._maybe_resume()


class Datagrams(asyncio.DatagramProtocol):
    """The UDP endpoint: one request per datagram."""

    def __init__(self, acceptor: "Acceptor") -> None:
        self.acceptor = acceptor

    def datagram_received(self, data: bytes, addr: Any) -> None:  # type: ignore[override]
        acceptor = self.acceptor
        cfg = acceptor.config
        limit = udp_guard.reply_limit(len(data), cfg.udp_max_response, cfg.udp_amplification_limit,
                                      acceptor.udp_guarded, acceptor.auth.required)
        number = acceptor.udp_register(addr, limit)
        if len(data) > acceptor.config.max_request_size:
            value: Any = FramingError(f"request exceeds max_request_size ({acceptor.config.max_request_size} bytes)", False)
        else:
            try:
                value = _LOADS(data)
            except orjson.JSONDecodeError as exc:
                reason = "invalid UTF-8" if "UTF-8" in str(exc) else f"malformed JSON: {exc}"
                value = FramingError(reason, False)
            else:
                if too_deep(value, data):
                    value = FramingError(TOO_DEEP, False)
        if not acceptor.auth.datagram(value):
            acceptor.udp_addrs.pop(number, None)
            return  # no valid auth_token: no reply at all
        if type(value) is dict:
            value[p.UDP_REPLY_LIMIT] = limit  # the worker refuses a consume whose reply would not fit
        acceptor.submit(Origin(number, True), 0, value)


class Acceptor(Dispatch):
    """Routes requests to workers (Dispatch decides where) and replies to clients."""

    def __init__(self, config: NodeConfig, ctx: zmq.Context, run_dir: str, log, loop: asyncio.AbstractEventLoop) -> None:
        router = Router(config.workers, [(v.name, v.queue_list) for v in config.virtual_queue_list],
                        config.dead_letter_suffix, groups=config.queue_groups)
        Dispatch.__init__(self, router, config.node_id, config.forward_request, {
            "leader_node_id": config.node_id,
            "leader_host": config.host,
            "leader_port": config.port,
        }, config.placement())
        self.config = config
        self.log = log
        self.loop = loop
        self.auth = Authenticator(read_token_file(config.auth_token_file) if config.auth_token_file else None)
        self.workers = [ipc.outbox(ctx, run_dir, ipc.worker_name(i)) for i in range(config.workers)]
        self.inbox = ipc.inbox(ctx, run_dir, "acceptor")
        self.inbox_poller = ipc.poller_of(self.inbox)
        self.coordinator = ipc.outbox(ctx, run_dir, "coordinator")
        self.ready = asyncio.Event()
        self.flush_requests_scheduled = False
        self.dirty: list[Connection] = []
        self.flush_output_scheduled = False
        self.conns: dict[int, Connection] = {}  # TCP connections, and HTTP requests in flight (http_api.Exchange)
        self.next_conn = 1
        self.tcp_connections = 0  # open client TCP connections
        self.tcp_opened = 0  # client TCP connections accepted
        self.http_connections = 0  # open HTTP connections (server/http_api.py counts them, and the next two)
        self.http_opened = 0  # HTTP connections accepted
        self.http_requests = 0  # HTTP requests read
        self.udp_addrs: dict[int, tuple[Any, int]] = {}  # datagram -> (sender, largest reply)
        self.udp_guarded = config.udp_amplification_limit > 0 and not is_loopback(config.host)
        self.next_udp = 0
        self.udp_transport: asyncio.DatagramTransport | None = None
        self.metrics = AcceptorMetrics()
        self.closed_requests = 0  # requests read on TCP connections since closed
        self.server: asyncio.AbstractServer | None = None
        self.http: Any = None  # the HTTP API's runner (server/http_api.py), with http_port set
        self.serving: asyncio.Task | None = None  # serve(), cancelled to stop
        self.draining: asyncio.Task | None = None
        self.drained = asyncio.Event()  # set when the last connection closes while draining

    # ----------------------------------------------------------------- connections
    def register(self, conn: Connection) -> int:
        conn_id = self.next_conn
        self.next_conn += 1
        self.conns[conn_id] = conn
        return conn_id

    def unregister(self, conn: Connection) -> None:
        """Forget a lost connection. Replies it was still owed and had not been written (held
        behind an earlier one, e.g. a long poll) cannot be delivered: they are undelivered."""
        self.conns.pop(conn.conn_id, None)
        if self.draining is not None and not self.conns:
            self.drained.set()
        for data in conn.out:
            self.undeliver(data)
        for data in conn.waiting.values():
            self.undeliver(data)
        conn.out.clear()
        conn.waiting.clear()
        if type(conn) is Connection:  # an HTTP request (http_api.Exchange) counts as HTTP's
            self.closed_requests += conn.next_no
        self.metrics.drop_probe(conn.conn_id)
        if self.polls or self.ended:
            self.forget(conn.conn_id)
        if conn.long_polls:
            message = ipc_frames.close_frames(conn.conn_id)
            for sock in self.workers:
                sock.send_multipart(message, zmq.NOBLOCK)

    def open_connections(self) -> int:
        """The connections max_connections bounds: client TCP and HTTP, one budget."""
        return self.tcp_connections + self.http_connections

    def udp_register(self, addr: Any, limit: int | None = None) -> int:
        """Number a datagram; its reply goes to `addr` and may be at most `limit` bytes
        (default udp_max_response; the amplification guard may set less)."""
        number = self.next_udp
        self.next_udp = number + 1
        self.udp_addrs[number] = (addr, self.config.udp_max_response if limit is None else limit)
        return number

    # ----------------------------------------------------------------- requests (Dispatch decides)
    def schedule_requests(self) -> None:
        if not self.flush_requests_scheduled:
            self.flush_requests_scheduled = True
            self.loop.call_soon(self.flush_requests)

    def send(self, index: int, frames: list[bytes]) -> None:
        (self.coordinator if index == TO_COORDINATOR else self.workers[index]).send_multipart(frames, zmq.NOBLOCK)

    def flush_requests(self) -> None:
        """Send the requests gathered during this loop turn: one message per worker."""
        self.flush_requests_scheduled = False
        if self.metrics.probe_no < 0:
            first = next((items[0] for items in self.pending if items), None)
            if first is not None:
                self.metrics.start_probe(first)
        Dispatch.flush_requests(self)

    # ----------------------------------------------------------------- replies
    def reply(self, origin: Origin, req_no: int, reply: dict) -> None:
        """Answer a request from the acceptor itself."""
        count_one(self.metrics.counts, reply)
        self.deliver(origin, req_no, _DUMPS(reply, option=_NEWLINE))
        self.schedule_output()

    def deliver(self, origin: Origin, req_no: int, data: Any) -> None:
        """Hand one encoded reply to its connection (or UDP address). A consume reply that
        cannot be delivered gives its messages back (undeliver)."""
        if origin.udp:
            sender = self.udp_addrs.pop(origin.conn, None)
            if sender is None or self.udp_transport is None:
                self.undeliver(data)
                return
            addr, limit = sender
            if len(data) > limit:
                # Last resort: the worker refuses a consume whose reply would not fit before
                # taking anything, so this fires only for replies it could not foresee. A
                # consume's messages are given back, not lost with the reply.
                reply = replies.decoded(data)
                self._give_back(reply)
                data = _DUMPS(p.error_reply(replies.naming(reply), UDP_TOO_LARGE, self.config.node_id), option=_NEWLINE)
            if limit < self.config.udp_max_response and (len(data) > limit or _TOO_LARGE in bytes(data)):
                count_limit(self.metrics.limits, limits.UDP_AMPLIFICATION_LIMIT)
                if len(data) > limit:
                    return  # even the refusal is larger than the guard allows: no reply
            self.udp_transport.sendto(data, addr)
            return
        conn = self.conns.get(origin.conn)
        if conn is None or ((self.polls or self.ended) and not self.owed(origin, req_no)):
            self.undeliver(data)
        elif req_no == p.PUSH_REQ_NO:  # a subscription's push: out at once, between replies
            conn.out.append(data)
            self.dirty.append(conn)
        elif conn.put(req_no, data):
            self.dirty.append(conn)

    def undeliver(self, data: Any) -> None:
        """A consume reply that cannot be delivered: have its messages given back."""
        self._give_back(replies.decoded(data))

    def _give_back(self, reply: Any) -> None:
        """If `reply` is a successful consume reply, have its messages given back (leases
        released, at-most-once messages restored) by the leader: the coordinator knows which
        node that is (ClusterNode.on_undelivered)."""
        given = p.delivered(reply)
        if given is not None:
            self.coordinator.send_multipart(ipc_frames.undeliver_frames(*given), zmq.NOBLOCK)

    def schedule_output(self) -> None:
        if not self.flush_output_scheduled:
            self.flush_output_scheduled = True
            self.loop.call_soon(self.flush_output)

    def flush_output(self) -> None:
        """Write every connection's queued replies in one write each."""
        self.flush_output_scheduled = False
        dirty = self.dirty
        if dirty:
            self.dirty = []
            for conn in dirty:
                conn.flush()

    def on_inbox(self) -> None:
        """Drain reply batches (from the coordinator, and from the workers for the replies that
        skip it) and status messages (from the coordinator), then write each connection's
        replies (one write per connection per wake)."""
        metrics = self.metrics
        received = 0
        for frames in ipc.drain(self.inbox, self.inbox_poller, MAX_DRAIN):
            received += 1
            if frames[0] == ipc_frames.REP:
                for header, blob in ipc_frames.read_rep(frames):
                    self._deliver_batch(header, memoryview(blob), metrics.probe_no)
            elif frames[0] == ipc_frames.STATUS:
                self.on_status(ipc_frames.read_status(frames))
                self.ready.set()
        if received == MAX_DRAIN:
            self.loop.call_soon(self.on_inbox)  # more may be waiting: the fd is edge-triggered
        self.flush_output()

    def _deliver_batch(self, header: bytes, blob: memoryview, probe_no: int) -> None:
        """deliver each reply of a batch (a header and its blob: protocol/replies.py). A reply to
        one of this node's TCP connections (or HTTP requests), owed, takes the short way: no
        Origin, no call of deliver per reply."""
        conns = self.conns
        dirty = self.dirty
        slow = self.polls or self.ended
        probe_conn = self.metrics.probe_conn
        start = 0
        for conn_id, udp, node, req_no, end in replies.rows(header):
            data = blob[start:end]
            start = end
            if udp or slow or req_no < 0:
                self.deliver(Origin(conn_id, udp, node), req_no, data)
            else:
                conn = conns.get(conn_id)
                if conn is None:
                    self.undeliver(data)
                elif conn.put(req_no, data):
                    dirty.append(conn)
            if req_no == probe_no and conn_id == probe_conn:
                self.metrics.end_probe(conn_id)

    def close_idle(self) -> None:
        """Close the connections silent for idle_timeout with nothing pending; repeats."""
        timeout = self.config.idle_timeout
        now = self.loop.time()
        # (HTTP connections: aiohttp's keepalive_timeout, server/http_api.py)
        for conn_id in limits.idle(((c.conn_id, c.last_read, c.subscribed or c.next_out < c.next_no)
                                    for c in self.conns.values() if type(c) is Connection and c.close_after is None),
                                   now, timeout):
            conn = self.conns[conn_id]
            count_limit(self.metrics.limits, limits.IDLE_TIMEOUT)
            conn.finish()
        self.loop.call_later(min(timeout / 4, 5.0), self.close_idle)

    def fold_metrics(self) -> None:
        """Publish the metrics counted since the last call; repeats every FOLD_INTERVAL."""
        tcp_requests = self.closed_requests + sum(c.next_no for c in self.conns.values() if type(c) is Connection)
        self.metrics.fold(self.tcp_connections, tcp_requests, self.next_udp, self.tcp_opened,
                          self.auth.failed_total, self.auth.throttled_total, self.http_connections,
                          self.http_requests, self.http_opened)
        self.loop.call_later(FOLD_INTERVAL, self.fold_metrics)

    # ----------------------------------------------------------------- stop
    def begin_drain(self) -> None:
        """SIGTERM: stop accepting connections, have the workers answer every long poll now
        (empty), let each connection receive what it is owed and close, then stop; after
        shutdown_grace at the latest. A second SIGTERM stops at once."""
        if self.draining is not None:
            self.log.info("second SIGTERM: stopping at once")
            if self.serving is not None:
                self.serving.cancel()
            return
        self.draining = self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        grace = self.config.shutdown_grace
        self.log.info("SIGTERM: no new connections; answering the %d open ones (up to %g s)",
                      len(self.conns), grace)
        if self.server is not None:
            self.server.close()
        if self.http is not None:
            from queue_server.server import http_api
            await http_api.stop_accepting(self.http)
        for sock in self.workers:
            sock.send_multipart(ipc_frames.DRAIN_FRAMES, zmq.NOBLOCK)
        self.end_forwarded_polls()
        self.schedule_output()
        for conn in list(self.conns.values()):
            conn.finish()
        if self.conns:
            try:
                await asyncio.wait_for(self.drained.wait(), grace)
            except asyncio.TimeoutError:
                self.log.warning("%d connections still owed replies after %g s: closing them (%s)",
                                 len(self.conns), grace, "; ".join(self._owing(c) for c in self.conns.values()))
        self.log.info("drained")
        if self.serving is not None:
            self.serving.cancel()

    def _owing(self, conn: Any) -> str:
        """What a connection is still owed, for the log: the request whose reply holds up the
        rest, and how many requests and replies stand behind it."""
        if type(conn) is not Connection:
            return f"HTTP request {conn.conn_id}"
        return (f"connection {conn.conn_id} from {conn.peer}: request #{conn.next_out} of {conn.next_no} "
                f"unanswered, {len(conn.waiting)} replies behind it, last read "
                f"{self.loop.time() - conn.last_read:.1f} s ago")

    # ----------------------------------------------------------------- start
    async def serve(self) -> None:
        """Listen on TCP and UDP at the configured host:port, then serve forever."""
        cfg = self.config
        loop = self.loop
        loop.add_reader(self.inbox.getsockopt(zmq.FD), self.on_inbox)
        self.on_inbox()
        # Clients are let in once the coordinator has recovered and said who leads, so that no
        # request reaches a worker before the stored queues are back.
        await self.ready.wait()
        ssl_context = tls.server_context(cfg)
        if cfg.http_port:  # before the client port: a node that takes TCP connections serves HTTP
            from queue_server.server import http_api  # aiohttp is loaded only when HTTP is on
            self.http = await http_api.start(self, ssl_context)
            scheme = "https" if ssl_context else "http"
            self.log.info("status page and HTTP API: %s/", url(cfg.host, cfg.http_port, scheme))
        server = await loop.create_server(
            lambda: Connection(self), cfg.host, cfg.port, backlog=1024, reuse_address=True, ssl=ssl_context,
            ssl_handshake_timeout=tls.HANDSHAKE_TIMEOUT if ssl_context is not None else None,
            # A closing TLS connection waits this long for the client's close_notify.
            ssl_shutdown_timeout=LINGER if ssl_context is not None else None)
        self.server = server
        port = server.sockets[0].getsockname()[1]
        self.udp_transport, _ = await loop.create_datagram_endpoint(
            lambda: Datagrams(self), local_addr=(cfg.host, port), family=socket.AF_INET
        )
        self.fold_metrics()
        if cfg.idle_timeout:
            self.close_idle()
        self.log.info("listening on %s+udp %s:%d", "tls" if ssl_context is not None else "tcp", cfg.host, port)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the acceptor process."""
    info = start("acceptor", argv)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    ctx = zmq.Context()
    acceptor = Acceptor(info.config, ctx, info.run_dir, info.log, loop)
    # SystemExit raised by a signal handler inside a uvloop callback would be logged and
    # swallowed, leaving an orphan holding the port: stop the loop instead.
    serving = acceptor.serving = loop.create_task(acceptor.serve())
    loop.add_signal_handler(signal.SIGTERM, acceptor.begin_drain)
    try:
        loop.run_until_complete(serving)
    except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
        pass
    finally:
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main(sys.argv[1:])
