"""Queue administration requests of a PartitionService: peek, purge, delete_queue, pause, resume
and dlq_replay (docs/protocol.md, section 5b). Pure like the service: time comes in as `now`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.protocol.records import DeleteQueue
from queue_server.workers.bad_request import BadRequest
from queue_server.workers.queue import PEEK_STATES, Message

if TYPE_CHECKING:
    from queue_server.workers.service import PartitionService

# peek's states: the queue's own, and "dead" (its dead-letter queue's messages).
STATES = (*PEEK_STATES, "dead")
# How long a peek cursor is, by state (see Queue.look).
_CURSOR_LENGTH = {"ready": 3, "delayed": 2, "leased": 2, "dead": 1}
DEFAULT_PEEK_COUNT = 10


def handlers(service: PartitionService) -> dict[int, Any]:
    """The service's handlers of the administration actions, by action number."""
    admin = Admin(service)
    return {
        p.PEEK: admin.peek,
        p.LOCAL_PEEK: admin.peek,
        p.PURGE: admin.purge,
        p.DELETE_QUEUE: admin.delete_queue,
        p.PAUSE: admin.pause,
        p.RESUME: admin.resume,
        p.DLQ_REPLAY: admin.dlq_replay,
    }


def dead_letter_name(name: str, suffix: str) -> str | None:
    """The dead-letter queue of queue `name` (None: dead letters are off, or `name` is one)."""
    if not suffix or name.endswith(suffix):
        return None
    return name + suffix


class Admin:
    """The administration actions over one PartitionService's queues."""

    def __init__(self, service: PartitionService) -> None:
        self.s = service

    def _name(self, req: dict) -> str:
        return self.s._reject_virtual(req.get("queue"))

    def peek(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Up to `count` messages in `state`, nothing changed (served by followers too, as
        local_peek)."""
        name = self._name(req)
        count = req.get("count", DEFAULT_PEEK_COUNT)
        if type(count) is not int:
            raise BadRequest("count: must be an integer")
        if not 1 <= count <= p.MAX_BATCH:
            raise BadRequest(f"count: must be 1..{p.MAX_BATCH}")
        state = req.get("state", "ready")
        if type(state) is not str or state not in STATES:
            raise BadRequest("state: must be one of " + ", ".join(STATES))
        after = req.get("after")
        if after is not None and (
                type(after) is not list or len(after) != _CURSOR_LENGTH[state]
                or not all(type(v) in (int, float) for v in after) or type(after[-1]) is not int):
            raise BadRequest(f"after: must be the cursor of a peek reply with state {state}")
        if state == "dead":
            dlq_name = dead_letter_name(name, self.s.dead_letter_suffix)
            q = self.s.queues.get(dlq_name) if dlq_name is not None else None
            found = q.oldest(count, after[0] if after else 0) if q is not None else []
        else:
            q = self.s.queues.get(name)
            found = q.look(now, state, count, after) if q is not None else []
        reply = self.s._ok(req)
        reply["messages"] = [_described(m) for _, m in found]
        if found:
            reply["cursor"] = found[-1][0]
        return reply

    def purge(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Delete every message of the queue in one record; answers `purged` (0 if none)."""
        name = self._name(req)
        q = self.s.queues.get(name)
        record = q.purge() if q is not None else None
        if record is not None:
            self.s.records.append(record)
            self.s.forget_restorable(name)
        reply = self.s._ok(req)
        reply["purged"] = record.count if record is not None else 0
        return reply

    def delete_queue(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Remove the queue and its messages; answers `deleted` (0: there was no such queue)."""
        name = self._name(req)
        q = self.s.queues.get(name)
        reply = self.s._ok(req)
        reply["deleted"] = 0 if q is None else 1
        if q is not None:
            record = DeleteQueue(queue=name)
            self.s._apply(record)
            self.s.records.append(record)
            self.s.forget_restorable(name)
        return reply

    def pause(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Pause the queue (made if it does not exist yet): consumes get nothing until resume."""
        return self._set_paused(req, True, now)

    def resume(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Let consumes take the queue's messages again; parked long polls are served."""
        return self._set_paused(req, False, now)

    def _set_paused(self, req: dict, paused: bool, now: float) -> dict:
        name = self._name(req)
        q = self.s.queues.get(name)
        if q is None and paused:
            self.s.admit_queues((name,))
            q = self.s._queue(name)
        record = q.set_paused(paused) if q is not None else None
        if record is not None:
            self.s.records.append(record)
            if not paused and name in self.s.waiters:
                self.s._serve_waiters(q, now)
        reply = self.s._ok(req)
        reply["paused"] = paused
        reply["changed"] = 0 if record is None else 1
        return reply

    def dlq_replay(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Move the queue's dead letters back to it (as many as fit); answers `moved`."""
        name = self._name(req)
        dlq_name = dead_letter_name(name, self.s.dead_letter_suffix)
        if dlq_name is None:
            raise BadRequest("queue: has no dead-letter queue (dead letters are off, or it is one)")
        dlq = self.s.queues.get(dlq_name)
        record = None
        if dlq is not None and len(dlq):
            made = name not in self.s.queues
            q = self.s._queue(name)
            record = q.replay_dead(dlq, now, now + p.DEFAULT_TTL)
            if record is None and made:  # nothing moved: no record makes the queue elsewhere
                del self.s.queues[name]
        reply = self.s._ok(req)
        reply["moved"] = len(record.moves) if record is not None else 0
        if record is not None:
            self.s.records.append(record)
            if name in self.s.waiters:
                self.s._serve_waiters(q, now)
        return reply


def _described(m: Message) -> dict:
    """A peeked message as a reply shows it (tokens are not shown)."""
    out: dict[str, Any] = {"msg_id": m.msg_id, "data": m.data, "delivery_count": m.delivery_count,
                           "ready": m.ready, "ttl": m.ttl, "retry": m.retry, "priority": m.priority,
                           "lease_until": m.lease}
    extra = m.extra
    if extra is not None:
        if "max_deliveries" in extra:
            out["max_deliveries"] = extra["max_deliveries"]
        dead = extra.get("dead")
        if dead is not None:
            out["dead_queue"] = dead.get("queue")
            out["dead_reason"] = dead.get("reason")
    return out

