"""Queue administration in the clients: peek, purge, delete_queue, pause, resume and dlq_replay
(docs/protocol.md section 5b): their requests, how their replies are read (the client methods
are in client/calls.py), and queue-cli's subcommands for them."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from queue_server.protocol.vocabulary import (
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
from .protocol import given

T = TypeVar("T")

# peek's states (the server checks them too).
PEEK_STATES = ("ready", "delayed", "leased", "dead")


def peek_request(queue: str, count: int | None = None, state: str | None = None,
                 local: bool = False, after: list | None = None) -> dict[str, Any]:
    """A peek request: up to `count` messages in `state` without changing anything; `after`
    (the `cursor` of a previous reply) continues after its last message."""
    return given({"action": LOCAL_PEEK if local else PEEK, "queue": queue}, count=count, state=state,
                 after=None if after is None else list(after))


def queue_request(action: int, queue: str) -> dict[str, Any]:
    """A purge, delete_queue, pause, resume or dlq_replay request."""
    return {"action": action, "queue": queue}


def _field(reply: dict[str, Any], field: str) -> Any:
    value = reply.get(field)
    if value is None:
        raise QueueError(CODE_ERROR, f"bad reply from server: no {field}", reply)
    return value


def reads(field: str, kind: Callable[[Any], T]) -> Callable[[dict[str, Any]], T]:
    """A reader of an administration reply: its `field` as `kind` (QueueError if it is missing)."""
    return lambda reply: kind(_field(reply, field))


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
