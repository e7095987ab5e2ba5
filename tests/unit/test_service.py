"""PartitionService: request validation and semantics over the pure queues, with a fake clock."""
from __future__ import annotations

import pytest

from queue_server.server.gather import Gatherer, merge
from queue_server.protocol import vocabulary as p
from queue_server.protocol.ipc_frames import req_item
from queue_server.protocol.origin import Origin
from queue_server.protocol.records import decode_many, encode_many
from queue_server.server.router import Router
from queue_server.workers.service import PartitionService
from tests.unit.service_replies import take_replies

T0 = 1_700_000_000.0


class Svc:
    """A PartitionService driven like a worker drives it, collecting its outputs."""

    def __init__(self, **kw) -> None:
        kw.setdefault("queue_size", 100)
        self.s = PartitionService(node_id=7, **kw)
        self.now = T0
        self.n = 0
        self.replica = PartitionService(node_id=8, queue_size=kw["queue_size"], virtual_queues=kw.get("virtual_queues"))

    def call(self, req: dict, conn: int = 1, udp: bool = False) -> dict | None:
        self.n += 1
        self.s.handle(req, Origin(conn, udp), self.n, self.now)
        replies = self.drain()
        mine = [r for c, n, r in replies if n == self.n]
        return mine[0] if mine else None

    def drain(self) -> list:
        """Every reply, whichever way it leaves (through the coordinator or straight)."""
        replies = take_replies(self.s)
        for rec in decode_many(encode_many(self.s.records)):  # as the log carries them
            self.replica.apply(rec)
        self.s.records.clear()
        return replies

    def tick(self) -> list:
        self.s.tick(self.now)
        return self.drain()


def test_produce_consume_confirm_round_trip_echoes_fields():
    t = Svc()
    r = t.call({"action": 1, "queue": "q", "data": "hello", "retry": 5, "seq": 42})
    assert r["code"] == 0 and r["msg_id"] == 1 and r["seq"] == 42 and r["node_id"] == 7
    assert "data" not in r
    r = t.call({"action": "consume", "queue": "q"})
    assert (r["code"], r["msg_id"], r["data"], r["delivery_count"]) == (0, 1, "hello", 1)
    r = t.call({"action": 3, "queue": "q", "msg_id": 1})
    assert r == {"action": 3, "queue": "q", "msg_id": 1, "code": 0, "node_id": 7, "confirmed": 1}
    assert t.call({"action": 3, "queue": "q", "msg_id": 1})["confirmed"] == 0
    assert t.replica.snapshot() == t.s.snapshot()


def test_empty_consume_answers_code_0_without_msg_id():
    t = Svc()
    r = t.call({"action": 2, "queue": "nothing"})
    assert r["code"] == 0 and "msg_id" not in r and "data" not in r
    assert t.call({"action": 2, "queue": "nothing", "count": 5})["messages"] == []


def test_absolute_and_relative_times():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "abs", "delay": T0 + 10, "ttl": T0 + 100})
    t.call({"action": 1, "queue": "q", "data": "rel", "delay": 5, "ttl": 50})
    assert "msg_id" not in t.call({"action": 2, "queue": "q"})
    t.now = T0 + 5
    assert t.call({"action": 2, "queue": "q"})["data"] == "rel"
    t.now = T0 + 10.5
    assert t.call({"action": 2, "queue": "q"})["data"] == "abs"


def test_retry_redelivers_until_confirmed():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "x", "retry": 2})
    assert t.call({"action": 2, "queue": "q"})["delivery_count"] == 1
    assert "msg_id" not in t.call({"action": 2, "queue": "q"})
    t.now += 2
    assert t.call({"action": 2, "queue": "q"})["delivery_count"] == 2


def test_batch_produce_consume_confirm():
    t = Svc()
    r = t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"], "retry": 9})
    assert r["msg_ids"] == [1, 2, 3]
    r = t.call({"action": 2, "queue": "q", "count": 2})
    assert [(m["msg_id"], m["data"], m["delivery_count"]) for m in r["messages"]] == [(1, "a", 1), (2, "b", 1)]
    assert t.call({"action": 3, "queue": "q", "msg_ids": [1, 2, 99]})["confirmed"] == 2


def test_queue_full_is_all_or_none():
    t = Svc(queue_size=3)
    t.call({"action": 1, "queue": "q", "data": "a"})
    r = t.call({"action": 1, "queue": "q", "data": ["b", "c", "d"]})
    assert r["code"] == -1 and r["reason"] == "queue full"
    assert t.s.queues["q"].stats(t.now)["size"] == 1


def test_virtual_queue_fans_out_all_or_none():
    t = Svc(queue_size=2, virtual_queues={"v": ("a", "b")})
    r = t.call({"action": 1, "queue": "v", "data": "x"})
    assert r["msg_ids"] == {"a": 1, "b": 1}
    t.call({"action": 1, "queue": "b", "data": "fill"})
    r = t.call({"action": 1, "queue": "v", "data": "y"})
    assert r["code"] == -1 and r["reason"] == "queue full"
    assert len(t.s.queues["a"]) == 1 and len(t.s.queues["b"]) == 2
    r = t.call({"action": 1, "queue": "v", "data": ["p"]})
    assert r["code"] == -1
    r = t.call({"action": 2, "queue": "v"})
    assert r["code"] == -1 and "virtual" in r["reason"]


@pytest.mark.parametrize(
    "req,field",
    [
        ({"action": 1, "data": "x"}, "queue"),
        ({"action": 1, "queue": "q"}, "data"),
        ({"action": 1, "queue": "q", "data": 5}, "data"),
        ({"action": 1, "queue": "q", "data": ["a", 1]}, "data"),
        ({"action": 1, "queue": "q", "data": []}, "data"),
        ({"action": 1, "queue": "q", "data": "x", "delay": "soon"}, "delay"),
        ({"action": 1, "queue": "q", "data": "x", "ttl": [1]}, "ttl"),
        ({"action": 1, "queue": "q", "data": "x", "retry": "1"}, "retry"),
        ({"action": 1, "queue": "q", "data": "x", "retry": True}, "retry"),
        ({"action": 1, "queue": "q", "data": "x", "retry": -1}, "retry"),
        ({"action": 1, "queue": "q", "data": "x", "delay": 100, "ttl": 10}, "ttl"),
        ({"action": 1, "queue": "q", "data": "x", "priority": 1.5}, "priority"),
        ({"action": 2, "queue": "q", "count": 0}, "count"),
        ({"action": 2, "queue": "q", "count": 1001}, "count"),
        ({"action": 2, "queue": "q", "count": "3"}, "count"),
        ({"action": 2, "queue": "q", "wait": "x"}, "wait"),
        ({"action": 3, "queue": "q"}, "msg_id"),
        ({"action": 3, "queue": "q", "msg_id": "1"}, "msg_id"),
        ({"action": 3, "queue": "q", "msg_ids": [1, "2"]}, "msg_ids"),
        ({"action": 6, "queue": "q", "msg_id": 1}, "retry"),
        ({"action": 1, "queue": "x" * 257, "data": "x"}, "queue"),
        ({"action": 1, "queue": "a\nb", "data": "x"}, "queue"),
        ({"action": 1, "queue": "", "data": "x"}, "queue"),
        ({"action": 99, "queue": "q"}, "action"),
        ({"queue": "q"}, "action"),
    ],
)
def test_bad_requests_get_one_error_naming_the_field(req, field):
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "kept"})
    r = t.call(req)
    assert r["code"] == -1 and r["reason"].startswith(field), r
    assert len(t.s.queues["q"]) == 1


def test_long_poll_is_served_by_a_later_produce():
    t = Svc()
    assert t.call({"action": 2, "queue": "q", "wait": 10}, conn=5) is None
    t.n += 1
    t.s.handle({"action": 1, "queue": "q", "data": "late"}, Origin(6), t.n, t.now)
    replies = t.drain()
    served = [r for c, n, r in replies if c == Origin(5)]
    assert served[0]["data"] == "late"


def test_long_poll_times_out_with_an_empty_reply_and_honours_max_wait():
    t = Svc(max_wait=3)
    assert t.call({"action": 2, "queue": "q", "wait": 100}, conn=5) is None
    assert t.s.next_deadline(t.now) <= T0 + 3
    t.now = T0 + 2.9
    assert [r for _, _, r in t.tick() if r.get("action") == 2] == []
    t.now = T0 + 3
    replies = t.tick()
    assert len(replies) == 1 and replies[0][0] == Origin(5) and "msg_id" not in replies[0][2]


def test_long_poll_served_when_a_delayed_message_becomes_ready():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "d", "delay": 2})
    assert t.call({"action": 2, "queue": "q", "wait": 10}, conn=5) is None
    assert t.tick() == []
    assert t.s.next_deadline(t.now) == T0 + 1  # the first lease sweep comes before the message
    t.now = T0 + 1
    assert t.tick() == []
    assert t.s.next_deadline(t.now) == T0 + 2
    t.now = T0 + 2
    replies = t.tick()
    assert replies[0][2]["data"] == "d"


def test_long_poll_over_udp_answers_at_once():
    t = Svc()
    r = t.call({"action": 2, "queue": "q", "wait": 10}, conn=0, udp=True)
    assert r["code"] == 0 and "msg_id" not in r


def test_closed_connection_drops_its_waiters():
    t = Svc()
    t.call({"action": 2, "queue": "q", "wait": 10}, conn=5)
    t.s.cancel(5)
    t.call({"action": 1, "queue": "q", "data": "x"})
    assert t.call({"action": 2, "queue": "q"})["data"] == "x"


def test_undelivered_messages_come_back():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "once"})
    t.call({"action": 1, "queue": "q", "data": "least", "retry": 60})
    a = t.call({"action": 2, "queue": "q"})
    b = t.call({"action": 2, "queue": "q"})
    t.s.undeliver("q", [[a["msg_id"], 1], [b["msg_id"], 1]], t.now)
    t.drain()
    got = sorted(t.call({"action": 2, "queue": "q"})["data"] for _ in range(2))
    assert got == ["least", "once"]
    assert t.replica.snapshot() == t.s.snapshot()


def test_a_late_give_back_leaves_a_later_lease_alone():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "least", "retry": 5})
    first = t.call({"action": 2, "queue": "q"})
    t.now += 6  # the lease ends; another consumer takes it
    second = t.call({"action": 2, "queue": "q"})
    assert second["delivery_count"] == 2
    t.s.undeliver("q", [[first["msg_id"], first["delivery_count"]]], t.now)
    assert t.s.records == []
    assert "msg_id" not in t.call({"action": 2, "queue": "q"})  # still leased to the second


def test_expired_leases_are_swept():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "x", "retry": 5, "ttl": 3})
    t.call({"action": 2, "queue": "q"})
    t.now += 5
    t.tick()
    assert len(t.s.queues["q"]) == 0
    assert t.replica.snapshot() == t.s.snapshot()


def test_release_and_extend():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "x", "retry": 5})
    m = t.call({"action": 2, "queue": "q"})
    assert t.call({"action": 6, "queue": "q", "msg_id": m["msg_id"], "retry": 100})["extended"] == 1
    t.now += 50
    assert "msg_id" not in t.call({"action": 2, "queue": "q"})
    assert t.call({"action": 5, "queue": "q", "msg_ids": [m["msg_id"]]})["released"] == 1
    assert t.call({"action": 2, "queue": "q"})["delivery_count"] == 2


def test_partials_and_merge():
    t = Svc()
    t.call({"action": 1, "queue": "alpha", "data": "x"})
    t.call({"action": 1, "queue": "beta", "data": "y", "delay": 60})
    g = Gatherer()
    req = {"action": 7, "pattern": "a"}
    t.s.partial([1, [3, False, 0], 4, 1, req], req, t.now)
    conn, req_no, request, parts = g.add(*t.s.partials.pop())
    reply = merge(request, parts, {"node_id": 7})
    assert reply["queue_list"] == ["alpha", "beta"] and reply["queue_count"] == 2
    req = {"action": 4}
    t.s.partial([2, [3, False, 0], 5, 1, req], req, t.now)
    _, _, request, parts = g.add(*t.s.partials.pop())
    reply = merge(request, parts, {"node_id": 7, "trans_id": 2})
    assert (reply["size"], reply["ready"], reply["delayed"], reply["queue_count"], reply["trans_id"]) == (2, 1, 1, 2, 2)


def test_gatherer_waits_for_every_part():
    g = Gatherer()
    tag = [9, [1, False, 0], 2, 2, {"action": 7}]
    assert g.add(tag, {"queue_list": ["a"]}) is None
    assert g.add(tag, {"queue_list": ["b"]})[3] == [{"queue_list": ["a"]}, {"queue_list": ["b"]}]
    assert len(g) == 0


def test_router_is_stable_and_keeps_virtual_groups_together():
    r = Router(4, [("v", ["a", "b"]), ("w", ["b", "c"])])
    assert len({r.worker_for(n) for n in ("v", "w", "a", "b", "c")}) == 1
    assert Router(4).worker_for("some-queue") == Router(4).worker_for("some-queue")
    spread = {Router(4).worker_for(f"q{i}") for i in range(100)}
    assert spread == {0, 1, 2, 3}


def test_a_router_numbers_its_scatter_requests_in_steps_of_two_from_its_first_gather():
    listing = {"action": p.LIST}

    def gathers(r: Router) -> list[int]:
        produce = {"action": p.PRODUCE, "queue": "q"}
        assert r.plan(p.PRODUCE, produce, Origin(1), 9) == [(r.worker_for("q"), req_item(Origin(1), 9, produce))]
        return [r.plan(p.LIST, listing, Origin(1), n)[0][1][3][0] for n in range(3)]

    assert gathers(Router(2)) == [0, 2, 4]  # the acceptor's; the produce planned first took no number
    assert gathers(Router(2, first_gather=1)) == [1, 3, 5]  # the coordinator's


# ---------------------------------------------------------------- lease tokens (protocol extension)

def test_token_consume_retry_returns_the_same_messages_with_times():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"], "delay": 0, "ttl": 600})
    r = t.call({"action": 2, "queue": "q", "count": 2, "token": "job/1", "lease": 30, "times": True})
    assert [(m["data"], m["delivery_count"], m["ready"], m["ttl"], m["lease_until"])
            for m in r["messages"]] == [("a", 1, T0, T0 + 600, T0 + 30), ("b", 1, T0, T0 + 600, T0 + 30)]
    assert "replayed" not in r and r["token"] == "job/1"
    t.now += 5
    again = t.call({"action": 2, "queue": "q", "count": 2, "token": "job/1", "lease": 30})
    assert again["replayed"] is True
    assert [(m["msg_id"], m["delivery_count"]) for m in again["messages"]] == [(1, 1), (2, 1)]
    assert t.s.queues["q"]._index[1].lease == T0 + 35  # renewed
    assert t.call({"action": 2, "queue": "q", "token": "other", "lease": 30})["data"] == "c"
    assert t.replica.snapshot() == t.s.snapshot()


def test_token_retry_is_answered_even_when_nothing_is_ready_and_over_long_poll():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "x"})
    first = t.call({"action": 2, "queue": "q", "token": "t", "lease": 10, "wait": 5}, conn=3)
    again = t.call({"action": 2, "queue": "q", "token": "t", "lease": 10, "wait": 5}, conn=4)
    assert (again["msg_id"], again["data"], again["replayed"]) == (first["msg_id"], "x", True)
    # A new token on an empty queue parks; the produce that serves it binds to the token.
    assert t.call({"action": 2, "queue": "q", "count": 3, "token": "u", "lease": 10, "wait": 5}, conn=5) is None
    t.n += 1
    t.s.handle({"action": 1, "queue": "q", "data": "y"}, Origin(6), t.n, t.now)
    served = next(r for c, _, r in t.drain() if c == Origin(5))
    assert [m["data"] for m in served["messages"]] == ["y"]
    assert t.s.queues["q"].held("u") == [served["messages"][0]["msg_id"]]
    assert t.replica.snapshot() == t.s.snapshot()


def test_confirm_release_extend_by_token_tokens_and_prefix():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": [f"m{i}" for i in range(6)]})
    for token in ("s/1/a", "s/1/b", "s/2/a"):
        t.call({"action": 2, "queue": "q", "count": 2, "token": token, "lease": 30})
    r = t.call({"action": 6, "queue": "q", "token_prefix": "s/1/", "retry": 100})
    assert r["extended"] == 4
    assert t.call({"action": 5, "queue": "q", "token": "s/2/a"})["released"] == 2
    r = t.call({"action": 3, "queue": "q", "tokens": ["s/1/a", "s/1/b", "nope"]})
    assert r["confirmed"] == 4 and "tokens" not in r
    assert t.call({"action": 3, "queue": "q", "token": "s/1/a"})["confirmed"] == 0
    assert t.s.queues["q"].tokens() == [] and len(t.s.queues["q"]) == 2
    assert t.replica.snapshot() == t.s.snapshot()


def test_ids_with_a_token_act_only_on_messages_leased_under_it():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b"], "retry": 5})
    mine = t.call({"action": 2, "queue": "q", "token": "mine", "lease": 10})["msg_id"]
    theirs = t.call({"action": 2, "queue": "q"})["msg_id"]
    r = t.call({"action": 3, "queue": "q", "msg_ids": [mine, theirs], "token": "mine"})
    assert r["confirmed"] == 1 and theirs in t.s.queues["q"]


def test_expired_lease_holder_cannot_confirm_extend_or_release_the_next_delivery():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "x", "retry": 5})
    stale = t.call({"action": 2, "queue": "q"})
    t.now += 5                                        # the lease ends; another client takes it
    fresh = t.call({"action": 2, "queue": "q", "token": "B", "lease": 30})
    assert fresh["delivery_count"] == 2
    mid, dc = stale["msg_id"], stale["delivery_count"]
    assert t.call({"action": 3, "queue": "q", "msg_id": mid, "delivery_count": dc})["confirmed"] == 0
    assert t.call({"action": 6, "queue": "q", "msg_ids": [mid], "delivery_counts": [dc], "retry": 9})["extended"] == 0
    assert t.call({"action": 5, "queue": "q", "msg_id": mid, "token": "A"})["released"] == 0
    assert t.call({"action": 3, "queue": "q", "msg_id": mid, "delivery_count": 2})["confirmed"] == 1


@pytest.mark.parametrize(
    "req,field",
    [
        ({"action": 2, "queue": "q", "lease": 0}, "lease"),
        ({"action": 2, "queue": "q", "lease": "5"}, "lease"),
        ({"action": 2, "queue": "q", "token": ""}, "token"),
        ({"action": 2, "queue": "q", "token": 5}, "token"),
        ({"action": 2, "queue": "q", "token": "x" * 257}, "token"),
        ({"action": 2, "queue": "q", "times": 1}, "times"),
        ({"action": 3, "queue": "q", "tokens": ["a", 1]}, "tokens"),
        ({"action": 3, "queue": "q", "tokens": "a"}, "tokens"),
        ({"action": 3, "queue": "q", "token_prefix": 3}, "token_prefix"),
        ({"action": 3, "queue": "q", "token": "a", "tokens": ["b"]}, "token"),
        ({"action": 3, "queue": "q", "msg_ids": [1, 2], "delivery_counts": [1]}, "delivery_counts"),
        ({"action": 3, "queue": "q", "msg_id": 1, "delivery_counts": [1]}, "delivery_counts"),
        ({"action": 3, "queue": "q", "delivery_counts": None}, "msg_id"),
        ({"action": 3, "queue": "q", "msg_ids": [1], "delivery_counts": "1"}, "delivery_counts"),
        ({"action": 3, "queue": "q", "msg_ids": [1], "delivery_count": 1}, "delivery_count"),
        ({"action": 3, "queue": "q", "msg_id": 1, "delivery_count": "1"}, "delivery_count"),
        ({"action": 5, "queue": "q"}, "msg_id"),
        ({"action": 1, "queue": "q", "data": "x", "producer": "p"}, "sequence"),
        ({"action": 1, "queue": "q", "data": "x", "sequence": 1}, "producer"),
        ({"action": 1, "queue": "q", "data": "x", "producer": "p", "sequence": -1}, "sequence"),
        ({"action": 1, "queue": "q", "data": "x", "producer": "p", "sequence": 1.5}, "sequence"),
        ({"action": 1, "queue": "q", "data": "x", "producer": 7, "sequence": 1}, "producer"),
    ],
)
def test_bad_extension_fields_get_one_error_naming_the_field(req, field):
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "kept"})
    r = t.call(req)
    assert r["code"] == -1 and r["reason"].startswith(field + ":"), r
    assert len(t.s.queues["q"]) == 1


# ---------------------------------------------------------------- idempotent produce

def test_idempotent_produce_retry_returns_the_original_ids_and_stores_nothing():
    t = Svc(queue_size=5)
    r = t.call({"action": 1, "queue": "q", "data": ["a", "b"], "producer": "w/3", "sequence": 0})
    assert r["msg_ids"] == [1, 2] and "duplicate" not in r
    again = t.call({"action": 1, "queue": "q", "data": ["a", "b"], "producer": "w/3", "sequence": 0})
    assert again["msg_ids"] == [1, 2] and again["duplicate"] is True
    one = t.call({"action": 1, "queue": "q", "data": "c", "producer": "w/3", "sequence": 1})
    assert t.call({"action": 1, "queue": "q", "data": "c", "producer": "w/3", "sequence": 1})["msg_id"] == one["msg_id"]
    assert len(t.s.queues["q"]) == 3
    r = t.call({"action": 1, "queue": "q", "data": ["a"], "producer": "w/3", "sequence": 0})
    assert r["code"] == -1 and r["reason"].startswith("sequence:")
    t.call({"action": 1, "queue": "q", "data": ["x", "y"]})  # now full
    full = t.call({"action": 1, "queue": "q", "data": ["a", "b"], "producer": "w/3", "sequence": 0})
    assert full["code"] == 0 and full["duplicate"] is True  # a duplicate is not refused as full
    assert t.replica.snapshot() == t.s.snapshot()


def test_idempotent_produce_to_a_virtual_queue():
    t = Svc(virtual_queues={"v": ("a", "b")})
    r = t.call({"action": 1, "queue": "v", "data": ["x", "y"], "producer": "p", "sequence": 9})
    assert r["msg_ids"] == {"a": [1, 2], "b": [1, 2]}
    again = t.call({"action": 1, "queue": "v", "data": ["x", "y"], "producer": "p", "sequence": 9})
    assert again["msg_ids"] == {"a": [1, 2], "b": [1, 2]} and again["duplicate"] is True
    assert len(t.s.queues["a"]) == len(t.s.queues["b"]) == 2
    assert t.replica.snapshot() == t.s.snapshot()


def test_a_follower_does_not_expire_leases_itself():
    """Expiry is the leader's decision; a follower's queues change only by its records."""
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "x", "retry": 5, "ttl": 3})
    t.call({"action": 2, "queue": "q"})
    t.s.accepting = False
    t.now += 5
    t.s.tick(t.now)
    assert t.s.records == [] and len(t.s.queues["q"]) == 1
    t.s.accepting = True
    t.now += 1  # the next sweep
    t.tick()
    assert len(t.s.queues["q"]) == 0


def test_a_follower_neither_gives_messages_back_nor_holds_polls():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "once"})
    m = t.call({"action": 2, "queue": "q"})
    assert t.call({"action": 2, "queue": "q", "wait": 10}, conn=5) is None
    t.s.accepting = False
    t.s.undeliver("q", [[m["msg_id"], m["delivery_count"]]], t.now)
    assert t.s.records == [] and len(t.s.queues["q"]) == 0
    replies = t.tick()
    assert [(c, "msg_id" in r) for c, _, r in replies] == [(Origin(5), False)] and not t.s.waiters


def test_a_node_that_replayed_an_at_most_once_delivery_restores_it_when_it_leads():
    """The message's consume was decided on another leader: this node (the replica) keeps the
    delivery from the record it replayed, and once it leads restores the message when it is
    given back, as that delivery left it, once."""
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "once", "priority": 3, "ttl": 600})
    m = t.call({"action": 2, "queue": "q"})
    t.call({"action": 1, "queue": "q", "data": "later"})
    assert len(t.replica.queues["q"]) == 1
    given = [[m["msg_id"], m["delivery_count"]]]
    t.replica.undeliver("q", [[m["msg_id"], m["delivery_count"] + 1]], t.now)  # not that delivery
    assert t.replica.records == []
    t.replica.undeliver("q", given, t.now)  # it leads now (accepting) and the message comes back
    [restore] = t.replica.records
    assert (restore.msg_id, restore.data, restore.priority, restore.delivery_count) == (m["msg_id"], "once", 3, 0)
    t.s.apply(restore)  # replayed by the old leader in turn: it forgets the delivery too
    t.replica.records.clear()
    for node in (t.replica, t.s):
        node.undeliver("q", given, t.now)  # a second give-back restores nothing
        assert node.records == []
    assert t.replica.snapshot() == t.s.snapshot()
    assert [msg.data for msg in t.replica.queues["q"].consume(t.now, 2)[0]] == ["once", "later"]


def test_a_replayed_purge_or_deletion_forgets_the_deliveries_kept_to_restore():
    t = Svc()
    for queue in ("p", "d"):
        t.call({"action": 1, "queue": queue, "data": "once"})
        t.call({"action": 2, "queue": queue})
        t.call({"action": 1, "queue": queue, "data": "stays"})  # so that the purge has a record
    assert len(t.replica._restorable) == 2
    t.call({"action": "purge", "queue": "p"})
    t.call({"action": "delete_queue", "queue": "d"})
    assert len(t.replica._restorable) == 0


def test_a_service_with_no_restore_cache_keeps_no_deliveries_to_restore():
    leader = PartitionService(7, 100)
    state = PartitionService(7, 100, restore_cache=0)
    leader.handle({"action": 1, "queue": "q", "data": "once"}, Origin(1), 1, T0)
    leader.handle({"action": 2, "queue": "q"}, Origin(1), 2, T0)
    for rec in decode_many(encode_many(leader.records)):
        state.apply(rec)
    assert len(state.queues["q"]) == 0 and not state._restorable and len(leader._restorable) == 1


# ----------------------------------------------------------------------------- UDP size limit

TOO_LARGE = "response too large for UDP, use TCP"


@pytest.mark.parametrize("retry", [0, 30], ids=["at-most-once", "at-least-once"])
@pytest.mark.parametrize("count", [None, 3], ids=["single", "count"])
def test_udp_consume_too_large_for_a_datagram_takes_nothing(retry, count):
    t = Svc(udp_max_response=1000)
    t.call({"action": 1, "queue": "q", "data": ["x" * 600, "y" * 600, "z" * 600] if count else "x" * 1200,
            "retry": retry})
    before = t.s.snapshot()
    req = {"action": 2, "queue": "q", "seq": [3, "mine"], "wait": 5, "times": True}
    if count:
        req["count"] = count
    r = t.call(req, conn=0, udp=True)
    assert r == {"action": 2, "queue": "q", "seq": [3, "mine"], "code": -1, "reason": TOO_LARGE, "node_id": 7}
    assert t.s.snapshot() == before and t.s.records == [] and not t.s.waiters
    # Over TCP the same consume takes the messages, delivered for the first time.
    got = t.call(req)
    messages = got["messages"] if count else [got]
    assert [m["delivery_count"] for m in messages] == [1] * (count or 1)
    # A UDP consume whose reply fits is served as before.
    t.call({"action": 1, "queue": "q", "data": "small", "retry": retry})
    assert t.call({"action": 2, "queue": "q"}, conn=0, udp=True)["data"] == "small"
    assert t.replica.snapshot() == t.s.snapshot()


def test_udp_size_limit_is_exactly_the_reply_as_encoded():
    """The limit counts the reply's bytes as the worker sends them (newline included)."""
    import orjson

    def first_consume(limit: int) -> dict:
        t = Svc(udp_max_response=limit)
        t.call({"action": 1, "queue": "q", "data": "d" * 700, "retry": 9})
        return t.call({"action": 2, "queue": "q", "times": True}, conn=0, udp=True)

    size = len(orjson.dumps(first_consume(65507), option=orjson.OPT_APPEND_NEWLINE))
    assert first_consume(size)["code"] == 0
    assert first_consume(size - 1)["reason"] == TOO_LARGE


def test_udp_token_retry_too_large_keeps_the_token_s_leases():
    t = Svc(udp_max_response=800)
    t.call({"action": 1, "queue": "q", "data": ["a" * 500, "b" * 500], "retry": 30})
    first = t.call({"action": 2, "queue": "q", "count": 2, "token": "tk", "lease": 60})  # over TCP
    assert len(first["messages"]) == 2
    before = t.s.snapshot()
    t.now += 1
    r = t.call({"action": 2, "queue": "q", "count": 2, "token": "tk", "lease": 60}, conn=0, udp=True)
    assert r["reason"] == TOO_LARGE and t.s.snapshot() == before  # leases not renewed
    again = t.call({"action": 2, "queue": "q", "count": 2, "token": "tk"})
    assert again["replayed"] is True and [m["msg_id"] for m in again["messages"]] == [1, 2]


def test_udp_max_response_defaults_to_the_config_default():
    from queue_server.config.loader import parse_config

    config, _ = parse_config("{}")
    assert PartitionService(node_id=1, queue_size=10).udp_max_response == config.udp_max_response


@pytest.mark.parametrize("number", [0, 30])
def test_a_replica_holds_byte_for_byte_what_the_leader_holds_whole_numbers_included(number):
    """A retry / delay / ttl written as a whole number (30, not 30.0) is stored as the float the
    record carries, so the leader's state and a replica's snapshot the same bytes (the cluster
    simulation compares them: seed 173 found an int on the leader and a float on the replicas)."""
    import orjson
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": "a", "retry": number, "delay": number, "ttl": 3600})
    t.call({"action": 1, "queue": "q", "data": ["b", "c"], "retry": number})
    t.call({"action": "consume", "queue": "q", "wait": 0, "lease": 60})
    assert orjson.dumps(t.s.snapshot(), option=orjson.OPT_SORT_KEYS) == \
        orjson.dumps(t.replica.snapshot(), option=orjson.OPT_SORT_KEYS)


def test_confirm_with_report_ids_names_the_ids_it_deleted():
    t = Svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"]})
    r = t.call({"action": 3, "queue": "q", "msg_ids": [3, 99, 1, 3], "report_ids": True})
    assert (r["confirmed"], r["confirmed_ids"]) == (2, [3, 1])
    assert t.call({"action": 3, "queue": "q", "msg_id": 2, "report_ids": True})["confirmed_ids"] == [2]
    assert t.call({"action": 3, "queue": "q", "msg_id": 2, "report_ids": True})["confirmed_ids"] == []
    assert "confirmed_ids" not in t.call({"action": 3, "queue": "q", "msg_id": 1})
    r = t.call({"action": 3, "queue": "q", "msg_id": 1, "report_ids": 1})
    assert (r["code"], r["reason"]) == (-1, "report_ids: must be true or false")
