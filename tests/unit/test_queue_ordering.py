"""Queue on workers/ordering.py's Ordering delivers exactly as Queue on plain SortedLists of
key tuples (what it used before), over random operation sequences: mixed priorities, delays,
leases, releases, restores, expiry, confirms of any message, purges. Fake clock only."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from queue_server.workers import ordering
from queue_server.workers.queue import Message, Queue
from tests.unit.test_queue import T0, check_invariants, random_step

_INF = float("inf")


class SortedOrdering:
    """Ordering's interface on a plain SortedList of (group, ready, msg_id): the reference."""

    def __init__(self) -> None:
        self.keys = SortedList()

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self):
        return iter(list(self.keys))

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def add(self, group: int, ready: float, msg_id: int) -> None:
        self.keys.add((group, ready, msg_id))

    def update(self, keys) -> None:
        self.keys.update(keys)

    def head(self):
        return self.keys[0] if self.keys else None

    def discard(self, group: int, ready: float, msg_id: int) -> bool:
        key = (group, ready, msg_id)
        found = key in self.keys
        self.keys.discard(key)
        return found

    def discard_many(self, keys) -> list:
        return [key for key in keys if not self.discard(*key)]

    def take_first(self, group: int, readies, ids) -> bool:
        keys = [(group, r, i) for r, i in zip(readies, ids)]
        if not keys or list(self.keys.islice(0, len(keys))) != keys:
            return False
        del self.keys[:len(keys)]
        return True

    def remove(self, group: int, ready: float, msg_id: int) -> None:
        self.keys.remove((group, ready, msg_id))

    def first(self, count: int, after=None) -> list:
        lo = 0 if after is None else self.keys.bisect_right(after)
        return list(self.keys.islice(lo, lo + max(count, 0)))

    def through(self, group: int, ready: float) -> list:
        return list(self.keys[:self.count_through(group, ready)])

    def pop_through(self, group: int, ready: float) -> list:
        n = self.count_through(group, ready)
        keys = list(self.keys[:n])
        del self.keys[:n]
        return keys

    def count_through(self, group: int, ready: float) -> int:
        return self.keys.bisect_right((group, ready, _INF))

    def clear(self) -> None:
        self.keys.clear()


def reference(name: str, max_size: int) -> Queue:
    q = Queue(name, max_size, dedupe_window=8)
    q._delayed = SortedOrdering()
    q._ready = SortedOrdering()
    return q


def _compare(a: Queue, b: Queue, now: float) -> None:
    assert a.snapshot() == b.snapshot()
    assert list(a._ready) == list(b._ready) and list(a._delayed) == list(b._delayed)
    assert a.stats(now) == b.stats(now)
    assert a.next_event(now) == b.next_event(now)
    assert a.has_ready(now) == b.has_ready(now)
    assert a.peek(now, 7) == b.peek(now, 7)
    for state in ("ready", "delayed"):
        page = a.look(now, state, 4)
        assert page == b.look(now, state, 4)
        if page:
            assert a.look(now, state, 4, page[-1][0]) == b.look(now, state, 4, page[-1][0])


def _run(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    a, b = Queue("q", 200, dedupe_window=8), reference("q", 200)
    now = T0
    delivered_a: list[Message] = []
    delivered_b: list[Message] = []
    for _ in range(steps):
        now += rng.choice([0, 0, 0, 0.5, 1, 2, 7])
        state = rng.getstate()
        if rng.random() < 0.01:
            ra, rb = a.purge(), b.purge()
        else:
            ra = random_step(a, rng, now, delivered_a)
            rng.setstate(state)
            rng.random()  # the purge roll, as on the first pass
            rb = random_step(b, rng, now, delivered_b)
        assert ra == rb
        _compare(a, b, now)
    check_invariants(a)
    for later in (now + 5, now + 50, now + 500):
        assert a.consume(later, 100) == b.consume(later, 100)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32))
def test_queue_delivers_as_with_sorted_lists(monkeypatch, seed):
    monkeypatch.setattr(ordering, "_MIN_GARBAGE", 1)  # so that lanes compact (2 does not) and trim
    monkeypatch.setattr(ordering, "_MIN_TRIM", 4)
    _run(seed, 400)


def test_many_in_order_messages_take_no_tuple_and_deletes_from_the_middle_stay_exact():
    q = Queue("q", 10_000)
    ids = [q.produce(f"m{i}", T0 + i // 10, T0 + 3600, 0.0, 0, T0 + i // 10).msg_id
           for i in range(3000)]
    assert not q._ready._late and len(q._ready) == 3000
    for msg_id in ids[1000:3000:2]:                      # confirm unleased ones by id
        assert q.confirm(msg_id) is not None
    assert q.stats(T0 + 300)["ready"] == 2000
    got, _ = q.consume(T0 + 300, 2000)
    assert [m.msg_id for m in got] == ids[:1000] + ids[1001:3000:2]
    assert len(q) == 0 and not q._ready
