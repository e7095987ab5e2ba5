"""Unit tests for election/state.py (fake clock, messages passed by hand or by a tiny network)."""

import random
from collections import deque

import pytest

from queue_server.election.messages import (
    BecomeCandidate,
    BecomeFollower,
    BecomeLeader,
    Heartbeat,
    HeartbeatAck,
    PersistVote,
    Send,
    TimeoutNow,
    TransferAborted,
    VoteReply,
    VoteRequest,
)
from queue_server.election.state import Election, Role
from queue_server.replication.log import ChangeLog
from queue_server.replication.messages import AppendAck, AppendEntries

T = 1.0  # election timeout
HB = 0.1  # heartbeat interval


def make(node_id, members, now=0.0, log=None, seed=None, **kw):
    kw.setdefault("election_timeout", T)
    kw.setdefault("heartbeat_interval", HB)
    return Election(node_id, members, log or ChangeLog(100), random.Random(seed if seed is not None else node_id),
                    now, **kw)


def sends(actions, cls=None):
    return [a for a in actions if isinstance(a, Send) and (cls is None or isinstance(a.msg, cls))]


def of(actions, cls):
    return [a for a in actions if isinstance(a, cls)]


class Net:
    """Nodes exchanging messages instantly, with links that can be cut. Checks that there is at
    most one leader per vote_id."""

    def __init__(self, n, seed=0, logs=None, **kw):
        self.members = list(range(1, n + 1))
        self.logs = logs or {i: ChangeLog(100) for i in self.members}
        self.nodes = {i: make(i, self.members, log=self.logs[i], seed=seed * 100 + i, **kw) for i in self.members}
        self.cut: set[tuple[int, int]] = set()
        self.down: set[int] = set()
        self.leaders: dict[int, int] = {}
        self.now = 0.0

    def isolate(self, i):
        for j in self.members:
            if j != i:
                self.cut |= {(i, j), (j, i)}

    def heal(self):
        self.cut.clear()

    def _handle(self, src, actions, queue):
        for a in actions:
            if isinstance(a, BecomeLeader):
                assert self.leaders.setdefault(a.vote_id, src) == src, f"two leaders in {a.vote_id}"
            if isinstance(a, Send) and (src, a.to) not in self.cut and a.to not in self.down:
                queue.append((a.to, a.msg))

    def step(self, now, order=None):
        self.now = now
        queue = deque()
        for i in order or self.members:
            if i not in self.down:
                self._handle(i, self.nodes[i].tick(now), queue)
        while queue:
            dst, msg = queue.popleft()
            self._handle(dst, self.nodes[dst].on_message(msg, now), queue)

    def run(self, until, dt=0.01):
        t = self.now
        while t < until:
            t = round(t + dt, 6)
            self.step(t)

    def leader_ids(self):
        return [i for i, n in self.nodes.items() if n.is_leader and i not in self.down]


# ------------------------------------------------------------------ basics


def test_single_node_elects_itself_at_once():
    e = make(1, [1])
    actions = e.tick(0.0)
    assert e.is_leader and e.role is Role.LEADER
    assert e.vote_id == 1 and e.voted_for == 1 and e.leader_id == 1
    assert PersistVote(1, 1) in actions
    assert BecomeLeader(1) in actions
    assert actions.index(PersistVote(1, 1)) < actions.index(BecomeLeader(1))
    assert not sends(actions)
    # and stays leader: nobody to lose
    assert e.tick(100.0) == [] and e.is_leader


def test_follower_waits_for_a_randomized_timeout():
    e = make(1, [1, 2, 3])
    assert e.tick(0.99 * T) == []
    assert e.role is Role.FOLLOWER
    actions = e.tick(2 * T)  # timeouts are in [T, 2T)
    assert e.role is Role.PRE_CANDIDATE
    assert e.vote_id == 0  # pre-vote does not raise the term
    reqs = sends(actions, VoteRequest)
    assert sorted(s.to for s in reqs) == [2, 3]
    assert all(s.msg.pre_vote and s.msg.vote_id == 1 for s in reqs)


def test_timeouts_differ_between_nodes():
    deadlines = set()
    for seed in range(5):
        e = make(1, [1, 2, 3], seed=seed)
        t = 0.0
        while not e.tick(t):
            t += 0.001
        deadlines.add(round(t, 3))
    assert len(deadlines) > 1


def test_three_nodes_elect_exactly_one():
    net = Net(3)
    net.run(3 * T)
    leaders = net.leader_ids()
    assert len(leaders) == 1
    leader = leaders[0]
    vote_id = net.nodes[leader].vote_id
    for n in net.nodes.values():
        assert n.vote_id == vote_id and n.leader_id == leader
    # and it stays stable: heartbeats keep followers from campaigning
    net.run(20 * T)
    assert net.leader_ids() == [leader] and net.nodes[leader].vote_id == vote_id


@pytest.mark.parametrize("seed", range(20))
def test_simultaneous_start_one_leader_per_vote_id(seed):
    # Every node times out at the same instant and campaigns before hearing from the others.
    net = Net(3, seed=seed, pre_vote=False)
    for n in net.nodes.values():
        n._deadline = 1.0
    net.step(1.0, order=[3, 1, 2])
    assert len(net.leader_ids()) <= 1
    net.run(10 * T)
    assert len(net.leader_ids()) == 1


def test_split_vote_resolves():
    # Four nodes, two candidates in the same term, each gets one other vote: nobody wins.
    members = [1, 2, 3, 4]
    nodes = {i: make(i, members, pre_vote=False, seed=i) for i in members}
    now = 5.0
    r1 = sends(nodes[1].tick(now), VoteRequest)
    r2 = sends(nodes[2].tick(now), VoteRequest)
    assert nodes[1].vote_id == nodes[2].vote_id == 1
    replies = []
    for req, voter in ((r1, 3), (r2, 4), (r1, 4), (r2, 3), (r1, 2), (r2, 1)):
        msg = next(s.msg for s in req if s.to == voter)
        replies += [(s.to, s.msg) for s in sends(nodes[voter].on_message(msg, now), VoteReply)]
    for to, msg in replies:
        nodes[to].on_message(msg, now)
    assert not any(n.is_leader for n in nodes.values())
    assert nodes[3].voted_for == 1 and nodes[4].voted_for == 2
    # New elections with random timeouts settle it.
    net = Net(4, pre_vote=False)
    net.nodes = nodes
    net.now = now
    net.run(now + 10 * T)
    assert len(net.leader_ids()) == 1
    assert net.nodes[net.leader_ids()[0]].vote_id >= 2


# ------------------------------------------------------------------ votes


def test_grants_one_vote_per_vote_id():
    e = make(3, [1, 2, 3], pre_vote=False)
    a = e.on_message(VoteRequest(5, 1, 0, 0), 0.0)
    assert PersistVote(5, None) in a and PersistVote(5, 1) in a
    assert sends(a, VoteReply)[0].msg == VoteReply(5, 3, True)
    assert e.vote_id == 5 and e.voted_for == 1
    b = e.on_message(VoteRequest(5, 2, 9, 9), 0.0)
    assert sends(b, VoteReply)[0].msg == VoteReply(5, 3, False)
    # a repeated request from the same candidate is granted again
    c = e.on_message(VoteRequest(5, 1, 0, 0), 0.0)
    assert sends(c, VoteReply)[0].msg.granted
    assert e.durable == (5, 1)


def test_vote_survives_restart():
    e = make(3, [1, 2, 3])
    e.on_message(VoteRequest(5, 1, 0, 0), 0.0)
    vote_id, voted_for = e.durable
    again = make(3, [1, 2, 3], vote_id=vote_id, voted_for=voted_for)
    reply = sends(again.on_message(VoteRequest(5, 2, 0, 0), 0.0), VoteReply)[0].msg
    assert not reply.granted


def test_persist_comes_before_the_reply():
    e = make(3, [1, 2, 3])
    a = e.on_message(VoteRequest(2, 1, 0, 0), 0.0)
    kinds = [type(x) for x in a]
    assert kinds.index(PersistVote) < kinds.index(Send)


def test_stale_vote_request_rejected():
    e = make(3, [1, 2, 3], vote_id=7)
    reply = sends(e.on_message(VoteRequest(6, 1, 100, 100), 0.0), VoteReply)[0].msg
    assert reply == VoteReply(7, 3, False)
    assert e.vote_id == 7 and e.voted_for is None


def test_candidate_with_older_log_cannot_win():
    behind = ChangeLog(100)
    behind.append(1, [{}] * 3)
    ahead_term = ChangeLog(100)
    ahead_term.append(1, [{}] * 2)
    ahead_term.append(2, [{}])
    ahead_len = ChangeLog(100)
    ahead_len.append(1, [{}] * 5)
    for voter_log in (ahead_term, ahead_len):
        voter = make(2, [1, 2, 3], log=voter_log)
        for pre in (True, False):
            req = VoteRequest(3, 1, behind.last_trans_id, behind.last_vote_id, pre_vote=pre)
            assert not sends(voter.on_message(req, 0.0), VoteReply)[0].msg.granted
    # a higher last vote_id wins over a longer log
    voter = make(2, [1, 2, 3], log=ahead_len)
    req = VoteRequest(3, 1, ahead_term.last_trans_id, ahead_term.last_vote_id)
    assert sends(voter.on_message(req, 0.0), VoteReply)[0].msg.granted


def test_cluster_elects_a_node_with_the_newest_log():
    logs = {i: ChangeLog(100) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        logs[i].append(1, [{}] * 3)
    for i in (2, 3):
        logs[i].append(1, [{}] * 2)  # node 1 is behind: it can get no vote but its own
    for seed in range(10):
        net = Net(3, seed=seed, logs={i: _copy(l) for i, l in logs.items()})
        net.nodes[1]._deadline = 0.5  # node 1 campaigns first, and again and again
        net.run(10 * T)
        assert len(net.leader_ids()) == 1 and net.leader_ids() != [1]
        assert 1 not in net.leaders.values()


def _copy(log):
    new = ChangeLog(100)
    new.accept(0, 0, log.entries_after(0, 100))
    return new


def test_candidate_needs_majority_of_whole_cluster():
    e = make(1, [1, 2, 3, 4, 5], pre_vote=False)
    e.tick(10.0)
    assert e.role is Role.CANDIDATE
    e.on_message(VoteReply(1, 2, True), 10.0)
    assert not e.is_leader  # 2 of 5
    e.on_message(VoteReply(1, 2, True), 10.0)  # a duplicate does not count twice
    assert not e.is_leader
    e.on_message(VoteReply(1, 3, False), 10.0)
    assert not e.is_leader
    a = e.on_message(VoteReply(1, 4, True), 10.0)
    assert e.is_leader and BecomeLeader(1) in a
    assert len(sends(a, Heartbeat)) == 4


def test_pre_vote_then_real_vote():
    e = make(1, [1, 2, 3])
    e.tick(10.0)
    assert e.role is Role.PRE_CANDIDATE and e.vote_id == 0
    a = e.on_message(VoteReply(1, 2, True, pre_vote=True), 10.0)
    assert e.role is Role.CANDIDATE and e.vote_id == 1 and e.voted_for == 1
    reqs = sends(a, VoteRequest)
    assert reqs and all(not s.msg.pre_vote and s.msg.vote_id == 1 for s in reqs)
    e.on_message(VoteReply(1, 3, True), 10.0)
    assert e.is_leader


def test_pre_vote_does_not_change_the_voter():
    e = make(3, [1, 2, 3])
    a = e.on_message(VoteRequest(4, 1, 0, 0, pre_vote=True), 0.0)
    assert sends(a, VoteReply)[0].msg == VoteReply(4, 3, True, True)
    assert not of(a, PersistVote)
    assert e.vote_id == 0 and e.voted_for is None


def test_rejected_pre_vote_with_higher_term_makes_follower():
    e = make(1, [1, 2, 3])
    e.tick(10.0)
    e.on_message(VoteReply(6, 2, False, pre_vote=True), 10.0)
    assert e.role is Role.FOLLOWER and e.vote_id == 6


def test_follower_in_lease_ignores_vote_requests():
    e = make(3, [1, 2, 3])
    e.on_message(Heartbeat(2, 1, 0, 0, 0, 0), 0.0)
    assert e.leader_id == 1
    for pre in (True, False):
        reply = sends(e.on_message(VoteRequest(3, 2, 50, 50, pre_vote=pre), 0.5), VoteReply)[0].msg
        assert not reply.granted
    assert e.vote_id == 2 and e.leader_id == 1  # not deposed
    # once the leader has been silent for an election timeout, the vote is granted
    reply = sends(e.on_message(VoteRequest(3, 2, 50, 50), 0.5 + T), VoteReply)[0].msg
    assert reply.granted and e.vote_id == 3 and e.voted_for == 2


# ------------------------------------------------------------------ terms and leaders


def test_higher_vote_id_in_any_message_makes_follower():
    net = Net(3)
    net.run(3 * T)
    (leader,) = net.leader_ids()
    e = net.nodes[leader]
    old = e.vote_id
    follower = next(i for i in net.members if i != leader)
    a = e.on_message(AppendAck(old + 3, follower, 0), net.now)
    assert not e.is_leader and e.vote_id == old + 3 and e.voted_for is None
    assert BecomeFollower(old + 3, None) in a and PersistVote(old + 3, None) in a


def test_heartbeat_makes_follower_and_is_acked():
    e = make(3, [1, 2, 3])
    e.tick(10.0)  # pre-candidate
    log = ChangeLog(10)
    a = e.on_message(Heartbeat(4, 1, 0, 0, 0, 0), 10.0)
    assert e.role is Role.FOLLOWER and e.leader_id == 1 and e.vote_id == 4
    assert BecomeFollower(4, 1) in a
    assert sends(a, HeartbeatAck)[0].msg == HeartbeatAck(4, 3, log.last_trans_id, log.last_vote_id)


def test_append_from_leader_resets_the_election_timer():
    e = make(3, [1, 2, 3])
    t = 0.0
    while t < 20 * T:
        t += 0.5 * T
        e.on_message(AppendEntries(1, 1, 0, 0, (), 0), t)
        assert not e.tick(t + 0.01)
    assert e.leader_id == 1 and e.role is Role.FOLLOWER


def test_stale_heartbeat_gets_the_current_term_back():
    e = make(3, [1, 2, 3], vote_id=5)
    a = e.on_message(Heartbeat(4, 1, 0, 0, 0, 0), 0.0)
    assert sends(a, HeartbeatAck)[0].msg.vote_id == 5
    assert e.leader_id is None and e.vote_id == 5
    a = e.on_message(AppendEntries(4, 1, 0, 0, (), 0), 0.0)
    assert sends(a, HeartbeatAck)[0].msg.vote_id == 5


def test_leader_sends_heartbeats_every_interval():
    e = make(1, [1, 2, 3], pre_vote=False)
    e.tick(5.0)
    e.on_message(VoteReply(1, 2, True), 5.0)
    assert e.is_leader
    count = 0
    t = 5.0
    while t < 6.0:
        t = round(t + 0.01, 6)
        e.on_message(HeartbeatAck(1, 2, 0, 0), t)
        count += len(sends(e.tick(t), Heartbeat))
    assert 18 <= count <= 22  # ~10 rounds to 2 peers


def test_leader_steps_down_without_majority():
    e = make(1, [1, 2, 3, 4, 5], pre_vote=False)
    e.tick(5.0)
    for voter in (2, 3):
        e.on_message(VoteReply(1, voter, True), 5.0)
    assert e.is_leader
    t = 5.0
    while e.is_leader:
        t = round(t + 0.01, 6)
        e.on_message(HeartbeatAck(1, 2, 0, 0), t)  # only one follower answers: 2 of 5
        actions = e.tick(t)
    assert BecomeFollower(1, None) in actions
    assert T <= t - 5.0 <= T + 0.02
    assert e.leader_id is None and e.vote_id == 1


def test_leader_with_majority_stays():
    e = make(1, [1, 2, 3], pre_vote=False)
    e.tick(5.0)
    e.on_message(VoteReply(1, 2, True), 5.0)
    t = 5.0
    while t < 15.0:
        t = round(t + 0.05, 6)
        e.on_message(HeartbeatAck(1, 2, 0, 0), t)
        e.tick(t)
        assert e.is_leader


def test_a_leader_with_a_follower_down_is_woken_by_its_heartbeats_not_at_once():
    # wake_at once took the oldest answer: with one follower of three down, it stayed an
    # election timeout after that follower's last answer, in the past, and the coordinator's loop
    # woke at once, over and over, for as long as the follower was down (a core at 100 %).
    e = make(1, [1, 2, 3], pre_vote=False)
    e.tick(5.0)
    e.on_message(VoteReply(1, 2, True), 5.0)
    t = 5.0
    while t < 5.0 + 3 * T:
        t = round(t + HB, 6)
        e.on_message(HeartbeatAck(1, 2, 0, 0), t)  # node 3 never answers
        e.tick(t)
        assert e.is_leader and e.wake_at > t, (t, e.wake_at)
    # Five nodes, two followers answering (a majority with this one), two down: the same.
    e = make(1, [1, 2, 3, 4, 5], pre_vote=False)
    e.tick(5.0)
    for voter in (2, 3):
        e.on_message(VoteReply(1, voter, True), 5.0)
    t = 5.0
    while t < 5.0 + 3 * T:
        t = round(t + HB, 6)
        e.on_message(HeartbeatAck(1, 2, 0, 0), t)
        e.on_message(HeartbeatAck(1, 3, 0, 0), t - HB / 2)
        e.tick(t)
        assert e.is_leader and e.wake_at > t, (t, e.wake_at)
    assert e.wake_at <= t - HB / 2 + T  # still woken to step down once node 3 goes silent too


def test_partitioned_leader_steps_down_and_returns_as_follower():
    net = Net(3)
    net.run(3 * T)
    (old,) = net.leader_ids()
    old_vote = net.nodes[old].vote_id
    net.isolate(old)
    net.run(net.now + 5 * T)
    assert not net.nodes[old].is_leader  # check quorum
    (new,) = [i for i in net.leader_ids() if i != old]
    assert net.nodes[new].vote_id > old_vote
    assert net.nodes[old].vote_id == old_vote  # pre-vote: no term inflation while cut off
    net.heal()
    net.run(net.now + 3 * T)
    assert net.leader_ids() == [new]
    assert net.nodes[old].leader_id == new and net.nodes[old].vote_id == net.nodes[new].vote_id


def test_returning_old_leader_that_still_thinks_it_leads():
    # check_quorum off: the old leader keeps believing, until it hears the new term.
    net = Net(3, check_quorum=False)
    net.run(3 * T)
    (old,) = net.leader_ids()
    net.isolate(old)
    net.run(net.now + 5 * T)
    assert net.nodes[old].is_leader
    (new,) = [i for i in net.leader_ids() if i != old]
    net.heal()
    net.run(net.now + 1 * T)
    assert net.leader_ids() == [new]
    assert net.nodes[old].role is Role.FOLLOWER and net.nodes[old].leader_id == new


def test_isolated_follower_does_not_disrupt_on_return():
    net = Net(3)
    net.run(3 * T)
    (leader,) = net.leader_ids()
    vote_id = net.nodes[leader].vote_id
    lone = next(i for i in net.members if i != leader)
    net.isolate(lone)
    net.run(net.now + 10 * T)
    assert net.nodes[lone].vote_id == vote_id  # it tried pre-votes only
    net.heal()
    net.run(net.now + 3 * T)
    assert net.leader_ids() == [leader] and net.nodes[leader].vote_id == vote_id
    assert net.nodes[lone].leader_id == leader


def test_minority_cannot_elect():
    net = Net(5)
    net.run(3 * T)
    (leader,) = net.leader_ids()
    minority = [leader, next(i for i in net.members if i != leader)]
    for i in minority:
        for j in net.members:
            if j not in minority:
                net.cut |= {(i, j), (j, i)}
    net.run(net.now + 10 * T)
    assert not any(net.nodes[i].is_leader for i in minority)
    assert len([i for i in net.leader_ids() if i not in minority]) == 1


def test_crashed_leader_is_replaced():
    net = Net(5)
    net.run(3 * T)
    (leader,) = net.leader_ids()
    net.down.add(leader)
    net.run(net.now + 5 * T)
    assert len(net.leader_ids()) == 1 and net.leader_ids()[0] != leader


def test_messages_from_outside_the_cluster_are_ignored():
    e = make(3, [1, 2, 3])
    assert e.on_message(VoteRequest(5, 9, 100, 100), 0.0) == []
    assert e.on_message(Heartbeat(5, 9, 0, 0, 0, 0), 0.0) == []
    assert e.vote_id == 0


def test_wake_at_says_when_to_tick():
    e = make(1, [1, 2, 3], pre_vote=False)
    t = e.wake_at
    assert T <= t < 2 * T
    assert e.tick(t - 0.001) == []
    assert of(e.tick(t), BecomeCandidate)
    e.on_message(VoteReply(1, 2, True), t)
    assert e.is_leader and e.wake_at == pytest.approx(t + HB)


def test_become_candidate_action():
    e = make(1, [1, 2, 3], pre_vote=False)
    a = e.tick(10.0)
    assert BecomeCandidate(1, False) in a and e.leader_id is None


# ------------------------------------------------------------------ leadership transfer


def _log_with(n, term=1, committed=None):
    log = ChangeLog(100)
    if n:
        log.append(term, [{}] * n)
    log.commit_to(n if committed is None else committed)
    return log


def _leader_of_three(log=None, now=0.0):
    """Node 1 leading term 1 of [1, 2, 3], both followers acked at `now`."""
    e = make(1, [1, 2, 3], log=log, pre_vote=False)
    e.tick(now + 2 * T)
    e.on_message(VoteReply(1, 2, True), now + 2 * T)
    assert e.is_leader
    for peer in (2, 3):
        e.on_message(HeartbeatAck(1, peer, 0, 0), now + 2 * T)
    return e, now + 2 * T


def test_transfer_waits_for_the_target_to_match_then_sends_timeout_now():
    e, t = _leader_of_three(_log_with(10))
    assert e.transfer_leadership(t, 5.0, {2: 7, 3: 4}) == []  # the target is behind: wait
    assert e.transfer_target == 2  # the live follower whose log reaches furthest
    assert e.on_progress(t + 0.01, {2: 9, 3: 4}) == []
    a = e.on_progress(t + 0.02, {2: 10, 3: 4})
    assert a == [Send(2, TimeoutNow(1, 1))]
    assert e.on_progress(t + 0.03, {2: 10, 3: 10}) == []  # sent once
    assert e.is_leader  # until the target's election deposes it


def test_transfer_waits_for_everything_to_be_committed():
    e, t = _leader_of_three(_log_with(10, committed=8))
    assert e.transfer_leadership(t, 5.0, {2: 10, 3: 10}) == []
    e.log.commit_to(10)
    assert e.on_progress(t + 0.01, {2: 10, 3: 10}) == [Send(2, TimeoutNow(1, 1))]


def test_an_unsettled_transfer_waits_for_on_progress():
    """settled=False: writes may still be on their way into the log (the coordinator's fence):
    no TimeoutNow yet, even to a follower that matches the log as it stands."""
    e, t = _leader_of_three(_log_with(10))
    assert e.transfer_leadership(t, 5.0, {2: 10, 3: 10}, settled=False) == []
    assert e.transfer_target == 2
    assert e.on_progress(t + 0.01, {2: 10, 3: 10}) == [Send(2, TimeoutNow(1, 1))]


def test_transfer_to_a_chosen_target_and_not_to_strangers():
    e, t = _leader_of_three()
    assert e.transfer_leadership(t, 5.0, {}, target=3) == [Send(3, TimeoutNow(1, 1))]
    other, t = _leader_of_three()
    with pytest.raises(ValueError):
        other.transfer_leadership(t, 1.0, {}, target=9)


def test_no_transfer_without_a_live_follower_or_when_not_leading():
    e, t = _leader_of_three()  # neither follower answers for an election timeout
    assert e.transfer_leadership(t + T, 5.0, {}) == [] and e.transfer_target is None
    follower = make(2, [1, 2, 3])
    assert follower.transfer_leadership(0.0, 5.0, {}) == [] and follower.transfer_target is None


def test_a_transfer_whose_target_stops_answering_moves_to_a_live_follower():
    """The target stopped (say the whole cluster is being stopped, one node after another):
    once it has not answered for an election timeout, the follower still answering becomes the
    target, within the same deadline; told to campaign, it gets the same time."""
    e, t = _leader_of_three(_log_with(10))
    e.transfer_leadership(t, 5.0, {2: 9, 3: 8}, settled=False)
    assert e.transfer_target == 2
    e.on_message(HeartbeatAck(1, 3, 10, 1), t + T / 2)  # node 2 says nothing from now on
    e.retarget_transfer(t + T / 2, {2: 9, 3: 10})
    assert e.transfer_target == 2  # not silent for an election timeout yet
    e.retarget_transfer(t + T, {2: 9, 3: 10})
    assert e.transfer_target == 3
    assert e.on_progress(t + T, {2: 9, 3: 10}) == [Send(3, TimeoutNow(1, 1))]
    e.retarget_transfer(t + T, {2: 10, 3: 10})
    assert e.on_progress(t + T, {2: 10, 3: 10}) == []  # told once
    e.on_message(HeartbeatAck(1, 2, 10, 1), t + 1.4 * T)  # node 2 is back; node 3 never campaigned
    e.retarget_transfer(t + 1.4 * T, {2: 10, 3: 10})
    assert e.transfer_target == 3  # not silent for an election timeout yet (last heard at t + T / 2)
    e.retarget_transfer(t + 2 * T, {2: 10, 3: 10})
    assert e.transfer_target == 2 and e.on_progress(t + 2 * T, {2: 10, 3: 10}) == [Send(2, TimeoutNow(1, 1))]


def test_a_transfer_keeps_its_target_when_no_other_follower_answers():
    e, t = _leader_of_three(_log_with(10))
    e.transfer_leadership(t, 5.0, {2: 10, 3: 10}, settled=False)
    e.retarget_transfer(t + T, {2: 10, 3: 10})
    assert e.transfer_target == 2


def test_transfer_aborts_at_its_deadline_and_the_node_leads_on():
    e, t = _leader_of_three(_log_with(10))
    e.transfer_leadership(t, 0.5, {2: 3, 3: 3})
    assert e.wake_at <= t + 0.5
    for peer in (2, 3):  # keep the quorum alive
        e.on_message(HeartbeatAck(1, peer, 10, 1), t + 0.4)
    a = e.tick(t + 0.5)
    assert TransferAborted(2) in a and e.is_leader and e.transfer_target is None
    assert e.on_progress(t + 0.6, {2: 10, 3: 10}) == []  # no late TimeoutNow


def test_timeout_now_starts_an_election_at_once_without_pre_vote():
    f = make(2, [1, 2, 3])  # pre-vote on
    f.on_message(Heartbeat(1, 1, 0, 0, 0, 0), 0.0)
    a = f.on_message(TimeoutNow(1, 1), 0.01)
    assert f.role is Role.CANDIDATE and f.vote_id == 2
    reqs = sends(a, VoteRequest)
    assert {r.to for r in reqs} == {1, 3}
    assert all(r.msg.transfer and not r.msg.pre_vote for r in reqs)


def test_timeout_now_of_an_old_term_is_ignored():
    f = make(2, [1, 2, 3])
    f.on_message(Heartbeat(3, 1, 0, 0, 0, 0), 0.0)
    assert f.on_message(TimeoutNow(2, 1), 0.01) == [] and f.role is Role.FOLLOWER


def test_transfer_vote_is_granted_within_the_leaders_lease():
    voter = make(3, [1, 2, 3])
    voter.on_message(Heartbeat(1, 1, 0, 0, 0, 0), 0.0)
    plain = sends(voter.on_message(VoteRequest(2, 2, 0, 0), 0.1), VoteReply)[0].msg
    assert not plain.granted  # the lease holds against an ordinary candidate
    granted = sends(voter.on_message(VoteRequest(2, 2, 0, 0, transfer=True), 0.1), VoteReply)[0].msg
    assert granted.granted and voter.voted_for == 2
    # and the old leader itself steps down for it
    e, t = _leader_of_three()
    reply = sends(e.on_message(VoteRequest(2, 2, 0, 0, transfer=True), t + 0.01), VoteReply)[0].msg
    assert reply.granted and not e.is_leader and e.transfer_target is None


def test_transfer_vote_still_needs_an_up_to_date_log():
    voter = make(3, [1, 2, 3], log=_log_with(5))
    reply = sends(voter.on_message(VoteRequest(2, 2, 3, 1, transfer=True), 0.1), VoteReply)[0].msg
    assert not reply.granted


@pytest.mark.parametrize("seed", range(20))
def test_transfer_in_a_cluster_elects_the_target_within_a_heartbeat(seed):
    net = Net(3, seed=seed)
    net.run(3 * T)
    (old,) = net.leader_ids()
    target = max(p for p in net.members if p != old)
    start = net.now
    queue = deque()
    net._handle(old, net.nodes[old].transfer_leadership(start, 2 * T, {}, target=target), queue)
    while queue:
        dst, msg = queue.popleft()
        net._handle(dst, net.nodes[dst].on_message(msg, start), queue)
    net.run(start + HB)
    assert net.leader_ids() == [target]
    assert all(n.leader_id == target for n in net.nodes.values())
