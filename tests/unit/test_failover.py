"""client/failover.py: every decision of the clients' shared fail-over core, without sockets."""
from __future__ import annotations

import pytest

from queue_server.client.errors import NoServerAvailable, QueueError, QueueTimeout
from queue_server.client.protocol import PRODUCE as PRODUCE_ACTION
from queue_server.protocol import vocabulary as v
from queue_server.protocol.vocabulary import LEADER_CHANGED
from queue_server.client.failover import (AGAIN, DONE, MAX_RESENDS, NEXT, ROUND_PAUSE, ROUND_PAUSE_MAX, Attempt, Drop,
                                          Failover, Lost, Reconnect, Route)

A, B, C = ("a", 1), ("b", 2), ("c", 3)
PRODUCE = {"action": PRODUCE_ACTION, "queue": "q", "data": "x", "producer": "p", "sequence": 7}


def failover(hosts=(A, B, C), req=None, **kw) -> Failover:
    return Failover(Route(hosts), req if req is not None else {"action": 103, "queue": "q"}, 5.0, **kw)


def attempt(f: Failover) -> Attempt:
    step = f.next()
    assert isinstance(step, Attempt), step
    return step


def test_ok_reply_is_done_and_the_route_stays():
    f = failover()
    a = attempt(f)
    assert (a.addr, a.drop) == (A, Drop.KEEP)
    assert f.replied(a, {"code": 0}) is DONE
    assert f.route.address == A


def test_attempt_timeout_adds_the_long_poll_wait():
    assert failover().timeout == 5.0
    f = failover(req={"action": 103, "queue": "q", "wait": 2.5})
    assert (f.wait, f.timeout) == (2.5, 7.5)
    assert failover(req={"action": 103, "wait": True}).timeout == 5.0  # not a number of seconds


def test_redirect_moves_to_the_leader_and_lets_the_old_connection_finish():
    f = failover()
    a = attempt(f)
    assert f.replied(a, {"code": -2, "leader_host": "c", "leader_port": 3}) is AGAIN
    b = attempt(f)
    assert (b.addr, b.drop) == (C, Drop.FINISH)
    assert b.epoch == a.epoch + 1
    assert f.route.address == C  # later calls go there first too


def test_redirect_to_a_wildcard_host_keeps_the_host_name():
    f = failover()
    a = attempt(f)
    assert f.replied(a, {"code": -2, "leader_host": "0.0.0.0", "leader_port": 9}) is AGAIN
    assert attempt(f).addr == ("a", 9)


def test_redirects_stop_after_max_and_when_not_followed():
    f = failover(max_redirects=2)
    for _ in range(2):
        assert f.replied(attempt(f), {"code": -2, "leader_host": "c", "leader_port": 3}) is AGAIN
    err = f.replied(attempt(f), {"code": -2, "leader_host": "c", "leader_port": 3})
    assert isinstance(err, QueueError) and err.code == -2
    err = failover(follow_redirects=False).replied(attempt(failover()), {"code": -2, "leader_port": 3})
    assert isinstance(err, QueueError) and err.code == -2


def test_redirect_without_a_usable_port_is_the_error():
    f = failover()
    err = f.replied(attempt(f), {"code": -2, "reason": "redirect", "leader_port": 0})
    assert isinstance(err, QueueError) and err.reason == "redirect"


def test_a_redirect_another_call_already_followed_keeps_the_connections():
    route = Route([A, B])
    f, g = Failover(route, {}, 1.0), Failover(route, {}, 1.0)
    fa, ga = attempt(f), attempt(g)
    assert f.replied(fa, {"code": -2, "leader_host": "c", "leader_port": 3}) is AGAIN
    assert g.replied(ga, {"code": -2, "leader_host": "c", "leader_port": 3}) is AGAIN
    assert attempt(f).drop is Drop.FINISH
    assert (attempt(g).addr, route.epoch) == (C, 1)
    assert Failover(route, {}, 1.0).next().drop is Drop.KEEP


@pytest.mark.parametrize("reason", [v.NO_LEADER, v.FORWARD_TIMED_OUT])
def test_a_node_that_cannot_pass_the_request_on_is_left_for_the_next_host(reason):
    f = failover(req=PRODUCE)
    a = attempt(f)
    assert f.replied(a, {"code": -1, "reason": reason}) is NEXT
    b = attempt(f)
    assert (b.addr, b.drop) == (B, Drop.CLOSE)


@pytest.mark.parametrize("reason", sorted(v.NOT_APPLIED - v.ASK_ANOTHER_NODE))
def test_a_refusal_of_a_node_whose_mode_changed_is_sent_to_it_again(reason):
    """A node that refused a request unapplied because it stopped leading, or its workers' mode
    changed (a hand-off that failed), knows where the request goes by now: itself, or the
    leader it forwards or redirects to. So a client with one host retries too."""
    for hosts in ([A], [A, B, C]):
        f = failover(hosts=hosts)
        for _ in range(MAX_RESENDS):
            a = attempt(f)
            assert f.replied(a, {"code": -1, "reason": reason}) is AGAIN
            assert f.route.address == A
        a = attempt(f)
        assert (a.addr, a.drop) == (A, Drop.KEEP)  # on the same connection
        verdict = f.replied(a, {"code": -1, "reason": reason})
        if len(hosts) == 1:
            assert type(verdict) is QueueError and verdict.reason == reason
        else:
            assert verdict is NEXT and attempt(f).addr == B
    f = failover(hosts=[A])
    assert f.replied(attempt(f), {"code": -1, "reason": reason}) is AGAIN
    assert f.replied(attempt(f), {"code": 0}) is DONE


def test_leader_changed_resends_only_an_idempotent_produce():
    f = failover(req=PRODUCE)
    assert f.replied(attempt(f), {"code": -1, "reason": LEADER_CHANGED}) is AGAIN
    assert attempt(f).addr == A  # the same request again: (producer, sequence) stores it once
    plain = dict(PRODUCE)
    del plain["sequence"]
    f = failover(req=plain)
    err = f.replied(attempt(f), {"code": -1, "reason": LEADER_CHANGED})
    assert isinstance(err, QueueError) and not isinstance(err, NoServerAvailable)
    f = failover()  # a consume: it may have been applied
    assert isinstance(f.replied(attempt(f), {"code": -1, "reason": LEADER_CHANGED}), QueueError)
    f = failover(req={**PRODUCE, "action": "produce"})  # the action by name
    assert f.replied(attempt(f), {"code": -1, "reason": LEADER_CHANGED}) is AGAIN


def test_other_errors_and_a_single_host_are_the_reply_error():
    f = failover()
    err = f.replied(attempt(f), {"code": -1, "reason": "queue: missing"})
    assert isinstance(err, QueueError) and err.reason == "queue: missing"
    f = failover(hosts=[A])
    err = f.replied(attempt(f), {"code": -1, "reason": "no leader"})
    assert type(err) is QueueError and err.reason == "no leader"


def test_a_closed_kept_open_connection_is_retried_once_on_the_same_host():
    f = failover()
    a = attempt(f)
    assert f.failed(a, Lost("connection closed by the server", reused=True)) is AGAIN
    b = attempt(f)
    assert (b.addr, b.epoch, b.drop) == (A, a.epoch, Drop.KEEP)
    assert f.failed(b, Lost("connection closed by the server", reused=True)) is NEXT
    assert attempt(f).addr == B


def test_every_host_failing_names_each_failure():
    f = failover()
    assert f.failed(attempt(f), ConnectionRefusedError(111, "refused")) is NEXT
    assert f.failed(attempt(f), Lost("connection closed by the server")) is NEXT
    assert f.replied(attempt(f), {"code": -1, "reason": "no leader"}) is NEXT
    err = f.next()
    assert isinstance(err, NoServerAvailable)
    assert err.reason == ("no server available: a:1: ConnectionRefusedError: [Errno 111] refused; "
                          "b:2: connection closed by the server; c:3: QueueError: [-1] no leader")
    assert f.route.address == C  # the last host stays current: the next call starts there


NO_LEADER = {"code": -1, "reason": "no leader"}


def _fail_round(f: Failover, now: float) -> list:
    """Every host of f's route fails once: the first connection refused, the others "no leader"."""
    tried = []
    first = f.next(now)
    assert isinstance(first, Attempt), first
    tried.append(first.addr)
    assert f.failed(first, ConnectionRefusedError(111, "refused")) is NEXT
    for _ in range(len(f.route.hosts) - 1):
        a = f.next(now)
        assert isinstance(a, Attempt), a
        tried.append(a.addr)
        assert f.replied(a, NO_LEADER) is NEXT
    return tried


def test_between_two_leaders_a_call_pauses_and_goes_round_the_hosts_again():
    f = Failover(Route([A, B, C]), {"action": 103, "queue": "q"}, 5.0, patience=5.0, now=100.0)
    assert sorted(_fail_round(f, 100.0)) == [A, B, C]
    assert f.next(100.1) == ROUND_PAUSE
    again = f.next(100.2)  # a new round: every host may be tried once more
    assert isinstance(again, Attempt) and again.addr == C  # from where the route is
    assert f.replied(again, {"code": 0}) is DONE


def test_the_pauses_grow_and_the_call_gives_up_when_its_patience_is_spent():
    f = Failover(Route([A, B]), {"action": 103, "queue": "q"}, 5.0, patience=1.0, now=0.0)
    pauses, now = [], 0.0
    while True:
        _fail_round(f, now)
        step = f.next(now)
        if not isinstance(step, float):
            break
        pauses.append(step)
        now += step
    assert pauses == [ROUND_PAUSE, 2 * ROUND_PAUSE, 4 * ROUND_PAUSE, ROUND_PAUSE_MAX][:len(pauses)]
    assert sum(pauses) <= 1.0 < sum(pauses) + ROUND_PAUSE_MAX
    assert isinstance(step, NoServerAvailable)
    # the last round's failures, each host once
    assert step.reason.count("a:1") == 1 and step.reason.count("b:2") == 1


def test_a_single_host_between_two_leaders_is_asked_again_and_its_refusal_is_the_error():
    """A client given one node of a cluster (or a name in front of several) waits out an
    election too; when its patience is spent, the node's own answer is the error."""
    f = Failover(Route([A]), {"action": 103, "queue": "q"}, 5.0, patience=0.2, now=0.0)
    now, pauses = 0.0, []
    while True:
        step = f.next(now)
        if isinstance(step, float):
            pauses.append(step)
            now += step
            continue
        if not isinstance(step, Attempt):
            break
        assert step.addr == A
        assert f.replied(step, NO_LEADER) is NEXT
    assert pauses == [ROUND_PAUSE, 2 * ROUND_PAUSE]
    assert type(step) is QueueError and step.reason == "no leader"
    f = Failover(Route([A]), {"action": 103, "queue": "q"}, 5.0, patience=5.0, now=0.0)
    assert f.replied(f.next(0.0), NO_LEADER) is NEXT
    assert f.next(0.0) == ROUND_PAUSE
    assert f.replied(f.next(0.1), {"code": 0}) is DONE  # a leader was elected meanwhile


def test_no_round_again_when_no_host_answered_or_without_patience():
    f = Failover(Route([A, B]), {"action": 103, "queue": "q"}, 5.0, patience=5.0, now=0.0)
    assert f.failed(f.next(0.0), ConnectionRefusedError(111, "refused")) is NEXT
    assert f.failed(f.next(0.0), TimeoutError("timed out")) is NEXT
    assert isinstance(f.next(0.0), QueueTimeout)  # hosts down or silent: no election to wait out
    f = Failover(Route([A, B]), {"action": 103, "queue": "q"}, 5.0)
    _fail_round(f, 0.0)
    assert isinstance(f.next(0.0), NoServerAvailable)


def test_a_round_again_does_not_apply_to_errors_that_are_the_answer():
    f = Failover(Route([A, B]), {"action": 103, "queue": "q"}, 5.0, patience=5.0, now=0.0)
    err = f.replied(f.next(0.0), {"code": -1, "reason": "queue: not found"})
    assert isinstance(err, QueueError)


def test_a_timeout_on_the_last_host_tried_is_a_timeout():
    f = failover(hosts=[A, B])
    assert f.failed(attempt(f), ConnectionRefusedError("refused")) is NEXT
    assert f.failed(attempt(f), TimeoutError("timed out")) is NEXT
    err = f.next()
    assert isinstance(err, QueueTimeout) and err.reason.startswith("timed out: a:1: ")
    f = failover(hosts=[A, B])
    assert f.failed(attempt(f), TimeoutError("timed out")) is NEXT
    assert f.failed(attempt(f), ConnectionRefusedError("refused")) is NEXT
    assert type(f.next()) is NoServerAvailable


def test_each_host_is_tried_at_most_once_even_when_redirected_back():
    f = failover()
    assert f.failed(attempt(f), TimeoutError("timed out")) is NEXT
    b = attempt(f)
    assert f.replied(b, {"code": -2, "leader_host": "a", "leader_port": 1}) is AGAIN
    skip = attempt(f)  # the leader named is A, which failed this call: back to the list (B did not fail)
    assert (skip.addr, skip.drop) == (B, Drop.FINISH)


def test_a_failure_after_another_call_moved_on_does_not_move_again():
    route = Route([A, B, C])
    f, g = Failover(route, {}, 1.0), Failover(route, {}, 1.0)
    fa, ga = attempt(f), attempt(g)
    assert f.failed(fa, TimeoutError()) is NEXT
    assert g.failed(ga, TimeoutError()) is NEXT
    assert route.address == B  # one move for the one failed host
    assert attempt(f).drop is Drop.CLOSE
    assert (attempt(g).addr, attempt(g).drop) == (B, Drop.KEEP)


def test_route_renew_keeps_the_host():
    route = Route([A, B])
    route.renew()
    assert (route.address, route.epoch) == (A, 1)


def test_reconnect_pauses_until_its_patience_runs_out():
    clock = 100.0
    r = Reconnect(clock, "subscribe q", patience=30.0, pause=0.2)
    assert r.failed(clock + 1, OSError("refused")) == 0.2
    assert r.failed(clock + 30.0, OSError("refused")) == 0.2
    err = r.failed(clock + 30.01, ConnectionRefusedError())
    assert isinstance(err, NoServerAvailable)
    assert err.reason == "subscribe q: no leader reachable: ConnectionRefusedError"


# ----------------------------------------------------------------- queue groups (issue 28 step 7)
from queue_server.client.group_leaders import REFRESH_AFTER, GroupLeaders  # noqa: E402
from queue_server.protocol.placement import Placement  # noqa: E402

GROUPED = Placement([1, 2, 3], 3)
Q = {g: next(f"q{i}" for i in range(100) if GROUPED.group_of(f"q{i}") == g) for g in range(3)}


def grouped_route() -> Route:
    """A route over A, B, C that knows group g is led by the host at position g."""
    route = Route((A, B, C))
    route.groups = GroupLeaders(GROUPED, {0: A, 1: B, 2: C})
    return route


def test_a_request_about_a_queue_goes_straight_to_its_group_s_leader():
    route = grouped_route()
    for g, addr in enumerate((A, B, C)):
        f = Failover(route, {"action": 1, "queue": Q[g], "data": "x"}, 5.0)
        assert attempt(f).addr == addr
    assert attempt(Failover(route, {"action": 4}, 5.0)).addr == A  # no queue: the route's host
    assert route.address == A  # the route itself never moved


def test_a_group_leader_that_fails_is_forgotten_and_the_request_goes_through_any_node():
    route = grouped_route()
    f = Failover(route, {"action": 1, "queue": Q[2], "data": "x"}, 5.0, now=100.0)
    a = attempt(f)
    assert a.addr == C and f.failed(a, ConnectionRefusedError("refused")) is NEXT
    assert attempt(f).addr == A and route.groups.leaders == {0: A, 1: B}
    assert not route.groups.due(100.0 + REFRESH_AFTER - 0.01) and route.groups.due(100.0 + REFRESH_AFTER)
    f = Failover(route, {"action": 1, "queue": Q[1], "data": "x"}, 5.0)  # another group's leader stays
    a = attempt(f)
    assert a.addr == B
    assert f.replied(a, {"code": -1, "reason": v.NOT_LEADING}) is AGAIN  # not leading any more
    assert attempt(f).addr == A and 1 not in route.groups.leaders


def test_a_redirect_moves_its_group_s_leader_and_not_the_route():
    route = grouped_route()
    route.groups.leaders.pop(2)
    f = Failover(route, {"action": 1, "queue": Q[2], "data": "x"}, 5.0)
    a = attempt(f)
    assert a.addr == A
    assert f.replied(a, {"code": -2, "leader_host": "b", "leader_port": 2}) is AGAIN
    assert attempt(f).addr == B and route.groups.leaders[2] == B and route.address == A


def test_group_leaders_are_learnt_from_action_8_and_a_cluster_of_one_group_has_none():
    reply = {"code": 0, "groups": [{"group": 0, "leader_node_id": 1, "leader_host": "0.0.0.0", "leader_port": 1},
                                   {"group": 1, "leader_node_id": 0, "leader_host": "", "leader_port": 0},
                                   {"group": 2, "leader_node_id": 3, "leader_host": "c", "leader_port": 3}],
             "placement": GROUPED.as_dict()}
    groups = GroupLeaders.from_reply(reply, "a")
    assert groups is not None and groups.leaders == {0: A, 2: C}  # a wildcard host: the one that answered
    assert groups.leader_of({"action": 1, "queue": Q[2]}) == C and groups.leader_of({"action": 4}) is None
    assert GroupLeaders.from_reply({"code": 0, "leader_node_id": 1}, "a") is None
    assert GroupLeaders.from_reply({**reply, "placement": {"nodes": "x"}}, "a") is None
