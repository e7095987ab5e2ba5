"""Forwarding of client requests between a follower and the leader, free of I/O: which requests a
follower sent the leader and still waits for, the leader's side (requests routed to its workers,
replies that go back over the peer wire), requests sent again after a change of leader, and
requests given up on; and the replies it makes itself, counted for queue_server_requests_total.
ClusterNode (server/cluster.py) owns one and carries out the actions its methods return."""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any, NamedTuple

import orjson

from queue_server.election.messages import Send
from queue_server.replication.messages import Forward, ForwardReply
from queue_server.protocol import vocabulary as p
from queue_server.protocol import replies
from queue_server.protocol.origin import Origin
from queue_server.server.reply_counts import count_replies
from queue_server.server.router import Router

# A forwarded request not answered this long after its own wait is failed (the leader is gone).
FORWARD_GRACE = 10.0
# How many given-up forwards are remembered, so that a reply still on its way is given back.
ABANDONED_KEPT = 65536
# A leader's replies to another node's forwarded requests whose send failed (that node is not
# connected: it restarts, or its link is being made again) are sent again every heartbeat for
# this long; then the messages of the consumes among them are given back, and the follower
# answers its clients when the forwards time out there (FORWARD_GRACE).
REPLY_RETRY = 1.0
_REFUSED = b'"code":-1'  # what every refusal's bytes hold: only those are decoded to read their reason
_NEVER = float("inf")
_DUMPS = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE


# ------------------------------------------------------------------ actions (and election's Send)
# NamedTuples, not frozen dataclasses: one is made per reply batch and per forwarded request, and
# a tuple is built in one step.
class Deliver(NamedTuple):
    """A reply batch for this node's acceptor. `answers`: replies the Forwarding made or brought
    back itself (not a release of the workers' replies): they may hold the answers to this
    node's own asks for a part of a scattered request (server/gather.py, Gatherer.ask)."""

    header: bytes
    blob: bytes
    answers: bool = False


class Work(NamedTuple):
    """A request item (protocol/ipc_frames.py REQ) for worker `index` of this leading node."""

    index: int
    item: list


class Undeliver(NamedTuple):
    """Give back the messages of a consume reply no client will get ([msg_id, delivery_count] each)."""

    queue: str
    given: list[list[int]]


class Forwarding:
    """One node's forwarded requests: on a follower those it sent the leader, on a leader whether
    it serves others' (their replies then go back as ForwardReply)."""

    def __init__(self, node_id: int, client: tuple[str, int], router: Router, rng: random.Random, *,
                 heartbeat: float, election_timeout: float, max_wait: float) -> None:
        """client: this node's client address, as a leader's reply to `leader` gives it."""
        self.node_id = node_id
        self.leader_fields = {"leader_node_id": node_id, "leader_host": client[0], "leader_port": client[1]}
        self.router = router
        self.heartbeat = heartbeat
        self.election_timeout = election_timeout
        self.max_wait = max_wait
        # forward_id -> (origin, req_no, deadline, the request's echoed fields for an error reply,
        # the request, how long it may take): what is needed to send it again
        self.forwards: dict[int, tuple[Origin, int, float, dict, bytes, float]] = {}
        # Forwards sent to a leader that is no longer the leader: failed as "leader changed" if
        # that node does not answer within an election timeout.
        self.orphaned: set[int] = set()
        # Whether this leader has served requests other nodes forwarded (their replies go back
        # over the peer wire): until then a reply batch is passed on without being read.
        self.served = False
        # Forward ids start at random, so that a leader's late reply to a request this node
        # forwarded before it restarted cannot be taken for the reply to a new one.
        self.next_forward = rng.getrandbits(40) << 20
        self.due = _NEVER  # no forward times out before this
        self.unsent: list[Forward] = []  # forwards the coordinator could not send yet
        self.resend_at = _NEVER
        # Forwards given up on (timed out, or failed by a change of leader), whose replies may
        # still come: a consume's messages are then given back.
        self.abandoned: OrderedDict[int, bool] = OrderedDict()
        # The replies made here rather than by a worker, by (action, code), until take_replied().
        self.replied: dict[tuple[Any, Any], int] = {}
        # Replies to other nodes' forwarded requests whose send failed: (node, message, until),
        # sent again every heartbeat until then; and those sent again in the last round, by id,
        # so that one that fails again keeps its deadline.
        self.replies_unsent: list[tuple[int, ForwardReply, float]] = []
        self._resent_replies: dict[int, tuple[int, ForwardReply, float]] = {}
        self.replies_lost = 0  # replies given up on so (counted, for the log)

    def wake_at(self) -> float:
        """When tick() next has something to do."""
        wake = self.due if self.forwards else _NEVER
        return min(wake, self.resend_at) if self.unsent or self.replies_unsent else wake

    # ----------------------------------------------------------------- a follower's side
    def on_requests(self, items: list, now: float, *, leading: bool, leader: int | None, vote_id: int,
                    redirect: dict | None) -> list:
        """Client requests this node's acceptor passed on ((origin, req_no, request), as
        ipc_frames.read_forward gives them): served here when leading, else sent to the leader; answered "no leader" when
        none is known, or redirected to it (redirect: its leader_* fields) when forwarding is off."""
        if leading:
            return [a for origin, req_no, request in items for a in self.route(origin, req_no, request)]
        if leader is None:
            return self._answer([(origin, req_no, p.error_reply(request, p.NO_LEADER, self.node_id))
                                 for origin, req_no, request in items])
        if redirect is not None:
            return self._answer([(origin, req_no, p.redirect_reply(request, self.node_id, redirect))
                                 for origin, req_no, request in items])
        batch = []
        for origin, req_no, request in items:
            fid = self.next_forward
            self.next_forward += 1
            wait = request.get("wait") if type(request) is dict else None
            grace = FORWARD_GRACE + (min(wait, self.max_wait) if isinstance(wait, (int, float)) and wait > 0 else 0)
            raw = _DUMPS(request)
            self.forwards[fid] = (origin, req_no, now + grace, p.echo(request), raw, grace)
            self.due = min(self.due, now + grace)
            batch.append((fid, raw, origin.udp))
        return [Send(leader, Forward(vote_id, self.node_id, tuple(batch)))]

    def on_replies(self, msg: ForwardReply, now: float, vote_id: int) -> list:
        """The leader's replies to requests this node forwarded: to their clients. A consume reply
        whose request was already given up on (timed out, or failed by a change of leader) is
        given back, never dropped with its messages. A request the node refused with nothing applied
        (p.NOT_APPLIED: it no longer leads, or its mode changed) goes to the current leader."""
        actions: list = []
        rows = []
        for fid, reply in msg.replies:
            target = self.forwards.pop(fid, None)
            if target is None:
                if self.abandoned.pop(fid, False):  # not a second copy of a delivered reply
                    given = p.delivered(replies.decoded(reply))
                    if given is not None:
                        actions.append(Undeliver(*given))
                continue
            if _REFUSED in reply and replies.decoded(reply).get("reason") in p.NOT_APPLIED:
                self._send_again(fid, target, now, vote_id)
                continue
            self.orphaned.discard(fid)
            rows.append((target[0], target[1], reply))
        if rows:
            actions.append(Deliver(*replies.encode_raw(rows), True))
        return actions

    def _send_again(self, fid: int, target: tuple, now: float, vote_id: int) -> None:
        """Forward a request again (to whoever leads by the next heartbeat), with its full time."""
        self.orphaned.discard(fid)
        where, req_no, _, echo, raw, grace = target
        self.forwards[fid] = (where, req_no, now + grace, echo, raw, grace)
        self.on_unsent(Forward(vote_id, self.node_id, ((fid, raw, where.udp),)), now)

    def on_unsent(self, msg: object, now: float, to: int | None = None) -> list:
        """A message to peer `to` could not be sent: forwarded client requests are sent again
        every heartbeat until their leader answers or they time out; replies to a follower's
        forwarded requests are sent again every heartbeat for REPLY_RETRY, then the messages of
        the consumes among them are given back here (the follower is gone, or stopped); other
        messages are not ours."""
        kind = type(msg)
        if kind is Forward:
            self._retry_at(now)
            self.unsent.append(msg)
        elif kind is ForwardReply:
            node, resent, until = self._resent_replies.pop(id(msg), (to, msg, now + REPLY_RETRY))
            if resent is not msg:  # (held below: no other message has its id meanwhile)
                node, until = to, now + REPLY_RETRY
            if node is not None and now < until:
                self._retry_at(now)
                self.replies_unsent.append((node, msg, until))
                return []
            self.replies_lost += len(msg.replies)
            given = (p.delivered(replies.decoded(reply)) for _, reply in msg.replies)
            return [Undeliver(*g) for g in given if g is not None]
        return []

    def _retry_at(self, now: float) -> None:
        """Something waits to be sent again: at the next heartbeat, unless a time is set."""
        if not (self.unsent or self.replies_unsent):
            self.resend_at = now + self.heartbeat

    def orphan(self, now: float) -> None:
        """The leader changed: requests forwarded to the old one wait an election timeout for its
        answer (a leader that handed over answers them, or refuses them as not applied: they are
        then sent to the new leader, or served here) before they fail as "leader changed"."""
        if not self.forwards:
            return
        due = now + self.election_timeout
        # waiting to be sent again: never reached a leader that could apply them, so they keep
        # their own time and go to the new leader
        waiting = {r[0] for msg in self.unsent for r in msg.requests}
        for fid, f in self.forwards.items():
            if fid in waiting:
                continue
            if f[2] > due:
                self.forwards[fid] = (*f[:2], due, *f[3:])
            self.orphaned.add(fid)
        self.due = min(self.due, due)

    def tick(self, now: float, leader: int | None, vote_id: int) -> list:
        """Send again what could not be sent; fail forwards nobody answered in time."""
        actions: list = []
        if now >= self.resend_at:
            if self.unsent:
                actions += self._resend(now, leader, vote_id)
            if self.replies_unsent:
                actions += self._resend_replies()
        if self.forwards and now >= self.due:
            expired = [fid for fid, f in self.forwards.items() if f[2] <= now]
            orphaned = [fid for fid in expired if fid in self.orphaned]
            if orphaned:
                actions += self._fail(orphaned, p.LEADER_CHANGED)
            if len(orphaned) < len(expired):
                actions += self._fail(expired, p.FORWARD_TIMED_OUT)
            self.due = min((f[2] for f in self.forwards.values()), default=_NEVER)
        return actions

    def _resend(self, now: float, leader: int | None, vote_id: int) -> list:
        if leader is None:  # kept until a leader is known (or they time out)
            self.resend_at = now + self.heartbeat
            return []
        # by forward id: a request both unsent and then refused is in here twice, and must be
        # served once
        waiting = tuple({r[0]: r for msg in self.unsent for r in msg.requests if r[0] in self.forwards}.values())
        self.unsent.clear()
        if not waiting:
            return []
        if leader != self.node_id:
            return [Send(leader, Forward(vote_id, self.node_id, waiting))]
        routes = []
        for fid, raw, _ in waiting:  # this node leads now: serve them here
            where, req_no = self.forwards.pop(fid)[:2]
            self.orphaned.discard(fid)
            routes += self.route(where, req_no, replies.decoded(raw))
        return routes

    def _resend_replies(self) -> list:
        pending, self.replies_unsent = self.replies_unsent, []
        self._resent_replies = {id(msg): (node, msg, until) for node, msg, until in pending}
        return [Send(node, msg) for node, msg, _ in pending]

    def _fail(self, fids: list[int], reason: str) -> list:
        failed = []
        for fid in fids:
            target = self.forwards.pop(fid, None)
            self.orphaned.discard(fid)
            if target is not None:
                failed.append((target[0], target[1], p.error_reply(target[3], reason, self.node_id)))
                self.abandoned[fid] = True
                if len(self.abandoned) > ABANDONED_KEPT:
                    self.abandoned.popitem(last=False)
        return self._answer(failed)

    # ----------------------------------------------------------------- the leader's side
    def serve(self, msg: Forward, leading: bool, vote_id: int) -> list:
        """A follower's clients' requests: serve them here (each keeps its transport's rules), or
        say there is no leader here."""
        if not leading:  # not counted: no client gets these, the follower sends the requests again
            refused = tuple((fid, _DUMPS(p.error_reply(replies.decoded(raw), p.LEADERSHIP_CHANGED,
                                                       self.node_id), option=_NEWLINE))
                            for fid, raw, _ in msg.requests)
            return [Send(msg.src, ForwardReply(vote_id, self.node_id, refused))]
        self.served = True
        actions: list = []
        answered = []  # `leader` and bad requests, answered here: back to the follower at once
        for fid, raw, udp in msg.requests:
            origin = Origin(fid, udp, msg.src)
            plan = self._plan(origin, 0, replies.decoded(raw))
            if type(plan) is dict:
                answered.append((origin, 0, plan))
            else:
                actions += plan
        if answered:
            count_replies(self.replied, answered)
            actions.append(Send(msg.src, ForwardReply(vote_id, self.node_id, tuple(
                (origin.conn, _DUMPS(reply, option=_NEWLINE)) for origin, _, reply in answered))))
        return actions

    def route(self, origin: Origin, req_no: int, request: Any) -> list:
        """Serve a request on this (leading) node's workers; a bad one, or `leader`, is answered here."""
        plan = self._plan(origin, req_no, request)
        return self._answer([(origin, req_no, plan)]) if type(plan) is dict else plan

    def _plan(self, origin: Origin, req_no: int, request: Any) -> dict | list:
        """The reply to a request this node answers itself (`leader`, a bad request), or the Work
        that serves it on the workers."""
        action = p.request_action(request)
        if type(action) is str:
            return p.error_reply(request, action, self.node_id)
        if action == p.LEADER:
            reply = p.echo(request)
            reply.update(code=p.CODE_OK, node_id=self.node_id, **self.leader_fields)
            return reply
        plan = self.router.plan(action, request, origin, req_no)
        if type(plan) is str:
            return p.error_reply(request, plan, self.node_id)
        return [Work(index, item) for index, item in plan]

    def _answer(self, rows: list[tuple[Origin, int, dict]]) -> list:
        """Replies made here, not by a worker: counted, and delivered."""
        if not rows:
            return []
        count_replies(self.replied, rows)
        return [Deliver(*replies.encode(rows), True)]

    def take_replied(self) -> dict[tuple[Any, Any], int]:
        """The replies made here since the last call, by (action, code) as the request gave
        them: for queue_server_requests_total."""
        taken, self.replied = self.replied, {}
        return taken

    def release(self, header: bytes, blob: bytes, vote_id: int) -> list:
        """Replies that may leave: to this node's acceptor, or back to the follower that
        forwarded their request. A batch with none of the latter is passed on as it is."""
        if not self.served:
            return [Deliver(header, blob)]
        local = []
        remote: dict[int, list[tuple[int, bytes]]] = {}
        for origin, req_no, data in replies.decode(header, blob):
            if origin.node:
                remote.setdefault(origin.node, []).append((origin.conn, data))
            else:
                local.append((origin, req_no, data))
        if not remote:
            return [Deliver(header, blob)]
        actions: list = [Deliver(*replies.encode_raw(local))] if local else []
        actions += [Send(node, ForwardReply(vote_id, self.node_id, tuple(items))) for node, items in remote.items()]
        return actions
