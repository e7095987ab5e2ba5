"""Unit tests for replication/progress.py (leader side) and replication/follower.py."""

from collections import deque

import pytest

from queue_server.election.messages import Heartbeat, HeartbeatAck, Send
from queue_server.replication import wire
from queue_server.replication.follower import Follower
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import (
    AppendAck,
    AppendEntries,
    ApplySnapshot,
    Commit,
    Discarded,
    InstallSnapshot,
    Pull,
    ReadLog,
    SendSnapshot,
    SnapshotChunk,
)
from queue_server.replication.progress import Flow, FollowerState, LeaderReplication, TokenBucket
from queue_server.replication.transfer import SnapshotSource
from queue_server.protocol.records import DeleteQueue, encode


def recs(n, tag="r"):
    return [DeleteQueue(queue=f"{tag}{i}") for i in range(n)]


def entries(first, vote_id, n, tag="e"):
    return tuple(Entry(first + i, vote_id, DeleteQueue(queue=f"{tag}{first + i}")) for i in range(n))


def sent(actions, cls=None):
    return [a.msg for a in actions if isinstance(a, Send) and (cls is None or isinstance(a.msg, cls))]


def of(actions, cls):
    return [a for a in actions if isinstance(a, cls)]


# ================================================================== follower


def test_push_that_continues_the_log_is_accepted():
    log = ChangeLog(100)
    f = Follower(2, log)
    a = f.on_append(AppendEntries(1, 1, 0, 0, entries(1, 1, 3), 2), 0.0)
    assert log.last_trans_id == 3
    assert sent(a) == [AppendAck(1, 2, 3)]
    assert of(a, Commit) == [Commit(2, entries(1, 1, 2))]
    assert log.commit_trans_id == 2


def test_commit_never_passes_what_was_matched():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 5, tag="old"))  # 4..5 may not be the leader's
    f = Follower(2, log)
    a = f.on_append(AppendEntries(2, 1, 0, 0, entries(1, 1, 3, tag="old"), 10), 0.0)
    assert log.commit_trans_id == 3
    assert sent(a) == [AppendAck(2, 2, 3)]


@pytest.mark.parametrize("prev", [(5, 1), (3, 2)])
def test_push_that_does_not_continue_is_ignored_and_pulls(prev):
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 3))
    log.commit_to(1)
    f = Follower(2, log)
    a = f.on_append(AppendEntries(2, 1, prev[0], prev[1], entries(prev[0] + 1, 2, 1), 0), 0.0)
    assert log.last_trans_id == 3
    assert sent(a) == [Pull(2, 2, 3, 1, 1)]
    assert not of(a, Commit)


def test_pulls_are_throttled_per_position():
    log = ChangeLog(100)
    f = Follower(2, log, pull_interval=0.1)
    gap = AppendEntries(1, 1, 5, 1, entries(6, 1, 1), 0)
    assert sent(f.on_append(gap, 0.0), Pull)
    assert not sent(f.on_append(gap, 0.05), Pull)
    assert sent(f.on_append(gap, 0.11), Pull)
    f.on_append(AppendEntries(1, 1, 0, 0, entries(1, 1, 1), 0), 0.12)
    assert sent(f.on_append(gap, 0.13), Pull)  # a new position pulls at once


def test_conflicting_suffix_is_discarded_not_replayed():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 2))
    log.accept(2, 1, entries(3, 2, 3, tag="deposed"))
    log.commit_to(2)
    f = Follower(2, log)
    new = entries(3, 3, 2, tag="new")
    a = f.on_append(AppendEntries(3, 1, 2, 1, new, 4), 0.0)
    (d,) = of(a, Discarded)
    assert [e.trans_id for e in d.entries] == [3, 4, 5]
    assert all(e.record.queue.startswith("deposed") for e in d.entries)
    assert [log.entry_at(t).record.queue for t in (3, 4)] == ["new3", "new4"]
    assert log.last_trans_id == 4 and log.last_vote_id == 3
    assert of(a, Commit) == [Commit(4, new)]
    assert sent(a) == [AppendAck(3, 2, 4)]


def test_malformed_push_is_ignored():
    log = ChangeLog(100)
    f = Follower(2, log)
    assert f.on_append(AppendEntries(1, 1, 0, 0, (Entry(2, 1, {}),), 0), 0.0) == []
    assert f.on_append(AppendEntries(1, 1, 0, 0, (Entry(1, 2, {}), Entry(2, 1, {})), 0), 0.0) == []
    assert log.last_trans_id == 0


def test_duplicate_push_is_harmless():
    log = ChangeLog(100)
    f = Follower(2, log)
    push = AppendEntries(1, 1, 0, 0, entries(1, 1, 3), 0)
    f.on_append(push, 0.0)
    f.on_append(AppendEntries(1, 1, 3, 1, entries(4, 1, 2), 0), 0.0)
    a = f.on_append(push, 0.0)  # an old push arrives late
    assert log.last_trans_id == 5 and not of(a, Discarded)
    assert sent(a) == [AppendAck(1, 2, 3)]


def test_heartbeat_commits_only_a_matching_entry():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 4))
    f = Follower(2, log)
    a = f.on_heartbeat(Heartbeat(1, 1, 3, 1, 4, 1), 0.0)
    assert log.commit_trans_id == 3 and of(a, Commit)[0].trans_id == 3
    assert not sent(a)
    f2 = Follower(2, log)
    a = f2.on_heartbeat(Heartbeat(2, 1, 4, 2, 4, 2), 0.0)  # our entry 4 is from another term
    assert log.commit_trans_id == 3
    assert sent(a) == [Pull(2, 2, 4, 1, 3)]


def test_heartbeat_pulls_when_committed_entries_are_missing():
    log = ChangeLog(100)
    f = Follower(2, log)
    assert sent(f.on_heartbeat(Heartbeat(1, 1, 5, 1, 5, 1), 0.0)) == [Pull(1, 2, 0, 0, 0)]


def test_heartbeat_pulls_only_when_pushes_stall():
    log = ChangeLog(100)
    f = Follower(2, log, pull_interval=0.01)
    assert not sent(f.on_heartbeat(Heartbeat(1, 1, 0, 0, 3, 1), 0.0))  # pushes may be on the way
    f.on_append(AppendEntries(1, 1, 0, 0, entries(1, 1, 1), 0), 0.05)
    assert not sent(f.on_heartbeat(Heartbeat(1, 1, 0, 0, 6, 1), 0.1))  # progress was made
    assert sent(f.on_heartbeat(Heartbeat(1, 1, 0, 0, 6, 1), 0.2)) == [Pull(1, 2, 1, 1, 0)]  # stalled


def test_heartbeat_does_not_pull_when_holding_the_leaders_last_entry():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 3))
    f = Follower(2, log, pull_interval=0.01)
    for t in (0.0, 0.1, 0.2):
        assert not sent(f.on_heartbeat(Heartbeat(2, 1, 0, 0, 3, 1), t))


def test_rejected_push_pulls_from_where_the_logs_may_agree():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 2))
    log.accept(2, 1, entries(3, 2, 2))
    log.accept(4, 2, entries(5, 4, 3))  # terms: 1 1 2 2 4 4 4
    log.commit_to(1)
    f = Follower(2, log)
    # the leader's entry 6 has term 3: our entries of term 4 cannot be its; our 4 (term 2) may be
    assert sent(f.on_append(AppendEntries(5, 1, 6, 3, (), 0), 0.0)) == [Pull(5, 2, 4, 2, 1)]
    # never before the commit point
    assert sent(f.on_append(AppendEntries(5, 1, 3, 0, (), 0), 0.0)) == [Pull(5, 2, 1, 1, 1)]


def test_snapshot_install_and_stale_snapshot():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 3))
    log.commit_to(2)
    f = Follower(2, log)
    a = f.on_snapshot(InstallSnapshot(4, 1, 50, 3, "state"), 0.0)
    assert of(a, ApplySnapshot) == [ApplySnapshot(50, 3, "state")]
    assert (log.last_trans_id, log.last_vote_id, log.commit_trans_id) == (50, 3, 50)
    assert sent(a) == [AppendAck(4, 2, 50)]
    a = f.on_snapshot(InstallSnapshot(4, 1, 40, 3, "older"), 0.0)
    assert not of(a, ApplySnapshot) and sent(a) == [AppendAck(4, 2, 50)]


def test_snapshot_of_entries_already_held_only_commits():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 5))
    f = Follower(2, log)
    a = f.on_snapshot(InstallSnapshot(1, 1, 4, 1, "state"), 0.0)
    assert not of(a, ApplySnapshot)
    assert of(a, Commit)[0].trans_id == 4 and log.last_trans_id == 5


# ================================================================== leader


class Pair:
    """A leader and followers with instant, optionally lossy, delivery."""

    def __init__(self, n=3, leader_log=None, follower_logs=None, vote_id=1, now=0.0, **kw):
        self.members = list(range(1, n + 1))
        self.log = leader_log or ChangeLog(1000)
        self.flogs = follower_logs or {i: ChangeLog(1000) for i in self.members[1:]}
        self.followers = {i: Follower(i, self.flogs[i], pull_interval=0.0) for i in self.members[1:]}
        self.vote_id = vote_id
        self.leader = LeaderReplication(1, self.members, self.log, vote_id, now, Flow(**kw))
        self.commits: list[Commit] = []
        self.snapshots: list[int] = []
        self.drop = lambda msg: False
        self.blocked: set[int] = set()
        self.batches: list[tuple[float, int, int]] = []  # (time, to, entries)

    def deliver(self, actions, now):
        queue = deque(actions)
        while queue:
            a = queue.popleft()
            if isinstance(a, Commit):
                self.commits.append(a)
            elif isinstance(a, SendSnapshot):
                self.snapshots.append(a.to)
            elif isinstance(a, Send):
                msg = wire.decode(wire.encode(a.msg)).msg
                assert msg == a.msg
                if self.drop(msg) or a.to in self.blocked:
                    continue
                if a.to == 1:
                    queue.extend(self.leader.on_message(msg, now))
                else:
                    if isinstance(msg, AppendEntries):
                        self.batches.append((now, a.to, len(msg.entries)))
                    queue.extend(self.followers[a.to].on_message(msg, now))

    def write(self, n, now=0.0):
        self.log.append(self.vote_id, recs(n))
        self.deliver(self.leader.replicate(now), now)

    def heartbeat(self, now):
        commit = self.log.commit_trans_id
        hb = Heartbeat(self.vote_id, 1, commit, self.log.term_at(commit), self.log.last_trans_id,
                       self.log.last_vote_id)
        actions = []
        for i, f in self.followers.items():
            actions += f.on_heartbeat(hb, now)
            actions.append(Send(1, HeartbeatAck(self.vote_id, i, f.log.last_trans_id, f.log.last_vote_id)))
        self.deliver(actions, now)

    def tick(self, now):
        self.deliver(self.leader.tick(now), now)


def test_single_node_commits_at_once():
    log = ChangeLog(100)
    leader = LeaderReplication(1, [1], log, 1, 0.0)
    log.append(1, recs(3))
    a = leader.replicate(0.0)
    assert a == [Commit(3, tuple(log.entries_after(0, 3)))]
    assert log.commit_trans_id == 3


def test_probe_then_pipelined_pushes():
    p = Pair(max_inflight=2)
    p.write(1)  # the first write probes, then both followers replicate
    assert all(pr.state is FollowerState.REPLICATE for pr in p.leader.progress.values())
    assert p.log.commit_trans_id == 1
    # with acks held back, at most max_inflight pushes go out per follower
    held = []
    p.drop = lambda m: isinstance(m, AppendAck) and not held.append(m)
    for _ in range(5):
        p.write(1)
    assert all(len(pr.inflight) == 2 for pr in p.leader.progress.values())
    assert all(f.log.last_trans_id == 3 for f in p.followers.values())
    p.drop = lambda m: False
    p.deliver([Send(1, m) for m in held], 0.0)
    assert all(f.log.last_trans_id == 6 for f in p.followers.values())
    assert p.log.commit_trans_id == 6


def test_followers_at_the_same_place_get_one_batch_object():
    """The coordinator encodes a message once for every follower it goes to: followers at the
    same place are given the same AppendEntries; a batch of another place, size or commit
    point is one of its own."""
    log = ChangeLog(100)
    leader = LeaderReplication(1, [1, 2, 3], log, 1, 0.0)
    log.append(1, recs(2))
    leader.replicate(0.0)
    for peer in (2, 3):
        leader.on_message(AppendAck(1, peer, 2), 0.0)
    log.append(1, recs(1))
    pushes = {a.to: a.msg for a in leader.replicate(0.0) if isinstance(a, Send)}
    assert pushes[2] is pushes[3] and pushes[2] == AppendEntries(1, 1, 2, 1, tuple(log.entries_after(2, 1)), 2)
    log.append(1, recs(1))
    (longer,) = sent(leader.on_message(Pull(1, 3, 2, 1, 2), 0.0))  # 3 asks again from 2
    assert longer == AppendEntries(1, 1, 2, 1, tuple(log.entries_after(2, 2)), 2)
    log.commit_to(3)
    (committed,) = sent(leader.on_message(Pull(1, 3, 2, 1, 2), 1.0))
    assert committed == AppendEntries(1, 1, 2, 1, tuple(log.entries_after(2, 2)), 3)
    (pushed,) = sent(leader.replicate(1.0))  # to 2, from 3
    assert pushed == AppendEntries(1, 1, 3, 1, tuple(log.entries_after(3, 1)), 3)


def test_a_batch_from_before_the_log_is_not_sent_again_but_a_snapshot():
    log = ChangeLog(3)
    log.append(1, recs(3))
    log.commit_to(3)
    leader = LeaderReplication(1, [1, 2, 3], log, 1, 0.0, Flow(max_batch=2))
    (batch,) = sent(leader.on_message(Pull(1, 3, 1, 1, 1), 0.0), AppendEntries)
    assert (batch.prev_trans_id, len(batch.entries)) == (1, 2)
    log.append(1, recs(2))  # 1 and 2 fall off: the base is 2
    assert of(leader.on_message(Pull(1, 3, 1, 1, 1), 1.0), SendSnapshot) == [SendSnapshot(3)]


def test_commit_needs_a_majority_including_the_leader():
    p = Pair(n=5, resend_interval=0.5)
    p.blocked = {3, 4, 5}
    p.write(2)
    assert p.leader.match_of(2) == 2
    assert p.log.commit_trans_id == 0  # leader + node 2 = 2 of 5
    p.blocked = {4, 5}
    p.tick(0.5)  # the unanswered probe to node 3 goes out again
    assert p.leader.match_of(3) == 2
    assert p.log.commit_trans_id == 2
    assert [c.trans_id for c in p.commits] == [2]


def test_commit_only_counts_entries_of_the_current_term():
    # Raft's figure 8: an entry from an older term on a majority is not committed by counting.
    log = ChangeLog(100)
    log.append(2, recs(2))
    flog = ChangeLog(100)
    flog.accept(0, 0, log.entries_after(0, 10))
    leader = LeaderReplication(1, [1, 2, 3], log, 4, 0.0)
    leader.on_message(AppendAck(4, 2, 2), 0.0)  # entries 1..2 of term 2 on 2 of 3 nodes
    assert log.commit_trans_id == 0
    log.append(4, recs(1))
    leader.replicate(0.0)
    a = leader.on_message(AppendAck(4, 2, 3), 0.0)
    assert log.commit_trans_id == 3
    assert of(a, Commit)[0].trans_id == 3 and len(of(a, Commit)[0].entries) == 3


def test_acks_of_another_term_are_ignored():
    p = Pair()
    p.write(1)
    assert p.leader.on_message(AppendAck(7, 2, 99), 0.0) == []
    assert p.leader.on_message(Pull(0, 2, 0, 0, 0), 0.0) == []


def test_lost_push_is_recovered_by_a_pull():
    p = Pair()
    p.write(1)
    p.blocked = {2}
    p.write(1)  # entry 2 never reaches node 2
    p.blocked = set()
    assert p.flogs[2].last_trans_id == 1 and p.flogs[3].last_trans_id == 2
    p.write(1)  # entry 3 does not continue node 2's log: it pulls from 1
    assert p.flogs[2].last_trans_id == 3
    assert p.leader.progress[2].state is FollowerState.REPLICATE


def test_lost_push_with_no_later_write_is_recovered_by_heartbeats():
    p = Pair()
    p.write(1)
    p.drop = lambda m: isinstance(m, AppendEntries)
    p.write(2)
    p.drop = lambda m: False
    p.heartbeat(0.1)
    p.heartbeat(0.2)
    assert all(f.log.last_trans_id == 3 for f in p.followers.values())
    p.heartbeat(0.3)
    assert all(f.log.commit_trans_id == 3 for f in p.followers.values())


def test_lost_acks_are_covered_by_heartbeat_acks():
    p = Pair()
    p.write(1)
    p.drop = lambda m: isinstance(m, AppendAck)
    p.write(4)
    assert p.log.commit_trans_id == 1
    p.drop = lambda m: False
    p.heartbeat(0.1)
    assert p.log.commit_trans_id == 5


def test_heartbeat_ack_matches_only_an_entry_of_ours():
    p = Pair(n=2)
    p.write(1)
    p.blocked = {2}
    p.write(3)
    p.blocked = set()
    assert p.leader.match_of(2) == 1
    p.deliver([Send(1, HeartbeatAck(1, 2, 3, 0))], 0.0)  # its entry 3 is not ours
    assert p.leader.match_of(2) == 1
    p.deliver([Send(1, HeartbeatAck(1, 2, 9, 1))], 0.0)  # past our log
    assert p.leader.match_of(2) == 1 and p.log.commit_trans_id == 1


def test_pull_from_a_diverged_position_does_not_count_as_match():
    leader_log = ChangeLog(100)
    leader_log.append(1, recs(2))
    leader_log.append(3, recs(3))
    leader = LeaderReplication(1, [1, 2, 3], leader_log, 3, 0.0, Flow(sync_rate=0))
    a = leader.on_message(Pull(3, 2, 4, 2, 2), 0.0)  # its 3..4 are from term 2
    assert leader.match_of(2) == 2
    (push,) = sent(a, AppendEntries)
    assert (push.prev_trans_id, push.prev_vote_id) == (2, 1)
    assert [e.trans_id for e in push.entries] == [3, 4, 5]
    assert leader_log.commit_trans_id == 0


def test_follower_that_lost_its_log_tail_is_served_from_where_it_is():
    p = Pair(n=2)
    p.write(5)
    assert p.leader.match_of(2) == 5
    p.flogs[2].truncate_after(3)  # as if the last writes never reached its disk
    p.followers[2] = Follower(2, p.flogs[2])
    p.deliver(p.followers[2].pull(1, 1, 0.0), 0.0)
    assert p.flogs[2].last_trans_id == 5
    assert p.leader.match_of(2) == 5


def test_diverged_follower_is_probed_near_the_divergence():
    leader_log = ChangeLog(100)
    leader_log.append(1, recs(2))
    leader_log.append(2, recs(2))
    leader_log.append(3, recs(2))  # terms 1 1 2 2 3 3
    flog = ChangeLog(100)
    flog.accept(0, 0, leader_log.entries_after(0, 4))
    flog.accept(4, 2, entries(5, 2, 3, tag="deposed"))  # terms 1 1 2 2 2 2 2
    flog.commit_to(1)
    p = Pair(n=2, leader_log=leader_log, follower_logs={2: flog}, vote_id=3, sync_rate=0)
    p.deliver(p.followers[2].pull(1, 3, 0.0), 0.0)
    assert [flog.term_at(t) for t in range(1, 8)] == [1, 1, 2, 2, 3, 3, None]
    assert p.leader.match_of(2) == 6
    assert p.batches == [(0.0, 2, 2)]  # one batch from entry 5: nothing sent twice


def test_diverged_follower_is_repaired_from_its_commit_point():
    leader_log = ChangeLog(100)
    leader_log.append(1, recs(3))
    leader_log.commit_to(3)
    flog = ChangeLog(100)
    flog.accept(0, 0, leader_log.entries_after(0, 3))
    flog.commit_to(2)
    flog.accept(3, 1, entries(4, 2, 4, tag="deposed"))  # a deposed leader's records
    p = Pair(n=2, leader_log=leader_log, follower_logs={2: flog}, vote_id=3)
    p.write(2)  # 4..5 in term 3
    assert [flog.term_at(t) for t in range(1, 6)] == [1, 1, 1, 3, 3]
    assert flog.last_trans_id == 5
    assert p.log.commit_trans_id == 5


def test_pull_catch_up_in_batches_with_rate_limit():
    leader_log = ChangeLog(10_000)
    leader_log.append(1, recs(1000))
    p = Pair(n=2, leader_log=leader_log, vote_id=1, max_batch=50, sync_rate=200.0)
    # the follower has nothing; the heartbeat tells it it is missing committed entries
    leader_log.commit_to(0)
    p.deliver(p.followers[2].pull(1, 1, 0.0), 0.0)
    t = 0.0
    while p.flogs[2].last_trans_id < 1000 and t < 20:
        t = round(t + 0.01, 6)
        p.tick(t)
    assert p.flogs[2].last_trans_id == 1000
    assert all(n <= 50 for _, _, n in p.batches)
    # burst of max(rate, batch) = 200, then 200/s: 800 more take ~4 s
    assert 3.8 <= t <= 4.3
    for _, _, n in p.batches:
        assert n > 0
    sent_by = 0
    for when, _, n in p.batches:
        sent_by += n
        assert sent_by <= 200 + 200 * when + 1e-6
    assert p.leader.progress[2].state is FollowerState.REPLICATE


def test_unlimited_rate_catches_up_per_round_trip_in_batches():
    leader_log = ChangeLog(10_000)
    leader_log.append(1, recs(1000))
    p = Pair(n=2, leader_log=leader_log, max_batch=100, sync_rate=0)
    p.deliver(p.followers[2].pull(1, 1, 0.0), 0.0)
    assert p.flogs[2].last_trans_id == 1000
    assert len(p.batches) == 10


def test_live_pushes_are_not_rate_limited():
    p = Pair(max_batch=1000, sync_rate=1.0)
    p.write(1)
    for _ in range(20):
        p.write(50)
    assert all(f.log.last_trans_id == 1001 for f in p.followers.values())


def test_snapshot_needed_when_behind_the_window():
    leader_log = ChangeLog(10)
    leader_log.append(1, recs(50))
    leader_log.commit_to(50)
    assert leader_log.first_trans_id == 41
    p = Pair(n=2, leader_log=leader_log, snapshot_timeout=1.0)
    p.deliver(p.followers[2].pull(1, 1, 0.0), 0.0)
    assert p.snapshots == [2]
    assert p.leader.progress[2].state is FollowerState.SNAPSHOT
    # more pulls while the snapshot is on its way send nothing new
    p.deliver(p.followers[2].pull(1, 1, 0.5), 0.5)
    assert p.snapshots == [2] and p.batches == []
    # the follower installs a snapshot at 45 and acks: the rest follows as entries
    p.deliver(p.followers[2].on_snapshot(InstallSnapshot(1, 1, 45, 1, "state"), 0.6), 0.6)
    assert p.flogs[2].last_trans_id == 50
    assert p.leader.progress[2].state is FollowerState.REPLICATE
    assert p.leader.match_of(2) == 50


def test_snapshot_is_sent_again_after_timeout():
    leader_log = ChangeLog(10)
    leader_log.append(1, recs(50))
    leader_log.commit_to(50)
    p = Pair(n=2, leader_log=leader_log, snapshot_timeout=1.0)
    p.deliver(p.followers[2].pull(1, 1, 0.0), 0.0)
    p.tick(0.9)
    assert p.snapshots == [2]
    p.tick(1.0)
    assert p.snapshots == [2, 2]


def test_unanswered_catch_up_batch_is_sent_again():
    leader_log = ChangeLog(1000)
    leader_log.append(1, recs(10))
    p = Pair(n=2, leader_log=leader_log, max_batch=5, sync_rate=0, resend_interval=0.5)
    lost = [True]
    p.drop = lambda m: isinstance(m, AppendEntries) and lost and lost.pop()
    p.deliver(p.followers[2].pull(1, 1, 0.0), 0.0)
    assert p.flogs[2].last_trans_id == 0
    p.tick(0.4)
    assert p.flogs[2].last_trans_id == 0
    p.tick(0.5)
    assert p.flogs[2].last_trans_id == 10


def test_token_bucket():
    b = TokenBucket(100.0, 50.0, 0.0)
    assert b.available(0.0) == 50
    b.take(50)
    assert b.available(0.0) == 0
    assert b.available(0.1) == 10
    assert b.available(10.0) == 50
    assert TokenBucket(0, 1, 0.0).available(0.0) > 10**9


def test_wire_round_trip():
    msgs = [
        AppendEntries(3, 1, 4, 2, entries(5, 3, 2), 4),
        AppendAck(3, 2, 6),
        Pull(3, 2, 4, 2, 1),
        InstallSnapshot(3, 1, 10, 2, {"queues": []}),
        Heartbeat(3, 1, 4, 2, 6, 3),
        HeartbeatAck(3, 2, 6, 3),
    ]
    for m in msgs:
        assert wire.decode(wire.encode(m)).msg == m
    with pytest.raises(ValueError):
        wire.decode(b"\x08")


# ================================================================== WAL reads (ReadLog)


def _wal_frames(log_entries):
    """A stand-in for the WAL: (trans_id, vote_id, JSON) of every entry ever written."""
    return [(e.trans_id, e.vote_id, encode(e.record)) for e in log_entries]


def _read(wal, read):
    """What Storage.read_log gives for `read`: the frame of `after` when held, then the rest."""
    frames = [f for f in wal if f[0] >= read.after]
    return frames[:read.limit + (1 if frames and frames[0][0] == read.after else 0)]


def test_a_follower_behind_the_log_but_within_the_wal_is_fed_from_it():
    """A follower the log in memory no longer reaches, but whose position the WAL still holds,
    gets its batches read from the WAL (ReadLog, paced like any catch-up batch) and no snapshot;
    once it is inside the log it is fed from memory."""
    log = ChangeLog(5)
    written = entries(1, 1, 40)
    log.accept(0, 0, list(written))
    log.commit_to(40)
    wal = _wal_frames(written)
    assert log.base_trans_id > 20
    leader = LeaderReplication(1, [1, 2], log, 1, 0.0, Flow(max_batch=8), wal_from=0)
    follower = Follower(2, ChangeLog(1000), pull_interval=0.0)
    actions = leader.on_message(Pull(1, 2, 0, 0, 0), 0.0)
    reads = 0
    for _ in range(100):
        if not actions:
            break
        a = actions.pop(0)
        assert not isinstance(a, SendSnapshot)
        if isinstance(a, ReadLog):
            reads += 1
            assert a.to == 2 and a.limit <= 8 and a.max_bytes == 1 << 20
            assert not of(leader.on_message(Pull(1, 2, a.after, 1 if a.after else 0, 0), 0.0), ReadLog)  # one at a time
            actions += leader.on_log_read(2, a.after, _read(wal, a), 0.0)
        elif isinstance(a, Send) and isinstance(a.msg, AppendEntries):
            msg = wire.decode(wire.encode(a.msg)).msg  # records go out as the WAL's bytes
            actions += [Send(1, m.msg) if isinstance(m, Send) else m for m in follower.on_message(msg, 0.0)]
        elif isinstance(a, Send) and a.to == 1:
            actions += leader.on_message(a.msg, 0.0)
    assert follower.log.last_trans_id == 40 and reads >= 4
    assert [e.record for e in follower.log.entries_after(0, 40)] == [e.record for e in written]
    assert leader.progress[2].match_trans_id == 40


def test_a_follower_older_than_the_wal_gets_a_snapshot():
    log = ChangeLog(5)
    log.accept(0, 0, list(entries(1, 1, 40)))
    log.commit_to(40)
    leader = LeaderReplication(1, [1, 2], log, 1, 0.0, wal_from=11)
    assert of(leader.on_message(Pull(1, 2, 10, 1, 10), 0.0), SendSnapshot) == [SendSnapshot(2)]
    leader = LeaderReplication(1, [1, 2], log, 1, 0.0, wal_from=11)
    assert of(leader.on_message(Pull(1, 2, 11, 1, 11), 0.0), ReadLog) == [ReadLog(2, 11, 1000, 1 << 20)]
    leader = LeaderReplication(1, [1, 2], log, 1, 0.0)  # in_memory: no WAL
    assert of(leader.on_message(Pull(1, 2, 11, 1, 11), 0.0), SendSnapshot) == [SendSnapshot(2)]


def test_a_wal_read_that_fails_or_comes_too_late_ends_in_a_snapshot_or_nothing():
    log = ChangeLog(5)
    written = entries(1, 1, 40)
    log.accept(0, 0, list(written))
    log.commit_to(40)
    leader = LeaderReplication(1, [1, 2], log, 1, 0.0, wal_from=0)
    (read,) = of(leader.on_message(Pull(1, 2, 3, 1, 3), 0.0), ReadLog)
    assert leader.on_log_unreadable(2, 0.0) == [SendSnapshot(2)]
    assert leader.progress[2].state is FollowerState.SNAPSHOT
    # an answer for a read nobody waits for any more is dropped
    assert leader.on_log_read(2, 3, _read(_wal_frames(written), read), 0.0) == []
    # a read that does not reach the follower's position (the WAL moved on) falls back too
    leader = LeaderReplication(1, [1, 2], log, 1, 0.0, wal_from=0)
    (read,) = of(leader.on_message(Pull(1, 2, 3, 1, 3), 0.0), ReadLog)
    assert leader.on_log_read(2, 3, _read(_wal_frames(written), read)[2:], 0.0) == [SendSnapshot(2)]


def test_a_follower_far_behind_the_newest_snapshot_gets_it_then_reads_the_wal_after_it():
    """More than Flow.snapshot_over records behind the newest snapshot on disk, the follower gets
    that snapshot (even one older than the log, since the WAL follows it) rather than the records
    read one by one; then the WAL after it. Closer than that, it reads the WAL."""
    log = ChangeLog(5)
    log.accept(0, 0, list(entries(1, 1, 600)))
    log.commit_to(600)
    source = SnapshotSource(500, 1, (("/s/m", 10), ("/s/p0", 5)))
    leader = LeaderReplication(1, [1, 2, 3], log, 1, 0.0, Flow(snapshot_over=100), source=source, wal_from=0)
    actions = leader.on_message(Pull(1, 2, 10, 1, 10), 0.0)
    assert not of(actions, ReadLog) and not of(actions, SendSnapshot)
    assert {(m.trans_id, m.part) for m in sent(actions, SnapshotChunk)} == {(500, -1), (500, 0)}
    assert of(leader.on_message(AppendAck(1, 2, 500), 1.0), ReadLog) == [ReadLog(2, 500, 1000, 1 << 20)]
    assert of(leader.on_message(Pull(1, 3, 450, 1, 450), 1.0), ReadLog) == [ReadLog(3, 450, 1000, 1 << 20)]
