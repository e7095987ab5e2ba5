"""Merging the parts of a monitor or list request that was scattered to every worker. Pure: the
coordinator feeds parts in and gets finished replies out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin

# The origin node of the part of a scattered request this node asked of another group's
# leader (ClusterNode._gather_remote): no node's (RECOVERY_ORIGIN's is -1).
GATHER_NODE = -2
_SUMMED = ("size", "ready", "delayed", "in_flight", "waiters", "queue_count", "max_id",
           "dead", "produced", "consumed", "overflowed", "overflow_bytes", "memory_bytes")


@dataclass(slots=True)
class _Pending:
    origin: Origin
    req_no: int
    expected: int
    request: dict
    parts: list[dict] = field(default_factory=list)


class Gatherer:
    """Collects the parts of scattered requests; a request is done when all its parts arrived."""

    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}
        # The parts asked of other groups' leaders (ask), by the number of each ask: its tag.
        self.asked: dict[int, list] = {}
        self._next_ask = 1

    def ask(self, gather: list) -> Origin:
        """A part of the request `gather` tags is asked of another group's leader: the origin its
        answer comes back with (see take_answers)."""
        number = self._next_ask
        self._next_ask += 1
        self.asked[number] = gather
        return Origin(number, False, GATHER_NODE)

    def take_answers(self, rows: list[tuple[Origin, int, Any]]) -> tuple[list, list]:
        """Of delivered replies (origin, req_no, encoded reply): the answers to ask() are added
        as parts. (What add() returned for each request they finished, the other rows.)"""
        done, rest = [], []
        for row in rows:
            if row[0].node != GATHER_NODE:
                rest.append(row)
                continue
            finished = self.answered(row[0], orjson.loads(row[2]))
            if finished is not None:
                done.append(finished)
        return done, rest

    def answered(self, origin: Origin, reply: dict) -> tuple[Origin, int, dict, list[dict]] | None:
        """The reply to ask() that returned `origin`, added as a part (what add() returns)."""
        tag = self.asked.pop(origin.conn, None)
        return None if tag is None else self.add(tag, part_of(reply))

    def add(self, gather: list, part: dict) -> tuple[Origin, int, dict, list[dict]] | None:
        """Add one worker's part. `gather` is [gather_id, origin (wire form), req_no, expected,
        request]. Returns (origin, req_no, request, parts) once the last part is in."""
        gather_id, origin, req_no, expected, request = gather
        pending = self._pending.get(gather_id)
        if pending is None:
            pending = self._pending[gather_id] = _Pending(Origin.from_wire(origin), req_no, expected, request)
        pending.parts.append(part)
        if len(pending.parts) < pending.expected:
            return None
        del self._pending[gather_id]
        return pending.origin, pending.req_no, pending.request, pending.parts

    def __len__(self) -> int:
        return len(self._pending)


def merge(request: dict, parts: list[dict], node_fields: dict[str, Any]) -> dict:
    """The reply to a scattered monitor or list request, from its parts and the node's own fields
    (node_id, leader_node_id, trans_id, log_size, max_log_size)."""
    errors = [part["error"] for part in parts if "error" in part]
    if errors:
        return p.error_reply(request, errors[0], node_fields.get("node_id"))
    reply = p.echo(request)
    reply["code"] = p.CODE_OK
    action = p.resolve_action(request.get("action"))
    if action in (p.LIST, p.LOCAL_LIST):
        names = sorted(name for part in parts for name in part["queue_list"])
        reply["queue_list"] = names
        reply["queue_count"] = len(names)
    else:
        for key in _SUMMED:
            values = [part[key] for part in parts if key in part]
            if values:
                reply[key] = max(values) if key == "max_id" else sum(values)
        if "max_size" in parts[0]:
            reply["max_size"] = parts[0]["max_size"]
        if "paused" in parts[0]:
            reply["paused"] = parts[0]["paused"]
        reply["wait_status"] = reply.get("ready", 0)
    reply.update(node_fields)
    return reply


def part_of(reply: dict) -> dict:
    """Another group's leader's reply to a monitor or list (of that group alone), as a part to
    merge: its queues, or its counts; its error if it failed."""
    if reply.get("code") != p.CODE_OK:
        return {"error": reply.get("reason", "no reply")}
    if "queue_list" in reply:
        return {"queue_list": reply["queue_list"]}
    return {key: reply[key] for key in _SUMMED if key in reply}
