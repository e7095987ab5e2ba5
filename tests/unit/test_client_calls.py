"""client/calls.py: every action is written once, as a Call, and both clients get it as a method;
and the UDP framing both clients share (client/protocol.py). No sockets."""
from __future__ import annotations

import asyncio
import inspect
import typing
from typing import Any, TypeVar

import orjson
import pytest

from queue_server.client import AsyncQueueClient, Message, QueueClient, QueueError
from queue_server.client import protocol as p
from queue_server.client.calls import Actions, action

ACTIONS = sorted(n for n, a in vars(Actions).items() if isinstance(a, action))


class Canned(QueueClient):
    """A QueueClient whose request() answers from a script and records what was asked."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__("127.0.0.1:1")
        self.replies, self.asked = list(replies), []
        self._producer = p.ProducerSequence("me")

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(req)
        return self.replies.pop(0)


class AsyncCanned(AsyncQueueClient):
    """The asyncio twin of Canned."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__("127.0.0.1:1")
        self.replies, self.asked = list(replies), []
        self._producer = p.ProducerSequence("me")

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(req)
        return self.replies.pop(0)


def test_every_action_is_a_method_of_both_clients_with_its_signature_and_docstring() -> None:
    assert "produce" in ACTIONS and "peek" in ACTIONS
    for name in ACTIONS:
        build = getattr(Actions, name).build
        sync, aio = getattr(QueueClient, name), getattr(AsyncQueueClient, name)
        assert not inspect.iscoroutinefunction(sync) and inspect.iscoroutinefunction(aio), name
        want = inspect.signature(build)
        assert str(want.return_annotation).startswith("Call["), name
        for method, owner in ((sync, "BlockingActions"), (aio, "AsyncActions")):
            got = inspect.signature(method)
            assert got.parameters == want.parameters, name
            assert f"Call[{got.return_annotation}]" == want.return_annotation, name  # the result, not the Call
            assert not isinstance(typing.get_type_hints(method)["return"], TypeVar), name
            assert method.__doc__ == build.__doc__ and method.__doc__, name
            assert method.__name__ == name and method.__qualname__ == f"{owner}.{name}"


# (call, its reply, the request it must send, what it must return)
SCRIPT: list[tuple[Any, dict[str, Any], dict[str, Any], Any]] = [
    (lambda c: c.produce("q", "x"), {"code": 0, "msg_id": 7},
     {"action": 1, "queue": "q", "data": "x", "retry": 0, "producer": "me", "sequence": 0}, 7),
    (lambda c: c.produce_batch("q", ("a", "b"), retry=None, producer="w", sequence=9),
     {"code": 0, "msg_ids": {"q1": [1, 2]}},
     {"action": 1, "queue": "q", "data": ["a", "b"], "producer": "w", "sequence": 9}, {"q1": [1, 2]}),
    (lambda c: c.produce("q", "y", ttl=5), {"code": 0, "msg_id": 8},
     {"action": 1, "queue": "q", "data": "y", "ttl": 5, "retry": 0, "producer": "me", "sequence": 1}, 8),
    (lambda c: c.consume("q", wait=2, times=True),
     {"code": 0, "msg_id": 3, "data": "d", "delivery_count": 2, "ready": 1.5},
     {"action": 2, "queue": "q", "wait": 2, "times": True}, Message("q", 3, "d", 2, 1.5)),
    (lambda c: c.consume("q"), {"code": 0}, {"action": 2, "queue": "q"}, None),
    (lambda c: c.consume_batch("q", 5, lease=30, token="t"),
     {"code": 0, "messages": [{"msg_id": 4, "data": "e"}]},
     {"action": 2, "queue": "q", "count": 5, "lease": 30, "token": "t"}, [Message("q", 4, "e", 1)]),
    (lambda c: c.confirm("q", 4), {"code": 0}, {"action": 3, "queue": "q", "msg_id": 4}, True),
    (lambda c: c.confirm("q", 4, token="t"), {"code": 0, "confirmed": 0},
     {"action": 3, "queue": "q", "msg_id": 4, "token": "t"}, False),
    (lambda c: c.confirm_many("q", iter([1, 2]), delivery_counts=(1, 1)), {"code": 0, "confirmed": 2},
     {"action": 3, "queue": "q", "msg_ids": [1, 2], "delivery_counts": [1, 1]}, 2),
    (lambda c: c.release("q", token_prefix="r/"), {"code": 0, "released": 3},
     {"action": 5, "queue": "q", "token_prefix": "r/"}, 3),
    (lambda c: c.extend("q", 6, 60), {"code": 0, "extended": 1},
     {"action": 6, "queue": "q", "msg_id": 6, "retry": 60}, 1),
    (lambda c: c.monitor("q", local=True), {"code": 0, "size": 1},
     {"action": 104, "queue": "q"}, {"code": 0, "size": 1}),
    (lambda c: c.list_queues("a"), {"code": 0, "queue_list": ["ab"]}, {"action": 7, "pattern": "a"}, ["ab"]),
    (lambda c: c.leader(), {"code": 0, "leader_node_id": 2}, {"action": 8}, {"code": 0, "leader_node_id": 2}),
    (lambda c: c.purge("q"), {"code": 0, "purged": 4}, {"action": 21, "queue": "q"}, 4),
]


def test_both_clients_send_the_same_requests_and_read_the_same_results() -> None:
    replies = [reply for _, reply, _, _ in SCRIPT]
    sync = Canned([dict(r) for r in replies])
    sync_results = [call(sync) for call, _, _, _ in SCRIPT]

    async def run() -> tuple[AsyncCanned, list[Any]]:
        aio = AsyncCanned([dict(r) for r in replies])
        return aio, [await call(aio) for call, _, _, _ in SCRIPT]
    aio, aio_results = asyncio.run(run())
    assert sync.asked == aio.asked == [req for _, _, req, _ in SCRIPT]
    assert sync_results == aio_results == [result for _, _, _, result in SCRIPT]


def test_an_action_refuses_bad_arguments_before_sending_and_bad_replies_after() -> None:
    c = Canned([{"code": 0}, {"code": 0}])
    with pytest.raises(TypeError, match="produce_batch"):
        c.produce("q", ["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of str"):
        c.produce_batch("q", "ab")
    assert c.asked == [] and c._producer is not None and c._producer.sequence == 0
    with pytest.raises(QueueError, match="no msg_id"):
        c.produce("q", "x")
    with pytest.raises(QueueError, match="no released"):
        c.release("q", 1)


def test_a_client_made_with_idempotent_false_numbers_no_produce() -> None:
    c = Canned([{"code": 0, "msg_id": 1}])
    c._producer = None
    c.produce("q", "x")
    assert "producer" not in c.asked[0] and "sequence" not in c.asked[0]


def test_udp_datagram_carries_the_client_seq_beside_the_callers_and_the_token() -> None:
    assert orjson.loads(p.udp_datagram({"action": 2, "queue": "q"}, 5, None)) == {
        "action": 2, "queue": "q", "seq": 5}
    req = {"action": 2, "queue": "q", "seq": "mine"}
    assert orjson.loads(p.udp_datagram(req, 6, "tok")) == {
        "action": 2, "queue": "q", "seq": [6, "mine"], "auth_token": "tok"}
    assert req == {"action": 2, "queue": "q", "seq": "mine"}  # the caller's request is left alone
    with pytest.raises(QueueError, match="too large for UDP"):
        p.udp_datagram({"action": 1, "queue": "q", "data": "x" * p.MAX_DATAGRAM}, 1, None)


def test_udp_replies_are_matched_by_the_client_seq_and_given_back_the_callers() -> None:
    assert p.udp_reply_seq({"seq": 5}) == 5
    assert p.udp_reply_seq({"seq": [6, "mine"]}) == 6
    for reply in ({}, {"seq": "5"}, {"seq": [6]}, {"seq": True}, {"seq": ["6", 1]}):
        assert p.udp_reply_seq(reply) is None, reply
    assert p.udp_reply({"code": 0, "seq": 5}, {"action": 2}) == {"code": 0}
    assert p.udp_reply({"code": 0, "seq": [6, "mine"]}, {"seq": "mine"}) == {"code": 0, "seq": "mine"}
    assert p.udp_reply({"code": -1}, {"seq": "mine"}) == {"code": -1}
