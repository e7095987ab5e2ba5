"""Push subscriptions with credit (protocol action `subscribe`): the node pushes ready messages
of a queue to a subscribed TCP connection, never more than its credit unconfirmed. Pure, like
the service that owns it: time comes in as `now`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.workers.bad_request import BadRequest

if TYPE_CHECKING:
    from queue_server.workers.queue import Queue
    from queue_server.workers.service import PartitionService

ENDED = "subscription ended: the node stopped leading; subscribe again (to the leader)"


@dataclass(slots=True)
class Subscription:
    """One connection's subscription to one queue."""

    origin: Origin
    queue: str
    credit: int
    request: dict
    # msg_id -> delivery_count of the push, for pushed messages not yet settled: a leased one
    # until its lease of that delivery ends (confirm, release, expiry), an at-most-once one
    # until a confirm names it.
    outstanding: dict[int, int] = field(default_factory=dict)


class Subscriptions:
    """The subscriptions of one PartitionService's queues."""

    def __init__(self, service: PartitionService) -> None:
        self.s = service
        self.by_queue: dict[str, dict[int, Subscription]] = {}  # queue -> conn -> subscription

    def subscribe(self, req: dict, origin: Origin, req_no: int, now: float) -> dict:
        """Start a subscription, or change its credit (0 stops the flow)."""
        name = self.s._reject_virtual(req.get("queue"))
        credit = req.get("credit")
        if type(credit) is not int:
            raise BadRequest("credit: missing" if credit is None else "credit: must be an integer")
        if not 0 <= credit <= p.MAX_BATCH:
            raise BadRequest(f"credit: must be 0..{p.MAX_BATCH}")
        if origin.udp or origin.forwarded:
            raise BadRequest(p.SUBSCRIBE_ON_LEADER)
        subs = self.by_queue.setdefault(name, {})
        sub = subs.get(origin.conn)
        if sub is None:
            sub = subs[origin.conn] = Subscription(origin, name, credit, p.echo(req))
        sub.credit = credit
        reply = self.s._ok(req)
        reply["subscribed"] = credit
        return reply

    def confirmed(self, queue: str, ids: list[int]) -> None:
        """A confirm named `ids` of `queue`: their credit is free (at-most-once pushes too)."""
        for sub in self.by_queue.get(queue, {}).values():
            for i in ids:
                sub.outstanding.pop(i, None)

    def pump_all(self, now: float) -> None:
        """Push what every subscription has credit for."""
        for name in list(self.by_queue):
            q = self.s.queues.get(name)
            if q is not None:
                self.pump(q, now)

    def pump(self, q: Queue, now: float) -> None:
        """Push ready messages of `q` to its subscribers, each up to its free credit."""
        subs = self.by_queue.get(q.name)
        if not subs:
            return
        service = self.s
        service.records.extend(q.expire_due(now))  # ended leases free their credit first
        for sub in list(subs.values()):
            sub.outstanding = {i: dc for i, dc in sub.outstanding.items()
                               if dc < 0 or q.leased_as(i, dc)}
            free = sub.credit - len(sub.outstanding)
            if free <= 0 or not q.has_ready(now):
                continue
            messages, records = q.consume(now, free)
            service.records.extend(records)
            for m in messages:
                if m.lease is None:
                    service._remember(q.name, m)
                    sub.outstanding[m.msg_id] = -1  # at most once: until a confirm names it
                else:
                    sub.outstanding[m.msg_id] = m.delivery_count
                push = dict(sub.request)
                push.update(code=p.CODE_OK, node_id=service.node_id, msg_id=m.msg_id, data=m.data,
                            delivery_count=m.delivery_count, lease_until=m.lease, push=True)
                service.replies.append((sub.origin, p.PUSH_REQ_NO, push))

    def next_event(self, now: float) -> float | None:
        """When a subscribed queue next has something to push or a lease to end."""
        soonest = None
        for name in self.by_queue:
            q = self.s.queues.get(name)
            if q is not None:
                event = q.next_event(now)
                if event is not None and (soonest is None or event < soonest):
                    soonest = event
        return soonest

    def cancel(self, conn: int) -> None:
        """Connection `conn` closed: its subscriptions end (leased pushes come back after their
        lease)."""
        for name in list(self.by_queue):
            subs = self.by_queue[name]
            subs.pop(conn, None)
            if not subs:
                del self.by_queue[name]

    def end_all(self) -> None:
        """The node stopped leading (or its queues were reset): every subscription ends with a
        message saying so."""
        for subs in self.by_queue.values():
            for sub in subs.values():
                self.s.replies.append((sub.origin, p.PUSH_REQ_NO,
                                       p.error_reply(dict(sub.request, push=True), ENDED, self.s.node_id)))
        self.by_queue.clear()

    def __bool__(self) -> bool:
        return bool(self.by_queue)


def handlers(service: PartitionService, subs: Subscriptions) -> dict[int, Any]:
    """The service's handler of action subscribe."""
    return {p.SUBSCRIBE: subs.subscribe}
