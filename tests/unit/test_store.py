"""workers/store.py: MessageStore against a plain dict of (data, state), by random operation
sequences (hypothesis), with the store's chunk size at its real value and shrunk so that sparse
chunks, side ids and batches across chunks happen within a few operations. Then whole Queues
with tiny chunks: a leader's records replayed on a replica give the same queue."""

from __future__ import annotations

import random
from contextlib import contextmanager
from unittest import mock

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_server.protocol.records import decode, encode
from queue_server.workers import queue as queue_module
from queue_server.workers import store as store_module
from queue_server.workers.queue import Queue
from queue_server.workers.store import MessageStore, message
from tests.unit.test_queue import T0, check_invariants, random_step

STATE = (T0, T0 + 60, 0.0, 0, 0, None, None, None)
states = st.one_of(st.just(STATE), st.tuples(
    st.floats(allow_nan=False), st.floats(allow_nan=False), st.floats(allow_nan=False),
    st.integers(-3, 3), st.integers(0, 5), st.one_of(st.none(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.text(max_size=3)), st.one_of(st.none(), st.just({"max_deliveries": 3})),
))
ops = st.lists(st.tuples(
    st.sampled_from(["add_next", "add_run", "add_old", "add_far", "set", "set_many", "pop",
                     "delete_run", "delete_some", "clear"]),
    st.integers(0, 10**6), st.text(max_size=8), states), max_size=150)


@contextmanager
def tiny_chunks():
    """Chunks of 8 msg_ids, sparse under 3 live (and so in Queue's one inlined read)."""
    with mock.patch.multiple(store_module, BITS=3, CHUNK=8, MASK=7, SPARSE=3), \
            mock.patch.multiple(queue_module, _BITS=3, _MASK=7):
        yield


def run(sequence) -> None:
    store = MessageStore()
    model: dict[int, tuple[str, tuple]] = {}
    next_id = 1
    gone: list[int] = []
    for op, n, data, state in sequence:
        if op == "add_run":
            k = 1 + n % 20
            store.add_run(next_id, [f"{data}{j}" for j in range(k)], [state] * k)
            model.update({next_id + j: (f"{data}{j}", state) for j in range(k)})
            next_id += k
        elif op.startswith("add"):
            if op == "add_old" and gone:
                msg_id = gone.pop(n % len(gone))
            elif op == "add_far":
                msg_id = next_id = next_id + n % 5000
                next_id += 1
            else:
                msg_id, next_id = next_id, next_id + 1 + n % 3  # sometimes a gap
            if msg_id in model:
                with pytest.raises(ValueError):
                    store.add(msg_id, data, state)
            else:
                store.add(msg_id, data, state)
                model[msg_id] = (data, state)
        elif op == "clear":
            store.clear()
            gone.extend(model)
            model.clear()
        elif model:
            ids = sorted(model)
            start = n % len(ids)
            if op == "set":
                store.set_state(ids[start], state)
                model[ids[start]] = (model[ids[start]][0], state)
            elif op == "set_many":
                chosen = ids[start:start + 1 + n % 30]
                store.set_states(chosen, [state] * len(chosen))
                model.update({i: (model[i][0], state) for i in chosen})
            elif op == "pop":
                assert store.pop(ids[start]) == model.pop(ids[start])
                gone.append(ids[start])
            else:  # a run of ids (consecutive when nothing is missing in between), or every 3rd
                chosen = ids[start:start + 1 + n % 40] if op == "delete_run" else ids[start::3]
                store.delete_many(chosen)
                for i in chosen:
                    del model[i]
                gone.extend(chosen)
        check(store, model)
        probes = gone[-3:] + [next_id, 0, -1]
        assert [store.state(i) for i in probes] == [model.get(i, (None, None))[1] for i in probes]
        assert store.states(probes) == [model.get(i, (None, None))[1] for i in probes]


def check(store: MessageStore, model: dict[int, tuple[str, tuple]]) -> None:
    assert len(store) == len(model) and bool(store) == bool(model)
    ids = sorted(model)
    assert list(store) == ids
    assert list(store.entries()) == [(i, *model[i]) for i in ids]
    assert store.states(ids) == [model[i][1] for i in ids]
    assert store.get_many(ids) == [message(i, *model[i]) for i in ids]
    for i in ids[:50]:
        assert i in store and store[i] == message(i, *model[i]) and store.data(i) == model[i][0]
    # A freed chunk's survivors are in the side dict; no msg_id is in both.
    for i in store.side:
        assert (i >> store_module.BITS) not in store.chunks
    assert sum(c.live for c in store.chunks.values()) + len(store.side) == len(model)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_the_store_answers_as_a_dict(sequence):
    run(sequence)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_the_store_with_tiny_chunks_answers_as_a_dict(sequence):
    with tiny_chunks():
        run(sequence)


def test_a_sparse_chunk_gives_its_few_live_messages_to_the_side_dict():
    store = MessageStore()
    n = store_module.CHUNK
    store.add_run(0, [str(i) for i in range(3 * n)], [STATE] * (3 * n))
    leased = (T0, T0, 5.0, 0, 1, T0 + 5, "tok", {"max_deliveries": 2})
    store.set_state(7, leased)
    store.delete_many([i for i in range(n) if i % 64 != 7])  # chunk 0 keeps 4: sparse
    assert 0 not in store.chunks and sorted(store.side) == [7, 71, 135, 199]
    assert store[7] == message(7, "7", leased)
    store.delete_many(list(range(n, 2 * n)))  # chunk 1 empties: freed
    store.delete_many(list(range(2 * n, 3 * n)))  # chunk 2 is the newest: kept, for the next ids
    assert list(store.chunks) == [2] and len(store) == 4
    store.add(5, "back", STATE)  # a restore of an old id whose chunk is gone
    assert store.side[5] == ("back", STATE) and store.pop(5) == ("back", STATE)


def test_produces_rolled_back_across_a_freed_chunk_are_stored_again():
    """A produce run whose first id fell in a sparse chunk freed when the next was made, rolled
    back and stored again (its ids, or the new leader's same ids): the ids of the freed chunk go
    to the side dict."""
    store = MessageStore()
    n = store_module.CHUNK
    store.add_run(0, [str(i) for i in range(n - 1)], [STATE] * (n - 1))
    store.delete_many(list(range(n - 6)))  # chunk 0 keeps 5, the newest: kept
    store.add_run(n - 1, ["a", "b", "c"], [STATE] * 3)  # chunk 1 made: chunk 0 (6 live) freed
    assert 0 not in store.chunks and n - 1 in store.side
    for i in (n + 1, n, n - 1):  # the rollback
        store.pop(i)
    store.add_run(n - 1, ["x", "y", "z"], [STATE] * 3)
    assert [store.data(i) for i in range(n - 6, n + 2)] == [*map(str, range(n - 6, n - 1)), "x", "y", "z"]
    with pytest.raises(ValueError):
        store.add_run(n - 1, ["again"], [STATE])


def test_a_chunk_no_longer_the_newest_joins_its_bodies_and_keeps_them_near_their_size():
    store = MessageStore()
    n = store_module.CHUNK
    store.add_run(0, [f"body {i:03}" for i in range(n)], [STATE] * n)
    store.add_run(n, ["newest", "é"], [STATE] * 2)
    old, new = store.chunks[0], store.chunks[1]
    assert old.blob == "".join(f"body {i:03}" for i in range(n)) and new.blob is None
    assert set(old.data) == {store_module.JOINED}
    assert store.pop(3) == ("body 003", STATE) and store.data(200) == "body 200"
    store.delete_many(list(range(4, 3 * n // 4)))  # under half of those it was joined with
    assert old.blob == "".join(f"body {i:03}" for i in (0, 1, 2, *range(3 * n // 4, n)))
    assert store.get_many([2, 3 * n // 4]) == [message(2, "body 002", STATE),
                                                message(3 * n // 4, f"body {3 * n // 4}", STATE)]
    store.add(5, "back", STATE)  # a restore into a joined chunk: its own str beside the blob
    assert store.data(5) == "back" and store.data(1) == "body 001"
    store.add_run(n + 2, ["é"] * n, [STATE] * n)  # chunk 1 is not all ASCII: its bodies stay apart
    assert new.blob is None and store.data(n) == "newest"


def test_a_joined_chunk_consumed_in_order_is_cut_to_its_live_bodies():
    store = MessageStore()
    n = store_module.CHUNK
    bodies = [f"body {i:03}" for i in range(n)]
    store.add_run(0, bodies, [STATE] * n)
    store.add(n, "newest", STATE)
    c = store.chunks[0]
    for i in range(n // 2 + 1):  # at most once, one at a time
        store.pop(i, keep=False)
    assert c.blob == "".join(bodies[n // 2 + 1:]) and c.base == 8 * (n // 2 + 1)
    assert store.get_many(list(range(n - 3, n))) == [message(i, bodies[i], STATE) for i in range(n - 3, n)]
    store.delete_many(list(range(n // 2 + 1, 3 * n // 4 + 2)))  # a confirm of a batch
    assert c.blob == "".join(bodies[3 * n // 4 + 2:]) and store.data(3 * n // 4 + 2) == bodies[3 * n // 4 + 2]
    assert [d for _, d, _ in store.entries()] == [*bodies[3 * n // 4 + 2:], "newest"]


def test_a_small_queue_keeps_small_lists():
    store = MessageStore()
    store.add_run(1, ["a", "b", "c"], [STATE] * 3)
    (c,) = store.chunks.values()
    assert len(c.states) == len(c.data) == 16  # not CHUNK
    store.add(40, "d", STATE)  # a position past the end: the lists grow to it
    assert len(c.states) == 41 and store.state(40) == STATE and store.state(39) is None
    assert store.states([2, 3, 4, 100, 200]) == [STATE, STATE, None, None, None]
    assert store.state(200) is None and 200 not in store and store.get(200) is None
    with pytest.raises(KeyError):
        store.pop(200)
    assert list(store) == [1, 2, 3, 40]


def test_a_queue_emptied_as_fast_as_it_is_filled_keeps_one_chunk():
    q = Queue("q", 10)
    for _ in range(3 * store_module.CHUNK):
        q.produce("x", T0, T0 + 60, 0.0, 0, T0)
        assert q.consume(T0, 1)[0]
    assert len(q._index.chunks) == 1 and not q._index.side


# ------------------------------------------------------------------ Queues with tiny chunks


@pytest.mark.parametrize("seed", range(8))
def test_a_replica_with_tiny_chunks_replays_to_the_leaders_queue(seed):
    """The leader's batch paths (a consume's first ready messages leave at once, a batch is
    stored or deleted a chunk slice at a time) against the replica's record by record."""
    rng = random.Random(seed)
    with tiny_chunks():
        a = Queue("q", 60, dedupe_window=8)
        b = Queue("q", 60, dedupe_window=8)
        c = Queue("q", 60, dedupe_window=8)
        now = T0
        delivered = []
        for _ in range(1200):
            now += rng.choice([0, 0, 0.5, 1, 2, 7])
            if rng.random() < 0.15:  # batches, so that runs cross chunks
                records = a.produce_many([(f"m{i}", now, now + 30, rng.choice([0, 5]), 0)
                                          for i in range(rng.randint(5, 20))], now) \
                    if a.free() >= 20 else []
                msgs, taken = a.consume(now, rng.randint(5, 20), rng.choice([None, 4.0]))
                records += taken
                if rng.random() < 0.5:
                    r = a.confirm_many([(m.msg_id, None, None) for m in msgs])
                    records += [r] if r else []
            else:
                records = random_step(a, rng, now, delivered)
            for record in records:
                b.apply(decode(encode(record)))
                c.apply(decode(encode(record)))
            assert a.snapshot() == b.snapshot() == c.snapshot()
            assert a.stats(now) == b.stats(now)
        check_invariants(a)
        check_invariants(b)
        loaded = Queue.from_snapshot(orjson.loads(orjson.dumps(a.snapshot())))
        check_invariants(loaded)
        assert loaded.snapshot() == a.snapshot()
        for later in (now + 5, now + 50, now + 500):
            assert a.consume(later, 100) == b.consume(later, 100) == loaded.consume(later, 100)
