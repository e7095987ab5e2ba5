"""One queue: the message index, its delayed / ready / leased orderings, leases and ttl.

Pure logic: no I/O and no clock reads; the time (`now`, float unix seconds) is always an argument.
Every change is a record (a type of protocol/records.py). Leader-side methods
build the record and then `apply` it, the same code a replica runs, so the two cannot diverge.

One file, over 600 lines, because Queue is one invariant: every stored message is in exactly one
of its orderings, and each leader-side method and its record's `apply` must keep that together.
Split by feature (leases, dead letters, dedupe), each part would reach into the others' orderings.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, groupby, islice, repeat
from operator import gt, itemgetter, le, lt, ne

from sortedcontainers import SortedDict

from queue_server.protocol.records import (
    Confirm, Consume, DeadLetter, DlqReplay, Expire, Pause, Produce, Purge, Record, Release, Restore,
    count,
)
from queue_server.protocol.snapshot_frames import (
    QUEUE, Frame, Rows, columns_of, queue_body, read_queue, rows_frames,
)
from queue_server.workers import undo
from queue_server.workers.ordering import Ordering
from queue_server.workers.overflow import BodyUnreadable
from queue_server.workers.store import BITS as _BITS, JOINED, MASK as _MASK, Message, MessageStore, message

MAX_MSG_ID = 2**63 - 1
# How many idempotent produces (producer, sequence) a queue remembers, oldest forgotten first.
DEDUPE_WINDOW = 10_000

_INF = float("inf")


class QueueFull(Exception):
    """The queue has no room for the message(s); nothing was changed."""


# Positions in a state tuple (Message._state).
_READY, _TTL, _RETRY, _PRIORITY, _DELIVERY_COUNT, _LEASE, _TOKEN, _EXTRA = range(8)
_get_ready = itemgetter(_READY)
_get_priority = itemgetter(_PRIORITY)
_get_lease = itemgetter(_LEASE)
_get_token = itemgetter(_TOKEN)
_get_delivery_count = itemgetter(_DELIVERY_COUNT)
_NOTHING = object()
_new_message = object.__new__

# Why a message became a dead letter (a dead_letter record's "reason").
DEAD_MAX_DELIVERIES = "max_deliveries"
DEAD_TTL = "ttl"
DEAD_UNREADABLE = "body unreadable"  # its body on disk failed its check (workers/overflow.py)
# The states peek() can look at.
PEEK_STATES = ("ready", "delayed", "leased")
# Per-queue event counters (Queue.counts keys), counted as records are applied.
COUNTERS = ("produced", "consumed", "confirmed", "expired", "dead_lettered")


class Queue:
    """One queue's messages, ordered for delivery, with leases, retries and ttl.

    Each stored message is in exactly one ordering:
    delayed ``(0, ready, msg_id)``, ready ``(-priority, ready, msg_id)`` (both an `Ordering`,
    workers/ordering.py) or leased (by lease deadline, then msg_id).
    A delayed message whose time has come may sit in `delayed` until the next consume or
    expire_due; every query accounts for that, so where a message sits is never observable.

    Two pieces of state besides the messages are replicated with them: lease tokens (which
    leased messages a token holds; carried by consume records) and the dedupe window of
    idempotent produces (carried by produce records).
    """

    __slots__ = ("name", "max_size", "next_id", "dedupe_window", "_index", "_delayed", "_ready",
                 "_leased", "_n_leased", "_tokens", "_dedupe", "paused", "max_deliveries",
                 "dlq_name", "_dead_letters", "counts", "_last_state", "journal")

    def __init__(
        self, name: str, max_size: int, next_id: int = 1, dedupe_window: int = DEDUPE_WINDOW
    ) -> None:
        if not 1 <= next_id <= MAX_MSG_ID + 1:
            raise ValueError(f"next_id out of range: {next_id}")
        self.name = name
        self.max_size = max_size
        self.next_id = next_id
        self.dedupe_window = dedupe_window
        self._index = MessageStore()  # msg_id -> payload and state (workers/store.py)
        self._delayed = Ordering()  # one group, 0
        self._ready = Ordering()
        # Leased messages by lease deadline: {deadline: {msg_id: None}}. A batch leased together
        # shares one deadline, so it is one entry here, not one per message.
        self._leased: SortedDict = SortedDict()
        self._n_leased = 0
        self._tokens: SortedDict = SortedDict()  # token -> set of msg_ids leased under it
        self._dedupe: OrderedDict[tuple[str, int], list[int]] = OrderedDict()  # -> [first id, count]
        self.paused = False  # replicated: while paused, consume delivers nothing
        # Dead letters (see dead_letters_to): the leader's policy, and how any copy finds the
        # queue a dead_letter record names.
        self.max_deliveries = 0
        self.dlq_name: str | None = None
        self._dead_letters: Callable[[str], Queue] | None = None
        self.counts = dict.fromkeys(COUNTERS, 0)
        self._last_state: tuple | None = None  # the state of the message stored last (_stored)
        # The worker's undo journal (workers/undo.py), shared by its queues; None: not kept.
        self.journal: deque | None = None

    def dead_letters_to(
        self, dlq_name: str | None, lookup: Callable[[str], Queue], max_deliveries: int = 0
    ) -> None:
        """Set the dead-letter policy: messages that reach `max_deliveries` (0: unlimited; a
        produce's own max_deliveries wins) or whose lease outlives their ttl move to the queue
        `dlq_name` (None: they are removed, as expired). `lookup(name)` returns (creating) the
        queue a dead_letter or dlq_replay record names; replicas need it whatever their policy."""
        self.dlq_name = dlq_name
        self._dead_letters = lookup
        self.max_deliveries = max_deliveries

    def __len__(self) -> int:
        """Stored messages: delayed + ready + leased."""
        return self._index.n

    def stored(self, msg_id: int) -> Message | None:
        """The stored message `msg_id` (a copy), or None."""
        return self._index.get(msg_id)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._index

    def free(self) -> int:
        """Room left (0 when full; a restore may overfill the queue)."""
        free = self.max_size - self._index.n
        return free if free > 0 else 0

    # ------------------------------------------------------------------ leader side

    def produce(
        self,
        data: str,
        ready: float,
        ttl: float,
        retry: float,
        priority: int,
        now: float,
        producer: str | None = None,
        sequence: int | None = None,
        max_deliveries: int | None = None,
    ) -> Produce:
        """Store a new message; return its produce record. Raises QueueFull, OverflowError.

        With `producer` and `sequence` the produce is remembered in the dedupe window (see
        produced()); a key already remembered raises ValueError. `max_deliveries` replaces the
        queue's for this message (0: unlimited).
        """
        return self.produce_many([(data, ready, ttl, retry, priority)], now, producer, sequence,
                                 max_deliveries)[0]

    def produce_many(
        self,
        items: list[tuple[str, float, float, float, int]],
        now: float,
        producer: str | None = None,
        sequence: int | None = None,
        max_deliveries: int | None = None,
    ) -> list[Produce]:
        """Store (data, ready, ttl, retry, priority) items, all or none; return their records.

        The items get consecutive msg_ids. With `producer` and `sequence` the batch is
        remembered in the dedupe window; a key already remembered raises ValueError.
        `max_deliveries` (not None) replaces the queue's for these messages.
        """
        if self._index.n + len(items) > self.max_size:
            raise QueueFull(self.name)
        first = self.next_id
        if items and first + len(items) - 1 > MAX_MSG_ID:
            raise OverflowError(f"message ids exhausted in queue {self.name!r}")
        if producer is not None and (producer, sequence) in self._dedupe:
            raise ValueError(f"produce {producer!r}/{sequence} already stored in {self.name!r}")
        name = self.name
        # Every record is built before any is applied, so a malformed item changes nothing.
        records = [
            Produce(queue=name, msg_id=first + i, ready=ready, ttl=ttl, retry=retry,
                    priority=priority, data=data, delivery_count=0, producer=producer,
                    sequence=sequence, max_deliveries=max_deliveries)
            for i, (data, ready, ttl, retry, priority) in enumerate(items)
        ]
        self._apply_produces(records, now)
        return records

    def consume(
        self, now: float, count: int = 1, lease: float | None = None, token: str | None = None
    ) -> tuple[list[Message], list[Record]]:
        """Deliver up to `count` ready messages, best first.

        `lease` (seconds) leases every delivered message until now + lease, at-most-once ones
        included, instead of each message's own retry. `token` binds the leased messages to it;
        if the token already holds messages, nothing new is delivered: those messages are
        returned again (msg_id order, delivery_count unchanged; with `lease` their leases are
        renewed), see held().

        Returns the delivered messages (their state at delivery, delivery_count already
        incremented; never aliased with stored state) and the records: first those of leases
        that ended by `now` (release / expire, as in expire_due), then one consume per message.
        """
        records: list[Record] = []
        if self._delayed or self._leased:
            self._settle(now, records)
        if self.paused:
            return [], records
        if token is not None and token in self._tokens:
            return self._redeliver(token, now, lease, records), records
        while True:
            try:
                return self._deliver(now, count, lease, token, records), records
            except BodyUnreadable as exc:  # nothing was changed for it: end that message, then again
                self._unreadable(exc, now, count, records)

    def _deliver(self, now: float, count: int, lease: float | None, token: str | None,
                 records: list[Record]) -> list[Message]:
        """consume() of the ready messages: the delivered ones; their records go to `records`.
        BodyUnreadable (before any change) when a body on disk does not read back."""
        ready = self._ready
        if not ready or count <= 0:
            return []
        if count == 1:  # the common request: no batch to build
            i = ready.head()[2]
            c = self._index.chunks.get(i >> _BITS)  # MessageStore.get inlined: the hottest read
            if c is None:
                m = self._index.get(i)
            else:
                m = _new_message(Message)
                m.msg_id = i
                p = i & _MASK
                d = c.data[p]
                if d is JOINED:  # Chunk.slot, inlined
                    offs, base = c.offs, c.base
                    d = c.blob[offs[p] - base:offs[p + 1] - base]
                elif type(d) is not str:  # on disk (workers/overflow.py)
                    d = self._index.body(c, p)
                m.data = d
                m._state = c.states[p]
            s = m._state
            delivery_count = s[_DELIVERY_COUNT] + 1
            if lease is not None:
                until = now + lease
                record = Consume(queue=self.name, msg_ids=[m.msg_id], lease=until, token=token,
                                 delivery_counts=[delivery_count])
            elif s[_RETRY] > 0:
                until = now + s[_RETRY]
                record = Consume(queue=self.name, msg_id=m.msg_id, lease=until,
                                 delivery_count=delivery_count, token=token)
            else:
                until = token = None
                record = Consume(queue=self.name, msg_id=m.msg_id, lease=None,
                                 delivery_count=delivery_count)
            # What _apply_consume does with this record, the state read once.
            m._state = self._lease(m.msg_id, until, delivery_count, token, s, data=m.data)
            records.append(record)
            return [m]
        # The messages as they are now (copies): each gets the state its consume leaves it with.
        delivered = self._index.get_many([key[2] for key in ready.first(count)])
        if lease is not None:
            # One record for the whole batch: every message gets the same lease and token.
            record = Consume(queue=self.name, msg_ids=[m.msg_id for m in delivered],
                             lease=now + lease, token=token,
                             delivery_counts=[m._state[_DELIVERY_COUNT] + 1 for m in delivered])
            states = self._apply_consume(record, now, [m._state for m in delivered])
            records.append(record)
        else:
            name = self.name
            # One record per message: each is leased for its own retry, or deleted (at most once).
            taken = [
                Consume(queue=name, msg_id=m.msg_id, lease=now + s[_RETRY],
                        delivery_count=s[_DELIVERY_COUNT] + 1, token=token)
                if (s := m._state)[_RETRY] > 0 else
                Consume(queue=name, msg_id=m.msg_id, lease=None,
                        delivery_count=s[_DELIVERY_COUNT] + 1)
                for m in delivered
            ]
            states = self._apply_consumes(taken, now, [m._state for m in delivered])
            records += taken
        for m, state in zip(delivered, states):
            m._state = state
        return delivered

    def _unreadable(self, exc: BodyUnreadable, now: float, count: int, records: list[Record]) -> None:
        """The body of one of the next `count` ready messages failed its check on read (a torn
        or overwritten segment): each such message goes the way of a dead message, reason
        DEAD_UNREADABLE (to the dead-letter queue, else removed), never delivered with a wrong
        body; the overflow counts them by segment (the worker logs each segment once)."""
        index = self._index
        ended = False
        for msg_id in [key[2] for key in self._ready.first(count)]:
            try:
                index.get(msg_id)
            except BodyUnreadable as torn:
                record = self._end_record(msg_id, DEAD_UNREADABLE, now)
                self.apply(record, now)
                records.append(record)
                index.ov.torn[torn.seg] = index.ov.torn.get(torn.seg, 0) + 1
                ended = True
        if not ended:
            raise exc

    def _redeliver(
        self, token: str, now: float, lease: float | None, records: list[Record]
    ) -> list[Message]:
        """The messages `token` holds, their leases renewed to now + lease when `lease` is given."""
        state = self._index.state
        ids = sorted(self._tokens[token])
        if lease is not None:
            record = Consume(queue=self.name, msg_ids=ids, lease=now + lease, token=token,
                             delivery_counts=[state(i)[_DELIVERY_COUNT] for i in ids])
            self.apply(record)
            records.append(record)
        get = self._index.get
        return [get(i) for i in ids]

    def confirm(
        self, msg_id: int, token: str | None = None, delivery_count: int | None = None
    ) -> Confirm | None:
        """Delete a stored message (leased or not); its confirm record, or None if not stored.

        Guards: with `token`, only a message leased under that token; with `delivery_count`,
        only if the message has not been delivered again since (None when a guard fails).
        """
        s = self._index.state(msg_id)
        if s is None:
            return None
        if (token is not None or delivery_count is not None) and not _passes(s, token, delivery_count):
            return None
        record = Confirm(queue=self.name, msg_id=msg_id)
        self.apply(record)
        return record

    def release(
        self, msg_id: int, now: float, token: str | None = None, delivery_count: int | None = None
    ) -> Release | None:
        """Give a lease back: the message is ready again at `now`, delivery_count unchanged.

        Returns the release record, or None if the message is not leased (or a guard fails,
        as for confirm).
        """
        s = self._index.state(msg_id)
        if s is None or s[_LEASE] is None or not _passes(s, token, delivery_count):
            return None
        record = Release(queue=self.name, msg_id=msg_id, ready=now,
                         delivery_count=s[_DELIVERY_COUNT])
        self.apply(record, now)
        return record

    def extend(
        self,
        msg_id: int,
        lease_until: float,
        token: str | None = None,
        delivery_count: int | None = None,
    ) -> Consume | None:
        """Move a lease deadline (the token binding is kept); a consume record with the new
        lease, or None if not leased (or a guard fails, as for confirm)."""
        s = self._index.state(msg_id)
        if s is None or s[_LEASE] is None or not _passes(s, token, delivery_count):
            return None
        record = self._lease_record(msg_id, s, lease_until)
        self.apply(record)
        return record

    def confirm_many(self, targets: Iterable[tuple[int, str | None, int | None]]) -> Confirm | None:
        """Confirm (msg_id, token guard, delivery_count guard) targets as in confirm(); one
        record for all that pass (single form when one does), or None if none does."""
        targets = list(targets)
        if len(targets) == 1:  # what a client's confirm of one message asks for
            return self.confirm(*targets[0])
        states = self._index.states([t[0] for t in targets])
        ids = [t[0] for t, s in zip(targets, states)
               if s is not None and ((t[1] is None and t[2] is None) or _passes(s, t[1], t[2]))]
        ids = list(dict.fromkeys(ids))
        if not ids:
            return None
        if len(ids) == 1:
            record = Confirm(queue=self.name, msg_id=ids[0])
        else:
            record = Confirm(queue=self.name, msg_ids=ids)
        self.apply(record)
        return record

    def release_many(
        self, targets: Iterable[tuple[int, str | None, int | None]], now: float
    ) -> Release | None:
        """Release targets as in release(); one record for all leases given back, or None."""
        targets = list(targets)
        if len(targets) == 1:  # what a client's release of one message asks for
            msg_id, token, delivery_count = targets[0]
            return self.release(msg_id, now, token, delivery_count)
        state = self._index.state
        ids = []
        for msg_id, token, delivery_count in targets:
            s = state(msg_id)
            if s is not None and s[_LEASE] is not None and _passes(s, token, delivery_count):
                ids.append(msg_id)
        ids = list(dict.fromkeys(ids))
        if len(ids) <= 1:
            return self.release(ids[0], now) if ids else None
        record = Release(queue=self.name, msg_ids=ids, ready=now)
        self.apply(record, now)
        return record

    def extend_many(
        self, targets: Iterable[tuple[int, str | None, int | None]], lease_until: float
    ) -> list[Consume]:
        """Extend targets as in extend(); one record per token among the leases moved."""
        targets = list(targets)
        if len(targets) == 1:  # what a client's extend of one message asks for
            msg_id, token, delivery_count = targets[0]
            record = self.extend(msg_id, lease_until, token, delivery_count)
            return [record] if record is not None else []
        state = self._index.state
        by_token: dict[str | None, dict[int, None]] = {}
        for msg_id, token, delivery_count in targets:
            s = state(msg_id)
            if s is not None and s[_LEASE] is not None and _passes(s, token, delivery_count):
                by_token.setdefault(s[_TOKEN], {})[msg_id] = None
        records = []
        for token, chosen in by_token.items():
            ids = list(chosen)
            if len(ids) == 1:
                record = self._lease_record(ids[0], state(ids[0]), lease_until)
            else:
                record = Consume(queue=self.name, msg_ids=ids, lease=lease_until, token=token,
                                 delivery_counts=[state(i)[_DELIVERY_COUNT] for i in ids])
            self.apply(record)
            records.append(record)
        return records

    def _lease_record(self, msg_id: int, s: tuple, lease_until: float) -> Consume:
        return Consume(queue=self.name, msg_id=msg_id, lease=lease_until,
                       delivery_count=s[_DELIVERY_COUNT], token=s[_TOKEN])

    def restore(self, message: Message) -> Restore:
        """Put back an at-most-once message that never reached a client; its restore record.

        Same msg_id, ready time and own max_deliveries, delivery_count one lower (not below 0). A restore is not
        refused when the queue is full: the message was stored a moment ago and must not be lost.
        Raises ValueError if the id is still stored.
        """
        if message.msg_id in self._index:
            raise ValueError(f"msg_id {message.msg_id} is still stored")
        record = Restore(queue=self.name, msg_id=message.msg_id, ready=message.ready,
                         ttl=message.ttl, retry=message.retry, priority=message.priority,
                         data=message.data, delivery_count=max(0, message.delivery_count - 1),
                         max_deliveries=(message.extra or {}).get("max_deliveries"))
        self.apply(record)
        return record

    def set_paused(self, paused: bool) -> Pause | None:
        """Pause (consumes deliver nothing) or resume the queue; the record, or None if it
        already was so."""
        if self.paused == paused:
            return None
        record = Pause(queue=self.name, paused=paused)
        self.apply(record)
        return record

    def purge(self) -> Purge | None:
        """Delete every stored message (ids are not reused; tokens are forgotten); the purge
        record with the count, or None if the queue holds nothing."""
        if not self._index:
            return None
        record = Purge(queue=self.name, count=self._index.n)
        self.apply(record)
        return record

    def replay_dead(self, dlq: Queue, now: float, min_ttl: float) -> DlqReplay | None:
        """Move the unleased messages of `dlq` (this queue's dead letters) back here, as many as
        fit, oldest first: ready at `now`, delivery_count 0, their old retry and max_deliveries,
        ttl the old one or `min_ttl`, whichever is later. The dlq_replay record, or None."""
        room = self.free()
        moves = []
        new_id = self.next_id
        state = dlq._index.state
        for dead_id in dlq._index:
            if len(moves) >= room:
                break
            s = state(dead_id)
            if s[_LEASE] is not None:
                continue
            dead = (s[_EXTRA] or {}).get("dead") or {}
            moves.append((dead_id, new_id, max(dead.get("ttl", s[_TTL]), min_ttl)))
            new_id += 1
        if not moves:
            return None
        record = DlqReplay(queue=self.name, dlq=dlq.name, moves=moves, ready=now)
        self.apply(record, now)
        return record

    def expire_due(self, now: float) -> list[Record]:
        """Settle every lease that ended by `now`; return the records.

        A lease that ended at or after the message's ttl removes it ('expire'); any other ended
        lease makes the message ready again at its lease deadline ('release').
        """
        records: list[Record] = []
        self._settle(now, records)
        return records

    # ------------------------------------------------------------------ queries

    def next_event(self, now: float) -> float | None:
        """Earliest time after `now` when a delayed message becomes ready or a lease ends.

        None if there is none. What is already due (<= now) is reported by has_ready() and
        handled by expire_due(now), not here.
        """
        t = None
        delayed = self._delayed
        if delayed:
            head = delayed.head()[1]
            if head > now:
                t = head
            else:
                later = delayed.first(1, (0, now, _INF))
                if later:
                    t = later[0][1]
        leased = self._leased
        if leased:
            i = leased.bisect_right(now)
            head = leased.keys()[i] if i < len(leased) else None
            if head is not None and (t is None or head < t):
                t = head
        return t

    def has_ready(self, now: float) -> bool:
        """Whether a consume at `now` would deliver something."""
        if self.paused:
            return False
        if self._ready:
            return True
        delayed = self._delayed
        if delayed and delayed.head()[1] <= now:
            return True
        return self._due_requeues(now) > 0 if self._leased else False

    def held(self, token: str) -> list[int]:
        """msg_ids leased under `token`, ascending (empty if the token holds none)."""
        ids = self._tokens.get(token)
        return sorted(ids) if ids else []

    def held_at(self, token: str, now: float) -> list[int]:
        """msg_ids a consume at `now` would find leased under `token` (those whose lease has not
        ended by `now`), ascending; nothing is changed."""
        ids = self._tokens.get(token)
        if not ids:
            return []
        state = self._index.state
        return sorted(i for i in ids if state(i)[_LEASE] > now)

    def peek(
        self, now: float, count: int = 1, lease: float | None = None, token: str | None = None
    ) -> list[Message]:
        """The messages consume(now, count, lease, token) would return, exactly as it would
        return them (delivery_count, lease and token as after that consume). Nothing is changed:
        a caller can check what a consume would deliver before deciding to make it. A message
        whose body on disk does not read back is left out (the consume that meets it ends it)."""
        if self.paused:
            return []
        readable = self._readable
        if token is not None:
            ids = self.held_at(token, now)
            if ids:
                held = [(i, m) for i in ids if (m := readable(i)) is not None]
                if lease is None:
                    return [m for _, m in held]
                until = now + lease
                return [message(i, m.data, (*m._state[:_LEASE], until, *m._state[_TOKEN:])) for i, m in held]
        if count <= 0:
            return []
        out = []
        for _, ready, i in self._ready_keys(now, count):
            m = readable(i)
            if m is None:
                continue
            s = m._state
            retry = s[_RETRY] if lease is None else lease
            until, held_by = (now + retry, token) if retry > 0 else (None, None)
            out.append(message(i, m.data, (ready, *s[_TTL:_DELIVERY_COUNT], s[_DELIVERY_COUNT] + 1,
                                            until, held_by, s[_EXTRA])))
        return out

    def _readable(self, msg_id: int) -> Message | None:
        """The stored message, or None if its body on disk does not read back."""
        try:
            return self._index[msg_id]
        except BodyUnreadable:
            return None

    def _ready_keys(self, now: float, count: int, after: tuple = ()) -> list[tuple]:
        """The first `count` keys (-priority, ready, msg_id) after `after` that the ready
        ordering would hold after settling at `now`: the ready ones, the due delayed ones and the
        leases ended by `now` that end in a requeue (ready again at their lease deadline)."""
        state = self._index.state
        keys = self._ready.first(count, after or None)
        delayed = self._delayed
        if delayed and delayed.head()[1] <= now:
            keys.extend((-state(i)[_PRIORITY], t, i) for _, t, i in delayed.through(0, now))
        leased = self._leased
        if leased and leased.keys()[0] <= now:
            for deadline in leased.irange(maximum=now):
                for i in leased[deadline]:
                    s = state(i)
                    if self._ending(s, deadline) is None:
                        keys.append((-s[_PRIORITY], deadline, i))
        if after:
            keys = [k for k in keys if k > after]
        return heapq.nsmallest(count, keys)

    def look(
        self, now: float, state: str = "ready", count: int = 1, after: list | None = None
    ) -> list[tuple[list, Message]]:
        """Up to `count` messages in `state` (one of PEEK_STATES) as they are at `now`, in the
        order they leave that state: ready ones in delivery order (also when paused), delayed ones
        by ready time, leased ones by lease deadline. Each comes with its cursor (a JSON-able
        list): `after` = a cursor continues after that message. Copies; nothing is changed. A
        message whose body on disk does not read back is left out (the consume that meets it
        ends it)."""
        readable = self._readable
        out: list[tuple[list, Message]] = []
        key = tuple(after) if after else ()
        if state == "ready":
            for priority, ready, i in self._ready_keys(now, count, key):
                if (m := readable(i)) is None:
                    continue
                s = m._state  # a requeue, as it will be: ready at its lease's end, unleased
                out.append(([priority, ready, i],
                            message(i, m.data, (ready, *s[_TTL:_LEASE], None, None, s[_EXTRA]))))
        elif state == "delayed":
            start = max(key, (now, _INF)) if key else (now, _INF)
            for _, ready, i in self._delayed.first(count, (0, *start)):
                if (m := readable(i)) is not None:
                    out.append(([ready, i], m))
        elif state == "leased":
            leased = self._leased
            low = max(key[0], now) if key else now
            for deadline in leased.irange(minimum=low):
                if deadline <= now:
                    continue
                for i in sorted(leased[deadline]):
                    if key and (deadline, i) <= key:
                        continue
                    if len(out) >= count:
                        return out
                    if (m := readable(i)) is not None:
                        out.append(([deadline, i], m))
        else:
            raise ValueError(f"unknown state {state!r}")
        return out

    def oldest(self, count: int, after: int = 0) -> list[tuple[list, Message]]:
        """Up to `count` stored messages with msg_id > `after` in msg_id order, whatever their
        state, each with its cursor [msg_id] (copies); one whose body on disk does not read back
        is left out."""
        index = self._index
        ids = islice((i for i in index if i > after) if after else index, count)
        return [([i], m) for i in ids if (m := self._readable(i)) is not None]

    def leased_as(self, msg_id: int, delivery_count: int) -> bool:
        """Whether the message is still leased by its delivery number `delivery_count`."""
        s = self._index.state(msg_id)
        return s is not None and s[_LEASE] is not None and s[_DELIVERY_COUNT] == delivery_count

    def token_of(self, msg_id: int) -> str | None:
        """The token a message is leased under, or None."""
        s = self._index.state(msg_id)
        return None if s is None else s[_TOKEN]

    def tokens(self, prefix: str = "") -> list[str]:
        """Tokens holding messages whose name starts with `prefix`, in sorted order."""
        tokens = self._tokens
        if not prefix:
            return list(tokens)
        found = []
        for token in tokens.irange(minimum=prefix):
            if not token.startswith(prefix):
                break
            found.append(token)
        return found

    def produced(self, producer: str, sequence: int) -> tuple[int, int] | None:
        """(first msg_id, count) of the idempotent produce (producer, sequence), if remembered."""
        entry = self._dedupe.get((producer, sequence))
        return None if entry is None else (entry[0], entry[1])

    def overflowed(self) -> int:
        """Messages whose body is on disk (workers/overflow.py)."""
        return self._index.spilled

    def stats(self, now: float) -> dict:
        """Counts as a consume at `now` would see them.

        Keys: size, ready, delayed, in_flight (includes ended leases awaiting expiry), max_id (last
        id handed out, 0 if none), max_size.
        """
        delayed = self._delayed
        due = 0
        if delayed and delayed.head()[1] <= now:
            due = delayed.count_through(0, now)
        requeues = self._due_requeues(now) if self._leased else 0
        return {
            "size": self._index.n,
            "ready": len(self._ready) + due + requeues,
            "delayed": len(delayed) - due,
            "in_flight": self._n_leased - requeues,
            "max_id": self.next_id - 1,
            "max_size": self.max_size,
        }

    # ------------------------------------------------------------------ replica side

    def apply(self, record: Record, now: float | None = None) -> None:
        """Replay one change record exactly as the leader decided it.

        `now` is only passed by the leader's own methods: it lets a message that is already
        ready skip the delayed ordering. The stored state is the same with or without it.
        Raises KeyError / ValueError for a record that does not fit the state (out of sync).
        """
        try:
            handler = _APPLY[type(record)]
        except KeyError:
            raise ValueError(f"not a queue record: {record!r}") from None
        handler(self, record, now)

    def _apply_produce(self, record: Produce, now: float | None) -> None:
        msg_id = record.msg_id
        journal = self.journal
        if journal is not None:
            if msg_id == self.next_id and record.producer is None:
                journal.append(record)  # the common case: undone from the record alone
            else:
                undo.produced(self, record)
        limit = record.max_deliveries
        state = self._stored((
            record.ready, record.ttl, record.retry, record.priority, record.delivery_count, None,
            None, None if limit is None else {"max_deliveries": limit}))
        if type(record) is Produce:
            self.counts["produced"] += 1
        self._insert(msg_id, record.data, state, now)
        producer = record.producer
        if producer is not None:
            self._remember(producer, record.sequence, msg_id)

    def _apply_produces(self, records: list[Produce], now: float | None) -> None:
        """Apply produce records as apply would, one by one; stored at once when they are a
        leader's batch (consecutive new msg_ids from next_id)."""
        if len(records) <= 1:
            if records:
                self._apply_produce(records[0], now)
            return
        first = records[0].msg_id
        journal = self.journal
        if (first != self.next_id or records[-1].msg_id != first + len(records) - 1
                or journal is not None and records[0].producer is not None):  # one producer: produce_many's
            for record in records:
                self._apply_produce(record, now)
            return
        if journal is not None:
            journal.extend(records)  # consecutive from next_id, no producer: undone from each
        stored = self._stored
        states = []
        for r in records:
            limit = r.max_deliveries
            states.append(stored((r.ready, r.ttl, r.retry, r.priority, r.delivery_count, None, None,
                                  None if limit is None else {"max_deliveries": limit})))
        self._index.add_run(first, [r.data for r in records], states)
        ready_keys = []
        delayed_keys = []
        for r in records:
            t = r.ready
            if now is not None and t <= now:
                ready_keys.append((-r.priority, t, r.msg_id))
            else:
                delayed_keys.append((0, t, r.msg_id))
        if ready_keys:
            self._ready.update(ready_keys)
        if delayed_keys:
            self._delayed.update(delayed_keys)
        self.next_id = first + len(records)
        self.counts["produced"] += sum(1 for r in records if type(r) is Produce)
        for r in records:
            if r.producer is not None:
                self._remember(r.producer, r.sequence, r.msg_id)

    def _stored(self, state: tuple) -> tuple:
        """`state`, or the state of the message stored last when equal: messages stored one
        after another with the same settings share one state tuple."""
        last = self._last_state
        if state == last:
            return last
        self._last_state = state
        return state

    def _remember(self, producer: str, sequence: int, msg_id: int) -> None:
        """Add msg_id to the dedupe entry of (producer, sequence); the oldest entries go first."""
        key = (producer, sequence)
        dedupe = self._dedupe
        entry = dedupe.get(key)
        if entry is None:
            dedupe[key] = [msg_id, 1]
            while len(dedupe) > self.dedupe_window:
                dedupe.popitem(last=False)
        elif msg_id == entry[0] + entry[1]:
            entry[1] += 1
        else:
            raise ValueError(f"produce {producer!r}/{sequence}: msg_id {msg_id} not consecutive")

    def _apply_consume(
        self, record: Consume, now: float | None, states: list[tuple] | None = None
    ) -> list[tuple]:
        """Apply a consume record; the states its messages are left with. `states`: theirs
        now, when the caller has read them."""
        ids = record.msg_ids
        if ids is None:
            return [self._lease(record.msg_id, record.lease, record.delivery_count, record.token,
                                states[0] if states else None)]
        # Consume itself refuses a list form without a lease or one delivery_count per id.
        n = len(ids)
        if n == 1:
            return [self._lease(ids[0], record.lease, record.delivery_counts[0], record.token,
                                states[0] if states else None)]
        if len(set(ids)) != n:
            raise ValueError("a consume record needs distinct msg_ids")
        journal = self.journal
        if journal is not None:  # one record: one entry, the states before
            before = states if states is not None else self._states(ids)
            journal.append((undo.undo_restate, self, record, ids, list(before), "consumed",
                            self.counts["consumed"]))
        return self._consume_ids(ids, record.delivery_counts, (record.lease,) * n,
                                 (record.token,) * n, states, journal_each=False)

    def _apply_consumes(
        self, records: list[Consume], now: float | None, states: list[tuple] | None = None
    ) -> list[tuple]:
        """Apply single-form consume records of distinct messages as apply would, one by one;
        the states their messages are left with (`states` as for _apply_consume)."""
        return self._consume_ids([r.msg_id for r in records], [r.delivery_count for r in records],
                                 [r.lease for r in records], [r.token for r in records], states,
                                 journal_each=True)

    def _consume_ids(
        self,
        ids: list[int],
        counts: Sequence[int],
        leases: Sequence[float | None],
        tokens: Sequence[str | None],
        states: list[tuple] | None = None,
        journal_each: bool = True,
    ) -> list[tuple]:
        """Deliver the messages `ids` (distinct) as consume records say: each numbered by its
        delivery count and leased until its lease under its token, or deleted when its lease is
        None (at most once). `states`: theirs now, when the caller has read them. The states
        they are left with, in `ids` order. `journal_each`: each msg_id is a record of its own
        (the undo journal gets an entry for each; else the caller made the record's)."""
        if len(ids) == 1:
            return [self._lease(ids[0], leases[0], counts[0], tokens[0],
                                states[0] if states else None, journal_each)]
        index = self._index
        if states is None:
            states = index.states(ids)
            if None in states:
                raise KeyError(f"consume record names msg_ids not stored in {self.name!r}")
        journal = self.journal
        if journal is not None and journal_each:
            # One entry for the run, standing once for each of its records (undo.undo_consumed):
            # no tuple per message.
            datas = index._columns(ids, True)[0] if None in leases else None
            n = len(ids)
            journal.extend(repeat((undo.undo_consumed, self, ids, datas, states, counts, leases, [n]), n))
        if None in leases:
            for i, lease, token in zip(ids, leases, tokens):
                if lease is None and token is not None:
                    raise ValueError(f"msg_id {i}: a token needs a lease")
        self._unlink_many(ids, states)
        consumed = sum(map(gt, counts, map(_get_delivery_count, states)))
        if consumed:
            self.counts["consumed"] += consumed
        if any(map(ne, map(_get_token, states), tokens)):
            for i, s, token in zip(ids, states, tokens):
                if s[_TOKEN] != token:
                    if s[_TOKEN] is not None:
                        self._unbind(i, s[_TOKEN])
                    if token is not None:
                        self._bind(token, i)
        # Messages that shared a state share the new one (a batch: same lease and count).
        new = []
        append = new.append
        last = _NOTHING
        for s, dc, lease, token in zip(states, counts, leases, tokens):
            if s is last and dc == last_dc and lease == last_lease and token == last_token:
                append(last_new)
            else:
                last, last_dc, last_lease, last_token = s, dc, lease, token
                last_new = (s[0], s[1], s[2], s[3], dc, lease, token, s[7])
                append(last_new)
        n_deleted = leases.count(None)
        if n_deleted == len(ids):
            index.delete_many(ids)
            return new
        if n_deleted:
            index.delete_many([i for i, lease in zip(ids, leases) if lease is None])
            kept = [(i, s) for i, s in zip(ids, new) if s[_LEASE] is not None]
            index.set_states([i for i, _ in kept], [s for _, s in kept])
        else:
            index.set_states(ids, new)
        by_lease: dict[float, list[int]] = {}
        for i, lease in zip(ids, leases):
            if lease is not None:
                group = by_lease.get(lease)
                if group is None:
                    by_lease[lease] = [i]
                else:
                    group.append(i)
        for lease, group in by_lease.items():
            self._lease_add(lease, group)
        return new

    def _lease(
        self, msg_id: int, lease: float | None, delivery_count: int, token: str | None,
        s: tuple | None = None, journal: bool = True, data: str | None = None,
    ) -> tuple:
        """Lease a message until `lease` under `token` (None: delete it, an at-most-once
        delivery), as one consume record says; the state it is left with. `s`: its state now,
        when the caller has read it. `journal`: push the record's undo entry; `data`: the
        message's, when the caller has read it."""
        if lease is None and token is not None:
            raise ValueError(f"msg_id {msg_id}: a token needs a lease")
        index = self._index
        if s is None:
            s = index.state(msg_id)
            if s is None:
                raise KeyError(msg_id)
        entries = self.journal
        if entries is not None and journal:
            if data is None and lease is None:
                data = index.data(msg_id)  # deleted: its image needs it
            entries.append((undo.undo_lease, self, msg_id, data, s, delivery_count, lease))
        if delivery_count > s[_DELIVERY_COUNT]:
            self.counts["consumed"] += 1
        self._unlink(msg_id, s)
        if s[_TOKEN] != token:
            if s[_TOKEN] is not None:
                self._unbind(msg_id, s[_TOKEN])
            if token is not None:
                self._bind(token, msg_id)
        s = (s[0], s[1], s[2], s[3], delivery_count, lease, token, s[7])
        if lease is None:
            index.pop(msg_id, False)
        else:
            index.set_state(msg_id, s)
            self._lease_add(lease, (msg_id,))
        return s

    def _bind(self, token: str, msg_id: int) -> None:
        """Count msg_id among the messages leased under `token` (its state is the caller's to set)."""
        held = self._tokens.get(token)
        if held is None:
            self._tokens[token] = {msg_id}
        else:
            held.add(msg_id)

    def _unbind(self, msg_id: int, token: str) -> None:
        """Take msg_id out of `token`'s messages, a token left with none forgotten (its state is
        the caller's to set)."""
        held = self._tokens[token]
        held.discard(msg_id)
        if not held:
            del self._tokens[token]

    def _apply_delete(self, record: Confirm | Expire, now: float | None, counter: str) -> None:
        ids = record.msg_ids
        index = self._index
        journal = self.journal
        if ids is None:
            msg_id = record.msg_id
            data, s = index.pop(msg_id)
            if journal is not None:  # the deleted message's image
                journal.append((undo.undo_delete_one, self, counter, msg_id, data, s))
            self._unlink(msg_id, s)
            if s[_TOKEN] is not None:
                self._unbind(msg_id, s[_TOKEN])
            return
        datas, states = index._columns(ids, journal is not None)
        if len(set(ids)) != len(ids) or None in states:
            raise KeyError(f"confirm record names msg_ids not stored (or twice) in {self.name!r}")
        if journal is not None:
            journal.append((undo.undo_delete, self, counter, self.counts[counter],
                            list(zip(ids, datas, states))))
        index.delete_many(ids)
        self._unlink_many(ids, states)
        self._unbind_many(ids, states)

    def _unbind_many(self, ids: list[int], states: list[tuple]) -> None:
        """_unbind each of the messages (msg_ids and states) that is leased under a token."""
        tokens = list(map(_get_token, states))
        if tokens.count(None) != len(tokens):
            for i, token in zip(ids, tokens):
                if token is not None:
                    self._unbind(i, token)

    def _apply_confirm(self, record: Confirm, now: float | None) -> None:
        self._apply_delete(record, now, "confirmed")
        self.counts["confirmed"] += count(record)

    def _apply_expire(self, record: Expire, now: float | None) -> None:
        self._apply_delete(record, now, "expired")
        self.counts["expired"] += count(record)

    def _apply_pause(self, record: Pause, now: float | None) -> None:
        if self.journal is not None:
            undo.paused(self, record)
        self.paused = bool(record.paused)

    def _apply_purge(self, record: Purge, now: float | None) -> None:
        contents = self._swap_contents()
        if self.journal is not None:
            undo.purged(self, record, contents)

    def _take(self, msg_id: int) -> tuple[str, tuple]:
        """Remove a stored message from the queue (orderings and token included); its
        (data, state)."""
        data, s = self._index.pop(msg_id)
        self._unlink(msg_id, s)
        if s[_TOKEN] is not None:
            self._unbind(msg_id, s[_TOKEN])
        return data, s

    def _apply_dead_letter(self, record: DeadLetter, now: float | None) -> None:
        dlq = self._dead_letters(record.dlq)
        if record.dlq_msg_id in dlq._index:
            raise ValueError(f"msg_id {record.dlq_msg_id} already stored in {dlq.name!r}")
        if self.journal is not None:
            undo.dead_lettered(self, record, dlq)
        data, s = self._take(record.msg_id)
        reason = record.reason
        dead = {"queue": self.name, "reason": reason, "retry": s[_RETRY], "ttl": s[_TTL]}
        extra = s[_EXTRA]
        if extra is not None and "max_deliveries" in extra:
            dead["max_deliveries"] = extra["max_deliveries"]
        ready = record.ready
        dlq._insert(record.dlq_msg_id, data, (ready, max(s[_TTL], ready), 0.0, s[_PRIORITY],
                                              s[_DELIVERY_COUNT], None, None, {"dead": dead}), now)
        self.counts["dead_lettered"] += 1
        if reason == DEAD_TTL:
            self.counts["expired"] += 1

    def _apply_dlq_replay(self, record: DlqReplay, now: float | None) -> None:
        dlq = self._dead_letters(record.dlq)
        ready = record.ready
        index = self._index
        moves = record.moves
        if any(new_id in index for _, new_id, _ in moves):
            raise ValueError(f"dlq_replay names msg_ids already stored in {self.name!r}")
        if self.journal is not None:
            undo.dlq_replayed(self, record, dlq)
        for dead_id, new_id, ttl in moves:
            data, s = dlq._take(dead_id)
            dead = (s[_EXTRA] or {}).get("dead") or {}
            extra = {"max_deliveries": dead["max_deliveries"]} if "max_deliveries" in dead else None
            self._insert(new_id, data, (ready, ttl, dead.get("retry", 0.0), s[_PRIORITY], 0, None,
                                        None, extra), now)

    def _insert(self, msg_id: int, data: str, state: tuple, now: float | None) -> None:
        """Store an unleased message in its ordering; msg_ids continue after it. ValueError
        (nothing changed) if msg_id is stored already."""
        self._index.add(msg_id, data, state)
        ready = state[_READY]
        if now is not None and ready <= now:
            self._ready.add(-state[_PRIORITY], ready, msg_id)
        else:
            self._delayed.add(0, ready, msg_id)
        if msg_id >= self.next_id:
            self.next_id = msg_id + 1

    def _apply_release(self, record: Release, now: float | None) -> None:
        ids = record.msg_ids
        journal = self.journal
        if journal is not None:
            if ids is None:
                s = self._index.state(record.msg_id)
                if s is None:
                    raise KeyError(record.msg_id)
                journal.append((undo.undo_restate_one, self, record.msg_id, s))
            else:
                journal.append((undo.undo_restate, self, record, ids, self._states(ids), None, 0))
        if ids is None:
            self._release(record.msg_id, record.ready, record.delivery_count, now)
        else:
            self._release_many(ids, record.ready, now)

    def _release(self, msg_id: int, ready: float, delivery_count: int | None, now: float | None) -> None:
        s = self._index.state(msg_id)
        if s is None:
            raise KeyError(msg_id)
        if s[_LEASE] is None:
            raise ValueError(f"msg_id {msg_id} is not leased in queue {self.name!r}")
        self._unlink(msg_id, s)
        if s[_TOKEN] is not None:
            self._unbind(msg_id, s[_TOKEN])
        self._index.set_state(msg_id, (ready, s[1], s[2], s[3],
                                       s[4] if delivery_count is None else delivery_count,
                                       None, None, s[7]))
        if now is not None and ready <= now:
            self._ready.add(-s[_PRIORITY], ready, msg_id)
        else:
            self._delayed.add(0, ready, msg_id)

    def _release_many(self, ids: list[int], ready: float, now: float | None) -> None:
        """_release of each of `ids` (distinct, leased), delivery counts unchanged."""
        index = self._index
        states = index.states(ids)
        if None in states:
            raise KeyError(f"release record names msg_ids not stored in {self.name!r}")
        if None in map(_get_lease, states) or len(set(ids)) != len(ids):
            raise ValueError(f"release record names msg_ids not leased (or twice) in {self.name!r}")
        self._unlink_many(ids, states)
        self._unbind_many(ids, states)
        new = []
        append = new.append
        last = _NOTHING
        for s in states:  # messages that shared a state share the new one
            if s is not last:
                last = s
                released = (ready, s[1], s[2], s[3], s[4], None, None, s[7])
            append(released)
        index.set_states(ids, new)
        if now is not None and ready <= now:
            self._ready.update([(-s[_PRIORITY], ready, i) for i, s in zip(ids, states)])
        else:
            self._delayed.update([(0, ready, i) for i in ids])

    def _unlink_many(self, ids: list[int], states: list[tuple]) -> None:
        """Take messages (their msg_ids and states) out of whichever orderings hold them."""
        leases = list(map(_get_lease, states))
        n_unleased = leases.count(None)
        if n_unleased == len(ids):  # a consume: most often the first ready (or, on a replica,
            readies = list(map(_get_ready, states))  # delayed) messages
            priorities = set(map(_get_priority, states))
            if len(priorities) == 1 and self._ready.take_first(-priorities.pop(), readies, ids):
                return
            if self._delayed.take_first(0, readies, ids):
                return
        elif not n_unleased and len(set(leases)) == 1:  # a batch leased together
            self._lease_remove_many(leases[0], ids)
            return
        unleased = []
        for i, s, lease in zip(ids, states, leases):
            if lease is not None:
                self._lease_remove(lease, i)
            else:
                unleased.append((-s[_PRIORITY], s[_READY], i))
        if unleased:
            remove = self._delayed.remove
            for _, ready, i in self._ready.discard_many(unleased):
                remove(0, ready, i)

    def _unlink(self, msg_id: int, state: tuple) -> None:
        """Take a message (its msg_id and state) out of whichever ordering holds it."""
        if state[_LEASE] is not None:
            self._lease_remove(state[_LEASE], msg_id)
            return
        if not self._ready.discard(-state[_PRIORITY], state[_READY], msg_id):
            self._delayed.remove(0, state[_READY], msg_id)

    # ------------------------------------------------------------------ undo (workers/undo.py)

    def _finals(self, ids: Iterable[int]) -> list[tuple]:
        """Before-images (msg_id, data, state) of stored messages a record deletes; KeyError if
        one is not stored."""
        ids = list(ids)
        datas, states = self._index._columns(ids, True)
        if None in states:
            raise KeyError(ids[states.index(None)])
        return list(zip(ids, datas, states))

    def _put_back(self, image: tuple) -> None:
        """Store again a message _finals gave (undo of its deletion)."""
        self._restate(*image)

    @staticmethod
    def _delivery_count(state: tuple) -> int:
        """The delivery_count of a state _states (or a hook) gave."""
        return state[_DELIVERY_COUNT]

    def _states(self, ids: list[int]) -> list[tuple]:
        """Before-images of the states of stored messages a record changes in place (lease,
        release); KeyError if one is not stored."""
        states = self._index.states(ids)
        if None in states:
            raise KeyError(ids[states.index(None)])
        return states

    def _restate(self, msg_id: int, data: str | None, state: tuple | None) -> None:
        """Make message `msg_id` have `state` again (data None: the stored data), or not be
        stored (state None). An unleased message goes to the delayed ordering, as on a
        replica."""
        if self._index.state(msg_id) is not None:
            stored, _ = self._take(msg_id)
            if data is None:
                data = stored
        if state is None:
            return
        lease = state[_LEASE]
        if lease is None:
            self._insert(msg_id, data, state, None)
            return
        self._index.add(msg_id, data, state)
        self._lease_add(lease, (msg_id,))
        token = state[_TOKEN]
        if token is not None:
            self._bind(token, msg_id)

    def _swap_contents(self, contents: tuple | None = None) -> tuple:
        """Put `contents` (a tuple this returned; None: empty ones) in place of the messages,
        their orderings, leases and tokens, and return those (so purge is undone in O(1))."""
        old = (self._index, self._delayed, self._ready, self._leased, self._n_leased, self._tokens)
        if contents is None:
            contents = (MessageStore(self._index.ov), type(self._delayed)(), type(self._ready)(),
                        SortedDict(), 0, SortedDict())
        else:
            contents[0].reattach()
        self._index.detach()
        (self._index, self._delayed, self._ready, self._leased, self._n_leased,
         self._tokens) = contents
        return old

    # ------------------------------------------------------------------ moving due messages

    def _settle(self, now: float, records: list[Record]) -> None:
        """Move due delayed messages to ready; end due leases (release or expire records)."""
        delayed = self._delayed
        if delayed and delayed.head()[1] <= now:
            state = self._index.state
            self._ready.update([(-state(msg_id)[_PRIORITY], t, msg_id)
                                for _, t, msg_id in delayed.pop_through(0, now)])
        leased = self._leased
        if leased and leased.keys()[0] <= now:
            state = self._index.state
            name = self.name
            apply = self.apply
            due = [(lease, msg_id) for lease in list(leased.irange(maximum=now))
                   for msg_id in sorted(leased[lease])]
            for lease, msg_id in due:
                s = state(msg_id)
                end = self._ending(s, lease)
                if end is not None:
                    record = self._end_record(msg_id, end, lease)
                else:
                    record = Release(queue=name, msg_id=msg_id, ready=lease,
                                     delivery_count=s[_DELIVERY_COUNT])
                apply(record, now)
                records.append(record)

    def _ending(self, s: tuple, lease: float) -> str | None:
        """How a lease ending at `lease` ends the life of a message in state `s`: None (it is
        ready again), DEAD_TTL (it outlived its ttl) or DEAD_MAX_DELIVERIES (delivered as often
        as allowed)."""
        if lease >= s[_TTL]:
            return DEAD_TTL
        limit = self.max_deliveries
        extra = s[_EXTRA]
        if extra is not None:
            limit = extra.get("max_deliveries", limit)
        if limit and s[_DELIVERY_COUNT] >= limit:
            return DEAD_MAX_DELIVERIES
        return None

    def _end_record(self, msg_id: int, reason: str, at: float) -> Expire | DeadLetter:
        """The record that ends a message's life at time `at`: a dead_letter into the dead-letter
        queue when there is one, else an expire. The record names the dead-letter queue, the
        new msg_id and ready time there: a replica decides nothing."""
        dlq_name = self.dlq_name
        if dlq_name is None:
            return Expire(queue=self.name, msg_id=msg_id,
                          reason=None if reason == DEAD_TTL else reason)
        dlq = self._dead_letters(dlq_name)
        return DeadLetter(queue=self.name, msg_id=msg_id, reason=reason, dlq=dlq_name,
                          dlq_msg_id=dlq.next_id, ready=at)

    def _due_requeues(self, now: float) -> int:
        """Leases ended by `now` whose message will be ready again (not expired)."""
        leased = self._leased
        if not leased or leased.keys()[0] > now:
            return 0
        state = self._index.state
        ending = self._ending
        return sum(
            1
            for lease in leased.irange(maximum=now)
            for msg_id in leased[lease]
            if ending(state(msg_id), lease) is None
        )

    def _lease_add(self, lease: float, ids: Iterable[int]) -> None:
        group = self._leased.get(lease)
        if group is None:
            group = self._leased[lease] = {}
        before = len(group)
        group.update(dict.fromkeys(ids))
        self._n_leased += len(group) - before

    def _lease_remove(self, lease: float, msg_id: int) -> None:
        group = self._leased[lease]
        del group[msg_id]
        self._n_leased -= 1
        if not group:
            del self._leased[lease]

    def _lease_remove_many(self, lease: float, ids: list[int]) -> None:
        group = self._leased[lease]
        for msg_id in ids:
            del group[msg_id]
        self._n_leased -= len(ids)
        if not group:
            del self._leased[lease]

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict:
        """Full state, JSON-able: name, max_size, next_id, every message by msg_id, and the
        dedupe window when it is not empty.

        Each message is a list in Message field order:
        [msg_id, data, ready, ttl, retry, priority, delivery_count, lease], plus the token as
        a ninth item when the message is leased under one, and its extra settings as a tenth
        (the token then None if it has none). "paused": true when the queue is paused. The dedupe window ("dedupe") is a
        list of [producer, sequence, first msg_id, count], oldest first.
        """
        index = self._index
        snap = {
            "name": self.name,
            "max_size": self.max_size,
            "next_id": self.next_id,
            "messages": [_snapshot_row(*entry) for entry in index.entries()],
        }
        if self._dedupe:
            snap["dedupe"] = [[p, s, first, n] for (p, s), (first, n) in self._dedupe.items()]
        if self.paused:
            snap["paused"] = True
        return snap

    @classmethod
    def from_snapshot(cls, snap: dict) -> Queue:
        """A queue with exactly the state of `snapshot()`."""
        q = cls._settings(snap)
        index = q._index
        delayed = []
        stored = q._stored
        next_id = q.next_id
        last_tail = state = None
        for row in snap["messages"]:
            if not 5 <= len(row) <= 10:
                raise ValueError(f"a message in snapshot has {len(row)} items, not 5 to 10")
            msg_id = row[0]
            if msg_id in index or not 0 < msg_id < next_id:
                raise ValueError(f"bad msg_id in snapshot: {msg_id}")
            tail = row[2:]
            if tail != last_tail:  # else the state of the row before serves (most rows)
                last_tail = tail
                state = (*tail, *_ROW_DEFAULTS[len(row) - 2:])
            state = stored(state)
            index.add(msg_id, row[1], state)
            ready, _, _, _, _, lease, token, _ = state
            if lease is None:
                if token is not None:
                    raise ValueError(f"msg_id {msg_id}: a token without a lease in snapshot")
                delayed.append((0, ready, msg_id))
            else:
                q._lease_add(lease, (msg_id,))
                if token is not None:
                    q._bind(token, msg_id)
        index.thin_sparse()
        # Without a clock every unleased message starts as delayed; the first consume sorts it out.
        q._delayed.update(delayed)
        return q

    @classmethod
    def _settings(cls, snap: dict) -> Queue:
        """An empty queue with the settings of a snapshot (name, max_size, next_id, paused,
        dedupe)."""
        q = cls(snap["name"], snap["max_size"], snap["next_id"])
        q.paused = bool(snap.get("paused", False))
        for producer, sequence, first, count in snap.get("dedupe", ()):
            q._dedupe[(producer, sequence)] = [first, count]
        return q

    def snapshot_frames(self, refs: bool = False) -> Iterator[Frame]:
        """snapshot() as v2 snapshot frames (protocol/snapshot_frames.py): one QUEUE, then ROWS
        in msg_id order, built as they are taken. With `refs`, the messages whose bodies are on
        disk are REFS rows (their references), not read back."""
        dedupe = [[p, s, first, n] for (p, s), (first, n) in self._dedupe.items()]
        yield QUEUE, self.name, queue_body(self.max_size, self.next_id, self.paused, dedupe)
        for kind, body in rows_frames(_snapshot_row(*entry) for entry in self._index.entries(refs)):
            yield kind, self.name, body

    @classmethod
    def load_frames(cls, name: str, frames: Iterable[Frame], now: float | None = None) -> Queue:
        """A queue with exactly the state of snapshot_frames() (ValueError when they are not),
        loaded a ROWS or REFS frame at a time by its columns (a REFS frame's data are references
        to bodies on disk, counted once the service attaches its overflow). With `now`, the unleased messages ready by
        then go to the ready ordering, the others to the delayed one (without, all to delayed:
        where a message sits is not observable, the first consume sorts it out)."""
        frames = iter(frames)
        kind, _, body = next(frames, (None, name, b""))
        if kind != QUEUE:
            raise ValueError(f"queue {name!r}: its frames do not start with QUEUE")
        try:
            q = cls._settings({**read_queue(body), "name": name})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"queue {name!r}: bad QUEUE frame: {exc!r}") from None
        last = 0
        for rows in columns_of(frames):
            q._load_rows(rows, last, now)
            if rows.ids:
                last = rows.ids[-1]
        q._index.thin_sparse()
        return q

    def _load_rows(self, rows: Rows, last: int, now: float | None) -> None:
        """Store the messages of one ROWS or REFS frame, whose msg_ids must ascend from above
        `last`."""
        ids = rows.ids
        n = len(ids)
        if not n:
            return
        if not (last < ids[0] and ids[-1] < self.next_id and all(map(lt, ids, islice(ids, 1, None)))):
            raise ValueError(f"bad msg_ids in snapshot: {ids[0]}..{ids[-1]} do not ascend from above {last} "
                             f"below next_id {self.next_id}")
        stored = self._stored
        states: list[tuple] = []
        # Rows stored together share a state tuple, as they did before the snapshot; most often
        # only the ready time tells them apart.
        others = (rows.ttl, rows.retry, rows.priority, rows.delivery_count)
        if all(map(_same, others)):
            rest = (*(c[0] for c in others), *_UNLEASED)
            for ready, run in groupby(rows.ready):
                states += repeat(stored((ready, *rest)), len(list(run)))
        else:
            for key, run in groupby(zip(rows.ready, *others)):
                states += repeat(stored(key + _UNLEASED), len(list(run)))
        free = None
        for i, *rest in rows.tail:
            state = states[i] = (*states[i][:_LEASE], *rest, *_ROW_DEFAULTS[_LEASE + len(rest):])
            lease, token = state[_LEASE], state[_TOKEN]
            if lease is None:
                if token is not None:
                    raise ValueError(f"msg_id {ids[i]}: a token without a lease in snapshot")
                continue
            if free is None:
                free = bytearray(b"\1") * n
            free[i] = 0
            self._lease_add(lease, (ids[i],))
            if token is not None:
                self._bind(token, ids[i])
        self._index.add_ascending(ids, rows.datas, states)
        readies, priorities = rows.ready, rows.priority
        if free is not None:  # only the unleased go to an ordering
            ids = array("q", compress(ids, free))
            readies = array("d", compress(readies, free))
            priorities = array("i", compress(priorities, free))
        in_order = all(map(le, readies, islice(readies, 1, None)))
        if not ids or now is None or readies[0] > now:
            self._delayed.update_columns(0, readies, ids, in_order)
        elif (readies[-1] if in_order else max(readies)) <= now and _same(priorities):
            self._ready.update_columns(-priorities[0], readies, ids, in_order)
        else:
            self._ready.update([(-p, t, i) for t, i, p in zip(readies, ids, priorities) if t <= now])
            self._delayed.update([(0, t, i) for t, i in zip(readies, ids) if t > now])


# A snapshot row's items after data, from ready on, with the defaults of the trailing ones.
_ROW_DEFAULTS = (None, None, None, 0, 0, None, None, None)
_UNLEASED = (None, None, None)  # a state's lease, token and extra when a row has no tail


def _same(column: array) -> bool:
    """Whether every item of a column (not empty) equals the first, compared as bytes."""
    return column.tobytes() == column[:1].tobytes() * len(column)


def _snapshot_row(msg_id: int, data: str, s: tuple) -> list:
    """A message as a snapshot row: [msg_id, data, ready, ttl, retry, priority, delivery_count,
    lease], then the token when it has one or extra settings, then those settings when it has
    them."""
    if s[_EXTRA] is not None:
        return [msg_id, data, *s]
    if s[_TOKEN] is not None:
        return [msg_id, data, *s[:_EXTRA]]
    return [msg_id, data, *s[:_TOKEN]]


def _passes(s: tuple, token: str | None, delivery_count: int | None) -> bool:
    """Whether a message in state `s` satisfies the guards of a confirm/release/extend (None:
    no guard)."""
    if token is not None and (s[_TOKEN] != token or s[_LEASE] is None):
        return False
    return delivery_count is None or s[_DELIVERY_COUNT] == delivery_count


_APPLY = {
    Produce: Queue._apply_produce,
    Consume: Queue._apply_consume,
    Confirm: Queue._apply_confirm,
    Expire: Queue._apply_expire,
    Release: Queue._apply_release,
    Restore: Queue._apply_produce,
    Pause: Queue._apply_pause,
    Purge: Queue._apply_purge,
    DeadLetter: Queue._apply_dead_letter,
    DlqReplay: Queue._apply_dlq_replay,
}
