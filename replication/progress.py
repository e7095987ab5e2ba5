"""Leader side of replication: what each follower holds, what to send it, what is committed.

Pure logic (time is an argument). One LeaderReplication lives for one term of leadership: make it
on BecomeLeader, drop it on BecomeFollower. Each follower is in one of three states:

* PROBE: where the follower's log matches ours is being found out or it is catching up; one
  AppendEntries batch at a time, each answered before the next, paced by the catch-up rate limit
  (queue_sync_rate records/s, one token bucket for the whole leader).
* REPLICATE: the follower is up to date; new entries are pushed as they are appended, up to
  max_inflight unanswered pushes, with no rate limit.
* A PROBE follower behind the log but not behind the WAL (`wal_from`, which the node keeps up to
  date) gets its next batch read from disk: a ReadLog action, answered by on_log_read (still
  one batch at a time, paced by the same token bucket); unless it is more than
  Flow.snapshot_over records behind the newest snapshot on disk: it gets that first.
* SNAPSHOT: it needs entries older than the log and the WAL keep. With a snapshot on disk whose
  point the log or the WAL still follows (`source`), the leader streams its files in chunks
  (replication/transfer.py SnapshotSend: a window of chunks, SnapshotAck answers); otherwise a
  SendSnapshot action is returned (the node makes one: an InstallSnapshot from memory, or a cut
  on disk that comes back as set_source). Either way the leader waits for the follower's AppendAck of the snapshot's
  point; with no progress for snapshot_timeout it starts again. A snapshot whose files can no
  longer be read (on_snapshot_unreadable) is given up at once: its transfers start again from the
  newest snapshot, or from a new cut.

Commit (Raft's rule): the highest trans_id held by a majority of the cluster, leader included,
whose entry was written in the leader's own term.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from queue_server.election.membership import membership
from queue_server.election.messages import HeartbeatAck, Send
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import (
    AppendAck, AppendEntries, Commit, Pull, ReadLog, SendSnapshot, SnapshotAck,
)
from queue_server.replication.transfer import CHUNK, WINDOW, SnapshotSend, SnapshotSource

Action = Send | Commit | SendSnapshot | ReadLog


class FollowerState(str, Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


@dataclass(slots=True)
class Progress:
    """The leader's view of one follower."""

    match_trans_id: int = 0  # the follower's log is known to equal ours up to here
    next_trans_id: int = 1  # the next entry to send it
    state: FollowerState = FollowerState.PROBE
    inflight: deque = field(default_factory=deque)  # REPLICATE: last trans_id of each unacked push
    probe_prev: int = 0  # PROBE: prev_trans_id of the batch awaiting an answer
    probe_end: int | None = None  # PROBE: last trans_id of that batch (None: no batch out)
    sent_at: float = float("-inf")  # PROBE / SNAPSHOT: when the batch or snapshot went out (or last moved on)
    transfer: SnapshotSend | None = None  # SNAPSHOT: the files being streamed to it
    waiting: bool = True  # PROBE: a batch is due (not sent yet, or held back by the rate limit)
    reading: bool = False  # PROBE: a ReadLog for its next batch is out (answered by on_log_read)


class TokenBucket:
    """rate tokens per second, holding at most `burst`. rate <= 0: unlimited."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.tokens = self.burst
        self.stamp = now

    def available(self, now: float) -> int:
        """Whole tokens available at `now`."""
        if self.rate <= 0:
            return 1 << 62
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return int(self.tokens)

    def take(self, n: int) -> None:
        if self.rate > 0:
            self.tokens -= n


@dataclass(frozen=True, slots=True)
class Flow:
    """How fast a leader feeds its followers. max_batch: entries per AppendEntries; max_inflight:
    batches unanswered per follower; sync_rate: catch-up entries per second (queue_sync_rate, <= 0
    for unlimited); resend_interval: a catch-up batch unanswered this long is sent again;
    snapshot_timeout: a snapshot transfer that made no progress this long starts again;
    chunk_bytes, chunk_window: a streamed snapshot's chunk size and how many may be unacked;
    chunk_resend: the oldest unacked chunk waits this long before the window is sent again;
    read_bytes: how much one batch read from the WAL (ReadLog) may take; snapshot_over: a
    follower more records than this behind the newest snapshot on disk gets that snapshot (then
    the log or the WAL after it) rather than that many records read from the WAL."""

    max_batch: int = 1000
    max_inflight: int = 64
    sync_rate: float = 3000.0
    resend_interval: float = 0.5
    snapshot_timeout: float = 10.0
    chunk_bytes: int = CHUNK
    chunk_window: int = WINDOW
    chunk_resend: float = 2.0
    read_bytes: int = 1 << 20
    snapshot_over: int = 100_000


class LeaderReplication:
    """Replication from this node, the leader of term vote_id, to its followers."""

    def __init__(self, node_id: int, members: Iterable[int], log: ChangeLog, vote_id: int, now: float,
                 flow: Flow = Flow(), source: SnapshotSource | None = None, wal_from: int | None = None) -> None:
        """members: the whole cluster; source: the newest snapshot on this node's disk (None:
        none, or no disk); wal_from: the oldest prev_trans_id a batch can be read from the WAL
        with (None: no WAL)."""
        self.node_id = node_id
        self.members, peers, self.quorum = membership(node_id, members)
        self.log = log
        self.vote_id = vote_id
        self.flow = flow
        self.bucket = TokenBucket(flow.sync_rate, max(flow.sync_rate, flow.max_batch), now)
        self.progress: dict[int, Progress] = {
            p: Progress(next_trans_id=log.last_trans_id + 1) for p in peers
        }
        self.source = source
        self.wal_from = wal_from  # the node moves it on as log segments are removed
        self._on = {AppendAck: self.on_ack, Pull: self.on_pull, HeartbeatAck: self.on_heartbeat_ack,
                    SnapshotAck: self.on_snapshot_ack}
        self._last_batch: AppendEntries | None = None  # the last one built (see _batch)

    # ----------------------------------------------------------------- inputs

    def replicate(self, now: float) -> list[Action]:
        """Send what is new in the log (call after log.append). Commits at once in a cluster of
        one."""
        actions: list[Action] = []
        for peer, pr in self.progress.items():
            self._send(peer, pr, now, actions)
        self._maybe_commit(actions)
        return actions

    def tick(self, now: float) -> list[Action]:
        """Send catch-up batches the rate limit held back, and again what went unanswered."""
        actions: list[Action] = []
        for peer, pr in self.progress.items():
            if pr.state is FollowerState.PROBE:
                if (pr.probe_end is not None or pr.reading) and now - pr.sent_at >= self.flow.resend_interval:
                    self._probe(pr, max(pr.probe_prev, pr.match_trans_id))
                if pr.waiting:
                    self._send(peer, pr, now, actions)
            elif pr.state is FollowerState.SNAPSHOT:
                if now - pr.sent_at >= self.flow.snapshot_timeout:
                    self._probe(pr, pr.match_trans_id)
                    self._send(peer, pr, now, actions)
                elif pr.transfer is not None and pr.transfer.tick(now):
                    actions.extend(self._chunks(peer, pr, now))
        return actions

    def set_source(self, source: SnapshotSource, now: float) -> list[Action]:
        """A newer snapshot is on disk: stream it to the followers that wait for one."""
        self.source = source
        actions: list[Action] = []
        for peer, pr in self.progress.items():
            if pr.state is FollowerState.SNAPSHOT and pr.transfer is None:
                self._snapshot(peer, pr, now, actions)
        return actions

    def on_snapshot_unreadable(self, trans_id: int, now: float) -> list[Action]:
        """The files of the snapshot at trans_id can no longer be read (gone from the disk): the
        transfers streaming it are abandoned and start again from the newest snapshot, or, when
        that is the one lost, from a new cut (SendSnapshot)."""
        if self.source is not None and self.source.trans_id == trans_id:
            self.source = None
        actions: list[Action] = []
        for peer, pr in self.progress.items():
            if (pr.state is FollowerState.SNAPSHOT and pr.transfer is not None
                    and pr.transfer.source.trans_id == trans_id):
                self._snapshot(peer, pr, now, actions)
        return actions

    def streaming(self) -> list[SnapshotSource]:
        """The snapshots being streamed to followers now (their files must stay readable)."""
        return [pr.transfer.source for pr in self.progress.values()
                if pr.state is FollowerState.SNAPSHOT and pr.transfer is not None]

    def on_snapshot_ack(self, m: SnapshotAck, now: float) -> list[Action]:
        """The follower wrote the streamed snapshot up to (m.part, m.offset): send what the
        window lets out."""
        pr = self.progress[m.src]
        transfer = pr.transfer
        if pr.state is not FollowerState.SNAPSHOT or transfer is None or transfer.source.trans_id != m.trans_id:
            return []
        if transfer.on_ack(m.part, m.offset):
            pr.sent_at = now
        return self._chunks(m.src, pr, now)

    def on_log_read(self, peer: int, after: int, frames: list[tuple[int, int, bytes]],
                    now: float) -> list[Action]:
        """The WAL's frames a ReadLog asked for: (trans_id, vote_id, record JSON) from `after`
        (its own frame first, for its vote_id; none for 0) on. Sends them as the follower's next
        batch; a read that no longer fits (answered late, or cut short) is dropped, and the
        follower is probed again."""
        pr = self.progress.get(peer)
        if pr is None or pr.state is not FollowerState.PROBE or not pr.reading or pr.next_trans_id != after + 1:
            return []
        pr.reading = False
        actions: list[Action] = []
        if frames and frames[0][0] == after:
            prev_vote = frames[0][1]
            frames = frames[1:]
        elif after == 0:
            prev_vote = 0
        else:
            prev_vote = None
        if prev_vote is None or not frames or any(f[0] != after + i for i, f in enumerate(frames, 1)):
            return self._snapshot_actions(peer, pr, now)
        batch = AppendEntries(self.vote_id, self.node_id, after, prev_vote,
                              tuple(Entry(t, v, None, data) for t, v, data in frames), self.log.commit_trans_id)
        self._sent_probe(pr, batch, now)
        actions.append(Send(peer, batch))
        return actions

    def on_log_unreadable(self, peer: int, now: float) -> list[Action]:
        """The WAL could not be read for this follower: send it a snapshot instead."""
        pr = self.progress.get(peer)
        if pr is None or pr.state is not FollowerState.PROBE:
            return []
        pr.reading = False
        return self._snapshot_actions(peer, pr, now)

    def on_message(self, msg: object, now: float) -> list[Action]:
        """Dispatch AppendAck, Pull and HeartbeatAck of this term; others are ignored."""
        if getattr(msg, "vote_id", None) != self.vote_id or msg.src not in self.progress:
            return []
        on = self._on.get(type(msg))
        return [] if on is None else on(msg, now)

    def on_ack(self, m: AppendAck, now: float) -> list[Action]:
        """The follower holds our log up to m.match_trans_id: advance it, commit, send more."""
        pr = self.progress[m.src]
        actions: list[Action] = []
        self._advance(m.src, pr, m.match_trans_id, now, actions)
        return actions

    def on_pull(self, m: Pull, now: float) -> list[Action]:
        """The follower wants what follows its last entry: find where its log matches ours and
        send batches from there (or a snapshot)."""
        pr = self.progress[m.src]
        actions: list[Action] = []
        if pr.state is FollowerState.SNAPSHOT and now - pr.sent_at < self.flow.snapshot_timeout:
            return actions
        log = self.log
        if m.commit_trans_id > log.last_trans_id:
            return actions  # it claims more committed entries than we have: a stale message
        if m.last_trans_id <= log.last_trans_id and log.term_at(m.last_trans_id) == m.last_vote_id:
            start = verified = m.last_trans_id  # log matching: equal up to there
        else:
            # Equal up to its commit point. Probe from our last entry at or before its position
            # that is no newer than its entry there (a newer one cannot be in its log).
            verified = m.commit_trans_id
            start = min(m.last_trans_id, log.last_trans_id)
            while start > verified and (log.term_at(start) or 0) > m.last_vote_id:
                start -= 1
        # Trust what the follower says it has now, even below an earlier match: a node may have
        # lost the unsynced tail of its log in a crash. A lower match only delays commits.
        pr.match_trans_id = verified
        if (pr.state is FollowerState.PROBE and (pr.probe_end is not None or pr.reading) and pr.probe_prev == start
                and now - pr.sent_at < self.flow.resend_interval):
            return actions  # that batch is on its way
        self._probe(pr, start)
        self._send(m.src, pr, now, actions)
        self._maybe_commit(actions)
        return actions

    def on_heartbeat_ack(self, m: HeartbeatAck, now: float) -> list[Action]:
        """A heartbeat answer tells where the follower's log ends: if that entry is ours, the
        follower matches up to there (covers lost acks)."""
        pr = self.progress[m.src]
        actions: list[Action] = []
        log = self.log
        if (m.last_trans_id > pr.match_trans_id and m.last_trans_id <= log.last_trans_id
                and log.term_at(m.last_trans_id) == m.last_vote_id):
            self._advance(m.src, pr, m.last_trans_id, now, actions)
        return actions

    # ----------------------------------------------------------------- state

    @property
    def commit_trans_id(self) -> int:
        return self.log.commit_trans_id

    def match_of(self, peer: int) -> int:
        return self.progress[peer].match_trans_id

    # ----------------------------------------------------------------- internals

    def _advance(self, peer: int, pr: Progress, match: int, now: float, actions: list[Action]) -> None:
        """The follower holds our log up to `match`: move on, send more, commit."""
        self._matched(pr, match)
        if pr.state is FollowerState.SNAPSHOT:
            if match >= self.log.base_trans_id or (self.wal_from is not None and match >= self.wal_from):
                self._probe(pr, match)
            elif pr.transfer is not None and match >= pr.transfer.source.trans_id:
                # It installed that snapshot, but the log moved past it meanwhile: the next one now,
                # not after snapshot_timeout.
                self._snapshot(peer, pr, now, actions)
                return
        elif pr.state is FollowerState.PROBE and pr.probe_end is not None and match >= pr.probe_end:
            pr.probe_end = None
            pr.waiting = True
        self._send(peer, pr, now, actions)
        self._maybe_commit(actions)

    def _probe(self, pr: Progress, after: int) -> None:
        """Restart catch-up for this follower from entry after+1."""
        pr.state = FollowerState.PROBE
        pr.transfer = None
        pr.next_trans_id = after + 1
        pr.inflight.clear()
        pr.probe_end = None
        pr.waiting = True
        pr.reading = False

    def _matched(self, pr: Progress, match: int) -> None:
        pr.match_trans_id = max(pr.match_trans_id, match)
        if pr.next_trans_id <= match:
            pr.next_trans_id = match + 1
        while pr.inflight and pr.inflight[0] <= pr.match_trans_id:
            pr.inflight.popleft()

    def _send(self, peer: int, pr: Progress, now: float, actions: list[Action]) -> None:
        """Send this follower whatever its state allows."""
        log = self.log
        if pr.state is FollowerState.SNAPSHOT:
            return
        if pr.state is FollowerState.PROBE:
            if pr.probe_end is not None or pr.reading:
                return  # a batch is out (or being read): wait for its answer
            if pr.next_trans_id > log.last_trans_id and pr.match_trans_id >= pr.next_trans_id - 1:
                pr.state = FollowerState.REPLICATE  # known to hold all we have: push from now on
                pr.waiting = False
                return
            if not pr.waiting:
                return
            limit = min(self.flow.max_batch, self.bucket.available(now))
            if limit <= 0 and pr.next_trans_id <= log.last_trans_id:
                pr.waiting = True
                return
            batch = self._batch(peer, pr, limit, actions, now)
            if batch is None:
                return
            self._sent_probe(pr, batch, now)
            actions.append(Send(peer, batch))
            return
        # REPLICATE
        while pr.next_trans_id <= log.last_trans_id and len(pr.inflight) < self.flow.max_inflight:
            batch = self._batch(peer, pr, self.flow.max_batch, actions, now)
            if batch is None or not batch.entries:
                return
            end = batch.prev_trans_id + len(batch.entries)
            pr.inflight.append(end)
            pr.next_trans_id = end + 1
            actions.append(Send(peer, batch))

    def _sent_probe(self, pr: Progress, batch: AppendEntries, now: float) -> None:
        """A PROBE follower's batch goes out: wait for its answer."""
        self.bucket.take(len(batch.entries))
        pr.waiting = False
        pr.probe_prev = batch.prev_trans_id
        pr.probe_end = batch.prev_trans_id + len(batch.entries)
        pr.sent_at = now
        pr.next_trans_id = pr.probe_end + 1

    def _batch(self, peer: int, pr: Progress, limit: int, actions: list[Action], now: float) -> AppendEntries | None:
        """The AppendEntries from pr.next_trans_id, or None after asking for a WAL read
        (ReadLog) or switching to SNAPSHOT. Followers
        at the same place get the same object, so that it is encoded once for all of them."""
        prev = pr.next_trans_id - 1
        log = self.log
        last = self._last_batch
        # A leader's log is only appended to in its term: same start, size and commit point,
        # same batch.
        if (last is not None and last.prev_trans_id == prev >= log.base_trans_id
                and last.commit_trans_id == log.commit_trans_id
                and len(last.entries) == min(limit, log.last_trans_id - prev)):
            return last
        entries = log.entries_after(prev, limit)
        prev_vote = log.term_at(prev)
        if entries is None or prev_vote is None:
            wal_from = self.wal_from
            source = self.source
            if (wal_from is not None and prev >= wal_from
                    and (source is None or source.trans_id - prev <= self.flow.snapshot_over
                         or not self._continues(source.trans_id))):
                if pr.state is not FollowerState.PROBE:
                    self._probe(pr, prev)  # a pushed-to follower the log left behind
                pr.reading = True  # _send sends nothing more until on_log_read
                pr.probe_prev = prev
                pr.waiting = False
                pr.sent_at = now
                actions.append(ReadLog(peer, prev, max(1, limit), self.flow.read_bytes))
                return None
            actions.extend(self._snapshot_actions(peer, pr, now))
            return None
        self._last_batch = AppendEntries(self.vote_id, self.node_id, prev, prev_vote, tuple(entries),
                                         log.commit_trans_id)
        return self._last_batch

    def _snapshot_actions(self, peer: int, pr: Progress, now: float) -> list[Action]:
        """Switch this follower to SNAPSHOT and start sending it one."""
        pr.state = FollowerState.SNAPSHOT
        pr.inflight.clear()
        pr.probe_end = None
        pr.waiting = False
        pr.reading = False
        actions: list[Action] = []
        self._snapshot(peer, pr, now, actions)
        return actions

    def _snapshot(self, peer: int, pr: Progress, now: float, actions: list[Action]) -> None:
        """Start sending this follower a snapshot: the one on disk if the log or the WAL follows
        its point, else ask the node for one (SendSnapshot)."""
        pr.sent_at = now
        source = self.source
        if source is None or not self._continues(source.trans_id):
            pr.transfer = None
            actions.append(SendSnapshot(peer))
            return
        flow = self.flow
        pr.transfer = SnapshotSend(source, chunk=flow.chunk_bytes, window=flow.chunk_window,
                                   resend_after=flow.chunk_resend)
        actions.extend(self._chunks(peer, pr, now))

    def _continues(self, trans_id: int) -> bool:
        """Whether a follower at trans_id can go on from the log or the WAL."""
        return trans_id >= self.log.base_trans_id or (self.wal_from is not None and trans_id >= self.wal_from)

    def _chunks(self, peer: int, pr: Progress, now: float) -> list[Action]:
        assert pr.transfer is not None
        return [Send(peer, c) for c in pr.transfer.chunks(self.vote_id, self.node_id, now)]

    def _maybe_commit(self, actions: list[Action]) -> None:
        log = self.log
        matches = sorted([log.last_trans_id] + [pr.match_trans_id for pr in self.progress.values()],
                         reverse=True)
        candidate = matches[self.quorum - 1]  # a cluster of one: its own last entry
        before = log.commit_trans_id
        if candidate > before and log.term_at(candidate) == self.vote_id:
            entries = tuple(log.entries_after(before, candidate - before) or ())
            log.commit_to(candidate)
            actions.append(Commit(candidate, entries))
