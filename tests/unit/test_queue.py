"""workers/queue.py: ordering, leases, ttl, records and replay. Fake clock only."""

import random

import orjson
import pytest

from queue_server.protocol.records import DeleteQueue, Record, decode, encode
from queue_server.workers.queue import MAX_MSG_ID, Message, Queue, QueueFull


def as_json(value):
    """Records (one, a list, or None) as their JSON says them: the format on the wire and disk."""
    return orjson.loads(encode(value))


def record_of(fields: dict) -> Record:
    """The record whose JSON is `fields`."""
    return decode(orjson.dumps(fields))


T0 = 1_700_000_000.0
HOUR = 3600.0


def make(max_size: int = 100, next_id: int = 1) -> Queue:
    return Queue("q", max_size, next_id)


def put(q: Queue, data: str, now: float = T0, *, ready: float | None = None,
        ttl: float | None = None, retry: float = 0.0, priority: int = 0) -> int:
    ready = now if ready is None else ready
    ttl = ready + HOUR if ttl is None else ttl
    return q.produce(data, ready, ttl, retry, priority, now).msg_id


def take(q: Queue, now: float, count: int = 1) -> list[str]:
    msgs, _ = q.consume(now, count)
    return [m.data for m in msgs]


def check_invariants(q: Queue) -> None:
    """Every stored message is in exactly one ordering, under the key its fields give; a
    message is leased under a token exactly when the token lists it."""
    delayed = {mid for *_, mid in q._delayed}
    ready = {mid for *_, mid in q._ready}
    leased = {mid for group in q._leased.values() for mid in group}
    assert all(q._leased.values()) and q._n_leased == len(leased)
    assert len(delayed) + len(ready) + len(leased) == len(q)
    assert delayed | ready | leased == set(q._index)
    for mid, m in q._index.items():
        assert mid == m.msg_id < q.next_id
        if mid in leased:
            assert mid in q._leased[m.lease]
        else:
            assert m.lease is None and m.token is None
            assert (0, m.ready, mid) in q._delayed or (-m.priority, m.ready, mid) in q._ready
        if m.token is not None:
            assert mid in q._tokens[m.token]
    for token, held in q._tokens.items():
        assert held and all(q._index[mid].token == token for mid in held)


# ---------------------------------------------------------------- delay and ordering

def test_delayed_message_not_visible_before_ready_and_visible_at_ready():
    q = make()
    put(q, "later", ready=T0 + 10)
    assert take(q, T0) == []
    assert take(q, T0 + 9.999) == []
    assert not q.has_ready(T0 + 9.999)
    assert q.has_ready(T0 + 10)
    assert take(q, T0 + 10) == ["later"]
    assert len(q) == 0


def test_fifo_by_ready_time_then_msg_id():
    q = make()
    put(q, "c", ready=T0 + 3)
    put(q, "a1", ready=T0 + 1)
    put(q, "b", ready=T0 + 2)
    put(q, "a2", ready=T0 + 1)
    put(q, "now", now=T0 + 5, ready=T0 + 5)  # produced ready: skips the delayed ordering
    assert take(q, T0 + 10, count=10) == ["a1", "a2", "b", "c", "now"]


def test_priority_first_then_fifo():
    q = make()
    put(q, "p0-first")
    put(q, "p5-first", priority=5)
    put(q, "p1")
    put(q, "p5-second", priority=5)
    put(q, "p9-delayed", ready=T0 + 100, priority=9)  # not ready yet: must not block others
    put(q, "p-1", priority=-1)
    assert take(q, T0 + 1, count=10) == ["p5-first", "p5-second", "p0-first", "p1", "p-1"]
    assert take(q, T0 + 100) == ["p9-delayed"]


def test_batch_consume_count():
    q = make()
    ids = [put(q, f"m{i}") for i in range(5)]
    msgs, records = q.consume(T0, count=3)
    assert [m.msg_id for m in msgs] == ids[:3]
    assert [as_json(r)["msg_id"] for r in records] == ids[:3]
    assert take(q, T0, count=10) == ["m3", "m4"]
    assert q.consume(T0, count=10) == ([], [])
    put(q, "x")
    assert q.consume(T0, count=0) == ([], [])
    assert len(q) == 1


# ---------------------------------------------------------------- delivery semantics

def test_at_most_once_is_deleted_on_delivery():
    q = make()
    mid = put(q, "once", retry=0)
    msgs, records = q.consume(T0)
    assert msgs == [Message(mid, "once", T0, T0 + HOUR, 0, 0, 1, None)]
    assert as_json(records) == [{"op": "consume", "queue": "q", "msg_id": mid, "lease": None,
                        "delivery_count": 1}]
    assert len(q) == 0
    assert take(q, T0 + 10 * HOUR) == []
    assert q.confirm(mid) is None


def test_lease_and_redelivery_after_retry():
    q = make()
    mid = put(q, "work", retry=10)
    msgs, records = q.consume(T0)
    first = msgs[0]
    assert (first.delivery_count, first.lease) == (1, T0 + 10)
    assert as_json(records) == [{"op": "consume", "queue": "q", "msg_id": mid, "lease": T0 + 10,
                        "delivery_count": 1}]
    assert len(q) == 1
    assert take(q, T0 + 9.99) == []
    msgs, records = q.consume(T0 + 12)
    assert [(m.msg_id, m.delivery_count, m.ready, m.lease) for m in msgs] == [
        (mid, 2, T0 + 10, T0 + 22)]
    assert as_json(records) == [
        {"op": "release", "queue": "q", "msg_id": mid, "ready": T0 + 10, "delivery_count": 1},
        {"op": "consume", "queue": "q", "msg_id": mid, "lease": T0 + 22, "delivery_count": 2},
    ]
    assert (first.delivery_count, first.lease) == (1, T0 + 10)  # returned copies don't alias
    assert q.consume(T0 + 22)[0][0].delivery_count == 3


def test_requeued_lease_keeps_fifo_position_by_lease_deadline():
    q = make()
    put(q, "a", retry=5)
    take(q, T0)  # a leased until T0+5
    put(q, "b", now=T0 + 6)
    assert take(q, T0 + 7, count=2) == ["a", "b"]  # a ready at T0+5 < b at T0+6


def test_confirm_removes_and_unknown_id_is_none():
    q = make()
    leased = put(q, "leased", retry=10)
    waiting = put(q, "waiting")
    delayed = put(q, "delayed", ready=T0 + 50)
    take(q, T0)
    for mid in (leased, waiting, delayed):
        assert as_json(q.confirm(mid)) == {"op": "confirm", "queue": "q", "msg_id": mid}
    assert len(q) == 0
    assert q.confirm(leased) is None
    assert q.confirm(999) is None
    assert take(q, T0 + 100) == []


# ---------------------------------------------------------------- ttl

def test_lease_ending_after_ttl_expires_and_is_not_redelivered():
    q = make()
    mid = put(q, "m", retry=10, ttl=T0 + 15)
    take(q, T0)                       # lease T0+10 < ttl
    assert as_json(q.expire_due(T0 + 10)) == [
        {"op": "release", "queue": "q", "msg_id": mid, "ready": T0 + 10, "delivery_count": 1}]
    assert take(q, T0 + 10) == ["m"]  # lease T0+20 >= ttl
    assert q.expire_due(T0 + 19.9) == []
    assert not q.has_ready(T0 + 20)
    assert as_json(q.expire_due(T0 + 20)) == [{"op": "expire", "queue": "q", "msg_id": mid}]
    assert len(q) == 0
    assert take(q, T0 + 1000) == []


def test_lease_ending_exactly_at_ttl_expires_even_through_consume():
    q = make()
    mid = put(q, "m", retry=10, ttl=T0 + 10)
    take(q, T0)
    msgs, records = q.consume(T0 + 30)
    assert msgs == []
    assert as_json(records) == [{"op": "expire", "queue": "q", "msg_id": mid}]
    assert len(q) == 0


def test_never_delivered_message_past_ttl_is_delivered_once():
    q = make()
    mid = put(q, "late", retry=10, ttl=T0 + 5)
    once = put(q, "late-once", retry=0, ttl=T0 + 5)
    msgs, _ = q.consume(T0 + 100, count=5)
    assert [(m.msg_id, m.delivery_count) for m in msgs] == [(mid, 1), (once, 1)]
    assert q.next_event(T0 + 100) == T0 + 110
    assert take(q, T0 + 110) == []
    assert len(q) == 0


# ---------------------------------------------------------------- capacity and ids

def test_queue_full_single_produce_changes_nothing():
    q = make(max_size=2)
    put(q, "a")
    put(q, "b")
    assert q.free() == 0
    with pytest.raises(QueueFull):
        put(q, "c")
    assert (len(q), q.next_id) == (2, 3)
    take(q, T0)
    assert q.free() == 1
    assert put(q, "c") == 3


def test_produce_many_is_all_or_none():
    q = make(max_size=3)
    put(q, "a")
    items = [("x", T0, T0 + HOUR, 0.0, 0)] * 3
    with pytest.raises(QueueFull):
        q.produce_many(items, T0)
    assert (len(q), q.next_id) == (1, 2)
    with pytest.raises(ValueError):  # a malformed item: nothing applied either
        q.produce_many([("x", T0, T0 + HOUR, 0.0, 0), ("bad",)], T0)
    assert (len(q), q.next_id) == (1, 2)
    records = q.produce_many([("x", T0, T0 + HOUR, 0.0, 0), ("y", T0, T0 + HOUR, 5.0, 2)], T0)
    assert [as_json(r)["msg_id"] for r in records] == [2, 3]
    assert as_json(records[1]) == {"op": "produce", "queue": "q", "msg_id": 3, "ready": T0,
                          "ttl": T0 + HOUR, "retry": 5.0, "priority": 2, "data": "y",
                          "delivery_count": 0}
    assert take(q, T0, count=5) == ["y", "a", "x"]
    assert q.produce_many([], T0) == []


def test_ids_strictly_increasing_and_never_reused():
    q = make()
    seen = []
    for round_ in range(3):
        ids = [put(q, f"{round_}-{i}") for i in range(4)]
        seen.extend(ids)
        for mid in ids[:2]:
            q.confirm(mid)
        take(q, T0, count=10)
        assert len(q) == 0
    assert seen == list(range(1, 13))
    assert q.stats(T0)["max_id"] == 12
    assert put(q, "next") == 13


def test_ids_stop_below_2_pow_63():
    q = make(next_id=MAX_MSG_ID - 1)
    assert put(q, "a") == MAX_MSG_ID - 1
    with pytest.raises(OverflowError):
        q.produce_many([("x", T0, T0 + HOUR, 0.0, 0)] * 2, T0)
    assert len(q) == 1
    assert put(q, "b") == MAX_MSG_ID
    take(q, T0, count=5)
    with pytest.raises(OverflowError):
        put(q, "c")
    assert (len(q), q.next_id) == (0, MAX_MSG_ID + 1)
    with pytest.raises(ValueError):
        Queue("q", 10, next_id=0)


# ---------------------------------------------------------------- release, extend, restore

def test_release_makes_leased_message_ready_at_now():
    q = make()
    a = put(q, "a", retry=30)
    put(q, "b", now=T0 + 1)
    assert take(q, T0 + 2) == ["a"]
    assert as_json(q.release(a, T0 + 3)) == {"op": "release", "queue": "q", "msg_id": a,
                                    "ready": T0 + 3, "delivery_count": 1}
    msgs, _ = q.consume(T0 + 3, count=5)
    assert [(m.data, m.delivery_count) for m in msgs] == [("b", 1), ("a", 2)]
    assert q.release(999, T0) is None
    c = put(q, "c", now=T0 + 4)
    assert q.release(c, T0 + 4) is None  # not leased


def test_extend_moves_the_lease_deadline():
    q = make()
    mid = put(q, "m", retry=10)
    take(q, T0)
    assert as_json(q.extend(mid, T0 + 60)) == {"op": "consume", "queue": "q", "msg_id": mid,
                                      "lease": T0 + 60, "delivery_count": 1}
    assert q.next_event(T0) == T0 + 60
    assert take(q, T0 + 30) == []
    msgs, _ = q.consume(T0 + 60)
    assert [(m.msg_id, m.delivery_count) for m in msgs] == [(mid, 2)]
    assert q.extend(999, T0 + 100) is None
    ready = put(q, "ready")
    assert q.extend(ready, T0 + 100) is None


def test_restore_keeps_the_messages_own_max_deliveries():
    q = make()
    q.produce("once", T0, T0 + HOUR, 0.0, 0, T0, max_deliveries=3)
    [msg], _ = q.consume(T0 + 1)
    record = q.restore(msg)
    assert record.max_deliveries == 3
    [(_, stored)] = q.oldest(1)
    assert (stored.msg_id, stored.extra) == (msg.msg_id, {"max_deliveries": 3})


def test_restore_puts_an_undelivered_message_back_in_place():
    q = make(max_size=2)
    first = put(q, "first", retry=0)
    put(q, "second", retry=0)
    [msg], _ = q.consume(T0 + 1)
    assert (msg.msg_id, msg.delivery_count) == (first, 1)
    put(q, "third", now=T0 + 1)  # fills the queue again; a restore still goes in
    record = q.restore(msg)
    assert as_json(record) == {"op": "restore", "queue": "q", "msg_id": first, "ready": T0,
                      "ttl": T0 + HOUR, "retry": 0, "priority": 0, "data": "first",
                      "delivery_count": 0}
    assert (len(q), q.free(), q.next_id) == (3, 0, 4)
    assert [row[0] for row in q.snapshot()["messages"]] == [1, 2, 3]  # by msg_id, not by age
    msgs, _ = q.consume(T0 + 2, count=5)
    assert [(m.data, m.msg_id, m.delivery_count) for m in msgs] == [
        ("first", first, 1), ("second", 2, 1), ("third", 3, 1)]
    put(q, "x")
    with pytest.raises(ValueError):
        q.restore(Message(4, "dup", T0, T0 + HOUR, 0))


# ---------------------------------------------------------------- queries

def test_next_event():
    q = make()
    assert q.next_event(T0) is None
    put(q, "now")
    assert q.next_event(T0) is None  # ready already: nothing to wait for
    put(q, "d", ready=T0 + 50)
    assert q.next_event(T0) == T0 + 50
    put(q, "w", retry=20)
    take(q, T0, count=2)  # "now" deleted, "w" leased until T0+20
    assert q.next_event(T0) == T0 + 20
    assert q.next_event(T0 + 20) == T0 + 50  # strictly after now, even if not yet settled
    assert q.next_event(T0 + 50) is None
    put(q, "d2", ready=T0 + 70)
    assert q.next_event(T0 + 60) == T0 + 70


def test_stats_counts_every_state():
    q = make(max_size=10)
    assert q.stats(T0) == {"size": 0, "ready": 0, "delayed": 0, "in_flight": 0, "max_id": 0,
                           "max_size": 10}
    put(q, "r1")
    put(q, "r2")
    put(q, "d1", ready=T0 + 10)
    put(q, "d2", ready=T0 + 20)
    put(q, "l1", retry=5, priority=9)
    put(q, "l2", retry=50, ttl=T0 + 5, priority=9)
    take(q, T0, count=2)
    assert q.stats(T0) == {"size": 6, "ready": 2, "delayed": 2, "in_flight": 2, "max_id": 6,
                           "max_size": 10}
    # At T0+10: d1 due, l1's lease ended (ready again); l2's lease is far away.
    assert q.stats(T0 + 10) == {"size": 6, "ready": 4, "delayed": 1, "in_flight": 1,
                                "max_id": 6, "max_size": 10}
    # At T0+50: l2's lease ended after its ttl: still stored and counted in flight until expiry.
    assert q.stats(T0 + 50)["in_flight"] == 1
    q.expire_due(T0 + 50)
    assert q.stats(T0 + 50) == {"size": 5, "ready": 5, "delayed": 0, "in_flight": 0,
                                "max_id": 6, "max_size": 10}


def test_has_ready_ignores_leases_that_will_expire():
    q = make()
    put(q, "m", retry=10, ttl=T0 + 1)
    take(q, T0)
    assert not q.has_ready(T0 + 100)
    put(q, "n", retry=10, now=T0 + 1)
    take(q, T0 + 1)
    assert q.has_ready(T0 + 11)


# ---------------------------------------------------------------- lease tokens

def test_lease_param_leases_at_most_once_messages_too():
    q = make()
    mid = put(q, "once", retry=0)
    msgs, records = q.consume(T0, 1, lease=30)
    assert [(m.msg_id, m.lease, m.retry) for m in msgs] == [(mid, T0 + 30, 0)]
    assert as_json(records) == [{"op": "consume", "queue": "q", "msg_ids": [mid], "lease": T0 + 30,
                        "delivery_counts": [1]}]  # a consume with a lease: one record per batch
    assert take(q, T0 + 29) == []
    assert take(q, T0 + 30) == ["once"]  # the lease ended: ready again, then at most once
    assert len(q) == 0


def test_token_consume_binds_and_a_retry_returns_the_same_messages():
    q = make()
    ids = [put(q, f"m{i}", retry=5) for i in range(5)]
    msgs, records = q.consume(T0, 3, lease=60, token="t")
    assert [m.msg_id for m in msgs] == ids[:3]
    assert as_json(records) == [{"op": "consume", "queue": "q", "msg_ids": ids[:3], "lease": T0 + 60,
                        "delivery_counts": [1, 1, 1], "token": "t"}]
    assert q.held("t") == ids[:3] and q.tokens() == ["t"]
    assert all(q.token_of(i) == "t" for i in ids[:3]) and q.token_of(ids[3]) is None
    # The retry: the same messages, not new ones; no record without a lease to renew.
    again, records = q.consume(T0 + 1, 3, token="t")
    assert [(m.msg_id, m.delivery_count, m.lease) for m in again] == [(i, 1, T0 + 60) for i in ids[:3]]
    assert records == []
    # With a lease the retry renews the leases (same delivery_count, token kept).
    again, records = q.consume(T0 + 2, 3, lease=100, token="t")
    assert [m.lease for m in again] == [T0 + 102] * 3
    assert as_json(records) == [{"op": "consume", "queue": "q", "msg_ids": ids[:3], "lease": T0 + 102,
                        "delivery_counts": [1, 1, 1], "token": "t"}]
    assert take(q, T0 + 3, count=10) == ["m3", "m4"]


def test_token_loses_messages_whose_lease_ended_and_is_forgotten_when_empty():
    q = make()
    a, b = put(q, "a", retry=5), put(q, "b", retry=5)
    q.consume(T0, 1, lease=10, token="t")
    q.extend(a, T0 + 50)                  # by id: the token binding is kept
    assert q.token_of(a) == "t"
    q.consume(T0, 1, lease=10, token="u")
    assert q.held("u") == [b]
    q.expire_due(T0 + 10)                 # u's lease ended: b is ready again, u is forgotten
    assert q.held("u") == [] and q.tokens() == ["t"]
    msgs, _ = q.consume(T0 + 11, 5, lease=10, token="u")  # a new consume under the same token
    assert [(m.msg_id, m.delivery_count) for m in msgs] == [(b, 2)]
    assert q.release(a, T0 + 12) is not None
    assert q.tokens() == ["u"] and q.token_of(a) is None


def test_token_without_lease_binds_only_leased_messages():
    q = make()
    put(q, "once", retry=0)
    leased = put(q, "least", retry=9)
    msgs, records = q.consume(T0, 5, token="t")
    assert [m.data for m in msgs] == ["once", "least"]
    assert "token" not in as_json(records[0]) and as_json(records[1])["token"] == "t"
    assert q.held("t") == [leased]


def test_guards_stop_a_stale_client_from_touching_a_redelivered_message():
    q = make()
    mid = put(q, "m", retry=10)
    [first], _ = q.consume(T0, 1, token="old")
    # old's lease ends; someone else gets the message
    [second], _ = q.consume(T0 + 10, 1, token="new")
    assert second.delivery_count == 2
    assert q.confirm(mid, token="old") is None
    assert q.release(mid, T0 + 11, token="old") is None
    assert q.extend(mid, T0 + 99, token="old") is None
    assert q.confirm(mid, delivery_count=first.delivery_count) is None
    assert q.extend(mid, T0 + 99, delivery_count=1) is None
    assert q.token_of(mid) == "new" and len(q) == 1
    assert q.extend(mid, T0 + 30, token="new", delivery_count=2).token == "new"
    assert as_json(q.confirm(mid, token="new", delivery_count=2)) == {"op": "confirm", "queue": "q",
                                                             "msg_id": mid}
    assert q.tokens() == []


def test_token_guard_needs_a_lease_but_delivery_count_guard_does_not():
    q = make()
    mid = put(q, "m", retry=10)
    q.consume(T0, 1)
    q.release(mid, T0 + 1)                # ready again, delivery_count stays 1
    assert q.confirm(mid, token="t") is None
    assert q.confirm(mid, delivery_count=1) is not None  # processed, not redelivered: fine


def test_tokens_by_prefix():
    q = make()
    for i in range(6):
        put(q, f"m{i}", retry=5)
    for token in ("s1/r1/0", "s1/r1/1", "s1/r10/0", "s2/r1/0", "s1/r2/0"):
        q.consume(T0, 1, lease=60, token=token)
    assert q.tokens("s1/r1/") == ["s1/r1/0", "s1/r1/1"]
    assert q.tokens("s1/") == ["s1/r1/0", "s1/r1/1", "s1/r10/0", "s1/r2/0"]
    assert q.tokens("zzz") == [] and len(q.tokens()) == 5


def test_token_records_replay_and_snapshot():
    q = make()
    for i in range(4):
        put(q, f"m{i}", retry=5)
    replica = Queue.from_snapshot(orjson.loads(orjson.dumps(q.snapshot())))
    _, records = q.consume(T0, 2, lease=30, token="t")
    _, more = q.consume(T0, 1, lease=30)
    for rec in records + more:
        replica.apply(decode(encode(rec)))
    snap = q.snapshot()
    assert snap["messages"][0] == [1, "m0", T0, T0 + HOUR, 5, 0, 1, T0 + 30, "t"]
    assert snap["messages"][2] == [3, "m2", T0, T0 + HOUR, 5, 0, 1, T0 + 30]  # no token: 8 items
    assert replica.snapshot() == snap
    copy = Queue.from_snapshot(orjson.loads(orjson.dumps(snap)))
    assert copy.held("t") == [1, 2] and copy.snapshot() == snap
    check_invariants(copy)
    with pytest.raises(ValueError):
        q.apply(record_of({"op": "consume", "queue": "q", "msg_id": 4, "lease": None,
                 "delivery_count": 1, "token": "x"}))


def test_bulk_confirm_release_extend_make_one_record_each():
    q = make()
    ids = [put(q, f"m{i}", retry=5) for i in range(6)]
    q.consume(T0, 3, lease=30, token="a")
    q.consume(T0, 2, lease=30, token="b")
    targets = [(i, None, None) for i in ids[:5]]
    recs = q.extend_many(targets + [(999, None, None)], T0 + 90)
    assert as_json(recs) == [
        {"op": "consume", "queue": "q", "msg_ids": ids[:3], "lease": T0 + 90,
         "delivery_counts": [1, 1, 1], "token": "a"},
        {"op": "consume", "queue": "q", "msg_ids": ids[3:5], "lease": T0 + 90,
         "delivery_counts": [1, 1], "token": "b"},
    ]
    assert q.held("a") == ids[:3]  # extending keeps the tokens
    rec = q.release_many([(i, "a", None) for i in ids[:5]], T0 + 1)  # only a's leases
    assert as_json(rec) == {"op": "release", "queue": "q", "msg_ids": ids[:3], "ready": T0 + 1}
    assert q.tokens() == ["b"]
    assert q.release_many([(ids[5], None, None)], T0 + 1) is None  # not leased
    rec = q.confirm_many([(i, None, None) for i in ids] + [(ids[0], None, None)])
    assert as_json(rec) == {"op": "confirm", "queue": "q", "msg_ids": ids}  # each id once
    assert len(q) == 0 and q.tokens() == []
    assert q.confirm_many([(ids[0], None, None)]) is None


def test_list_form_records_replay_like_single_ones():
    q = make()
    ids = [put(q, f"m{i}", retry=5) for i in range(4)]
    replica = Queue.from_snapshot(orjson.loads(orjson.dumps(q.snapshot())))
    records = q.consume(T0, 4, lease=10, token="t")[1]
    records += q.extend_many([(i, None, None) for i in ids[:2]], T0 + 50)
    records.append(q.release_many([(i, None, None) for i in ids[2:]], T0 + 2))
    records.append(q.confirm_many([(i, "t", 1) for i in ids]))
    for rec in records:
        replica.apply(decode(encode(rec)))
    assert replica.snapshot() == q.snapshot() and len(q) == 2
    assert as_json(q.confirm_many([(i, None, None) for i in ids])) == {"op": "confirm", "queue": "q",
                                                               "msg_ids": ids[2:]}
    with pytest.raises(ValueError):
        q.apply(record_of({"op": "consume", "queue": "q", "msg_ids": [1], "lease": None, "delivery_counts": [1]}))


# ---------------------------------------------------------------- idempotent produce

def test_idempotent_produce_is_remembered_and_replicated():
    q = make()
    records = q.produce_many([("a", T0, T0 + HOUR, 0.0, 0), ("b", T0, T0 + HOUR, 0.0, 0)], T0,
                             "p", 7)
    assert all(as_json(r)["producer"] == "p" and as_json(r)["sequence"] == 7 for r in records)
    single = q.produce("c", T0, T0 + HOUR, 0.0, 0, T0, "p", 8)
    assert q.produced("p", 7) == (1, 2) and q.produced("p", 8) == (as_json(single)["msg_id"], 1)
    assert q.produced("p", 9) is None and q.produced("other", 7) is None
    with pytest.raises(ValueError):
        q.produce("dup", T0, T0 + HOUR, 0.0, 0, T0, "p", 7)
    assert len(q) == 3
    replica = make()
    for rec in records + [single]:
        replica.apply(decode(encode(rec)))
    assert replica.produced("p", 7) == (1, 2) and replica.snapshot() == q.snapshot()
    assert q.snapshot()["dedupe"] == [["p", 7, 1, 2], ["p", 8, 3, 1]]
    take(q, T0, count=5)                  # consuming does not forget: a retry is still a duplicate
    assert Queue.from_snapshot(q.snapshot()).produced("p", 7) == (1, 2)


def test_dedupe_window_forgets_the_oldest_first():
    q = Queue("q", 100, dedupe_window=3)
    for s in range(5):
        assert q.produce(f"m{s}", T0, T0 + HOUR, 0.0, 0, T0, "p", s).msg_id == s + 1
    assert [q.produced("p", s) for s in range(5)] == [None, None, (3, 1), (4, 1), (5, 1)]
    assert "dedupe" not in make().snapshot()


# ---------------------------------------------------------------- snapshots and replay

def busy_queue() -> Queue:
    q = make(max_size=50)
    put(q, "ready", priority=3)
    put(q, "delayed", ready=T0 + 40)
    put(q, "leased", retry=30)
    put(q, "once", retry=0)
    put(q, "confirmed")
    q.consume(T0, count=1)                      # "ready" deleted
    q.consume(T0, count=1)                      # "leased" leased
    q.confirm(5)
    return q


def test_snapshot_round_trip():
    q = busy_queue()
    snap = q.snapshot()
    assert snap["next_id"] == 6
    assert [row[0] for row in snap["messages"]] == [2, 3, 4]
    assert snap["messages"][1] == [3, "leased", T0, T0 + HOUR, 30, 0, 1, T0 + 30]
    copy = Queue.from_snapshot(orjson.loads(orjson.dumps(snap)))
    assert copy.snapshot() == snap
    assert (len(copy), copy.next_id, copy.stats(T0)) == (len(q), q.next_id, q.stats(T0))
    check_invariants(copy)
    for now in (T0, T0 + 30, T0 + 40, T0 + 100):
        assert q.next_event(now) == copy.next_event(now)
        assert q.consume(now, 10) == copy.consume(now, 10)
        assert q.snapshot() == copy.snapshot()
    assert put(copy, "new") == 6


def test_apply_of_produce_advances_next_id():
    q = make()
    q.apply(record_of({"op": "produce", "queue": "q", "msg_id": 41, "ready": T0, "ttl": T0 + 1,
             "retry": 0, "priority": 0, "data": "x", "delivery_count": 0}))
    assert q.next_id == 42
    q.apply(record_of({"op": "restore", "queue": "q", "msg_id": 7, "ready": T0, "ttl": T0 + 1,
             "retry": 0, "priority": 0, "data": "y", "delivery_count": 0}))
    assert q.next_id == 42
    assert take(q, T0, count=5) == ["y", "x"]
    with pytest.raises(ValueError):
        q.apply(record_of({"op": "nope", "queue": "q", "msg_id": 1}))
    with pytest.raises(ValueError, match="not a queue record"):
        q.apply(DeleteQueue(queue="q"))  # the service's to apply, not a queue's
    with pytest.raises(KeyError):  # a replica out of sync must not silently carry on
        q.apply(record_of({"op": "confirm", "queue": "q", "msg_id": 7}))


def random_step(a: Queue, rng: random.Random, now: float, delivered: list[Message]) -> list[dict]:
    """One random leader operation on `a`; the records it produced."""
    roll = rng.random()
    ids = list(a._index) or [1]
    tokens = a.tokens() or ["t0"]
    if roll < 0.24:
        try:
            return [a.produce(f"d{rng.random():.6f}", now + rng.choice([0, 0, -1, 3, 8]),
                              now + rng.choice([2, 10, 40]), rng.choice([0, 0, 4, 9]),
                              rng.choice([0, 0, 1, 5]), now)]
        except QueueFull:
            return []
    if roll < 0.32:
        items = [(f"b{i}", now + rng.choice([0, 2]), now + 30, rng.choice([0, 5]), 0)
                 for i in range(rng.randint(1, 4))]
        key = (rng.choice(["p1", "p2"]), rng.randrange(30)) if rng.random() < 0.5 else (None, None)
        if key[0] is not None and a.produced(*key):
            return []
        try:
            return a.produce_many(items, now, *key)
        except QueueFull:
            return []
    if roll < 0.48:
        msgs, records = a.consume(now, rng.randint(1, 3))
        delivered.extend(m for m in msgs if m.retry == 0)
        return records
    if roll < 0.56:
        lease = rng.choice([None, 3, 12])
        msgs, records = a.consume(now, rng.randint(1, 3), lease, f"t{rng.randrange(6)}")
        delivered.extend(m for m in msgs if m.lease is None)
        return records
    if roll < 0.64:
        guard = rng.choice([None, rng.choice(tokens)])
        r = a.confirm(rng.choice(ids + [10**6]), guard, rng.choice([None, None, 1, 2]))
        return [r] if r else []
    if roll < 0.68:
        targets = [(i, t, None) for t in rng.sample(tokens, min(2, len(tokens))) for i in a.held(t)]
        targets += [(rng.choice(ids), None, rng.choice([None, 1])) for _ in range(rng.randint(0, 2))]
        rng.shuffle(targets)
        bulk = rng.choice(["confirm", "release", "extend"])
        if bulk == "confirm":
            return [r] if (r := a.confirm_many(targets)) else []
        if bulk == "release":
            return [r] if (r := a.release_many(targets, now)) else []
        return a.extend_many(targets, now + rng.choice([2, 9]))
    if roll < 0.74:
        r = a.release(rng.choice(ids), now, rng.choice([None, rng.choice(tokens)]))
        return [r] if r else []
    if roll < 0.82:
        r = a.extend(rng.choice(ids), now + rng.choice([1, 5, 20]), rng.choice([None, rng.choice(tokens)]))
        return [r] if r else []
    if roll < 0.90 and delivered:
        m = delivered.pop(rng.randrange(len(delivered)))
        return [] if m.msg_id in a else [a.restore(m)]
    return a.expire_due(now)


@pytest.mark.parametrize("seed", range(5))
def test_replica_replaying_records_matches_leader(seed):
    rng = random.Random(seed)
    a = Queue("q", 25, dedupe_window=8)  # small, so that the window's eviction is replayed too
    b = Queue("q", 25, dedupe_window=8)
    now = T0
    delivered: list[Message] = []
    ops_seen = set()
    tokens_seen = dedupe_seen = False
    list_forms_seen: set[str] = set()
    for _ in range(1500):
        now += rng.choice([0, 0, 0.5, 1, 2, 7])
        for record in random_step(a, rng, now, delivered):
            fields = as_json(record)
            ops_seen.add(fields["op"])
            if "msg_ids" in fields:
                list_forms_seen.add(fields["op"])
            b.apply(decode(encode(record)))
        assert a.snapshot() == b.snapshot()
        assert a.tokens() == b.tokens()
        assert all(a.held(t) == b.held(t) for t in a.tokens())
        tokens_seen = tokens_seen or bool(a.tokens())
        dedupe_seen = dedupe_seen or "dedupe" in a.snapshot()
        assert a.stats(now) == b.stats(now)
        assert a.next_event(now) == b.next_event(now)
    check_invariants(a)
    check_invariants(b)
    assert ops_seen == {"produce", "consume", "confirm", "expire", "release", "restore"}
    assert tokens_seen and dedupe_seen and list_forms_seen >= {"consume", "confirm", "release"}
    # A replica built from the leader's snapshot is the same queue too.
    c = Queue.from_snapshot(orjson.loads(orjson.dumps(a.snapshot())))
    check_invariants(c)
    assert c.snapshot() == a.snapshot() and c.tokens() == a.tokens()
    # The replica taking over as leader delivers exactly what the old leader would.
    for later in (now + 5, now + 50, now + 500):
        assert a.consume(later, 100) == b.consume(later, 100)
        assert a.snapshot() == b.snapshot()


@pytest.mark.parametrize("seed", range(5))
def test_state_queue_replays_to_the_same_snapshot(seed):
    """The coordinator's committed copy keeps no orderings but must snapshot exactly as the
    leader's queue does, and a Queue loaded from it serves the same messages."""
    rng = random.Random(seed)
    a = Queue("q", 25, dedupe_window=8)
    b = Queue("q", 25, dedupe_window=8)
    now = T0
    delivered: list[Message] = []
    for _ in range(1500):
        now += rng.choice([0, 0, 0.5, 1, 2, 7])
        for record in random_step(a, rng, now, delivered):
            b.apply(decode(encode(record)))
        assert a.snapshot() == b.snapshot()
        assert a.tokens() == b.tokens()
    c = Queue.from_snapshot(orjson.loads(orjson.dumps(b.snapshot())))
    assert Queue.from_snapshot(b.snapshot()).snapshot() == b.snapshot()
    for later in (now + 5, now + 50, now + 500):
        assert a.consume(later, 100) == c.consume(later, 100)


# ---------------------------------------------------------------- peek: what a consume would take


def _orderings(q: Queue) -> tuple:
    """Everything a peek must leave alone, orderings and tokens included."""
    return (q.snapshot(), list(q._delayed), list(q._ready),
            [(k, dict(v)) for k, v in q._leased.items()], q._n_leased,
            {t: set(ids) for t, ids in q._tokens.items()}, q.next_id)


def test_peek_tells_what_consume_takes_and_changes_nothing():
    q = make()
    put(q, "late", ready=T0 + 5)                      # delayed, due at T0 + 5
    put(q, "low", retry=10)
    put(q, "high", retry=10, priority=3)
    put(q, "once")
    taken, _ = q.consume(T0, 1)                       # "high", leased until T0 + 10
    assert [m.data for m in taken] == ["high"]
    before = _orderings(q)
    at = T0 + 10                                      # "late" is due, the lease of "high" ended
    peeked = q.peek(at, 3)
    assert _orderings(q) == before
    assert [(m.data, m.delivery_count, m.lease, m.ready) for m in peeked] == [
        ("high", 2, at + 10, T0 + 10), ("low", 1, at + 10, T0), ("once", 1, None, T0)]
    msgs, _ = q.consume(at, 3)
    assert msgs == peeked
    assert q.peek(at, 5) == [Message(1, "late", T0 + 5, T0 + 5 + HOUR, 0, 0, 1)]


def test_peek_with_lease_and_token_and_a_token_retry():
    q = make()
    ids = [put(q, f"m{i}", retry=0) for i in range(3)]
    peeked = q.peek(T0, 2, lease=30, token="t")
    assert [(m.msg_id, m.lease, m.token, m.delivery_count) for m in peeked] == [
        (ids[0], T0 + 30, "t", 1), (ids[1], T0 + 30, "t", 1)]
    assert q.consume(T0, 2, lease=30, token="t")[0] == peeked
    assert q.held_at("t", T0 + 29) == ids[:2] and q.held_at("t", T0 + 30) == []
    # A retry with the token: the held messages (leases renewed with `lease`), whatever count.
    again = q.peek(T0 + 1, 1, lease=50, token="t")
    assert [(m.msg_id, m.lease, m.delivery_count) for m in again] == [(i, T0 + 51, 1) for i in ids[:2]]
    assert q.consume(T0 + 1, 1, lease=50, token="t")[0] == again
    # Once the leases have ended the token holds nothing: a new consume, ended leases first.
    assert q.peek(T0 + 60, 3, token="t") == q.consume(T0 + 60, 3, token="t")[0]
    assert q.peek(T0 + 60, 0) == [] and make().peek(T0, 5) == []


@pytest.mark.parametrize("seed", range(4))
def test_peek_always_matches_the_consume_that_follows(seed):
    rng = random.Random(seed)
    q = Queue("q", 25, dedupe_window=8)
    now = T0
    delivered: list[Message] = []
    checked = 0
    for _ in range(1500):
        now += rng.choice([0, 0, 0.5, 1, 2, 7])
        random_step(q, rng, now, delivered)
        if rng.random() < 0.3:
            count = rng.randint(0, 4)
            lease = rng.choice([None, None, 3, 12])
            token = rng.choice([None, None, *q.tokens(), "t-new"])
            before = _orderings(q)
            peeked = q.peek(now, count, lease, token)
            assert _orderings(q) == before
            msgs, _ = q.consume(now, count, lease, token)
            assert msgs == peeked
            checked += bool(msgs)
            check_invariants(q)
    assert checked > 100


def test_peek_shows_a_messages_own_max_deliveries_as_the_consume_does():
    for retry in (0.0, 5.0):
        q = make()
        q.produce("m", T0, T0 + HOUR, retry, 0, T0, max_deliveries=3)
        peeked = q.peek(T0, 1, None, "t")
        assert peeked[0].extra == {"max_deliveries": 3}
        assert q.consume(T0, 1, None, "t")[0] == peeked


def test_a_snapshot_written_before_the_compact_messages_loads_unchanged():
    old = {"name": "q", "max_size": 10, "next_id": 5, "paused": True,
           "messages": [[1, "a", T0, T0 + HOUR, 0.0, 0, 0, None],
                        [2, "b", T0, T0 + HOUR, 5.0, 2, 1, T0 + 5, "tok"],
                        [3, "c", T0, T0 + HOUR, 5.0, 0, 0, None, None, {"max_deliveries": 3}],
                        [4, "d", T0, T0 + HOUR, 5.0]],
           "dedupe": [["p", 1, 1, 1]]}
    q = Queue.from_snapshot(orjson.loads(orjson.dumps(old)))
    again = dict(old, messages=old["messages"][:3] + [[4, "d", T0, T0 + HOUR, 5.0, 0, 0, None]])
    assert q.snapshot() == again
    assert q.held("tok") == [2] and q._index[3].extra == {"max_deliveries": 3}
    with pytest.raises(ValueError):
        Queue.from_snapshot(dict(old, messages=[[1, "a", T0, T0 + HOUR]]))


def test_messages_produced_together_share_their_state_until_one_changes():
    for q in (Queue("q", 10),):
        q.produce_many([("a", T0, T0 + HOUR, 5.0, 0)] * 3, T0)
        for r in Queue("src", 10, next_id=4).produce_many([("b", T0, T0 + HOUR, 5.0, 0)] * 2, T0):
            q.apply(as_replayed(r))
        states = [q._index[i]._state for i in range(1, 6)]
        assert all(s is states[0] for s in states)
        loaded = Queue.from_snapshot(orjson.loads(orjson.dumps(q.snapshot())))
        assert all(loaded._index[i]._state is loaded._index[1]._state for i in range(2, 6))
        q.apply(Queue.from_snapshot(q.snapshot()).consume(T0, 1)[1][0])
        assert q._index[1].lease == T0 + 5.0 and q._index[2].lease is None
        assert q._index[2]._state is states[0]


def as_replayed(record):
    """A record as a replica gets it: decoded from its JSON, every float a new object."""
    return decode(encode(record))
