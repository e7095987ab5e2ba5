"""Forwarding (server/forwarding.py) driven directly: time is an argument, the random source is
seeded, and the actions it returns are read as they are; no sockets, no ClusterNode."""
from __future__ import annotations

import random

import orjson

from queue_server.election.messages import Send
from queue_server.protocol import ipc_frames, replies
from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.replication.messages import Forward, ForwardReply
from queue_server.server.forwarding import FORWARD_GRACE, REPLY_RETRY, Deliver, Forwarding, Undeliver, Work
from queue_server.server.router import SCATTER_ACTIONS, Router

T0 = 1_000_000.0
HEARTBEAT = 0.0625  # binary fractions: sums of times compare exactly
ELECTION = 0.375
MAX_WAIT = 30.0
VOTE = 4
ME = 1  # this node
LEADER = 2  # the leader it follows
CLIENT = Origin(3, True)  # a client of this node, over UDP
PRODUCE = {"action": p.PRODUCE, "queue": "q", "data": "x", "seq": 9}
CONSUME = {"action": p.CONSUME, "queue": "q", "wait": 5, "seq": 10}


def _forwarding(node_id: int = ME, workers: int = 4) -> Forwarding:
    return Forwarding(node_id, ("127.0.0.1", 1100 + node_id), Router(workers, first_gather=1), random.Random(7),
                      heartbeat=HEARTBEAT, election_timeout=ELECTION, max_wait=MAX_WAIT)


def _forward(fw: Forwarding, *items: tuple[Origin, int, dict], now: float = T0) -> tuple[int, ...]:
    """Forward client requests to LEADER: their forward ids."""
    [send] = fw.on_requests(list(items), now, leading=False, leader=LEADER, vote_id=VOTE, redirect=None)
    return tuple(fid for fid, _, _ in send.msg.requests)


def _rows(actions: list) -> list[tuple[Origin, int, dict]]:
    """The replies of Deliver actions (and nothing else may be among them), decoded."""
    assert all(type(a) is Deliver for a in actions), actions
    return [(o, n, orjson.loads(d)) for a in actions for o, n, d in replies.decode(a.header, a.blob)]


def _reply(fid: int, reply: dict, src: int = LEADER) -> ForwardReply:
    return ForwardReply(VOTE, src, ((fid, orjson.dumps(reply, option=orjson.OPT_APPEND_NEWLINE)),))


def _refused(fid: int) -> ForwardReply:
    """What a node that no longer leads answers a forward (Forwarding.serve when not leading)."""
    return _reply(fid, p.error_reply(PRODUCE, p.LEADERSHIP_CHANGED, LEADER))


def _consumed(fid: int) -> ForwardReply:
    return _reply(fid, {"action": p.CONSUME, "queue": "q", "seq": 10, "code": p.CODE_OK,
                        "messages": [{"msg_id": 5, "delivery_count": 1, "data": "x"}]})


# ----------------------------------------------------------------- a follower's requests
def test_a_follower_forwards_requests_to_the_leader_with_their_bytes_and_transport():
    fw = _forwarding()
    actions = fw.on_requests([(CLIENT, 5, PRODUCE), (Origin(8), 6, CONSUME)], T0, leading=False,
                             leader=LEADER, vote_id=VOTE, redirect=None)
    [send] = actions
    assert type(send) is Send and send.to == LEADER
    assert type(send.msg) is Forward and (send.msg.vote_id, send.msg.src) == (VOTE, ME)
    (fid1, raw1, udp1), (fid2, raw2, udp2) = send.msg.requests
    assert fid1 != fid2
    assert (orjson.loads(raw1), udp1) == (PRODUCE, True)
    assert (orjson.loads(raw2), udp2) == (CONSUME, False)
    assert fw.wake_at() == T0 + FORWARD_GRACE  # the produce's, which has no wait of its own


def test_forward_ids_start_at_random_so_a_restarted_node_does_not_reuse_them():
    assert _forward(_forwarding(), (CLIENT, 1, PRODUCE)) == _forward(_forwarding(), (CLIENT, 1, PRODUCE))
    other = Forwarding(ME, ("h", 1), Router(1), random.Random(8), heartbeat=HEARTBEAT,
                       election_timeout=ELECTION, max_wait=MAX_WAIT)
    assert _forward(other, (CLIENT, 1, PRODUCE)) != _forward(_forwarding(), (CLIENT, 1, PRODUCE))


def test_the_leaders_reply_goes_to_the_requests_origin_once():
    fw = _forwarding()
    fid1, fid2 = _forward(fw, (CLIENT, 5, PRODUCE), (Origin(8), 6, CONSUME))
    answer = {"action": p.PRODUCE, "queue": "q", "seq": 9, "code": p.CODE_OK, "msg_id": 1}
    assert _rows(fw.on_replies(_reply(fid1, answer), T0 + 0.01, VOTE)) == [(CLIENT, 5, answer)]
    assert fw.on_replies(_reply(fid1, answer), T0 + 0.02, VOTE) == []  # a second copy is dropped
    assert list(fw.forwards) == [fid2]
    fw.on_replies(_reply(fid2, {"code": 0}), T0 + 0.03, VOTE)
    assert fw.wake_at() == float("inf")
    assert fw.tick(T0 + 100, LEADER, VOTE) == []  # answered forwards never time out


def test_without_a_leader_requests_are_answered_no_leader():
    fw = _forwarding()
    actions = fw.on_requests([(CLIENT, 5, PRODUCE)], T0, leading=False, leader=None, vote_id=VOTE, redirect=None)
    [(origin, req_no, reply)] = _rows(actions)
    assert (origin, req_no) == (CLIENT, 5)
    assert reply == {"action": p.PRODUCE, "queue": "q", "seq": 9, "code": p.CODE_ERROR,
                     "reason": "no leader", "node_id": ME}
    assert fw.forwards == {}


def test_with_forwarding_off_requests_are_redirected_to_the_leader():
    fw = _forwarding()
    leader = {"leader_node_id": LEADER, "leader_host": "10.0.0.2", "leader_port": 1102}
    actions = fw.on_requests([(CLIENT, 5, PRODUCE)], T0, leading=False, leader=LEADER, vote_id=VOTE,
                             redirect=leader)
    [(origin, req_no, reply)] = _rows(actions)
    assert (origin, req_no) == (CLIENT, 5)
    assert reply == {"action": p.PRODUCE, "queue": "q", "seq": 9, "code": p.CODE_REDIRECT, "node_id": ME, **leader}
    assert fw.forwards == {} and fw.wake_at() == float("inf")


# ----------------------------------------------------------------- timeouts and given-up forwards
def test_a_forward_times_out_its_grace_after_its_own_wait():
    fw = _forwarding()
    [fid] = _forward(fw, (CLIENT, 5, CONSUME))
    due = T0 + FORWARD_GRACE + CONSUME["wait"]
    assert fw.wake_at() == due
    assert fw.tick(due - 0.001, LEADER, VOTE) == []
    [(origin, req_no, reply)] = _rows(fw.tick(due, LEADER, VOTE))
    assert (origin, req_no) == (CLIENT, 5)
    assert reply == {"action": p.CONSUME, "queue": "q", "wait": 5, "seq": 10, "code": p.CODE_ERROR,
                     "reason": p.FORWARD_TIMED_OUT, "node_id": ME}
    assert fw.forwards == {} and fw.wake_at() == float("inf")
    assert fw.tick(due + 1, LEADER, VOTE) == []  # failed once


def test_a_wait_longer_than_max_wait_counts_as_max_wait():
    fw = _forwarding()
    _forward(fw, (CLIENT, 5, {**CONSUME, "wait": 1000}))
    assert fw.wake_at() == T0 + FORWARD_GRACE + MAX_WAIT


def test_a_late_consume_reply_gives_its_messages_back():
    fw = _forwarding()
    consume, produce = _forward(fw, (CLIENT, 5, CONSUME), (CLIENT, 6, {**PRODUCE, "wait": 5}))
    assert len(_rows(fw.tick(fw.wake_at(), LEADER, VOTE))) == 2
    late = T0 + 20
    assert fw.on_replies(_consumed(consume), late, VOTE) == [Undeliver("q", [[5, 1]])]
    assert fw.on_replies(_consumed(consume), late, VOTE) == []  # a second copy gives nothing back twice
    produced = {"action": p.PRODUCE, "queue": "q", "seq": 9, "code": p.CODE_OK, "msg_id": 1}
    assert fw.on_replies(_reply(produce, produced), late, VOTE) == []  # nothing to give back


def test_a_reply_to_a_forward_never_made_is_dropped():
    fw = _forwarding()
    assert fw.on_replies(_consumed(12345), T0, VOTE) == []


# ----------------------------------------------------------------- a change of leader
def test_after_a_change_of_leader_unanswered_forwards_fail_an_election_timeout_later():
    fw = _forwarding()
    answered, lost = _forward(fw, (CLIENT, 5, PRODUCE), (Origin(8), 6, CONSUME))
    changed = T0 + 1
    fw.orphan(changed)
    assert fw.wake_at() == changed + ELECTION
    fw.on_replies(_reply(answered, {"code": 0}), changed + 0.1, VOTE)  # the old leader answers one
    assert fw.tick(changed + ELECTION - 0.001, 3, VOTE + 1) == []
    [(origin, req_no, reply)] = _rows(fw.tick(changed + ELECTION, 3, VOTE + 1))
    assert (origin, req_no, reply["code"], reply["reason"]) == (Origin(8), 6, p.CODE_ERROR, p.LEADER_CHANGED)
    assert fw.forwards == {} and fw.orphaned == set()


def test_a_change_of_leader_never_extends_a_forwards_time():
    fw = _forwarding()
    [fid] = _forward(fw, (CLIENT, 5, PRODUCE))
    near_end = T0 + FORWARD_GRACE - 0.1
    fw.orphan(near_end)
    assert fw.wake_at() == T0 + FORWARD_GRACE
    [(_, _, reply)] = _rows(fw.tick(T0 + FORWARD_GRACE, None, VOTE))
    assert reply["reason"] == p.LEADER_CHANGED


def test_orphan_without_forwards_changes_nothing():
    fw = _forwarding()
    fw.orphan(T0)
    assert fw.wake_at() == float("inf") and fw.orphaned == set()


def test_a_forward_the_old_leader_refused_goes_to_the_new_leader_with_its_full_time():
    fw = _forwarding()
    [fid] = _forward(fw, (CLIENT, 5, PRODUCE))
    fw.orphan(T0 + 1)
    refused_at = T0 + 1.1
    assert fw.on_replies(_refused(fid), refused_at, VOTE) == []  # not applied: no reply to the client
    assert fid not in fw.orphaned
    assert fw.wake_at() == refused_at + HEARTBEAT  # sent again at the next heartbeat
    assert fw.tick(refused_at + HEARTBEAT - 0.001, 3, VOTE + 1) == []
    [send] = fw.tick(refused_at + HEARTBEAT, 3, VOTE + 1)
    assert send == Send(3, Forward(VOTE + 1, ME, ((fid, orjson.dumps(PRODUCE), True),)))
    # neither the old deadline nor the orphan's: a full grace from the refusal
    assert fw.tick(T0 + FORWARD_GRACE + 1, 3, VOTE + 1) == []
    [(_, _, reply)] = _rows(fw.tick(refused_at + FORWARD_GRACE, 3, VOTE + 1))
    assert reply["reason"] == p.FORWARD_TIMED_OUT


def test_a_forward_refused_unapplied_for_any_reason_is_sent_again_and_others_reach_the_client():
    """The leader's worker (not leading), its coordinator (a batch of a mode that is over: a
    hand-off that failed) and its forwarding all refuse with nothing applied: the follower sends
    the request again rather than handing its client the refusal."""
    for reason in sorted(p.NOT_APPLIED):
        fw = _forwarding()
        [fid] = _forward(fw, (CLIENT, 5, PRODUCE))
        assert fw.on_replies(_reply(fid, p.error_reply(PRODUCE, reason, LEADER)), T0 + 1, VOTE) == [], reason
        [send] = fw.tick(T0 + 1 + HEARTBEAT, LEADER, VOTE)
        assert send.msg.requests[0][0] == fid
    for reason in (p.STORAGE_UNAVAILABLE, p.LEADERSHIP_LOST, "queue: missing"):
        fw = _forwarding()
        [fid] = _forward(fw, (CLIENT, 5, PRODUCE))
        [(_, _, reply)] = _rows(fw.on_replies(_reply(fid, p.error_reply(PRODUCE, reason, LEADER)), T0 + 1, VOTE))
        assert reply["reason"] == reason


def test_a_refused_forward_waits_for_a_leader_and_is_served_here_when_this_node_leads():
    fw = _forwarding()
    [fid] = _forward(fw, (CLIENT, 5, PRODUCE))
    fw.on_replies(_refused(fid), T0 + 1, VOTE)
    assert fw.tick(T0 + 1 + HEARTBEAT, None, VOTE) == []  # no leader yet: kept
    assert fw.wake_at() == T0 + 1 + 2 * HEARTBEAT
    actions = fw.tick(T0 + 1 + 2 * HEARTBEAT, ME, VOTE + 1)
    assert actions == [Work(fw.router.worker_for("q"), ipc_frames.req_item(CLIENT, 5, PRODUCE))]
    assert fw.forwards == {} and fw.unsent == []


def test_a_forward_that_never_reached_the_old_leader_keeps_its_time_after_a_change_of_leader():
    """Its send failed (on_unsent), so the old leader cannot have applied it: it waits for the
    new leader, however long the election takes, and is sent there with its own time."""
    fw = _forwarding()
    [send] = fw.on_requests([(CLIENT, 5, CONSUME)], T0, leading=False, leader=LEADER, vote_id=VOTE, redirect=None)
    fw.on_unsent(send.msg, T0)  # the leader's link is down: it died
    changed = T0 + 1
    fw.orphan(changed)  # this node stands for election
    elected = changed + 2 * ELECTION
    assert fw.tick(changed + ELECTION, None, VOTE + 1) == []  # not failed as "may have been applied"
    assert fw.tick(elected, 3, VOTE + 1) == [Send(3, Forward(VOTE + 1, ME, send.msg.requests))]
    assert fw.tick(elected + ELECTION, 3, VOTE + 1) == []  # the new leader holds it (its wait is 5)
    [(_, _, reply)] = _rows(fw.tick(T0 + FORWARD_GRACE + CONSUME["wait"], 3, VOTE + 1))
    assert reply["reason"] == p.FORWARD_TIMED_OUT


# ----------------------------------------------------------------- forwards that could not be sent
def test_a_forward_that_could_not_be_sent_is_sent_again_every_heartbeat():
    fw = _forwarding()
    [send] = fw.on_requests([(CLIENT, 5, PRODUCE)], T0, leading=False, leader=LEADER, vote_id=VOTE, redirect=None)
    fw.on_unsent(send.msg, T0)
    assert fw.wake_at() == T0 + HEARTBEAT
    assert fw.tick(T0 + HEARTBEAT - 0.001, LEADER, VOTE) == []
    assert fw.tick(T0 + HEARTBEAT, LEADER, VOTE) == [Send(LEADER, Forward(VOTE, ME, send.msg.requests))]
    assert fw.unsent == []
    fw.on_unsent(send.msg, T0 + 0.2)  # not sent again either: again a heartbeat later
    assert fw.tick(T0 + 0.2 + HEARTBEAT, 3, VOTE + 1) == [Send(3, Forward(VOTE + 1, ME, send.msg.requests))]


def test_an_unsent_forward_answered_meanwhile_or_sent_twice_goes_once():
    fw = _forwarding()
    [send] = fw.on_requests([(CLIENT, 5, PRODUCE), (CLIENT, 6, PRODUCE)], T0, leading=False, leader=LEADER,
                            vote_id=VOTE, redirect=None)
    (answered, _, _), waiting = send.msg.requests
    fw.on_unsent(send.msg, T0)
    fw.on_unsent(send.msg, T0 + 0.01)
    fw.on_replies(_reply(answered, {"code": 0}), T0 + 0.02, VOTE)
    assert fw.tick(T0 + HEARTBEAT, LEADER, VOTE) == [Send(LEADER, Forward(VOTE, ME, (waiting,)))]


def test_only_forwards_are_sent_again():
    fw = _forwarding()
    assert fw.on_unsent(ForwardReply(VOTE, ME, ((1, b"{}\n"),)), T0) == []
    assert fw.unsent == [] and fw.wake_at() == float("inf")


def test_a_consume_reply_that_cannot_go_back_to_its_follower_gives_its_messages_back():
    """The follower stopped (or died) with a long poll parked here: the message that serves the
    poll must not be lost with the reply, as it was when the reply was dropped."""
    fw = _forwarding(node_id=LEADER)
    reply = _consumed(7)
    both = ForwardReply(VOTE, LEADER, (reply.replies[0], _reply(8, {"action": p.PRODUCE, "code": 0}).replies[0]))
    assert fw.on_unsent(both, T0) == [Undeliver("q", [[5, 1]])]
    assert fw.unsent == []


def test_a_reply_whose_send_failed_is_sent_again_to_its_node_every_heartbeat():
    """The follower's link is down for a moment (it is being made again): the reply goes to it
    once the link is back, and its consume's messages stay taken."""
    fw = _forwarding(node_id=LEADER)
    reply = _consumed(7)
    assert fw.on_unsent(reply, T0, to=ME) == []
    assert fw.wake_at() == T0 + HEARTBEAT
    assert fw.tick(T0 + HEARTBEAT / 2, None, VOTE) == []
    assert fw.tick(T0 + HEARTBEAT, None, VOTE) == [Send(ME, reply)]
    assert fw.on_unsent(reply, T0 + HEARTBEAT, to=ME) == []  # still down
    assert fw.tick(T0 + 2 * HEARTBEAT, None, VOTE) == [Send(ME, reply)]  # sent: nothing more
    assert fw.tick(T0 + 3 * HEARTBEAT, None, VOTE) == [] and fw.wake_at() == float("inf")
    assert fw.replies_lost == 0


def test_a_reply_that_cannot_be_sent_for_reply_retry_gives_its_messages_back_once():
    fw = _forwarding(node_id=LEADER)
    reply = _consumed(7)
    now = T0
    assert fw.on_unsent(reply, now, to=ME) == []
    given = []
    while not given:
        now = fw.wake_at()
        assert now < T0 + REPLY_RETRY + HEARTBEAT  # the deadline is the first failure's, not renewed
        assert fw.tick(now, None, VOTE) == [Send(ME, reply)]
        given = fw.on_unsent(reply, now, to=ME)
    assert given == [Undeliver("q", [[5, 1]])] and now >= T0 + REPLY_RETRY
    assert fw.replies_lost == 1 and fw.replies_unsent == [] and fw.wake_at() == float("inf")


# ----------------------------------------------------------------- the leader's side
def test_a_leader_routes_requests_to_the_worker_owning_the_queue():
    fw = _forwarding(workers=4)
    names = [f"queue-{i}" for i in range(8)]
    assert len({fw.router.worker_for(q) for q in names}) > 1  # the names do spread over workers
    items = [(Origin(i), i, {"action": p.PRODUCE, "queue": q, "data": "x"}) for i, q in enumerate(names)]
    actions = fw.on_requests(items, T0, leading=True, leader=ME, vote_id=VOTE, redirect=None)
    assert actions == [Work(fw.router.worker_for(q), ipc_frames.req_item(o, n, r)) for (o, n, r), q in zip(items, names)]
    assert fw.forwards == {}


def test_a_scatter_action_goes_to_every_worker_under_its_own_gather_id():
    fw = _forwarding(workers=3)
    assert p.LIST in SCATTER_ACTIONS and p.MONITOR in SCATTER_ACTIONS
    listing = {"action": p.LIST}
    first = fw.route(CLIENT, 5, listing)
    second = fw.route(CLIENT, 6, listing)
    assert [w.index for w in first] == [0, 1, 2]
    tags = {w.item[3][0] for w in first}, {w.item[3][0] for w in second}
    assert tags == ({1}, {3})  # odd: the acceptor's own gathers are even
    assert first[0].item == ipc_frames.req_item(CLIENT, 5, listing, [1, CLIENT.wire(), 5, 3, listing])
    monitor = {"action": p.MONITOR, "queue": "q"}
    [one] = fw.route(CLIENT, 7, monitor)  # a monitor of one queue asks its worker only
    assert one.index == fw.router.worker_for("q") and one.item[3] == [5, CLIENT.wire(), 7, 1, monitor]


def test_a_leader_answers_leader_and_bad_requests_itself():
    fw = _forwarding()
    [(_, _, reply)] = _rows(fw.route(CLIENT, 5, {"action": p.LEADER, "seq": 1}))
    assert reply == {"action": p.LEADER, "seq": 1, "code": p.CODE_OK, "node_id": ME, "leader_node_id": ME,
                     "leader_host": "127.0.0.1", "leader_port": 1101}
    [(_, _, reply)] = _rows(fw.route(CLIENT, 5, {"action": "nonsense"}))
    assert (reply["code"], reply["reason"]) == (p.CODE_ERROR, "action: unknown")
    [(origin, req_no, reply)] = _rows(fw.route(CLIENT, 6, {"action": p.PRODUCE, "data": "x"}))
    assert (origin, req_no, reply["code"], reply["reason"]) == (CLIENT, 6, p.CODE_ERROR, "queue: missing")


def test_a_leader_serves_a_followers_requests_under_their_forward_ids():
    fw = _forwarding()
    msg = Forward(VOTE, 3, ((77, orjson.dumps(PRODUCE), True), (78, orjson.dumps({"action": p.LEADER}), False)))
    work, back = fw.serve(msg, True, VOTE)
    assert work == Work(fw.router.worker_for("q"), ipc_frames.req_item(Origin(77, True, 3), 0, PRODUCE))
    assert back.to == 3 and type(back.msg) is ForwardReply  # answered here: back to the follower
    [(fid, _)] = back.msg.replies
    assert fid == 78
    assert fw.served


def test_a_node_that_does_not_lead_refuses_forwards_as_not_applied():
    fw = _forwarding()
    [send] = fw.serve(Forward(VOTE, 3, ((77, orjson.dumps(PRODUCE), True),)), False, VOTE + 1)
    assert send.to == 3 and type(send.msg) is ForwardReply and (send.msg.vote_id, send.msg.src) == (VOTE + 1, ME)
    [(fid, data)] = send.msg.replies
    assert fid == 77
    assert orjson.loads(data) == p.error_reply(PRODUCE, p.LEADERSHIP_CHANGED, ME)
    assert not fw.served


def test_release_passes_replies_on_untouched_until_a_follower_was_served():
    fw = _forwarding()
    header, blob = replies.encode([(Origin(77, False, 3), 0, {"code": 0})])
    assert fw.release(header, blob, VOTE) == [Deliver(header, blob)]


def test_after_serving_a_follower_a_batch_of_this_nodes_own_replies_is_passed_on_as_it_is():
    fw = _forwarding()
    fw.serve(Forward(VOTE, 3, ((77, orjson.dumps(PRODUCE), False),)), True, VOTE)
    header, blob = replies.encode([(CLIENT, 5, {"n": 1}), (Origin(4), 2, {"n": 2})])
    [deliver] = fw.release(header, blob, VOTE)
    assert deliver.header is header and deliver.blob is blob  # not decoded and encoded again


def test_release_sends_followers_replies_back_and_keeps_this_nodes_own():
    fw = _forwarding()
    fw.serve(Forward(VOTE, 3, ((77, orjson.dumps(PRODUCE), False),)), True, VOTE)
    header, blob = replies.encode([(Origin(77, False, 3), 0, {"n": 1}), (CLIENT, 5, {"n": 2}),
                                   (Origin(12, True, 2), 0, {"n": 3}), (Origin(78, False, 3), 0, {"n": 4})])
    deliver, to3, to2 = fw.release(header, blob, VOTE)
    assert _rows([deliver]) == [(CLIENT, 5, {"n": 2})]
    assert to3 == Send(3, ForwardReply(VOTE, ME, ((77, b'{"n":1}\n'), (78, b'{"n":4}\n'))))
    assert to2 == Send(2, ForwardReply(VOTE, ME, ((12, b'{"n":3}\n'),)))


def test_a_forwarded_request_round_trips_from_follower_to_leader_and_back():
    follower, leader = _forwarding(ME), _forwarding(LEADER)
    [send] = follower.on_requests([(CLIENT, 5, PRODUCE)], T0, leading=False, leader=LEADER, vote_id=VOTE,
                                  redirect=None)
    [work] = leader.serve(send.msg, True, VOTE)
    origin, req_no, request = work.item
    answer = {**p.echo(request), "code": p.CODE_OK, "msg_id": 1}
    [back] = leader.release(*replies.encode([(Origin.from_wire(origin), req_no, answer)]), VOTE)
    assert back.to == ME
    assert _rows(follower.on_replies(back.msg, T0 + 0.01, VOTE)) == [(CLIENT, 5, answer)]


def test_a_bad_request_the_leader_answers_itself_goes_back_to_the_follower_at_once():
    follower, leader = _forwarding(ME), _forwarding(LEADER)
    [send] = follower.on_requests([(CLIENT, 5, {"action": p.PRODUCE, "data": "x", "seq": 3})], T0, leading=False,
                                  leader=LEADER, vote_id=VOTE, redirect=None)
    [back] = leader.serve(send.msg, True, VOTE)
    assert back.to == ME
    [(origin, req_no, reply)] = _rows(follower.on_replies(back.msg, T0 + 0.01, VOTE))
    assert (origin, req_no, reply["reason"], reply["node_id"]) == (CLIENT, 5, "queue: missing", LEADER)
    assert follower.forwards == {}  # answered: it never times out


# ----------------------------------------------------------------- the replies it makes, counted
def test_no_leader_and_redirect_replies_are_counted_by_action_and_code():
    fw = _forwarding()
    fw.on_requests([(CLIENT, 5, PRODUCE), (CLIENT, 6, CONSUME)], T0, leading=False, leader=None, vote_id=VOTE,
                   redirect=None)
    fw.on_requests([(CLIENT, 7, PRODUCE)], T0, leading=False, leader=LEADER, vote_id=VOTE,
                   redirect={"leader_node_id": LEADER, "leader_host": "h", "leader_port": 1})
    assert fw.take_replied() == {(p.PRODUCE, p.CODE_ERROR): 1, (p.CONSUME, p.CODE_ERROR): 1,
                                 (p.PRODUCE, p.CODE_REDIRECT): 1}
    assert fw.take_replied() == {}  # taken once


def test_failed_forwards_are_counted_and_answered_ones_are_not():
    fw = _forwarding()
    answered, orphaned = _forward(fw, (CLIENT, 5, PRODUCE), (CLIENT, 6, {**PRODUCE, "action": "produce"}))
    fw.on_replies(_reply(answered, {"action": p.PRODUCE, "code": p.CODE_OK}), T0 + 0.1, VOTE)
    assert fw.take_replied() == {}  # the leader's worker counts the replies it made
    fw.orphan(T0 + 1)
    [timed_out] = _forward(fw, (CLIENT, 7, CONSUME), now=T0 + 2)  # to the new leader
    [(_, _, reply)] = _rows(fw.tick(T0 + 1 + ELECTION, 3, VOTE + 1))
    assert reply["reason"] == p.LEADER_CHANGED
    assert fw.take_replied() == {("produce", p.CODE_ERROR): 1}  # the action as the client gave it
    [(_, _, reply)] = _rows(fw.tick(T0 + 2 + FORWARD_GRACE + CONSUME["wait"], 3, VOTE + 1))
    assert reply["reason"] == p.FORWARD_TIMED_OUT
    assert fw.take_replied() == {(p.CONSUME, p.CODE_ERROR): 1}
    fw.on_replies(_consumed(timed_out), T0 + 30, VOTE + 1)  # too late: given back, not counted
    assert fw.take_replied() == {}


def test_a_leader_counts_the_replies_it_makes_itself_and_not_a_refusal_to_forward():
    fw = _forwarding()
    fw.route(CLIENT, 5, {"action": p.LEADER})
    fw.route(CLIENT, 6, {"action": "nonsense"})
    fw.serve(Forward(VOTE, 3, ((77, orjson.dumps({"action": p.PRODUCE}), False),
                               (78, orjson.dumps(PRODUCE), False))), True, VOTE)
    assert fw.take_replied() == {(p.LEADER, p.CODE_OK): 1, ("nonsense", p.CODE_ERROR): 1,
                                 (p.PRODUCE, p.CODE_ERROR): 1}  # the forwarded produce without a queue
    fw.serve(Forward(VOTE, 3, ((79, orjson.dumps(PRODUCE), False),)), False, VOTE + 1)
    assert fw.take_replied() == {}  # not an answer: the follower sends it again
