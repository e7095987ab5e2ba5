"""The acceptor's decisions (server/dispatch.py) without sockets or processes: which worker, the
coordinator or the acceptor itself answers a request, by the node's role; what leaves per flush;
the fence when the node stops leading; and replies leaving a connection in request order however
the workers' answers interleave."""
from __future__ import annotations

import random

import pytest

from queue_server.protocol import ipc_frames
from queue_server.protocol import vocabulary as p
from queue_server.server import dispatch
from queue_server.server.dispatch import FOLLOWER, LEADER, TO_COORDINATOR, Dispatch, ReplyOrder
from queue_server.protocol.framing import FramingError
from queue_server.protocol.origin import Origin
from queue_server.protocol.placement import Placement
from queue_server.server.router import Router

NODE = 1
WORKERS = 4


class FakeDispatch(Dispatch):
    """Records what the acceptor would send and answer."""

    def __init__(self, forward_request: bool = True) -> None:
        super().__init__(Router(WORKERS), NODE, forward_request,
                         {"leader_node_id": NODE, "leader_host": "127.0.0.1", "leader_port": 1111})
        self.sent: list[tuple[int, list[bytes]]] = []
        self.answers: list[tuple[Origin, int, dict]] = []
        self.scheduled = 0

    def reply(self, origin: Origin, req_no: int, reply: dict) -> None:
        self.answers.append((origin, req_no, reply))

    def send(self, index: int, frames: list[bytes]) -> None:
        self.sent.append((index, frames))

    def schedule_requests(self) -> None:
        self.scheduled += 1

    def status(self, role: str, epoch: int, leader: int = NODE) -> None:
        self.on_status({"role": role, "epoch": epoch, "leader_node_id": leader,
                        "leader_host": "127.0.0.%d" % leader, "leader_port": 1000 + leader})


def produce(queue: str) -> dict:
    return {"action": p.PRODUCE, "queue": queue, "data": "x"}


@pytest.fixture
def leader() -> FakeDispatch:
    d = FakeDispatch()
    d.status(LEADER, 3)
    return d


def test_queue_requests_go_to_the_owning_worker_in_one_req_per_worker_per_flush(leader):
    queues = ["a", "b", "c", "d", "e", "f"]
    for no, q in enumerate(queues):
        leader.submit(Origin(7), no, produce(q))
    assert leader.sent == [] and leader.answers == []  # nothing leaves before the flush
    leader.flush_requests()
    assert len(leader.sent) == len({leader.router.worker_for(q) for q in queues})
    seen = []
    for index, frames in leader.sent:
        assert frames[0] == ipc_frames.REQ and ipc_frames.req_epoch(frames) == 3
        for origin, req_no, request, gather in ipc_frames.read_req(frames):
            assert leader.router.worker_for(request["queue"]) == index and gather is None
            seen.append((origin, req_no, request["queue"]))
    assert sorted(seen, key=lambda s: s[1]) == [(Origin(7), no, q) for no, q in enumerate(queues)]
    leader.flush_requests()
    assert len(leader.sent) == len({leader.router.worker_for(q) for q in queues})  # nothing twice


def test_a_list_is_scattered_to_every_worker_with_one_even_gather_tag(leader):
    leader.submit(Origin(7), 0, {"action": p.LIST})
    leader.submit(Origin(7), 1, {"action": p.LIST})
    leader.flush_requests()
    assert sorted(index for index, _ in leader.sent) == list(range(WORKERS))
    tags = [g for _, frames in leader.sent for *_, g in ipc_frames.read_req(frames)]
    assert {t[0] for t in tags} == {0, 2} and all(t[3] == WORKERS for t in tags)


@pytest.mark.parametrize("value, reason", [
    (FramingError("malformed JSON: x", False), "malformed JSON: x"),
    ({"action": 999}, None),
    ({"action": p.PRODUCE, "data": "x"}, "queue: missing"),
    ({"action": p.PRODUCE, "queue": 5}, "queue: must be a string"),
    # Not actions, though equal to one (True == 1 == 1.0): the short way for queue requests
    # (Router.owner) must not take them.
    ({"action": True, "queue": "q"}, "action: unknown"),
    ({"action": float(p.PRODUCE), "queue": "q"}, "action: unknown"),
])
def test_a_bad_request_is_answered_here_with_one_error_naming_the_field(leader, value, reason):
    leader.submit(Origin(7), 4, value)
    leader.flush_requests()
    assert leader.sent == []
    [(origin, req_no, reply)] = leader.answers
    assert (origin, req_no, reply["code"]) == (Origin(7), 4, p.CODE_ERROR)
    if reason is not None:
        assert reply["reason"] == reason


def test_an_action_named_by_a_string_goes_to_the_worker_as_its_number_would(leader):
    leader.submit(Origin(7), 0, {"action": "produce", "queue": "a", "data": "x"})
    leader.submit(Origin(7), 1, produce("a"))
    leader.flush_requests()
    [(index, frames)] = leader.sent
    assert index == leader.router.worker_for("a") == leader.router.owner(p.PRODUCE, produce("a"))
    assert [req_no for _, req_no, _, _ in ipc_frames.read_req(frames)] == [0, 1]


def test_leader_and_auth_are_answered_here(leader):
    leader.submit(Origin(7), 0, {"action": p.LEADER, "seq": 1})
    leader.submit(Origin(7, True), 0, {"action": p.AUTH, "token": "secret"})
    (_, _, where), (_, _, auth) = leader.answers
    assert where["code"] == p.CODE_OK and where["leader_host"] == "127.0.0.1" and where["seq"] == 1
    assert auth["code"] == p.CODE_OK and "token" not in auth
    assert leader.sent == []


def test_with_no_leader_known_queue_requests_are_refused_and_local_ones_served():
    d = FakeDispatch()
    d.submit(Origin(7), 0, produce("q"))
    d.submit(Origin(7), 1, {"action": p.LEADER})
    d.submit(Origin(7), 2, {"action": p.LOCAL_LIST})
    assert [r["reason"] for _, _, r in d.answers] == [p.NO_LEADER, p.NO_LEADER]
    d.flush_requests()
    assert sorted(i for i, _ in d.sent) == list(range(WORKERS))  # 104 is served by this node


def test_a_follower_forwards_through_the_coordinator_in_one_message():
    d = FakeDispatch(forward_request=True)
    d.status(FOLLOWER, 5, leader=2)
    d.submit(Origin(7), 0, produce("a"))
    d.submit(Origin(8, True), 0, produce("b"))
    d.flush_requests()
    [(to, frames)] = d.sent
    assert to == TO_COORDINATOR and frames[0] == ipc_frames.FORWARD
    assert [(o, n, r["queue"]) for o, n, r in ipc_frames.read_forward(frames)] == [
        (Origin(7), 0, "a"), (Origin(8, True), 0, "b")]


def test_a_follower_that_does_not_forward_redirects_to_the_leader():
    d = FakeDispatch(forward_request=False)
    d.status(FOLLOWER, 5, leader=2)
    d.submit(Origin(7), 0, produce("a"))
    [(_, _, reply)] = d.answers
    assert reply["code"] == p.CODE_REDIRECT and reply["leader_port"] == 1002
    assert d.sent == []


def test_the_nodes_http_ports_are_kept_for_the_http_api_and_stay_out_of_protocol_replies():
    d = FakeDispatch(forward_request=False)
    d.on_status({"role": "follower", "epoch": 5, "leader_node_id": 2, "leader_host": "127.0.0.2",
                 "leader_port": 1002, "http_ports": {1: 8111, 2: 8112}})
    assert d.http_ports == {1: 8111, 2: 8112}
    d.submit(Origin(7), 0, produce("a"))
    d.submit(Origin(7), 1, {"action": p.LEADER})
    assert [sorted(k for k in reply if k.startswith(("leader", "http"))) for _, _, reply in d.answers] == [
        ["leader_host", "leader_node_id", "leader_port"]] * 2


def test_stopping_to_lead_sends_the_last_requests_then_a_fence_under_the_old_mode(leader):
    leader.submit(Origin(7), 0, produce("a"))
    leader.status(FOLLOWER, 4, leader=2)
    req, *fences = leader.sent
    assert ipc_frames.req_epoch(req[1]) == 3
    assert sorted(i for i, _ in fences) == list(range(WORKERS))
    assert {ipc_frames.read_fence(f) for _, f in fences} == {(3, ipc_frames.FROM_ACCEPTOR)}
    assert leader.epoch == 4 and leader.leader["leader_node_id"] == 2
    leader.status(FOLLOWER, 5, leader=2)
    assert len(leader.sent) == 1 + WORKERS  # a follower has nothing to fence


def test_replies_leave_in_request_order_whatever_order_they_arrive_in():
    rng = random.Random(11)
    for _ in range(50):
        order = ReplyOrder()
        arrival = list(range(20))
        rng.shuffle(arrival)
        released = []
        for req_no in arrival:
            if order.put(req_no, b"%d" % req_no):
                released.extend(order.out)
                order.out.clear()
            assert released == [b"%d" % n for n in range(len(released))]  # a prefix, always
        assert released == [b"%d" % n for n in range(20)] and not order.waiting


def test_a_connection_whose_requests_went_to_two_workers_gets_its_replies_in_order(leader):
    """Request 0 goes to a slow worker, request 1 to a fast one: the fast reply waits."""
    slow = next(q for q in "abcdefgh" if leader.router.worker_for(q) == 0)
    fast = next(q for q in "abcdefgh" if leader.router.worker_for(q) == 1)
    leader.submit(Origin(7), 0, produce(slow))
    leader.submit(Origin(7), 1, produce(fast))
    leader.flush_requests()
    by_worker = {i: ipc_frames.read_req(f) for i, f in leader.sent}
    order = ReplyOrder()
    [(_, fast_no, _, _)] = by_worker[1]
    [(_, slow_no, _, _)] = by_worker[0]
    assert order.put(fast_no, b"fast") is False and order.out == []
    assert order.put(slow_no, b"slow") is True and order.out == [b"slow", b"fast"]


@pytest.fixture
def follower() -> FakeDispatch:
    d = FakeDispatch()
    d.status(FOLLOWER, 3, leader=2)
    return d


def test_a_stopping_follower_answers_its_clients_polls_parked_on_the_leader_empty(follower):
    """Its own workers answer their long polls at once when the node stops; the ones it forwarded
    wait on the leader, which does not hear of it: they once went unanswered until the node
    closed the connection, shutdown_grace later."""
    poll = {"action": p.CONSUME, "queue": "q", "wait": 20, "seq": 1}
    follower.submit(Origin(7), 0, poll)
    follower.submit(Origin(7), 1, {**poll, "count": 5, "seq": 2})
    follower.submit(Origin(8, udp=True), 0, poll)  # never held over UDP: answered by the leader at once
    follower.submit(Origin(7), 2, {"action": p.PRODUCE, "queue": "q", "data": "x", "wait": 3})
    follower.submit(Origin(9), 0, poll)
    assert follower.owed(Origin(9), 0) and 9 not in follower.polls  # the leader answered that one
    follower.end_forwarded_polls()
    assert [(o, n, r) for o, n, r in follower.answers] == [
        (Origin(7), 0, {"action": p.CONSUME, "queue": "q", "wait": 20, "seq": 1, "code": 0, "node_id": NODE}),
        (Origin(7), 1, {"action": p.CONSUME, "queue": "q", "wait": 20, "seq": 2, "count": 5, "code": 0,
                        "node_id": NODE, "messages": []})]
    # the leader's replies to them, when they come, are not delivered (their messages go back)
    assert not follower.owed(Origin(7), 0) and not follower.owed(Origin(7), 1)
    assert follower.owed(Origin(7), 2) and follower.owed(Origin(8, udp=True), 0)
    assert follower.owed(Origin(7), 0)  # only once: a later request's reply of that number is owed
    follower.end_forwarded_polls()
    assert len(follower.answers) == 2 and follower.polls == follower.ended == {}


def test_a_leader_ends_its_own_polls_in_its_workers(leader):
    leader.submit(Origin(7), 0, {"action": p.CONSUME, "queue": "q", "wait": 20})
    leader.end_forwarded_polls()
    assert leader.answers == [] and leader.owed(Origin(7), 0)


def test_a_closed_connection_owes_nothing(follower):
    follower.submit(Origin(7), 0, {"action": p.CONSUME, "queue": "q", "wait": 20})
    follower.submit(Origin(8), 0, {"action": p.CONSUME, "queue": "q", "wait": 20})
    follower.end_forwarded_polls()
    follower.submit(Origin(7), 1, {"action": p.CONSUME, "queue": "q", "wait": 20})
    follower.forget(7)
    assert follower.polls == {} and follower.ended == {8: {0}}


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("role", [LEADER, FOLLOWER])
def test_a_request_that_cannot_be_passed_on_is_answered_alone_and_stops_nothing(role):
    """The framing refuses requests nested too deep to encode; should one get past it, it alone
    gets an error, and the requests beside and behind it still leave."""
    d = FakeDispatch()
    d.status(role, 3, leader=NODE if role == LEADER else 2)
    bad = {**produce("a"), "seq": 9, "extra": _deep(300)}
    d.submit(Origin(7), 0, produce("a"))
    d.submit(Origin(7), 1, bad)
    d.submit(Origin(7), 2, produce("a"))
    d.flush_requests()
    [(origin, req_no, reply)] = d.answers
    assert (origin, req_no, reply["code"], reply["reason"], reply["seq"]) == (Origin(7), 1, p.CODE_ERROR,
                                                                           dispatch.UNPASSABLE, 9)
    [(_, frames)] = d.sent
    read = ipc_frames.read_req if role == LEADER else ipc_frames.read_forward
    assert [item[1] for item in read(frames)] == [0, 2]
    d.submit(Origin(7), 3, produce("a"))
    d.flush_requests()
    assert len(d.sent) == 2 and [item[1] for item in read(d.sent[1][1])] == [3]


# ----------------------------------------------------------------- queue groups
GROUPS = 3


class GroupDispatch(FakeDispatch):
    """A node of a 3-node cluster with three queue groups, every group on every node (or, with
    `replicas`, on that many)."""

    def __init__(self, forward_request: bool = True, replicas: int = 0) -> None:
        Dispatch.__init__(self, Router(WORKERS, groups=GROUPS), NODE, forward_request,
                          {"leader_node_id": NODE, "leader_host": "127.0.0.1", "leader_port": 1111},
                          Placement([1, 2, 3], GROUPS, group_replicas=replicas))
        self.sent, self.answers, self.scheduled = [], [], 0

    def groups(self, *rows: tuple[str, int, int]) -> None:
        """Each group's (role, epoch, leader), group 0's also the node's own fields."""
        views = [{"group": g, "role": role, "epoch": epoch, "leader_node_id": leader,
                  "leader_host": "127.0.0.%d" % leader, "leader_port": 1000 + leader}
                 for g, (role, epoch, leader) in enumerate(rows)]
        self.on_status({**{k: v for k, v in views[0].items() if k != "group"}, "groups": views})


def _queue_of_group(group: int) -> str:
    placement = Placement([1, 2, 3], GROUPS)
    return next(q for q in (f"q{i}" for i in range(100)) if placement.group_of(q) == group)


def test_with_queue_groups_a_request_follows_its_group_s_role_and_epoch():
    d = GroupDispatch()
    d.groups((LEADER, 4, NODE), (FOLLOWER, 7, 2), (dispatch.NONE, 0, 0))
    q0, q1, q2 = (_queue_of_group(g) for g in range(GROUPS))
    d.submit(Origin(7), 0, produce(q0))
    d.submit(Origin(7), 1, produce(q1))
    d.submit(Origin(7), 2, produce(q2))
    d.flush_requests()
    # Group 0 is led here: to its queue's worker, under group 0's epoch and with its group frame.
    ((index, frames),) = [s for s in d.sent if s[0] != TO_COORDINATOR]
    forward = [s for s in d.sent if s[0] == TO_COORDINATOR]
    assert index == d.router.worker_for(q0) and ipc_frames.req_epoch(frames) == 4 and ipc_frames.group_of(frames) == 0
    # Group 1 is led by node 2: forwarded through the coordinator; group 2 has no leader.
    assert [r[2]["queue"] for r in ipc_frames.read_forward(forward[0][1])] == [q1]
    assert [(no, a["code"], a.get("reason")) for _, no, a in d.answers] == [(2, p.CODE_ERROR, p.NO_LEADER)]


def test_with_queue_groups_a_redirect_and_action_8_name_the_leader_of_the_queue_s_group():
    d = GroupDispatch(forward_request=False)
    d.groups((LEADER, 4, NODE), (FOLLOWER, 7, 2), (FOLLOWER, 2, 3))
    q1, q2 = _queue_of_group(1), _queue_of_group(2)
    d.submit(Origin(7), 0, produce(q1))
    d.submit(Origin(7), 1, {"action": p.LEADER, "queue": q2})
    d.submit(Origin(7), 2, {"action": p.LEADER})
    redirect, leader_of_q2, leaders = (a for _, _, a in d.answers)
    assert (redirect["code"], redirect["leader_node_id"], redirect["leader_port"]) == (p.CODE_REDIRECT, 2, 1002)
    assert (leader_of_q2["leader_node_id"], leader_of_q2["leader_port"]) == (3, 1003)
    assert leaders["leader_node_id"] == NODE  # group 0's, for clients that know no groups
    assert [(row["group"], row["leader_node_id"]) for row in leaders["groups"]] == [(0, 1), (1, 2), (2, 3)]
    placement = Placement.from_dict(leaders["placement"])  # what a client places queues by
    assert placement.group_of(q2) == 2 and placement.replicas(1) == (2, 3, 1)


def test_with_queue_groups_only_the_group_that_stopped_leading_is_fenced():
    d = GroupDispatch()
    d.groups((LEADER, 4, NODE), (LEADER, 7, NODE), (FOLLOWER, 2, 3))
    q1 = _queue_of_group(1)
    d.submit(Origin(7), 0, produce(q1))
    d.groups((LEADER, 4, NODE), (FOLLOWER, 8, 2), (FOLLOWER, 2, 3))
    reqs = [f for _, f in d.sent if f[0] == ipc_frames.REQ]
    fences = [f for _, f in d.sent if f[0] == ipc_frames.FENCE]
    # The request routed while group 1 was led leaves first, under its old epoch; then each
    # worker's FENCE of group 1's old mode, and none of group 0's.
    assert [(ipc_frames.req_epoch(f), ipc_frames.group_of(f)) for f in reqs] == [(7, 1)]
    assert d.sent.index(next(s for s in d.sent if s[1][0] == ipc_frames.REQ)) == 0
    assert sorted((ipc_frames.read_fence(f)[0], ipc_frames.group_of(f)) for f in fences) == [(7, 1)] * WORKERS


def test_with_queue_groups_a_local_list_gathers_each_group_from_every_worker():
    d = GroupDispatch()
    d.groups((LEADER, 4, NODE), (FOLLOWER, 7, 2), (FOLLOWER, 2, 3))
    d.submit(Origin(7), 0, {"action": p.LOCAL_LIST})
    d.flush_requests()
    sent = sorted((index, ipc_frames.group_of(frames), ipc_frames.req_epoch(frames)) for index, frames in d.sent)
    assert sent == sorted((i, g, e) for i in range(WORKERS) for g, e in ((0, 4), (1, 7), (2, 2)))
    tags = {(item[3][0], item[3][2], item[3][3]) for _, frames in d.sent for item in ipc_frames.read_req(frames)}
    assert tags == {(tags.copy().pop()[0], 0, WORKERS * GROUPS)}  # one gather, a part per worker and group


@pytest.mark.parametrize("action", [p.LIST, p.MONITOR])
def test_with_queue_groups_a_list_or_monitor_of_every_queue_takes_each_group_from_its_leader(action):
    """As one group's follower asks the leader: a copy this node follows may trail the leader's
    (a list through it would miss the queues made since), so only the groups it leads are its
    workers' to answer; the others are asked of their leaders through the coordinator."""
    d = GroupDispatch()
    d.groups((FOLLOWER, 4, 2), (LEADER, 7, NODE), (FOLLOWER, 2, 3))
    d.submit(Origin(7), 0, {"action": action})
    d.flush_requests()
    reqs = [(index, frames) for index, frames in d.sent if index != TO_COORDINATOR]
    assert sorted((index, ipc_frames.group_of(frames), ipc_frames.req_epoch(frames)) for index, frames in reqs) == [
        (i, 1, 7) for i in range(WORKERS)]
    ((_, forward),) = [s for s in d.sent if s[0] == TO_COORDINATOR]
    asked = ipc_frames.read_forward(forward)
    assert [item[4] for item in asked] == [0, 2]
    tag = asked[0][3]
    assert tag[3] == WORKERS + 2 and all(item[3] == tag for item in asked)
    assert all(item[3] == tag for _, frames in reqs for item in ipc_frames.read_req(frames))


def test_with_queue_groups_an_action_by_name_goes_to_its_queue_s_group_only():
    d = GroupDispatch()
    d.groups((LEADER, 4, NODE), (LEADER, 7, NODE), (LEADER, 2, NODE))
    q1 = _queue_of_group(1)
    d.submit(Origin(7), 0, {"action": "produce", "queue": q1, "data": "x"})
    d.submit(Origin(7), 1, {"action": "bogus", "queue": q1})
    d.flush_requests()
    assert [(index, ipc_frames.group_of(f), ipc_frames.req_epoch(f)) for index, f in d.sent] == [
        (d.router.worker_for(q1), 1, 7)]  # once, in its group: not once per group
    [(_, no, answer)] = d.answers
    assert (no, answer["code"], answer["reason"]) == (1, p.CODE_ERROR, "action: unknown")


def test_a_list_of_every_queue_asks_the_leader_of_each_group_this_node_holds_no_copy_of():
    d = GroupDispatch(replicas=1)  # node 1 holds group 0 alone
    d.groups((LEADER, 4, NODE), (FOLLOWER, 0, 2), (FOLLOWER, 0, 3))
    d.submit(Origin(7), 0, {"action": p.LIST})
    d.flush_requests()
    reqs = [(index, frames) for index, frames in d.sent if index != TO_COORDINATOR]
    assert sorted((index, ipc_frames.group_of(frames)) for index, frames in reqs) == [(i, 0) for i in range(WORKERS)]
    ((_, forward),) = [s for s in d.sent if s[0] == TO_COORDINATOR]
    asked = ipc_frames.read_forward(forward)
    assert [item[4] for item in asked] == [1, 2]  # one part from each other group's leader
    tag = asked[0][3]
    assert tag[3] == WORKERS + 2 and all(item[3] == tag for item in asked)
    assert all(item[3] == tag for _, frames in reqs for item in ipc_frames.read_req(frames))


def test_a_local_request_about_a_queue_of_a_group_held_elsewhere_is_refused_naming_the_queue():
    d = GroupDispatch(replicas=1)
    d.groups((LEADER, 4, NODE), (FOLLOWER, 0, 2), (FOLLOWER, 0, 3))
    d.submit(Origin(7), 0, {"action": p.LOCAL_MONITOR, "queue": _queue_of_group(2)})
    d.submit(Origin(7), 1, {"action": p.LOCAL_LIST})  # of this node's own groups: no part asked elsewhere
    d.flush_requests()
    [(_, no, answer)] = d.answers
    assert answer["code"] == p.CODE_ERROR and answer["reason"].startswith("queue: in queue group 2, which this node")
    assert all(index != TO_COORDINATOR for index, _ in d.sent) and d.sent
