"""Queue administration and dead letters on the pure cores (workers/queue.py, workers/admin.py,
workers/service.py): peek, purge, delete_queue, pause/resume, max_deliveries, ttl dead letters
and dlq_replay. Fake clock only; every change is checked against a replica replaying the
records and against a snapshot round trip."""
from __future__ import annotations

import orjson
import pytest

from queue_server.protocol.origin import Origin
from queue_server.protocol.records import decode_many, encode
from queue_server.server.router import Router
from queue_server.workers.queue import Queue
from tests.unit.test_queue import HOUR, T0, as_json, check_invariants, put
from tests.unit.test_service import Svc


def dlq_pair(max_deliveries: int = 0) -> tuple[Queue, dict[str, Queue]]:
    """A queue "q" whose dead letters go to "q.dlq" (created on demand in the returned dict)."""
    queues: dict[str, Queue] = {}

    def lookup(name: str) -> Queue:
        if name not in queues:
            queues[name] = Queue(name, 100)
            queues[name].dead_letters_to(None, lookup)
        return queues[name]

    q = lookup("q")
    q.dead_letters_to("q.dlq", lookup, max_deliveries)
    return q, queues


def replay(records: list[dict]) -> dict[str, Queue]:
    """Replay records (JSON round trip) into fresh Queues, as a follower's coordinator does."""
    queues: dict[str, Queue] = {}

    def lookup(name: str) -> Queue:
        if name not in queues:
            queues[name] = Queue(name, 100)
            queues[name].dead_letters_to(None, lookup)
        return queues[name]

    for record in decode_many(encode(records)):
        lookup(record.queue).apply(record)
    return queues


def test_unconfirmed_deliveries_move_the_message_to_the_dlq_with_count_and_reason():
    q, queues = dlq_pair(max_deliveries=2)
    records = [q.produce("job", T0, T0 + HOUR, 10, 0, T0)]
    for i in range(2):
        msgs, recs = q.consume(T0 + 20 * i)
        records += recs
        assert [m.delivery_count for m in msgs] == [i + 1]
    # the second lease ends unconfirmed: a dead letter, not a third delivery
    msgs, recs = q.consume(T0 + 40)
    records += recs
    assert msgs == [] and len(q) == 0
    assert [as_json(r)["op"] for r in recs] == ["dead_letter"]
    assert recs[0].reason == "max_deliveries" and recs[0].ready == T0 + 30
    dlq = queues["q.dlq"]
    [(_, dead)] = dlq.look(T0 + 40, "ready", 10)
    assert (dead.data, dead.delivery_count, dead.retry) == ("job", 2, 0.0)
    assert dead.extra["dead"] == {"queue": "q", "reason": "max_deliveries", "retry": 10, "ttl": T0 + HOUR}
    assert q.counts["dead_lettered"] == 1 and q.counts["expired"] == 0
    check_invariants(q)
    check_invariants(dlq)
    # a replica replays it without a clock and ends with the same state
    copy = replay(records)
    assert copy["q"].snapshot() == q.snapshot() and copy["q.dlq"].snapshot() == dlq.snapshot()


def test_a_produce_s_own_max_deliveries_wins_and_0_means_unlimited():
    q, queues = dlq_pair(max_deliveries=1)
    q.produce("a", T0, T0 + HOUR, 10, 0, T0, max_deliveries=3)
    q.produce("b", T0, T0 + HOUR, 10, 0, T0, max_deliveries=0)
    counts = []
    for i in range(6):
        msgs, _ = q.consume(T0 + 20 * i, 2)
        counts.append(sorted((m.data, m.delivery_count) for m in msgs))
    assert counts[2] == [("a", 3), ("b", 3)]
    assert counts[3] == [("b", 4)]  # a: dead after its third delivery
    assert [m.data for _, m in queues["q.dlq"].oldest(10)] == ["a"]
    # the per-message limit survives a snapshot
    assert Queue.from_snapshot(orjson.loads(orjson.dumps(q.snapshot())))._index[2].extra == {"max_deliveries": 0}


def test_an_at_least_once_message_outliving_its_ttl_becomes_a_dead_letter():
    q, queues = dlq_pair()
    q.produce("x", T0, T0 + 8, 10, 0, T0)
    q.consume(T0)
    assert q.expire_due(T0 + 5) == []
    [rec] = q.expire_due(T0 + 10)
    assert as_json(rec)["op"] == "dead_letter" and as_json(rec)["reason"] == "ttl"
    [(_, dead)] = queues["q.dlq"].oldest(10)
    assert dead.extra["dead"]["reason"] == "ttl" and dead.delivery_count == 1
    assert q.counts["expired"] == 1 and q.counts["dead_lettered"] == 1


def test_without_a_dead_letter_queue_expired_messages_are_removed_and_counted():
    q = Queue("q", 100)
    q.max_deliveries = 1
    q.produce("x", T0, T0 + 8, 10, 0, T0)
    q.produce("y", T0, T0 + HOUR, 10, 0, T0)
    q.consume(T0, 2)
    recs = q.expire_due(T0 + 10)
    assert [(as_json(r)["op"], r.reason) for r in recs] == [("expire", None), ("expire", "max_deliveries")]
    assert len(q) == 0 and q.counts["expired"] == 2


def test_a_dead_letter_is_never_counted_ready_in_its_source_queue():
    q, _ = dlq_pair(max_deliveries=1)
    q.produce("x", T0, T0 + HOUR, 10, 0, T0)
    q.consume(T0)
    assert not q.has_ready(T0 + 11) and q.stats(T0 + 11)["ready"] == 0
    assert q.peek(T0 + 11, 5) == []


def test_replay_moves_dead_letters_back_fresh_and_the_replica_agrees():
    q, queues = dlq_pair(max_deliveries=1)
    records = [q.produce("job", T0, T0 + 100, 10, 3, T0)]
    records += q.consume(T0)[1]
    records += q.expire_due(T0 + 10)
    dlq = queues["q.dlq"]
    rec = q.replay_dead(dlq, T0 + 200, T0 + 200 + HOUR)
    records.append(rec)
    assert len(dlq) == 0 and as_json(rec)["moves"] == [[1, 2, T0 + 200 + HOUR]]
    [(_, m)] = q.look(T0 + 200, "ready", 5)
    assert (m.msg_id, m.data, m.delivery_count, m.retry, m.priority, m.ttl) == (2, "job", 0, 10, 3, T0 + 200 + HOUR)
    assert q.replay_dead(dlq, T0 + 200, T0) is None
    copy = replay(records)
    assert copy["q"].snapshot() == q.snapshot() and copy["q.dlq"].snapshot() == dlq.snapshot()
    check_invariants(q)


def test_replay_takes_only_what_fits_and_leaves_leased_dead_letters():
    q, queues = dlq_pair(max_deliveries=1)
    for i in range(3):
        q.produce(f"m{i}", T0, T0 + HOUR, 10, 0, T0)
    q.consume(T0, 3)
    q.expire_due(T0 + 10)
    q.max_size = 2
    dlq = queues["q.dlq"]
    dlq.consume(T0 + 11, 1, lease=30)  # someone is looking at m0
    rec = q.replay_dead(dlq, T0 + 12, T0)
    assert [m for m, _, _ in as_json(rec)["moves"]] == [2, 3] and len(dlq) == 1


def test_pause_stops_deliveries_keeps_produces_and_is_replicated():
    q = Queue("q", 100)
    records = [q.set_paused(True)]
    assert q.set_paused(True) is None
    put(q, "a")
    records.append(q.produce("b", T0, T0 + HOUR, 0, 0, T0))
    assert q.consume(T0 + 1, 5)[0] == [] and not q.has_ready(T0 + 1) and q.peek(T0 + 1, 5) == []
    assert [m.data for _, m in q.look(T0 + 1, "ready", 5)] == ["a", "b"]  # peek still sees them
    snap = orjson.loads(orjson.dumps(q.snapshot()))
    assert snap["paused"] is True and Queue.from_snapshot(snap).paused
    assert replay(records)["q"].paused
    records.append(q.set_paused(False))
    assert [m.data for m in q.consume(T0 + 1, 5)[0]] == ["a", "b"]
    assert "paused" not in q.snapshot()


def test_purge_deletes_everything_in_one_record_and_ids_go_on():
    q = Queue("q", 100)
    records = [q.produce("a", T0, T0 + HOUR, 10, 0, T0, "p", 1)]
    put(q, "later", ready=T0 + 50)
    records += q.consume(T0, 1, lease=5, token="t")[1]
    records.append(q.produce("later", T0 + 50, T0 + HOUR, 0, 0, T0))
    rec = q.purge()
    records.append(rec)
    assert as_json(rec) == {"op": "purge", "queue": "q", "count": 3}
    assert len(q) == 0 and q.held("t") == [] and q.purge() is None
    check_invariants(q)
    assert put(q, "new") == 4
    assert q.produced("p", 1) == (1, 1)  # the dedupe window is kept: a retry is still no duplicate


def looked(q: Queue, now: float, state: str, count: int, after: list | None = None) -> list[str]:
    return [m.data for _, m in q.look(now, state, count, after)]


def test_look_lists_each_state_in_the_order_it_leaves_it():
    q = Queue("q", 100)
    put(q, "r1", retry=10)
    put(q, "r2", priority=5)
    put(q, "d2", ready=T0 + 20)
    put(q, "d1", ready=T0 + 10)
    put(q, "l", retry=30)
    q.consume(T0, 1)  # r2 (priority): at most once, gone
    q.consume(T0, 1)  # r1 leased until T0 + 10
    q.consume(T0 + 1, 1)  # l leased until T0 + 31
    assert looked(q, T0 + 1, "delayed", 5) == ["d1", "d2"]
    assert looked(q, T0 + 1, "leased", 5) == ["r1", "l"]
    assert looked(q, T0 + 1, "leased", 1) == ["r1"]
    assert looked(q, T0 + 1, "ready", 5) == []
    # at T0 + 15, r1's lease has ended and d1 is due: both ready, neither delayed nor leased
    assert looked(q, T0 + 15, "ready", 5) == ["r1", "d1"]
    [(_, r1), _] = q.look(T0 + 15, "ready", 5)
    assert (r1.ready, r1.lease) == (T0 + 10, None)  # as it will be: ready since its lease ended
    assert looked(q, T0 + 15, "delayed", 5) == ["d2"]
    assert looked(q, T0 + 15, "leased", 5) == ["l"]
    before = q.snapshot()
    q.look(T0 + 15, "ready", 5)
    assert q.snapshot() == before
    with pytest.raises(ValueError):
        q.look(T0, "gone", 1)


@pytest.mark.parametrize("state", ["ready", "delayed", "leased"])
def test_look_pages_through_a_state_with_cursors(state):
    q = Queue("q", 1000)
    for i in range(50):
        if state == "delayed":
            put(q, f"m{i}", ready=T0 + 100 + i % 7)
        else:
            put(q, f"m{i}", retry=100 + i % 7, priority=i % 3)
    if state == "leased":
        for i in range(50):
            q.consume(T0 + i % 5, 1)
    # some are due already: ready by their ready time (or lease end), in with the rest
    now = T0 + 103 if state != "leased" else T0 + 5
    everything = looked(q, now, state, 1000)
    pages, after = [], None
    while True:
        page = q.look(now, state, 7, after)
        if not page:
            break
        pages += [m.data for _, m in page]
        after = page[-1][0]
    assert pages == everything and len(set(everything)) == len(everything) > 0


def test_router_puts_a_dead_letter_queue_with_its_queue():
    r = Router(7, (), ".dlq")
    for name in ("jobs", "a", "x.y", "orders-2024"):
        assert r.worker_for(name + ".dlq") == r.worker_for(name)
    assert Router(7).worker_for("jobs.dlq") == Router(7).worker_for("jobs.dlq")


# ------------------------------------------------------------------ the service


def svc(**kw) -> Svc:
    kw.setdefault("dead_letter_suffix", ".dlq")
    t = Svc(**kw)
    t.replica = type(t.s)(node_id=8, queue_size=100, dead_letter_suffix="")  # decides nothing itself
    return t


def check_replica(t: Svc) -> None:
    assert t.replica.snapshot() == t.s.snapshot()


def test_peek_changes_nothing_and_filters_by_state():
    t = svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"], "retry": 30})
    t.call({"action": 1, "queue": "q", "data": "later", "delay": 60})
    t.call({"action": 2, "queue": "q"})
    before = t.s.snapshot()
    r = t.call({"action": "peek", "queue": "q", "count": 5})
    assert r["code"] == 0 and [m["data"] for m in r["messages"]] == ["b", "c"]
    assert r["messages"][0]["delivery_count"] == 0 and "token" not in r["messages"][0]
    assert [m["data"] for m in t.call({"action": 20, "queue": "q", "state": "leased"})["messages"]] == ["a"]
    assert [m["data"] for m in t.call({"action": 20, "queue": "q", "state": "delayed"})["messages"]] == ["later"]
    first = t.call({"action": 20, "queue": "q", "count": 1})
    assert first["messages"][0]["data"] == "b"
    assert [m["data"] for m in t.call({"action": 20, "queue": "q", "after": first["cursor"]})["messages"]] == ["c"]
    assert "cursor" not in t.call({"action": 20, "queue": "q", "after": [0, T0 + 99, 99]})
    assert t.call({"action": 20, "queue": "nothing"})["messages"] == []
    assert t.s.snapshot() == before and not t.s.records


@pytest.mark.parametrize("req,field", [
    ({"action": "peek"}, "queue"),
    ({"action": "peek", "queue": 5}, "queue"),
    ({"action": "peek", "queue": "q", "count": 0}, "count"),
    ({"action": "peek", "queue": "q", "count": 1001}, "count"),
    ({"action": "peek", "queue": "q", "count": "3"}, "count"),
    ({"action": "peek", "queue": "q", "count": True}, "count"),
    ({"action": "peek", "queue": "q", "state": "gone"}, "state"),
    ({"action": "peek", "queue": "q", "state": 1}, "state"),
    ({"action": "peek", "queue": "fan"}, "queue"),
    ({"action": "peek", "queue": "q", "after": [1, 2]}, "after"),
    ({"action": "peek", "queue": "q", "after": "x"}, "after"),
    ({"action": "peek", "queue": "q", "state": "dead", "after": [1.5]}, "after"),
    ({"action": "purge"}, "queue"),
    ({"action": "purge", "queue": ["q"]}, "queue"),
    ({"action": "delete_queue", "queue": ""}, "queue"),
    ({"action": "delete_queue", "queue": None}, "queue"),
    ({"action": "pause", "queue": {}}, "queue"),
    ({"action": "pause", "queue": "fan"}, "queue"),
    ({"action": "resume"}, "queue"),
    ({"action": "dlq_replay"}, "queue"),
    ({"action": "dlq_replay", "queue": "q.dlq"}, "queue"),
    ({"action": 1, "queue": "q", "data": "x", "max_deliveries": -1}, "max_deliveries"),
    ({"action": 1, "queue": "q", "data": "x", "max_deliveries": "2"}, "max_deliveries"),
    ({"action": 1, "queue": "q", "data": "x", "max_deliveries": 1.5}, "max_deliveries"),
])
def test_bad_admin_requests_get_one_error_naming_the_field(req, field):
    t = svc(virtual_queues={"fan": ("fa", "fb")})
    r = t.call(req)
    assert r["code"] == -1 and r["reason"].startswith(field + ":"), r
    assert not t.s.records and not t.s.errors


def test_purge_and_delete_of_a_missing_queue_answer_0():
    t = svc()
    assert t.call({"action": "purge", "queue": "none"}) == {
        "action": "purge", "queue": "none", "code": 0, "node_id": 7, "purged": 0}
    assert t.call({"action": "delete_queue", "queue": "none"})["deleted"] == 0
    assert t.call({"action": "resume", "queue": "none"})["changed"] == 0
    assert "none" not in t.s.queues and not t.s.records


def handle(t: Svc, req: dict, conn: int = 1) -> tuple[list[dict], list[dict]]:
    """Every reply (this request's and any it released) and the records of one request."""
    t.n += 1
    t.s.handle(req, Origin(conn), t.n, t.now)
    records = list(t.s.records)
    return [r for _, _, r in t.drain()], records


def test_purge_answers_how_many_in_one_record():
    t = svc()
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"], "retry": 30})
    t.call({"action": 2, "queue": "q"})
    [reply], records = handle(t, {"action": "purge", "queue": "q"})
    assert reply["purged"] == 3 and [as_json(r)["op"] for r in records] == ["purge"]
    check_replica(t)
    assert "msg_id" not in t.call({"action": 2, "queue": "q"})
    assert t.call({"action": "purge", "queue": "q"})["purged"] == 0


def test_delete_queue_removes_it_from_list_and_monitor_and_from_replicas():
    t = svc()
    t.call({"action": 1, "queue": "q", "data": "a"})
    t.call({"action": 1, "queue": "keep", "data": "a"})
    assert t.call({"action": "delete_queue", "queue": "q"})["deleted"] == 1
    check_replica(t)
    assert set(t.s.queues) == {"keep"}
    t.s.partial(["g"], {"action": 7}, t.now)
    assert t.s.partials[-1][1] == {"queue_list": ["keep"]}
    t.s.partial(["g"], {"action": 4}, t.now)
    assert t.s.partials[-1][1]["queue_count"] == 1
    # a new queue of that name starts afresh
    assert t.call({"action": 1, "queue": "q", "data": "b"})["msg_id"] == 1


def test_pause_parks_long_polls_and_resume_serves_them():
    t = svc()
    assert t.call({"action": "pause", "queue": "q"})["changed"] == 1
    assert t.call({"action": 1, "queue": "q", "data": "a"})["code"] == 0
    assert "msg_id" not in t.call({"action": 2, "queue": "q"})
    assert handle(t, {"action": 2, "queue": "q", "wait": 5}, conn=2) == ([], [])  # parked
    t.now += 1
    assert t.tick() == []  # still parked: the queue is paused
    t.s.partial(["g"], {"action": 4, "queue": "q"}, t.now)
    assert t.s.partials[-1][1]["paused"] is True
    check_replica(t)
    assert t.replica.queues["q"].paused
    replies, records = handle(t, {"action": "resume", "queue": "q"})
    assert [as_json(r)["op"] for r in records] == ["pause", "consume"]
    assert {(r["action"], r.get("data")) for r in replies} == {(2, "a"), ("resume", None)}
    check_replica(t)
    assert not t.replica.queues["q"].paused


def test_local_peek_is_served_by_a_follower_and_peek_is_not():
    t = svc()
    t.call({"action": 1, "queue": "q", "data": "a"})
    t.s.accepting = False
    assert t.call({"action": "local_peek", "queue": "q"})["messages"][0]["data"] == "a"
    assert t.call({"action": "peek", "queue": "q"})["reason"].startswith("not leader")


def test_dead_letter_round_trip_through_the_service():
    t = svc(max_deliveries=1)
    t.call({"action": 1, "queue": "q", "data": "job", "retry": 5})
    assert t.call({"action": 2, "queue": "q"})["delivery_count"] == 1
    t.now += 6
    t.tick()
    check_replica(t)
    r = t.call({"action": "peek", "queue": "q", "state": "dead"})
    [m] = r["messages"]
    assert (m["data"], m["dead_queue"], m["dead_reason"], m["delivery_count"]) == ("job", "q", "max_deliveries", 1)
    assert "q.dlq" in t.s.queues
    # looking at a dead letter under a lease does not lose it to max_deliveries again
    assert t.call({"action": 2, "queue": "q.dlq", "lease": 1})["delivery_count"] == 2
    t.now += 2
    t.tick()
    assert len(t.s.queues["q.dlq"]) == 1
    r = t.call({"action": "dlq_replay", "queue": "q"})
    assert r["moved"] == 1
    check_replica(t)
    r = t.call({"action": 2, "queue": "q"})
    assert (r["data"], r["delivery_count"]) == ("job", 1)
    assert t.call({"action": "dlq_replay", "queue": "q"})["moved"] == 0
    # the state survives a snapshot into a fresh service
    fresh = type(t.s)(node_id=9, queue_size=100, dead_letter_suffix=".dlq", max_deliveries=1)
    fresh.load_snapshot(orjson.loads(orjson.dumps(t.s.snapshot())))
    assert fresh.snapshot() == t.s.snapshot()


# ------------------------------------------------------------------ per-queue metrics


def test_per_queue_metrics_count_events_cap_labels_and_zero_deleted_queues():
    from prometheus_client import CollectorRegistry

    from queue_server.server.queue_metrics import OTHER, QueueMetrics

    registry = CollectorRegistry()
    qm = QueueMetrics(2, registry)
    get = registry.get_sample_value
    t = svc(max_deliveries=1)
    t.call({"action": 1, "queue": "a", "data": ["1", "2", "3"], "retry": 5})
    t.call({"action": 1, "queue": "b", "data": "x", "delay": 60})
    t.call({"action": 1, "queue": "c", "data": "y"})
    t.call({"action": 1, "queue": "d", "data": "z"})
    r = t.call({"action": 2, "queue": "a", "count": 2})
    t.call({"action": 3, "queue": "a", "msg_id": r["messages"][0]["msg_id"]})
    t.now += 6  # the other lease ends: a dead letter (max_deliveries 1)
    t.tick()
    qm.fold(t.s.queue_rows(t.now))
    assert get("queue_server_queue_produced_total", {"queue": "a"}) == 3
    assert get("queue_server_queue_consumed_total", {"queue": "a"}) == 2
    assert get("queue_server_queue_confirmed_total", {"queue": "a"}) == 1
    assert get("queue_server_queue_dead_lettered_total", {"queue": "a"}) == 1
    assert get("queue_server_queue_ready", {"queue": "a"}) == 1
    assert get("queue_server_queue_dead", {"queue": "a"}) == 1
    assert get("queue_server_queue_delayed", {"queue": "b"}) == 1
    # two queues get series of their own; the rest (c, d, a.dlq) are summed as _other
    assert get("queue_server_queue_ready", {"queue": OTHER}) == 3
    assert get("queue_server_queue_produced_total", {"queue": OTHER}) == 2
    assert get("queue_server_queue_ready", {"queue": "c"}) is None
    # counters move by what happened since; a deleted queue's gauges read 0
    t.call({"action": 1, "queue": "a", "data": "4"})
    t.call({"action": "delete_queue", "queue": "b"})
    qm.fold(t.s.queue_rows(t.now))
    assert get("queue_server_queue_produced_total", {"queue": "a"}) == 4
    assert get("queue_server_queue_delayed", {"queue": "b"}) == 0
    # a queue made again counts from its own start, never backwards
    t.call({"action": "delete_queue", "queue": "a"})
    t.call({"action": 1, "queue": "a", "data": "new"})
    qm.fold(t.s.queue_rows(t.now))
    assert get("queue_server_queue_produced_total", {"queue": "a"}) == 5
