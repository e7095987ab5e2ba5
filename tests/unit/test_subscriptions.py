"""Push subscriptions with credit on the pure service (workers/subscriptions.py), fake clock:
credit is never exceeded, confirm / release / lease expiry free it, a closed connection or a
lost leadership ends the subscription, and pushes follow the consume rules."""
from __future__ import annotations

from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from tests.unit.test_service import Svc

SUB = 9  # the subscriber's connection


def pushes(t: Svc) -> list[dict]:
    """Replies pushed to the subscriber by the last calls and a tick."""
    t.s.tick(t.now)
    return [r for o, n, r in t.drain() if n == p.PUSH_REQ_NO and o == Origin(SUB)]


def subscribe(t: Svc, queue: str, credit: int) -> dict:
    return t.call({"action": "subscribe", "queue": queue, "credit": credit}, conn=SUB)


def leased(t: Svc, queue: str) -> int:
    return t.s.queues[queue].stats(t.now)["in_flight"]


def test_credit_is_never_exceeded_and_confirm_frees_it():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": [f"m{i}" for i in range(10)], "retry": 30})
    assert subscribe(t, "q", 3)["subscribed"] == 3
    got = pushes(t)
    assert [m["data"] for m in got] == ["m0", "m1", "m2"] and all(m["push"] for m in got)
    assert pushes(t) == [] and leased(t, "q") == 3
    t.call({"action": 3, "queue": "q", "msg_id": got[0]["msg_id"]})
    assert [m["data"] for m in pushes(t)] == ["m3"]
    t.call({"action": 5, "queue": "q", "msg_id": got[1]["msg_id"]})  # release: ready again, credit free
    assert [m["data"] for m in pushes(t)] == ["m1"]
    # the leases end unconfirmed: credit is free again, and the next ready ones are pushed
    # (the expired ones are ready again at their lease deadline, after m4..m9)
    t.now += 31
    again = pushes(t)
    assert [(m["data"], m["delivery_count"]) for m in again] == [("m4", 1), ("m5", 1), ("m6", 1)]
    assert leased(t, "q") == 3
    assert t.replica.snapshot() == t.s.snapshot()


def test_credit_can_change_and_0_stops_the_flow():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"], "retry": 30})
    subscribe(t, "q", 0)
    assert pushes(t) == []
    subscribe(t, "q", 2)
    assert len(pushes(t)) == 2
    t.call({"action": 1, "queue": "q", "data": "d", "retry": 30})
    assert pushes(t) == []  # no credit left
    subscribe(t, "q", 4)
    assert [m["data"] for m in pushes(t)] == ["c", "d"]


def test_at_most_once_pushes_are_deleted_and_hold_credit_until_confirmed():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"]})
    subscribe(t, "q", 2)
    got = pushes(t)
    assert [m["data"] for m in got] == ["a", "b"] and len(t.s.queues["q"]) == 1
    assert pushes(t) == []
    assert t.call({"action": 3, "queue": "q", "msg_ids": [got[0]["msg_id"], got[1]["msg_id"]]})["confirmed"] == 0
    assert [m["data"] for m in pushes(t)] == ["c"]


def test_new_messages_are_pushed_as_they_come_and_paused_queues_push_nothing():
    t = Svc()
    subscribe(t, "q", 5)
    t.call({"action": "pause", "queue": "q"})
    t.call({"action": 1, "queue": "q", "data": "x", "retry": 30})
    assert pushes(t) == []
    t.call({"action": "resume", "queue": "q"})
    assert [m["data"] for m in pushes(t)] == ["x"]
    t.call({"action": 1, "queue": "q", "data": "later", "retry": 30, "delay": 5})
    assert pushes(t) == []
    assert t.s.next_deadline(t.now) <= t.now + 5
    t.now += 5
    assert [m["data"] for m in pushes(t)] == ["later"]


def test_a_closed_connection_ends_it_and_its_leased_pushes_come_back_after_their_lease():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b"], "retry": 10})
    subscribe(t, "q", 1)
    assert [m["data"] for m in pushes(t)] == ["a"]
    t.s.cancel(SUB)
    t.call({"action": 1, "queue": "q", "data": "c", "retry": 10})
    assert pushes(t) == []
    t.now += 11
    r = t.call({"action": 2, "queue": "q", "count": 5})
    assert sorted(m["data"] for m in r["messages"]) == ["a", "b", "c"]


def test_undelivered_pushes_are_given_back():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["amo"]})
    subscribe(t, "q", 1)
    [push] = pushes(t)
    assert p.delivered(push) == ("q", [[push["msg_id"], 1]])
    t.s.undeliver("q", p.delivered(push)[1], t.now)
    t.drain()
    assert len(t.s.queues["q"]) == 1  # restored, not lost with the push


def test_losing_leadership_ends_every_subscription_with_a_message():
    t = Svc()
    subscribe(t, "q", 1)
    subscribe(t, "r", 1)
    t.s.accepting = False
    ended = pushes(t)
    assert len(ended) == 2 and all(e["code"] == -1 and e["reason"].startswith("subscription ended") for e in ended)
    assert not t.s.subs


def test_bad_subscribe_requests_name_the_field():
    t = Svc(virtual_queues={"fan": ("a", "b")})
    for req, field in (({"action": "subscribe", "queue": "q"}, "credit"),
                       ({"action": "subscribe", "queue": "q", "credit": "5"}, "credit"),
                       ({"action": "subscribe", "queue": "q", "credit": -1}, "credit"),
                       ({"action": "subscribe", "queue": "q", "credit": 1001}, "credit"),
                       ({"action": "subscribe", "credit": 1}, "queue"),
                       ({"action": "subscribe", "queue": "fan", "credit": 1}, "queue")):
        r = t.call(req, conn=SUB)
        assert r["code"] == -1 and r["reason"].startswith(field + ": "), r
    r = t.call({"action": "subscribe", "queue": "q", "credit": 1}, udp=True)
    assert r["reason"].startswith("subscribe: ")
    t.s.handle({"action": "subscribe", "queue": "q", "credit": 1}, Origin(5, False, 2), 1, t.now)
    assert t.drain()[0][2]["reason"].startswith("subscribe: ")  # forwarded by a follower
    assert not t.s.subs


def test_pushes_are_not_counted_as_requests():
    from queue_server.server.reply_counts import count_replies

    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b"], "retry": 30})
    t.n += 1
    t.s.handle({"action": "subscribe", "queue": "q", "credit": 5}, Origin(SUB), t.n, t.now)
    t.s.tick(t.now)
    counts: dict = {}
    count_replies(counts, t.s.replies)
    assert len(t.s.replies) == 3 and counts == {("subscribe", 0): 1}
