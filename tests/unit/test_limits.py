"""The resource limits (protocol/limits.py, pure) and how a PartitionService applies max_queues and
max_memory_mb, with a fake clock."""
from queue_server.protocol.limits import (
    idle, memory_full, over_connection_limit, over_queue_share, queue_share, too_many_connections,
    too_many_queues,
)
from tests.unit.service_replies import take_replies


def test_connection_limit():
    assert not over_connection_limit(10, 10)
    assert over_connection_limit(11, 10)
    assert not over_connection_limit(10**6, 0)  # 0: no limit
    assert "max_connections (10)" in too_many_connections(10)


def test_idle_connections():
    conns = [(1, 100.0, False), (2, 100.0, True), (3, 150.0, False)]
    assert idle(conns, 159.9, 60) == []
    assert idle(conns, 160.0, 60) == [1]  # 2 waits on a long poll or a subscription
    assert idle(conns, 1000.0, 60) == [1, 3]
    assert idle(conns, 1000.0, 0) == []  # 0: never


def test_queue_share_is_each_workers_part_of_max_queues():
    assert queue_share(10, 2) == 5
    assert queue_share(5, 2) == 3  # ceil: the node holds at most workers - 1 more than max_queues
    assert queue_share(1, 4) == 1
    assert queue_share(0, 4) == 0  # no limit
    assert not over_queue_share(4, 1, 5)
    assert over_queue_share(5, 1, 5)
    assert over_queue_share(4, 2, 5)  # a virtual queue's produce creating two
    assert not over_queue_share(5, 0, 5)  # existing queues always pass
    assert not over_queue_share(10**6, 1, 0)
    assert "max_queues (10)" in too_many_queues(10)


def test_memory_limit():
    assert memory_full(100).startswith("node memory limit reached: ")
    assert "max_memory_mb (100)" in memory_full(100)


def _service(**kw):
    from queue_server.workers.service import PartitionService
    return PartitionService(node_id=1, queue_size=100, virtual_queues={"fan": ("v1", "v2")},
                            dead_letter_suffix=".dlq", **kw)


def _call(s, req: dict) -> dict:
    from queue_server.protocol.origin import Origin
    s.handle(req, Origin(1), 1, 1_700_000_000.0)
    reply = take_replies(s)[-1][2]
    s.records.clear()
    return reply


def test_a_worker_refuses_queues_past_its_share_and_serves_existing_ones():
    s = _service(max_queues=5, queue_share=3)
    for name in ("a", "b", "c"):
        assert _call(s, {"action": 1, "queue": name, "data": "x"})["code"] == 0
    refused = _call(s, {"action": 1, "queue": "d", "data": "x"})
    assert refused["code"] == -1 and refused["reason"] == too_many_queues(5)
    assert _call(s, {"action": 23, "queue": "d"})["code"] == -1  # pause would create it too
    assert _call(s, {"action": 1, "queue": "a", "data": "y"})["code"] == 0
    assert _call(s, {"action": 2, "queue": "a"})["data"] == "x"
    assert _call(s, {"action": 22, "queue": "c"})["code"] == 0  # deleting one makes room
    assert _call(s, {"action": 1, "queue": "fan", "data": "x"})["code"] == -1  # two new ones
    assert _call(s, {"action": 1, "queue": "d", "data": "x"})["code"] == 0
    assert s.limit_refusals == {"max_queues": 3}
    assert set(s.queues) == {"a", "b", "d"}


def test_a_worker_over_the_memory_limit_refuses_produce_only():
    s = _service(max_memory_mb=64)
    assert _call(s, {"action": 1, "queue": "q", "data": "kept", "retry": 30})["code"] == 0
    assert _call(s, {"action": 1, "queue": "q", "data": "second"})["code"] == 0
    s.memory_full = True
    refused = _call(s, {"action": 1, "queue": "q", "data": "x"})
    assert refused["code"] == -1 and refused["reason"] == memory_full(64)
    got = _call(s, {"action": 2, "queue": "q"})
    assert got["data"] == "kept"
    assert _call(s, {"action": 3, "queue": "q", "msg_id": got["msg_id"]})["code"] == 0
    assert _call(s, {"action": 21, "queue": "q"})["code"] == 0  # purge
    assert s.limit_refusals == {"max_memory_mb": 1}
    s.memory_full = False
    assert _call(s, {"action": 1, "queue": "q", "data": "x"})["code"] == 0
