"""client/linger.py: which requests merge, when a batch is due, its request and the split of
its reply; time is an argument (a fake clock), nothing is sent."""
from __future__ import annotations

import pytest

from queue_server.client import linger
from queue_server.client import protocol as p
from queue_server.client.errors import QueueError

T0 = 1000.0
ME = "client-me"


def produce(data: str, seq: int = 0, **kw) -> dict:
    return p.produce_request("q", data, producer=ME, sequence=seq, **kw)


def key(req: dict) -> linger.Key:
    k = linger.batch_key(req, ME)
    assert k is not None, req
    return k


def test_requests_with_the_same_queue_and_options_share_a_key():
    assert key(produce("a", 1, retry=30)) == key(produce("b", 2, retry=30))
    assert key(produce("a", retry=30)) != key(produce("a", retry=31))
    assert key(p.produce_request("q", "a", retry=0)) == key(produce("a", retry=0))  # idempotent=False
    assert key(p.consume_request("q", lease=5)) != key(p.consume_request("q"))
    assert key(p.ids_request(p.CONFIRM, "q", 1)) != key(p.ids_request(p.CONFIRM, "q", 1, delivery_count=2))


@pytest.mark.parametrize("req", [
    p.produce_request("q", ["a", "b"]),                        # already a batch
    p.produce_request("q", "a", producer="theirs", sequence=1),  # the caller's own idempotency key
    p.produce_request("q", "a", producer=ME),                  # malformed: sequence missing
    p.produce_request("q", "a", sequence=1),                    # malformed: producer missing
    {**p.produce_request("q", "a"), "seq": 3},                 # a field the batch could not echo
    p.produce_request("q", "a", delay=[1]),                    # malformed: the server says so, alone
    p.consume_request("q", wait=2),                            # a long poll
    p.consume_request("q", count=3),
    p.consume_request("q", token="t"),
    p.ids_request(p.CONFIRM, "q", [1, 2]),
    p.ids_request(p.CONFIRM, "q", True),
    p.ids_request(p.CONFIRM, "q", 1, token="t"),
    p.ids_request(p.RELEASE, "q", 1),
    {"action": "produce", "queue": "q", "data": "a"},
])
def test_requests_that_go_alone(req):
    assert linger.batch_key(req, ME) is None


def test_a_batch_is_due_after_the_linger_or_when_full():
    b = linger.Batcher[str](0.001, max_items=3)
    k = key(produce("a"))
    assert b.add(k, "c1", produce("a"), T0) == []
    assert b.add(k, "c2", produce("b"), T0 + 0.0005) == []
    assert b.next_deadline() == T0 + 0.001
    assert b.due(T0 + 0.0009) == []
    [batch] = b.due(T0 + 0.001)
    assert batch.callers == ["c1", "c2"] and b.next_deadline() is None
    for i in range(2):
        assert b.add(k, f"d{i}", produce("x"), T0 + 1) == []
    [full] = b.add(k, "d2", produce("x"), T0 + 1)
    assert full.callers == ["d0", "d1", "d2"] and b.due(T0 + 5) == []


def test_a_batch_never_exceeds_its_bytes():
    b = linger.Batcher[str](0.001, max_bytes=100)
    k = key(produce("a"))
    assert b.add(k, "small", produce("x" * 40), T0) == []
    [first] = b.add(k, "big", produce("y" * 70), T0)      # would not fit: the first goes now
    assert first.callers == ["small"]
    big, alone = b.add(k, "huge", produce("z" * 500), T0)  # over the limit by itself: goes alone
    assert (big.callers, alone.callers) == (["big"], ["huge"])
    assert b.due(T0 + 1) == []


def test_linger_is_at_most_one_millisecond():
    with pytest.raises(ValueError):
        linger.Batcher(0.002)
    with pytest.raises(ValueError):
        linger.Batcher(0)


def _batch(reqs: list[dict]) -> linger.Batch[int]:
    b = linger.Batcher[int](0.001)
    for i, req in enumerate(reqs):
        b.add(key(req), i, req, T0)
    [batch] = b.due(T0 + 1)
    return batch


def test_a_batch_of_one_is_the_lone_request_and_reply():
    req = produce("a", 4, retry=30)
    batch = _batch([req])
    assert linger.batch_request(batch, p.ProducerSequence(ME)) is req
    reply = {"action": 1, "code": 0, "msg_id": 9}
    assert linger.split_reply(batch, reply) == [reply]


def test_produces_become_one_batch_produce_and_each_gets_its_id():
    batch = _batch([produce("a", 1, retry=30, priority=2), produce("b", 2, retry=30, priority=2)])
    numbering = p.ProducerSequence(ME)
    numbering.sequence = 7
    req = linger.batch_request(batch, numbering)
    assert req == {"action": 1, "queue": "q", "data": ["a", "b"], "retry": 30, "priority": 2,
                   "producer": ME, "sequence": 7}
    replies = linger.split_reply(batch, {**req, "code": 0, "msg_ids": [11, 12], "node_id": 3})
    assert [p.produced_ids(r) for r in replies] == [11, 12]
    assert replies[0] == {"action": 1, "queue": "q", "retry": 30, "priority": 2, "producer": ME,
                          "sequence": 1, "code": 0, "msg_id": 11, "node_id": 3}
    virtual = linger.split_reply(batch, {"code": 0, "msg_ids": {"a": [1, 2], "b": [5, 6]}})
    assert [p.produced_ids(r) for r in virtual] == [{"a": 1, "b": 5}, {"a": 2, "b": 6}]
    with pytest.raises(QueueError, match="no msg_ids for 2"):
        linger.split_reply(batch, {"code": 0, "msg_ids": [11]})


def test_consumes_become_a_count_and_the_messages_go_to_callers_in_order():
    batch = _batch([p.consume_request("q", times=True)] * 3)
    assert linger.batch_request(batch, None) == {"action": 2, "queue": "q", "count": 3, "times": True}
    m = {"msg_id": 4, "data": "a", "delivery_count": 2, "ready": 1.0, "ttl": 2.0, "lease_until": None}
    replies = linger.split_reply(batch, {"code": 0, "messages": [m], "node_id": 1})
    first = p.message_from_reply("q", replies[0])
    assert first == p.Message("q", 4, "a", 2, 1.0, 2.0, None)
    assert [p.message_from_reply("q", r) for r in replies[1:]] == [None, None]
    assert linger.consumed(replies[0]) and not linger.consumed(replies[1])


def test_confirms_ask_which_ids_were_deleted_and_a_repeated_id_is_the_first_callers():
    reqs = [p.ids_request(p.CONFIRM, "q", i) for i in (1, 2, 1, 3)]
    batch = _batch(reqs)
    req = linger.batch_request(batch, None)
    assert req == {"action": 3, "queue": "q", "msg_ids": [1, 2, 1, 3], "report_ids": True}
    replies = linger.split_reply(batch, {"code": 0, "confirmed": 2, "confirmed_ids": [1, 3]})
    assert [p.confirmed_one(r) for r in replies] == [True, False, False, True]
    assert replies[0]["msg_id"] == 1
    with pytest.raises(QueueError, match="linger_ms=0"):
        linger.split_reply(batch, {"code": 0, "confirmed": 2})  # a server without report_ids


def test_guarded_confirms_carry_their_delivery_counts():
    batch = _batch([p.ids_request(p.CONFIRM, "q", 1, delivery_count=2),
                    p.ids_request(p.CONFIRM, "q", 5, delivery_count=1)])
    assert linger.batch_request(batch, None)["delivery_counts"] == [2, 1]


def test_callers_that_left_are_dropped_and_their_messages_rehomed_or_released():
    b = linger.Batcher[str](0.001)
    k = key(p.consume_request("q"))
    for c in ("gone", "w1", "w2"):
        b.add(k, c, p.consume_request("q"), T0)
    assert b.take(k, 1, lambda c: c != "gone") == [("w1", p.consume_request("q"))]
    [rest] = b.due(T0 + 1)
    assert rest.callers == ["w2"]  # the caller that left is gone from its batch too
    assert rest.size == linger.request_size(p.consume_request("q"))  # and its bytes with it
    assert rest.keep(lambda c: False).callers == []
    assert b.take(k, 5, lambda c: True) == []
    orphan = {"action": 2, "queue": "q", "code": 0, "msg_id": 7, "data": "x", "delivery_count": 3}
    assert linger.as_reply_to(p.consume_request("q"), orphan) == {
        "action": 2, "queue": "q", "code": 0, "msg_id": 7, "data": "x", "delivery_count": 3}
    assert linger.release_request("q", [orphan, {"code": 0}]) == {
        "action": 5, "queue": "q", "msg_ids": [7], "delivery_counts": [3]}
    assert linger.release_request("q", [{"code": 0}]) is None


def test_take_all_empties_the_batcher():
    b = linger.Batcher[str](0.001)
    b.add(key(produce("a")), "c1", produce("a"), T0)
    b.add(key(p.consume_request("q")), "c2", p.consume_request("q"), T0)
    assert sorted(c for bt in b.take_all() for c in bt.callers) == ["c1", "c2"]
    assert b.next_deadline() is None
