"""The clients' side of the protocol extensions (lease tokens, guards, idempotent produce),
against a fake server that answers with a real PartitionService in-process."""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from queue_server.client import AsyncQueueClient, Message, QueueClient
from queue_server.client import protocol as p
from queue_server.client.cli import main
from tests.unit.service_replies import take_replies
from tests.unit.test_client import FakeTcpServer
from queue_server.protocol.origin import Origin
from queue_server.workers.service import PartitionService


class ServiceHandler:
    """Serves each request with a PartitionService (no long polls: every reply is immediate)."""

    def __init__(self) -> None:
        self.service = PartitionService(node_id=1, queue_size=1000, virtual_queues={"v": ("v1", "v2")})
        self.lock = threading.Lock()
        self.numbers = itertools.count(1)

    def __call__(self, req: dict, state: dict) -> dict:
        with self.lock:
            n = next(self.numbers)
            self.service.handle(req, Origin(1), n, time.time())
            replies = [r for _, req_no, r in take_replies(self.service) if req_no == n]
            self.service.records.clear()
            return replies[0]


@pytest.fixture
def server() -> Iterator[FakeTcpServer]:
    s = FakeTcpServer(ServiceHandler())
    yield s
    s.close()


def test_builders_of_the_extension_fields() -> None:
    assert p.produce_request("q", ["a"], producer="w", sequence=3) == {
        "action": 1, "queue": "q", "data": ["a"], "retry": 0, "producer": "w", "sequence": 3}
    assert p.consume_request("q", 5, None, 30, "t", True) == {
        "action": 2, "queue": "q", "count": 5, "lease": 30, "token": "t", "times": True}
    assert p.ids_request(3, "q", None, token=None, tokens=iter(["a", "b"])) == {
        "action": 3, "queue": "q", "tokens": ["a", "b"]}
    assert p.ids_request(6, "q", [1, 2], retry=5, delivery_counts=(1, 2)) == {
        "action": 6, "queue": "q", "msg_ids": [1, 2], "retry": 5, "delivery_counts": [1, 2]}


def test_sync_token_consume_retry_and_confirm_by_token(server: FakeTcpServer) -> None:
    with QueueClient(server.addr) as c:
        ids = c.produce_batch("q", ["a", "b", "c"], ttl=600, retry=30)
        first = c.consume_batch("q", 2, lease=30, token="job/0", times=True)
        assert [m.msg_id for m in first] == ids[:2]
        m = first[0]
        assert m.lease_until is not None and m.ttl - m.ready == pytest.approx(600)
        again = c.consume_batch("q", 2, lease=30, token="job/0")
        assert [(x.msg_id, x.delivery_count) for x in again] == [(ids[0], 1), (ids[1], 1)]
        assert c.extend("q", None, 60, token_prefix="job/") == 2
        assert c.confirm("q", ids[0], token="other") is False
        assert c.confirm_many("q", token="job/0") == 2
        one = c.consume("q", lease=5, token="x")
        assert one == Message("q", ids[2], "c", 1)
        assert c.release("q", tokens=["x"]) == 1
        late = c.consume("q")
        assert c.confirm("q", late.msg_id, delivery_count=1) is False  # delivered again since
        assert c.confirm("q", late.msg_id, delivery_count=2) is True


def test_sync_idempotent_produce(server: FakeTcpServer) -> None:
    with QueueClient(server.addr) as c:
        ids = c.produce_batch("q", ["a", "b"], producer="p", sequence=0)
        assert c.produce_batch("q", ["a", "b"], producer="p", sequence=0) == ids
        one = c.produce("v", "x", producer="p", sequence=1)
        assert c.produce("v", "x", producer="p", sequence=1) == one == {"v1": 1, "v2": 1}


def test_async_token_consume_and_idempotent_produce(server: FakeTcpServer) -> None:
    async def scenario() -> None:
        async with AsyncQueueClient(server.addr) as c:
            ids = await c.produce_batch("q", ["a", "b"], producer="p", sequence=5)
            assert await c.produce_batch("q", ["a", "b"], producer="p", sequence=5) == ids
            got = await c.consume_batch("q", 10, lease=20, token="t", times=True)
            assert [m.msg_id for m in got] == ids and all(m.lease_until for m in got)
            assert [m.msg_id for m in await c.consume_batch("q", 10, token="t")] == ids
            assert await c.extend("q", ids, 40, token="t") == 2
            assert await c.release("q", ids[0], token="t") == 1
            assert await c.confirm("q", ids[1], token="t") is True
            assert await c.confirm_many("q", token_prefix="t") == 0

    asyncio.run(scenario())


def test_cli_token_and_producer_flags(server: FakeTcpServer, capsys: pytest.CaptureFixture[str]) -> None:
    h = ("--hosts", server.addr, "--json")
    assert main([*h, "produce", "q", "a", "b", "--producer", "w", "--sequence", "1"]) == 0
    assert main([*h, "produce", "q", "a", "b", "--producer", "w", "--sequence", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert orjson.loads(out[1])["duplicate"] is True
    assert main([*h, "consume", "q", "--count", "5", "--lease", "30", "--token", "t", "--times"]) == 0
    got = orjson.loads(capsys.readouterr().out)
    assert len(got["messages"]) == 2 and "lease_until" in got["messages"][0]
    assert main([*h, "extend", "q", "--token", "t", "--retry", "60"]) == 0
    assert orjson.loads(capsys.readouterr().out)["extended"] == 2
    assert main([*h, "confirm", "q", "--token-prefix", "t"]) == 0
    assert orjson.loads(capsys.readouterr().out)["confirmed"] == 2
    assert main([*h, "release", "q"]) == 1  # nothing named: the server says msg_id: missing
    assert "msg_id: missing" in capsys.readouterr().err
