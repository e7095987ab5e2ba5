"""The acceptor's decisions, free of I/O: where each client request goes (the worker owning its
queue, every worker for a scattered request, the coordinator to reach the leader, or an answer
on the spot), when requests are sent (one REQ per worker per loop turn), what a change of role
means (fence the workers), and in which order a connection's replies leave (request order,
whatever order the workers answer in). server/acceptor.py moves the bytes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from queue_server.protocol import ipc_frames, replies
from queue_server.protocol.roles import Role
from queue_server.protocol import vocabulary as p
from queue_server.protocol.framing import FramingError
from queue_server.protocol.origin import Origin
from queue_server.protocol.placement import Placement
from queue_server.server.router import SCATTER_ACTIONS, Router

# This node's role, as the coordinator last reported it.
LEADER, FOLLOWER, NONE = Role.LEADER, Role.FOLLOWER, Role.NONE
TO_COORDINATOR = -1  # the destination of a message for the coordinator (workers are 0, 1, ...)
# The reply to a request that cannot be passed to a worker or the leader (it cannot be encoded).
UNPASSABLE = "request: cannot be passed on (nested too deep, or a number out of range)"
_SCALARS = (str, int, float, bool, type(None))


class ReplyOrder:
    """One connection's replies, released in request order: a reply that arrives before an
    earlier request's waits for it."""

    def __init__(self) -> None:
        self.next_out = 0  # req_no of the next reply to release
        self.waiting: dict[int, Any] = {}  # replies that arrived before earlier ones
        self.out: list[Any] = []  # released, not yet written

    def put(self, req_no: int, data: Any) -> bool:
        """Take the reply to request `req_no`; True if replies were released to `out`."""
        if req_no != self.next_out:
            self.waiting[req_no] = data
            return False
        out = self.out
        out.append(data)
        req_no += 1
        waiting = self.waiting
        while waiting and req_no in waiting:
            out.append(waiting.pop(req_no))
            req_no += 1
        self.next_out = req_no
        return True


class Dispatch:
    """Routes decoded requests by this node's role. The process supplies `reply` (answer a
    request here), `send` (one message to worker `index` or TO_COORDINATOR) and
    `schedule_requests` (call flush_requests once this loop turn's requests are all in)."""

    def __init__(self, router: Router, node_id: int, forward_request: bool, leader: dict[str, Any],
                 placement: Placement | None = None) -> None:
        """leader: leader_node_id, leader_host, leader_port, until the coordinator says otherwise;
        placement: the queue groups (None or one group: the node's role is its one group's)."""
        self.router = router
        self.node_id = node_id
        self.forward_request = forward_request
        self.leader = leader
        self.role = NONE  # until the coordinator's first status (group 0's)
        self.epoch = 0  # of the workers' mode, as last reported (see GroupNode.epoch)
        self.http_ports: dict[int, int] = {}  # each node's http_port as the coordinator knows it (0: none)
        self.pending: list[list] = [[] for _ in range(router.workers)]
        # With several queue groups: each group's role, leader and epoch as last reported
        # (ClusterNode._view), its requests per worker (group 0's are `pending`), and which group
        # each queue is in. None with one group: the node's fields above are all there is.
        self.placement = placement if placement is not None and placement.queue_groups > 1 else None
        # Pending requests are kept for the groups this node's workers hold; the others' always
        # go to their leader.
        self.views: dict[int, dict[str, Any]] | None = None
        self.group_pending: dict[int, list[list]] = {0: self.pending}
        if self.placement is not None:
            self.views = {g: {"role": NONE, "epoch": 0, **leader} for g in range(self.placement.queue_groups)}
            own = self.placement.groups_of(node_id)
            self.group_pending = {g: self.pending if g == own[0] else [[] for _ in range(router.workers)] for g in own}
        self.forwarding: list = []
        # Long polls of this node's TCP and HTTP clients parked on the leader, by connection and
        # req_no: (origin, request). A stopping node answers them itself (end_forwarded_polls).
        self.polls: dict[int, dict[int, tuple[Origin, dict]]] = {}
        # Those it answered so: the leader's reply, when it comes, is not theirs to deliver.
        self.ended: dict[int, set[int]] = {}

    # ----------------------------------------------------------------- hooks
    def reply(self, origin: Origin, req_no: int, reply: dict) -> None:
        """Answer a request here."""
        raise NotImplementedError

    def send(self, index: int, frames: list[bytes]) -> None:
        """Send one message to worker `index`, or to the coordinator (TO_COORDINATOR)."""
        raise NotImplementedError

    def schedule_requests(self) -> None:
        """Have flush_requests called once the requests read now are all submitted."""

    # ----------------------------------------------------------------- decisions
    def submit(self, origin: Origin, req_no: int, value: Any) -> None:
        """Route one decoded request: to the workers (this node leads, or the action is local),
        to the leader (forwarded through the coordinator, or a code -2 redirect), or answer it
        here."""
        if type(value) is dict:
            if self.views is not None:
                if self.submit_to_group(origin, req_no, value):
                    return
            elif self.role == LEADER:
                index = self.router.owner(value.get("action"), value)
                if index is not None:  # the common case: a queue request, for the worker owning it
                    self.pending[index].append(ipc_frames.req_item(origin, req_no, value))
                    self.schedule_requests()
                    return
        if isinstance(value, FramingError):
            self.reply(origin, req_no, p.error_reply(None, value.reason, self.node_id))
            return
        action = p.request_action(value)
        if type(action) is str:
            self.reply(origin, req_no, p.error_reply(value, action, self.node_id))
        elif action == p.LEADER:
            self.answer_leader(origin, req_no, value)
        elif action == p.AUTH:  # authentication is off, or a UDP datagram's auth_token passed
            reply = p.echo({k: v for k, v in value.items() if k != "token"})
            reply.update(code=p.CODE_OK, node_id=self.node_id)
            self.reply(origin, req_no, reply)
        elif self.role == LEADER or action in p.LOCAL_ACTIONS:
            self.route(action, value, origin, req_no)
        elif self.role == FOLLOWER:
            if p.passes_to_coordinator(self.forward_request, self.leader["leader_node_id"], self.node_id):
                self.forwarding.append(ipc_frames.req_item(origin, req_no, value))
                if value.get("wait") and not origin.udp and action == p.CONSUME:
                    self.polls.setdefault(origin.conn, {})[req_no] = (origin, value)
                self.schedule_requests()
            else:
                self.reply(origin, req_no, p.redirect_reply(value, self.node_id, self.leader))
        else:
            self.reply(origin, req_no, p.error_reply(value, p.NO_LEADER, self.node_id))

    def submit_to_group(self, origin: Origin, req_no: int, value: dict) -> bool:
        """With queue groups: route a request about one queue (a queue action, or a monitor or
        list naming its queue) by the role of this node in the queue's group, as submit does by
        the node's with one group; a monitor or list of every queue is served by this node's
        workers from every group they hold. False: not such a request (submit goes on)."""
        action = value.get("action")
        if type(action) is not int:  # a name ("produce"), or no action at all
            action = p.request_action(value)
            if type(action) is str:
                return False  # submit answers the error
        queue = value.get("queue")
        if type(queue) is not str:
            if action in SCATTER_ACTIONS and queue is None:
                self.route(action, value, origin, req_no)
                return True
            return False
        if not (action in p.QUEUE_ACTIONS or action in SCATTER_ACTIONS):
            return False
        assert self.placement is not None and self.views is not None
        group = self.placement.group_of(queue)
        view = self.views[group]
        role = view["role"]
        if action in p.LOCAL_ACTIONS and group not in self.group_pending:
            self.reply(origin, req_no, p.error_reply(value, not_held(group, self.placement.replicas(group)), self.node_id))
        elif role == LEADER or action in p.LOCAL_ACTIONS:
            self.route(action, value, origin, req_no, group)
        elif role == FOLLOWER:
            if p.passes_to_coordinator(self.forward_request, view["leader_node_id"], self.node_id):
                self.forwarding.append(ipc_frames.req_item(origin, req_no, value))
                if value.get("wait") and not origin.udp and action == p.CONSUME:
                    self.polls.setdefault(origin.conn, {})[req_no] = (origin, value)
                self.schedule_requests()
            else:
                self.reply(origin, req_no, p.redirect_reply(value, self.node_id, _leader_fields(view)))
        else:
            self.reply(origin, req_no, p.error_reply(value, p.NO_LEADER, self.node_id))
        return True

    def route(self, action: int, value: dict, origin: Origin, req_no: int, group: int | None = None) -> None:
        """Queue the request for the worker(s) that serve it: of `group`; None: of the only
        group, or with queue groups a request of every queue. A local one (local monitor or
        list) takes a part from every group the workers hold; any other one a part from each
        group's leader, as with one group a follower asks the leader: these workers' for the
        groups this node leads, the others asked of their leaders through the coordinator."""
        groups = self.group_pending if group is None else {group: self.group_pending[group]}
        remote: tuple[int, ...] = ()
        if group is None and self.views is not None and action not in p.LOCAL_ACTIONS:
            views = self.views
            groups = {g: pending for g, pending in groups.items() if views[g]["role"] == LEADER}
            remote = tuple(g for g in views if g not in groups)
        plan = self.router.plan(action, value, origin, req_no, len(groups), len(remote))
        if type(plan) is str:
            self.reply(origin, req_no, p.error_reply(value, plan, self.node_id))
            return
        for pending in groups.values():
            for index, item in plan:
                pending[index].append(item)
        if remote:
            tag = plan[0][1][3]
            self.forwarding.extend((*ipc_frames.req_item(origin, req_no, value, tag), g) for g in remote)
        self.schedule_requests()

    def end_forwarded_polls(self) -> None:
        """The node is stopping: answer its clients' long polls parked on the leader now, empty,
        as its own workers answer theirs (a reply the leader sends them later is not delivered:
        see owed)."""
        polls, self.polls = self.polls, {}
        for conn, parked in polls.items():
            for req_no, (origin, request) in parked.items():
                self.reply(origin, req_no, p.empty_consume_reply(request, self.node_id, "count" in request))
            self.ended.setdefault(conn, set()).update(parked)

    def owed(self, origin: Origin, req_no: int) -> bool:
        """Whether a reply that came for request `req_no` of `origin` is still owed to its client:
        not when this node answered that long poll itself (end_forwarded_polls); the caller then
        gives its messages back."""
        conn = origin.conn
        ended = self.ended.get(conn)
        if ended is not None and req_no in ended:
            ended.discard(req_no)
            if not ended:
                del self.ended[conn]
            return False
        parked = self.polls.get(conn)
        if parked is not None and parked.pop(req_no, None) is not None and not parked:
            del self.polls[conn]
        return True

    def forget(self, conn: int) -> None:
        """Connection `conn` is gone: none of its replies are owed any more."""
        self.polls.pop(conn, None)
        self.ended.pop(conn, None)

    def answer_leader(self, origin: Origin, req_no: int, value: dict) -> None:
        """Action 8: the leader's client address."""
        leader, role = self.leader, self.role
        queue = value.get("queue")
        if self.views is not None and self.placement is not None and type(queue) is str:
            view = self.views[self.placement.group_of(queue)]
            leader, role = _leader_fields(view), view["role"]
        if role == NONE:
            self.reply(origin, req_no, p.error_reply(value, p.NO_LEADER, self.node_id))
            return
        reply = p.echo(value)
        reply.update(code=p.CODE_OK, node_id=self.node_id, **leader)
        if self.views is not None and self.placement is not None and queue is None:
            reply["groups"] = [{"group": g, **_leader_fields(view)} for g, view in sorted(self.views.items())]
            reply["placement"] = self.placement.as_dict()  # a client computes a queue's group from it
        self.reply(origin, req_no, reply)

    def flush_requests(self) -> None:
        """Send each worker the requests gathered for it since the last flush, as one REQ, and
        the coordinator the ones for the leader, as one FORWARD."""
        send = self.send
        if self.views is None:
            epoch = self.epoch
            for index, items in enumerate(self.pending):
                if items:
                    frames = self._encoded(ipc_frames.req_frames, items, epoch)
                    items.clear()
                    if frames is not None:
                        send(index, frames)
        else:
            for group, pending in self.group_pending.items():
                epoch = self.views[group]["epoch"]
                for index, items in enumerate(pending):
                    if items:
                        frames = self._encoded(ipc_frames.req_frames, items, epoch, group)
                        items.clear()
                        if frames is not None:
                            send(index, frames)
        if self.forwarding:
            frames = self._encoded(ipc_frames.forward_frames, self.forwarding)
            self.forwarding.clear()
            if frames is not None:
                send(TO_COORDINATOR, frames)

    def _encoded(self, encode: Callable[..., list[bytes]], items: list, *args: Any) -> list[bytes] | None:
        """encode(items, *args); should a request not encode (the framing's checks refuse every one known
        not to), it alone is answered with an error and the others go on: one request must never
        stop the ones behind it. None when none is left to send."""
        try:
            return encode(items, *args)
        except TypeError:  # orjson.JSONEncodeError is one
            pass
        kept = []
        for item in items:
            try:
                encode([item], *args)
            except TypeError:
                named = {k: v for k, v in replies.naming(item[2]).items() if type(v) in _SCALARS}
                self.reply(Origin.from_wire(item[0]), item[1], p.error_reply(named, UNPASSABLE, self.node_id))
            else:
                kept.append(item)
        return encode(kept, *args) if kept else None

    def fence(self, group: int = 0) -> None:
        """This node stopped leading `group` (or is handing its leadership over): behind the
        requests routed while it led, tell each worker that no more come in that mode (see
        ipc_frames FENCE)."""
        self.flush_requests()
        epoch = self.epoch if self.views is None else self.views[group]["epoch"]
        for index in range(len(self.pending)):
            self.send(index, ipc_frames.fence_frames(epoch, ipc_frames.FROM_ACCEPTOR, group))

    def on_status(self, status: dict[str, Any]) -> None:
        """The coordinator's STATUS: this node's role, the leader, the workers' mode and the
        nodes' http_ports. A node that stops leading fences the workers first, under the mode it
        led in."""
        status = dict(status)
        groups = status.pop("groups", None)
        role = Role(status.pop("role"))
        if self.views is not None and groups is not None:
            self.flush_requests()  # what was routed so far leaves under the modes it was routed in
            for row in groups:
                view = self.views[row["group"]]
                group_role = Role(row["role"])
                if view["role"] == LEADER and group_role != LEADER:
                    self.fence(row["group"])
                view.update(row, role=group_role)
        elif self.role == LEADER and role != LEADER:
            self.fence()
        self.role = role
        self.epoch = status.pop("epoch")
        self.http_ports = status.pop("http_ports", self.http_ports)
        self.leader.update(status)


def not_held(group: int, replicas: tuple[int, ...]) -> str:
    """The reason a local request about a queue of `group` fails on a node that is no replica of it."""
    return f"queue: in queue group {group}, which this node holds no copy of (nodes {', '.join(map(str, replicas))} do)"


def _leader_fields(view: dict[str, Any]) -> dict[str, Any]:
    """The leader_* fields of a group's view (what a redirect and action 8 name)."""
    return {"leader_node_id": view["leader_node_id"], "leader_host": view["leader_host"],
            "leader_port": view["leader_port"]}
