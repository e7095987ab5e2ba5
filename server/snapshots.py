"""When and how a node's workers make a snapshot, free of I/O: SnapshotCut, owned by ClusterNode.

A cut sends SNAP to every worker (on a leader, only once every worker has answered a first round
trip, SYNC -> SYNCED: a worker still busy with what it was sent earlier, such as the replay of a
long log, would otherwise make the hold below time out); each flushes, forks a child that writes its queues as one part
file (server/snapshot_child.py), and answers SNAPPED at once. On a leader the workers keep deciding
meanwhile, so a worker that has snapped holds what it sends the coordinator until every worker has
snapped (RELEASE): the pipes are FIFO, so the log then holds every record decided before a fork
and none decided after one, and T is the last logged trans_id. On a follower (or a node with no
leader) the workers decide nothing: T is the last trans_id sent to them, and nothing is held.
The cut is published (Publish, carried out by Storage.finish_snapshot) only once every part is
written and the log up to T is committed with the term it had at the cut (the same term at T means
the same prefix: log matching); anything else ends it with one Failed. docs/architecture.md §5
gives the argument."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from queue_server.protocol import ipc_frames

# How long the first SNAPPED may wait for the last: a worker busy with a long request makes the
# cut fail (and the held batches go on) rather than hold the others' replies.
SNAP_HOLD_TIMEOUT = 0.5
# How long a graceful stop (SIGTERM) lets a cut whose T is set finish (its workers' writers, then the
# publish), so that it is not lost: under the supervisor's STOP_GRACE (server/main.py), after which
# it kills what is left.
STOP_WAIT = 4.0
# After a failed cut that was asked for at once (a snapshot was installed), the next try waits this long.
RETRY_AFTER = 1.0
# After a cut whose hold timed out (a worker busy with something long, as right after a replay), the
# next is tried RETRY_AFTER later, then twice as long after each further timeout, up to this; or
# once snapshot_every more records are committed, if that comes first.
RETRY_MAX = 60.0

TermAt = Callable[[int], "int | None"]


class Publish(NamedTuple):
    """Publish the parts in `tmp` as the snapshot at trans_id (Storage.finish_snapshot)."""

    trans_id: int
    vote_id: int
    tmp: str
    parts: tuple[dict, ...]  # the workers' part entries, by worker index
    held: float = 0.0  # seconds from the SNAPs to T: how long snapped workers held their output
    took: float = 0.0  # seconds from the SNAPs to this publish


class Failed(NamedTuple):
    """A cut that will not be published: log `reason` once, delete `tmp`."""

    trans_id: int | None  # None: T was never set
    tmp: str
    reason: str


class Clear(NamedTuple):
    """A writer of a cut that ended before it did has finished: delete `tmp` again (it may have
    made the directory anew), saying nothing."""

    tmp: str


class SnapshotCut:
    """The cuts of one queue group on a node, one at a time. Methods return the frames to send to the workers,
    [(worker index, frames)]; what the coordinator must do on disk gathers in `done`."""

    def __init__(self, workers: int, every: int | None, snapshot_dir: str | None, last: int = 0,
                 hold_timeout: float = SNAP_HOLD_TIMEOUT, group: int = 0) -> None:
        """every: committed records between two cuts (None: cuts only when a follower needs one,
        as on an in_memory node); snapshot_dir: where the parts go (None: no cuts at all);
        last: the trans_id of the snapshot the node started from; group: the queue group cut."""
        self.workers = workers
        self.group = group
        self.every = every
        self.snapshot_dir = snapshot_dir
        self.hold_timeout = hold_timeout
        self.last = last  # where the last cut started (or the snapshot at start)
        self.cut_id = 0
        self.running = False
        self.urgent = False  # a cut is wanted now (the log was replaced by an installed snapshot, or a follower needs one)
        self.retry_at = 0.0
        self.timeouts = 0  # holds timed out in a row (the retry waits longer after each)
        self.done: list[Publish | Failed | Clear] = []
        self.aborts = 0
        # Cuts that ended before every writer did: cut id -> [tmp dir, PART_DONEs still to come].
        self.abandoned: dict[int, list] = {}
        self._reset()

    def _reset(self) -> None:
        self.running = False
        self.started = self.held = 0.0
        self.epoch = -1
        self.hold = False
        self.tmp = ""
        self.deadline = 0.0
        self.syncing: set[int] | None = None  # the workers that answered SYNC; None: none asked
        self.snapped: set[int] = set()
        self.parts: dict[int, dict] = {}
        self.trans_id: int | None = None
        self.term: int | None = None
        self.committed = False

    # ----------------------------------------------------------------- starting
    def due(self, commit: int, now: float) -> bool:
        """Whether a cut should start: `every` records committed since the last one started, or
        one is wanted at once, or the last one's hold timed out a while ago (RETRY_AFTER, doubled
        after each further timeout); never without a disk or while one runs."""
        return now >= self.due_at(commit)

    def due_at(self, commit: int) -> float:
        """The time from which due() holds at this commit point (inf: not before the commit
        moves on or a cut is wanted)."""
        if self.snapshot_dir is None or self.running:
            return float("inf")
        if not self.urgent and self.every is not None and commit - self.last >= self.every:
            return 0.0
        return self.retry_at if self.urgent or self.timeouts else float("inf")

    def request(self) -> list[tuple[int, list[bytes]]]:
        """A cut is wanted at once (the state was replaced) on a node that keeps snapshots: the
        running one, if any, ends."""
        self.urgent = self.every is not None
        self.retry_at = 0.0
        return self.abort("a snapshot was installed")

    def want(self) -> None:
        """A cut is wanted soon (a follower needs a snapshot to be streamed): unless one runs
        already, the next one starts at once, and again after a failure."""
        if not self.running and not self.urgent:
            self.urgent = True
            self.retry_at = 0.0

    def start(self, epoch: int, now: float, commit: int, *, hold: bool, point: int,
              term_at: TermAt) -> list[tuple[int, list[bytes]]]:
        """Start a cut in the workers' mode `epoch`. hold: the workers decide (a leader), T is set
        once all have snapped, and the SNAPs go once all have answered a SYNC (on_synced); else T
        is `point`, what the workers were sent."""
        self.cut_id += 1
        self.running = True
        self.epoch = epoch
        self.hold = hold
        self.last = commit
        # clean() deletes a tmp- directory a crash (or an abandoned cut) left.
        self.tmp = os.path.join(self.snapshot_dir or "", f"tmp-cut-{int(now * 1e6):x}-{self.cut_id}")
        self.started = now
        if hold:  # no deadline before the SNAPs
            self.syncing = set()
            return [(i, ipc_frames.sync_frames(epoch, self.cut_id, self.group)) for i in range(self.workers)]
        self._set_point(point, term_at)
        return self._snaps(now)

    def _snaps(self, now: float) -> list[tuple[int, list[bytes]]]:
        self.deadline = now + self.hold_timeout
        self.started = now
        return [(i, ipc_frames.snap_frames(self.epoch, self.cut_id, self.tmp, self.hold, self.group))
                for i in range(self.workers)]

    def _set_point(self, trans_id: int, term_at: TermAt) -> None:
        self.trans_id = trans_id
        self.term = term_at(trans_id)

    # ----------------------------------------------------------------- the workers' answers
    def on_synced(self, epoch: int, cut_id: int, index: int, now: float) -> list[tuple[int, list[bytes]]]:
        """Worker `index` has handled everything sent before the SYNC; once every worker has,
        the SNAPs go (and the hold's deadline starts)."""
        if not self.running or cut_id != self.cut_id or epoch != self.epoch or self.syncing is None:
            return []
        self.syncing.add(index)
        if len(self.syncing) < self.workers:
            return []
        self.syncing = None
        return self._snaps(now)

    def on_snapped(self, epoch: int, cut_id: int, index: int, last_logged: int,
                   term_at: TermAt, now: float) -> list[tuple[int, list[bytes]]]:
        """Worker `index` forked (in mode `epoch`). Once every worker has, T is the last logged
        trans_id and the workers stop holding."""
        if not self.running or cut_id != self.cut_id or epoch != self.epoch or self.syncing is not None:
            return []
        self.snapped.add(index)
        if len(self.snapped) < self.workers or self.trans_id is not None:
            return []
        self._set_point(last_logged, term_at)
        self.held = now - self.started
        return self._releases()

    def on_part_done(self, cut_id: int, index: int, ok: bool, part: dict | None) -> list[tuple[int, list[bytes]]]:
        """Worker `index`'s part of cut `cut_id` is written (ok) or is not."""
        if not self.running or cut_id != self.cut_id:
            gone = self.abandoned.get(cut_id)
            if gone is not None:
                self.done.append(Clear(gone[0]))
                gone[1] -= 1
                if gone[1] == 0:
                    del self.abandoned[cut_id]
            return []
        if not ok or part is None:
            why = part.get("error") if isinstance(part, dict) else None
            return self.abort(f"worker {index} could not write its part" + (f": {why}" if why else ""))
        self.parts[index] = part
        return []

    def poll(self, now: float | None, commit: int, term_at: TermAt) -> list[tuple[int, list[bytes]]]:
        """Time (None: not known, no timeout then) or the commit point moved: end a hold that took
        too long; publish a cut whose parts are all written once its T is committed with the term
        it had."""
        if not self.running:
            return []
        if self.trans_id is None:
            if now is not None and self.syncing is None and now >= self.deadline:
                releases = self.abort(f"not every worker forked within {self.hold_timeout:g} s")
                if not self.urgent:
                    self.retry_at = now + min(RETRY_AFTER * 2 ** self.timeouts, RETRY_MAX)
                self.timeouts += 1
                return releases
            return []
        if not self.committed and commit >= self.trans_id:
            if term_at(self.trans_id) != self.term:
                return self.abort(f"the log at trans_id {self.trans_id} was replaced before it was committed")
            self.committed = True
        if self.committed and len(self.parts) == self.workers:
            self.done.append(Publish(self.trans_id, self.term or 0, self.tmp,
                                     tuple(self.parts[i] for i in range(self.workers)), self.held,
                                     now - self.started if now is not None else 0.0))
            self.urgent = False
            self.timeouts = 0
            self._reset()
        return []

    def abort(self, reason: str) -> list[tuple[int, list[bytes]]]:
        """End the running cut unpublished (a mode change, a timeout, a failed part)."""
        if not self.running:
            return []
        syncing = self.syncing is not None  # no SNAP sent: no writer, nothing held
        releases = self._releases() if self.hold and self.trans_id is None and not syncing else []
        self.done.append(Failed(self.trans_id, self.tmp, reason))
        if len(self.parts) < self.workers and not syncing:
            self.abandoned[self.cut_id] = [self.tmp, self.workers - len(self.parts)]
        self.aborts += 1
        if self.urgent:
            self.retry_at = self.started + RETRY_AFTER
        self._reset()
        return releases

    def _releases(self) -> list[tuple[int, list[bytes]]]:
        return [(i, ipc_frames.release_frames(self.cut_id, self.group)) for i in range(self.workers)]

    @property
    def writing(self) -> bool:
        """A cut's T is set and its parts are being written (or wait for T's commit)."""
        return self.running and self.trans_id is not None

    def wake_at(self) -> float:
        """When poll() next has something to do on its own (the hold's deadline)."""
        if self.running and self.trans_id is None and self.syncing is None:
            return self.deadline
        return float("inf")

    def take_done(self) -> list[Publish | Failed | Clear]:
        """What to carry out on disk since the last call."""
        taken, self.done = self.done, []
        return taken
