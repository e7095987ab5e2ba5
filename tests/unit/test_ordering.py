"""workers/ordering.py: Ordering gives the answers of a SortedList of (group, ready, msg_id)
tuples, over random operation sequences, and keeps its garbage bounded."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from queue_server.workers import ordering
from queue_server.workers.ordering import Ordering

GROUPS = st.sampled_from([-3, 0, 0, 0, 2])
READY_STEPS = st.sampled_from([0.0, 0.0, 0.5, 1.0, -1.0])  # mostly in order, sometimes not

# One operation: (name, group, ready step or ready, id step or count). Adds and deletes weigh
# most, so that lanes grow and get holes that later reads and pops must step over.
_ADD = st.tuples(st.just("add"), GROUPS, READY_STEPS, st.sampled_from([1, 1, 1, 2, -5]))
_DISCARD = st.tuples(st.just("discard"), st.integers(0, 10**6), st.booleans(), st.booleans())
OPS = st.one_of(
    _ADD, _ADD, _ADD, _ADD, _DISCARD, _DISCARD,
    st.tuples(st.just("add_old"), GROUPS, st.floats(0, 20), st.integers(1, 300)),
    st.tuples(st.just("add_run"), GROUPS, READY_STEPS, st.integers(1, 30)),
    st.tuples(st.just("add_many"), st.integers(0, 2**32), st.just(0.0), st.integers(1, 12)),
    st.tuples(st.just("add_columns"), st.integers(0, 2**32), GROUPS, st.integers(1, 12)),
    st.tuples(st.just("pop_head"), st.just(0), st.just(0.0), st.just(0)),
    st.tuples(st.just("take_first"), st.integers(0, 3), st.booleans(), st.integers(1, 12)),
    st.tuples(st.just("discard_many"), st.integers(0, 10**6), st.booleans(), st.integers(1, 8)),
    st.tuples(st.just("first"), st.integers(0, 10**6), st.booleans(), st.integers(0, 12)),
    st.tuples(st.just("through"), st.integers(0, 10**6), st.booleans(), st.booleans()),
)
RUNS = st.lists(OPS, min_size=20, max_size=200).map(
    lambda ops: ops[:len(ops) // 2] + [("clear", 0, 0.0, 0)] + ops[len(ops) // 2:])


def _check(o: Ordering, model: SortedList) -> None:
    assert len(o) == len(model)
    assert list(o) == list(model)
    assert o.head() == (model[0] if model else None)
    assert o._n_late == len(o._late)
    for lane in o._lanes.values():
        assert len(lane) > 0
        # Garbage: the dead keys never outnumber the live ones by more than the allowance.
        assert lane.n_dead <= max(ordering._MIN_GARBAGE, len(lane))
        assert lane.n_dead == lane.dead.count(1, lane.start)
        assert lane.start <= max(ordering._MIN_TRIM, len(lane.ids) // 2 + 1)


def _run(ops: list) -> None:
    o, model = Ordering(), SortedList()
    ready, msg_id = 5.0, 100
    used: set[int] = set()
    gone: list = []  # keys discarded: dead in their lane's middle, some of them
    for name, a, b, c in ops:
        if name == "add":
            ready = max(0.0, ready + b)
            msg_id += c
            if msg_id in used or msg_id < 1:
                continue
            key = (a, ready, msg_id)
        elif name == "add_old":
            if c in used:
                continue
            key = (a, b, c)
        elif name == "add_run":  # a batch produce: c keys in order, one ready time
            ready = max(0.0, ready + abs(b))
            keys = [(a, ready, msg_id + i) for i in range(1, c + 1) if msg_id + i not in used]
            msg_id += c
            used.update(k[2] for k in keys)
            o.update(keys)
            model.update(keys)
        elif name == "add_many":  # keys in any order at once, as a snapshot load gives them
            rng = random.Random(a)
            keys = {}
            for i in range(1, c + 1):
                new = rng.choice([msg_id + i, rng.randrange(1, 300)])
                if new not in used:
                    keys[new] = (rng.choice([0, 0, 2]), rng.choice([ready, rng.uniform(0, 20)]), new)
            msg_id += c
            used.update(keys)
            o.update(keys.values())
            model.update(keys.values())
        elif name == "add_columns":  # a snapshot's ROWS frame: msg_ids ascending, readies mostly so
            rng = random.Random(a)
            ids = sorted({msg_id + rng.randrange(1, 4 * c) for _ in range(c)} - used)
            readies = [max(0.0, ready + rng.choice([0.0, 0.0, 0.5, -1.0])) for _ in ids]
            msg_id += 4 * c
            used.update(ids)
            o.update_columns(b, array("d", readies), array("q", ids))
            model.update((b, t, i) for t, i in zip(readies, ids))
        if name in ("add", "add_old"):
            used.add(key[2])
            o.add(*key)
            model.add(key)
        elif name == "discard":
            if b and model:  # a stored key, a key taken out, else most likely one never there
                key = model[a % len(model)]
                gone.append(key)
            elif c and gone:
                key = gone[a % len(gone)]
            else:
                key = (0, float(a % 20), a % 400)
            assert o.discard(*key) == (key in model)
            model.discard(key)
        elif name == "pop_head" and model:
            key = model[0]
            o.remove(*key)
            model.remove(key)
        elif name == "take_first" and model:
            # The first c keys of the first group (what a consume takes), or a window shifted by
            # a (not the first keys: nothing may change), or the first keys with another ready.
            group = model[0][0]
            run = [k for k in model.islice(a if b else 0, (a if b else 0) + c) if k[0] == group]
            readies = [k[1] for k in run]
            if not b and a == 3 and run:
                readies[-1] += 0.25
            first = list(model.islice(0, len(run)))
            expected = bool(run) and run == first and readies == [k[1] for k in run]
            # False also when they are first but not all in one lane (then nothing changed).
            if o.take_first(group, readies, [k[2] for k in run]):
                assert expected
                del model[:len(run)]
        elif name == "discard_many":
            keys = [model[(a + i) % len(model)] for i in range(c)] if model else []
            keys = list(dict.fromkeys(keys + (gone[-2:] if b else [])))
            gone.extend(keys)
            assert o.discard_many(keys) == [k for k in keys if k not in model]
            for key in keys:
                model.discard(key)
        elif name == "first":
            after = model[a % len(model)] if b and model else None
            lo = 0 if after is None else model.bisect_right(after)
            assert o.first(c, after) == list(model.islice(lo, lo + c))
        elif name == "through":
            # Through a stored key's (group, ready) mostly, else through a time of its own.
            group, at = model[a % len(model)][:2] if b and model else (0, float(a % 20))
            n = model.bisect_right((group, at, float("inf")))
            assert o.count_through(group, at) == n
            assert o.through(group, at) == list(model[:n])
            if c:
                assert o.pop_through(group, at) == list(model[:n])
                del model[:n]
        elif name == "clear":
            o.clear()
            model.clear()
        for key in model.islice(0, 3):
            assert key in o
        _check(o, model)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(RUNS)
def test_ordering_answers_as_a_sorted_list_with_small_thresholds(monkeypatch, ops):
    monkeypatch.setattr(ordering, "_MIN_GARBAGE", 2)
    monkeypatch.setattr(ordering, "_MIN_TRIM", 4)
    _run(ops)


@settings(max_examples=100, deadline=None)
@given(RUNS)
def test_ordering_answers_as_a_sorted_list(ops):
    _run(ops)


def test_keys_in_order_cost_no_late_tuple_and_deletes_keep_counts_exact():
    o = Ordering()
    for i in range(1, 10_001):
        o.add(0, 1000.0 + i // 100, i)       # one batch of 100 shares a ready time
    assert not o._late and len(o) == 10_000
    gone = [i for i in range(1, 10_001) if i % 3]  # two in three, from the middle: tombstones
    for i in gone:
        o.remove(0, 1000.0 + i // 100, i)
    lane = o._lanes[0]
    assert len(o) == 3_333 == len(lane)
    assert lane.n_dead <= max(ordering._MIN_GARBAGE, len(lane))  # compacted as it went
    assert len(lane.ids) - lane.start < 2 * 3_333 + ordering._MIN_GARBAGE
    assert o.count_through(0, 1050.0) == len([i for i in range(3, 5100, 3)])
    assert o.first(3) == [(0, 1000.0, 3), (0, 1000.0, 6), (0, 1000.0, 9)]


def test_a_key_out_of_order_goes_late_and_the_head_is_the_smaller():
    o = Ordering()
    o.add(0, 10.0, 5)
    o.add(0, 11.0, 6)
    o.add(0, 9.0, 7)                         # ready earlier than the lane's tail
    o.add(0, 12.0, 2)                        # msg_id lower than the lane's tail
    o.add(-1, 50.0, 8)                       # a higher priority (a lower group) comes first
    assert list(o._late) == [(0, 9.0, 7), (0, 12.0, 2)]
    assert list(o) == [(-1, 50.0, 8), (0, 9.0, 7), (0, 10.0, 5), (0, 11.0, 6), (0, 12.0, 2)]
    assert o.pop_through(0, 10.0) == [(-1, 50.0, 8), (0, 9.0, 7), (0, 10.0, 5)]
    assert o.head() == (0, 11.0, 6)


def test_pop_through_steps_over_a_hole_and_counts_stay_exact():
    o = Ordering((0, float(i), i) for i in range(1, 11))
    o.remove(0, 5.0, 5)
    assert o.pop_through(0, 7.0) == [(0, float(i), i) for i in (1, 2, 3, 4, 6, 7)]
    lane = o._lanes[0]
    assert len(o) == len(lane) == 3 and lane.n_dead == 0
    assert o.count_through(0, 9.0) == 2


def test_remove_of_a_key_not_there_raises():
    o = Ordering([(0, 1.0, 1)])
    with pytest.raises(KeyError):
        o.remove(0, 2.0, 1)
    assert o.discard(0, 1.0, 1) and not o and o.head() is None
