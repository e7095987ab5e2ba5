"""Merging concurrent requests into batch requests (AsyncQueueClient's `linger_ms`): which
requests can go together, when a batch is due, the request that carries it, and each caller's
reply cut out of the batch's reply, as the lone request would have been answered.

Pure: no I/O; time is an argument. Callers are opaque tickets (the client's futures).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from . import protocol as p
from .errors import QueueError

T = TypeVar("T")

# The longest linger a client may ask for, in seconds: merging is for calls issued together.
MAX_LINGER = 0.001

_PRODUCE_SHARED = ("delay", "ttl", "retry", "priority", "max_deliveries")
_PRODUCE_FIELDS = frozenset({"action", "queue", "data", "producer", "sequence", *_PRODUCE_SHARED})
_CONSUME_SHARED = ("lease", "times")
_CONSUME_FIELDS = frozenset({"action", "queue", "wait", *_CONSUME_SHARED})
_CONFIRM_FIELDS = frozenset({"action", "queue", "msg_id", "delivery_count"})
_MESSAGE_FIELDS = ("msg_id", "data", "delivery_count", "ready", "ttl", "lease_until")


@dataclass(frozen=True, slots=True)
class Key:
    """What every request of one batch shares: the action, the queue and the shared fields."""

    action: int
    queue: str
    shared: tuple[tuple[str, Any], ...]


@dataclass(slots=True)
class Batch(Generic[T]):
    """Requests waiting to go out together, in the order their callers made them."""

    key: Key
    deadline: float
    callers: list[T] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0

    def keep(self, alive: Callable[[T], bool]) -> Batch[T]:
        """This batch with only the callers still `alive` (those that left take nothing)."""
        if all(map(alive, self.callers)):
            return self  # the usual case: nothing to measure again
        kept = Batch[T](self.key, self.deadline)
        for caller, req in zip(self.callers, self.requests):
            if alive(caller):
                kept.callers.append(caller)
                kept.requests.append(req)
                kept.size += request_size(req)
        return kept


def batch_key(req: dict[str, Any], own_producer: str | None) -> Key | None:
    """The batch `req` can join, or None if it must go alone: a produce of one message (numbered
    by the client itself, `own_producer`, or not at all), a consume without wait, count or token,
    a confirm of one id (guarded by delivery_count or not)."""
    action, queue = req.get("action"), req.get("queue")
    if type(queue) is not str or type(action) is not int:
        return None
    if action == p.PRODUCE:
        if not req.keys() <= _PRODUCE_FIELDS or type(req.get("data")) is not str:
            return None
        producer, sequence = req.get("producer"), req.get("sequence")
        if (producer is None) != (sequence is None) or producer not in (None, own_producer):
            return None  # only the client's own numbering is replaced by the batch's
        return _key(action, queue, req, _PRODUCE_SHARED)
    if action == p.CONSUME:
        if not req.keys() <= _CONSUME_FIELDS or req.get("wait") not in (None, 0):
            return None
        return _key(action, queue, req, _CONSUME_SHARED)
    if action == p.CONFIRM:
        if not req.keys() <= _CONFIRM_FIELDS or not _is_int(req.get("msg_id")):
            return None
        guarded = "delivery_count" in req
        if guarded and not _is_int(req["delivery_count"]):
            return None
        return Key(action, queue, (("guarded", guarded),))
    return None


def _is_int(value: Any) -> bool:
    return type(value) is int


def _key(action: int, queue: str, req: dict[str, Any], shared: tuple[str, ...]) -> Key | None:
    values = tuple((name, req.get(name)) for name in shared)
    if not all(v is None or type(v) in (int, float, str, bool) for _, v in values):
        return None  # a malformed field: the server names it, for this request alone
    return Key(action, queue, values)


def max_batch_bytes(max_request_size: int) -> int:
    """The bytes of messages a batch may hold for nodes that take requests of up to
    `max_request_size` bytes: half, the rest left for the request's other fields."""
    return max_request_size // 2


def request_size(req: dict[str, Any]) -> int:
    """The bytes a request adds to a batch (its message, for a produce)."""
    return len(orjson.dumps(req["data"])) + 1 if req.get("action") == p.PRODUCE else 16


class Batcher(Generic[T]):
    """Requests waiting for their batch: a batch is due `linger` seconds after its first
    request, or at once when it holds `max_items` requests or `max_bytes`."""

    def __init__(self, linger: float, max_items: int = p.MAX_BATCH,
                 max_bytes: int = max_batch_bytes(p.DEFAULT_MAX_REQUEST_SIZE)) -> None:
        if not 0 < linger <= MAX_LINGER:
            raise ValueError(f"linger must be in (0, {MAX_LINGER}] seconds")
        self.linger = linger
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._open: dict[Key, Batch[T]] = {}

    def add(self, key: Key, caller: T, req: dict[str, Any], now: float) -> list[Batch[T]]:
        """Put `req` in its key's batch; the batches to send now (full ones)."""
        size = request_size(req)
        due = []
        batch = self._open.get(key)
        if batch is not None and batch.size + size > self.max_bytes:
            due.append(self._open.pop(key))
            batch = None
        if batch is None:
            batch = self._open[key] = Batch(key, now + self.linger)
        batch.callers.append(caller)
        batch.requests.append(req)
        batch.size += size
        if len(batch.callers) >= self.max_items or batch.size >= self.max_bytes:
            due.append(self._open.pop(key))
        return due

    def due(self, now: float) -> list[Batch[T]]:
        """The batches whose linger has passed, taken out."""
        keys = [k for k, b in self._open.items() if b.deadline <= now]
        return [self._open.pop(k) for k in keys]

    def next_deadline(self) -> float | None:
        """When the next batch falls due, or None when none waits."""
        return min((b.deadline for b in self._open.values()), default=None)

    def take(self, key: Key, n: int, alive: Callable[[T], bool]) -> list[tuple[T, dict[str, Any]]]:
        """Up to `n` waiting callers of `key` (the oldest first, only those `alive`), taken out of
        their batch with their requests: to give them messages consumed for callers that left."""
        batch = self._open.pop(key, None)
        if batch is None:
            return []
        batch = batch.keep(alive)
        taken = list(zip(batch.callers[:n], batch.requests[:n]))
        rest = batch.requests[n:]
        if rest:
            self._open[key] = Batch(key, batch.deadline, batch.callers[n:], rest, sum(map(request_size, rest)))
        return taken

    def take_all(self) -> list[Batch[T]]:
        """Every waiting batch, taken out (the client is closing)."""
        batches = list(self._open.values())
        self._open.clear()
        return batches


def batch_request(batch: Batch[Any], numbering: p.ProducerSequence | None) -> dict[str, Any]:
    """The one request that carries `batch` (a batch of one: its own request, unchanged)."""
    if len(batch.requests) == 1:
        return batch.requests[0]
    key, reqs = batch.key, batch.requests
    if key.action == p.PRODUCE:
        producer, sequence = numbering.next() if numbering is not None else (None, None)
        return p.produce_request(key.queue, [r["data"] for r in reqs], **dict(key.shared),
                                 producer=producer, sequence=sequence)
    if key.action == p.CONSUME:
        return p.consume_request(key.queue, len(reqs), **dict(key.shared))
    guarded = dict(key.shared)["guarded"]
    return p.ids_request(p.CONFIRM, key.queue, [r["msg_id"] for r in reqs], report_ids=True,
                         delivery_counts=[r["delivery_count"] for r in reqs] if guarded else None)


def split_reply(batch: Batch[Any], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """Each request's reply, cut out of the (code 0) reply to batch_request(batch): what the
    server answers the request sent alone. QueueError if the reply lacks what it must carry."""
    reqs = batch.requests
    if len(reqs) == 1:
        return [reply]
    action = batch.key.action
    if action == p.PRODUCE:
        return _split_produce(reqs, reply)
    if action == p.CONSUME:
        return _split_consume(reqs, reply)
    return _split_confirm(reqs, reply)


def _answer(req: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """A lone reply's frame for `req`: its echoed fields, code 0 and the answering node."""
    out = {k: v for k, v in req.items() if k != "data"}  # of the fields a mergeable request has, data alone is not echoed
    out["code"] = p.CODE_OK
    if "node_id" in reply:
        out["node_id"] = reply["node_id"]
    return out


def _split_produce(reqs: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    ids = reply.get("msg_ids")
    n = len(reqs)
    if isinstance(ids, list) and len(ids) == n:
        parts: list[Any] = [("msg_id", i) for i in ids]
    elif isinstance(ids, dict) and all(isinstance(v, list) and len(v) == n for v in ids.values()):
        parts = [("msg_ids", {q: v[i] for q, v in ids.items()}) for i in range(n)]  # a virtual queue
    else:
        raise QueueError(p.CODE_ERROR, f"bad reply from server: no msg_ids for {n} messages", reply)
    out = []
    for req, (name, value) in zip(reqs, parts):
        one = _answer(req, reply)
        one[name] = value
        if "duplicate" in reply:
            one["duplicate"] = reply["duplicate"]
        out.append(one)
    return out


def _split_consume(reqs: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    messages = reply.get("messages")
    if not isinstance(messages, list) or len(messages) > len(reqs):
        raise QueueError(p.CODE_ERROR, "bad reply from server: no messages list", reply)
    out = [_answer(req, reply) for req in reqs]
    for one, m in zip(out, messages):  # the first callers get the messages, in order
        _with_message(one, m)
    return out


def _split_confirm(reqs: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    deleted = reply.get("confirmed_ids")
    if not isinstance(deleted, list):
        raise QueueError(p.CODE_ERROR, "bad reply from server: no confirmed_ids "
                         "(a server without report_ids: make the client with linger_ms=0)", reply)
    left = set(deleted)
    out = []
    for req in reqs:
        one = _answer(req, reply)
        one["confirmed"] = 1 if req["msg_id"] in left else 0
        left.discard(req["msg_id"])  # the same id twice: the first caller deleted it
        out.append(one)
    return out


def release_request(queue: str, replies: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The release that gives back the messages in consume `replies` no caller took (leased
    ones come back ready at once; an at-most-once message is already deleted and the protocol
    cannot give it back), or None if they carry none."""
    held = [r for r in replies if consumed(r)]
    if not held:
        return None
    return p.ids_request(p.RELEASE, queue, [r["msg_id"] for r in held],
                         delivery_counts=[r.get("delivery_count", 1) for r in held])


def consumed(reply: dict[str, Any]) -> bool:
    """Whether a (lone-shaped) consume reply carries a message."""
    return reply.get("msg_id") is not None


def as_reply_to(req: dict[str, Any], message_reply: dict[str, Any]) -> dict[str, Any]:
    """`message_reply` (a consume's reply carrying a message) as the reply to consume `req`."""
    return _with_message(_answer(req, message_reply), message_reply)


def _with_message(out: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """`out` with the fields of a consumed `message` (as a lone consume's reply carries them)."""
    out.update((k, message[k]) for k in _MESSAGE_FIELDS if k in message)
    return out
