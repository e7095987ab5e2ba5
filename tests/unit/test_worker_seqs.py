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
