"""One queue: the message index, its delayed / ready / leased orderings, leases and ttl.

Pure logic: no I/O and no clock reads; the time (`now`, float unix seconds) is always an argument.
Every change is a record (a dict, see docs/architecture.md "The change log"). Leader-side methods
build the record and then `apply` it, the same code a replica runs, so the two cannot diverge.
"""

from __future__ import annotations

from dataclasses import dataclass

from sortedcontainers import SortedList

MAX_MSG_ID = 2**63 - 1

_INF = float("inf")


class QueueFull(Exception):
    """The queue has no room for the message(s); nothing was changed."""


@dataclass(slots=True)
class Message:
    """One stored message and its delivery state."""

    msg_id: int
    data: str
    ready: float  # absolute time it becomes ready (after a lease ends: the lease deadline)
    ttl: float  # absolute time after which it is no longer retried
    retry: float  # seconds; 0 = at most once
    priority: int = 0  # higher first among ready messages
    delivery_count: int = 0
    lease: float | None = None  # lease deadline while in flight, else None


class Queue:
    """One queue's messages, ordered for delivery, with leases, retries and ttl.

    Each stored message is in exactly one ordering:
    delayed ``(ready, msg_id)``, ready ``(-priority, ready, msg_id)`` or leased ``(lease, msg_id)``.
    A delayed message whose time has come may sit in `delayed` until the next consume or
    expire_due; every query accounts for that, so where a message sits is never observable.
    """

    __slots__ = ("name", "max_size", "next_id", "_index", "_delayed", "_ready", "_leased")

    def __init__(self, name: str, max_size: int, next_id: int = 1) -> None:
        if not 1 <= next_id <= MAX_MSG_ID + 1:
            raise ValueError(f"next_id out of range: {next_id}")
        self.name = name
        self.max_size = max_size
        self.next_id = next_id
        self._index: dict[int, Message] = {}
        self._delayed = SortedList()
        self._ready = SortedList()
        self._leased = SortedList()

    def __len__(self) -> int:
        """Stored messages: delayed + ready + leased."""
        return len(self._index)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._index

    def free(self) -> int:
        """Room left (0 when full; a restore may overfill the queue)."""
        free = self.max_size - len(self._index)
        return free if free > 0 else 0

    # ------------------------------------------------------------------ leader side

    def produce(
        self, data: str, ready: float, ttl: float, retry: float, priority: int, now: float
    ) -> dict:
        """Store a new message; return its produce record. Raises QueueFull, OverflowError."""
        if len(self._index) >= self.max_size:
            raise QueueFull(self.name)
        msg_id = self.next_id
        if msg_id > MAX_MSG_ID:
            raise OverflowError(f"message ids exhausted in queue {self.name!r}")
        record = {
            "op": "produce",
            "queue": self.name,
            "msg_id": msg_id,
            "ready": ready,
            "ttl": ttl,
            "retry": retry,
            "priority": priority,
            "data": data,
            "delivery_count": 0,
        }
        self.apply(record, now)
        return record

    def produce_many(
        self, items: list[tuple[str, float, float, float, int]], now: float
    ) -> list[dict]:
        """Store (data, ready, ttl, retry, priority) items, all or none; return their records."""
        if len(self._index) + len(items) > self.max_size:
            raise QueueFull(self.name)
        first = self.next_id
        if items and first + len(items) - 1 > MAX_MSG_ID:
            raise OverflowError(f"message ids exhausted in queue {self.name!r}")
        name = self.name
        # Every record is built before any is applied, so a malformed item changes nothing.
        records = [
            {
                "op": "produce",
                "queue": name,
                "msg_id": first + i,
                "ready": ready,
                "ttl": ttl,
                "retry": retry,
                "priority": priority,
                "data": data,
                "delivery_count": 0,
            }
            for i, (data, ready, ttl, retry, priority) in enumerate(items)
        ]
        apply = self.apply
        for record in records:
            apply(record, now)
        return records

    def consume(self, now: float, count: int = 1) -> tuple[list[Message], list[dict]]:
        """Deliver up to `count` ready messages, best first.

        Returns the delivered messages (their state at delivery, delivery_count already
        incremented; never aliased with stored state) and the records: first those of leases
        that ended by `now` (release / expire, as in expire_due), then one consume per message.
        """
        records: list[dict] = []
        self._settle(now, records)
        ready = self._ready
        if not ready or count <= 0:
            return [], records
        index = self._index
        name = self.name
        apply = self.apply
        delivered: list[Message] = []
        while count > 0 and ready:
            msg_id = ready[0][2]
            m = index[msg_id]
            retry = m.retry
            if retry > 0:
                record = {
                    "op": "consume",
                    "queue": name,
                    "msg_id": msg_id,
                    "lease": now + retry,
                    "delivery_count": m.delivery_count + 1,
                }
                apply(record, now)
                delivered.append(
                    Message(msg_id, m.data, m.ready, m.ttl, retry, m.priority,
                            m.delivery_count, m.lease)
                )
            else:
                record = {
                    "op": "consume",
                    "queue": name,
                    "msg_id": msg_id,
                    "lease": None,
                    "delivery_count": m.delivery_count + 1,
                }
                apply(record, now)
                delivered.append(m)  # deleted: no longer referenced by the queue
            records.append(record)
            count -= 1
        return delivered, records

    def confirm(self, msg_id: int) -> dict | None:
        """Delete a stored message (leased or not); its confirm record, or None if not stored."""
        if msg_id not in self._index:
            return None
        record = {"op": "confirm", "queue": self.name, "msg_id": msg_id}
        self.apply(record)
        return record

    def release(self, msg_id: int, now: float) -> dict | None:
        """Give a lease back: the message is ready again at `now`, delivery_count unchanged.

        Returns the release record, or None if the message is not leased.
        """
        m = self._index.get(msg_id)
        if m is None or m.lease is None:
            return None
        record = {
            "op": "release",
            "queue": self.name,
            "msg_id": msg_id,
            "ready": now,
            "delivery_count": m.delivery_count,
        }
        self.apply(record, now)
        return record

    def extend(self, msg_id: int, lease_until: float) -> dict | None:
        """Move a lease deadline; a consume record with the new lease, or None if not leased."""
        m = self._index.get(msg_id)
        if m is None or m.lease is None:
            return None
        record = {
            "op": "consume",
            "queue": self.name,
            "msg_id": msg_id,
            "lease": lease_until,
            "delivery_count": m.delivery_count,
        }
        self.apply(record)
        return record

    def restore(self, message: Message) -> dict:
        """Put back an at-most-once message that never reached a client; its restore record.

        Same msg_id and ready time, delivery_count one lower (not below 0). A restore is not
        refused when the queue is full: the message was stored a moment ago and must not be lost.
        Raises ValueError if the id is still stored.
        """
        if message.msg_id in self._index:
            raise ValueError(f"msg_id {message.msg_id} is still stored")
        record = {
            "op": "restore",
            "queue": self.name,
            "msg_id": message.msg_id,
            "ready": message.ready,
            "ttl": message.ttl,
            "retry": message.retry,
            "priority": message.priority,
            "data": message.data,
            "delivery_count": max(0, message.delivery_count - 1),
        }
        self.apply(record)
        return record

    def expire_due(self, now: float) -> list[dict]:
        """Settle every lease that ended by `now`; return the records.

        A lease that ended at or after the message's ttl removes it ('expire'); any other ended
        lease makes the message ready again at its lease deadline ('release').
        """
        records: list[dict] = []
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
            head = delayed[0][0]
            if head > now:
                t = head
            else:
                i = delayed.bisect_right((now, _INF))
                if i < len(delayed):
                    t = delayed[i][0]
        leased = self._leased
        if leased:
            head = leased[0][0]
            if head <= now:
                i = leased.bisect_right((now, _INF))
                head = leased[i][0] if i < len(leased) else None
            if head is not None and (t is None or head < t):
                t = head
        return t

    def has_ready(self, now: float) -> bool:
        """Whether a consume at `now` would deliver something."""
        if self._ready:
            return True
        delayed = self._delayed
        if delayed and delayed[0][0] <= now:
            return True
        return self._due_requeues(now) > 0 if self._leased else False

    def stats(self, now: float) -> dict:
        """Counts as a consume at `now` would see them.

        Keys: size, ready, delayed, in_flight (includes ended leases awaiting expiry), max_id (last
        id handed out, 0 if none), max_size.
        """
        delayed = self._delayed
        due = 0
        if delayed and delayed[0][0] <= now:
            due = delayed.bisect_right((now, _INF))
        requeues = self._due_requeues(now) if self._leased else 0
        return {
            "size": len(self._index),
            "ready": len(self._ready) + due + requeues,
            "delayed": len(delayed) - due,
            "in_flight": len(self._leased) - requeues,
            "max_id": self.next_id - 1,
            "max_size": self.max_size,
        }

    # ------------------------------------------------------------------ replica side

    def apply(self, record: dict, now: float | None = None) -> None:
        """Replay one change record exactly as the leader decided it.

        `now` is only passed by the leader's own methods: it lets a message that is already
        ready skip the delayed ordering. The stored state is the same with or without it.
        Raises KeyError / ValueError for a record that does not fit the state (out of sync).
        """
        try:
            handler = _APPLY[record["op"]]
        except KeyError:
            raise ValueError(f"unknown record op: {record.get('op')!r}") from None
        handler(self, record, now)

    def _apply_produce(self, record: dict, now: float | None) -> None:
        msg_id = record["msg_id"]
        index = self._index
        if msg_id in index:
            raise ValueError(f"msg_id {msg_id} already stored in queue {self.name!r}")
        m = Message(
            msg_id,
            record["data"],
            record["ready"],
            record["ttl"],
            record["retry"],
            record["priority"],
            record["delivery_count"],
        )
        index[msg_id] = m
        if now is not None and m.ready <= now:
            self._ready.add((-m.priority, m.ready, msg_id))
        else:
            self._delayed.add((m.ready, msg_id))
        if msg_id >= self.next_id:
            self.next_id = msg_id + 1

    def _apply_consume(self, record: dict, now: float | None) -> None:
        msg_id = record["msg_id"]
        m = self._index[msg_id]
        self._unlink(m)
        m.delivery_count = record["delivery_count"]
        lease = record["lease"]
        if lease is None:
            del self._index[msg_id]
        else:
            m.lease = lease
            self._leased.add((lease, msg_id))

    def _apply_delete(self, record: dict, now: float | None) -> None:
        self._unlink(self._index.pop(record["msg_id"]))

    def _apply_release(self, record: dict, now: float | None) -> None:
        msg_id = record["msg_id"]
        m = self._index[msg_id]
        if m.lease is None:
            raise ValueError(f"msg_id {msg_id} is not leased in queue {self.name!r}")
        self._unlink(m)
        m.lease = None
        m.ready = ready = record["ready"]
        m.delivery_count = record["delivery_count"]
        if now is not None and ready <= now:
            self._ready.add((-m.priority, ready, msg_id))
        else:
            self._delayed.add((ready, msg_id))

    def _unlink(self, m: Message) -> None:
        """Take `m` out of whichever ordering holds it."""
        if m.lease is not None:
            self._leased.remove((m.lease, m.msg_id))
            return
        key = (-m.priority, m.ready, m.msg_id)
        ready = self._ready
        if ready and ready[0] == key:  # the consume hot path
            ready.pop(0)
        elif key in ready:
            ready.remove(key)
        else:
            self._delayed.remove((m.ready, m.msg_id))

    # ------------------------------------------------------------------ moving due messages

    def _settle(self, now: float, records: list[dict]) -> None:
        """Move due delayed messages to ready; end due leases (release or expire records)."""
        delayed = self._delayed
        if delayed and delayed[0][0] <= now:
            n = delayed.bisect_right((now, _INF))
            due = delayed[:n]
            del delayed[:n]
            index = self._index
            self._ready.update([(-index[msg_id].priority, t, msg_id) for t, msg_id in due])
        leased = self._leased
        if leased and leased[0][0] <= now:
            index = self._index
            name = self.name
            apply = self.apply
            for lease, msg_id in leased[: leased.bisect_right((now, _INF))]:
                m = index[msg_id]
                if lease >= m.ttl:
                    record = {"op": "expire", "queue": name, "msg_id": msg_id}
                else:
                    record = {
                        "op": "release",
                        "queue": name,
                        "msg_id": msg_id,
                        "ready": lease,
                        "delivery_count": m.delivery_count,
                    }
                apply(record, now)
                records.append(record)

    def _due_requeues(self, now: float) -> int:
        """Leases ended by `now` whose message will be ready again (not expired)."""
        leased = self._leased
        if not leased or leased[0][0] > now:
            return 0
        index = self._index
        return sum(
            1
            for lease, msg_id in leased.islice(0, leased.bisect_right((now, _INF)))
            if lease < index[msg_id].ttl
        )

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict:
        """Full state, JSON-able: name, max_size, next_id and every message by msg_id.

        Each message is a list in Message field order:
        [msg_id, data, ready, ttl, retry, priority, delivery_count, lease].
        """
        index = self._index
        return {
            "name": self.name,
            "max_size": self.max_size,
            "next_id": self.next_id,
            "messages": [
                [m.msg_id, m.data, m.ready, m.ttl, m.retry, m.priority, m.delivery_count, m.lease]
                for m in (index[msg_id] for msg_id in sorted(index))
            ],
        }

    @classmethod
    def from_snapshot(cls, snap: dict) -> Queue:
        """A queue with exactly the state of `snapshot()`."""
        q = cls(snap["name"], snap["max_size"], snap["next_id"])
        index = q._index
        delayed = []
        leased = []
        for row in snap["messages"]:
            m = Message(*row)
            if m.msg_id in index or not 0 < m.msg_id < q.next_id:
                raise ValueError(f"bad msg_id in snapshot: {m.msg_id}")
            index[m.msg_id] = m
            if m.lease is None:
                delayed.append((m.ready, m.msg_id))
            else:
                leased.append((m.lease, m.msg_id))
        # Without a clock every unleased message starts as delayed; the first consume sorts it out.
        q._delayed.update(delayed)
        q._leased.update(leased)
        return q


_APPLY = {
    "produce": Queue._apply_produce,
    "consume": Queue._apply_consume,
    "confirm": Queue._apply_delete,
    "expire": Queue._apply_delete,
    "release": Queue._apply_release,
    "restore": Queue._apply_produce,
}
