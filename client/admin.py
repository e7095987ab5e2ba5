"""Queue administration in the clients: peek, purge, delete_queue, pause, resume and dlq_replay
(docs/protocol.md section 5b). Request builders and reply readers are shared; QueueClient and
AsyncQueueClient get the methods from AdminMethods and AsyncAdminMethods."""
from __future__ import annotations

from typing import Any

from queue_server.server.protocol import (
    DELETE_QUEUE,
    DLQ_REPLAY,
    LOCAL_PEEK,
    PAUSE,
    PEEK,
    PURGE,
    RESUME,
    CODE_ERROR,
)

from .errors import QueueError

# peek's states (the server checks them too).
PEEK_STATES = ("ready", "delayed", "leased", "dead")


def peek_request(queue: str, count: int | None = None, state: str | None = None,
                 local: bool = False, after: list | None = None) -> dict[str, Any]:
    """A peek request: up to `count` messages in `state` without changing anything; `after`
    (the `cursor` of a previous reply) continues after its last message."""
    req: dict[str, Any] = {"action": LOCAL_PEEK if local else PEEK, "queue": queue}
    if count is not None:
        req["count"] = count
    if state is not None:
        req["state"] = state
    if after is not None:
        req["after"] = list(after)
    return req


def queue_request(action: int, queue: str) -> dict[str, Any]:
    """A purge, delete_queue, pause, resume or dlq_replay request."""
    return {"action": action, "queue": queue}


def _field(reply: dict[str, Any], field: str) -> Any:
    value = reply.get(field)
    if value is None:
        raise QueueError(CODE_ERROR, f"bad reply from server: no {field}", reply)
    return value


class AdminMethods:
    """Queue administration for a blocking client (anything with `request(dict) -> dict`)."""

    def request(self, req: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - provided
        raise NotImplementedError

    def peek(self, queue: str, count: int | None = None, *, state: str | None = None,
             local: bool = False) -> list[dict[str, Any]]:
        """Up to `count` (default 10, at most 1000) messages in `state` ("ready" by default,
        "delayed", "leased" or "dead") as dicts, changing nothing; `local` asks the node itself."""
        return list(_field(self.request(peek_request(queue, count, state, local)), "messages"))

    def purge(self, queue: str) -> int:
        """Delete every message of the queue; how many there were."""
        return int(_field(self.request(queue_request(PURGE, queue)), "purged"))

    def delete_queue(self, queue: str) -> bool:
        """Remove the queue and its messages; False if there was no such queue."""
        return bool(_field(self.request(queue_request(DELETE_QUEUE, queue)), "deleted"))

    def pause(self, queue: str) -> bool:
        """Pause consumers of the queue (produces are still stored); False if it already was."""
        return bool(_field(self.request(queue_request(PAUSE, queue)), "changed"))

    def resume(self, queue: str) -> bool:
        """Let consumers take from the queue again; False if it was not paused."""
        return bool(_field(self.request(queue_request(RESUME, queue)), "changed"))

    def dlq_replay(self, queue: str) -> int:
        """Move the queue's dead letters back to it; how many were moved."""
        return int(_field(self.request(queue_request(DLQ_REPLAY, queue)), "moved"))

    def subscribe(self, queues: str | list[str], credit: int = 100) -> Any:
        """A Subscription to one queue or a list of them: iterate it for the messages the leader
        pushes, never more than `credit` unconfirmed per queue (see client/subscribe.py)."""
        from .subscribe import Subscription

        return Subscription(self, queues, credit)


class AsyncAdminMethods:
    """Queue administration for an asyncio client (anything with `async request(dict)`)."""

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - provided
        raise NotImplementedError

    async def peek(self, queue: str, count: int | None = None, *, state: str | None = None,
                   local: bool = False) -> list[dict[str, Any]]:
        """As AdminMethods.peek."""
        return list(_field(await self.request(peek_request(queue, count, state, local)), "messages"))

    async def purge(self, queue: str) -> int:
        """As AdminMethods.purge."""
        return int(_field(await self.request(queue_request(PURGE, queue)), "purged"))

    async def delete_queue(self, queue: str) -> bool:
        """As AdminMethods.delete_queue."""
        return bool(_field(await self.request(queue_request(DELETE_QUEUE, queue)), "deleted"))

    async def pause(self, queue: str) -> bool:
        """As AdminMethods.pause."""
        return bool(_field(await self.request(queue_request(PAUSE, queue)), "changed"))

    async def resume(self, queue: str) -> bool:
        """As AdminMethods.resume."""
        return bool(_field(await self.request(queue_request(RESUME, queue)), "changed"))

    async def dlq_replay(self, queue: str) -> int:
        """As AdminMethods.dlq_replay."""
        return int(_field(await self.request(queue_request(DLQ_REPLAY, queue)), "moved"))

    def subscribe(self, queues: str | list[str], credit: int = 100) -> Any:
        """An AsyncSubscription: `async for m in client.subscribe(queues, credit)`."""
        from .subscribe import AsyncSubscription

        return AsyncSubscription(self, queues, credit)


def add_commands(command: Any, common: Any) -> None:
    """Add queue-cli's peek, purge, delete-queue, pause, resume and dlq subcommands;
    `command(name, help)` makes a subcommand parser and `common(parser)` adds the connection
    options to a nested one (see client/cli.py)."""
    cmd = command("peek", "look at messages without taking them")
    cmd.add_argument("queue", metavar="QUEUE")
    cmd.add_argument("--count", type=int, metavar="N", help="up to N messages (1..1000, default 10)")
    cmd.add_argument("--state", choices=PEEK_STATES, help="which messages (default ready)")
    cmd.add_argument("--local", action="store_true", help="ask the node itself, not the leader")
    cmd.set_defaults(build=lambda a: peek_request(a.queue, a.count, a.state, a.local))
    for name, action, help_text in (
        ("purge", PURGE, "delete every message of a queue"),
        ("delete-queue", DELETE_QUEUE, "remove a queue and its messages"),
        ("pause", PAUSE, "stop deliveries from a queue (produces are still stored)"),
        ("resume", RESUME, "deliver from a paused queue again"),
    ):
        cmd = command(name, help_text)
        cmd.add_argument("queue", metavar="QUEUE")
        cmd.set_defaults(build=lambda a, action=action: queue_request(action, a.queue))
    cmd = command("dlq", "dead letters of a queue")
    sub = cmd.add_subparsers(dest="dlq_command", required=True, metavar="DLQ_COMMAND")
    replay = sub.add_parser("replay", help="move a queue's dead letters back to it",
                            description="move a queue's dead letters back to it")
    replay.add_argument("queue", metavar="QUEUE")
    common(replay)
    replay.set_defaults(build=lambda a: queue_request(DLQ_REPLAY, a.queue))
