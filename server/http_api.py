"""The node's HTTP API and status page (config `http_port`, docs/http.md), served by aiohttp on
the acceptor's own event loop.

Each HTTP request becomes the JSON protocol request of its route (server/http_routes.py) and
enters the acceptor exactly where a TCP request does (`Acceptor.submit`), as one request of a
connection of its own: so routing, forwarding to the leader, redirects, long polls, validation and
the reply are the TCP protocol's. Auth is the same token, as `Authorization: Bearer`.
"""
from __future__ import annotations

import asyncio
import os
import ssl
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import orjson
from aiohttp import web

from queue_server.protocol import limits
from queue_server.protocol import vocabulary as p
from queue_server.protocol import replies
from queue_server.server.http_openapi import openapi
from queue_server.server.http_routes import (AUTH_MISSING, ROUTES, TOO_LARGE, Route, bearer, build,
                                             cluster_view, leader_headers, leader_http, status_of)
from queue_server.server.metrics import count_limit
from queue_server.server.metrics_http import readiness
from queue_server.protocol.origin import Origin

if TYPE_CHECKING:
    from queue_server.server.acceptor import Acceptor

STATIC = os.path.join(os.path.dirname(__file__), "static")
JSON = "application/json"
# Paths served without a token: the page and its files carry no queue data, only the API does.
OPEN = ("/", "/v1/openapi.json", "/healthz", "/readyz")
# Answered even on a connection past max_connections: a saturated node is still alive and says so.
HEALTH = ("/healthz", "/readyz")
# Seconds a connection past max_connections may take to send the request that is told why.
OVER_LIMIT_GRACE = 2.0


def json_response(value: Any, status: int = 200) -> web.Response:
    """`value` as a JSON response body (one line, as the protocol's replies)."""
    return web.Response(body=orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE), status=status, content_type=JSON)


class Exchange:
    """One HTTP request in flight, registered with the acceptor as a connection of its own so that
    the reply finds its way back (Acceptor.deliver -> put)."""

    def __init__(self, acceptor: "Acceptor", long_poll: bool) -> None:
        self.reply: asyncio.Future = acceptor.loop.create_future()
        self.out: list = []
        self.waiting: dict = {}
        self.long_polls = long_poll  # the workers must hear if it goes away
        self.conn_id = acceptor.register(self)  # type: ignore[arg-type]
        self.origin = Origin(self.conn_id)

    def put(self, req_no: int, data: Any) -> bool:
        if not self.reply.done():
            self.reply.set_result(data)
        return False  # nothing to flush

    def flush(self) -> None:
        pass

    def finish(self) -> None:
        pass  # draining: the reply still comes (the workers answer long polls at once)


class HttpApi:
    """The aiohttp application of one acceptor."""

    def __init__(self, acceptor: "Acceptor") -> None:
        self.acceptor = acceptor
        self.node_id = acceptor.config.node_id
        self.members = [n.node_id for n in acceptor.config.cluster_node_list]
        self.spec = orjson.dumps(openapi(ROUTES), option=orjson.OPT_INDENT_2)
        self.over_limit: set = set()  # connections past max_connections (aiohttp RequestHandlers)
        app = web.Application(client_max_size=acceptor.config.max_request_size,
                              middlewares=[self.count, self.errors, self.connection_limit, self.authenticate])
        for route in ROUTES:
            app.router.add_route(route.method, route.path, self.handler(route))
        app.router.add_get("/v1/cluster", self.cluster)
        app.router.add_get("/v1/openapi.json", self.openapi)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/", self.index)
        app.router.add_static("/static/", STATIC)
        self.app = app

    # ----------------------------------------------------------------- the way in
    async def call(self, request: dict) -> bytes:
        """Send one protocol request through the acceptor; its encoded reply."""
        long_poll = bool(request.get("wait"))
        exchange = Exchange(self.acceptor, long_poll)
        try:
            self.acceptor.submit(exchange.origin, 0, request)
            return await exchange.reply
        finally:
            # A client that went away while waiting: the workers drop its long poll, and a reply
            # that still comes finds no connection and gives its messages back.
            self.acceptor.unregister(exchange)  # type: ignore[arg-type]

    def respond(self, request: web.Request, data: bytes, ok: int = 200) -> web.Response:
        """The protocol reply as the response body, with the status it calls for."""
        reply = replies.decoded(data)
        transport = request.transport
        if transport is None or transport.is_closing():
            self.acceptor.undeliver(data)  # a consume's messages go back
        http = leader_http(reply, self.acceptor.http_ports)
        if http is not None:
            reply["leader_http"] = http
            data = orjson.dumps(reply, option=orjson.OPT_APPEND_NEWLINE)
        return web.Response(body=data, status=status_of(reply, ok), headers=leader_headers(reply, http),
                            content_type=JSON)

    def refuse(self, status: int, named: dict | None, reason: str) -> web.Response:
        """An error made here, in the protocol's form."""
        return json_response(p.error_reply(named, reason, self.node_id), status)

    def handler(self, route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read() if request.can_read_body else b""
            value = build(route, request.match_info, request.query, body)
            if type(value) is str:
                return self.refuse(400, {"action": route.action, **request.match_info}, value)
            return self.respond(request, await self.call(value), route.ok)
        return handle

    # ----------------------------------------------------------------- middlewares
    @web.middleware
    async def count(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """Count every HTTP request as HTTP's (received_requests_total{transport="http"}, never
        TCP's) and its answer by status (http_requests_total)."""
        self.acceptor.http_requests += 1
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self.acceptor.metrics.http_answered(exc.status)
            raise
        self.acceptor.metrics.http_answered(response.status)
        return response

    @web.middleware
    async def errors(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """Unknown routes, wrong methods and oversized bodies answer in the protocol's form."""
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return self.refuse(413, None, f"{TOO_LARGE} ({self.acceptor.config.max_request_size} bytes)")
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            response = self.refuse(exc.status, None, f"route: no {request.method} {request.path}; it takes {allowed}")
            response.headers["Allow"] = allowed  # a 405 must list them (RFC 9110, 15.5.6)
            return response
        except web.HTTPNotFound as exc:
            return self.refuse(exc.status, None,
                               f"route: no {request.method} {request.path} (GET /v1/openapi.json lists the routes)")

    @web.middleware
    async def connection_limit(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """On a connection past max_connections, every request but a health check gets 503 with
        the reason, and the connection closes."""
        if request.protocol not in self.over_limit or request.path in HEALTH:
            return await handler(request)
        response = self.refuse(503, None, limits.too_many_connections(self.acceptor.config.max_connections))
        response.force_close()
        return response

    # ----------------------------------------------------------------- connections
    def count_connections(self, server: web.Server) -> None:
        """Count the server's connections in the acceptor's budget (max_connections is shared
        with the client TCP port). A connection past it is kept only to answer its first
        request with the reason, for at most OVER_LIMIT_GRACE seconds."""
        acceptor = self.acceptor
        made, lost = server.connection_made, server.connection_lost
        over_limit = self.over_limit

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            acceptor.http_connections += 1
            acceptor.http_opened += 1
            limit = acceptor.config.max_connections
            if limits.over_connection_limit(acceptor.open_connections(), limit):
                count_limit(acceptor.metrics.limits, limits.MAX_CONNECTIONS)
                over_limit.add(handler)
                acceptor.loop.call_later(OVER_LIMIT_GRACE, handler.force_close)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            acceptor.http_connections -= 1
            over_limit.discard(handler)
            lost(handler, exc)

        # aiohttp calls these once per connection (web.Server's connection_made/_lost)
        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    @web.middleware
    async def authenticate(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """With auth_token_file set, every API route needs `Authorization: Bearer <token>`: 401
        without one, 403 for a wrong one (and while the address is throttled)."""
        auth = self.acceptor.auth
        if not auth.required or request.path in OPEN or request.path.startswith("/static/"):
            return await handler(request)
        token = bearer(request.headers.get("Authorization"))
        if token is None:
            auth.failed_total += 1
            return self.refuse(401, None, AUTH_MISSING)
        reason = auth.attempt(request.remote, token, time.monotonic())
        if reason is not None:
            return self.refuse(403, None, reason)
        return await handler(request)

    # ----------------------------------------------------------------- other routes
    async def cluster(self, request: web.Request) -> web.Response:
        """Every node's role, vote_id, trans_id and lag, as this node and the leader know them."""
        local, leader = await asyncio.gather(self.call({"action": p.LOCAL_MONITOR}), self.call({"action": p.MONITOR}))
        view = cluster_view(replies.decoded(local), replies.decoded(leader), self.members)
        return json_response(view)

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=self.spec, content_type=JSON)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"healthy":true}\n', content_type=JSON)

    async def readyz(self, request: web.Request) -> web.Response:
        status, body = readiness(self.acceptor.role)
        return json_response(body, status)

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(os.path.join(STATIC, "index.html"))


async def start(acceptor: "Acceptor", ssl_context: "ssl.SSLContext | None" = None) -> web.AppRunner:
    """Serve the API on the acceptor's host and `http_port` (HTTPS with the client port's TLS
    context when it has one); returns the runner (cleanup() stops)."""
    cfg = acceptor.config
    api = HttpApi(acceptor)
    # idle_timeout: aiohttp closes a connection waiting that long for its next request (never
    # one whose request is in progress, such as a long poll); 0 keeps aiohttp's own default.
    idle = {"keepalive_timeout": float(cfg.idle_timeout)} if cfg.idle_timeout > 0 else {}
    runner = web.AppRunner(api.app, handler_cancellation=True, access_log=None, **idle)
    await runner.setup()
    assert runner.server is not None
    api.count_connections(runner.server)
    await web.TCPSite(runner, cfg.host, cfg.http_port, backlog=1024, reuse_address=True,
                      ssl_context=ssl_context).start()
    return runner


async def stop_accepting(runner: web.AppRunner) -> None:
    """Draining: take no new HTTP connections; requests in flight are answered (each is a
    connection of the acceptor's, which the drain waits for)."""
    for site in list(runner.sites):
        await site.stop()
