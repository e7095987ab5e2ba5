"""Which replies skip the coordinator (PartitionService.direct, sent by Worker.flush straight to
the acceptor): only those that rest on no record, committed or not. Pure, with a fake clock."""
from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry

from queue_server.protocol import ipc_frames, replies
from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.protocol.records import Noop
from queue_server.server.metrics import WorkerMetrics
from queue_server.server.worker import Worker
from queue_server.workers.service import PartitionService

NOW = 1_700_000_000.0
OWN = Origin(5)  # a TCP connection of this node
FORWARDED = Origin(9, False, 2)  # forward id 9 of follower node 2


def _service(**kw) -> PartitionService:
    kw.setdefault("queue_size", 3)
    return PartitionService(node_id=1, virtual_queues={"fan": ("fan_a", "fan_b")}, dead_letter_suffix=".dlq",
                            max_queues=kw.pop("max_queues", 0), queue_share=kw.pop("queue_share", 0), **kw)


def _way(s: PartitionService, req: dict, origin: Origin = OWN, now: float = NOW) -> str:
    """Where the reply of `req` goes: "direct", "coordinator", or "parked" (none yet)."""
    s.handle(req, origin, 7, now)
    direct, through = list(s.direct), list(s.replies)
    s.direct.clear()
    s.replies.clear()
    s.records.clear()
    assert len(direct) + len(through) <= 1
    return "direct" if direct else "coordinator" if through else "parked"


def _filled(**kw) -> PartitionService:
    s = _service(**kw)
    _way(s, {"action": p.PRODUCE, "queue": "q", "data": "m", "producer": "p1", "sequence": 1})
    return s


@pytest.mark.parametrize("req", [
    "not json object",
    {"queue": "q"},
    {"action": "nope", "queue": "q"},
    {"action": p.PRODUCE, "queue": "q"},  # data: missing
    {"action": p.PRODUCE, "queue": "", "data": "x"},
    {"action": p.CONSUME, "queue": "q", "count": 0},
    {"action": p.CONSUME, "queue": "fan"},  # a virtual queue only takes produce
    {"action": p.CONFIRM, "queue": "q"},  # msg_id: missing
    {"action": p.PEEK, "queue": "q", "state": "gone"},
], ids=repr)
def test_a_refused_field_skips_the_coordinator(req):
    assert _way(_filled(), req) == "direct"


@pytest.mark.parametrize("req", [
    {"action": p.CONSUME, "queue": "q"},
    {"action": p.CONSUME, "queue": "q", "count": 5},
    {"action": p.CONSUME, "queue": "q", "wait": 1},  # to the UDP rule below: over TCP it parks
], ids=repr)
def test_an_empty_consume_skips_the_coordinator(req):
    s = _service()
    way = _way(s, req)
    assert way == ("parked" if "wait" in req else "direct")
    assert _way(s, {"action": p.CONSUME, "queue": "q", "wait": 1}, Origin(5, True)) == "direct"  # UDP: never parks
    _way(s, {"action": p.PAUSE, "queue": "paused"})
    assert _way(s, {"action": p.CONSUME, "queue": "paused"}) == "direct"  # paused: nothing to take


def test_replies_that_rest_on_records_go_through_the_coordinator():
    s = _filled()
    assert _way(s, {"action": p.PRODUCE, "queue": "q", "data": "a"}) == "coordinator"
    # an idempotent produce's "duplicate" rests on the original's record, maybe not committed yet
    assert _way(s, {"action": p.PRODUCE, "queue": "q", "data": "m", "producer": "p1", "sequence": 1}) == "coordinator"
    assert _way(s, {"action": p.CONSUME, "queue": "q", "lease": 30}) == "coordinator"
    assert _way(s, {"action": p.CONFIRM, "queue": "q", "msg_id": 1}) == "coordinator"
    assert _way(s, {"action": p.CONFIRM, "queue": "q", "msg_id": 99}) == "coordinator"  # confirmed: 0, a fact of state
    assert _way(s, {"action": p.PEEK, "queue": "q"}) == "coordinator"  # may show an uncommitted produce
    assert _way(s, {"action": p.PURGE, "queue": "none"}) == "coordinator"


def test_refusals_on_the_queues_state_go_through_the_coordinator():
    """Queue full, too many queues, a sequence used for another count: each rests on records
    that may not be committed yet."""
    s = _filled()
    _way(s, {"action": p.PRODUCE, "queue": "q", "data": ["a", "b"]})
    s.handle({"action": p.PRODUCE, "queue": "q", "data": "c"}, OWN, 8, NOW)
    assert s.replies.pop()[2]["reason"] == "queue full" and not s.direct
    assert _way(s, {"action": p.PRODUCE, "queue": "q", "data": ["x", "y"], "producer": "p1", "sequence": 1}) == "coordinator"
    s = _service(max_queues=1, queue_share=1)
    _way(s, {"action": p.PRODUCE, "queue": "one", "data": "a"})
    assert _way(s, {"action": p.PRODUCE, "queue": "two", "data": "a"}) == "coordinator"


def test_a_long_poll_answered_later_goes_through_the_coordinator():
    s = _service()
    assert _way(s, {"action": p.CONSUME, "queue": "q", "wait": 5}) == "parked"
    s.handle({"action": p.PRODUCE, "queue": "q", "data": "a"}, Origin(6), 1, NOW)
    assert sorted(r[1] for r in s.replies) == [1, 7] and not s.direct  # the produce, the poll it served
    s.replies.clear()
    assert _way(s, {"action": p.CONSUME, "queue": "q2", "wait": 5}) == "parked"
    s.tick(NOW + 10)  # its deadline: answered empty, later, on the old path
    assert [r[1] for r in s.replies] == [7] and not s.direct


def test_forwarded_requests_and_a_worker_not_accepting_skip_nothing():
    s = _service()
    assert _way(s, {"action": p.CONSUME, "queue": "q"}, FORWARDED) == "coordinator"
    assert _way(s, {"action": p.CONSUME, "queue": "q", "count": 0}, FORWARDED) == "coordinator"
    s.accepting = False  # a follower, or between modes: its "not leader" keeps the old path
    assert _way(s, {"action": p.CONSUME, "queue": "q"}) == "coordinator"
    assert _way(s, {"action": p.CONSUME, "queue": "q", "count": 0}) == "coordinator"


def test_an_empty_consume_that_wrote_a_record_goes_through_the_coordinator():
    """An empty reply made along with a record (a consume that first ends expired leases, say)
    rests on that record."""
    s = _service()
    empty = s._handlers[p.CONSUME]

    def writes_then_finds_nothing(req, origin, req_no, now):
        s.records.append(Noop())
        return empty(req, origin, req_no, now)

    s._handlers[p.CONSUME] = writes_then_finds_nothing
    assert _way(s, {"action": p.CONSUME, "queue": "q"}) == "coordinator"


def test_the_worker_sends_direct_replies_to_the_acceptor_and_the_rest_to_the_coordinator():
    class Pipe:
        def __init__(self) -> None:
            self.sent: list[list[bytes]] = []

        def send_multipart(self, frames: list[bytes]) -> None:
            self.sent.append(list(frames))

    w = Worker({0: _service()}, None, Pipe(), None, metrics=WorkerMetrics(CollectorRegistry()), acceptor=Pipe())
    w.dispatch(ipc_frames.mode_frames(True, 1), NOW)
    items = [ipc_frames.req_item(OWN, 0, {"action": p.PRODUCE, "queue": "q", "data": "a"}),
             ipc_frames.req_item(OWN, 1, {"action": p.CONSUME, "queue": "empty"}),
             ipc_frames.req_item(OWN, 2, {"action": p.CONSUME, "queue": "q", "count": 0})]
    w.dispatch(ipc_frames.req_frames(items, 1), NOW)
    w.flush()
    [rep] = w.acceptor.sent
    assert [(n, orjson.loads(d)["code"]) for _, n, d in replies.decode(*ipc_frames.read_rep(rep)[0])] == [(1, 0), (2, -1)]
    [batch] = w.coordinator.sent
    [(_, _records, header, blob, _partials, epoch)] = ipc_frames.read_batch(batch)
    assert [n for _, n, _ in replies.decode(header, blob)] == [0] and epoch == 1
    counted = {(p.PRODUCE, 0): 1, (p.CONSUME, 0): 1, (p.CONSUME, -1): 1}  # each reply once, whichever way
    assert w.metrics.counts == counted
    w.flush()
    assert len(w.acceptor.sent) == 1 and len(w.coordinator.sent) == 1  # nothing new, nothing sent

    w = Worker({0: _service()}, None, Pipe(), None, metrics=WorkerMetrics(CollectorRegistry()))  # no acceptor
    w.dispatch(ipc_frames.mode_frames(True, 1), NOW)
    w.dispatch(ipc_frames.req_frames(items, 1), NOW)
    w.flush()
    [batch] = w.coordinator.sent
    [(_, _records, header, blob, _partials, _epoch)] = ipc_frames.read_batch(batch)
    assert sorted(n for _, n, _ in replies.decode(header, blob)) == [0, 1, 2]
    assert w.metrics.counts == counted
