"""The change log: an in-memory window of records with consecutive trans_ids.

Every entry carries the vote_id (election term) of the leader that wrote it. The log keeps at
most ``capacity`` entries and ``max_bytes`` bytes of records; the oldest fall off the front once
they are committed (and, when the log is told what is on disk, written there: ``mark_stable``).
Uncommitted entries are never dropped from the front, so the log may hold more than that while a
commit is pending. A node that needs entries older than the window gets a snapshot.

The window is compact. Entries that are committed and on disk (all that may fall off) are kept
as their vote_id and where their record's JSON starts (two arrays of 8 bytes an entry) and the
JSON itself in chunks of bytes; `Entry` objects for them are made when they are read, and decode
their record only when it is asked for (a follower that fell behind, a new leader's replay to its
workers). The newer ones, the tail, stay `Entry` objects with the record they came with (a
worker's batch, a peer's message, the disk), since a commit hands them on and the disk and the
peers read them at once: the hot path reads a list, as it did before the window was compact.

Pure logic: no I/O, no clock.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import attrgetter

from queue_server.protocol.records import Encoded, Record, decode, encode

# Drop the dead head of the arrays once it is at least this long and half of them.
_COMPACT_MIN = 1024
# A chunk of records' bytes takes entries until it is this long (an entry is never split).
# Entries both committed and stable move from the tail into the compact part in runs of at least
# this many (or all at once when the log is over a bound): not a move per append.
_RUN = 64
_CHUNK = 1 << 16
# The default bound of the records' bytes the log keeps (config queue_log_bytes).
MAX_BYTES = 8 << 20


class Entry:
    """One change-log record with its position and the term it was written in. `data` is the
    record's JSON as the worker (or the leader, or the disk) gave it, which goes to disk and to
    peers as it is; `record` is decoded from it when first asked for (or given). An entry is made
    with one of the two at least."""

    __slots__ = ("trans_id", "vote_id", "_record", "data")

    def __init__(self, trans_id: int, vote_id: int, record: Record | None = None,
                 data: Encoded | None = None) -> None:
        self.trans_id = trans_id
        self.vote_id = vote_id
        self._record = record
        self.data = data

    @property
    def record(self) -> Record:
        """The record (decoded from `data` on first use)."""
        record = self._record
        if record is None:
            record = self._record = decode(self.data)  # type: ignore[arg-type]
        return record

    def encoded(self) -> Encoded:
        """The record's JSON (records.encode's bytes)."""
        data = self.data
        if data is None:
            data = self.data = encode(self._record)  # type: ignore[arg-type]
        return data

    def __eq__(self, other: object) -> bool:
        if type(other) is not Entry:
            return NotImplemented
        return (self.trans_id == other.trans_id and self.vote_id == other.vote_id
                and self.record == other.record)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return f"Entry(trans_id={self.trans_id!r}, vote_id={self.vote_id!r}, record={self.record!r})"


_TRANS_ID, _VOTE_ID, _DATA = attrgetter("trans_id"), attrgetter("vote_id"), attrgetter("data")


class ChangeLog:
    """The change log: records with strictly increasing trans_ids, bounded to `capacity` entries
    and `max_bytes` bytes of records kept in memory (older fall off the front)."""

    def __init__(self, capacity: int, last_trans_id: int = 0, last_vote_id: int = 0, *,
                 max_bytes: int = MAX_BYTES, stable_trans_id: int | None = None) -> None:
        """An empty log that starts after a snapshot at (last_trans_id, last_vote_id).
        stable_trans_id: the log is on disk up to here, and entries fall off only once they are
        (mark_stable moves it); None: a log with no disk to wait for."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        if last_trans_id < 0 or last_vote_id < 0:
            raise ValueError("trans_id and vote_id must not be negative")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._stable: int | None = None
        self._clear(last_trans_id, last_vote_id)
        self._stable = stable_trans_id

    def _clear(self, trans_id: int, vote_id: int) -> None:
        """No entries: the base and every point at (trans_id, vote_id)."""
        self._base_trans_id = trans_id
        self._base_vote_id = vote_id
        self._commit = trans_id
        if self._stable is not None:
            self._stable = trans_id
        # The compact part, entries _base_trans_id+1 .. _tail_from. Per entry from _head on: its
        # vote_id, and the offset of its record's first byte in the bytes stored so far (an
        # entry's bytes end where the next one's start, or at _end).
        self._votes = array("Q")
        self._starts = array("Q")
        self._head = 0
        # The bytes: chunks (the last one a bytearray still taking entries, the others bytes)
        # and each one's first offset. An entry's bytes are in one chunk.
        self._chunks: list[bytes | bytearray] = [bytearray()]
        self._chunk_at: list[int] = [0]
        self._end = 0
        # The tail, entries _tail_from+1 .. the last: those not both committed and stable, and
        # fewer than _RUN that are. Each has its bytes (data).
        self._tail_from = trans_id
        self._tail: list[Entry] = []
        self._bytes = 0  # of the kept entries' records, the compact part's and the tail's
        self._last_trans_id = trans_id
        self._last_vote_id = vote_id

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
    stable_trans_id = property(attrgetter("_stable"), doc="int | None: how far the log is on disk (mark_stable); "
                               "None for a log with no disk to wait for")
    byte_size = property(attrgetter("_bytes"), doc="int: bytes of records in the kept entries")

    def __len__(self) -> int:
        return self._last_trans_id - self._base_trans_id

    def term_at(self, trans_id: int) -> int | None:
        """vote_id of the entry at trans_id (or of the base), None if not kept."""
        if trans_id > self._tail_from:
            offset = trans_id - self._tail_from - 1
            return self._tail[offset].vote_id if offset < len(self._tail) else None
        if trans_id > self._base_trans_id:
            return self._votes[self._head + trans_id - self._base_trans_id - 1]
        return self._base_vote_id if trans_id == self._base_trans_id else None

    def entry_at(self, trans_id: int) -> Entry | None:
        """The kept entry at trans_id, or None."""
        if trans_id <= self._base_trans_id or trans_id > self._last_trans_id:
            return None
        return self._entries(trans_id, 1)[0]

    def entries_after(self, trans_id: int, limit: int) -> list[Entry] | None:
        """Up to `limit` entries following trans_id; None when trans_id is older than the window
        (the caller must send a snapshot). Empty when trans_id is at or past the last entry."""
        if trans_id < self._base_trans_id:
            return None
        if limit <= 0 or trans_id >= self._last_trans_id:
            return []
        return self._entries(trans_id + 1, min(limit, self._last_trans_id - trans_id))

    def encoded_after(self, trans_id: int, limit: int) -> list[tuple[int, int, Encoded]] | None:
        """As entries_after, but each entry as (trans_id, vote_id, its record's JSON): what the
        disk takes."""
        if trans_id < self._base_trans_id:
            return None
        if limit <= 0 or trans_id >= self._last_trans_id:
            return []
        stop = trans_id + min(limit, self._last_trans_id - trans_id)  # the last one given
        out: list[tuple[int, int, Encoded]] = []
        if trans_id < self._tail_from:
            upto = min(stop, self._tail_from)
            at = self._head + trans_id - self._base_trans_id
            out += zip(range(trans_id + 1, upto + 1), self._votes[at:at + upto - trans_id],
                       self._slices(at, at + upto - trans_id))
        if stop > self._tail_from:
            tail = self._tail[max(0, trans_id - self._tail_from):stop - self._tail_from]
            out += zip(map(_TRANS_ID, tail), map(_VOTE_ID, tail), map(_DATA, tail))
        return out

    # ----------------------------------------------------------------- changes

    def append(self, vote_id: int, records: Sequence[Record] | None,
               encoded: Sequence[Encoded] | None = None) -> tuple[int, int]:
        """Leader: give records the next trans_ids in term vote_id; returns (first, last).
        encoded: each record's JSON, when the caller has it (see Entry.data); records may then be
        None (each is decoded if read).

        With no records returns (last + 1, last)."""
        if vote_id < self._last_vote_id:
            raise ValueError(f"vote_id {vote_id} is below the log's last vote_id {self._last_vote_id}")
        if encoded is None:
            if records is None:
                raise ValueError("append needs the records or their encodings")
            encoded = [encode(r) for r in records]
        elif records is not None and len(encoded) != len(records):
            raise ValueError("records and their encodings differ in number")
        n = len(encoded)
        first = self._last_trans_id + 1
        if n:
            self._tail += map(Entry, range(first, first + n), repeat(vote_id, n),
                              repeat(None, n) if records is None else records, encoded)
            self._bytes += sum(map(len, encoded))
            self._last_trans_id = first + n - 1
            self._last_vote_id = vote_id
            if first + n - 1 - self._base_trans_id > self.capacity or self._bytes > self.max_bytes:
                self._settle()
        return first, first + n - 1

    def commit_to(self, trans_id: int) -> None:
        """Mark everything up to trans_id committed; never moves back, never past the last entry."""
        target = min(trans_id, self._last_trans_id)
        if target > self._commit:
            self._commit = target
            self._settle()

    def mark_stable(self, trans_id: int) -> None:
        """The log is on disk up to trans_id: entries up to there may fall off once committed.
        (On a log made with stable_trans_id None, nothing changes.)"""
        if self._stable is not None and trans_id > self._stable:
            self._stable = min(trans_id, self._last_trans_id)
            self._settle()

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
        if prev_trans_id > self._last_trans_id:
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
        last = self._last_trans_id
        for i, entry in enumerate(entries):
            if entry.trans_id > last:
                self._extend(entries[i:])
                break
            if self.term_at(entry.trans_id) != entry.vote_id:
                self.truncate_after(entry.trans_id - 1)
                self._extend(entries[i:])
                break
        self._settle()
        return True

    def truncate_after(self, trans_id: int) -> list[Entry]:
        """Drop the (uncommitted) entries after trans_id and return them, oldest first."""
        assert trans_id >= self._commit, (
            f"truncate_after({trans_id}) would drop committed entries (commit {self._commit})")
        if trans_id >= self._last_trans_id:
            return []
        cut = trans_id - self._tail_from  # the tail holds every uncommitted entry
        dropped = self._tail[cut:]
        del self._tail[cut:]
        self._bytes -= sum(map(len, map(_DATA, dropped)))
        if self._stable is not None and self._stable > trans_id:
            self._stable = trans_id
        self._ended()
        return dropped

    def reset(self, trans_id: int, vote_id: int) -> None:
        """Forget every entry: the log restarts after a snapshot at (trans_id, vote_id), which
        counts as committed (and, for a log that waits for its disk, as what the disk holds: the
        entries after it have to be written anew)."""
        if trans_id < 0 or vote_id < 0:
            raise ValueError("trans_id and vote_id must not be negative")
        self._clear(trans_id, vote_id)

    # ----------------------------------------------------------------- internals

    def _entries(self, first: int, n: int) -> list[Entry]:
        """The n kept entries from trans_id first on (all of them kept)."""
        start = first - self._tail_from - 1
        if start >= 0:
            return self._tail[start:start + n]
        k = min(n, -start)  # how many are in the compact part
        at = self._head + first - self._base_trans_id - 1
        out = list(map(Entry, range(first, first + k), self._votes[at:at + k], repeat(None, k),
                       self._slices(at, at + k)))
        if n > k:
            out += self._tail[:n - k]
        return out

    def _slices(self, start: int, stop: int) -> list[bytes]:
        """The records' bytes of the compact entries at array positions start..stop-1."""
        starts = self._starts
        bounds = starts[start:stop + 1].tolist() if stop < len(starts) else [*starts[start:stop], self._end]
        chunk_at, chunks = self._chunk_at, self._chunks
        out: list[bytes] = []
        i = bisect_right(chunk_at, bounds[0]) - 1
        k, n = 0, stop - start
        while k < n:
            base = chunk_at[i]
            chunk = chunks[i]
            # the entries that start in this chunk (each ends in it too)
            j = bisect_left(bounds, base + len(chunk), k, n) if i + 1 < len(chunks) else n
            if j > k:
                pairs = zip(bounds[k:j], bounds[k + 1:j + 1])
                if type(chunk) is bytearray:
                    with memoryview(chunk) as view:
                        out += [bytes(view[a - base:b - base]) for a, b in pairs]
                else:
                    out += [chunk[a - base:b - base] for a, b in pairs]
            k = j
            i += 1
        return out

    def _extend(self, entries: Sequence[Entry]) -> None:
        # Copies, so that a caller changing its list (or a shared Entry) cannot change our log.
        fresh = [Entry(e.trans_id, e.vote_id, e._record, e.encoded()) for e in entries]
        self._tail += fresh
        self._bytes += sum(map(len, map(_DATA, fresh)))
        self._ended()

    def _ended(self) -> None:
        """Note where the log ends now (the last entry, or the base when empty)."""
        if self._tail:
            last = self._tail[-1]
            self._last_trans_id, self._last_vote_id = last.trans_id, last.vote_id
        elif self._tail_from > self._base_trans_id:
            self._last_trans_id, self._last_vote_id = self._tail_from, self._votes[-1]
        else:
            self._last_trans_id, self._last_vote_id = self._base_trans_id, self._base_vote_id

    def _settle(self) -> None:
        """Move the entries both committed and stable from the tail into the compact part (once
        there are _RUN of them, or the log is over a bound), then drop what the bounds allow."""
        stable = self._stable
        k = (self._commit if stable is None or stable > self._commit else stable) - self._tail_from
        over = self._last_trans_id - self._base_trans_id > self.capacity or self._bytes > self.max_bytes
        if k >= _RUN or (over and k > 0):
            self._move(k)
        if over:
            self._evict()

    def _move(self, k: int) -> None:
        """Move the tail's first k entries into the compact part."""
        moved = self._tail[:k]
        del self._tail[:k]
        encoded = list(map(_DATA, moved))
        lengths = list(map(len, encoded))
        self._starts.fromlist(list(accumulate(lengths[:-1], initial=self._end)))
        total = sum(lengths)
        chunk = self._open_chunk()
        if len(chunk) + total <= 2 * _CHUNK:
            chunk += b"".join(encoded)
        else:  # many: into chunks of about _CHUNK, so that eviction frees them as it goes
            for data in encoded:
                self._open_chunk().extend(data)
        self._end += total
        vote_id = moved[0].vote_id
        # vote_ids never decrease along the log: mostly one term
        self._votes.fromlist([vote_id] * k if moved[-1].vote_id == vote_id else list(map(_VOTE_ID, moved)))
        self._tail_from += k

    def _open_chunk(self) -> bytearray:
        """The chunk that takes the next entry's bytes (a new one once the last is _CHUNK long)."""
        chunk = self._chunks[-1]
        if len(chunk) >= _CHUNK:
            self._chunks[-1] = bytes(chunk)
            self._chunk_at.append(self._chunk_at[-1] + len(chunk))
            chunk = bytearray()
            self._chunks.append(chunk)
        return chunk  # type: ignore[return-value]

    def _evict(self) -> None:
        """Drop entries from the front of the compact part (committed and stable ones) while more
        than capacity entries, or more than max_bytes of records, are kept."""
        head, compact = self._head, self._tail_from - self._base_trans_id
        if not compact:
            return
        n = compact + len(self._tail) - self.capacity
        first = self._starts[head]
        if self._bytes > self.max_bytes:  # the fewest oldest entries whose bytes make it fit
            n = max(n, bisect_left(self._starts, first + self._bytes - self.max_bytes, head, head + compact) - head)
        if n <= 0:
            return
        n = min(n, compact)
        self._base_trans_id += n
        self._base_vote_id = self._votes[head + n - 1]
        head = self._head = head + n
        kept = self._starts[head] if head < len(self._starts) else self._end
        self._bytes -= kept - first
        drop = bisect_right(self._chunk_at, kept) - 1  # the chunks wholly before the first kept byte
        if drop > 0:
            del self._chunks[:drop], self._chunk_at[:drop]
        if head >= _COMPACT_MIN and head * 2 >= len(self._votes):
            del self._votes[:head], self._starts[:head]
            self._head = 0
