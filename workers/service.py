"""The queues one worker owns: validates requests, applies them to its queues, parks long polls,
and returns replies and change records. Pure: time comes in as `now`, nothing here does I/O.

One file, over 600 lines, because it is the worker's one request handler: each action's check of
its fields, its call into workers/queue.py and its reply sit together, so that a reader sees the
whole of what a request gets in one place. The parts that stand alone are apart already:
workers/admin.py (administration), workers/subscriptions.py (push), workers/bad_request.py."""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable

import orjson

from queue_server.protocol import limits
from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.workers import admin, subscriptions, undo
from queue_server.workers.bad_request import BadRequest, Refused
from queue_server.protocol.snapshot_frames import Frame
from queue_server.protocol.records import Confirm, Consume, DeleteQueue, Noop, Purge, Record, Release, Restore, count
from queue_server.workers.body_budget import body_size, memory_bytes
from queue_server.workers.compaction import Compaction
from queue_server.workers.overflow import Overflow
from queue_server.workers.queue import Message, Queue
from queue_server.workers.store import delivered_once

# How many just-deleted at-most-once messages each worker keeps to be restored if their reply
# cannot be delivered (the client's connection closed while the reply was on its way). Every
# node's workers keep them, from the consume records they replay too: whichever node leads when
# the message is given back restores it.
RESTORE_CACHE_SIZE = 65536
# How often leased messages whose ttl has passed are swept out (seconds).
EXPIRE_SWEEP_INTERVAL = 1.0
# Longest lease token and producer id, in UTF-8 bytes.
MAX_TOKEN_BYTES = 256
# Largest UDP reply in bytes (config udp_max_response's default).
DEFAULT_UDP_MAX_RESPONSE = 60000
UDP_TOO_LARGE = "response too large for UDP, use TCP"
# Request fields that replies do not echo: the protocol's bulky ones, and our list selectors.


@dataclass(slots=True)
class Waiter:
    """A long-poll consume parked until a message is ready or its deadline passes."""

    origin: Origin
    req_no: int
    request: dict
    count: int | None
    deadline: float
    lease: float | None = None
    token: str | None = None
    times: bool = False


def _number(req: dict, key: str, default: float | None) -> float | None:
    """A number field as a float (records carry floats, so a leader's state and its replicas'
    hold the same values however the client wrote them: 30 or 30.0)."""
    value = req.get(key)
    if value is None:
        return default
    if type(value) is bool or not isinstance(value, (int, float)):
        raise BadRequest(f"{key}: must be a number")
    return float(value)


def _int(req: dict, key: str, default: int | None) -> int | None:
    value = req.get(key)
    if value is None:
        return default
    if type(value) is not int:
        raise BadRequest(f"{key}: must be an integer")
    return value


def _name(req: dict, key: str) -> str | None:
    """A token or producer field: a non-empty string of at most MAX_TOKEN_BYTES."""
    value = req.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{key}: must be a non-empty string")
    if len(value) > MAX_TOKEN_BYTES or len(value.encode("utf-8", "surrogatepass")) > MAX_TOKEN_BYTES:
        raise BadRequest(f"{key}: longer than {MAX_TOKEN_BYTES} bytes")
    return value


def _int_list(req: dict, key: str) -> list[int] | None:
    value = req.get(key)
    if value is None:
        return None
    if type(value) is not list or any(type(i) is not int for i in value):
        raise BadRequest(f"{key}: must be a list of integers")
    return value


def _msg_ids(req: dict) -> list[int] | None:
    ids = _int_list(req, "msg_ids")
    if ids is None:
        one = req.get("msg_id")
        if one is None:
            return None
        if type(one) is not int:
            raise BadRequest("msg_id: must be an integer")
        return [one]
    return ids


@dataclass(slots=True)
class Selection:
    """Which messages a confirm/release/extend names: ids, tokens, or ids guarded by tokens."""

    ids: list[int] | None
    delivery_counts: list[int] | None
    tokens: list[str] | None
    prefix: str | None

    @classmethod
    def parse(cls, req: dict) -> Selection:
        """The selection of a request; BadRequest names the offending field."""
        ids = _msg_ids(req)
        counts = None
        if req.get("delivery_counts") is not None:
            counts = _int_list(req, "delivery_counts")
            if req.get("msg_ids") is None or len(counts) != len(ids):
                raise BadRequest("delivery_counts: must be as long as msg_ids")
        elif req.get("delivery_count") is not None:
            one = _int(req, "delivery_count", None)
            if req.get("msg_ids") is not None or ids is None:
                raise BadRequest("delivery_count: goes with msg_id (use delivery_counts)")
            counts = [one]
        token = _name(req, "token")
        prefix = req.get("token_prefix")
        if prefix is not None and not isinstance(prefix, str):
            raise BadRequest("token_prefix: must be a string")
        tokens = req.get("tokens")
        if tokens is not None and (
                type(tokens) is not list or not all(isinstance(t, str) and t for t in tokens)):
            raise BadRequest("tokens: must be a list of non-empty strings")
        if (token is not None) + (tokens is not None) + (prefix is not None) > 1:
            raise BadRequest("token: give only one of token, tokens, token_prefix")
        if token is not None:
            tokens = [token]
        if ids is None and tokens is None and prefix is None:
            raise BadRequest("msg_id: missing")
        return cls(ids, counts, tokens, prefix)

    def targets(self, q: Queue) -> list[tuple[int, str | None, int | None]]:
        """(msg_id, token guard, delivery_count guard) for each message to act on in `q`."""
        if self.ids is None:
            names = self.tokens if self.tokens is not None else q.tokens(self.prefix)
            return [(msg_id, token, None) for token in names for msg_id in q.held(token)]
        counts = self.delivery_counts or [None] * len(self.ids)
        if self.tokens is None and self.prefix is None:
            return [(msg_id, None, dc) for msg_id, dc in zip(self.ids, counts)]
        allowed = set(self.tokens) if self.tokens is not None else None
        found = []
        for msg_id, dc in zip(self.ids, counts):
            token = q.token_of(msg_id)
            if token is None:
                continue
            if allowed is not None and token not in allowed:
                continue
            if self.prefix is not None and not token.startswith(self.prefix):
                continue
            found.append((msg_id, token, dc))
        return found


class PartitionService:
    """All queues of one worker, with the request semantics of the protocol (docs/protocol.md).

    After each call, the caller drains `replies` ((origin, req_no, reply dict)), `records` (change
    records for the coordinator), `partials` (contributions to scattered monitor/list requests)
    and `direct` (replies that may skip the coordinator, see `handle`).
    """

    def __init__(
        self,
        node_id: int,
        queue_size: int,
        virtual_queues: dict[str, tuple[str, ...]] | None = None,
        max_wait: float = 30.0,
        queue_class: type[Queue] = Queue,
        udp_max_response: int = DEFAULT_UDP_MAX_RESPONSE,
        max_deliveries: int = 0,
        dead_letter_suffix: str = "",
        max_queues: int = 0,
        queue_share: int = 0,
        max_memory_mb: int = 0,
        restore_cache: int = RESTORE_CACHE_SIZE,
        undo_limit: int | None = None,
        overflow: Overflow | None = None,
    ) -> None:
        """queue_class: the class of its queues (a test's subclass of Queue).
        restore_cache: how many at-most-once deliveries it keeps to restore (RESTORE_CACHE_SIZE).
        udp_max_response: the largest reply (bytes, newline included) a UDP request may get; a
        UDP consume whose reply would be larger is refused before anything is taken.
        max_deliveries, dead_letter_suffix: the dead-letter policy (config keys of those names;
        "" turns dead-letter queues off).
        max_queues, queue_share: the node's max_queues and this worker's share of it (see
        protocol/limits.py queue_share); a request that would create a queue past the share is
        refused. max_memory_mb: named in the refusal of a produce while `memory_full` (the worker
        sets it from the node's resident memory). undo_limit: keep an undo journal (rollback)
        of at most this many records (None: keep none). overflow: where bodies past the worker's
        share of overflow_mb go (workers/overflow.py; None: every body stays in memory)."""
        self.node_id = node_id
        self.restore_cache = restore_cache
        self.max_queues = max_queues
        self.queue_share = queue_share
        self.max_memory_mb = max_memory_mb
        self.memory_full = False
        self.limit_refusals: dict[str, int] = {}  # limit -> refusals, emptied by the worker's metrics
        self.max_deliveries = max_deliveries
        self.dead_letter_suffix = dead_letter_suffix
        self.udp_max_response = udp_max_response
        self.queue_class = queue_class
        self.queue_size = queue_size
        self.virtual_queues = dict(virtual_queues or {})
        self.max_wait = max_wait
        self.accepting = True  # False on a follower: its queues change only by replayed records
        # Not accepting because the node is handing leadership over (fence): parked long polls
        # and subscriptions are kept, not answered, until the next mode says whether it leads.
        self.fenced = False
        self.draining = False  # the node is shutting down: long polls are answered at once, empty
        self.queues: dict[str, Queue] = {}
        self.waiters: dict[str, deque[Waiter]] = {}
        self.replies: list[tuple[Origin, int, dict]] = []
        # Replies that rest on no record, committed or not: they go to the acceptor at once.
        self.direct: list[tuple[Origin, int, dict]] = []
        self.records: list[Record] = []
        self.partials: list[list] = []
        self.errors: list[Exception] = []
        self._restorable: OrderedDict[tuple[str, int], Message] = OrderedDict()
        # Records applied, decided here or replayed (the coordinator counts them too), and the
        # undo journal of those not committed yet (workers/undo.py; None: rollback is off).
        self.seq = 0
        self.undo_limit = undo_limit
        self.journal = undo.UndoJournal() if undo_limit is not None else None
        # The deque every queue pushes its undo entries to (None: no journal); kept apart from
        # `journal`, which apply_committed turns off for its records.
        self._journal_entries = self.journal.entries if self.journal is not None else None
        self.overflow = overflow
        self.compaction = Compaction(overflow) if overflow is not None else None
        self._next_sweep = 0.0
        self._handlers: dict[int, Callable[[dict, Origin, int, float], dict | None]] = {
            p.PRODUCE: self._produce,
            p.CONSUME: self._consume,
            p.CONFIRM: self._confirm,
            p.RELEASE: self._release,
            p.EXTEND: self._extend,
        }
        self._handlers.update(admin.handlers(self))
        self.subs = subscriptions.Subscriptions(self)
        self._handlers.update(subscriptions.handlers(self, self.subs))

    # ----------------------------------------------------------------------------- requests
    def handle(self, req: Any, origin: Origin, req_no: int, now: float) -> None:
        """Serve one queue request; its reply (unless parked as a long poll) goes to `replies`,
        or to `direct` when nothing a reset of the mode could take back stands behind it: this
        worker accepts writes, the request came from this node's own acceptor (a forwarded one's
        reply goes back through the coordinator), it made no record, and the reply is a
        refusal of its fields or a consume that found nothing (docs/architecture.md, "Replies
        that skip the coordinator")."""
        made = len(self.records)
        settled = False
        try:
            if type(req) is not dict:
                raise BadRequest("request: must be a JSON object")
            action = p.resolve_action(req.get("action"))
            if action is None:
                raise BadRequest("action: missing" if req.get("action") is None else "action: unknown")
            handler = self._handlers.get(action)
            if handler is None:
                raise BadRequest("action: not a queue action")
            if not self.accepting and action != p.LOCAL_PEEK:
                raise BadRequest(p.NOT_LEADING)
            journal = self.journal
            if journal is not None and len(journal.entries) >= self.undo_limit and action not in _READS:
                self._refused(limits.UNCOMMITTED)
                raise Refused(limits.too_many_uncommitted(self.undo_limit))
            reply = handler(req, origin, req_no, now)
            settled = action == p.CONSUME and _found_nothing(reply)
        except BadRequest as exc:
            reply = p.error_reply(req, str(exc), self.node_id)
            settled = type(exc) is not Refused
        except Exception as exc:  # a bug must cost one request, never the process or its queues
            self.errors.append(exc)
            reply = p.error_reply(req, f"internal error: {type(exc).__name__}", self.node_id)
        self.seq += len(self.records) - made
        if reply is not None:
            if settled and self.accepting and not origin.node and len(self.records) == made:
                self.direct.append((origin, req_no, reply))
            else:
                self.replies.append((origin, req_no, reply))

    def _ok(self, req: dict) -> dict:
        reply = p.echo(req)
        reply["code"] = p.CODE_OK
        reply["node_id"] = self.node_id
        return reply

    def _check_queue(self, name: Any) -> str:
        if type(name) is str and name in self.queues:  # checked when it was created
            return name
        reason = p.queue_name_error(name)
        if reason:
            raise BadRequest(reason)
        return name

    def _queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = self.queue_class(name, self.queue_size)
            self._configure(q)
            if self.journal is not None:  # made for the next record: undone with it
                self.journal.beside(False, undo.undo_create, self, name, q)
        return q

    def admit_queues(self, names: tuple[str, ...]) -> None:
        """Refuse (Refused) a request that would create queues past this worker's share of
        max_queues; existing queues always pass."""
        new = sum(1 for name in names if name not in self.queues)
        if limits.over_queue_share(len(self.queues), new, self.queue_share):
            self._refused(limits.MAX_QUEUES)
            raise Refused(limits.too_many_queues(self.max_queues))

    def _refused(self, limit: str) -> None:
        self.limit_refusals[limit] = self.limit_refusals.get(limit, 0) + 1

    def _configure(self, q: Queue) -> None:
        """Give a queue this service's dead-letter policy. A dead-letter queue's own messages
        are never ended for max_deliveries (they have been delivered that often already)."""
        suffix = self.dead_letter_suffix
        is_dlq = bool(suffix) and q.name.endswith(suffix)
        q.dead_letters_to(admin.dead_letter_name(q.name, suffix), self._queue,
                          0 if is_dlq else self.max_deliveries)
        q.journal = self._journal_entries
        if self.overflow is not None:
            q._index.attach(self.overflow)

    def forget_restorable(self, queue: str) -> None:
        """Forget the at-most-once deliveries of `queue` kept for restoring (it was purged or
        deleted: they must not come back)."""
        cache = self._restorable
        forgotten = [(k, cache.pop(k)) for k in [k for k in cache if k[0] == queue]]
        if forgotten and self.journal is not None:
            self.journal.beside(True, undo.undo_forget, cache, forgotten, False)

    def _produce(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        name = req.get("queue")
        data = req.get("data")
        if isinstance(data, str):
            batch = None
        elif type(data) is list and data and all(isinstance(d, str) for d in data):
            batch = data
        elif data is None:
            raise BadRequest("data: missing")
        elif type(data) is list:
            raise BadRequest("data: a batch must be a non-empty list of strings")
        else:
            raise BadRequest("data: must be a string or a list of strings")
        delay = _number(req, "delay", None)
        if delay is not None and delay < 0:
            raise BadRequest("delay: must not be negative")
        ready = now if delay is None else p.absolute_time(delay, now)
        ttl_value = _number(req, "ttl", None)
        ttl = ready + p.DEFAULT_TTL if ttl_value is None else p.absolute_time(ttl_value, now)
        if ttl < ready:
            raise BadRequest("ttl: before the ready time")
        retry = _number(req, "retry", 0.0)
        if retry < 0:
            raise BadRequest("retry: must be >= 0")
        priority = _int(req, "priority", 0)
        if not -(2**31) <= priority < 2**31:
            raise BadRequest("priority: out of range")

        producer = _name(req, "producer")
        sequence = _int(req, "sequence", None)
        if producer is not None and sequence is None:
            raise BadRequest("sequence: missing (producer needs a sequence)")
        if sequence is not None:
            if producer is None:
                raise BadRequest("producer: missing (sequence needs a producer)")
            if not 0 <= sequence < 2**63:
                raise BadRequest("sequence: out of range (0 .. 2**63-1)")
        max_deliveries = _int(req, "max_deliveries", None)
        if max_deliveries is not None and not 0 <= max_deliveries < 2**31:
            raise BadRequest("max_deliveries: must be 0 (unlimited) .. 2**31-1")

        members = self.virtual_queues.get(name) if isinstance(name, str) else None
        targets = members if members is not None else (self._check_queue(name),)
        n = 1 if batch is None else len(batch)
        if producer is not None:
            seen = self._produced(targets, producer, sequence, n)
            if seen is not None:
                return self._produce_reply(req, members, targets, batch, seen, duplicate=True)
        self.admit_queues(targets)
        if self.memory_full:
            self._refused(limits.MAX_MEMORY_MB)
            raise BadRequest(limits.memory_full(self.max_memory_mb, counted=self.overflow is not None))
        if self.overflow is not None:
            size = body_size(data) if batch is None else sum(map(body_size, batch))
            refused = self.overflow.refuses(size * len(targets), now)
            if refused is not None:
                self._refused(limits.OVERFLOW_MB)
                raise Refused(refused)
        # Checked before any queue is made: a refused produce makes none (no record would).
        existing = self.queues
        if any((existing[t].free() if t in existing else self.queue_size) < n for t in targets):
            raise Refused(p.QUEUE_FULL)
        ids: dict[str, tuple[int, int]] = {}
        items = [(d, ready, ttl, retry, priority) for d in batch] if batch is not None else None
        for target in targets:
            q = self._queue(target)  # made just before its first record (workers/undo.py)
            if items is None:
                recs = [q.produce(data, ready, ttl, retry, priority, now, producer, sequence,
                                  max_deliveries)]
            else:
                recs = q.produce_many(items, now, producer, sequence, max_deliveries)
            self.records.extend(recs)
            ids[q.name] = (recs[0].msg_id, len(recs))
            if q.name in self.waiters:
                self._serve_waiters(q, now)
        return self._produce_reply(req, members, targets, batch, ids, duplicate=False)

    def _produced(
        self, targets: tuple[str, ...], producer: str, sequence: int, n: int
    ) -> dict[str, tuple[int, int]] | None:
        """The remembered ids of an idempotent produce, per real queue that still remembers it;
        None if no target queue remembers it (a new produce)."""
        seen: dict[str, tuple[int, int]] = {}
        for target in targets:
            q = self.queues.get(target)
            entry = q.produced(producer, sequence) if q is not None else None
            if entry is not None:
                if entry[1] != n:
                    raise Refused(
                        f"sequence: already used by this producer for {entry[1]} message(s), not {n}")
                seen[target] = entry
        return seen or None

    def _produce_reply(
        self,
        req: dict,
        members: tuple[str, ...] | None,
        targets: tuple[str, ...],
        batch: list | None,
        ids: dict[str, tuple[int, int]],
        duplicate: bool,
    ) -> dict:
        def listed(first: int, count: int) -> int | list[int]:
            return first if batch is None else list(range(first, first + count))

        reply = self._ok(req)
        if members is not None:
            reply["msg_ids"] = {q: listed(*entry) for q, entry in ids.items()}
        elif batch is None:
            reply["msg_id"] = ids[targets[0]][0]
        else:
            reply["msg_ids"] = listed(*ids[targets[0]])
        if duplicate:
            reply["duplicate"] = True
        return reply

    def _reject_virtual(self, name: Any) -> str:
        if isinstance(name, str) and name in self.virtual_queues:
            raise BadRequest("queue: a virtual queue only takes produce")
        return self._check_queue(name)

    def _consume(self, req: dict, origin: Origin, req_no: int, now: float) -> dict | None:
        name = self._reject_virtual(req.get("queue"))
        count = _int(req, "count", None)
        if count is not None and not 1 <= count <= p.MAX_BATCH:
            raise BadRequest(f"count: must be 1..{p.MAX_BATCH}")
        wait = _number(req, "wait", 0.0)
        if wait < 0:
            raise BadRequest("wait: must be >= 0")
        lease = _number(req, "lease", None)
        if lease is not None and not lease > 0:
            raise BadRequest("lease: must be > 0")
        token = _name(req, "token")
        times = req.get("times", False)
        if type(times) is not bool:
            raise BadRequest("times: must be true or false")
        q = self.queues.get(name)
        if q is not None and not q.paused and (q.has_ready(now) or (token is not None and q.held(token))):
            if origin.udp and self._too_large_for_udp(q, req, count, now, lease, token, times,
                                                      req.get(p.UDP_REPLY_LIMIT, self.udp_max_response)):
                return self._udp_too_large(req)
            return self._deliver(q, req, count, now, lease, token, times)
        if wait > 0 and not origin.udp and not self.draining:
            deadline = now + min(wait, self.max_wait)
            self.waiters.setdefault(name, deque()).append(
                Waiter(origin, req_no, req, count, deadline, lease, token, times))
            return None
        return self._empty(req, count)

    def _empty(self, req: dict, count: int | None) -> dict:
        return p.empty_consume_reply(req, self.node_id, count is not None)

    def _deliver(
        self,
        q: Queue,
        req: dict,
        count: int | None,
        now: float,
        lease: float | None = None,
        token: str | None = None,
        times: bool = False,
    ) -> dict:
        replayed = False
        if token is not None:
            self.records.extend(q.expire_due(now))  # so that a token whose leases ended is new
            replayed = bool(q.held(token))
        messages, records = q.consume(now, count or 1, lease, token)
        self.records.extend(records)
        for m in messages:
            if m.lease is None:
                self._remember(q.name, m)
        return self._consume_reply(req, count, messages, times, replayed)

    def _too_large_for_udp(
        self,
        q: Queue,
        req: dict,
        count: int | None,
        now: float,
        lease: float | None,
        token: str | None,
        times: bool,
        limit: Any,
    ) -> bool:
        """Whether the reply of this consume would exceed `limit` (udp_max_response, or the
        amplification guard's limit the acceptor set for the datagram). Nothing is taken."""
        messages = q.peek(now, count or 1, lease, token)
        replayed = token is not None and bool(q.held_at(token, now))
        reply = self._consume_reply(req, count, messages, times, replayed)
        if type(limit) is not int or limit > self.udp_max_response:
            limit = self.udp_max_response
        return len(orjson.dumps(reply, option=orjson.OPT_APPEND_NEWLINE)) > limit

    def _udp_too_large(self, req: dict) -> dict:
        """The refusal of a UDP consume whose reply would not fit a datagram: it echoes only
        action, queue and seq, as the acceptor's own size error does, so that it fits."""
        reply = {k: req[k] for k in ("action", "queue", "seq") if k in req}
        reply["code"] = p.CODE_ERROR
        reply["reason"] = UDP_TOO_LARGE
        reply["node_id"] = self.node_id
        return reply

    def _consume_reply(
        self, req: dict, count: int | None, messages: list[Message], times: bool, replayed: bool
    ) -> dict:
        """The reply of a consume that delivers `messages`."""
        reply = self._ok(req)
        if count is None:
            if messages:
                m = messages[0]
                reply["msg_id"] = m.msg_id
                reply["data"] = m.data
                reply["delivery_count"] = m.delivery_count
                if times:
                    reply["ready"] = m.ready
                    reply["ttl"] = m.ttl
                    reply["lease_until"] = m.lease
        elif times:
            reply["messages"] = [
                {"msg_id": m.msg_id, "data": m.data, "delivery_count": m.delivery_count,
                 "ready": m.ready, "ttl": m.ttl, "lease_until": m.lease}
                for m in messages
            ]
        else:
            reply["messages"] = [
                {"msg_id": m.msg_id, "data": m.data, "delivery_count": m.delivery_count} for m in messages
            ]
        if replayed:
            reply["replayed"] = True
        return reply

    def _remember(self, queue: str, message: Message) -> None:
        """Keep an at-most-once message just delivered (deleted), to restore it should its reply
        never reach the client (undeliver); the oldest of restore_cache are forgotten."""
        cache = self._restorable
        cache[(queue, message.msg_id)] = message
        if len(cache) > self.restore_cache:
            evicted = cache.popitem(last=False)
            if self.journal is not None:
                self.journal.beside(True, undo.undo_forget, cache, [evicted], True)

    def _selected(self, req: dict) -> tuple[Queue | None, list[tuple[int, str | None, int | None]]]:
        """The queue a confirm/release/extend names, and its (msg_id, token, delivery_count)
        targets."""
        name = self._reject_virtual(req.get("queue"))
        selection = Selection.parse(req)
        q = self.queues.get(name)
        return q, (selection.targets(q) if q is not None else [])

    def _confirm(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        report_ids = req.get("report_ids", False)
        if type(report_ids) is not bool:
            raise BadRequest("report_ids: must be true or false")
        q, targets = self._selected(req)
        rec = q.confirm_many(targets) if targets else None
        if rec is not None:
            self.records.append(rec)
        if self.subs and targets:
            self.subs.confirmed(q.name, [t[0] for t in targets])
        reply = self._ok(req)
        reply["confirmed"] = _count(rec)
        if report_ids:
            reply["confirmed_ids"] = _ids(rec)
        return reply

    def _release(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        q, targets = self._selected(req)
        rec = q.release_many(targets, now) if targets else None
        reply = self._ok(req)
        reply["released"] = _count(rec)
        if rec is not None:
            self.records.append(rec)
            if q.name in self.waiters:
                self._serve_waiters(q, now)
        return reply

    def _extend(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        retry = _number(req, "retry", None)
        if retry is None:
            raise BadRequest("retry: missing")
        if retry <= 0:
            raise BadRequest("retry: must be > 0")
        q, targets = self._selected(req)
        recs = q.extend_many(targets, now + retry) if targets else []
        self.records.extend(recs)
        reply = self._ok(req)
        reply["extended"] = sum(_count(r) for r in recs)
        return reply

    # ----------------------------------------------------------------------------- scatter
    def partial(self, gather: list, req: dict, now: float) -> None:
        """This worker's part of a monitor or list request scattered to every worker."""
        action = p.resolve_action(req.get("action"))
        try:
            if action in (p.LIST, p.LOCAL_LIST):
                pattern = req.get("pattern") or ""
                if not isinstance(pattern, str):
                    raise BadRequest("pattern: must be a string")
                part: dict = {"queue_list": [n for n in self.queues if pattern in n]}
            else:
                name = req.get("queue")
                if name is None:
                    part = self._totals(now)
                else:
                    name = self._reject_virtual(name)
                    q = self.queues.get(name)
                    part = q.stats(now) if q is not None else _empty_stats(self.queue_size)
                    part["waiters"] = len(self.waiters.get(name, ()))
                    part["paused"] = q is not None and q.paused
                    part["overflowed"] = q.overflowed() if q is not None else 0
                    dlq = self.queues.get(admin.dead_letter_name(name, self.dead_letter_suffix) or "")
                    part["dead"] = len(dlq) if dlq is not None else 0
                    counts = q.counts if q is not None else {}
                    part["produced"] = counts.get("produced", 0)
                    part["consumed"] = counts.get("consumed", 0)
        except BadRequest as exc:
            part = {"error": str(exc)}
        self.partials.append([gather, part])

    def queue_rows(self, now: float) -> list[tuple[str, Queue, dict, dict]]:
        """(name, queue, sizes by state, event counts) of every queue, for per-queue metrics."""
        rows = []
        queues = self.queues
        for name, q in queues.items():
            st = q.stats(now)
            dlq = queues.get(admin.dead_letter_name(name, self.dead_letter_suffix) or "")
            rows.append((name, q, {"ready": st["ready"], "delayed": st["delayed"], "leased": st["in_flight"],
                                   "dead": len(dlq) if dlq is not None else 0}, q.counts))
        return rows

    def _totals(self, now: float) -> dict:
        total = {"size": 0, "ready": 0, "delayed": 0, "in_flight": 0, "waiters": 0}
        for q in self.queues.values():
            s = q.stats(now)
            for key in ("size", "ready", "delayed", "in_flight"):
                total[key] += s[key]
        total["waiters"] = sum(len(w) for w in self.waiters.values())
        total["queue_count"] = len(self.queues)
        ov = self.overflow
        if ov is not None:
            total["overflowed"] = sum(q.overflowed() for q in self.queues.values())
            total["overflow_bytes"] = ov.live_bytes
            total["memory_bytes"] = memory_bytes(ov.budget.held, total["size"])
        return total

    def held_bytes(self) -> int:
        """What this service holds for its messages (its `memory_bytes`); a service with overflow."""
        assert self.overflow is not None
        return memory_bytes(self.overflow.budget.held, sum(map(len, self.queues.values())))

    # ----------------------------------------------------------------------------- modes
    def set_mode(self, accepting: bool) -> None:
        """A new mode of the node (the coordinator's MODE): whether this worker serves queue
        requests (its node leads). A fence ends with it."""
        self.accepting = accepting
        self.fenced = False

    def fence(self) -> None:
        """Decide nothing more in this mode: the node is handing leadership over. Requests are
        refused, no long poll is served, nothing pushed, no lease swept; but parked long polls
        and subscriptions are kept, not ended, since the hand-off may fail: the next mode
        serves them again if the node goes on leading, or ends them if it does not."""
        self.accepting = False
        self.fenced = True

    # ----------------------------------------------------------------------------- time
    def tick(self, now: float) -> None:
        """Serve or time out parked long polls, and sweep leases that ran past their ttl. A
        worker that is not accepting (its node does not lead) decides nothing: its polls are
        answered empty and its subscriptions end, and so do they while the node shuts down
        (draining); while it is fenced they wait (only a poll's own deadline answers it)."""
        compaction = self.compaction
        if compaction is not None and compaction.step(self.queues, now) and self.journal is None:
            self.overflow.trimmed(self.seq, self.seq)  # the emptied segment goes (a journal's trim does it)
        if not (self.waiters or self.subs) and now < self._next_sweep:
            return  # nothing parked, no sweep due: the common wake-up has nothing to do here
        made = len(self.records)
        self._tick(now)
        self.seq += len(self.records) - made

    def _tick(self, now: float) -> None:
        ending = self.draining or not (self.accepting or self.fenced)
        # Past undo_limit uncommitted records nothing more is decided until they commit.
        deciding = self.accepting and not (self.journal is not None and self._undo_full())
        if ending and self.waiters:
            for waiting in self.waiters.values():
                for w in waiting:
                    self.replies.append((w.origin, w.req_no, self._empty(w.request, w.count)))
            self.waiters.clear()
        if self.subs:
            if ending:
                self.subs.end_all()
            elif deciding:
                self.subs.pump_all(now)
        for name in list(self.waiters):
            q = self.queues.get(name)
            if q is not None and deciding:
                self._serve_waiters(q, now)
            waiting = self.waiters.get(name)
            if waiting and any(w.deadline <= now for w in waiting):
                keep: deque[Waiter] = deque()
                for w in waiting:
                    if w.deadline <= now:
                        self.replies.append((w.origin, w.req_no, self._empty(w.request, w.count)))
                    else:
                        keep.append(w)
                waiting = keep
                self.waiters[name] = keep
            if not waiting:
                self.waiters.pop(name, None)
        if now >= self._next_sweep:
            self._next_sweep = now + EXPIRE_SWEEP_INTERVAL
            if deciding:  # a follower's queues change only by the leader's records
                for q in list(self.queues.values()):  # a dead letter may make a queue
                    self.records.extend(q.expire_due(now))

    def next_deadline(self, now: float) -> float:
        """When tick() next has something to do."""
        soonest = self._next_sweep
        if self.subs and self.accepting:
            event = self.subs.next_event(now)
            if event is not None:
                soonest = min(soonest, event)
        for name, waiting in self.waiters.items():
            for w in waiting:
                soonest = min(soonest, w.deadline)
            q = self.queues.get(name)
            if q is not None and self.accepting:
                event = q.next_event(now)
                if event is not None:
                    soonest = min(soonest, event)
        return soonest

    def _serve_waiters(self, q: Queue, now: float) -> None:
        waiting = self.waiters.get(q.name)
        while waiting and q.has_ready(now):
            w = waiting.popleft()
            reply = self._deliver(q, w.request, w.count, now, w.lease, w.token, w.times)
            self.replies.append((w.origin, w.req_no, reply))
        if not waiting:
            self.waiters.pop(q.name, None)

    # ----------------------------------------------------------------------------- connections
    def cancel(self, conn: int) -> None:
        """Drop the long polls of this node's TCP connection `conn`, which closed."""
        gone = Origin(conn)
        self.subs.cancel(conn)
        for name in list(self.waiters):
            kept = deque(w for w in self.waiters[name] if w.origin != gone)
            if kept:
                self.waiters[name] = kept
            else:
                del self.waiters[name]

    def undeliver(self, queue: str, given: list[list[int]], now: float) -> None:
        """Take back messages whose consume reply could not be delivered ([msg_id,
        delivery_count] of that delivery each): leases are released and at-most-once messages
        restored, so they are not lost. A lease is released only if it is still that delivery's
        (not one a later consumer holds); an at-most-once message is restored only as that
        delivery left it (kept by _remember, here or, on a node that led then, from the consume
        record replayed: apply), and only if it is not stored again already."""
        q = self.queues.get(queue)
        if q is None or not self.accepting:
            return  # giving a message back is a write: only the leader decides it
        made = len(self.records)
        for msg_id, delivery_count in given:
            rec = q.release(msg_id, now, delivery_count=delivery_count)
            if rec is None:
                message = self._restorable.get((queue, msg_id))
                if message is not None and message.delivery_count == delivery_count and msg_id not in q:
                    self._unremember((queue, msg_id), before_record=True)
                    rec = q.restore(message)
            if rec is not None:
                self.records.append(rec)
        if queue in self.waiters:
            self._serve_waiters(q, now)
        self.seq += len(self.records) - made

    def _unremember(self, key: tuple[str, int], before_record: bool) -> None:
        """Forget one kept at-most-once delivery (it is being restored)."""
        message = self._restorable.pop(key, None)
        if message is not None and self.journal is not None:
            self.journal.beside(not before_record, undo.undo_forget, self._restorable,
                                [(key, message)], False)

    # ----------------------------------------------------------------------------- replicas
    def apply(self, record: Record) -> None:
        """Replay a change record decided by the leader. An at-most-once delivery is kept as the
        leader keeps it (_remember), so that this node restores the message if it leads when
        the message is given back; a restore, purge or deletion forgets it."""
        if type(record) is not Noop:
            self._apply(record)
            self.seq += 1
            if self.undo_limit is None and self.overflow is not None:  # never undone: emptied
                self.overflow.trimmed(self.seq, self.seq)  # segments go (a journal's trim does it)

    def apply_committed(self, records: Iterable[Record]) -> None:
        """apply each of `records`, which the log has committed (a follower's APPLY): they are
        never undone, so they get no undo entries (no before-image is built); the journal starts
        after them. Every record applied before them is committed too: it is earlier in the log."""
        journal = self.journal
        if journal is None:
            for record in records:
                self.apply(record)
            return
        journal.trim(self.seq)
        entries = self._journal_entries
        quiet: list[Queue] = []  # the queues whose hooks are off until the end
        self.journal = None  # the service's own hooks (side entries, delete_queue) are off
        queues = self.queues
        try:
            for record in records:
                kind = type(record)
                if kind is Noop:
                    continue
                if kind is not DeleteQueue:
                    q = queues.get(record.queue)
                    if q is None:
                        q = self._queue(record.queue)
                    if q.journal is not None:
                        q.journal = None
                        quiet.append(q)
                self._apply(record)
                self.seq += 1
        finally:
            for q in quiet:
                q.journal = entries
            self.journal = journal
            journal.base = self.seq
            if self.overflow is not None:  # nothing can be undone: emptied segments go
                self.overflow.trimmed(self.seq, self.seq)

    def _apply(self, record: Record) -> None:
        """apply, not counted in seq (a delete_queue this service decides is counted as a
        record it made)."""
        kind = type(record)
        if kind is DeleteQueue:
            q = self.queues.pop(record.queue, None)
            if q is not None:
                q._index.detach()
            if self.journal is not None:
                undo.deleted_queue(self.journal, record, q)
            self.forget_restorable(record.queue)
        elif kind is not Noop:
            q = self._queue(record.queue)
            taken = None
            if kind is Consume and record.lease is None and self.restore_cache:
                taken = q.stored(record.msg_id)  # deleted by the record
            q.apply(record)
            if taken is not None:
                self._remember(q.name, delivered_once(taken, record.delivery_count))
            elif kind is Restore:
                self._unremember((q.name, record.msg_id), before_record=False)
            elif kind is Purge:
                self.forget_restorable(q.name)

    # ----------------------------------------------------------------------------- undo
    def _undo_full(self) -> bool:
        """Whether the journal holds undo_limit records: writes wait for the commit."""
        return len(self.journal) >= self.undo_limit

    def rollback(self, keep_through: int) -> int:
        """Undo, newest first, every record numbered after `keep_through` (they were not
        committed); how many. Then seq is keep_through. If any was undone, parked long polls are
        answered empty and subscriptions end (as load_snapshot does); otherwise they are kept."""
        if self.journal is None:
            raise ValueError("rollback: this service keeps no undo journal")
        undone = self.journal.rollback(self, keep_through)
        self.seq = keep_through
        if self.overflow is not None:
            self.overflow.rolled_back(keep_through)
        cache = self._restorable
        while len(cache) > self.restore_cache:  # evictions of undone records came back too
            cache.popitem(last=False)
        if undone:
            self._end_waiting()
            self.subs.end_all()
        return undone

    def trim(self, committed_seq: int) -> None:
        """Records through `committed_seq` are committed: their undo entries go. A point before
        the journal's start (an older watermark) changes nothing."""
        if self.journal is not None and committed_seq > self.journal.base:
            self.journal.trim(committed_seq)
        if self.overflow is not None:
            self.overflow.trimmed(committed_seq, self.seq)

    def _end_waiting(self) -> None:
        """Answer every parked long poll empty."""
        for waiting in self.waiters.values():
            for w in waiting:
                self.replies.append((w.origin, w.req_no, self._empty(w.request, w.count)))
        self.waiters.clear()

    def snapshot(self) -> dict:
        """The state of every queue, JSON-able."""
        return {name: q.snapshot() for name, q in self.queues.items()}

    def snapshot_frames(self, refs: bool = False) -> Iterator[Frame]:
        """The state of every queue as v2 snapshot frames (Queue.snapshot_frames), built as
        they are taken; with `refs`, bodies on disk as their references (REFS frames)."""
        for q in self.queues.values():
            yield from q.snapshot_frames(refs)

    def load_snapshot(self, state: dict) -> None:
        """Replace all queues with a snapshot's. Parked long polls are answered empty."""
        self._replace({name: self.queue_class.from_snapshot(s) for name, s in state.items()})

    def load_frames(self, frames: Iterable[Frame], keep: Callable[[str], bool] | None = None,
                    now: float | None = None) -> None:
        """Replace all queues with those of v2 snapshot frames (snapshot_frames), only those
        whose name `keep` accepts (None: all), as load_snapshot does (`now`: Queue.load_frames').
        ValueError when the frames are malformed (the queues are then unchanged)."""
        queues = {}
        seen = set()
        for name, group in groupby(frames, key=itemgetter(1)):
            if name in seen:
                raise ValueError(f"queue {name!r} twice in a snapshot")
            seen.add(name)
            if keep is None or keep(name):
                queues[name] = self.queue_class.load_frames(name, group, now)
        self._replace(queues)

    def _replace(self, queues: dict[str, Queue]) -> None:
        """Make `queues` this service's. The record count starts again at 0, with an empty
        journal."""
        self.seq = 0
        if self.journal is not None:
            self.journal = undo.UndoJournal()
            self._journal_entries = self.journal.entries
        if self.overflow is not None:
            self.overflow.reset()
            if self.compaction is not None:
                self.compaction.stop()
        self.queues = queues
        for q in self.queues.values():
            self._configure(q)
        self._end_waiting()
        self._restorable.clear()
        self.subs.end_all()


# Actions that change nothing: served while the undo journal is full.
_READS = frozenset((p.PEEK, p.LOCAL_PEEK))


def _found_nothing(reply: dict | None) -> bool:
    """Whether a consume reply hands out nothing (an empty consume)."""
    return (reply is not None and reply.get("code") == p.CODE_OK and "msg_id" not in reply
            and not reply.get("messages"))


def _count(record: Consume | Confirm | Release | None) -> int:
    """How many messages a record changed (0: no record)."""
    return 0 if record is None else count(record)


def _ids(record: Confirm | None) -> list[int]:
    """The ids of the messages a record changed, in its order (none: no record)."""
    if record is None:
        return []
    return [record.msg_id] if record.msg_ids is None else list(record.msg_ids)


def _empty_stats(max_size: int) -> dict:
    return {"size": 0, "ready": 0, "delayed": 0, "in_flight": 0, "max_id": 0, "max_size": max_size}
