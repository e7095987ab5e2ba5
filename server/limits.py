"""The acceptor's connection limits (config max_connections, idle_timeout, max_pending_requests):
the reasons a client reads and which connections are idle. Pure: the time comes in as an argument."""
from __future__ import annotations

from collections.abc import Iterable


def too_many_connections(limit: int) -> str:
    """The one reply a connection past max_connections gets before it is closed."""
    return f"too many connections: this node's max_connections ({limit}) is reached; retry later or use another node"


def over_connection_limit(open_connections: int, limit: int) -> bool:
    """Whether a new connection (already counted in open_connections) is past max_connections
    (0 = no limit)."""
    return limit > 0 and open_connections > limit


def idle(connections: Iterable[tuple[int, float, bool]], now: float, timeout: float) -> list[int]:
    """The ids of connections to close for idle_timeout (0 = never): (conn_id, last_read, busy)
    each; a busy connection (a request not yet answered: a long poll, or a subscription) is
    never idle."""
    if timeout <= 0:
        return []
    return [conn_id for conn_id, last_read, busy in connections if not busy and now - last_read >= timeout]
