"""SnapshotCut (server/snapshots.py) alone, with a fake clock and a fake log: when a cut starts,
when it is published and when it fails."""
from __future__ import annotations

from queue_server.protocol import ipc_frames
from queue_server.server.snapshots import RETRY_AFTER, RETRY_MAX, Clear, Failed, Publish, SnapshotCut

PART = {"file": "part-0.qsp", "bytes": 10, "queues": 0, "messages": 0}


def terms(log: dict[int, int]):
    return log.get


def synced(cut: SnapshotCut, now: float) -> list:
    """Every worker answers the SYNC of the running cut at `now`: the SNAPs."""
    out = []
    for i in range(cut.workers):
        out += cut.on_synced(cut.epoch, cut.cut_id, i, now)
    return out


def test_a_cut_starts_after_every_committed_records_and_never_without_a_disk():
    cut = SnapshotCut(2, 100, "/s", last=50)
    assert not cut.due(149, 0.0) and cut.due(150, 0.0)
    cut.start(1, 0.0, 150, hold=False, point=150, term_at=terms({150: 1}))
    assert not cut.due(1000, 0.0)  # one at a time
    assert not SnapshotCut(2, 1, None).due(1000, 0.0)


def test_a_cut_whose_t_was_replaced_before_it_was_committed_fails():
    """Log matching: the same term at T means the same log up to T; another term, another log."""
    log = {10: 3}
    cut = SnapshotCut(1, 1, "/s")
    cut.start(1, 0.0, 5, hold=True, point=0, term_at=terms(log))
    synced(cut, 0.0)
    assert [f[0] for _, f in cut.on_snapped(1, 1, 0, 10, terms(log), 0.05)] == [ipc_frames.RELEASE]
    cut.on_part_done(1, 0, True, PART)
    assert cut.poll(0.1, 9, terms(log)) == [] and cut.done == []  # not committed yet
    log[10] = 4  # the entry at 10 was replaced by another leader's
    cut.poll(0.2, 10, terms(log))
    (failed,) = cut.take_done()
    assert (type(failed), failed.trans_id) == (Failed, 10) and "replaced" in failed.reason


def test_committed_once_is_final_even_if_the_entry_leaves_the_log_window():
    log = {10: 3}
    cut = SnapshotCut(1, 1, "/s")
    cut.start(1, 0.0, 5, hold=True, point=0, term_at=terms(log))
    synced(cut, 0.0)
    cut.on_snapped(1, 1, 0, 10, terms(log), 0.05)
    cut.poll(0.1, 10, terms(log))
    del log[10]
    cut.on_part_done(1, 0, True, PART)
    tmp = cut.tmp
    cut.poll(0.2, 12, terms(log))
    assert cut.take_done() == [Publish(10, 3, tmp, (PART,), 0.05, 0.2)]


def test_an_urgent_cut_is_tried_again_soon_after_a_failure_and_ends_with_a_publish():
    cut = SnapshotCut(1, 1000, "/s")
    cut.request()
    assert cut.due(0, 5.0)
    cut.start(1, 5.0, 0, hold=False, point=7, term_at=terms({7: 2}))
    cut.on_part_done(1, 0, False, None)
    assert [type(d) for d in cut.take_done()] == [Failed]
    assert not cut.due(0, 5.0 + RETRY_AFTER / 2) and cut.due(0, 5.0 + RETRY_AFTER)
    cut.start(1, 6.0, 0, hold=False, point=7, term_at=terms({7: 2}))
    cut.on_part_done(2, 0, True, PART)
    cut.poll(6.1, 7, terms({7: 2}))
    (published,) = cut.take_done()
    assert (type(published), published.trans_id, published.vote_id) == (Publish, 7, 2)
    assert not cut.urgent and not cut.due(7, 7.0)


def test_answers_of_another_cut_or_mode_are_ignored():
    cut = SnapshotCut(2, 1, "/s")
    cut.start(3, 0.0, 1, hold=True, point=0, term_at=terms({}))
    assert cut.on_synced(2, 1, 0, 0.0) == [] and cut.on_synced(3, 0, 0, 0.0) == []
    synced(cut, 0.0)
    assert cut.on_snapped(2, 1, 0, 5, terms({}), 0.0) == []  # an older mode
    assert cut.on_snapped(3, 0, 0, 5, terms({}), 0.0) == []  # an older cut
    assert cut.on_part_done(0, 0, False, None) == [] and cut.running
    assert cut.snapped == set()


def test_what_writers_of_an_ended_cut_write_afterwards_is_deleted_when_each_ends():
    """A cut that failed (here: a worker did not fork in time) leaves writers running; each
    PART_DONE of it deletes the cut's directory again, since a late writer makes it anew."""
    cut = SnapshotCut(2, 1, "/s")
    cut.start(1, 0.0, 5, hold=True, point=0, term_at=terms({}))
    tmp = cut.tmp
    synced(cut, 0.0)
    cut.on_snapped(1, 1, 0, 5, terms({}), 0.1)
    cut.poll(1.0, 5, terms({}))
    assert [type(d) for d in cut.take_done()] == [Failed]
    cut.on_part_done(1, 0, True, PART)
    cut.on_part_done(1, 1, True, PART)  # the late worker's
    assert cut.take_done() == [Clear(tmp), Clear(tmp)] and cut.abandoned == {}
    cut.on_part_done(1, 1, True, PART)
    assert cut.take_done() == []


def test_a_leader_s_cut_snaps_only_once_every_worker_answered_its_sync_and_waits_for_it_unbounded():
    """A worker busy with what it was sent earlier (the replay of a long log) delays the SNAPs,
    not the hold: the hold's deadline starts at the SNAPs, so the cut does not time out."""
    cut = SnapshotCut(2, 1, "/s")
    sent = cut.start(1, 0.0, 5, hold=True, point=0, term_at=terms({}))
    assert [(i, f[0]) for i, f in sent] == [(0, ipc_frames.SYNC), (1, ipc_frames.SYNC)]
    assert ipc_frames.read_sync(sent[0][1]) == (1, 1)
    assert cut.on_synced(1, 1, 0, 0.01) == [] and cut.wake_at() == float("inf")
    assert cut.on_snapped(1, 1, 0, 5, terms({}), 0.02) == []  # no SNAP was sent yet
    assert cut.poll(30.0, 5, terms({})) == [] and cut.running  # no deadline while syncing
    snaps = cut.on_synced(1, 1, 1, 30.0)  # worker 1 is done with its replay
    assert [(i, ipc_frames.read_snap(f)) for i, f in snaps] == [(0, (1, 1, cut.tmp, True)), (1, (1, 1, cut.tmp, True))]
    assert cut.wake_at() == 30.0 + cut.hold_timeout
    cut.on_snapped(1, 1, 0, 7, terms({7: 1}), 30.01)
    assert not cut.writing  # a stop now would not wait for it: T is not set
    assert [f[0] for _, f in cut.on_snapped(1, 1, 1, 7, terms({7: 1}), 30.02)] == [ipc_frames.RELEASE] * 2
    assert cut.trans_id == 7 and cut.writing


def test_a_cut_that_ends_before_its_snaps_leaves_no_writer_to_wait_for():
    cut = SnapshotCut(2, 1, "/s")
    cut.start(1, 0.0, 5, hold=True, point=0, term_at=terms({}))
    cut.on_synced(1, 1, 0, 0.1)
    assert cut.abort("the workers' mode changed") == []  # nothing held: no RELEASE
    assert [type(d) for d in cut.take_done()] == [Failed] and cut.abandoned == {}
    assert cut.on_synced(1, 1, 1, 0.2) == []  # a late answer of that cut


def test_after_a_hold_timed_out_the_next_cut_is_tried_soon_then_less_often_until_one_is_published():
    cut = SnapshotCut(2, 1000, "/s")
    now = 0.0
    for backoff in (1, 2, 4):
        cut.start(1, now, 0, hold=True, point=0, term_at=terms({}))
        synced(cut, now)
        cut.on_snapped(1, cut.cut_id, 0, 5, terms({}), now)
        now += cut.hold_timeout
        cut.poll(now, 5, terms({}))  # worker 1 was busy: the hold timed out
        assert [type(d) for d in cut.take_done()] == [Failed]
        assert not cut.due(0, now + backoff * RETRY_AFTER - 0.01) and cut.due(0, now + backoff * RETRY_AFTER)
        assert cut.due(1000, now)  # snapshot_every more records, if they come first
        now += backoff * RETRY_AFTER
    cut.timeouts = 20
    cut.start(1, now, 0, hold=True, point=0, term_at=terms({}))
    synced(cut, now)
    now += cut.hold_timeout
    cut.poll(now, 5, terms({}))
    cut.take_done()
    assert not cut.due(0, now + RETRY_MAX - 0.01) and cut.due(0, now + RETRY_MAX)
    cut.start(1, now, 0, hold=True, point=0, term_at=terms({7: 1}))
    synced(cut, now)
    for i in range(2):
        cut.on_snapped(1, cut.cut_id, i, 7, terms({7: 1}), now)
        cut.on_part_done(cut.cut_id, i, True, PART)
    cut.poll(now, 7, terms({7: 1}))
    assert [type(d) for d in cut.take_done()] == [Publish]
    assert cut.timeouts == 0 and not cut.due(0, now + 3600)  # back to every snapshot_every records
