"""The wire protocol as the clients see it: host lists, request building, reply decoding.

Pure functions and data only; the transports live in sync.py and aio.py.
See docs/protocol.md for the protocol itself.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from .errors import QueueError

from queue_server.protocol.framing import DEFAULT_MAX_REQUEST_SIZE  # noqa: F401  (re-exported)
from queue_server.protocol.vocabulary import (  # noqa: F401  (re-exported: one vocabulary for server and client)
    ASK_ANOTHER_NODE,
    AUTH,
    AUTH_REFUSED,
    ACTION_NAMES,
    CODE_ERROR,
    CODE_OK,
    CODE_REDIRECT,
    CONFIRM,
    LEADERSHIP_CHANGED,
    NO_LEADER,
    NOT_APPLIED,
    NOT_LEADER,
    SUBSCRIBE_ON_LEADER,
    UNKNOWN_OUTCOME,
    try_again,
    number,
    CONSUME,
    EXTEND,
    LEADER,
    LIST,
    LOCAL_LIST,
    LOCAL_MONITOR,
    MAX_BATCH,
    MONITOR,
    PRODUCE,
    RELEASE,
)

DEFAULT_PORT = 1111
# The largest UDP payload (IPv4); a bigger request has to go over TCP.
MAX_DATAGRAM = 65507

Address = tuple[str, int]

T = TypeVar("T")

# The caller set no "seq" of its own on a UDP request.
NO_SEQ: Any = object()

# A leader_host the server may report when it listens on every interface: the client then
# reaches the leader through the host it was already talking to.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


@dataclass(slots=True)
class Message:
    """One consumed message. The times (unix seconds) are set when the consume asked for them
    (`times=True`): its ready time, its ttl, and the lease deadline (None: not leased)."""

    queue: str
    msg_id: int
    data: str
    delivery_count: int
    ready: float | None = None
    ttl: float | None = None
    lease_until: float | None = None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One action of a client: the request to send and how its reply becomes the result."""

    request: dict[str, Any]
    read: Callable[[dict[str, Any]], T]


# ------------------------------------------------------------------ hosts


def parse_address(text: str) -> Address:
    """"host:port", "host" (port 1111) or "[v6addr]:port" as (host, port)."""
    text = text.strip()
    if not text:
        raise ValueError("empty host")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad host {text!r}: missing ]")
        port_text = rest[1:] if rest.startswith(":") else (rest or None)
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad host {text!r}")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, None
    else:
        host, port_text = text, None
    if not host:
        raise ValueError(f"bad host {text!r}: empty host name")
    if port_text is None or port_text == "":
        return host, DEFAULT_PORT
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad host {text!r}: port is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad host {text!r}: port out of range")
    return host, port


def parse_hosts(hosts: str | Sequence[str | Address]) -> list[Address]:
    """A host list ("h1:1111,h2:1112", or a list of "h:p" strings or (host, port) pairs)."""
    items: Iterable[str | Address] = hosts.split(",") if isinstance(hosts, str) else hosts
    result: list[Address] = []
    for item in items:
        if isinstance(item, str):
            if item.strip():
                result.append(parse_address(item))
        else:
            host, port = item
            result.append((str(host), int(port)))
    if not result:
        raise ValueError("no hosts given")
    return result


def format_address(addr: Address) -> str:
    """(host, port) as "host:port"."""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ------------------------------------------------------------------ requests


def encode(req: dict[str, Any]) -> bytes:
    """A request as one newline-terminated JSON line."""
    try:
        return orjson.dumps(req, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"request is not JSON-serialisable: {exc}") from None


def reply_wait(req: dict[str, Any]) -> float:
    """How long the server may hold the reply to `req` (its long-poll `wait`), in seconds."""
    wait = req.get("wait")
    if wait is None or isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait <= 0:
        return 0.0
    return float(wait)


class ProducerSequence:
    """A client's producer identity: a random producer id and the next sequence number. Every
    produce a client sends carries the pair, so that a produce retried after a timeout or a lost
    connection (when the first attempt may have been stored) is recognised by the queue and
    stored once (see "Delivery semantics" in docs/protocol.md)."""

    def __init__(self, producer: str | None = None) -> None:
        self.producer = producer or "client-" + secrets.token_hex(8)
        self.sequence = 0

    def next(self) -> tuple[str, int]:
        """The (producer, sequence) of the next produce."""
        sequence = self.sequence
        self.sequence = sequence + 1
        return self.producer, sequence


def produce_request(
    queue: str,
    data: str | Sequence[str],
    delay: float | None = None,
    ttl: float | None = None,
    retry: float | None = 0,
    priority: int | None = None,
    producer: str | None = None,
    sequence: int | None = None,
    max_deliveries: int | None = None,
) -> dict[str, Any]:
    """A produce request (a list of strings as `data` makes it a batch); `producer` and
    `sequence` make it idempotent; `max_deliveries` replaces the queue's dead-letter limit."""
    return given({"action": PRODUCE, "queue": queue, "data": data if isinstance(data, str) else list(data)},
                  delay=delay, ttl=ttl, retry=retry, priority=priority, producer=producer,
                  sequence=sequence, max_deliveries=max_deliveries)


def consume_request(
    queue: str,
    count: int | None = None,
    wait: float | None = None,
    lease: float | None = None,
    token: str | None = None,
    times: bool = False,
) -> dict[str, Any]:
    """A consume request (`count` given makes it a batch; `lease`, `token`, `times` as in
    docs/protocol.md)."""
    return given({"action": CONSUME, "queue": queue}, count=count, wait=wait, lease=lease, token=token,
                  times=True if times else None)


def ids_request(
    action: int, queue: str, msg_ids: int | Iterable[int] | None, **extra: Any
) -> dict[str, Any]:
    """A confirm/release/extend request for one id (`msg_id`), several (`msg_ids`) or none
    (select by token); `extra` fields set to None are left out."""
    req: dict[str, Any] = {"action": action, "queue": queue}
    if isinstance(msg_ids, int):
        req["msg_id"] = msg_ids
    elif msg_ids is not None:
        req["msg_ids"] = list(msg_ids)
    for key in ("tokens", "delivery_counts"):
        if extra.get(key) is not None:
            extra[key] = list(extra[key])
    return given(req, **extra)


def given(req: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """`req` with those of `fields` that are not None added, in order."""
    req.update((key, value) for key, value in fields.items() if value is not None)
    return req


def monitor_request(queue: str | None = None, local: bool = False) -> dict[str, Any]:
    """A monitor request for one queue, or for the whole node when `queue` is None."""
    return given({"action": LOCAL_MONITOR if local else MONITOR}, queue=queue)


def list_request(pattern: str = "", local: bool = False) -> dict[str, Any]:
    """A list request for queue names containing `pattern`."""
    return given({"action": LOCAL_LIST if local else LIST}, pattern=pattern or None)


def auth_request(token: str) -> dict[str, Any]:
    """The first request on a TCP connection to a node with auth_token_file set."""
    return {"action": "auth", "token": token}


def check_auth_reply(reply: dict[str, Any]) -> None:
    """QueueError unless the auth request was accepted (a wrong token is not worth trying on
    another host: they share it)."""
    if reply.get("code") != CODE_OK:
        raise error_from_reply(reply)


def leader_request(queue: str | None = None) -> dict[str, Any]:
    """A request for the leader's address; with `queue`, of that queue's group (queue groups)."""
    return {"action": LEADER} if queue is None else {"action": LEADER, "queue": queue}


# ------------------------------------------------------------------ replies


def decode_reply(line: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """One reply line as a dict; QueueError if it is not a JSON object."""
    try:
        reply = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise QueueError(CODE_ERROR, f"bad reply from server: {exc}") from None
    if type(reply) is not dict:
        raise QueueError(CODE_ERROR, "bad reply from server: not a JSON object")
    return reply


def error_from_reply(reply: dict[str, Any]) -> QueueError:
    """The QueueError for a reply whose code is not 0."""
    code = reply.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return QueueError(CODE_ERROR, "bad reply from server: no code", reply)
    reason = reply.get("reason")
    if not isinstance(reason, str) or not reason:
        reason = "redirect to the leader" if code == CODE_REDIRECT else "error"
    return QueueError(code, reason, reply)


def redirect_target(reply: dict[str, Any], current_host: str) -> Address | None:
    """Where a code -2 reply sends the client, or None if it names no usable address."""
    port = reply.get("leader_port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    host = reply.get("leader_host")
    if not isinstance(host, str) or host in _WILDCARD_HOSTS:
        host = current_host
    return host, port


def produced_ids(reply: dict[str, Any]) -> Any:
    """A produce reply's result: `msg_id`, or `msg_ids` (a list, or a dict per real queue)."""
    msg_id = reply.get("msg_id")
    if msg_id is not None:
        return msg_id
    msg_ids = reply.get("msg_ids")
    if msg_ids is None:
        raise QueueError(CODE_ERROR, "bad reply from server: no msg_id", reply)
    return msg_ids


def message_from_reply(queue: str, reply: dict[str, Any]) -> Message | None:
    """A single consume reply's message, or None when the queue had nothing ready."""
    msg_id = reply.get("msg_id")
    if msg_id is None:
        return None
    return Message(queue, msg_id, reply.get("data", ""), reply.get("delivery_count", 1),
                   reply.get("ready"), reply.get("ttl"), reply.get("lease_until"))


def messages_from_reply(queue: str, reply: dict[str, Any]) -> list[Message]:
    """A batch consume reply's messages (possibly none)."""
    return [
        Message(queue, m["msg_id"], m.get("data", ""), m.get("delivery_count", 1),
                m.get("ready"), m.get("ttl"), m.get("lease_until"))
        for m in reply.get("messages") or ()
    ]


def count_from_reply(reply: dict[str, Any], field: str) -> int:
    """A confirm/release/extend reply's count (`confirmed`, `released`, `extended`)."""
    value = reply.get(field)
    if not isinstance(value, int) or isinstance(value, bool):
        raise QueueError(CODE_ERROR, f"bad reply from server: no {field}", reply)
    return value


def confirmed_one(reply: dict[str, Any]) -> bool:
    """A single confirm reply's result: whether the message was deleted."""
    return bool(reply.get("confirmed", 1))  # the original server sends no count


def queue_names(reply: dict[str, Any]) -> list[str]:
    """A list reply's queue names."""
    return list(reply.get("queue_list") or [])


# ------------------------------------------------------------------ UDP


def udp_datagram(req: dict[str, Any], seq: int, token: str | None) -> bytes:
    """`req` as one datagram: its "seq" is the client's `seq` (a seq the caller set travels beside
    it, [seq, theirs]), with the client token. QueueError if it is too large for UDP."""
    wire = dict(req)
    wire["seq"] = seq if req.get("seq", NO_SEQ) is NO_SEQ else [seq, req["seq"]]
    if token is not None:
        wire["auth_token"] = token
    data = orjson.dumps(wire)
    if len(data) > MAX_DATAGRAM:
        raise QueueError(CODE_ERROR, "request too large for UDP, use TCP")
    return data


def udp_reply_seq(reply: dict[str, Any]) -> int | None:
    """The client seq a UDP reply answers, or None when it carries none that can be read."""
    got = reply.get("seq")
    if type(got) is int:
        return got
    if type(got) is list and len(got) == 2 and type(got[0]) is int:
        return got[0]
    return None


def udp_reply(reply: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """A UDP reply to `req` as the caller sees it: the seq it set, or none."""
    if "seq" in reply:
        user_seq = req.get("seq", NO_SEQ)
        if user_seq is NO_SEQ:
            del reply["seq"]
        else:
            reply["seq"] = user_seq
    return reply


def retry_elsewhere(req: dict, reply: dict) -> bool:
    """Whether a refused request may be sent again (to the same host or the next, resend_here
    says which): the node knows no leader, or was not leading or stopped leading before it
    applied the request (nothing was applied: NOT_APPLIED), or the request is an idempotent
    produce whose outcome is unknown (UNKNOWN_OUTCOME: the leader changed or did not answer;
    applied or not, sending it again stores it once)."""
    if reply.get("code") != CODE_ERROR:
        return False
    reason = reply.get("reason")
    if type(reason) is not str:
        return False
    if reason in NOT_APPLIED:
        return True
    return (reason in UNKNOWN_OUTCOME and req.get("action") in (PRODUCE, "produce")
            and req.get("producer") is not None and req.get("sequence") is not None)


def resend_here(reply: dict) -> bool:
    """Whether a request retry_elsewhere allows goes to the host that refused it once more: it
    refused because its mode changed, and has learnt who leads since (ASK_ANOTHER_NODE: not when
    it knows no leader, or the leader it forwarded to did not answer)."""
    return reply.get("reason") not in ASK_ANOTHER_NODE
