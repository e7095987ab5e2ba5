"""client/admin.py and queue-cli's administration subcommands: the requests they build and how
the client methods read replies, without a server."""
from __future__ import annotations

import asyncio

import pytest

from queue_server.client import AsyncQueueClient, QueueClient, QueueError
from queue_server.client.cli import build_parser


def built(*argv: str) -> dict:
    args = build_parser().parse_args(list(argv))
    return args.build(args)


def test_cli_builds_each_administration_request():
    assert built("peek", "jobs") == {"action": 20, "queue": "jobs"}
    assert built("peek", "jobs", "--count", "5", "--state", "dead", "--local") == {
        "action": 120, "queue": "jobs", "count": 5, "state": "dead"}
    assert built("purge", "jobs") == {"action": 21, "queue": "jobs"}
    assert built("delete-queue", "jobs") == {"action": 22, "queue": "jobs"}
    assert built("pause", "jobs") == {"action": 23, "queue": "jobs"}
    assert built("resume", "jobs") == {"action": 24, "queue": "jobs"}
    assert built("dlq", "replay", "jobs") == {"action": 25, "queue": "jobs"}
    [produce] = built("produce", "jobs", "x", "--max-deliveries", "3")  # one request per batch of bodies
    assert produce["max_deliveries"] == 3
    args = build_parser().parse_args(["dlq", "replay", "jobs", "--hosts", "h:1", "--timeout", "2"])
    assert args.hosts == [("h", 1)] and args.timeout == 2.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["peek", "jobs", "--state", "sleeping"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dlq", "jobs"])


class Canned(QueueClient):
    """A QueueClient whose request() answers from a script (and records what was asked)."""

    def __init__(self, reply: dict) -> None:
        super().__init__("127.0.0.1:1")
        self.reply, self.asked = reply, []

    def request(self, req: dict) -> dict:
        self.asked.append(req)
        return dict(req, code=0, **self.reply)


def test_client_methods_read_their_reply_fields():
    assert Canned({"messages": [{"msg_id": 1}]}).peek("q", 3, state="leased") == [{"msg_id": 1}]
    c = Canned({"purged": 4, "deleted": 1, "changed": 0, "moved": 2})
    assert (c.purge("q"), c.delete_queue("q"), c.pause("q"), c.resume("q"), c.dlq_replay("q")) == (4, True, False, False, 2)
    assert [r["action"] for r in c.asked] == [21, 22, 23, 24, 25]
    with pytest.raises(QueueError, match="no purged"):
        Canned({}).purge("q")


def test_async_client_methods_build_the_same_requests():
    class AsyncCanned(AsyncQueueClient):
        def __init__(self) -> None:
            super().__init__("127.0.0.1:1")
            self.asked = []

        async def request(self, req: dict) -> dict:
            self.asked.append(req)
            return dict(req, code=0, messages=[], purged=0, deleted=0, changed=1, moved=0)

    async def run() -> list:
        c = AsyncCanned()
        assert await c.peek("q", local=True) == []
        assert (await c.purge("q"), await c.delete_queue("q"), await c.pause("q"),
                await c.resume("q"), await c.dlq_replay("q")) == (0, False, True, True, 0)
        return c.asked
    asked = asyncio.run(run())
    assert [r["action"] for r in asked] == [120, 21, 22, 23, 24, 25]
