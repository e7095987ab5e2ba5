"""The node's resource limits: their names (config keys, and the `limit` label of
queue_server_limit_refusals_total), the reasons a client reads when one refuses it, which
connections are idle, and the workers' shares of max_queues and max_memory_mb. Pure: the time
comes in as an argument."""
from __future__ import annotations

from collections.abc import Iterable

# Every limit a refusal can be counted under: count_limit takes one of these.
MAX_CONNECTIONS = "max_connections"
MAX_PENDING_REQUESTS = "max_pending_requests"
IDLE_TIMEOUT = "idle_timeout"
UDP_AMPLIFICATION_LIMIT = "udp_amplification_limit"
MAX_QUEUES = "max_queues"
MAX_MEMORY_MB = "max_memory_mb"
UNCOMMITTED = "uncommitted"
OVERFLOW_MB = "overflow_mb"  # a produce past it while the overflow disk refuses writes
LIMITS = (MAX_CONNECTIONS, MAX_PENDING_REQUESTS, IDLE_TIMEOUT, UDP_AMPLIFICATION_LIMIT, MAX_QUEUES, MAX_MEMORY_MB,
          UNCOMMITTED, OVERFLOW_MB)


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


# -- max_queues and max_memory_mb: decided in the workers, where produces are --------------------

# Seconds between two readings of the node's resident memory (a few small /proc reads each).
MEMORY_CHECK_INTERVAL = 0.5


def queue_share(max_queues: int, workers: int) -> int:
    """The queues one worker may hold under max_queues (0 = no limit): each worker owns a
    partition of the queues and decides alone, so each gets ceil(max_queues / workers)."""
    return -(-max_queues // workers) if max_queues > 0 else 0


def over_queue_share(existing: int, new: int, share: int) -> bool:
    """Whether creating `new` queues next to a worker's `existing` ones passes its share."""
    return share > 0 and new > 0 and existing + new > share


def too_many_queues(limit: int) -> str:
    """The reason a produce that would create a queue past max_queues gets."""
    return (f"too many queues: this node's max_queues ({limit}) is reached; "
            "produce into an existing queue or delete unused queues (action delete_queue)")


def memory_full(limit_mb: int, counted: bool = False) -> str:
    """The reason a produce gets while the node is over max_memory_mb: its processes' resident
    memory, or (`counted`, a node with overflow) what it holds for its messages."""
    what = " holds more for its messages" if counted else "'s processes use more"
    return (f"node memory limit reached: this node{what} than max_memory_mb ({limit_mb}); "
            "consume, confirm or purge messages, or raise max_memory_mb")


def too_many_uncommitted(limit: int) -> str:
    """The reason a write gets while a worker holds `limit` records not yet committed (its undo
    journal is full: the cluster is not committing, e.g. the disk or the peers are slow)."""
    return (f"too many uncommitted changes: this worker holds {limit} changes the cluster has "
            "not committed yet; retry later")
