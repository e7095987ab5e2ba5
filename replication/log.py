"""The change log: an in-memory window of records with consecutive trans_ids.

Every entry carries the vote_id (election term) of the leader that wrote it. The log keeps at
most ``capacity`` entries; the oldest fall off the front once they are committed. Uncommitted
entries are never dropped from the front, so the log may hold more than ``capacity`` entries
while a commit is pending. A node that needs entries older than the window gets a snapshot.

Pure logic: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

from queue_server.protocol.records import Encoded, Record, encode

# Drop the dead head of the backing list once it is at least this long and half the list.
_COMPACT_MIN = 1024
# The newest entries that keep their record's bytes by default (ChangeLog keep_bytes).
KEEP_BYTES = 8192


@dataclass(slots=True)
class Entry:
    """One change-log record with its position and the term it was written in; `data`, when
    known, is the record's JSON as the worker (or the leader, or the disk) gave it, which goes to
    disk and to peers as it is."""

    trans_id: int
    vote_id: int
    record: Record
    data: Encoded | None = field(default=None, compare=False, repr=False)

    def encoded(self) -> Encoded:
        """The record's JSON (records.encode's bytes)."""
        data = self.data
        return encode(self.record) if data is None else data


class ChangeLog:
    """The change log: records with strictly increasing trans_ids, bounded to `capacity` entries
    kept in memory (older fall off the front)."""

    def __init__(self, capacity: int, last_trans_id: int = 0, last_vote_id: int = 0, *,
                 keep_bytes: int = KEEP_BYTES) -> None:
        """An empty log that starts after a snapshot at (last_trans_id, last_vote_id).
        keep_bytes: how many of the newest entries keep their record's bytes (Entry.data; up to a
        32nd more, shed in runs); an
        older entry's bytes are encoded again if it is read, which only a follower that fell
        behind, or a disk write that fell behind, asks for."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if last_trans_id < 0 or last_vote_id < 0:
            raise ValueError("trans_id and vote_id must not be negative")
        self.capacity = capacity
        self._entries: list[Entry] = []
        self._head = 0  # index in _entries of the oldest kept entry
        self._base_trans_id = last_trans_id
        self._base_vote_id = last_vote_id
        self._commit = last_trans_id
        # Where the log ends, kept by _ended after every change (read several times per batch).
        self._last_trans_id = last_trans_id
        self._last_vote_id = last_vote_id
        self.keep_bytes = keep_bytes
        self._shed_run = max(1, keep_bytes // 32)  # shed in runs: not a call per append
        self._bytes_from = last_trans_id + 1  # entries from here on may still hold their bytes

    # ----------------------------------------------------------------- positions

    last_trans_id = property(attrgetter("_last_trans_id"),
                             doc="int: trans_id of the last entry, or of the base when empty")
    last_vote_id = property(attrgetter("_last_vote_id"),
                            doc="int: vote_id of the last entry, or of the base when empty")

    @property
    def first_trans_id(self) -> int:
        """trans_id of the oldest kept entry (base + 1 when empty)."""
        return self._base_trans_id + 1

    base_trans_id = property(attrgetter("_base_trans_id"),
                             doc="int: trans_id before the oldest kept entry (the snapshot point, or the last dropped)")
    base_vote_id = property(attrgetter("_base_vote_id"), doc="int: vote_id of the entry at base_trans_id")
    commit_trans_id = property(attrgetter("_commit"), doc="int: the highest committed trans_id")

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def term_at(self, trans_id: int) -> int | None:
        """vote_id of the entry at trans_id (or of the base), None if not kept."""
        if trans_id == self._base_trans_id:
            return self._base_vote_id
        entry = self._get(trans_id)
        return None if entry is None else entry.vote_id

    def entry_at(self, trans_id: int) -> Entry | None:
        """The kept entry at trans_id, or None."""
        return self._get(trans_id)

    def entries_after(self, trans_id: int, limit: int) -> list[Entry] | None:
        """Up to `limit` entries following trans_id; None when trans_id is older than the window
        (the caller must send a snapshot). Empty when trans_id is at or past the last entry."""
        if trans_id < self._base_trans_id:
            return None
        if limit <= 0 or trans_id >= self.last_trans_id:
            return []
        start = self._head + (trans_id - self._base_trans_id)
        return self._entries[start:start + limit]

    # ----------------------------------------------------------------- changes

    def append(self, vote_id: int, records: list[Record],
               encoded: Sequence[Encoded] | None = None) -> tuple[int, int]:
        """Leader: give records the next trans_ids in term vote_id; returns (first, last).
        encoded: each record's JSON, when the caller has it (see Entry.data).

        With no records returns (last + 1, last)."""
        if vote_id < self.last_vote_id:
            raise ValueError(f"vote_id {vote_id} is below the log's last vote_id {self.last_vote_id}")
        n = len(records)
        if encoded is not None and len(encoded) != n:
            raise ValueError("records and their encodings differ in number")
        first = self.last_trans_id + 1
        self._entries.extend(map(Entry, range(first, first + n), repeat(vote_id, n), records,
                                 repeat(None, n) if encoded is None else encoded))
        self._ended()
        self._evict()
        return first, first + n - 1

    def commit_to(self, trans_id: int) -> None:
        """Mark everything up to trans_id committed; never moves back, never past the last entry."""
        target = min(trans_id, self.last_trans_id)
        if target > self._commit:
            self._commit = target
            self._evict()

    def accept(self, prev_trans_id: int, prev_vote_id: int, entries: Sequence[Entry]) -> bool:
        """Follower: take entries that follow (prev_trans_id, prev_vote_id) in the leader's log.

        False (nothing changes) if this log has no entry matching prev: the caller should pull.
        Entries already held are kept; at the first conflicting one the (uncommitted) suffix from
        there is dropped and the rest appended. Entries must be consecutive after prev_trans_id."""
        for i, entry in enumerate(entries):
            if entry.trans_id != prev_trans_id + 1 + i:
                raise ValueError("entries must have consecutive trans_ids following prev_trans_id")
            if entry.vote_id < (entries[i - 1].vote_id if i else prev_vote_id):
                raise ValueError("entries' vote_ids must not decrease")
        if prev_trans_id > self.last_trans_id:
            return False
        if prev_trans_id < self._commit:
            # Committed entries equal the leader's (a leader holds every committed entry), so the
            # part of the batch up to our commit point is already here, even if no longer kept.
            skip = self._commit - prev_trans_id
            if skip >= len(entries):
                return True
            entries = entries[skip:]
            prev_trans_id = self._commit
        elif self.term_at(prev_trans_id) != prev_vote_id:
            return False
        last = self.last_trans_id
        for i, entry in enumerate(entries):
            if entry.trans_id > last:
                self._extend(entries[i:])
                break
            if self.term_at(entry.trans_id) != entry.vote_id:
                self.truncate_after(entry.trans_id - 1)
                self._extend(entries[i:])
                break
        self._evict()
        return True

    def truncate_after(self, trans_id: int) -> list[Entry]:
        """Drop the (uncommitted) entries after trans_id and return them, oldest first."""
        assert trans_id >= self._commit, (
            f"truncate_after({trans_id}) would drop committed entries (commit {self._commit})")
        if trans_id >= self.last_trans_id:
            return []
        cut = self._head + (trans_id - self._base_trans_id)
        dropped = self._entries[cut:]
        del self._entries[cut:]
        self._ended()
        return dropped

    def reset(self, trans_id: int, vote_id: int) -> None:
        """Forget every entry: the log restarts after a snapshot at (trans_id, vote_id), which
        counts as committed."""
        if trans_id < 0 or vote_id < 0:
            raise ValueError("trans_id and vote_id must not be negative")
        self._entries = []
        self._head = 0
        self._base_trans_id = trans_id
        self._base_vote_id = vote_id
        self._commit = trans_id
        self._ended()

    # ----------------------------------------------------------------- internals

    def _get(self, trans_id: int) -> Entry | None:
        offset = trans_id - self._base_trans_id - 1
        if offset < 0 or offset >= len(self._entries) - self._head:
            return None
        return self._entries[self._head + offset]

    def _extend(self, entries: Sequence[Entry]) -> None:
        # Copies, so that a caller mutating its list (or a shared Entry) cannot change our log.
        self._entries.extend(Entry(e.trans_id, e.vote_id, e.record, e.data) for e in entries)
        self._ended()

    def _ended(self) -> None:
        """Note where the log ends now (the last entry, or the base when empty)."""
        if len(self._entries) > self._head:
            last = self._entries[-1]
            self._last_trans_id, self._last_vote_id = last.trans_id, last.vote_id
        else:
            self._last_trans_id, self._last_vote_id = self._base_trans_id, self._base_vote_id
        last = self._last_trans_id
        if self._bytes_from > last + 1:  # truncated
            self._bytes_from = last + 1
        elif last - self.keep_bytes - self._bytes_from + 1 >= self._shed_run:  # that many to shed
            self._shed_bytes()

    def _shed_bytes(self) -> None:
        """Let go of the bytes of entries older than the newest keep_bytes: kept for the log's
        whole capacity they cost the coordinator tens of bytes per stored message."""
        first = max(self._bytes_from, self._base_trans_id + 1)
        through = self._last_trans_id - self.keep_bytes
        entries, at = self._entries, self._head - self._base_trans_id - 1
        for trans_id in range(first, through + 1):
            entries[at + trans_id].data = None
        self._bytes_from = min(max(first, through + 1), self._last_trans_id + 1)

    def _evict(self) -> None:
        """Drop committed entries from the front while more than capacity are kept."""
        excess = len(self) - self.capacity
        if excess <= 0:
            return
        droppable = self._commit - self._base_trans_id
        n = min(excess, droppable)
        if n <= 0:
            return
        last_dropped = self._entries[self._head + n - 1]
        self._base_trans_id = last_dropped.trans_id
        self._base_vote_id = last_dropped.vote_id
        self._head += n
        if self._head >= _COMPACT_MIN and self._head * 2 >= len(self._entries):
            del self._entries[:self._head]
            self._head = 0
