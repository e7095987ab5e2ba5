"""The client protocol's vocabulary: actions, reply codes, limits, and small pure helpers shared
by the acceptor, the workers, the coordinator and the client (client/protocol.py re-exports them)."""
from __future__ import annotations

import math
import re
from typing import Any

PRODUCE = 1
CONSUME = 2
CONFIRM = 3
MONITOR = 4
RELEASE = 5
EXTEND = 6
LIST = 7
LEADER = 8
LOCAL_MONITOR = 104
LOCAL_LIST = 107
# Queue administration (issue 14): look without taking, empty, remove, pause, dead letters.
PEEK = 20
PURGE = 21
DELETE_QUEUE = 22
PAUSE = 23
RESUME = 24
DLQ_REPLAY = 25
LOCAL_PEEK = 120
# Client authentication (config auth_token_file): the first request on a TCP connection.
AUTH = 9
# The start of the reason of every reply refused for a missing or wrong token (TCP and HTTP).
AUTH_REFUSED = "authentication "
# Push subscriptions with credit (issue 14): pushed messages travel as replies with this req_no,
# written at once, outside the connection's reply order.
SUBSCRIBE = 26
PUSH_REQ_NO = -2

ACTION_NAMES: dict[str, int] = {
    "produce": PRODUCE,
    "consume": CONSUME,
    "confirm": CONFIRM,
    "monitor": MONITOR,
    "release": RELEASE,
    "extend": EXTEND,
    "list": LIST,
    "leader": LEADER,
    "local_monitor": LOCAL_MONITOR,
    "local_list": LOCAL_LIST,
    "peek": PEEK,
    "purge": PURGE,
    "delete_queue": DELETE_QUEUE,
    "pause": PAUSE,
    "resume": RESUME,
    "dlq_replay": DLQ_REPLAY,
    "local_peek": LOCAL_PEEK,
    "subscribe": SUBSCRIBE,
    "auth": AUTH,
}
ACTIONS: frozenset[int] = frozenset(ACTION_NAMES.values())
# Actions that name one queue and are served by the worker owning it.
QUEUE_ACTIONS: frozenset[int] = frozenset({PRODUCE, CONSUME, CONFIRM, RELEASE, EXTEND,
                                           PEEK, PURGE, DELETE_QUEUE, PAUSE, RESUME, DLQ_REPLAY,
                                           LOCAL_PEEK, SUBSCRIBE})
# Actions a node answers from its own state, leader or not (never forwarded).
LOCAL_ACTIONS: frozenset[int] = frozenset({LOCAL_MONITOR, LOCAL_LIST, LOCAL_PEEK})

CODE_OK = 0
CODE_ERROR = -1
CODE_REDIRECT = -2
# The reasons of the error replies that mean "not now" rather than "bad input" (code -1). A
# client acts on them: each says whether the request was applied, and so whether sending it
# again is safe. Every reason of a node that is not (or no longer) leading starts with this:
NOT_LEADER = "not leader"
# Not applied: the node knows no leader; another host may.
NO_LEADER = "no leader"
# Not applied: the node it reached stopped leading first; send it again (to the new leader).
LEADERSHIP_CHANGED = NOT_LEADER + ": leadership changed; retry"
# Not applied: a worker of a node that is not leading was asked to write.
NOT_LEADING = NOT_LEADER + ": this node is not leading; retry on the leader"
# Not applied: its records reached the coordinator after it stopped leading.
NOT_LEADER_RETRY = NOT_LEADER + ": retry"
# Not applied: decided under a mode of the node (leading, following) that has since ended.
MODE_CHANGED = "not applied: the node changed mode; retry"
# Unknown outcome: logged, but the node stopped leading before the write was committed.
LEADERSHIP_LOST = NOT_LEADER + ": leadership lost before the write was committed; it may or may not take effect"
# Unknown outcome: the request was forwarded to a leader that lost its leadership meanwhile.
LEADER_CHANGED = "leader changed: the request may or may not have been applied"
# Unknown outcome: the leader a request was forwarded to did not answer in time.
FORWARD_TIMED_OUT = "forwarded request timed out: the leader did not answer"
# Not applied: the leader cannot write its change log (disk full, I/O error).
STORAGE_UNAVAILABLE = "storage unavailable"
# Not applied: the queue holds max_queue_size messages.
QUEUE_FULL = "queue full"
# Not applied: a subscribe that reached the leader through a follower, or came over UDP. The
# subscription client asks who leads and subscribes there (client/subscribe.py).
SUBSCRIBE_ON_LEADER = "subscribe: only on a TCP connection to the leader (not forwarded, not UDP)"
# The reasons after which sending the request again is safe: nothing was applied. Every refusal a
# node makes because it was not, or stopped being, the leader in the mode the request was served
# in is one of these (the worker's, the coordinator's for a batch of a mode that is over, the
# forwarding's). The clients send the request again (client/failover.py), and so does a follower
# that forwarded it (server/forwarding.py). STORAGE_UNAVAILABLE and QUEUE_FULL apply nothing
# either, but the same request sent again at once meets the same refusal: they are the caller's.
NOT_APPLIED = frozenset({NO_LEADER, LEADERSHIP_CHANGED, NOT_LEADING, NOT_LEADER_RETRY, MODE_CHANGED})
# The reasons after which the request may or may not take effect: sending it again is safe only
# where a repeat changes nothing (a produce with producer and sequence).
UNKNOWN_OUTCOME = frozenset({LEADERSHIP_LOST, LEADER_CHANGED, FORWARD_TIMED_OUT})
# Of the two classes above, the reasons of a node that cannot pass a request on now: it knows no
# leader, or the leader it knows did not answer. A request is sent again to another node after
# these; after any other, to the same node: it has learnt who leads since it refused (itself
# again, once a hand-off that failed is over; or another node, which it forwards or redirects to).
ASK_ANOTHER_NODE = frozenset({NO_LEADER, FORWARD_TIMED_OUT})
# The starts of every "not now" reason (a reply's reason may add detail after them).
_TRY_AGAIN = (NOT_LEADER, NO_LEADER, MODE_CHANGED, LEADER_CHANGED, FORWARD_TIMED_OUT, STORAGE_UNAVAILABLE,
              QUEUE_FULL)

# delay/ttl values at or above this are unix timestamps; below it, seconds from now.
ABSOLUTE_TIME_THRESHOLD = 1_000_000_000
MAX_QUEUE_NAME_BYTES = 256
MAX_BATCH = 1000
DEFAULT_TTL = 3600.0

# Request fields that are not echoed in replies (bulky or replaced by the result).
# `pad`: padding a UDP client adds so that the amplification guard allows a larger reply.
NOT_ECHOED = frozenset({"data", "msg_ids", "tokens", "delivery_counts", "auth_token", "udp_reply_limit", "pad"})
# Set by the acceptor on every UDP request (a client's own value is replaced): the largest reply
# in bytes this datagram may get (udp_max_response, or less under the amplification guard).
UDP_REPLY_LIMIT = "udp_reply_limit"

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # Unicode category Cc


def resolve_action(value: Any) -> int | None:
    """The numeric action for a request's `action` value (number or name), or None if unknown."""
    if type(value) is int:
        return value if value in ACTIONS else None
    if isinstance(value, str):
        return ACTION_NAMES.get(value)
    return None


def queue_name_error(name: Any) -> str | None:
    """Why `name` is not a valid queue name, or None if it is."""
    if not isinstance(name, str):
        return "queue: must be a string" if name is not None else "queue: missing"
    if not name:
        return "queue: must not be empty"
    if len(name) > MAX_QUEUE_NAME_BYTES:
        return f"queue: longer than {MAX_QUEUE_NAME_BYTES} bytes"
    try:
        if len(name.encode("utf-8")) > MAX_QUEUE_NAME_BYTES:
            return f"queue: longer than {MAX_QUEUE_NAME_BYTES} bytes"
    except UnicodeEncodeError:
        return "queue: not valid UTF-8"
    if _CONTROL.search(name):
        return "queue: contains control characters"
    return None


def echo(request: Any) -> dict:
    """The request's own fields that a reply repeats (a fresh dict)."""
    if type(request) is not dict:
        return {}
    return {k: v for k, v in request.items() if k not in NOT_ECHOED}


def error_reply(request: Any, reason: str, node_id: int | None = None) -> dict:
    """A code -1 reply to `request` naming what was wrong."""
    reply = echo(request)
    reply["code"] = CODE_ERROR
    reply["reason"] = reason
    if node_id is not None:
        reply["node_id"] = node_id
    return reply


def empty_consume_reply(request: Any, node_id: int, batch: bool) -> dict:
    """A consume's code 0 reply that hands out nothing; with `batch` (the request gave a count)
    its empty `messages` list."""
    reply = echo(request)
    reply["code"] = CODE_OK
    reply["node_id"] = node_id
    if batch:
        reply["messages"] = []
    return reply


def try_again(reply: Any) -> bool:
    """Whether a reply is an error that means "not now" (no leader, leadership changed, the
    leader did not answer, storage unavailable, queue full), not "bad input"."""
    if type(reply) is not dict or reply.get("code") != CODE_ERROR:
        return False
    reason = reply.get("reason")
    return type(reason) is str and reason.startswith(_TRY_AGAIN)


def redirect_reply(request: Any, node_id: int, leader: dict) -> dict:
    """A code -2 reply to `request`: ask the leader (leader: leader_node_id, leader_host,
    leader_port)."""
    reply = echo(request)
    reply.update(code=CODE_REDIRECT, node_id=node_id, **leader)
    return reply


def passes_to_coordinator(forward_request: bool, leader_node_id: int, node_id: int) -> bool:
    """Whether a follower's acceptor passes a queue request to its coordinator rather than
    redirecting it: it forwards requests (forward_request), or the leader it knows is its own
    node, which is handing leadership over; its coordinator holds the request until the new
    leader is known, then sends it there or redirects it."""
    return bool(forward_request) or leader_node_id == node_id


def delivered(reply: Any) -> tuple[str, list[list[int]]] | None:
    """(queue, [[msg_id, delivery_count], ...]) handed out by a successful consume reply or
    subscription push (a decoded dict), else None."""
    if type(reply) is not dict or resolve_action(reply.get("action")) not in (CONSUME, SUBSCRIBE) \
            or reply.get("code") != CODE_OK:
        return None
    queue = reply.get("queue")
    given = [[m["msg_id"], m.get("delivery_count", 0)] for m in reply.get("messages", ())
             if type(m) is dict and "msg_id" in m]
    if "msg_id" in reply:
        given.append([reply["msg_id"], reply.get("delivery_count", 0)])
    return (queue, given) if given and isinstance(queue, str) else None


def number(text: str) -> int | float | None:
    """The number `text` spells: an int when it is one (what the original's clients send), else a
    finite float; None when it is neither (nan and inf included)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def absolute_time(value: float, now: float) -> float:
    """A delay/ttl value as an absolute unix time (the original's clients send timestamps)."""
    return float(value) if value >= ABSOLUTE_TIME_THRESHOLD else now + value


def request_action(value: Any) -> int | str:
    """The action of a decoded request, or the reason it has none we know."""
    if type(value) is not dict:
        return "request: must be a JSON object"
    action = value.get("action")
    if type(action) is int and action in ACTIONS:
        return action
    resolved = resolve_action(action)
    if resolved is None:
        return "action: missing" if action is None else "action: unknown"
    return resolved
