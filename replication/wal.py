"""The write-ahead log on disk: segment files of checksummed change-log records.

A segment is named ``wal-<first trans_id:020d>.log`` and holds records with consecutive
trans_ids, the first one equal to the number in its name. An empty segment still says which
trans_id comes next (what ``reset`` leaves behind). A record is a 25-byte header and a payload:

    magic u8 | crc32 u32 | payload length u32 | trans_id u64 | vote_id u64 | payload

little-endian. The crc covers every byte after it (length, trans_id, vote_id, payload). It is
zlib's crc32: the standard library has no crc32c, and zlib's is fast enough (it guards against
torn and rotted writes, not against tampering). ``scan`` is the one walker over a segment's
records in memory; recovery (read_wal) and the writer both use it. ``WalWriter.read_range`` reads
records back for a follower the change log in memory no longer reaches: each segment has a
sparse index (the file offset of every ``INDEX_EVERY``-th record from its first), kept as the
writer writes and rebuilt for the last segment when the writer opens; an older segment's index is
built the first time a read needs it, by reading the segment once.

One file, over 600 lines, because it is the one place the record format is written and read:
encode_record, scan, read_wal and WalWriter (its group commit, segment roll and reset) must agree
byte for byte, and a change to the layout has to change them together.

This file also holds SyncPolicy, when the log is fsync'd. The disk helpers it shares with the
snapshots and the data dir are in disk.py.

Durability rules the writer keeps:

* a record is written whole or cut off again before anything is written after it;
* what was written since the last successful fsync stays in memory and is written again when an
  fsync fails (the kernel may have dropped those pages), so an error never loses a record; it is
  kept as the bytes of each write, and once it reaches ``MAX_UNSYNCED`` bytes the writer fsyncs,
  whatever the SyncPolicy says, so it stays small however fast records come;
* a segment is fsync'd before the next one is created, so only the last segment can have a
  torn tail.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import Any, NamedTuple

from queue_server.replication.disk import StorageError, fsync_dir, numbered_files, read_file, truncate_file

__all__ = [
    "HEADER_SIZE", "CorruptLog", "Damage", "Frame", "StorageError", "SyncPolicy", "WalWriter",
    "encode_record", "list_segments", "read_wal", "scan", "segment_name",
]
_log = logging.getLogger(__name__)

MAGIC = 0xD1  # format version 1
_FRAME = struct.Struct("<BIIQQ")  # magic, crc, length, trans_id, vote_id
_HEAD = struct.Struct("<BI")
_TAIL = struct.Struct("<IQQ")
HEADER_SIZE = _FRAME.size
_CRC_FROM = _HEAD.size  # the crc covers the frame from here to its end
MAX_PAYLOAD = 1 << 30
# The most bytes written since the last fsync: past it the writer fsyncs (whatever the policy), so
# the copy it keeps of them (to write them again if the fsync fails) is bounded in bytes, not by
# the sync interval times the write rate. An fsync of 4 MiB takes about as long as one of 1 MiB.
MAX_UNSYNCED = 4 << 20
INDEX_EVERY = 1024  # a segment's sparse index holds the offset of every this-many-th record
_READ_BLOCK = 1 << 20  # how much read_range reads from a file at a time (more for a larger record)
_SEGMENT_RE = re.compile(r"wal-(\d{20})\.log")

Opener = Callable[[str], Any]
"""Opens (creating if needed) a segment for appending; returns an object with write (may write
short), truncate, fileno and close, like ``open(path, "ab", buffering=0)``."""


class CorruptLog(Exception):
    """A damaged record that is not a torn tail: data follows it, or a later segment does."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


def segment_name(first_trans_id: int) -> str:
    """File name of the segment whose first record is first_trans_id."""
    return f"wal-{first_trans_id:020d}.log"


def encode_record(trans_id: int, vote_id: int, payload: bytes) -> bytes:
    """One record as it is stored."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"record {trans_id} is {len(payload)} bytes, more than {MAX_PAYLOAD}")
    tail = _TAIL.pack(len(payload), trans_id, vote_id)
    return _HEAD.pack(MAGIC, zlib.crc32(payload, zlib.crc32(tail))) + tail + payload


def _parse(buf: memoryview, pos: int) -> tuple[int, int, int] | str:
    """(trans_id, vote_id, end offset) of the record at pos, or what is wrong with it."""
    if len(buf) - pos < HEADER_SIZE:
        return "a partial record header"
    magic, crc, length, trans_id, vote_id = _FRAME.unpack_from(buf, pos)
    if magic != MAGIC:
        return f"bad magic byte 0x{magic:02x}"
    end = pos + HEADER_SIZE + length
    if length > MAX_PAYLOAD or end > len(buf):
        return f"a record of {length} bytes that runs past the end of the file"
    if zlib.crc32(buf[pos + _CRC_FROM : end]) != crc:
        return "a checksum mismatch"
    return trans_id, vote_id, end


def _valid_record_after(data: bytes, pos: int, above: int) -> bool:
    """Whether an intact record with a trans_id above `above` starts anywhere after pos."""
    buf = memoryview(data)
    i = data.find(MAGIC, pos + 1)
    while i != -1 and len(data) - i >= HEADER_SIZE:
        found = _parse(buf, i)
        if not isinstance(found, str) and found[0] > above:
            return True
        i = data.find(MAGIC, i + 1)
    return False


Frame = tuple[int, int, int, int]  # a plain tuple: recovery makes one per record
"""An intact record found by scan: (trans_id, vote_id, offset, end) in the buffer."""


class Damage(NamedTuple):
    """Where scan stopped before the end of the buffer, and why. `intact` is true for a whole
    record out of sequence: that is never a torn write."""

    offset: int
    reason: str
    intact: bool


def scan(data: bytes, first: int) -> Iterator[Frame | Damage]:
    """The records of a segment whose first record should be trans_id `first`, in order. When a
    record is damaged or out of sequence, yields a Damage for it as the last item."""
    buf = memoryview(data)
    pos, expected = 0, first
    while pos < len(data):
        found = _parse(buf, pos)
        if isinstance(found, str):
            yield Damage(pos, found, False)
            return
        trans_id, vote_id, end = found
        if trans_id != expected:
            yield Damage(pos, f"trans_id {trans_id} where {expected} was expected", True)
            return
        yield trans_id, vote_id, pos, end
        pos, expected = end, expected + 1


def _records_from(f: Any, offset: int, size: int, first: int, path: str) -> Iterator[tuple[int, int, int, memoryview]]:
    """(trans_id, vote_id, offset, payload) of each record of the open segment file `f` from
    `offset`, where record `first` starts, to `size`, each checked. Raises CorruptLog."""
    f.seek(offset)
    buf, pos, at, expected = b"", 0, offset, first  # `at`: the file offset of buf[pos]
    view = memoryview(buf)
    length_of = _TAIL.unpack_from
    while at < size:
        avail = len(buf) - pos
        end = -1
        if avail >= HEADER_SIZE:
            length = length_of(buf, pos + _CRC_FROM)[0]
            if length > MAX_PAYLOAD:
                raise CorruptLog(path, at, f"a record of {length} bytes")
            end = pos + HEADER_SIZE + length
        if end < 0 or end > len(buf):  # read on: at least the header, then the whole record
            need = HEADER_SIZE if end < 0 else end - pos
            more = f.read(min(max(need - avail, _READ_BLOCK), size - at - avail))
            if not more:
                raise CorruptLog(path, at, "the file ends inside a record")
            buf, pos = buf[pos:] + more, 0
            view = memoryview(buf)
            continue
        found = _parse(view, pos)
        if isinstance(found, str):
            raise CorruptLog(path, at, found)
        trans_id, vote_id, end = found
        if trans_id != expected:
            raise CorruptLog(path, at, f"trans_id {trans_id} where {expected} was expected")
        yield trans_id, vote_id, at, view[pos + HEADER_SIZE:end]
        at += end - pos
        pos, expected = end, expected + 1


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(first trans_id, path) of every segment, oldest first."""
    return numbered_files(directory, _SEGMENT_RE)


def read_wal(
    directory: str,
    *,
    after: int = 0,
    repair: bool = False,
    warn: Callable[[str], object] = _log.warning,
    decode: Callable[[bytes], Any] = bytes,
) -> Iterator[tuple[int, int, Any]]:
    """Yield (trans_id, vote_id, decode(payload)) of every record with trans_id > after, in order.

    A torn or corrupt tail of the last segment is cut off on disk with a warning and the log ends
    there. Damage anywhere else raises CorruptLog (while iterating, at the damaged record) unless
    repair is true: then the log is cut at the damage, later segments are deleted, and a warning
    says what was thrown away. A log that starts after `after + 1` raises CorruptLog whatever
    `repair` says: the records in between are gone. A record whose checksum holds but whose
    payload `decode` refuses (ValueError) is damage too, never a torn tail.
    """
    segments = list_segments(directory)
    if not segments:
        return
    if segments[0][0] > after + 1:
        raise CorruptLog(
            segments[0][1], 0,
            f"the log starts at trans_id {segments[0][0]}; trans_ids {after + 1} to "
            f"{segments[0][0] - 1} are missing",
        )
    sizes = [os.path.getsize(path) for _, path in segments]
    last_with_data = max((i for i, size in enumerate(sizes) if size), default=-1)
    start = 0
    while start + 1 < len(segments) and segments[start + 1][0] <= after + 1:
        start += 1  # every record in segments[start] is <= after

    def cut(index: int, offset: int, reason: str, torn: bool) -> None:
        """Cut the log at (segment index, offset), or raise when that would lose data."""
        path = segments[index][1]
        later = [p for _, p in segments[index + 1 :]]
        if not torn:
            if not repair:
                raise CorruptLog(path, offset, reason)
            warn(
                f"REPAIR: {path} at offset {offset}: {reason}; discarding the rest of this segment "
                f"({sizes[index] - offset} bytes) and {len(later)} later segment(s): "
                f"the log now ends at trans_id {expected - 1}"
            )
        else:
            warn(
                f"{path} at offset {offset}: {reason} in the last record(s); cutting off "
                f"{sizes[index] - offset} bytes: the log ends at trans_id {expected - 1}"
            )
        for p in reversed(later):  # newest first: a crash part way leaves a contiguous log
            os.remove(p)
        if offset == 0 and segments[index][0] != expected:
            os.remove(path)  # a misnamed segment cannot be kept even empty
        else:
            truncate_file(path, offset)
        fsync_dir(directory)

    expected = segments[start][0]
    for index in range(start, len(segments)):
        first, path = segments[index]
        if first != expected:
            cut(index, 0, f"segment should start at trans_id {expected}", torn=False)
            return
        data = read_file(path)
        for item in scan(data, expected):
            if isinstance(item, Damage):
                torn = (not item.intact and index >= last_with_data
                        and not _valid_record_after(data, item.offset, expected - 1))
                cut(index, item.offset, item.reason, torn)
                return
            trans_id, vote_id, offset, end = item
            if trans_id > after:
                try:
                    value = decode(data[offset + HEADER_SIZE : end])
                except ValueError as exc:
                    cut(index, offset, f"trans_id {trans_id} is not a record this version reads ({exc})", torn=False)
                    return
                yield trans_id, vote_id, value
            expected += 1


def _default_opener(path: str) -> Any:
    return open(path, "ab", buffering=0)


class WalWriter:
    """Appends records to the log in `directory`, one segment file at a time.

    Open it after recovery (read_wal): it continues after the last record on disk. Appends are
    kept in memory until flush (group commit). trans_ids are consecutive: the first record of an
    empty log is 1, or `n + 1` after ``reset(n)``.
    """

    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int = 64 << 20,
        opener: Opener | None = None,
        fsync: Callable[[int], None] | None = None,
        max_unsynced: int = MAX_UNSYNCED,
    ) -> None:
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        if max_unsynced < 1:
            raise ValueError("max_unsynced must be positive")
        os.makedirs(directory, exist_ok=True)
        self._dir = directory
        self._segment_bytes = segment_bytes
        self._max_unsynced = max_unsynced
        self._opener = opener or _default_opener
        self._fsync = fsync or os.fsync
        self._file: Any = None
        self._closed = False
        try:
            self._load()
        except OSError as e:
            raise StorageError(f"cannot open the log in {directory}: {e}") from e

    def _load(self) -> None:
        """Take the state from what is on disk."""
        self._reload = True  # until this succeeds
        if self._file is not None:
            self._file, f = None, self._file
            try:
                f.close()
            except OSError:
                pass
        self._pending: list[tuple[int, bytes]] = []
        # What was written since the current segment's fsync, as (first trans_id, the bytes of
        # one write): one object a write, not one a record, since at a high rate a second of the
        # log is held here (see _written_again).
        self._unsynced: list[tuple[int, bytes]] = []
        self._segments = [[first, path, os.path.getsize(path)] for first, path in list_segments(self._dir)]
        # Each segment's sparse index by its first trans_id (see read_range); none yet: not built.
        self._index: dict[int, list[int]] = {}
        self._torn = False  # the current segment may hold bytes past its recorded size
        self._dir_dirty = False
        last = 0
        if self._segments:
            first, path, size = self._segments[-1]
            last = first - 1
            index = self._index[first] = []
            if size:
                data = read_file(path)
                for item in scan(data, first):
                    if isinstance(item, Damage):
                        raise CorruptLog(path, item.offset, f"{item.reason} (recover with read_wal before writing)")
                    last = item[0]
                    if (last - first) % INDEX_EVERY == 0:
                        index.append(item[2])
                self._segments[-1][2] = len(data)
            self._file = self._opener(path)
            self._fsync(self._file.fileno())  # what a crashed process left in the page cache
        self._synced_size = self._segments[-1][2] if self._segments else 0
        self._last = self._flushed = self._synced = last
        self._reload = False

    # ------------------------------------------------------------------ state

    last_trans_id = property(attrgetter("_last"), doc="int: the last appended trans_id (written or still pending)")
    flushed_trans_id = property(attrgetter("_flushed"),
                                doc="int: the last trans_id handed to the OS: safe from a process crash")
    synced_trans_id = property(attrgetter("_synced"), doc="int: the last trans_id fsync'd: safe from a power loss")

    @property
    def first_trans_id(self) -> int:
        """The oldest trans_id the log can hold now (last_trans_id + 1 when empty)."""
        return self._segments[0][0] if self._segments else self._last + 1

    @property
    def pending_count(self) -> int:
        """Records appended but not yet written."""
        return len(self._pending)

    @property
    def size_bytes(self) -> int:
        """Bytes of all segments on disk."""
        return sum(size for _, _, size in self._segments)

    def bytes_since(self, trans_id: int) -> int:
        """About how many bytes on disk hold records after trans_id (exact at segment bounds,
        proportional inside the segment holding trans_id)."""
        total = 0
        for i, (first, _, size) in enumerate(self._segments):
            last = self._segments[i + 1][0] - 1 if i + 1 < len(self._segments) else self._flushed
            if last <= trans_id or last < first:
                continue
            if first > trans_id:
                total += size
            else:
                total += size * (last - trans_id) // (last - first + 1)
        return total

    # ------------------------------------------------------------------ writing

    def append(self, entries: Iterable[tuple[int, int, bytes]]) -> None:
        """Queue (trans_id, vote_id, payload) records; trans_ids must follow on from last_trans_id.
        All or none of `entries` are queued."""
        self._check()
        last = self._last
        frames = []
        for trans_id, vote_id, payload in entries:
            if trans_id != last + 1:
                raise ValueError(f"trans_id {trans_id} does not follow {last}")
            frames.append((trans_id, encode_record(trans_id, vote_id, payload)))
            last = trans_id
        self._pending.extend(frames)
        self._last = last

    def flush(self, sync: bool) -> None:
        """Write the queued records to the OS, and fsync them when sync is true.

        On a failure raises StorageError; every record not yet known to be written stays queued
        and the next flush writes it again.
        """
        self._check()
        try:
            if self._torn:
                self._file.truncate(self._segments[-1][2])
                self._torn = False
            while self._pending:
                if self._file is None or self._segments[-1][2] >= self._segment_bytes:
                    self._roll()
                self._write_some()
                if self._segments[-1][2] - self._synced_size >= self._max_unsynced:  # bytes since the fsync
                    self._sync()
            if sync and (self._synced < self._flushed or self._dir_dirty):
                self._sync()
        except OSError as e:
            raise StorageError(f"writing the log in {self._dir} failed: {e}") from e

    def _write_some(self) -> None:
        """Write as many queued records as fit in the current segment (at least one)."""
        segment = self._segments[-1]
        room = self._segment_bytes - segment[2]
        n = size = 0
        for _, frame in self._pending:
            if n and size + len(frame) > room:
                break
            n += 1
            size += len(frame)
        batch = self._pending[:n]
        joined = b"".join(frame for _, frame in batch)
        data = memoryview(joined)
        written = 0
        try:
            while written < len(data):
                w = self._file.write(data[written:])
                if not w:
                    raise OSError(errno.EIO, "write wrote nothing")
                written += w
        except OSError:
            raise
        except BaseException:
            # Raised from outside the write (a signal handler's exit): the file may hold more
            # than `written` says, so nothing more is written before the state is read back
            # from the disk (close() then writes nothing; the next use reloads).
            self._reload = True
            raise
        finally:
            if written == size:
                done, k = size, n
            else:
                done = k = 0
                for _, frame in batch:
                    if done + len(frame) > written:
                        break
                    done += len(frame)
                    k += 1
            if k:
                self._note_written(segment, batch[:k])
                self._unsynced.append((batch[0][0], joined if k == n else joined[:done]))
                del self._pending[:k]
                self._flushed = batch[k - 1][0]
                segment[2] += done
            if written > done:
                # part of a record reached the file: cut it off now, or before the next write
                self._torn = True
                try:
                    self._file.truncate(segment[2])
                    self._torn = False
                except OSError:
                    pass

    def _note_written(self, segment: list, written: list[tuple[int, bytes]]) -> None:
        """Add the records just written at the end of `segment` to its index."""
        index = self._index.get(segment[0])
        if index is None:
            return
        target = segment[0] + len(index) * INDEX_EVERY
        if target > written[-1][0]:
            return
        offset = segment[2]
        for trans_id, frame in written:
            if trans_id == target:
                index.append(offset)
                target += INDEX_EVERY
            offset += len(frame)

    def _trim_index(self, segment: list) -> None:
        """Forget index points at or past the segment's end (it was cut)."""
        index = self._index.get(segment[0])
        while index and index[-1] >= segment[2]:
            index.pop()

    def _sync(self) -> None:
        try:
            self._fsync(self._file.fileno())
        except OSError:
            # the kernel may have dropped pages it could not write: write them again
            self._pending[:0] = self._written_again()
            self._unsynced = []
            self._segments[-1][2] = self._synced_size
            self._trim_index(self._segments[-1])
            self._flushed = self._synced
            self._torn = True
            raise
        self._unsynced.clear()
        self._synced_size = self._segments[-1][2]
        if self._dir_dirty:
            fsync_dir(self._dir)
            self._dir_dirty = False
        self._synced = self._flushed

    def _written_again(self) -> list[tuple[int, bytes]]:
        """The records written since the last fsync, queued records again (oldest first)."""
        out: list[tuple[int, bytes]] = []
        for first, data in self._unsynced:
            for item in scan(data, first):
                if isinstance(item, Damage):  # the writer's own bytes, checked when they were made
                    raise AssertionError(f"unsynced records from {first} unreadable: {item.reason}")
                out.append((item[0], data[item[2]:item[3]]))
        return out

    def _roll(self) -> None:
        """Start a new segment at the first queued record."""
        if self._file is not None:
            self._sync()  # a newer segment exists only once the older one is complete on disk
        first = self._pending[0][0]
        path = os.path.join(self._dir, segment_name(first))
        f = self._opener(path)
        old, self._file = self._file, f
        if old is not None:
            try:
                old.close()
            except OSError:
                pass
        self._segments.append([first, path, 0])
        self._index[first] = []
        self._synced_size = 0
        self._dir_dirty = True

    # ------------------------------------------------------------------ cutting

    def truncate_after(self, trans_id: int) -> None:
        """Drop every record after trans_id, queued or on disk (fsync'd before returning)."""
        self._check()
        if trans_id >= self._last:
            return
        if trans_id >= self._flushed:
            self._pending = [p for p in self._pending if p[0] <= trans_id]
            self._last = trans_id
            return
        if trans_id < self.first_trans_id - 1:
            raise ValueError(f"trans_id {trans_id} is before the start of the log ({self.first_trans_id})")
        self._pending.clear()
        try:
            while self._segments[-1][0] > trans_id + 1:  # newest first
                first, path, _ = self._segments.pop()
                self._index.pop(first, None)
                self._close_file()
                os.remove(path)
            first, path, _ = self._segments[-1]
            offset = 0 if first == trans_id + 1 else self._end_of(path, first, trans_id)
            if self._file is None:
                self._file = self._opener(path)
            self._file.truncate(offset)
            self._fsync(self._file.fileno())
            fsync_dir(self._dir)
        except OSError as e:
            self._reload = True
            raise StorageError(f"cutting the log in {self._dir} after {trans_id} failed: {e}") from e
        self._segments[-1][2] = self._synced_size = offset
        self._trim_index(self._segments[-1])
        self._unsynced.clear()
        self._torn = self._dir_dirty = False
        self._last = self._flushed = self._synced = trans_id

    @staticmethod
    def _end_of(path: str, first: int, trans_id: int) -> int:
        """Offset just after record trans_id in the segment at path."""
        data = read_file(path)
        for item in scan(data, first):
            if isinstance(item, Damage):
                raise CorruptLog(path, item.offset, item.reason)
            if item[0] == trans_id:
                return item[3]
        raise CorruptLog(path, len(data), f"trans_id {trans_id} is not in this segment")

    def remove_segments_before(self, trans_id: int) -> int:
        """Delete the segments whose records are all <= trans_id (never the current one); returns
        how many were deleted."""
        self._check()
        removed = 0
        try:
            while len(self._segments) > 1 and self._segments[1][0] - 1 <= trans_id:
                os.remove(self._segments[0][1])  # oldest first: what is left stays contiguous
                self._index.pop(self._segments.pop(0)[0], None)
                removed += 1
            if removed:
                fsync_dir(self._dir)
        except OSError as e:
            raise StorageError(f"removing old segments in {self._dir} failed: {e}") from e
        return removed

    def reset(self, trans_id: int) -> None:
        """Delete the whole log; the next record is trans_id + 1. For after a snapshot at
        trans_id that the log does not reach (installed from the leader, or newer than the log
        on disk); write that snapshot first."""
        self._check()
        self._pending.clear()
        try:
            self._close_file()
            while self._segments:  # newest first
                os.remove(self._segments.pop()[1])
            self._index.clear()
            path = os.path.join(self._dir, segment_name(trans_id + 1))
            self._file = self._opener(path)
            self._segments.append([trans_id + 1, path, 0])
            self._index[trans_id + 1] = []
            fsync_dir(self._dir)
        except OSError as e:
            self._reload = True
            raise StorageError(f"resetting the log in {self._dir} failed: {e}") from e
        self._unsynced.clear()
        self._synced_size = 0
        self._torn = self._dir_dirty = False
        self._last = self._flushed = self._synced = trans_id

    # ------------------------------------------------------------------ reading

    def read_range(self, after: int, max_bytes: int, limit: int) -> list[tuple[int, int, bytes]]:
        """(trans_id, vote_id, payload) of the written records after `after`, at most `limit` of
        them and about `max_bytes` of payload (at least one), preceded by the record `after`
        itself when the log holds it. Reads only what was handed to the OS. Raises StorageError
        (or CorruptLog for a damaged record)."""
        self._check()
        start = max(after, self.first_trans_id)
        stop = min(after + limit, self._flushed)
        out: list[tuple[int, int, bytes]] = []
        if start > stop:
            return out
        total = 0
        try:
            for i, (first, path, size) in enumerate(self._segments):
                if i + 1 < len(self._segments) and self._segments[i + 1][0] <= start:
                    continue  # every record of it is before start
                if first > stop or total >= max_bytes:
                    break
                index = self._segment_index(first, path, size)
                k = min((max(start, first) - first) // INDEX_EVERY, len(index) - 1)
                t, offset = (first + k * INDEX_EVERY, index[k]) if k >= 0 else (first, 0)
                with open(path, "rb") as f:
                    for trans_id, vote_id, _, payload in _records_from(f, offset, size, t, path):
                        if trans_id < start:
                            continue
                        if trans_id > stop:
                            break
                        out.append((trans_id, vote_id, bytes(payload)))
                        if trans_id > after:
                            total += len(payload)
                            if total >= max_bytes:
                                break
        except OSError as e:
            raise StorageError(f"reading the log in {self._dir} after {after} failed: {e}") from e
        return out

    def _segment_index(self, first: int, path: str, size: int) -> list[int]:
        """The segment's sparse index, built by reading it if it has none yet."""
        index = self._index.get(first)
        if index is None:
            with open(path, "rb") as f:
                index = [offset for trans_id, _, offset, _ in _records_from(f, 0, size, first, path)
                         if (trans_id - first) % INDEX_EVERY == 0]
            self._index[first] = index
        return index

    # ------------------------------------------------------------------ lifecycle

    def _check(self) -> None:
        if self._closed:
            raise ValueError("the log writer is closed")
        if self._reload:
            try:
                self._load()
            except OSError as e:
                raise StorageError(f"reopening the log in {self._dir} failed: {e}") from e

    def _close_file(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            f.close()

    def close(self) -> None:
        """Write and fsync what is queued, then close (the file is closed even when that fails)."""
        if self._closed:
            return
        try:
            if not self._reload:
                self.flush(sync=True)
        finally:
            self._closed = True
            try:
                self._close_file()
            except OSError:
                pass

    def __enter__(self) -> WalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPolicy:
    """When the log is fsync'd: "always" (every flush), "everysec" (once `interval` seconds have
    passed since the last fsync) or "no" (the OS decides). Pure: the caller passes the time."""

    MODES = ("always", "everysec", "no")

    def __init__(self, mode: str = "everysec", interval: float = 1.0) -> None:
        if mode not in self.MODES:
            raise ValueError(f"fsync must be one of {', '.join(self.MODES)}, not {mode!r}")
        self.mode = mode
        self.interval = interval
        self._last_sync: float | None = None
        self._dirty = False

    def after_append(self, now: float) -> bool:
        """Note that records were appended; whether the flush that follows should fsync."""
        self._dirty = True
        return self.due(now)

    def due(self, now: float) -> bool:
        """Whether appended records are waiting for an fsync that should happen now."""
        if not self._dirty or self.mode == "no":
            return False
        if self.mode == "always" or self._last_sync is None:
            return True
        return now - self._last_sync >= self.interval

    def deadline(self) -> float | None:
        """When due() turns true if nothing else happens (a poll timeout), or None for never."""
        if not self._dirty or self.mode == "no":
            return None
        if self.mode == "always" or self._last_sync is None:
            return 0.0
        return self._last_sync + self.interval

    def synced(self, now: float) -> None:
        """Note a successful fsync at now."""
        self._last_sync = now
        self._dirty = False
