"""The coordinator's count of each worker's records (PartitionService.seq, workers/undo.py), and
where its uncommitted ones sit in the log, so that a mode change can tell a worker which of its
records to keep (docs/plans/one-copy.md 3.1). Pure: no I/O.

Every record a worker applies gets the next number of its count: those it decides (logged from
its BATCH) and those it replays (APPLY). A BATCH's records are consecutive in the log, so each
logged batch is one run (first trans_id, first seq, count) and a commit point inside it maps to
an exact seq. A refused batch is not counted: every refusal ends the mode, whose MODE undoes it
in the worker."""
from __future__ import annotations

from collections import deque


class WorkerSeqs:
    """Per worker: how many records it has applied, and the runs of them not yet committed."""

    __slots__ = ("counts", "_runs")

    def __init__(self, workers: int) -> None:
        self.counts = [0] * workers
        self._runs: list[deque[tuple[int, int, int]]] = [deque() for _ in range(workers)]

    def reset(self) -> None:
        """Every worker's queues were replaced (LOAD): their counts start again at 0."""
        for i in range(len(self.counts)):
            self.counts[i] = 0
            self._runs[i].clear()

    def logged(self, index: int, first_trans_id: int, n: int) -> None:
        """Worker `index`'s batch of n records took trans_ids first_trans_id.. in the log."""
        self._runs[index].append((first_trans_id, self.counts[index] + 1, n))
        self.counts[index] += n

    def applied(self, index: int, trans_ids: list[int], committed: bool) -> None:
        """Worker `index` replays the records at these trans_ids (ascending)."""
        if not committed:
            runs = self._runs[index]
            seq = self.counts[index]
            for t in trans_ids:
                seq += 1
                runs.append((t, seq, 1))
        self.counts[index] += len(trans_ids)

    def through(self, index: int, trans_id: int) -> int:
        """The number of worker `index`'s last record at or before `trans_id` in the log."""
        runs = self._runs[index]
        for first, seq, n in reversed(runs):
            if first <= trans_id:
                return seq + min(n, trans_id - first + 1) - 1
        return runs[0][1] - 1 if runs else self.counts[index]

    def keep(self, trans_id: int) -> list[int]:
        """The log is committed through `trans_id` and the workers' mode ends: every worker's
        through(trans_id), and all its runs forgotten: those after are undone by the MODE being
        sent, those at or before are committed. (A committed run left here, as one the last
        heartbeat's commit() had not reached yet, would name a record of this mode when the
        node leads again: a later keep() would map to it, far before the new mode's records.)"""
        kept = []
        for index, runs in enumerate(self._runs):
            seq = self.through(index, trans_id)
            runs.clear()
            self.counts[index] = seq
            kept.append(seq)
        return kept

    def commit(self, trans_id: int) -> list[int]:
        """The log is committed through `trans_id`: every worker's committed seq; the runs wholly
        committed are forgotten."""
        seqs = []
        for index, runs in enumerate(self._runs):
            seqs.append(self.through(index, trans_id))
            while runs and runs[0][0] + runs[0][2] - 1 <= trans_id:
                runs.popleft()
        return seqs
