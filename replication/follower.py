"""Follower side of replication: take the leader's pushes, pull when behind, commit.

Pure logic. Feed it only messages of the current term from the current leader (the election
decides who that is). It returns actions (replication/messages.py).
"""

from __future__ import annotations

from queue_server.election.messages import Heartbeat, Send
from queue_server.replication.log import ChangeLog
from queue_server.replication.messages import (
    AppendAck,
    AppendEntries,
    ApplySnapshot,
    Commit,
    Discarded,
    InstallSnapshot,
    Pull,
    SnapshotAck,
    SnapshotChunk,
    SnapshotStaged,
    WriteChunk,
)
from queue_server.replication.transfer import MANIFEST, SnapshotReceive

Action = Send | Commit | Discarded | ApplySnapshot | WriteChunk | SnapshotStaged


class Follower:
    """A follower's view of replication from the leader of one term."""

    def __init__(self, node_id: int, log: ChangeLog, *, pull_interval: float = 0.1) -> None:
        """pull_interval: at least this long between two pulls from the same log position."""
        self.node_id = node_id
        self.log = log
        self.pull_interval = pull_interval
        self._pulled: tuple[int, int, float] | None = None  # (trans_id, vote_id, when)
        self._match = 0  # the highest position acked to this leader
        self._prev_hb: Heartbeat | None = None
        self._progress_at_hb: tuple[int, int] = (-1, -1)  # (last_trans_id, _match) then
        self.receiving: SnapshotReceive | None = None  # a snapshot being streamed from the leader
        self._on = {AppendEntries: self.on_append, Heartbeat: self.on_heartbeat, InstallSnapshot: self.on_snapshot,
                    SnapshotChunk: self.on_snapshot_chunk}

    def on_message(self, msg: object, now: float) -> list[Action]:
        """Dispatch AppendEntries, Heartbeat, InstallSnapshot and SnapshotChunk; others are ignored."""
        on = self._on.get(type(msg))
        return [] if on is None else on(msg, now)

    def on_append(self, m: AppendEntries, now: float) -> list[Action]:
        """Accept entries that continue the log (dropping a conflicting uncommitted suffix),
        ack the matched position and commit up to the leader's commit; else pull."""
        log = self.log
        actions: list[Action] = []
        if not _well_formed(m):
            return actions
        if m.prev_trans_id > log.last_trans_id or (
                m.prev_trans_id >= log.commit_trans_id and log.term_at(m.prev_trans_id) != m.prev_vote_id):
            self._pull(m.src, m.vote_id, self._restart_point(m.prev_trans_id, m.prev_vote_id), now, actions)
            return actions
        for e in m.entries:
            if e.trans_id > log.last_trans_id:
                break
            if e.trans_id > log.commit_trans_id and log.term_at(e.trans_id) != e.vote_id:
                actions.append(Discarded(tuple(log.truncate_after(e.trans_id - 1))))
                break
        accepted = log.accept(m.prev_trans_id, m.prev_vote_id, m.entries)
        assert accepted
        match = max(m.prev_trans_id + len(m.entries), log.commit_trans_id)
        self._match = max(self._match, match)
        self._commit(min(m.commit_trans_id, match), actions)
        actions.append(Send(m.src, AppendAck(m.vote_id, self.node_id, match)))
        return actions

    def on_heartbeat(self, m: Heartbeat, now: float) -> list[Action]:
        """Commit what the leader committed if this log holds the same entry there. Pull if this
        log conflicts with the leader's at its commit point, or lacks committed entries, or lacks
        what the leader had at the previous heartbeat and made no progress since (lost pushes).
        (The election answers the heartbeat itself.)"""
        log = self.log
        actions: list[Action] = []
        term = log.term_at(m.commit_trans_id)
        if term == m.commit_vote_id:
            self._commit(m.commit_trans_id, actions)
        progress = (log.last_trans_id, self._match)
        if term is not None and term != m.commit_vote_id and m.commit_trans_id > log.commit_trans_id:
            self._pull(m.src, m.vote_id, self._restart_point(m.commit_trans_id, m.commit_vote_id), now, actions)
        elif m.commit_trans_id > log.last_trans_id or (
                self._prev_hb is not None and progress == self._progress_at_hb
                and log.term_at(self._prev_hb.last_trans_id) != self._prev_hb.last_vote_id):
            self._pull(m.src, m.vote_id, (log.last_trans_id, log.last_vote_id), now, actions)
        self._prev_hb = m
        self._progress_at_hb = progress
        return actions

    def on_snapshot(self, m: InstallSnapshot, now: float) -> list[Action]:
        """Take the state at a committed point of the leader's log and ack it. When this log
        already holds that entry nothing is replaced: it only commits up to there."""
        log = self.log
        actions: list[Action] = []
        if m.trans_id > log.commit_trans_id:
            if log.term_at(m.trans_id) == m.trans_vote_id:
                self._commit(m.trans_id, actions)
            else:
                log.reset(m.trans_id, m.trans_vote_id)
                actions.append(ApplySnapshot(m.trans_id, m.trans_vote_id, m.data))
        self._pulled = None
        match = max(m.trans_id, log.commit_trans_id)
        self._match = max(self._match, match)
        actions.append(Send(m.src, AppendAck(m.vote_id, self.node_id, match)))
        return actions

    def on_snapshot_chunk(self, m: SnapshotChunk, now: float) -> list[Action]:
        """A chunk of the leader's snapshot on disk: write it (WriteChunk, before the SnapshotAck
        that follows), and once every file is written have it checked and installed
        (SnapshotStaged; then installed()). A chunk of another snapshot than the one being
        received starts again from its beginning. When this log already holds the snapshot's
        point it only commits up to there and acks it, as on_snapshot does."""
        log = self.log
        actions: list[Action] = []
        if m.trans_id <= log.commit_trans_id or log.term_at(m.trans_id) == m.trans_vote_id:
            return self.on_snapshot(m, now)  # nothing to replace
        recv = self.receiving
        if recv is None or (recv.trans_id, recv.vote_id) != (m.trans_id, m.trans_vote_id):
            if (m.part, m.offset) != (MANIFEST, 0):
                actions.append(Send(m.src, SnapshotAck(m.vote_id, self.node_id, m.trans_id, MANIFEST, 0)))
                return actions  # from the start, please
            recv = self.receiving = SnapshotReceive(m.trans_id, m.trans_vote_id)
        if recv.take(m):
            actions.append(WriteChunk(m.trans_id, m.part, m.offset, m.data))  # type: ignore[arg-type]
        actions.append(Send(m.src, SnapshotAck(m.vote_id, self.node_id, m.trans_id, *recv.at)))
        if recv.complete:
            self.receiving = None
            actions.append(SnapshotStaged(recv.trans_id, recv.vote_id, recv.manifest))  # type: ignore[arg-type]
        self._pulled = None
        return actions

    def installed(self, trans_id: int, vote_id: int, leader_id: int | None, term: int) -> list[Action]:
        """The snapshot at (trans_id, vote_id) is checked and installed (the node's state and
        disk hold it): the log restarts after it; the leader `leader_id` of term `term` hears
        so (AppendAck). Nothing is done if the log holds that point committed already."""
        log = self.log
        actions: list[Action] = []
        if trans_id <= log.commit_trans_id:
            return actions
        log.reset(trans_id, vote_id)
        self._pulled = None
        self._match = max(self._match, trans_id)
        if leader_id is not None:
            actions.append(Send(leader_id, AppendAck(term, self.node_id, trans_id)))
        return actions

    def reset(self) -> None:
        """Forget per-leader state (call when the leader or term changes)."""
        self._pulled = None
        self._match = 0
        self._prev_hb = None
        self._progress_at_hb = (-1, -1)

    def pull(self, leader_id: int, vote_id: int, now: float) -> list[Action]:
        """Ask the leader for what follows this log's last entry."""
        actions: list[Action] = []
        self._pull(leader_id, vote_id, (self.log.last_trans_id, self.log.last_vote_id), now, actions)
        return actions

    # ----------------------------------------------------------------- helpers

    def _restart_point(self, trans_id: int, vote_id: int) -> tuple[int, int]:
        """Where to pull from when the leader's entry (trans_id, vote_id) is not ours: the last
        entry at or before it whose vote_id is at most vote_id (a later one, or one of a newer
        term, cannot be the leader's), but not before the commit point."""
        log = self.log
        i = min(trans_id, log.last_trans_id)
        while i > log.commit_trans_id and log.term_at(i) > vote_id:
            i -= 1
        return i, log.term_at(i)

    def _pull(self, leader_id: int, vote_id: int, at: tuple[int, int], now: float,
              actions: list[Action]) -> None:
        if self._pulled is not None and self._pulled[:2] == at and now - self._pulled[2] < self.pull_interval:
            return
        self._pulled = (*at, now)
        actions.append(Send(leader_id, Pull(vote_id, self.node_id, at[0], at[1], self.log.commit_trans_id)))

    def _commit(self, trans_id: int, actions: list[Action]) -> None:
        log = self.log
        before = log.commit_trans_id
        target = min(trans_id, log.last_trans_id)
        if target > before:
            entries = tuple(log.entries_after(before, target - before) or ())
            log.commit_to(target)
            actions.append(Commit(target, entries))


def _well_formed(m: AppendEntries) -> bool:
    """Consecutive trans_ids after prev, vote_ids never decreasing (what ChangeLog.accept needs)."""
    vote_id = m.prev_vote_id
    for i, e in enumerate(m.entries):
        if e.trans_id != m.prev_trans_id + 1 + i or e.vote_id < vote_id:
            return False
        vote_id = e.vote_id
    return True
