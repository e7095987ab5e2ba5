"""Snapshots streamed in chunks (replication/transfer.py) through the leader's SNAPSHOT state
(replication/progress.py) and the follower's reception (replication/follower.py): the window, the
resend, a restart of the staging, and a lossy stream that still delivers every byte."""
import random

import orjson
import pytest

from queue_server.election.messages import Send
from queue_server.replication.follower import Follower
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import (
    AppendAck,
    FileRange,
    Pull,
    SendSnapshot,
    SnapshotAck,
    SnapshotChunk,
    SnapshotStaged,
    WriteChunk,
)
from queue_server.replication.progress import Flow, FollowerState, LeaderReplication
from queue_server.replication.transfer import MANIFEST, SnapshotReceive, SnapshotSend, SnapshotSource
from queue_server.protocol.records import DeleteQueue

T, TV = 55, 1  # the snapshot's point and term


def files(sizes: list[int]) -> dict[str, bytes]:
    """A manifest and parts of these sizes, as a dict path -> bytes (the 'disk')."""
    rng = random.Random(len(sizes))
    parts = {f"p{i}": rng.randbytes(n) for i, n in enumerate(sizes)}
    manifest = orjson.dumps({"format": 2, "trans_id": T, "vote_id": TV,
                             "parts": [{"file": p, "bytes": len(b), "queues": 1, "messages": 1} for p, b in parts.items()]})
    return {"manifest": manifest, **parts}


def source(disk: dict[str, bytes]) -> SnapshotSource:
    return SnapshotSource(T, TV, tuple((path, len(data)) for path, data in disk.items()))


def filled(msg: SnapshotChunk, disk: dict[str, bytes]) -> SnapshotChunk:
    r = msg.data
    assert isinstance(r, FileRange)
    return SnapshotChunk(msg.vote_id, msg.src, msg.trans_id, msg.trans_vote_id, msg.part, msg.offset, msg.total,
                         disk[r.path][r.offset:r.offset + r.length])


def leader_log(n: int = 60, keep: int = 10) -> ChangeLog:
    log = ChangeLog(keep)
    log.append(TV, [DeleteQueue(queue=f"q{i}") for i in range(n)])
    log.commit_to(n)
    return log


def chunks_of(actions) -> list[SnapshotChunk]:
    return [a.msg for a in actions if isinstance(a, Send) and isinstance(a.msg, SnapshotChunk)]


# ================================================================== SnapshotSend


def test_the_window_bounds_the_chunks_out_and_acks_move_it():
    s = SnapshotSend(SnapshotSource(T, TV, (("m", 10), ("a", 25), ("b", 5))), chunk=10, window=2)
    out = s.chunks(3, 1, 0.0)
    assert [(c.part, c.offset, c.data.length) for c in out] == [(MANIFEST, 0, 10), (0, 0, 10)]
    assert s.chunks(3, 1, 0.0) == []  # the window is full
    assert s.on_ack(0, 0)
    assert [(c.part, c.offset, c.data.length) for c in s.chunks(3, 1, 0.1)] == [(0, 10, 10)]
    assert s.on_ack(0, 20)
    assert [(c.part, c.offset, c.total, c.data.length) for c in s.chunks(3, 1, 0.2)] == [(0, 20, 25, 5), (1, 0, 5, 5)]
    assert not s.done and s.on_ack(2, 0) and s.done
    assert s.chunks(3, 1, 0.3) == []


def test_an_unanswered_chunk_makes_the_window_go_again_from_the_last_ack():
    s = SnapshotSend(SnapshotSource(T, TV, (("m", 10), ("a", 40))), chunk=10, window=3, resend_after=1.0)
    s.chunks(3, 1, 0.0)
    s.on_ack(0, 0)
    assert not s.tick(0.9)
    assert s.tick(1.0) and s.resent == 2
    assert [(c.part, c.offset) for c in s.chunks(3, 1, 1.0)] == [(0, 0), (0, 10), (0, 20)]


def test_an_ack_behind_the_last_one_starts_the_stream_there_again():
    """The follower started over (it restarted, or dropped what it had)."""
    s = SnapshotSend(SnapshotSource(T, TV, (("m", 10), ("a", 40))), chunk=10, window=3)
    s.chunks(3, 1, 0.0)
    s.on_ack(0, 20)
    assert not s.on_ack(MANIFEST, 0)
    assert [(c.part, c.offset) for c in s.chunks(3, 1, 0.0)] == [(MANIFEST, 0), (0, 0), (0, 10)]


# ================================================================== SnapshotReceive / Follower


def stream(disk: dict[str, bytes], chunk: int) -> list[SnapshotChunk]:
    out = []
    for part, (path, data) in enumerate(disk.items(), start=MANIFEST):
        for offset in range(0, len(data), chunk):
            out.append(SnapshotChunk(3, 1, T, TV, part, offset, len(data), data[offset:offset + chunk]))
    return out


def test_the_follower_writes_chunks_in_order_and_stages_the_whole():
    disk = files([25, 7])
    log = ChangeLog(100)
    log.accept(0, 0, (Entry(1, 1, DeleteQueue(queue="x")),))
    f = Follower(2, log)
    written: dict[int, bytearray] = {}
    staged = []
    for c in stream(disk, 10):
        actions = f.on_message(c, 0.0)
        for a in actions:
            if isinstance(a, WriteChunk):
                buf = written.setdefault(a.part, bytearray())
                assert a.offset == len(buf)
                buf += a.data
            elif isinstance(a, SnapshotStaged):
                staged.append(a)
        (ack,) = [a.msg for a in actions if isinstance(a, Send)]
        assert isinstance(ack, SnapshotAck)
    assert ack == SnapshotAck(3, 2, T, 2, 0)  # the end: every file
    assert [bytes(written[i]) for i in (MANIFEST, 0, 1)] == list(disk.values())
    assert staged == [SnapshotStaged(T, TV, orjson.loads(disk["manifest"]))]
    assert log.last_trans_id == 1  # nothing replaced until it is installed
    assert f.installed(T, TV, 1, 3) == [Send(1, AppendAck(3, 2, T))]
    assert (log.base_trans_id, log.last_trans_id, log.commit_trans_id) == (T, T, T)
    assert f.installed(T, TV, 1, 3) == []  # once


def test_a_chunk_out_of_order_is_answered_with_the_position_held():
    disk = files([25])
    f = Follower(2, ChangeLog(100))
    chunks = stream(disk, 10)
    first = next(i for i, c in enumerate(chunks) if c.part == 0)
    for c in chunks[:first + 1]:
        f.on_message(c, 0.0)
    actions = f.on_message(chunks[first + 2], 0.0)  # the one before was lost
    assert not [a for a in actions if isinstance(a, WriteChunk)]
    assert [a.msg for a in actions if isinstance(a, Send)] == [SnapshotAck(3, 2, T, 0, 10)]
    actions = f.on_message(chunks[first], 0.0)  # a duplicate
    assert [a.msg for a in actions if isinstance(a, Send)] == [SnapshotAck(3, 2, T, 0, 10)]


def test_a_chunk_of_another_snapshot_restarts_the_staging():
    f = Follower(2, ChangeLog(100))
    disk = files([25])
    f.on_message(stream(disk, 10)[0], 0.0)
    f.on_message(stream(disk, 10)[1], 0.0)
    newer = SnapshotChunk(3, 1, T + 5, TV, 0, 0, 25, b"x" * 10)  # not from its start
    assert [a.msg for a in f.on_message(newer, 0.0) if isinstance(a, Send)] == [SnapshotAck(3, 2, T + 5, MANIFEST, 0)]
    manifest = orjson.dumps({"trans_id": T + 5, "vote_id": TV, "parts": [{"file": "a", "bytes": 3}]})
    actions = f.on_message(SnapshotChunk(3, 1, T + 5, TV, MANIFEST, 0, len(manifest), manifest), 0.0)
    assert [a for a in actions if isinstance(a, WriteChunk)] == [WriteChunk(T + 5, MANIFEST, 0, manifest)]
    assert f.receiving.trans_id == T + 5 and f.receiving.at == (0, 0)


def test_a_part_whose_size_is_not_the_manifests_is_refused():
    r = SnapshotReceive(T, TV)
    disk = files([25])
    assert r.take(stream(disk, 100)[0])
    assert not r.take(SnapshotChunk(3, 1, T, TV, 0, 0, 26, b"x" * 10))
    assert not r.take(SnapshotChunk(3, 1, T, TV, 1, 0, 25, b"x" * 10))  # no such part
    assert r.take(SnapshotChunk(3, 1, T, TV, 0, 0, 25, b"x" * 10)) and r.at == (0, 10)


def test_a_snapshot_the_log_holds_only_commits():
    log = ChangeLog(100)
    log.append(TV, [DeleteQueue(queue=f"q{i}") for i in range(T + 2)])
    f = Follower(2, log)
    actions = f.on_message(stream(files([5]), 10)[0], 0.0)
    assert log.commit_trans_id == T
    assert [a.msg for a in actions if isinstance(a, Send)] == [AppendAck(3, 2, T)]


# ================================================================== the leader's SNAPSHOT state


def test_a_follower_behind_the_log_gets_the_snapshot_on_disk_in_chunks():
    disk = files([3000, 10])
    leader = LeaderReplication(1, [1, 2], leader_log(), 3, 0.0, Flow(chunk_bytes=1000, chunk_window=2),
                               source=SnapshotSource(T, TV, source(disk).files))
    out = chunks_of(leader.on_message(Pull(3, 2, 0, 0, 0), 0.0))
    assert leader.progress[2].state is FollowerState.SNAPSHOT
    assert [(c.trans_id, c.part, c.offset) for c in out] == [(T, MANIFEST, 0), (T, 0, 0)]
    more = chunks_of(leader.on_message(SnapshotAck(3, 2, T, 0, 1000), 0.5))
    assert [(c.part, c.offset) for c in more] == [(0, 1000), (0, 2000)]
    assert chunks_of(leader.on_message(SnapshotAck(3, 2, T - 1, 0, 3000), 0.5)) == []  # another snapshot's
    # it installed the snapshot: catch-up goes on with entries after it
    actions = leader.on_message(AppendAck(3, 2, T), 0.6)
    assert leader.progress[2].state is not FollowerState.SNAPSHOT and leader.progress[2].transfer is None
    assert [a.msg.prev_trans_id for a in actions if isinstance(a, Send)] == [T]


def test_no_snapshot_on_disk_asks_the_node_and_streams_once_one_is_published():
    disk = files([100])
    log = leader_log()
    leader = LeaderReplication(1, [1, 2], log, 3, 0.0, Flow(chunk_bytes=1000),
                               source=SnapshotSource(20, TV, source(disk).files))  # older than the log
    assert [a for a in leader.on_message(Pull(3, 2, 0, 0, 0), 0.0) if isinstance(a, SendSnapshot)] == [SendSnapshot(2)]
    out = chunks_of(leader.set_source(SnapshotSource(T, TV, source(disk).files), 0.2))
    assert [(c.trans_id, c.part) for c in out] == [(T, MANIFEST), (T, 0)]


def test_a_follower_that_installed_a_snapshot_the_log_moved_past_gets_the_next_at_once():
    disk = files([100])
    log = leader_log()
    leader = LeaderReplication(1, [1, 2], log, 3, 0.0, Flow(chunk_bytes=1000),
                               source=SnapshotSource(T, TV, source(disk).files))
    leader.on_message(Pull(3, 2, 0, 0, 0), 0.0)
    log.append(3, [DeleteQueue(queue="x")] * 10)
    log.commit_to(log.last_trans_id)
    assert log.base_trans_id > T
    # it installed T, but the log no longer follows it: another snapshot now, not after snapshot_timeout
    actions = leader.on_message(AppendAck(3, 2, T), 0.5)
    assert leader.progress[2].state is FollowerState.SNAPSHOT
    assert [a for a in actions if isinstance(a, SendSnapshot)] == [SendSnapshot(2)]


def test_resend_after_chunk_resend_and_restart_after_snapshot_timeout():
    disk = files([3000])
    leader = LeaderReplication(1, [1, 2], leader_log(), 3, 0.0,
                               Flow(chunk_bytes=1000, chunk_window=2, chunk_resend=1.0, snapshot_timeout=5.0),
                               source=SnapshotSource(T, TV, source(disk).files))
    leader.on_message(Pull(3, 2, 0, 0, 0), 0.0)
    assert chunks_of(leader.tick(0.5)) == []
    assert [(c.part, c.offset) for c in chunks_of(leader.tick(1.0))] == [(MANIFEST, 0), (0, 0)]
    assert leader.progress[2].transfer.resent == 2
    leader.on_message(SnapshotAck(3, 2, T, 0, 0), 1.5)  # progress: the timeout counts from here
    assert leader.tick(6.0)  # the window again, not a restart
    assert leader.progress[2].transfer.acked == (0, 0)
    restarted = leader.tick(6.5)
    assert [(c.part, c.offset) for c in chunks_of(restarted)] == [(MANIFEST, 0), (0, 0)]
    assert leader.progress[2].transfer.acked == (MANIFEST, 0)


def test_a_snapshot_whose_files_vanished_is_given_up_for_the_newest_one_at_once():
    disk = files([3000])
    log = leader_log()
    leader = LeaderReplication(1, [1, 2], log, 3, 0.0, Flow(chunk_bytes=1000, chunk_window=2),
                               source=SnapshotSource(T, TV, source(disk).files))
    leader.on_message(Pull(3, 2, 0, 0, 0), 0.0)
    assert leader.streaming() == [SnapshotSource(T, TV, source(disk).files)]
    newer = SnapshotSource(T + 3, TV, tuple((f"new-{p}", n) for p, n in source(disk).files))
    assert chunks_of(leader.set_source(newer, 1.0)) == []  # the transfer under way goes on
    # The files of the snapshot streamed are gone (pruned): the transfer starts again from the
    # newest at once, not after snapshot_timeout with the same lost snapshot.
    out = chunks_of(leader.on_snapshot_unreadable(T, 1.5))
    assert [(c.trans_id, c.part, c.offset, c.data.path) for c in out] == [
        (T + 3, MANIFEST, 0, "new-manifest"), (T + 3, 0, 0, "new-p0")]
    assert leader.progress[2].state is FollowerState.SNAPSHOT and leader.streaming() == [newer]
    assert leader.on_snapshot_unreadable(T, 1.6) == []  # the other chunks of the lost one: nothing more
    # The newest lost too: the node is asked for a new cut, streamed once published.
    assert leader.on_snapshot_unreadable(T + 3, 2.0) == [SendSnapshot(2)]
    assert leader.source is None and leader.progress[2].transfer is None and leader.streaming() == []
    cut = SnapshotSource(T + 4, TV, source(disk).files)
    assert [c.trans_id for c in chunks_of(leader.set_source(cut, 2.5))] == [T + 4] * 2
    leader.on_message(AppendAck(3, 2, T + 4), 3.0)
    assert leader.streaming() == []  # installed: no snapshot streamed any more


@pytest.mark.parametrize("seed", range(20))
def test_a_lossy_stream_still_delivers_every_byte(seed):
    rng = random.Random(seed)
    disk = files([rng.randrange(1, 5000) for _ in range(rng.randrange(1, 4))])
    log = leader_log()
    leader = LeaderReplication(1, [1, 2], log, 3, 0.0,
                               Flow(chunk_bytes=rng.choice([7, 100, 999]), chunk_window=rng.randrange(1, 9),
                                    chunk_resend=0.5, snapshot_timeout=1e9),
                               source=SnapshotSource(T, TV, source(disk).files))
    flog = ChangeLog(100)
    follower = Follower(2, flog)
    written: dict[int, bytearray] = {}
    staged = []
    to_follower = chunks_of(leader.on_message(Pull(3, 2, 0, 0, 0), 0.0))
    now = 0.0
    for _ in range(100_000):
        if staged:
            break
        to_leader = []
        for c in to_follower:
            if rng.random() < 0.2:
                continue  # lost
            for a in follower.on_message(filled(c, disk), now):
                if isinstance(a, WriteChunk) and a.part != MANIFEST:
                    buf = written.setdefault(a.part, bytearray())
                    buf[a.offset:a.offset + len(a.data)] = a.data
                elif isinstance(a, SnapshotStaged):
                    staged.append(a)
                elif isinstance(a, Send) and rng.random() >= 0.2:
                    to_leader.append(a.msg)
        to_follower = []
        for m in to_leader:
            to_follower += chunks_of(leader.on_message(m, now))
        now += 0.1
        to_follower += chunks_of(leader.tick(now))
    assert staged and staged[0].trans_id == T
    assert [bytes(written[i]) for i in range(len(disk) - 1)] == list(disk.values())[1:]
