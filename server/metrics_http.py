"""The node's HTTP endpoint on ``metrics_port``, served by the supervisor from a daemon thread:

* ``GET /metrics``: the Prometheus exposition of every process's metrics;
* ``GET /healthz``: 200 while the node serves (this answers only while the supervisor runs, and
  the supervisor stops the node when any of its processes dies);
* ``GET /readyz``: 200 when the node can serve requests: it leads, or it follows a leader (a
  leader that cannot hear a majority steps down, and a follower that stops hearing its leader
  stops following it), else 503; the body is JSON with the role and a reason;
* anything else: 404.
"""
from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from queue_server.protocol.roles import SERVING

ROLE_METRIC = "queue_server_role"
READY_ROLES = tuple(r.value for r in SERVING)


def current_role(registry: CollectorRegistry) -> str | None:
    """The role the coordinator last published (None before it has, or once it is gone)."""
    for family in registry.collect():
        if family.name != ROLE_METRIC:
            continue
        for sample in family.samples:
            if sample.value == 1 and "role" in sample.labels:
                return sample.labels["role"]
    return None


def readiness(role: str | None) -> tuple[int, dict]:
    """The /readyz status and body for the published role."""
    if role in READY_ROLES:
        return 200, {"ready": True, "role": role}
    if role is None:
        return 503, {"ready": False, "role": None, "reason": "the coordinator has not reported a role yet"}
    return 503, {"ready": False, "role": role,
                 "reason": "no leader known: a majority of the cluster is not reachable (or an election is on)"}


def _handler(registry: CollectorRegistry) -> type:
    base = MetricsHandler.factory(registry)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path == "/metrics":
                super().do_GET()
            elif path == "/healthz":
                self._json(200, {"healthy": True})
            elif path == "/readyz":
                self._json(*readiness(current_role(registry)))
            else:
                self._json(404, {"reason": f"no such path {path}: /metrics, /healthz or /readyz"})

        def _json(self, status: int, body: dict) -> None:
            data = orjson.dumps(body) + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every few seconds is not worth a log line

    return Handler


def serve(host: str, port: int, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve the endpoints from a daemon thread; returns the server (``.shutdown()`` stops it).
    OSError if the port cannot be bound."""
    server = ThreadingHTTPServer((host, port), _handler(registry))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
