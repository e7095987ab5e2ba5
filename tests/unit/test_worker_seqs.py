"""WorkerSeqs (server/worker_seqs.py): which record of its own each worker keeps at a log point."""
from __future__ import annotations

from queue_server.server.worker_seqs import WorkerSeqs


def test_a_point_inside_a_batch_maps_to_its_exact_record():
    seqs = WorkerSeqs(2)
    seqs.logged(0, 10, 3)  # worker 0: records 1..3 at trans_ids 10..12
    seqs.logged(1, 13, 2)  # worker 1: records 1..2 at 13..14
    seqs.logged(0, 15, 2)  # worker 0: records 4..5 at 15..16
    assert [seqs.through(0, t) for t in (9, 10, 11, 12, 14, 15, 16, 99)] == [0, 1, 2, 3, 3, 4, 5, 5]
    assert [seqs.through(1, t) for t in (12, 13, 14)] == [0, 1, 2]
    assert seqs.keep(11) == [2, 0] and seqs.counts == [2, 0]
    seqs.logged(0, 17, 1)  # numbered after the kept ones
    assert seqs.through(0, 17) == 3 and seqs.through(0, 16) == 2


def test_committed_runs_are_forgotten_and_the_count_stays():
    seqs = WorkerSeqs(1)
    seqs.logged(0, 1, 2)
    seqs.logged(0, 3, 2)
    assert seqs.commit(3) == [3]
    assert seqs.through(0, 2) == 2 and seqs.through(0, 3) == 3 and seqs.through(0, 4) == 4
    assert seqs.commit(4) == [4] and seqs.keep(4) == [4]


def test_replayed_records_count_and_uncommitted_ones_can_be_undone():
    seqs = WorkerSeqs(2)
    seqs.applied(0, [1, 3], committed=True)
    seqs.applied(0, [5, 8], committed=False)  # a new leader's entries of earlier terms
    assert seqs.counts == [4, 0]
    assert seqs.through(0, 4) == 2 and seqs.through(0, 5) == 3 and seqs.through(0, 7) == 3
    assert seqs.keep(6) == [3, 0]
    seqs.reset()
    assert seqs.counts == [0, 0] and seqs.through(0, 99) == 0


def test_a_mode_that_ends_forgets_its_committed_runs_too():
    """GroupSim seed 210 (found at 2000 seeds): a leader's records committed since its last
    heartbeat's commit() stayed as runs when it stopped leading; leading again, its new records
    were all past the next commit point, and keep() mapped that point into the stale runs (44,
    where the worker held 85..88): the worker was told to undo records long committed."""
    seqs = WorkerSeqs(1)
    seqs.logged(0, 10, 4)  # records 1..4 at trans_ids 10..13, all committed by 13
    assert seqs.keep(13) == [4]  # the mode ends before a heartbeat's commit() forgot them
    seqs.applied(0, [14, 15, 16], committed=True)  # following: records 5..7
    seqs.logged(0, 20, 2)  # leading again: records 8..9 at 20..21, the commit point still 17
    assert seqs.keep(17) == [7]  # not 4: nothing at or before 17 is undone
