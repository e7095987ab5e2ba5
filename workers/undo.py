"""The undo journal of one worker: a before-image of every record its PartitionService applies,
so that the records not committed yet can be taken back, newest first, when the node stops
leading (docs/plans/one-copy.md, 3.1). Pure: no I/O, no clock.

Every record a worker applies, decided by it or replayed, gets the next number of its count
(`PartitionService.seq`). The journal holds one entry per record from `base + 1` to that count,
pushed by a hook in the Queue._apply_* method (or in PartitionService for delete_queue) before the
record changes anything: a tuple whose first item is its undo function, called with the entry
and the service; or, for a produce that took the queue's next id and names no producer (most
records), the record itself. A consume(n)'s run of single-form records pushes one entry that
stands once for each of them (undo_consumed), so that no tuple is built per message. Records the
log has committed (a follower's, PartitionService.apply_committed) get no entry at all: the
journal just starts after them. Besides a queue's counters, next_id, paused flag and dedupe window,
the before-images go through a few Queue methods: `_finals` (images of the messages a record
deletes), `_states` (the states of messages it changes in place), and back through `_put_back`,
`_restate` and `_swap_contents` (a purge swaps its containers: O(1)).

Changes that are not records ride beside them as *side* entries `(tag, function, args)`: a queue
made for the next record (tag `2 * seq + 1`: undone after that record is, or at any rollback when
no record followed), and the restore cache's forgotten and evicted messages (tag `2 * seq`: after
record `seq`).
"""
from __future__ import annotations

from collections import deque
from itertools import repeat, starmap
from typing import TYPE_CHECKING, Any

from queue_server.protocol.records import Produce

if TYPE_CHECKING:
    from queue_server.protocol.records import DeadLetter, DlqReplay, Pause, Purge
    from queue_server.workers.queue import Queue
    from queue_server.workers.service import PartitionService

# The most records a leading worker holds uncommitted: past it, it refuses writes (limit
# protocol/limits.py UNCOMMITTED) until the commit watermark trims the journal.
UNDO_LIMIT = 1_000_000


class UndoJournal:
    """Entries for records base+1 .. seq of one worker, oldest first, and their side entries.

    `entries` is the deque the worker's queues push to (Queue.journal): it is never replaced."""

    __slots__ = ("entries", "base", "side")

    def __init__(self, base: int = 0) -> None:
        self.entries: deque[tuple] = deque()
        self.base = base  # the seq of the newest record that is not in the journal
        self.side: deque[tuple] = deque()

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def seq(self) -> int:
        """The number of the newest record journalled (base when empty)."""
        return self.base + len(self.entries)

    def beside(self, after_record: bool, fn: Any, *args: Any) -> None:
        """Journal a change that is not a record: one that belongs to the newest record
        (`after_record`) or to the next one (made for it, undone with it)."""
        tag = 2 * self.seq + (0 if after_record else 1)
        self.side.append((tag, fn, args))

    def rollback(self, service: PartitionService, keep_through: int) -> int:
        """Undo every record numbered after `keep_through`, newest first, with its side entries
        and those of the next record; how many records were undone."""
        if not self.base <= keep_through <= self.seq:
            raise ValueError(f"cannot roll back to {keep_through}: the journal holds "
                             f"{self.base + 1}..{self.seq}")
        entries, side = self.entries, self.side
        undone = 0
        while self.base + len(entries) > keep_through:
            seq = self.base + len(entries)
            _undo_side(side, 2 * seq)
            _undo(entries.pop(), service)
            undone += 1
        _undo_side(side, 2 * keep_through + 1)
        return undone

    def trim(self, committed: int) -> None:
        """Forget the entries of records through `committed` (they will never be undone)."""
        if committed > self.seq:
            raise ValueError(f"commit point {committed} is past the newest record {self.seq}")
        n = committed - self.base
        if n > 0:
            entries = self.entries
            if n >= len(entries):
                entries.clear()
            else:  # popleft n times, the loop in C
                deque(starmap(entries.popleft, repeat((), n)), maxlen=0)
            self.base = committed
        side = self.side
        while side and side[0][0] <= 2 * committed:
            side.popleft()


def _undo_side(side: deque, from_tag: int) -> None:
    while side and side[-1][0] >= from_tag:
        _, fn, args = side.pop()
        fn(*args)


# ---------------------------------------------------------------------------- capture (hooks)
# An entry is a tuple whose first item is its undo function, called with the entry and the
# service; or, for a produce that took the queue's next id and names no producer (most records),
# the record itself (_undo_record).

def produced(q: Queue, record: Produce) -> None:
    """Before any other produce or restore: next_id and the dedupe entry it may evict."""
    evicted = None
    producer = record.producer
    if producer is not None:
        dedupe = q._dedupe
        if (producer, record.sequence) not in dedupe and dedupe and len(dedupe) >= q.dedupe_window:
            key = next(iter(dedupe))
            evicted = (key, list(dedupe[key]))
    q.journal.append((_undo_produce, q, record, q.next_id, evicted))


def paused(q: Queue, record: Pause) -> None:
    q.journal.append((_undo_pause, q, q.paused))


def purged(q: Queue, record: Purge, contents: tuple) -> None:
    """After a purge swapped the queue's `contents` out (O(1) either way)."""
    q.journal.append((_undo_purge, q, contents))


def dead_lettered(q: Queue, record: DeadLetter, dlq: Queue) -> None:
    """Before a dead letter: the message, the dead-letter queue's next_id, both counters."""
    counts = q.counts
    q.journal.append((_undo_dead_letter, q, record, q._finals((record.msg_id,))[0], dlq,
                      dlq.next_id, counts["dead_lettered"], counts["expired"]))


def dlq_replayed(q: Queue, record: DlqReplay, dlq: Queue) -> None:
    """Before a dlq_replay: the dead letters it moves and this queue's next_id."""
    q.journal.append((_undo_dlq_replay, q, record, dlq, dlq._finals([m[0] for m in record.moves]),
                      q.next_id))


def deleted_queue(journal: UndoJournal, record: Any, q: Queue | None) -> None:
    """Before a delete_queue (a PartitionService record): the Queue object itself, if any."""
    journal.entries.append((_undo_delete_queue, q, record.queue))


# ---------------------------------------------------------------------------- undo

def _undo(entry: Any, service: Any) -> None:
    if type(entry) is tuple:
        entry[0](entry, service)
    else:
        _undo_record(entry, service)


def _undo_record(record: Produce, service: Any) -> None:
    q = service.queues[record.queue]  # newest first: the queue the record went to
    msg_id = record.msg_id
    q._restate(msg_id, None, None)
    q.next_id = msg_id
    if type(record) is Produce:
        q.counts["produced"] -= 1


def _undo_produce(entry: tuple, service: Any) -> None:
    _, q, record, next_id, evicted = entry
    q._restate(record.msg_id, None, None)
    q.next_id = next_id
    if type(record) is Produce:
        q.counts["produced"] -= 1
    producer = record.producer
    if producer is not None:
        dedupe = q._dedupe
        key = (producer, record.sequence)
        found = dedupe.get(key)
        if found is not None:
            if found[1] > 1:
                found[1] -= 1
            else:
                del dedupe[key]
        if evicted is not None:
            dedupe[evicted[0]] = evicted[1]
            dedupe.move_to_end(evicted[0], last=False)


def undo_lease(entry: tuple, service: Any) -> None:
    """Undo of a consume record of one message; its entry, pushed by Queue._lease (or
    Queue._consume_ids for each record of a batch): (undo_lease, queue, msg_id, its data (None:
    the stored one; it is needed when the record deleted the message), state before,
    delivery_count and lease of the record)."""
    _, q, msg_id, data, state, delivery_count, lease = entry
    q._restate(msg_id, data, state)
    if delivery_count > q._delivery_count(state):
        q.counts["consumed"] -= 1
    if lease is None:  # delivered at most once: no longer a delivery to restore
        service._restorable.pop((q.name, msg_id), None)


def undo_consumed(entry: tuple, service: Any) -> None:
    """Undo of the newest record not undone yet of a run of single-form consume records (a
    consume(n)'s, pushed by Queue._consume_ids): one entry stands for each record of the run,
    (undo_consumed, queue, msg_ids, their data (None: none was deleted), states before,
    delivery_counts, leases, [records of the run not undone]). Rollbacks go newest first and
    trims oldest first, so the records not undone are always the run's first ones."""
    _, q, ids, datas, states, counts, leases, left = entry
    i = left[0] = left[0] - 1
    lease = leases[i]
    undo_lease((undo_lease, q, ids[i], datas[i] if lease is None else None, states[i], counts[i], lease),
               service)


def undo_restate(entry: tuple, service: Any) -> None:
    """Undo of a record that changed stored messages in place (list consume, release); its
    entry: (undo_restate, queue, record, msg_ids, their states before, counter or None, its
    value before)."""
    _, q, record, ids, states, counter, value = entry
    restate = q._restate
    for i in range(len(ids) - 1, -1, -1):
        restate(ids[i], None, states[i])
    if counter is not None:
        q.counts[counter] = value


def undo_restate_one(entry: tuple, service: Any) -> None:
    """Undo of a single-form release; its entry: (undo_restate_one, queue, msg_id, its state
    before)."""
    entry[1]._restate(entry[2], None, entry[3])


def undo_delete_one(entry: tuple, service: Any) -> None:
    """Undo of a single-form confirm or expire, which added one to `counter`; its entry, pushed
    by Queue._apply_delete: (undo_delete_one, queue, counter, msg_id, data, state before)."""
    _, q, counter, msg_id, data, state = entry
    q._put_back((msg_id, data, state))
    q.counts[counter] -= 1


def undo_delete(entry: tuple, service: Any) -> None:
    """Undo of a confirm or expire; its entry, pushed by Queue._apply_delete: (undo_delete,
    queue, counter, its value before, the image (msg_id, data, state) of the deleted message or a
    list of them)."""
    _, q, counter, value, finals = entry
    if type(finals) is list:
        for m in reversed(finals):
            q._put_back(m)
    else:
        q._put_back(finals)
    q.counts[counter] = value


def _undo_pause(entry: tuple, service: Any) -> None:
    entry[1].paused = entry[2]


def _undo_purge(entry: tuple, service: Any) -> None:
    entry[1]._swap_contents(entry[2])


def _undo_dead_letter(entry: tuple, service: Any) -> None:
    _, q, record, m, dlq, next_id, dead_lettered, expired = entry
    dlq._restate(record.dlq_msg_id, None, None)
    dlq.next_id = next_id
    q._put_back(m)
    q.counts["dead_lettered"] = dead_lettered
    q.counts["expired"] = expired


def _undo_dlq_replay(entry: tuple, service: Any) -> None:
    _, q, record, dlq, finals, next_id = entry
    for _, new_id, _ in reversed(record.moves):
        q._restate(new_id, None, None)
    q.next_id = next_id
    for m in reversed(finals):
        dlq._put_back(m)


def _undo_delete_queue(entry: tuple, service: Any) -> None:
    _, q, name = entry
    if q is not None:
        service.queues[name] = q
        q._index.reattach()  # its bodies count in the overflow again (detached when deleted)


def undo_create(service: Any, name: str, q: Queue) -> None:
    """Side undo of a queue made for a record: it goes (if it is still that queue)."""
    if service.queues.get(name) is q:
        del service.queues[name]


def undo_forget(cache: Any, forgotten: list[tuple], front: bool) -> None:
    """Side undo of restore-cache entries forgotten (a restore, purge or deletion) or evicted
    (`front`: the oldest, in their order)."""
    for key, message in reversed(forgotten) if front else forgotten:
        cache[key] = message
        if front:
            cache.move_to_end(key, last=False)
